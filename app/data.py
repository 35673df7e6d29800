"""What the explorer's pages show, as plain functions (no Streamlit here, so tests call them directly).

Every number comes from the project's own code: the loss core (``policy_loss`` through the
shared-prefix probe of ``dfpo.core.loss.cancellation``), the toy lab and the claims ledger (run
folders are read by ``dfpo.app.runs``). Bad input raises ``ValueError`` with a sentence a page can show.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..core import stats
from ..core.loss import AGGREGATIONS, OBJECTIVES, resolve_objective
from ..core.loss.cancellation import (  # noqa: F401  the atlas lives with the core
    ATLAS_COLUMNS,
    CANCEL_TOL,
    AtlasCell,
    SharedPrefixGroup,
    atlas,
    atlas_draws,
    atlas_rows,
    group_breakdown,
    make_shared_prefix_group,
    shared_token_gradient,
)
from ..core.settings import finite_number
from ..toy import train as toy_train
from ..toy.checks import PREDICTIONS, comparison_pairs
from ..toy.cli import toy_threads
from ..toy.config import ToyConfig
from ..toy.report import prediction_checks, summarise, summary_table, to_numpy
from ..toy.tasks import count_completions, enumerate_completions
from . import cache, jobs

PREFIX_LEN = 3
"""Shared positions of the hand-made group ('The answer is' in the paper's 10+10 example)."""
DEFAULT_REWARDS = (0.0, 1.0, 1.0, 0.0)
"""The paper's App. A group: 'The answer is 25 .', 'The answer is 20 .' twice, '... 25 .' again."""
DEFAULT_LENGTHS = (5, 5, 5, 5)
COMPONENTS = ("stopgrad", "aggregation", "length_aware", "eps_low", "eps_high")
"""The objective components the cancellation page lets a user change."""
MAX_COMPLETIONS = 64
"""Most completions (rewards) of the cancellation page's group."""
MAX_LENGTH = 4096
"""Longest completion of the cancellation page's group, in tokens: the group is a G x max-length table."""
SEED_RANGE = (0, 2**16)
"""Seeds the pages accept (both ends included)."""


def parse_numbers(text: str, name: str, cast=float) -> list:
    """'1, 0, 1' -> [1.0, 0.0, 1.0]; ValueError naming the field and the bad entry (``cast=int``: whole numbers)."""
    out = []
    for item in filter(None, (x.strip() for x in text.replace(";", ",").split(","))):
        try:
            value = cast(item)
        except ValueError:
            kind = "a whole number" if cast is int else "a number"
            raise ValueError(f"{name}: {item!r} is not {kind}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name}: {item!r} is not a finite number")
        out.append(value)
    return out


def whole_number(value, name: str, low: int, high: int) -> int:
    """A number box's value as an int: ValueError naming it and its range when it is not a whole number in [low, high].

    The boxes pass on whatever is typed (a browser rounds 2.5 to 2 in a box for whole numbers, and keeps a value
    outside a box's own bounds from the page while showing it), so the page checks it here."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value != int(value):
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {name}={value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {name}={value:g}")
    return int(value)


def components_of(objective: str) -> dict[str, object]:
    """The preset's own value of each of COMPONENTS (what the page shows when the objective is chosen)."""
    spec = OBJECTIVES[objective]
    return {name: getattr(spec, name) for name in COMPONENTS}


def component_overrides(objective: str, chosen: dict[str, object]) -> dict[str, object]:
    """The components of ``chosen`` that differ from the preset's own: only these are overrides."""
    own = components_of(objective)
    return {name: value for name, value in chosen.items() if name in own and value != own[name]}


def cancellation_case(
    objective: str, rewards: list[float], lengths: list[int], *, shared_log_ratio: float, scale: float, seed: int, **overrides
):
    """The shared-token breakdown of one hand-made group, or ValueError saying why nothing can move."""
    if len(rewards) < 2:
        raise ValueError(f"a group needs G >= 2 completions, got G={len(rewards)}: with one completion every advantage is 0")
    if len(rewards) > MAX_COMPLETIONS:
        raise ValueError(f"this page takes at most {MAX_COMPLETIONS} completions, got G={len(rewards)} rewards: give fewer")
    if len(lengths) != len(rewards):
        raise ValueError(f"give one length per completion: {len(rewards)} rewards but {len(lengths)} lengths")
    if min(lengths) <= PREFIX_LEN:
        raise ValueError(f"every length must exceed the {PREFIX_LEN} shared tokens, got lengths={lengths}")
    if max(lengths) > MAX_LENGTH:
        raise ValueError(f"every length must be at most {MAX_LENGTH} tokens on this page, got lengths={lengths}: give shorter ones")
    if len(set(rewards)) == 1:
        raise ValueError("all rewards are equal: every advantage is 0, so no objective moves anything (the group carries no signal)")
    group = make_shared_prefix_group(
        torch.tensor(rewards, dtype=torch.float64),
        lengths,
        prefix_len=PREFIX_LEN,
        shared_log_ratio=shared_log_ratio,
        log_ratio_scale=scale,
        seed=seed,
    )
    return group_breakdown(objective, group, **overrides)


def verdict(b) -> str:
    """'no gradient at all' (every coefficient 0), 'cancels' (|sum| < CANCEL_TOL) or 'does not cancel'."""
    if bool((b.coefficient.abs() < CANCEL_TOL).all()):
        return "no gradient at all"
    return "cancels" if abs(b.residual) < CANCEL_TOL else "does not cancel"


def breakdown_table(b) -> list[dict]:
    """One row per completion of a GroupBreakdown, for a table or a chart."""
    return [
        {
            "completion": i + 1,
            "advantage A_i": float(b.advantages[i]),
            "length": int(b.lengths[i]),
            "sequence ratio s_i": float(b.seq_ratio[i]),
            "post-clip sbar_i": float(b.post_clip[i]),
            "weight after transform": float(b.weight[i]),
            "clipped": bool(b.clipped[i]),
            "coefficient on the shared token": float(b.coefficient[i]),
        }
        for i in range(len(b.advantages))
    ]


def padded_range(values: list[float], pad: float = 0.08) -> list[float]:
    """[low, high] of a chart axis that holds every value, widened by ``pad`` of the span on each side
    (a span of 0 by ``pad`` of the largest |value|, or by ``pad`` when every value is 0)."""
    low, high = min(values), max(values)
    span = high - low or max(abs(low), abs(high)) or 1.0
    return [low - pad * span, high + pad * span]


# ----------------------------------------------------------------------------- the atlas, one group at a time

ATLAS_ASPECTS = tuple((agg, equal, clipped) for agg in AGGREGATIONS for equal in (True, False) for clipped in (False, True))
"""(aggregation, equal lengths, shared ratio clipped) of an objective's atlas cells, in ``cancellation.atlas``'s order."""


@functools.lru_cache(maxsize=256)
def atlas_groups(seed: int, index: int) -> dict[tuple[bool, bool], SharedPrefixGroup]:
    """The ``index``-th random group of the atlas for ``seed`` in its four forms, keyed (equal lengths, shared ratio
    clipped): built once and read by every objective (autograd.grad never writes to the group's leaves)."""
    rewards, equal_lengths, unequal_lengths, group_seed = atlas_draws(index + 1, seed)[index]
    return {
        (equal, clipped): make_shared_prefix_group(
            torch.tensor(rewards, dtype=torch.float64),
            equal_lengths if equal else unequal_lengths,
            shared_log_ratio=0.5 if clipped else 0.0,
            seed=group_seed,
        )
        for equal in (True, False)
        for clipped in (False, True)
    }


def atlas_group_residuals(objective: str, seed: int, index: int) -> tuple[float, ...]:
    """max_t |eq 2 residual| of ``objective`` on the ``index``-th group of the atlas for ``seed``, one per
    ``ATLAS_ASPECTS`` entry (each aggregation resolved once, not once per cell)."""
    groups = atlas_groups(seed, index)
    specs = {agg: resolve_objective(objective, aggregation=agg) for agg in AGGREGATIONS}
    return tuple(float(shared_token_gradient(specs[agg], groups[equal, clipped]).abs().max()) for agg, equal, clipped in ATLAS_ASPECTS)


def atlas_objective_cells(objective: str, residuals: list[tuple[float, ...]]) -> list[AtlasCell]:
    """``objective``'s atlas cells from its ``atlas_group_residuals`` of the first groups: each cell the largest over
    them, folded from 0 in order as ``cancellation.atlas`` does (so the cells are the same floats)."""
    cells = []
    for k, (agg, equal, clipped) in enumerate(ATLAS_ASPECTS):
        worst = 0.0
        for group in residuals:
            worst = max(worst, group[k])
        cells.append(AtlasCell(objective, agg, equal, clipped, worst))
    return cells


# ----------------------------------------------------------------------------- toy lab


TOY_LABELS = ("gspo", "dfpo_min", "gspo_noclip", "dfpo_min:stopgrad=score")
"""The toy lab's default objectives: DFPO in both stop-gradient forms, each beside its matched GSPO control."""


def prediction_seeds(labels: tuple[str, ...]) -> int:
    """The fewest seeds at which the page's Prediction 1 (eq 19, steps to the reward threshold: a censored outcome) gets
    its sign-test interval of the median at the level of the page's prediction table, which adjusts every paper
    prediction for every pair of ``toy.checks.comparison_pairs`` together (Bonferroni; all of them, the most checks the
    table makes, so the seeds are enough when it makes fewer). With fewer seeds the table falls back to the mean's
    t-interval, and a run that never reaches the threshold leaves that row without one."""
    tests = len(PREDICTIONS) * len(comparison_pairs(list(labels), ToyConfig(objectives=tuple(labels))))
    return stats.sign_test_min_seeds(stats.bonferroni_level(0.95, max(1, tests)))


@dataclass(frozen=True)
class ToySettings:
    """One comparison of the toy lab page; the defaults are its default comparison: DFPO in both
    stop-gradient forms, each beside its matched GSPO control, on as many seeds as Prediction 1 needs."""

    task: str = "family"
    labels: tuple[str, ...] = TOY_LABELS
    group_size: int = 8
    inner_steps: int = 4
    steps: int = 150
    seeds: int = prediction_seeds(TOY_LABELS)
    mode: str = "sampled"
    optimizer: str = "sgd"
    lr: float = 0.5

    @property
    def total_steps(self) -> int:
        return len(self.labels) * self.steps

    def config(self):
        return ToyConfig(
            task=self.task,
            objectives=self.labels,
            mode=self.mode,
            seeds=self.seeds,
            steps=self.steps,
            group_size=self.group_size,
            inner_steps=self.inner_steps,
            optimizer=self.optimizer,
            lr=self.lr,
        )


TOY_DEFAULT = ToySettings()
TOY_LIMITS: dict[str, tuple[str, float, float]] = {
    "group_size": ("the group size G", 2, 64),
    "inner_steps": ("K (optimiser steps per batch)", 1, 64),
    "steps": ("the number of steps", 1, 2000),
    "seeds": ("the number of seeds", 1, 64),
    "lr": ("the learning rate lr", 1e-6, 100.0),
}
"""The range of each numeric input of the toy lab page: (what it is, low, high), both ends included.
The page keeps runs interactive (the command line ``dfpo toy`` takes any value the toy accepts)."""


def toy_settings(task: str, labels_text: str, group_size, inner_steps, steps, seeds, mode: str, optimizer: str, lr) -> ToySettings:
    """The page's inputs checked before any training: ValueError naming the first bad value and its range."""
    values = {"group_size": group_size, "inner_steps": inner_steps, "steps": steps, "seeds": seeds, "lr": lr}
    for name, value in values.items():
        what, low, high = TOY_LIMITS[name]
        if not finite_number(value):
            raise ValueError(f"{what} must be a number, got {name}={value!r}")
        if name != "lr" and value != int(value):
            raise ValueError(f"{what} must be a whole number, got {name}={value:g}")
        if not low <= value <= high:
            raise ValueError(f"{what} must be between {low:g} and {high:g} on this page, got {name}={value:g}")
    labels = tuple(x.strip() for x in labels_text.split(",") if x.strip())
    if not labels:
        raise ValueError(f"name at least one objective label, got {labels_text!r}")
    settings = ToySettings(task, labels, int(group_size), int(inner_steps), int(steps), int(seeds), mode, optimizer, float(lr))
    toy_train.validate(settings.config())  # unknown objective, repeated label, bad task or mode: ValueError before any compute
    return settings


@dataclass(frozen=True)
class ToyResult:
    """Curves {label: {metric: (steps, S) array}} and the summary markdown (table and the paper's predictions)."""

    curves: dict[str, dict[str, np.ndarray]]
    summary: str

    def to_json(self) -> dict:
        return {"curves": {o: {k: v.tolist() for k, v in h.items()} for o, h in self.curves.items()}, "summary": self.summary}

    @classmethod
    def from_json(cls, obj: dict) -> ToyResult:
        return cls({o: {k: np.asarray(v, float) for k, v in h.items()} for o, h in obj["curves"].items()}, obj["summary"])


def run_toy(settings: ToySettings, tick=None) -> ToyResult:
    """Train the toy for each label. ``tick(label, done, total)`` is called before each label and after
    each of its training steps, ``done`` counting steps over all labels; it may raise to stop the run
    there (the page's Stop). A ``jobs.Cancelled`` it raises leaves with the result of the steps that
    finished as its ``partial`` (``partial_toy_result``)."""
    config = settings.config()
    task, _ = toy_train.validate(config)  # every option checked before any compute
    enum = enumerate_completions(task, limit=config.exact_limit) if count_completions(task) <= config.exact_limit else None
    total = settings.total_steps
    torch.set_num_threads(toy_threads(settings.mode))
    finished: dict[str, list[dict]] = {}  # label -> the metrics of each step it finished
    results = {}
    try:
        for i, label in enumerate(settings.labels):
            first = i * settings.steps  # steps done before this label
            if tick is not None:
                tick(label, first, total)
            rows = finished[label] = []

            def on_step(step: int, row: dict, label=label, rows=rows, first=first) -> None:
                rows.append(row)
                if tick is not None:
                    tick(label, first + step + 1, total)

            results[label] = toy_train.train_objective(task, label, config, enum=enum, callback=on_step)
    except jobs.Cancelled as stop:
        stop.partial = partial_toy_result(settings, finished)
        raise
    res = to_numpy(results)
    summary = summarise(res, config.kappa)
    return ToyResult(res, "\n".join([summary_table(summary), "", *prediction_checks(summary, config)]))


def partial_toy_result(settings: ToySettings, finished: dict[str, list[dict]]) -> ToyResult | None:
    """The result of a run stopped early, from the metrics of each step that finished ({label: [step rows]}):
    its curves and each objective's summary over the steps it ran (None when no step finished). The paper's
    predictions compare objectives over the same steps, so they wait for a finished run."""
    ran = {label: rows for label, rows in finished.items() if rows}
    if not ran:
        return None
    curves = to_numpy({label: {key: torch.stack([row[key] for row in rows]) for key in rows[0]} for label, rows in ran.items()})
    steps = ", ".join(f"{label} {len(rows)} of {settings.steps} steps" for label, rows in ran.items())
    note = (
        f"Stopped early: {steps}. Each objective's summary is over the steps it ran; the paper's predictions are "
        "checked once a run finishes (they compare objectives over the same steps)."
    )
    return ToyResult(curves, "\n".join([note, "", summary_table(summarise(curves, settings.config().kappa))]))


def toy_failure(err: BaseException, settings: ToySettings, label: str, done: int) -> str:
    """The sentence the page shows when training ``label`` failed after ``done`` steps of the whole run
    (``tick``'s count), its inputs having been accepted."""
    step = done - settings.labels.index(label) * settings.steps + 1 if label in settings.labels else done + 1
    return (
        f"Training stopped during {label} at step {step} of {settings.steps}: {err}. The settings were accepted, so the numbers "
        f"left their valid range while training; a smaller learning rate than lr={settings.lr:g} usually keeps them finite."
    )


def cached_toy(settings: ToySettings) -> ToyResult | None:
    """The stored result of ``settings`` for this code version, if one was stored (see ``dfpo.app.cache``)."""
    obj = cache.load("toy", repr(settings))
    return None if obj is None else ToyResult.from_json(obj)


def store_toy(settings: ToySettings, result: ToyResult) -> None:
    cache.store("toy", result.to_json(), repr(settings))


def band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and mean +- 1.96 standard errors over seeds of a (steps, S) array."""
    mean = values.mean(1)
    half = 1.96 * values.std(1, ddof=1) / np.sqrt(values.shape[1]) if values.shape[1] > 1 else np.zeros_like(mean)
    return mean, mean - half, mean + half


def markdown_blocks(text: str) -> list[list[dict[str, str]] | str]:
    """Markdown split into its tables (each a list of {header: cell} rows) and its other lines (strings), in order."""
    blocks: list[list[dict[str, str]] | str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|"):
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            cells = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[i:j]]
            header, body = cells[0], [c for c in cells[1:] if not all(set(x) <= set("-: ") for x in c)]
            blocks.append([dict(zip(header, row)) for row in body])
            i = j
        else:
            if lines[i].strip():
                blocks.append(lines[i])
            i += 1
    return blocks


def markdown_table(rows: list[dict[str, str]]) -> str:
    """Rows of {header: cell} as a markdown table (the inverse of a table of ``markdown_blocks``)."""
    if not rows:
        return ""
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(r.get(h, "")) for h in header) + " |" for r in rows]
    return "\n".join(lines)


def transpose_rows(rows: list[dict[str, str]], key: str) -> list[dict[str, str]]:
    """Rows keyed by ``key`` (one per objective) turned into one row per other column (one per metric)."""
    columns = [c for c in rows[0] if c != key] if rows else []
    return [{"metric": c, **{r[key]: r.get(c, "") for r in rows}} for c in columns]


# ----------------------------------------------------------------------------- claims ledger


def ledger_records(*, fresh: bool = False) -> list[dict[str, str]]:
    """Every claim of the ledger as a dict (id, source, statement, conditions, method, verdict, evidence, notes).

    Stored for this code version (``dfpo.app.cache``) and read back unless ``fresh``."""
    if not fresh and (stored := cache.load("ledger")) is not None:
        return stored
    from ..theory.ledger import run_ledger  # deferred: the checks import sympy (~0.5 s); the app starts without it

    records = [c.to_dict() for c in run_ledger()]
    cache.store("ledger", records)
    return records


def claim_matches(claim: dict[str, str], text: str) -> bool:
    """True when ``text`` (any case) is in the claim's id, source or statement; an empty text matches every claim."""
    needle = text.strip().lower()
    return needle in f"{claim['id']} {claim['source']} {claim['statement']}".lower()


def filter_claims(claims: list[dict[str, str]], verdicts, methods, text: str) -> list[dict[str, str]]:
    """The claims whose verdict is one of ``verdicts``, method one of ``methods``, and that mention ``text``."""
    return [c for c in claims if c["verdict"] in verdicts and c["method"] in methods and claim_matches(c, text)]


def no_claim_hint(claims: list[dict[str, str]], verdicts, methods, text: str) -> str:
    """The sentence the ledger page shows when its filter keeps no claim: what to change to see some."""
    if not verdicts or not methods:
        missing = " and ".join(name for name, chosen in (("verdict", verdicts), ("method", methods)) if not chosen)
        return f"No claim shown: choose at least one {missing}."
    search = text.strip()
    mentioning = [c for c in claims if claim_matches(c, search)]
    if not mentioning:
        return f"No claim mentions {search!r} in its id, source or statement: change or clear the search."
    kinds = sorted({f"{c['verdict']} ({c['method']})" for c in mentioning})
    return (
        f"No claim with the chosen verdicts and methods mentions {search!r}; {len(mentioning)} with other verdicts or "
        f"methods do: {', '.join(kinds)}. Add those, or clear the search."
    )
