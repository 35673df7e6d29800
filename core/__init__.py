"""The shared core: what the toy, the claims ledger, the LLM trainer, the explorer and the integrations all use.

Nothing here imports the parts above it (``dfpo.toy``, ``dfpo.theory``, ``dfpo.trainer``, ``dfpo.app``).

Modules (one line each; ``tests/core/test_core_modules.py`` fails when a module of core/ is missing here):
    loss             the loss core: every objective as a composition of components, pure torch (``policy_loss``)
    logprobs         per-token log-probs and entropy of a causal LM, chunked over the vocabulary (``token_logprobs``)
    fused            the LM head and any objective's loss in one pass, gradients in the forward (``fused_policy_loss``)
    cast_in_place    a float32 block of logits cast to and from half precision inside its own bytes (half-precision heads)
    metrics          mechanism metrics every part reports the same way: shared-prefix residual (eq 2), Energy (eq 24)
    metric_registry  every logged metric key: its meaning and its reduction over micro-batches, processes, steps
    settings         the one config mechanism: fields declared with default, meaning and bounds; the ``--set`` grammar
    stats            paired-difference statistics: Student-t intervals, Bonferroni, verdicts
    files            output paths checked before any work, files written atomically, write errors in one sentence
    labels           run labels: an objective label plus the training settings a comparison varies per label
    calibration      the learning rate at which a control's effective step matches a method's (``--match-step``)
    probe            the parameter-space drift probe: how one real optimiser step moves a shared token and a pair
    param_atlas      cancellation verdicts in parameter space: each correction, rejection, KL estimator and objective
    drift_tables     the drift probe's stored document read into intervals, matched comparisons and replicated findings
    findings         the findings ledger: every sentence about this project's experiments, generated from stored tables
    registration     experiments registered before their data: rows, margins, one family per experiment, the answer
"""
