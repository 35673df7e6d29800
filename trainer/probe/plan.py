"""``dfpo probe``'s plan: what to probe (labels, their matched controls, seeds, the config or run folder, the
outputs), every input checked before any work. The numbered choices (choice 2, ...) are those of ``dfpo.trainer.probe.command``'s docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...core.files import check_writable_folder
from ...core.loss import objective_from_label, unmatched_components
from ...core.loss.advantages import GREEDY_BASELINE, LENGTH_WEIGHTED, MULTI_REWARD, TOKEN_LEVEL
from ..config import Config, load_config

PROBE_DEFAULTS = (
    "model.sft_steps=100",
    "data.task=add",
    "data.max_operand=9",
    "data.eval_size=32",
    "rollout.prompts_per_step=16",
    "rollout.group_size=8",
    "rollout.max_new_tokens=5",
    "optim.lr=3e-4",
    "threads=1",
)
"""The tiny preset of configs/tiny-cpu.toml (model, warm start, task, rollout, learning rate) with 16 prompts a batch
(choice 2)."""
EQUIV_SETS = ("data.task=equiv", "model.sft_steps=300")
"""``--set`` these for equivalent pairs: the equiv task, whose correct answers have several surface forms, and a
warm start long enough that a group holds two correct ones (choice 2)."""


@dataclass(frozen=True)
class ProbePlan:
    """What to probe: labels, their matched controls, seeds, the config, the run folder (or None) and the outputs."""

    labels: tuple[str, ...]
    controls: dict[str, str]
    seeds: tuple[int, ...]
    config: Config
    run: Path | None
    move_steps: int
    max_events: int
    out: Path
    command: str


def matched_controls(labels: Sequence[str]) -> dict[str, str]:
    """{label with a group transform: the first label without one whose trust region it shares}."""
    specs = {label: objective_from_label(label) for label in labels}
    out = {}
    for label, spec in specs.items():
        if spec.transform == "none":
            continue
        control = next((c for c, s in specs.items() if s.transform == "none" and not unmatched_components(spec, s)), None)
        if control is not None:
            out[label] = control
    return out


READS_MORE_THAN_THE_TOTAL = (*LENGTH_WEIGHTED, *MULTI_REWARD, *GREEDY_BASELINE, *TOKEN_LEVEL)
"""Advantage estimators the probe cannot compute from the rollout's total rewards alone: the scales of
``dfpo.core.loss.advantages`` that read completion lengths, reward columns, a greedy completion or per-token statistics."""
PROBE_INPUTS = ("entropy", "ref_logp", "rollout_logp", "token_ids")
"""The loss inputs beyond the batch's that the probe computes (choices 4 and 5); a label reading another is refused."""


def make_plan(
    *,
    objectives: str,
    seeds: int,
    first_seed: int,
    config: str | None,
    sets: list[str] | None,
    run: str | None,
    move_steps: int,
    max_events: int,
    out: str,
    command: str = "",
) -> ProbePlan:
    """Every input checked before any work: labels, seeds, steps, the config or run folder, the output folder."""
    labels = tuple(x.strip() for x in objectives.split(",") if x.strip())
    if not labels:
        raise ValueError(f"--objectives needs at least one objective label, got --objectives {objectives!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"--objectives repeats a label: {objectives!r}")
    for label in labels:
        spec = objective_from_label(label)  # names the bad label or component
        if spec.adv_scale in READS_MORE_THAN_THE_TOTAL:
            raise ValueError(
                f"--objectives {label!r}: the probe gives each label advantages of the rollout's total rewards, and "
                f"adv_scale={spec.adv_scale!r} reads more (lengths, reward columns, a greedy completion or per-token "
                "statistics): probe another adv_scale, or train it with dfpo train"
            )
        missing = {k: why for k, why in spec.required_inputs().items() if k not in PROBE_INPUTS}
        if missing:
            raise ValueError(
                f"--objectives {label!r} reads {', '.join(f'{k} ({why})' for k, why in missing.items())}, which the probe "
                f"does not compute (it computes {', '.join(PROBE_INPUTS)}): probe it without that term, or train it with dfpo train"
            )
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got --seeds {seeds}")
    if first_seed < 0 or first_seed + seeds > 2**32:
        raise ValueError(f"--first-seed must be in [0, 2^32 - seeds], got --first-seed {first_seed}")
    if move_steps < 0:
        raise ValueError(f"--move-steps must be >= 0, got --move-steps {move_steps}")
    if max_events < 1:
        raise ValueError(f"--max-events must be >= 1, got --max-events {max_events}")
    if run is not None:
        if config is not None or sets:
            raise ValueError("--run probes the run folder's own config and checkpoint; drop --config and --set")
        cfg = run_config(Path(run))
    else:
        cfg = load_config(config, [*(PROBE_DEFAULTS if config is None else ()), *(sets or [])])
    if cfg.rollout.group_size < 2:
        raise ValueError(f"rollout.group_size must be >= 2 for groups, got {cfg.rollout.group_size}")
    check_writable_folder("--out", out)
    return ProbePlan(
        labels,
        matched_controls(labels),
        tuple(range(first_seed, first_seed + seeds)),
        cfg,
        None if run is None else Path(run),
        move_steps,
        max_events,
        Path(out),
        command,
    )


def run_config(run_dir: Path) -> Config:
    """The config of a run folder with a checkpoint, read without writing anything (``--run``); ValueError naming the
    folder for anything else."""
    from ..run.checkpoint import check_checkpoint
    from ..run.resume import resume_config

    cfg = resume_config(run_dir, [])  # its config.toml, checked against the checkpoint's record
    check_checkpoint(run_dir)  # checksum and contents, before any work
    return cfg
