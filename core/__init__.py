"""The shared core: what the toy, the claims ledger, the LLM trainer, the explorer and the integrations all use.

Nothing here imports the parts above it (``dfpo.toy``, ``dfpo.theory``, ``dfpo.trainer``, ``dfpo.app``).

Modules:
    loss/            the loss core: every objective as a composition of components, pure torch (``policy_loss``)
    logprobs.py      per-token log-probs and entropy of a causal LM, chunked over the vocabulary (``token_logprobs``)
    fused.py         the LM head and any objective's loss in one pass, gradients in the forward (``fused_policy_loss``)
    cast_in_place.py a float32 block of logits cast to and from half precision inside its own bytes (half-precision heads)
    metrics.py       mechanism metrics every part reports the same way: shared-prefix residual (eq 2), Energy (eq 24)
    metric_registry.py  every logged metric key: its meaning and its reduction over micro-batches, processes, steps
    settings.py      the one config mechanism: fields declared with default, meaning and bounds; the ``--set`` grammar
    stats.py         paired-difference statistics: Student-t intervals, Bonferroni, verdicts
    files.py         output paths checked before any work, files written atomically, write errors in one sentence
"""
