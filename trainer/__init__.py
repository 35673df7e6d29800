"""Group-relative RL fine-tuning of transformers models with every objective of the loss core.

Entry point: ``dfpo train --config FILE.toml [--set key=value ...] [--resume RUN_DIR]``
(``cli.py``), or ``dfpo.trainer.train.train(config)`` from Python.

Folders:
    run/      the run folder: its layout, checks and lock, checkpoints, what a resume may change, the run's
              state, its logs, and every SIGINT/SIGTERM rule of ``dfpo train`` (``run/signals.py``)
    rewards/  what scores a completion (exact, math-verify, equiv, reasoning-gym, user, format) and the sandbox
              its calls run in: worker processes started by path, killed with what they started
    stages/   the five stages of one training step, in order: rollout, advantages, old_logp, update, metrics
    probe/    parameter-space drift (``dfpo probe``, and ``log.param_drift`` inside a run): one name, one place

Modules at the top (read in this order):
    config.py           frozen dataclass config, strict TOML parsing, --set overrides
    preflight.py        checks before any work: prompt lengths, model folder, prompts per step, memory
    memory.py           the memory a config needs at the least, checked against the device before any work
    tasks.py            built-in tasks (add, equiv), JSONL, reasoning-gym, HF datasets, resumable sampler;
                        prompt encoding, the warm-start target and forms/* metrics of the tasks
    policy.py           tiny offline preset (char tokenizer + Qwen2 from scratch + SFT), hub/local models, LoRA;
                        ``Model``
    packaged_model.py   ``model.name`` as a GGUF file or a packaged model, converted once into a cached folder
    sampler.py          RolloutEngine interface, HF generate engine, batch layout, sampler log-probs
    vllm_engine.py      the same interface on vLLM
    forward.py          the policy's forward pass: per-token log-probs and entropy without (B, T, V) logits
    minibatches.py      the plan: whole-group mini-batches and micro-batches, exact accumulation weights
    diagnostics.py      Energy (eq 24), shared-prefix residual, zero-variance groups
    entropy_control.py  the state of Skywork-OR1's adaptive entropy coefficient
    train.py            ``Trainer``: builds the run once, then each step is the five stages of ``stages/``
    parallel.py         the strategy every stage asks: one process, DDP, FSDP2
    distributed.py      the collectives of data parallelism over whole groups (DDP, FSDP2)
    launch.py           ``--nproc N``: the ranks on one machine, signals passed on, none outliving the launcher
    cli.py              ``dfpo train`` (imports stay light)
    curves.py           RUN_DIR/curves.png from metrics.jsonl and eval.jsonl
    compare.py          ``dfpo compare``: objectives over paired seeds, with matched controls
    compare_report.py   what ``dfpo compare`` prints, a pure function of its compare.json

Every logged key (RUN_DIR/metrics.jsonl, eval.jsonl, TensorBoard), its meaning and its reduction over micro-batches,
processes and optimiser steps: ``dfpo.core.metric_registry`` and docs/metrics.md. RUN_DIR/summary.json holds
``reward/jitter2`` (eq 20) and ``reward/steps_to_kappa`` (eq 19) of the train reward curve.
"""
