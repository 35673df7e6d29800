"""The LLM trainer: rollouts -> rewards -> group advantages -> K off-policy optimiser steps.

One training step (``Trainer.train_step``), one module of ``stages/`` per stage:

1. ``stages.rollout``: ``prompts_per_step`` prompts (seeded, resumable order), G completions each, scored
   (timeouts and errors give 0 and are counted); DAPO's dynamic sampling when configured;
2. ``stages.advantages``: group advantages (eq 43, the scale the objective names);
3. ``stages.old_logp``: pi_old of the rows the first optimiser step does not score itself, pi_ref with a KL term;
4. ``stages.update``: ``epochs`` passes over mini-batches of ``minibatch_groups`` whole groups (K = epochs *
   prompts_per_step / minibatch_groups optimiser steps), each accumulated over micro-batches weighted so the
   summed gradient is the mini-batch loss's (``minibatches``); grad-norm clipping, AdamW, cosine schedule;
5. ``stages.metrics``: the metrics line (diagnostics from ``d loss / d logp``: Energy, shared-prefix residual),
   samples; with ``log.param_drift``, ``probe.stage``'s trial step first (parameter-space drift, ``drift/*``; its seconds
   are ``time/probe_s``, kept out of ``time/step_s``).

Around the steps: ``run.state`` (counters, checkpoints, logs) and ``parallel``, the strategy (one process, DDP,
FSDP2) every stage asks whatever depends on the number of processes. All loss maths is ``dfpo.policy_loss``;
no file of the trainer writes an objective formula.

On several processes (torchrun, ``dfpo train --nproc N``) each samples and scores every world-th prompt and the
shares are gathered, so every process holds the whole rollout batch: advantages (batch-wide scales included),
the mini-batch plan and the metrics come from the global batch. Each process trains its share of the whole
groups of every mini-batch with weights normalised by the mini-batch's count over all processes; the gradients
are summed over the processes (DDP) or reduce-scattered (FSDP2) before clipping, so N processes take the
optimiser steps one process would. With per-group sampling seeds (``rollout.seed_per_group``, on by itself with
more than one process) the rollouts, and so whole runs, do not depend on the number of processes. Rank 0 writes
the run folder; checkpoints hold whole tensors.

Choices made here (where the paper and the peers leave it open; the stages list theirs):
1. ``constant`` aggregation gets max_completion_length = rollout.max_new_tokens unless the config overrides it,
   as TRL's dr_grpo does.
2. An objective coupled across a mini-batch (STAPO, top-entropy, Clip-Cov, KL-Cov, an entropy bonus) split over
   micro-batches, a token budget or processes is trained, with a warning naming the coupling.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass

import torch

from ..core.files import WriteFailed, write_run_file
from ..core.loss import ObjectiveSpec, resolve_objective
from ..core.loss.advantages import GREEDY_BASELINE, TOKEN_LEVEL
from . import entropy_control, parallel
from .config import Config, check_tiny_shape, config_to_toml
from .decode import DecodeOptions
from .diagnostics import StepDiagnostics
from .minibatches import MicroBatch, micro_batch, split_settings
from .packaged_model import quiet_loading, resolve_model_name
from .policy import (
    Model,
    check_model_available,
    load_policy,
    resolve_amp,
    resolve_device,
    resolve_dtype,
)
from .preflight import check_lengths, check_memory_fits, check_model_folder, check_prompts_per_step, measure_prompts
from .probe.stage import DriftStage, check_drift_settings
from .prompts import clip_long_prompts
from .rewards.compute import RewardComputer, reward_spec
from .rewards.pool import default_workers
from .run import logs
from .run.checkpoint import seed_everything
from .run.folder import NullLock, prepare_run_folder
from .run.layout import RunDir
from .run.progress import Progress, duration, evals_left, time_left
from .run.resume import finished_run_message
from .run.signals import StopSignals, TrainingInterrupted, stop_beneath
from .run.state import Checkpointer, FinishedStep, RunLogs, RunState
from .run.stop_messages import StopPoint, first_signal_line
from .sampler import HFGenerateEngine
from .stages.advantages import advantages
from .stages.metrics import Stopwatch, run_summary, step_metrics, write_samples
from .stages.old_logp import OldLogpStage, old_logp_from_sampler
from .stages.rollout import RolloutStage
from .stages.update import NonFiniteLossError, UpdateStage, accumulate_gradients
from .tasks import duplicate_prompts, load_splits
from .vllm_engine import VLLMEngine, check_vllm_available
from .warmup import ensure_warm_model, warm_folder

__all__ = [
    "MicroBatch",  # the names below stay importable from here for the code that imported them before the split
    "NonFiniteLossError",
    "StepDiagnostics",
    "Trainer",
    "accumulate_gradients",
    "check_lengths",
    "micro_batch",
    "objective_spec",
    "train",
]


def objective_spec(cfg: Config) -> ObjectiveSpec:
    """The objective of the config, resolved once and passed down as is: the preset with its overrides, and
    max_completion_length = max_new_tokens for ``constant`` aggregation."""
    overrides = dict(cfg.objective.overrides)
    if resolve_objective(cfg.objective.name, **overrides).aggregation == "constant":
        overrides.setdefault("max_completion_length", cfg.rollout.max_new_tokens)
    return resolve_objective(cfg.objective.name, **overrides)


def rollout_engine(cfg: Config, policy: Model, device: torch.device, amp: torch.dtype | None):
    """The HF engine on the trainer's own model, or vLLM started from the model's folder (the trainer syncs it with
    the checkpoint's weights on a resume)."""
    if cfg.rollout.engine == "hf":
        return HFGenerateEngine(
            policy.model, policy.tok.pad_token_id, policy.eos_ids, cfg.rollout.batch_size, amp, DecodeOptions.from_config(cfg.rollout)
        )
    folder = str(cfg.folder.init_model) if cfg.model.name == "tiny" else resolve_model_name(cfg.model.name)  # a GGUF: its folder
    folder = str(warm_folder(cfg) or folder)  # warmup.steps > 0: the cached warm-up the policy was loaded from
    context = getattr(policy.model.config, "max_position_embeddings", 2048)
    return VLLMEngine(folder, eos_ids=policy.eos_ids, device=device, seed=cfg.seed, max_model_len=context)


@dataclass(frozen=True)
class Inputs:
    """What the cheap checks of construction resolved, before any weights load."""

    dtype: torch.dtype
    amp: torch.dtype | None
    train_examples: list
    eval_examples: list
    max_prompt_tokens: int | None
    sft_examples: list
    """What the tiny preset's warm start trains on: the train examples, over-long prompts cut (``clip_long_prompts``)."""


class Trainer:
    """Everything a run needs, built from a Config in ``__init__`` (cheap checks first, then the model,
    optimiser, step-0 checkpoint and logs), so the initial parameters are there to read before ``run``.

    The run folder is locked from construction until ``run`` returns (or ``close`` is called).

    What it prints on stderr (rank 0 speaks for the run; warnings that need the user, and the answer to a signal,
    are printed in every mode): by default the start-up phases, a progress bar (``log.progress``; its estimate
    ``bar_postfix``), a line before and after each evaluation and per-step lines (a skipped optimiser step, dropped
    non-finite metrics); ``quiet``: the start-up phases and the warm-up's result, a progress line at most every
    ``logs.PROGRESS_EVERY_S`` seconds and a last line, no bar, no evaluation or per-step lines; both: a heartbeat
    line (``run.progress``) whenever ``logs.PROGRESS_EVERY_S`` seconds passed without a line; ``silent``: none of them.
    """

    def __init__(self, cfg: Config, *, resume: bool = False, quiet: bool = False, silent: bool = False):
        self.built_at = time.monotonic()  # the start-up's clock (summary.json's wall_s_start_up)
        self.cfg = cfg
        if resume and (done := finished_run_message(cfg.folder.path, cfg.train.steps)):  # before the lock: nothing is touched
            raise ValueError(done)
        parallel.check_launch(cfg)  # before any work, before joining the group
        device = resolve_device(cfg.device)
        self.parallel = parallel.join(cfg, device.type)
        self.device = self.parallel.local_device(device)
        self.silent = silent or not self.parallel.is_main  # rank 0 speaks for the run
        self.quiet = quiet or self.silent
        self.state = RunState(seed_per_group=self.parallel.seed_per_group(cfg.rollout))
        # checked and locked first, by rank 0 (the others wait for its verdict)
        run_dir = cfg.folder.path
        self.lock = self.parallel.on_rank0(lambda: prepare_run_folder(run_dir, resume=resume, steps=cfg.train.steps)) or NullLock()
        self.rewards = None
        self._tax_warned = False  # eval/tax_kl's missing reference said (``_warn_tax_unavailable``)
        self.progress = Progress(self._progress_write, every_s=logs.PROGRESS_EVERY_S)
        """What the run is doing and for how long: the heartbeat, the time left, the first signal's line."""
        self.finished: FinishedStep | None = None
        """The last finished step's checkpoint parts besides the weights (``Checkpointer.finished_step``)."""
        self.finished_is_live = True
        """The weights and the optimiser still hold the last finished step (False from the next step's first optimiser
        step until it ends): a checkpoint of it can still be written."""
        self.evaluating = False
        self.stop: StopSignals | None = None
        self._bar = None
        try:
            with quiet_loading() if self.quiet else contextlib.nullcontext():  # no conversion line, no loading bars
                inputs = self.parallel.agree(lambda: self._check(cfg, resume))  # refused on every process, reported once
                self._setup(inputs, resume)
        except BaseException:
            self._close_rewards()
            self.lock.abandon()  # a refused config leaves no empty run folder behind
            raise

    def _check(self, cfg: Config, resume: bool) -> Inputs:
        """The checks that need no weights: precision, objective, rewards, model availability, data, prompt lengths,
        memory."""
        self._phase(1, "checking the config, the data and the prompts' lengths")
        dtype = resolve_dtype(cfg.model.dtype, self.device)
        amp = resolve_amp(cfg.model.amp, self.device)
        self.spec = objective_spec(cfg)
        self.state.entropy_control = entropy_control.initial_state(self.spec)  # a resume reads it from the checkpoint
        split = split_settings(cfg, self.parallel.world)
        if self.spec.batch_coupled and split:
            self._tell(
                f"warning: objective {self.spec.name!r} is coupled across a mini-batch ({'; '.join(self.spec.batch_coupling())}), "
                f"and {', '.join(split)} splits each mini-batch over several loss calls: their summed gradient is not the "
                "mini-batch loss's. Set optim.microbatch_groups = 0 and optim.max_tokens_per_microbatch = 0 on one process "
                "for the exact loss."
            )
        self.rewards = RewardComputer(
            reward_spec(cfg.reward.kind, cfg.data.task, cfg.reward.user_fn),
            format_weight=cfg.reward.format_weight,
            format_regex=cfg.reward.format_regex,
            timeout_s=cfg.reward.timeout_s,
            workers=cfg.reward.workers or max(1, default_workers() // self.parallel.world),  # processes on one machine share its cores
            max_tasks_per_worker=cfg.reward.max_tasks_per_worker,
            memory_limit_mb=cfg.reward.memory_limit_mb,
            functions=cfg.reward.functions,
            weights=cfg.reward.weights,
        )
        check_tiny_shape(cfg.model)
        check_model_folder(cfg.model.name)
        check_model_available(cfg.model.name)
        if cfg.rollout.engine == "vllm":  # before any work: installed, a supported device, no adapters to merge
            check_vllm_available(self.device)
            if cfg.model.lora_r > 0:
                raise ValueError("rollout.engine = 'vllm' samples from full weights; with model.lora_r > 0 use rollout.engine = 'hf'")
        train_examples, eval_examples = load_splits(cfg.data, cfg.seed)
        shared = duplicate_prompts(train_examples, eval_examples)
        if shared and self.parallel.is_main:  # said once, even with --quiet
            print(f"dfpo: warning: {len(shared)} eval prompt(s) also appear in the train split (e.g. {shared[0][:60]!r}); "
                  "eval scores on them measure memorisation", file=sys.stderr, flush=True)  # fmt: skip
        check_prompts_per_step(cfg, train_examples)
        check_drift_settings(cfg, self.parallel.world)
        # lengths checked with the tokenizer alone: before any weights load or warm up
        lengths = measure_prompts(cfg, train_examples, eval_examples)
        check_memory_fits(cfg, lengths, device=self.device, world=self.parallel.world, with_ref=self.spec.needs_ref_logp, resume=resume)
        # the warm start reads raw prompts: with data.truncate_prompts, never more of one than the rollouts can keep
        sft_examples = clip_long_prompts(train_examples, lengths.char_limit) if cfg.data.truncate_prompts else train_examples
        return Inputs(dtype, amp, train_examples, eval_examples, lengths.limit, sft_examples)

    def _setup(self, inputs: Inputs, resume: bool) -> None:
        """The expensive part of construction: model, engine, stages (optimiser), checkpoint, logs."""
        from transformers.utils import logging as hf_logging  # transformers loads only when a trainer is built

        hf_logging.disable_progress_bar()
        cfg, run_dir = self.cfg, self.cfg.folder.path
        self._phase(2, self._model_phase(resume))
        if self.parallel.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_run_file(RunDir(run_dir).config, config_to_toml(cfg))  # on resume: with any --set train.steps
        seed_everything(cfg.seed)  # Python's and NumPy's generators too: identical runs write identical checkpoints
        warm = warm_folder(cfg)  # warmup.steps > 0: the cached warm-up, built by rank 0 when missing
        if warm is not None:
            self.parallel.on_rank0(lambda: ensure_warm_model(cfg, device=self.device, say=self._tell))
        self.policy = load_policy(
            cfg,
            run_dir=run_dir,
            device=self.device,
            dtype=inputs.dtype,
            resume=resume,
            with_ref=self.spec.needs_ref_logp,
            train_examples=inputs.sft_examples,
            on_rank0=self.parallel.on_rank0,
            say=self._tell,
            warm=warm,
        )
        self.parallel.shard(self.policy.model)  # FSDP2: the decoder layers are sharded, the rest stays whole
        self._phase(
            3,
            "the rollout engine, the optimiser, "
            + ("the checkpoint to resume from" if resume else "the step-0 checkpoint" if cfg.train.save_every > 0 else "no checkpoint")
            + " and the logs",
        )
        engine = rollout_engine(cfg, self.policy, self.device, inputs.amp)
        self.old_logp_stage = OldLogpStage(
            self.policy.model,
            self.policy.ref,
            self.spec,
            self.parallel,
            device=self.device,
            amp=inputs.amp,
            from_sampler=old_logp_from_sampler(cfg.rollout, inputs.amp, inputs.dtype),
            rows_per_forward=(cfg.optim.microbatch_groups or cfg.optim.minibatch_groups) * cfg.rollout.group_size,
            head_dtype=cfg.optim.head_dtype,
            shared_prompt=cfg.optim.shared_prompt,
        )
        self.update_stage = UpdateStage(
            self.policy.model,
            self.spec,
            cfg,
            self.parallel,
            self.old_logp_stage,
            device=self.device,
            amp=inputs.amp,
            vocab_size=self.policy.vocab_size,
            total_updates=cfg.train.steps * cfg.optim.epochs * (cfg.rollout.prompts_per_step // cfg.optim.minibatch_groups),
            say=self._say,
        )
        self.drift_stage = None  # log.param_drift off: no extra work at all
        if cfg.log.param_drift:
            self.drift_stage = DriftStage(
                self.policy.model,
                self.spec,
                self.update_stage.optimizer,
                log_cfg=cfg.log,
                max_grad_norm=cfg.optim.max_grad_norm,
                device=self.device,
                amp=inputs.amp,
            )
        self.rollout_stage = RolloutStage(
            cfg,
            device=self.device,
            engine=engine,
            tok=self.policy.tok,
            eos_ids=self.policy.eos_ids,
            rewards=self.rewards,
            parallel=self.parallel,
            train_examples=inputs.train_examples,
            eval_examples=inputs.eval_examples,
            max_prompt_tokens=inputs.max_prompt_tokens,
            greedy_baseline=self.spec.adv_scale in GREEDY_BASELINE,
            policy_model=self.policy.model,  # eval/tax_kl scores the policy itself, whichever engine samples (vLLM has no .model)
        )
        self.checkpointer = Checkpointer(
            cfg,
            self.parallel,
            model=self.policy.model,
            optimizer=self.update_stage.optimizer,
            scheduler=self.update_stage.scheduler,
            prompts=self.rollout_stage.prompts,
            say=self._tell,
        )
        if resume:
            self.checkpointer.restore(self.state)
            engine.sync_weights(self.policy.model)  # vLLM samples from the checkpoint's weights, not the folder's (HF: a no-op)
        elif cfg.train.save_every > 0:  # a stop during start-up or the first steps resumes from step 0 (``checkpoint_due``)
            self.checkpointer.save(0, self.state)  # it also writes the run's identity into the folder's mark
        else:
            self.checkpointer.claim()  # no checkpoint: the mark gets the run's identity now (dfpo compare checks it)
        self.logs = RunLogs.open(run_dir, cfg, writes=self.parallel.is_main, start_step=self.state.start_step)

    # -- what callers read ---------------------------------------------------------------------

    @property
    def model(self) -> torch.nn.Module:
        """The policy being trained."""
        return self.policy.model

    @property
    def step_now(self) -> int:
        return self.state.step_now

    @property
    def last_checkpoint_step(self) -> int:
        return self.state.last_checkpoint_step

    def old_logp_from_sampler(self) -> bool:
        """Whether pi_old is the sampler's own log-probs (rollout.old_logp; 'auto': when sampling is the policy itself)."""
        return self.old_logp_stage.from_sampler

    def _say(self, msg: str) -> None:
        """A per-step line (a skipped optimiser step, dropped metrics): printed unless quiet or silent."""
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def _tell(self, msg: str) -> None:
        """A start-up or progress line: printed unless silent (with --quiet too)."""
        if not self.silent:
            print(msg, file=sys.stderr, flush=True)

    START_UP_PHASES = 3

    def _phase(self, n: int, what: str) -> None:
        """One line as each phase of the start-up begins (the training steps have their progress bar or lines)."""
        self._tell(f"dfpo train: start-up {n}/{self.START_UP_PHASES}: {what}")

    def _model_phase(self, resume: bool) -> str:
        m, w = self.cfg.model, self.cfg.warmup
        if w.steps:  # the cached warm-up (``warmup``), built first when missing
            return f"the model {m.name!r} after its supervised warm-up ({w.steps} steps of {w.batch_size} examples, cached)"
        if m.name != "tiny":
            return f"loading the model {m.name!r}"
        if resume or m.sft_steps == 0:
            return "building the tiny model" if not resume else "loading the tiny model of the run folder"
        return f"building the tiny model and warming it up: {m.sft_steps} supervised steps of {m.sft_batch_size} prompts"

    # -- one step ------------------------------------------------------------------------------

    def train_step(self, step: int) -> dict:
        """Rollout -> advantages -> old (and reference) log-probs -> the K optimiser steps -> metrics."""
        cfg, clock = self.cfg, Stopwatch()
        self.state.step_now = step
        self.progress.stage = "the rollouts: sampling and scoring"
        rollout = self.rollout_stage.run(step, seed_per_group=self.state.seed_per_group)
        clock.lap("rollout")
        self.progress.stage = "the old log-probs"
        per_token = self.spec.adv_scale in TOKEN_LEVEL  # the optimal token baseline reads pi_old at every token first
        adv = advantages(
            rollout,
            self.spec,
            mask_truncated=cfg.rollout.mask_truncated,
            format_weight=cfg.reward.format_weight,
            function_weights=self.rewards.function_weights,
            token_baseline_inputs=self.old_logp_stage.token_baseline_inputs(rollout.batch) if per_token else None,
        )  # (B,), or (B, T) per token
        plan = self.update_stage.plan(step, rollout.batch)  # every optimiser step's micro-batches, this process's rows
        old = self.old_logp_stage.run(rollout, plan)  # pi_old, pi_ref
        clock.lap("old_logp")
        self._checkpoint_before_update(step)
        self.finished_is_live = False  # from here the weights are no longer the finished step's
        self.progress.stage = "the optimiser steps"
        upd = self.update_stage.run(
            step, rollout, plan, old, adv, self.state, entropy_control.step_spec(self.spec, self.state.entropy_control)
        )
        old = self.old_logp_stage.shared(old, plan, cfg.optim.epochs)  # the pi_old the first steps recorded, every row's
        control = {}
        if self.state.entropy_control is not None:  # Skywork-OR1: the next step's coefficient from this step's pi_old
            self.state.entropy_control, control = entropy_control.advance(
                self.spec, self.state.entropy_control, old.first.logp, rollout.batch.mask
            )
        clock.lap("update")
        self.progress.stage = "the metrics"
        probe_start = time.time()
        drift = {} if self.drift_stage is None else self.drift_stage.run(step, rollout, plan, old, adv)  # model left as it was
        probe_s = time.time() - probe_start
        self.rollout_stage.engine.sync_weights(self.model)  # the next rollout samples from the new weights (a no-op for HF)
        metrics = step_metrics(
            step,
            rollout,
            old,
            upd,
            lr=self.update_stage.scheduler.get_last_lr()[0],
            updates_done=self.state.updates_done,
            task=cfg.data.task,
            group_size=cfg.rollout.group_size,
            say=self._say,
        )
        metrics.update(drift)
        metrics.update(control)
        metrics.update(probe_times(clock.stage_times(recompute_s=upd.recompute_s), probe_s if drift else None))
        write_samples(self.logs.samples, step, rollout, cfg.log, cfg.rollout.group_size, self.policy.tok)
        return metrics

    def evaluate(self, step: int) -> dict:
        """avg@k and pass@k on the eval prompts (``RolloutStage.evaluate``), logged to eval.jsonl."""
        out = self.rollout_stage.evaluate(step, seed_per_group=self.state.seed_per_group)
        self._warn_tax_unavailable()
        self.logs.eval.write(out)
        self.logs.scalars.log(out, step)
        return out

    def _warn_tax_unavailable(self) -> None:
        """Say once why eval/tax_kl is left out (a resumed run without its pi_init: ``TaxMeter.unavailable``), as a
        ``dfpo: warning:`` line: the user needs it to read eval.jsonl, so it is printed with --quiet too, not with --silent."""
        meter = self.rollout_stage.tax
        if meter is None or meter.unavailable is None or self._tax_warned:
            return
        self._tax_warned = True
        if not self.silent:
            print(f"dfpo: warning: {meter.unavailable}", file=sys.stderr, flush=True)

    # -- run -----------------------------------------------------------------------------------

    def run(self, stop: StopSignals | None = None) -> dict:
        """Train to cfg.train.steps. The first SIGINT/SIGTERM is answered at once by one line (``first_signal_line``:
        what the run does, about how long it takes, what a second signal costs) and stops the run after the current
        step with a checkpoint (``TrainingInterrupted``); during an evaluation it stops at once, losing nothing (the
        evaluation runs again on resume). A second one stops at once (``StoppedAtOnce``), after writing the checkpoint
        of the last finished step while the weights are still its own (``_checkpoint_before_update``,
        ``_checkpoint_at_once``). ``stop``: the signal handling the command line installed before construction (else
        the run installs its own). The run folder's lock and the reward workers are released however the run ends."""
        threads_before = torch.get_num_threads()
        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        self.stop = StopSignals(immediate=False) if stop is None else stop
        self.stop.first_words = self._first_signal_words
        try:
            with self.stop if stop is None else contextlib.nullcontext(stop.training()):
                return self._run()
        finally:
            torch.set_num_threads(threads_before)  # the process-wide setting is left as found
            self._close_rewards()
            self.lock.release()

    def _close_rewards(self) -> None:
        if self.rewards is not None and hasattr(self.rewards, "close"):
            self.rewards.close()

    def stop_point(self) -> StopPoint:
        """Where the run stands, for the lines that answer a signal (``stop_messages``)."""
        finished = self.finished.step if self.finished is not None else self.state.start_step
        on_disk = RunDir(self.cfg.folder.path).checkpoint.is_file()
        return StopPoint(
            step_now=max(self.state.step_now, finished),
            finished=finished,
            checkpoint=self.state.last_checkpoint_step if on_disk else None,
            keeps_checkpoints=self.cfg.train.save_every > 0,
            savable=self.finished_is_live and self.parallel.alone,
            evaluating=self.evaluating,
            seconds_in=self.progress.seconds_in(),
            step_s=self.progress.step_s(),
        )

    def _first_signal_words(self, signum: int) -> None:
        """Said by the signal watcher the moment the first signal of training arrives, by rank 0 in every mode (it
        answers the user), through the bar's writer."""
        if not self.parallel.is_main:
            return
        self.progress.note = f"stopping after it ({signal.Signals(signum).name})"
        self.progress.say(f"dfpo: {first_signal_line(signum, self.stop_point())}")

    def _stop_if_asked(self, step: int) -> None:
        """After a finished step: on a signal recorded by any process, checkpoint this step (unless just
        written) and stop (every process, at the same step)."""
        signum = self.parallel.any_signal(self.stop.signum)
        if signum is not None:
            self._checkpoint_and_stop(signum, step)

    def _checkpoint_and_stop(self, signum: int, step: int, during: str = "") -> None:
        """Write the checkpoint of the finished step ``step`` (unless on disk, or the run writes none) and raise
        ``TrainingInterrupted``."""
        saves = self.cfg.train.save_every > 0
        if self.state.last_checkpoint_step != step and saves:
            if during and self.parallel.is_main:  # no first line was said: say now what the seconds of the write are for
                name = signal.Signals(signum).name
                self.progress.say(f"dfpo: {name}: {during} stopped at once; writing the checkpoint of step {step}, then stopping")
            finished = self.finished if self.finished is not None and self.finished.step == step else None
            self.checkpointer.save(step, self.state, finished=finished)
        checkpointed = saves or self.state.last_checkpoint_step == step > 0
        raise TrainingInterrupted(signum, step, self.cfg.folder.path, checkpointed=checkpointed, during=during)

    def _checkpoint_before_update(self, step: int) -> None:
        """A first signal came during step ``step`` before its optimiser steps: write the checkpoint of the finished
        step ``step - 1`` now, while the weights and the optimiser are still its own, so that a second signal during
        the optimiser steps loses no finished step. Every process decides at the same point (the signal is agreed on
        as in ``_stop_if_asked``); nothing is asked when that checkpoint is on disk already."""
        f = self.finished
        if self.stop is None or f is None or self.cfg.train.save_every == 0 or self.state.last_checkpoint_step == f.step:
            return
        if self.parallel.any_signal(self.stop.signum) is None:
            return
        self.progress.stage = f"the checkpoint of step {f.step}, before the optimiser steps"
        self.checkpointer.save(f.step, self.state, finished=f)

    def _checkpoint_at_once(self) -> None:
        """A stop at once (a second signal) during training: write the checkpoint of the last finished step when the
        weights and the optimiser still hold it, it is not on disk, and its own write was not what the signal cut
        short. One process only: on several, the others may be anywhere, and a checkpoint needs them all. A write
        that fails or that a further signal cuts short keeps the previous checkpoint (the stop's line says which)."""
        f = self.finished
        if (
            f is None
            or self.stop is None
            or not self.finished_is_live
            or not self.parallel.alone
            or self.cfg.train.save_every == 0
            or self.state.last_checkpoint_step == f.step
            or self.checkpointer.failed_step == f.step
        ):
            return
        self.stop.handled()  # no redelivery of the signal in the middle of the write
        with contextlib.suppress(WriteFailed):
            self.checkpointer.save(f.step, self.state, finished=f)

    def close(self) -> None:
        """Close the logs and release the run folder without training (``run`` does this itself)."""
        self.logs.close()
        self._close_rewards()
        self.lock.release()

    # -- what the run says --------------------------------------------------------------------

    def _progress_write(self, line: str) -> None:
        """One line on stderr, through the bar's writer while a bar is drawn (the bar is drawn again below it)."""
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def _say_progress(self, line: str) -> None:
        """A line of the default mode (an evaluation's start and end), bar-safe: not with --quiet or --silent."""
        if not self.quiet:
            self.progress.say(line)

    def _show_step(self, m: dict, step: int, loop_s: float) -> None:
        """The bar moves one step (its estimate: the recent steps' seconds, evaluations apart), or without a bar a
        progress line when one is due."""
        cfg = self.cfg
        left = time_left(
            cfg.train.steps - step, evals_left(step, cfg.train.steps, cfg.eval.every), self.progress.step_s(), self.progress.eval_s()
        )
        if self._bar is not None:
            self._bar.set_postfix_str(bar_postfix(m["reward/mean"], self.progress.step_s(), left), refresh=False)
            self._bar.update(1)
            self.progress.shown()
        elif not self.silent and self.progress.due():
            self.progress.say(progress_line(step, cfg.train.steps, m["reward/mean"], loop_s, left))

    # -- the loop -------------------------------------------------------------------------------

    def _step(self, step: int) -> dict:
        """``train_step``, timed, its metrics logged; then it is the last finished step (``finished``)."""
        self.progress.begin(f"step {step} of {self.cfg.train.steps}")
        m = self.train_step(step)
        self.logs.metrics.write(m)
        self.logs.scalars.log(m, step)
        self.progress.step_done(self.progress.seconds_in())
        self.finished, self.finished_is_live = self.checkpointer.finished_step(step, self.state), True
        return m

    def _evaluate_in_loop(self, step: int, *, final: bool = False) -> dict:
        """``evaluate`` after step ``step``, with a line before it (what it evaluates, how many prompts) and one after
        (its scores, its seconds), not with --quiet. On one process a signal during it stops it at once
        (``StopSignals.at_once``): it is no part of the training state and runs again on resume, so the run writes
        the checkpoint of step ``step`` (unless on disk) and stops, losing nothing. On several processes the signal
        waits for its end; the run then stops before the next step."""
        n, k = len(self.rollout_stage.eval_examples), self.cfg.eval.k
        what = f"{n} held-out prompts x {k} samples"
        self.progress.begin(f"the evaluation at step {step}", what)
        self._say_progress(f"dfpo train: evaluation at step {step}: avg@{k} and pass@{k} on {what}")
        self.evaluating = True
        try:
            with self.stop.at_once() if self.parallel.alone else contextlib.nullcontext():
                out = self.evaluate(step)
        except BaseException as err:
            stopped = stop_beneath(err)
            if stopped is None:
                raise
            self.stop.handled()  # no redelivery of the signal in the middle of the checkpoint
            self.evaluating = False
            self._checkpoint_and_stop(stopped.signum, step, during=f"the evaluation at step {step}")
        finally:
            self.evaluating = False
        seconds = self.progress.seconds_in()
        self.progress.eval_done(seconds)
        self._say_progress(f"dfpo train: evaluation at step {step} done in {duration(seconds)}: {eval_scores(out)}")
        if not final:
            self._stop_if_asked(step)
        return out

    def _run(self) -> dict:
        cfg, start = self.cfg, self.state.start_step
        if cfg.log.progress and not self.quiet:
            self._bar = progress_bar(cfg.train.steps, start)
        t_start, cpu_start = time.monotonic(), time.process_time()
        start_up_s = t_start - self.built_at
        self.finished, self.finished_is_live = self.checkpointer.finished_step(start, self.state), True
        if not self.silent:
            self.progress.start_heartbeat()
        try:
            self._stop_if_asked(start)  # a signal during start-up: the step-0 (or resumed) checkpoint is there
            for s in range(start, cfg.train.steps):
                if cfg.eval.every and s % cfg.eval.every == 0:
                    self._evaluate_in_loop(s)
                m = self._step(s + 1)
                if checkpoint_due(s + 1, cfg.train):
                    self.checkpointer.save(s + 1, self.state, finished=self.finished)
                self._show_step(m, s + 1, time.monotonic() - t_start)
                self._stop_if_asked(s + 1)
            final_eval = self._evaluate_in_loop(cfg.train.steps, final=True) if cfg.eval.every else {}
        except BaseException as err:
            if stop_beneath(err) is not None:  # a stop at once: keep the last finished step if it can still be written
                self._checkpoint_at_once()
            raise
        finally:
            self.progress.stop_heartbeat()
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            self.logs.close()
        if not self.parallel.is_main:  # rank 0 reads the log and writes the summary
            return {}
        run_dir = cfg.folder.path
        loop_s, loop_cpu_s = time.monotonic() - t_start, time.process_time() - cpu_start
        summary = run_summary(run_dir, cfg.eval.kappa)
        summary.update(
            {"final_eval": final_eval, "wall_s_start_up": start_up_s, "wall_s_training_loop": loop_s, "cpu_s_training_loop": loop_cpu_s}
        )
        write_run_file(RunDir(run_dir).summary, json.dumps(summary, indent=2, sort_keys=True))
        self._tell(
            f"dfpo train: done, {cfg.train.steps - start} steps in {loop_s:.1f} s ({start_up_s:.1f} s before the first); "
            f"{RunDir(run_dir).summary} written"
        )
        return summary


def checkpoint_due(step: int, train_cfg) -> bool:
    """Whether training step ``step`` ends with a checkpoint: every ``save_every`` steps (0: never during the run), and
    the last step when ``save_final``."""
    if step == train_cfg.steps:
        return train_cfg.save_final
    return train_cfg.save_every > 0 and step % train_cfg.save_every == 0


def probe_times(times: dict[str, float], probe_s: float | None) -> dict[str, float]:
    """The step's ``time/*`` with the probe's trial step (``log.param_drift``) apart: ``time/probe_s`` its seconds on a
    probed step (``probe_s``; None: not probed, no key), taken out of ``time/step_s``, which then holds the rollout,
    old log-probs, update and metrics only, as on a run without the probe."""
    if probe_s is None:
        return times
    return {**times, "time/step_s": times["time/step_s"] - probe_s, "time/probe_s": probe_s}


def progress_line(step: int, steps: int, reward: float, loop_s: float, left_s: float | None = None) -> str:
    """The progress line printed without a bar: the step, the step's mean train reward, the loop's seconds so far and
    the time left (``progress.time_left``: steps and evaluations each at their own rate) when known."""
    left = f", about {duration(left_s)} left" if left_s is not None else ""
    return (
        f"dfpo train: step {step}/{steps}, reward {reward:.3f} (mean of the step's rollouts), {duration(loop_s)} in the training loop{left}"
    )


BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"
"""tqdm's bar without its own rate and estimate (they would count an evaluation as a step): ``bar_postfix`` says ours."""


def progress_bar(steps: int, start: int):
    """The tqdm bar of the training steps on stderr (its estimate is ``bar_postfix``'s)."""
    from tqdm import tqdm

    return tqdm(
        total=steps,
        initial=start,
        desc="dfpo train",
        unit="step",
        dynamic_ncols=True,
        mininterval=2.0,
        bar_format=BAR_FORMAT,
        file=sys.stderr,
    )


def bar_postfix(reward: float, step_s: float | None, left_s: float | None) -> str:
    """The bar's text after the elapsed time: the last step's mean reward, the recent steps' seconds (evaluations left
    out) and the time left."""
    rate = f", {step_s:.1f} s/step" if step_s is not None else ""
    left = f", ~{duration(left_s)} left" if left_s is not None else ""
    return f"reward={reward:.3f}{rate}{left}"


def eval_scores(out: dict) -> str:
    """An evaluation's scores in one phrase: 'avg@2 0.156, pass@2 0.281'."""
    return ", ".join(
        f"{key.split('/', 1)[1]} {value:.3f}" for key, value in out.items() if key.startswith("eval/") and isinstance(value, float)
    )


def train(cfg: Config, *, resume: bool = False, quiet: bool = False, silent: bool = False) -> dict:
    """Run (or resume) a training run; returns the run summary."""
    return Trainer(cfg, resume=resume, quiet=quiet, silent=silent).run()
