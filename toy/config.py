"""``ToyConfig``: one toy experiment. Light on purpose (no torch), so the CLI can build its options from it.

Every field carries its help text in ``metadata["help"]``; ``dfpo toy``'s options, their defaults and
their help are read from here, never declared a second time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MODES = ("sampled", "exact")
OPTIMIZERS = ("adam", "sgd")
DEFAULT_OBJECTIVES = ("gspo", "dfpo_min", "dfpo_orth_pos", "grpo", "grpo_fix", "stapo")
ADAM_LR = 0.05
"""The learning rate the CLI uses for ``--optimizer adam`` when ``--lr`` is not given."""


def _opt(default, help: str, *, short: str | None = None, cli: bool = True):
    """A field with its command-line help (and a one-letter flag, if any)."""
    return field(default=default, metadata={"help": help, "short": short, "cli": cli})


@dataclass(frozen=True)
class ToyConfig:
    """One toy experiment: a task, training options and the objectives to compare."""

    task: str = _opt("tenplusten", "tenplusten (paper App. A) or family (parametric)")
    task_options: Mapping[str, object] = field(
        default_factory=dict,
        metadata={"help": "task option, e.g. k=4 distractors=2 (family) or distractors=false", "flag": "task-opt", "pairs": True},
    )
    objectives: tuple[str, ...] = field(
        default=DEFAULT_OBJECTIVES,
        metadata={"help": "objective labels: a preset of dfpo.OBJECTIVES with optional overrides (dfpo_min:stopgrad=score)", "cli": False},
    )
    overrides: Mapping[str, object] = field(
        default_factory=dict,
        metadata={
            "help": "objective component override for every objective, e.g. eps_low=0.2 (a label's own overrides win)",
            "flag": "override",
            "pairs": True,
        },
    )
    mode: str = _opt("sampled", "sampled (G completions a group) or exact (every completion, weighted by its probability)")
    seeds: int = _opt(8, "independent runs, batched")
    steps: int = _opt(300, "rollout batches")
    group_size: int = _opt(8, "G, completions per group (sampled mode)", short="G")
    inner_steps: int = _opt(4, "K, optimiser steps per rollout batch (K > 1 moves the ratios away from 1)", short="K")
    minibatches: int = _opt(1, "mini-batches (whole groups) per rollout batch; optimiser step k uses mini-batch k mod this")
    groups_per_step: int = _opt(0, "groups per rollout batch; 0 means one per prompt, prompts used in turn")
    optimizer: str = _opt("sgd", "sgd (the update theta + eta g that Prop. 3.1 analyses) or adam (per-coordinate normalisation)")
    lr: float = _opt(0.5, f"learning rate ({ADAM_LR} is the command line's default for adam)")
    init_noise: float = _opt(0.1, "std of the per-seed Gaussian noise on the prior logits")
    seed: int = _opt(0, "base random seed (initial noise and sampling; the same for every objective)")
    kappa: float = _opt(0.95, "threshold of Steps(E[R] >= kappa), eq 19")
    exact_limit: int = _opt(200_000, "most completions exact mode (and the exact metrics) will enumerate", cli=False)
