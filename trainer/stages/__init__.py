"""The five stages of one training step, in the order ``train.Trainer.train_step`` runs them.

Modules:
    rollout.py     1. prompts -> G completions each, scored; DAPO dynamic sampling; evaluation
    advantages.py  2. group advantages (eq 43); DAPO overlong filtering
    old_logp.py    3. pi_old (sampler or recomputed, first step's own forward) and pi_ref
    update.py      4. the K optimiser steps: accumulate, combine, clip, AdamW (``accumulate_gradients``)
    metrics.py     5. the metrics line, samples, the run summary (Jitter2 eq 20, Steps eq 19)

The sampler the rollout stage drives (``RolloutEngine``, the HF generate engine, the batch layout) is
``trainer/sampler.py``; vLLM's engine is ``trainer/vllm_engine.py``.
"""
