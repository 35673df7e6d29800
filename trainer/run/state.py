"""What a run carries from step to step and keeps in its folder: counters, checkpoints, logs.

``RunState`` holds the counters a checkpoint carries besides the tensors (the step, the non-finite skips in a
row, the optimiser steps taken, whether rollouts are seeded per group). ``Checkpointer`` writes and restores
``checkpoint.pt`` in the one-process format whatever the parallel strategy (whole tensors; the world size that
trained it is recorded), through ``checkpoint.save_checkpoint`` / ``load_checkpoint`` (atomic, checksummed, with
the config it was made with); the run's first checkpoint writes its identity into the folder's mark. ``RunLogs``
are the run folder's JSON Lines logs and scalars, written by rank 0; a log that cannot be written, trimmed or
closed (a full disk) is one ``WriteFailed`` sentence.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path

from ...core.files import WriteFailed, describe_write_error
from .. import entropy_control
from ..config import Config, config_to_dict
from ..parallel import OneProcess
from .checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from .folder import run_identity, write_mark
from .layout import RunDir
from .logs import JsonlLog, NullLog, Scalars, missing_steps
from .resume import check_same_config


@dataclass
class RunState:
    """The counters of a run (checkpointed with its tensors)."""

    seed_per_group: bool
    """Rollouts draw each group from its own seed (``rollout.seed_per_group``; kept once a run was seeded so)."""
    start_step: int = 0
    """The step this session started from (0, or the resumed checkpoint's)."""
    step_now: int = 0
    """The training step being run (or last run)."""
    last_checkpoint_step: int = 0
    nonfinite_in_row: int = 0
    """Optimiser steps skipped in a row for a non-finite loss or gradient."""
    updates_done: int = 0
    """Optimiser steps taken."""
    entropy_control: entropy_control.EntropyControl | None = None
    """Skywork-OR1's adaptive entropy coefficient as the last step left it (None: the objective's is fixed)."""


@dataclass
class RunLogs:
    """metrics.jsonl, eval.jsonl, samples.jsonl and the scalars (TensorBoard, wandb) of a run; nothing on ranks > 0."""

    metrics: JsonlLog | NullLog
    eval: JsonlLog | NullLog
    samples: JsonlLog | NullLog
    scalars: Scalars
    run_dir: Path

    @classmethod
    def open(cls, run_dir: Path, cfg: Config, *, writes: bool, start_step: int) -> RunLogs:
        log = lambda name: JsonlLog(run_dir / name) if writes else NullLog()  # noqa: E731
        scalars = Scalars(
            run_dir, cfg.log.tensorboard and writes, cfg.log.wandb_project if writes else "", start_step or None, config_to_dict(cfg)
        )
        return cls(*(log(name) for name in RunDir.LOGS), scalars, run_dir)

    def close(self) -> None:
        """Close every log; a log whose last line cannot be flushed (a full disk) is ``WriteFailed`` once all are closed."""
        failed = None
        for log in (self.metrics, self.eval, self.samples, self.scalars):
            try:
                log.close()
            except OSError as err:
                failed = failed or (getattr(log, "path", RunDir(self.run_dir).tensorboard), err)
        if failed is not None:
            raise WriteFailed(
                f"closing {describe_write_error(*failed)}; the last checkpoint is kept. Free space, then continue with: "
                f"dfpo train --resume {self.run_dir}"
            )


@dataclass(frozen=True)
class FinishedStep:
    """What a checkpoint of a finished step holds besides the weights and the optimiser's state, taken as the step
    ends (``Checkpointer.finished_step``): the schedule, the prompt order, the RNG states and the counters, a few
    kilobytes. The next step moves all of them before its first optimiser step changes the weights, so with these a
    checkpoint of the finished step can still be written until then (``Checkpointer.save(finished=...)``)."""

    step: int
    parts: dict


class Checkpointer:
    """Saves and restores the training state of a run: trainable parameters, optimiser, schedule, prompt order,
    RNG states and the ``RunState`` counters."""

    def __init__(self, cfg: Config, parallel: OneProcess, *, model, optimizer, scheduler, prompts, say):
        self.cfg, self.parallel, self.say = cfg, parallel, say
        self.run_dir = cfg.folder.path
        self.model, self.optimizer, self.scheduler, self.prompts = model, optimizer, scheduler, prompts
        self.marked = False
        """Whether this session's first checkpoint has written the folder's mark (checkpointed, with the identity)."""
        self.failed_step: int | None = None
        """The step of the last checkpoint whose write failed or was cut short (by a signal: whoever sent it wants out,
        so a stop at once does not write it again)."""

    @property
    def path(self) -> Path:
        return RunDir(self.run_dir).checkpoint

    def finished_step(self, step: int, state: RunState) -> FinishedStep:
        """The parts of the checkpoint of ``step`` that are not weights or optimiser state, as they are now (copies)."""
        parts = {
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "sampler": dict(self.prompts.state_dict()),
            "rng": rng_state(),
            "nonfinite_in_row": state.nonfinite_in_row,
            "updates_done": state.updates_done,
            "seed_per_group": state.seed_per_group,
        }
        if state.entropy_control is not None:
            parts[entropy_control.CHECKPOINT_KEY] = entropy_control.state_dict(state.entropy_control)
        return FinishedStep(step, parts)

    def save(self, step: int, state: RunState, *, finished: FinishedStep | None = None) -> Path:
        """Rank 0 writes the checkpoint: whole tensors, the one-process format, and the world size that trained it.
        ``finished``: the parts of the finished step ``step`` taken as it ended (the weights and optimiser must still
        be its own), else those of now. ``state.last_checkpoint_step`` is ``step`` once the checkpoint is written."""
        if finished is not None and finished.step != step:
            raise ValueError(f"the parts of step {finished.step} cannot make the checkpoint of step {step}")
        try:
            path = self._save(step, finished or self.finished_step(step, state))
        except BaseException:
            self.failed_step = step
            raise
        state.last_checkpoint_step = step
        return path

    def _save(self, step: int, finished: FinishedStep) -> Path:
        if not self.parallel.builds_checkpoint:  # DDP, rank > 0: rank 0 holds the same parameters and optimiser state
            self.parallel.on_rank0(lambda: None)
            return self.path
        parts = finished.parts
        content = {
            "step": step,
            "model": self.parallel.trainable_state(self.model),
            "optimizer": self.parallel.optimizer_state(self.optimizer),
            **{k: parts[k] for k in ("scheduler", "sampler", "rng", "nonfinite_in_row", "updates_done")},
            "world_size": self.parallel.world,
            **{k: v for k, v in parts.items() if k not in ("scheduler", "sampler", "rng", "nonfinite_in_row", "updates_done")},
        }  # the keys in the order checkpoints were always written (identical runs write identical bytes)

        def write() -> Path:
            config = config_to_dict(self.cfg)
            path = save_checkpoint(self.run_dir, content, config=config)
            if not self.marked:  # the folder holds a checkpoint, never a start-up leftover, of this run (step 0, or the
                # first one of a run with train.save_every = 0: its last)
                write_mark(self.run_dir, checkpointed=True, identity=run_identity(config))
                self.marked = True
            return path

        return self.parallel.on_rank0(write) or self.path

    def claim(self) -> None:
        """Write the run's identity into the folder's mark without a checkpoint (a run with train.save_every = 0), as
        its first checkpoint would: ``dfpo compare`` checks a finished folder's run by it."""
        self.parallel.on_rank0(lambda: write_mark(self.run_dir, checkpointed=False, identity=run_identity(config_to_dict(self.cfg))))

    def restore(self, state: RunState) -> None:
        """Load the run folder's checkpoint into the model, optimiser, schedule, prompt order, RNGs and ``state``
        (checked against the config first); drop log lines past its step."""
        saved = load_checkpoint(self.run_dir)
        check_same_config(self.run_dir, saved.get("config"), self.cfg)
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(saved["model"]) != names:
            raise ValueError(f"--resume {self.run_dir}: checkpoint parameters do not match the model (was the config edited?)")
        for n, p in self.model.named_parameters():
            if n in saved["model"]:
                self.parallel.load_parameter(p, saved["model"][n])
        self.parallel.load_optimizer_state(self.optimizer, saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        self.prompts.load_state_dict(saved["sampler"])
        set_rng_state(saved["rng"])
        c = state.start_step = state.last_checkpoint_step = int(saved["step"])
        state.nonfinite_in_row = int(saved["nonfinite_in_row"])
        state.updates_done = int(saved["updates_done"])
        if state.entropy_control is not None:
            state.entropy_control = entropy_control.load_state(saved, self.run_dir)
        saved_world, world = int(saved.get("world_size", 1)), self.parallel.world
        was_seeded = bool(saved.get("seed_per_group", self.cfg.rollout.seed_per_group))
        state.seed_per_group = state.seed_per_group or was_seeded  # a run seeded per group stays so on any world size
        if saved_world != world and self.parallel.is_main:  # said even with --quiet: the run goes on differently laid out
            print(f"dfpo: resuming {self.run_dir} on {world} process(es); the checkpoint (step {c}) was written by a run on "
                  f"{saved_world}: the world size changed", file=sys.stderr, flush=True)  # fmt: skip
            if not was_seeded and state.seed_per_group:
                print("dfpo: note: rollouts are now seeded per group (rollout.seed_per_group), as on more than one process; "
                      "they no longer continue the single-process random stream", file=sys.stderr, flush=True)  # fmt: skip
        if self.parallel.is_main:
            self.truncate_logs(c)
        self.say(f"resumed {self.run_dir} at step {c}")

    def truncate_logs(self, c: int) -> None:
        """Drop log lines past the checkpoint's step ``c`` (they are re-run); warn about lines lost before it. A log
        that cannot be rewritten (a full disk) stays as it was: ``WriteFailed``."""
        for name, keep in (
            (RunDir.METRICS, lambda r: r.get("step", 0) <= c),
            (RunDir.SAMPLES, lambda r: r.get("step", 0) <= c),
            (RunDir.EVALS, lambda r: r.get("step", 0) < c),
        ):
            try:
                JsonlLog.truncate(self.run_dir / name, keep)
            except OSError as err:
                raise WriteFailed(
                    f"rewriting {describe_write_error(self.run_dir / name, err)}; the log and the checkpoint are as they were. "
                    f"Free space, then continue with: dfpo train --resume {self.run_dir}"
                ) from None
        lost = missing_steps(JsonlLog.read(RunDir(self.run_dir).metrics), c)
        if lost:  # said even with --quiet: the log will have a gap
            print(f"dfpo: warning: metrics.jsonl of {self.run_dir} has no line for step(s) {lost[:10]}{' ...' if len(lost) > 10 else ''} "
                  f"(lost before the checkpoint at step {c}); they are not re-run", file=sys.stderr, flush=True)  # fmt: skip
