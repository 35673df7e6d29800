"""``ToyConfig``: one toy experiment. Light on purpose (no torch), so the CLI can build its options from it.

Every field is declared once with ``dfpo.core.settings.setting``: its default, its help text (the
``Setting`` doc) and its bounds or choices. ``dfpo toy``'s options, their defaults and their help are read
from here, never declared a second time; ``dfpo.toy.train.validate`` checks the bounds and choices through
``check_config`` and docs/config.md is generated from the same declarations. Command-line metadata beside
the ``Setting``: ``short`` (a one-letter flag), ``cli`` (False: not an option), ``flag`` (the option's name
when it is not the field's) and ``pairs`` (KEY=VALUE pairs, parsed by ``dfpo.core.settings.parse_value``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..core.settings import Bounds, check_fields, setting

MODES = ("sampled", "exact")
OPTIMIZERS = ("adam", "sgd")
MATCH_STEP = ("none", "steps", "update")
"""How ``--match-step`` calibrates a control's learning rate: not at all, on steps to kappa, on the update norm."""
DEFAULT_OBJECTIVES = ("gspo", "dfpo_min", "dfpo_orth_pos", "grpo", "grpo_fix", "stapo")
ADAM_LR = 0.05
"""The learning rate the CLI uses for ``--optimizer adam`` when ``--lr`` is not given."""


@dataclass(frozen=True)
class ToyConfig:
    """One toy experiment: a task, training options and the objectives to compare."""

    task: str = setting("tenplusten", "tenplusten (paper App. A) or family (parametric)")
    task_options: Mapping[str, object] = setting(
        factory=dict, doc="task option, e.g. k=4 distractors=2 (family) or distractors=false", flag="task-opt", pairs=True
    )
    objectives: tuple[str, ...] = setting(
        DEFAULT_OBJECTIVES, "objective labels: a preset of dfpo.OBJECTIVES with optional overrides (dfpo_min:stopgrad=score)", cli=False
    )
    overrides: Mapping[str, object] = setting(
        factory=dict,
        doc="objective component override for every objective, e.g. eps_low=0.2 (a label's own overrides win)",
        flag="override",
        pairs=True,
    )
    mode: str = setting(
        "sampled", "sampled (G completions a group) or exact (every completion, weighted by its probability)", choices=MODES
    )
    seeds: int = setting(8, "independent runs, batched", bounds=Bounds(1))
    steps: int = setting(300, "rollout batches", bounds=Bounds(1))
    group_size: int = setting(8, "G, completions per group (sampled mode)", bounds=Bounds(2), short="G")
    inner_steps: int = setting(4, "K, optimiser steps per rollout batch (K > 1 moves the ratios away from 1)", bounds=Bounds(1), short="K")
    minibatches: int = setting(
        1, "mini-batches (whole groups) per rollout batch; optimiser step k uses mini-batch k mod this", bounds=Bounds(1)
    )
    groups_per_step: int = setting(0, "groups per rollout batch; 0 means one per prompt, prompts used in turn", bounds=Bounds(0))
    optimizer: str = setting(
        "sgd", "sgd (the update theta + eta g that Prop. 3.1 analyses) or adam (per-coordinate normalisation)", choices=OPTIMIZERS
    )
    lr: float = setting(0.5, f"learning rate ({ADAM_LR} is the command line's default for adam)", bounds=Bounds(0, low_open=True))
    init_noise: float = setting(0.1, "std of the per-seed Gaussian noise on the prior logits", bounds=Bounds(0))
    seed: int = setting(0, "base random seed (initial noise and sampling; the same for every objective)")
    kappa: float = setting(0.95, "threshold of Steps(E[R] >= kappa), eq 19", bounds=Bounds())
    exact_limit: int = setting(200_000, "most completions exact mode (and the exact metrics) will enumerate", cli=False)
    match_step: str = setting(
        "none",
        "what the step-size-matched controls were calibrated on: none, steps (steps to kappa) or update (update norm)",
        choices=MATCH_STEP,
        cli=False,
    )
    step_matched: Mapping[str, str] = setting(
        factory=dict,
        doc="step-size-matched control label (CONTROL@lr=...) -> the methods it was calibrated for, comma-separated",
        cli=False,
    )


def check_config(config: ToyConfig) -> None:
    """Every field's type, bounds and choices from its declaration; ValueError naming the field and its value."""
    check_fields(config)
