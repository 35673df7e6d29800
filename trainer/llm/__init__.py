"""Group-relative RL fine-tuning of transformers models with every objective of the loss core.

Entry point: ``dfpo train --config FILE.toml [--set key=value ...] [--resume RUN_DIR]``
(``cli.py``), or ``dfpo.trainer.llm.train.train(config)`` from Python.

Modules (read in this order):
    config.py       frozen dataclass config, strict TOML parsing, --set overrides
    tasks.py        built-in tasks (add, equiv), JSONL, reasoning-gym, HF datasets, resumable sampler
    rewards.py      exact / math-verify / equiv / reasoning-gym / user rewards, format reward, timeouts
    policy.py       tiny offline preset (char tokenizer + Qwen2 from scratch + SFT), hub/local models, LoRA
    rollout.py      RolloutEngine interface, HF generate engine, batch layout, log-probs
    train.py        the loop: rollouts, advantages, K optimiser steps over whole-group mini-batches
    diagnostics.py  Energy (eq 24), shared-prefix residual, zero-variance groups, Jitter2 (eq 20), Steps (eq 19)
    runlog.py       run folder: JSONL logs, TensorBoard/wandb, atomic checkpoints, RNG states

Metrics (one JSONL line per training step in RUN_DIR/metrics.jsonl, same keys in TensorBoard):

| key | meaning |
|---|---|
| reward/mean, reward/std | total reward of the rollout batch (correctness + format_weight * format) |
| reward/correct, reward/format | mean correctness and format rewards |
| reward/errors, reward/timeouts, reward/invalid | reward calls that raised / timed out / returned no finite number within +-1e6 (each gave 0) |
| completion/length, completion/truncated_frac, completion/empty_frac | lengths in tokens (EOS counted) |
| groups/zero_var_frac | share of groups whose rewards are all equal (no signal) |
| entropy/rollout, entropy/mean | policy entropy at completion tokens: rollout policy / during updates |
| loss/policy, clip/frac_low, clip/frac_high, ratio/mean, ratio/max, weights/asym (eq 23), mask/frac, kl/ref | from ``dfpo.policy_loss``, averaged over the K optimiser steps (ratio/max: max) |
| grad/norm, optim/lr, optim/updates, optim/skipped_nonfinite | optimiser state |
| energy/bucketK | Energy (eq 24) of token-frequency bucket K (0 = most frequent), output-layer closed form |
| diag/shared_residual, diag/shared_positions | uncancelled share of shared-prefix logit gradients (0 = full cancellation) |
| forms/* | add/equiv tasks: share of completions in each surface form (number, swap, split, echo, invalid) |
| time/rollout_s, time/update_s, time/step_s | wall times |

RUN_DIR/eval.jsonl holds ``eval/avg@k`` and ``eval/pass@k``; RUN_DIR/summary.json holds
``reward/jitter2`` (eq 20) and ``reward/steps_to_kappa`` (eq 19) of the train reward curve.
"""
