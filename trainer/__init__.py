"""Group-relative RL fine-tuning of transformers models with every objective of the loss core.

Entry point: ``dfpo train --config FILE.toml [--set key=value ...] [--resume RUN_DIR]``
(``cli.py``), or ``dfpo.trainer.train.train(config)`` from Python.

Modules (read in this order):
    config.py        frozen dataclass config, strict TOML parsing, --set overrides
    resume.py        what a resume may change: the checkpoint's config compared key by key
    layout.py        ``RunDir``: the file names of a run folder, in one place
    preflight.py     checks before any work: prompt lengths, model folder, prompts per step, memory
    tasks.py         built-in tasks (add, equiv), JSONL, reasoning-gym, HF datasets, resumable sampler;
                     prompt encoding, the warm-start target and forms/* metrics of the tasks
    rewards.py       exact / math-verify / equiv / reasoning-gym / user rewards, format reward
    reward_pool.py   the worker processes that run rewards with a deadline, killed and replaced when they hang or die
    reward_worker.py one such worker (a fresh interpreter, standard library only) and the protocol both sides share
    process_tree.py  the processes a reward worker started, found and killed whatever session they made
    policy.py        tiny offline preset (char tokenizer + Qwen2 from scratch + SFT), hub/local models, LoRA; ``Model``
    rollout.py       RolloutEngine interface, HF generate engine, batch layout, sampler log-probs
    forward.py       the policy's forward pass: per-token log-probs and entropy without (B, T, V) logits
    train.py         ``Trainer``: builds the run once, then each step is five named stages (below)
    stage_rollout.py     1. prompts -> G completions each, scored; DAPO dynamic sampling; evaluation
    stage_advantages.py  2. group advantages (eq 43); DAPO overlong filtering
    stage_old_logp.py    3. pi_old (sampler or recomputed, first step's own forward) and pi_ref
    stage_update.py      4. the K optimiser steps: accumulate, combine, clip, AdamW (``accumulate_gradients``)
    stage_metrics.py     5. the metrics line, samples, the run summary (Jitter2 eq 20, Steps eq 19)
    minibatches.py   the plan: whole-group mini-batches and micro-batches, exact accumulation weights
    parallel.py      the strategy every stage asks: one process, DDP, FSDP2
    run_state.py     the run's counters, checkpoints (save/restore) and logs
    diagnostics.py   Energy (eq 24), shared-prefix residual, zero-variance groups
    run_folder.py    the run folder: checked, locked, marked as dfpo's own; never cleared unless it is
    checkpoint.py    checkpoint.pt and checkpoint.json: atomic writes, SHA-256, the config the run was made with
    runlog.py        JSONL logs, TensorBoard/wandb, SIGINT/SIGTERM handling
    distributed.py   the collectives of data parallelism over whole groups (DDP, FSDP2)
    launch.py        ``--nproc N``: the ranks on one machine, signals passed on, none outliving the launcher
    exit_signals.py  SIGINT/SIGTERM before the trainer's own handling and after it: one line, the shell's status
    memory.py        the memory a config needs at the least, checked against the device before any work
    curves.py        RUN_DIR/curves.png from metrics.jsonl and eval.jsonl

Every logged key (RUN_DIR/metrics.jsonl, eval.jsonl, TensorBoard), its meaning and its reduction over micro-batches,
processes and optimiser steps: ``dfpo.core.metric_registry`` and docs/metrics.md. RUN_DIR/summary.json holds
``reward/jitter2`` (eq 20) and ``reward/steps_to_kappa`` (eq 19) of the train reward curve.
"""
