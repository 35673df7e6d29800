"""Registered experiments: rows committed before the data they read (issue 58).

A registration is a TOML file under ``docs/attribution/registered/``: the experiment's name, its seed sets and the
command that trains each, and its rows (method, control, outcome, the direction the paper predicts, the direction an
earlier look suggested, and the margin inside which a difference counts as negligible). The file is committed before
the first cell trains; git says when (``file_history``), the run folders say when the data began, and a row is
*registered* only if it is in the last version of the file committed before then (``row_status``). A row added
later is *exploratory*, and every sentence about it says so.

Verdicts (``registered_verdict``): the paired Student-t interval of method - control over a set's seeds, Bonferroni-
adjusted over the experiment's own rows (each at level 1 - alpha / R: the family is one experiment, not every table
the project has), against the row's margin (absolute, or relative to the control's mean): ``negligible`` (the interval
lies within the margin), ``higher`` / ``lower`` (it excludes 0), ``inconclusive`` (neither). An effect counts only
where every seed set gives the same word (``combined_word``). ``detectable_effect`` says what size of effect the seeds
run could have seen (80% power, in the outcome's units), so "inconclusive" is never read as "no change".

Nothing here executes what it reads: TOML is parsed by ``tomllib``; git is asked for history and file contents only.
numpy only.
"""

from __future__ import annotations

import math
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from . import stats

DIRECTIONS = ("higher", "lower", "negligible", "none")
MARGIN_KINDS = ("absolute", "relative")
POWER = 0.8
"""The power at which ``detectable_effect`` states the smallest effect the seeds could have seen."""


@dataclass(frozen=True)
class SeedSet:
    name: str
    first_seed: int
    seeds: int

    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))


@dataclass(frozen=True)
class RegisteredRow:
    """One comparison registered before its data: method - control on one outcome."""

    method: str
    control: str
    metric: str
    paper: str
    """The direction the paper's claims predict ('higher', 'lower', 'negligible' or 'none' where it says nothing)."""
    hypothesis: str
    """The direction an earlier look suggested (what this experiment tests)."""
    margin: float
    margin_kind: str
    """'absolute': +-margin in the outcome's units; 'relative': +-margin times the control's mean."""
    primary: bool = False
    """The row the experiment exists for (its detectable effect is the one the opening sentence states)."""

    def key(self) -> tuple[str, str, str]:
        return (self.method, self.control, self.metric)


@dataclass(frozen=True)
class Registration:
    experiment: str
    title: str
    machine: str
    family_alpha: float
    sets: tuple[SeedSet, ...]
    command: str
    rows: tuple[RegisteredRow, ...]
    pilot: str = ""
    """The stored pilot the recipe passed (a path under the repository), '' where none was run."""

    def commands(self) -> list[str]:
        """The command that trains each seed set, in the order of ``sets``."""
        return [self.command.format(name=s.name, first_seed=s.first_seed) for s in self.sets]

    @property
    def per_row_level(self) -> float:
        """Each row's interval level: 1 - alpha / R over this experiment's R rows."""
        return stats.bonferroni_level(1 - self.family_alpha, len(self.rows))


def _field(item: Mapping, name: str, kind: type, where: str):
    value = item.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: {name} must be a {kind.__name__}, got {value!r}")
    return value


def _row(item: Mapping, where: str) -> RegisteredRow:
    row = RegisteredRow(
        method=_field(item, "method", str, where),
        control=_field(item, "control", str, where),
        metric=_field(item, "metric", str, where),
        paper=_field(item, "paper", str, where),
        hypothesis=_field(item, "hypothesis", str, where),
        margin=float(_field(item, "margin", (int, float), where)),
        margin_kind=_field(item, "margin_kind", str, where),
        primary=bool(item.get("primary", False)),
    )
    for name in ("paper", "hypothesis"):
        if getattr(row, name) not in DIRECTIONS:
            raise ValueError(f"{where}: {name}={getattr(row, name)!r} is not one of {', '.join(DIRECTIONS)}")
    if row.margin_kind not in MARGIN_KINDS:
        raise ValueError(f"{where}: margin_kind={row.margin_kind!r} is not one of {', '.join(MARGIN_KINDS)}")
    if not (math.isfinite(row.margin) and row.margin > 0):
        raise ValueError(f"{where}: margin={row.margin!r} must be a positive number")
    if not row.control:
        raise ValueError(f"{where}: control is empty; a registered row compares a method with a control")
    return row


def load_registration(raw: Mapping, where: str = "registration") -> Registration:
    """A ``Registration`` from a parsed TOML document; ValueError naming the first bad field."""
    sets = tuple(
        SeedSet(
            _field(s, "name", str, f"{where} sets[{i}]"),
            _field(s, "first_seed", int, f"{where} sets[{i}]"),
            _field(s, "seeds", int, f"{where} sets[{i}]"),
        )
        for i, s in enumerate(raw.get("sets", []))
    )
    if len(sets) < 2:
        raise ValueError(
            f"{where}: sets has {len(sets)} seed set(s); an effect counts only where two disjoint sets agree, so register at least 2"
        )
    seen: set[int] = set()
    for s in sets:
        overlap = seen & set(s.seed_list())
        if s.seeds < 2 or overlap:
            raise ValueError(
                f"{where}: seed set {s.name!r} must hold >= 2 seeds disjoint from the other sets (seeds={s.seeds}, shared: {sorted(overlap)[:3]})"
            )
        seen |= set(s.seed_list())
    rows = tuple(_row(item, f"{where} rows[{i}]") for i, item in enumerate(raw.get("rows", [])))
    if not rows:
        raise ValueError(f"{where}: no rows; register what the experiment compares before it runs")
    keys = [r.key() for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{where}: a row is registered twice: {sorted(k for k in keys if keys.count(k) > 1)[0]}")
    alpha = float(_field(raw, "family_alpha", (int, float), where))
    if not 0 < alpha < 1:
        raise ValueError(f"{where}: family_alpha={alpha!r} must lie in (0, 1)")
    command = _field(raw, "command", str, where)
    if "{first_seed}" not in command or "{name}" not in command:
        raise ValueError(f"{where}: command must contain {{first_seed}} and {{name}} (each set's first seed and folder), got {command!r}")
    return Registration(
        experiment=_field(raw, "experiment", str, where),
        title=_field(raw, "title", str, where),
        machine=str(raw.get("machine", "")),
        family_alpha=alpha,
        sets=sets,
        command=command,
        rows=rows,
        pilot=str(raw.get("pilot", "")),
    )


def read_registration(path: Path) -> Registration:
    return load_registration(tomllib.loads(Path(path).read_text(encoding="utf-8")), where=str(path))


# --- when was each row registered ------------------------------------------------------------------------------------


def file_history(path: Path, repo: Path) -> list[tuple[str, datetime]]:
    """Every commit that changed ``path`` (relative to ``repo``), oldest first, with its commit time."""
    done = subprocess.run(["git", "-C", str(repo), "log", "--format=%H %cI", "--", str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if "does not have any commits" in done.stderr:
            return []
        raise ValueError(f"git log -- {path} in {repo} failed: {done.stderr.strip() or done.returncode}")
    out = done.stdout
    return [(c, datetime.fromisoformat(t)) for c, t in (line.split(" ", 1) for line in reversed(out.strip().splitlines()))]


def rows_at(commit: str, path: Path, repo: Path) -> set[tuple[str, str, str]]:
    """The row keys of ``path`` as committed at ``commit`` (an empty set where it did not exist or does not parse)."""
    done = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{path}"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return set()
    try:
        raw = tomllib.loads(done.stdout)
    except tomllib.TOMLDecodeError:
        return set()
    return {(str(r.get("method")), str(r.get("control")), str(r.get("metric"))) for r in raw.get("rows", [])}


@dataclass(frozen=True)
class RowStatus:
    registering_commit: str
    """The commit that added the registration file."""
    registered_at: datetime
    data_started: datetime
    registered: frozenset
    """Row keys in the last version of the file committed before the data started."""

    def is_registered(self, row: RegisteredRow) -> bool:
        return row.key() in self.registered


def row_status(path: Path, repo: Path, data_started: datetime) -> RowStatus:
    """Which rows of ``path`` were committed before ``data_started`` (the first cell's start)."""
    history = file_history(path, repo)
    if not history:
        raise ValueError(f"{path} is not committed in {repo}; commit the registration before its first cell trains")
    before = [(c, t) for c, t in history if t < data_started]
    registered = rows_at(before[-1][0], path, repo) if before else set()
    return RowStatus(history[0][0], history[0][1], data_started, frozenset(registered))


# --- verdicts ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SetVerdict:
    word: str
    interval: stats.Interval
    control_mean: float
    bound: float
    """The negligible margin in the outcome's units."""
    detectable: float
    """The smallest |effect| these seeds detect with probability ``POWER`` at this level (outcome's units)."""
    constant: float = math.nan
    """The one value every cell of both arms took, where they all took the same (else NaN): such an outcome cannot
    tell the arms apart, whatever its word."""


def margin_bound(row: RegisteredRow, control_mean: float) -> float:
    return row.margin if row.margin_kind == "absolute" else row.margin * abs(control_mean)


def detectable_effect(diff: np.ndarray, level: float, power: float = POWER) -> float:
    """The smallest true mean difference that a two-sided paired t interval at ``level`` over these n seeds excludes
    0 for with probability ``power``, at the observed spread: (t_{1-(1-level)/2} + t_{power}) sd / sqrt(n)."""
    d = np.asarray(diff, float)
    if d.size < 2:
        return math.inf
    df = d.size - 1
    t = stats.student_t_quantile(1 - (1 - level) / 2, df) + stats.student_t_quantile(power, df)
    return float(t * d.std(ddof=1) / math.sqrt(d.size))


def word_of(interval: stats.Interval, bound: float) -> str:
    if -bound <= interval.low and interval.high <= bound:
        return "negligible"
    if interval.low > 0:
        return "higher"
    if interval.high < 0:
        return "lower"
    return "inconclusive"


def registered_verdict(method: Sequence[float], control: Sequence[float], row: RegisteredRow, level: float) -> SetVerdict:
    """The verdict of one row on one seed set: paired values (seeds,) of method and control, interval at ``level``
    (already Bonferroni-adjusted over the experiment's rows)."""
    m, c = np.asarray(method, float), np.asarray(control, float)
    if m.shape != c.shape or m.size == 0:
        raise ValueError(f"{row.key()}: needs one method and one control value per seed, got {m.size} and {c.size}")
    if not (np.all(np.isfinite(m)) and np.all(np.isfinite(c))):
        raise ValueError(f"{row.key()}: a value is missing or not finite (method {m.tolist()}, control {c.tolist()})")
    ci = stats.paired_interval(m - c, level=level, tests=1)
    mean = float(c.mean())
    bound = margin_bound(row, mean)
    values = np.concatenate([m, c])  # (2 seeds,)
    constant = float(values[0]) if np.all(values == values[0]) else math.nan
    return SetVerdict(word_of(ci, bound), ci, mean, bound, detectable_effect(m - c, level), constant)


def combined_word(words: Sequence[str]) -> str:
    """One word for a row over its seed sets: the shared word where every set agrees on an effect or on negligible;
    'did not replicate' where two sets claim different things; else 'inconclusive'."""
    claims = {w for w in words if w != "inconclusive"}
    if len(claims) > 1:
        return "did not replicate"
    if len(claims) == 1 and all(w != "inconclusive" for w in words):
        return claims.pop()
    return "inconclusive"


def against_prediction(word: str, predicted: str) -> str:
    """'as predicted' / 'against the prediction' / '' of a combined word against a predicted direction."""
    if predicted == "none" or word in ("inconclusive", "did not replicate"):
        return ""
    return "as predicted" if word == predicted else "against the prediction"


# --- the generated answer ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowResult:
    row: RegisteredRow
    per_set: tuple[SetVerdict, ...]
    registered: bool
    set_names: tuple[str, ...]
    """The seed sets of ``per_set``, in the same order."""

    @property
    def word(self) -> str:
        return combined_word([v.word for v in self.per_set])

    def decided_on_some_sets_only(self) -> str:
        """Where the row is not shown over its sets but some set decided on its own: what each such set said, e.g.
        "negligible on `x-a` only, within +-0.02 there"; '' otherwise. A set's own verdict is no finding (an effect
        counts only where every set agrees), but leaving it out would hide that the other set is the one that could
        not tell."""
        if self.word != "inconclusive":
            return ""
        parts = []
        for name, v in zip(self.set_names, self.per_set, strict=True):
            if v.word == "negligible":
                parts.append(f"negligible on `{name}` only, within +-{v.bound:.3g} there")
            elif v.word in ("higher", "lower"):
                parts.append(f"{v.word} on `{name}` only")
        return "; ".join(parts)

    @property
    def constant(self) -> bool:
        """Every cell of both arms on every set took one and the same value: the outcome did not vary at all here."""
        values = {v.constant for v in self.per_set}
        return len(values) == 1 and math.isfinite(next(iter(values)))


def set_values(doc: Mapping, label: str, metric: str, seeds: Sequence[int]) -> np.ndarray:
    """(seeds,) values of ``metric`` for ``label`` in a ``dfpo compare`` document (compare.json), NaN where missing."""
    records = doc.get("records", {}).get(label, {})
    return np.array([records.get(str(s), {}).get(metric, math.nan) for s in seeds], float)


def evaluate(registration: Registration, docs: Mapping[str, Mapping], status: RowStatus | None) -> list[RowResult]:
    """Every registered row's verdict on every seed set (``docs``: set name -> compare.json document)."""
    level = registration.per_row_level
    out = []
    for row in registration.rows:
        verdicts = []
        for s in registration.sets:
            if s.name not in docs:
                raise ValueError(
                    f"{registration.experiment}: seed set {s.name!r} has no stored table; run {registration.commands()[registration.sets.index(s)]!r}"
                )
            seeds = s.seed_list()
            verdicts.append(
                registered_verdict(
                    set_values(docs[s.name], row.method, row.metric, seeds),
                    set_values(docs[s.name], row.control, row.metric, seeds),
                    row,
                    level,
                )
            )
        registered = status.is_registered(row) if status else False
        out.append(RowResult(row, tuple(verdicts), registered, tuple(s.name for s in registration.sets)))
    return out


def _num(value: float) -> str:
    return stats.format_number(value, "{:+.3g}")


def row_sentence(result: RowResult, metric_name: str) -> str:
    """One sentence about one row, every number from its table."""
    row, word = result.row, result.word
    head = f"`{row.method}` against `{row.control}`, {metric_name}"
    if not result.registered:
        head += " (exploratory: added after the data)"
    intervals = "; ".join(f"{_num(v.interval.mean)} [{_num(v.interval.low)}, {_num(v.interval.high)}]" for v in result.per_set)
    if result.constant:
        value = result.per_set[0].constant + 0.0  # -0.0 (a mean of -0.0 entropies) reads as 0
        return f"{head}: {value:.3g} in every cell of both arms on every set, so this outcome cannot tell them apart on this task."
    if word in ("higher", "lower"):
        said = [f"{who}'s" for who, d in (("the paper", row.paper), ("the hypothesis", row.hypothesis)) if d != "none" and d == word]
        against = [f"{who}'s" for who, d in (("the paper", row.paper), ("the hypothesis", row.hypothesis)) if d not in ("none", word)]
        note = (f", as {' and '.join(said)} prediction" + ("s" if len(said) > 1 else "") if said else "") + (
            f", against {' and '.join(against)} prediction" + ("s" if len(against) > 1 else "") if against else ""
        )
        return f"{head}: {word} on every set ({intervals}){note}."
    if word == "negligible":
        bound = max(v.bound for v in result.per_set)
        return f"{head}: no change larger than {bound:.3g} on any set ({intervals})."
    if word == "did not replicate":
        return f"{head}: did not replicate ({', '.join(v.word for v in result.per_set)}; {intervals})."
    detectable = max(v.detectable for v in result.per_set)
    alone = result.decided_on_some_sets_only()
    alone = f"; {alone}" if alone else ""
    return f"{head}: not shown either way ({intervals}){alone}; these seeds could detect only an effect of about {detectable:.3g} or more."


def rest_clause(rest: Sequence[RowResult]) -> str:
    """What the rows without a counted effect say, by kind: exploratory (never counted), negligible, did not replicate,
    and not shown either way with the smallest effect each row's seeds could have seen, in its outcome's units."""
    exploratory = [r for r in rest if not r.registered]
    counted = [r for r in rest if r.registered]
    parts = []
    if exploratory:
        parts.append(f"{len(exploratory)} exploratory (added after the data: never counted)")
    constant = [r for r in counted if r.constant]
    if constant:
        parts.append(f"{len(constant)} took one value in every cell of both arms (it cannot tell them apart here)")
    counted = [r for r in counted if not r.constant]
    negligible = [r for r in counted if r.word == "negligible"]
    if negligible:
        parts.append(f"{len(negligible)} negligible on every set (within the registered margin)")
    split = [r for r in counted if r.word == "did not replicate"]
    if split:
        parts.append(f"{len(split)} did not replicate (the sets disagree)")
    unshown = [r for r in counted if r.word == "inconclusive"]
    if unshown:
        sizes = ", ".join(f"{max(v.detectable for v in r.per_set):.3g} on `{r.row.metric}` against `{r.row.control}`" for r in unshown)
        parts.append(
            f"{len(unshown)} not shown either way, which is not 'no change': the seeds could detect only an effect of about {sizes} or more"
        )
    return "; ".join(parts)


EXACT_CANCELLATION = "cancel=shared_whole"
"""The label option of the exact-cancellation arm (docs/loss.md): no gradient at the positions a whole group shares."""


def ceiling_clause(results: Sequence[RowResult]) -> str:
    """What a registered primary row of an exact-cancellation arm against its control says about every in-group
    transform (issue 58: stage 2 runs only if it shows an effect); '' where the primary row is not such a row or was
    added after the data. The arm takes eq 2's gradient at the positions a whole group shares away and changes nothing
    else, so its difference from the control bounds what any in-group transform can gain through that gradient."""
    primary = next((r for r in results if r.row.primary and r.registered), None)
    if primary is None or EXACT_CANCELLATION not in primary.row.method.split(":")[1:]:
        return ""
    head = (
        "exact cancellation takes away eq 2's gradient at the positions a whole group shares and nothing else, so its "
        "difference on the primary outcome bounds what any in-group transform can gain there through that gradient"
    )
    if primary.word in ("higher", "lower"):
        return f"{head}: it is {primary.word} on every set, so the next stage (a transform against this bound) is to run"
    if primary.word == "negligible":
        bound = max(v.bound for v in primary.per_set)
        return (
            f"{head}: it is within +-{bound:.3g} on every set, so no in-group transform can change it by more through "
            "this mechanism here, and the next stage is not run"
        )
    detectable = max(v.detectable for v in primary.per_set)
    alone = primary.decided_on_some_sets_only()
    unshown = f"it is not shown either way ({alone})" if alone else "it is not shown either way"
    return (
        f"{head}: {unshown if primary.word == 'inconclusive' else 'its seed sets disagree'}, so no in-group "
        f"transform is shown to gain through this mechanism here (an effect smaller than about {detectable:.3g} would not "
        "have been seen), and the next stage is not run"
    )


def stage_sentence(
    registration: Registration, results: Sequence[RowResult], status: RowStatus | None, metric_names: Mapping[str, str]
) -> str:
    """The one sentence README opens with for this experiment: what it found, or that it found nothing, and what size
    of effect its seeds could have seen."""
    seeds = " and ".join(f"{s.seeds}" for s in registration.sets)
    where = f"registered before its data in {status.registering_commit[:7]}" if status else "not registered before its data"
    effects = [r for r in results if r.word in ("higher", "lower") and r.registered]
    if effects:
        found = "; ".join(
            f"`{r.row.method}` against `{r.row.control}` {r.word} on {metric_names.get(r.row.metric, r.row.metric)} "
            f"({', '.join(_num(v.interval.mean) for v in r.per_set)})"
            for r in effects
        )
        rest = [r for r in results if r not in effects]
        return (
            f"{registration.title} ({where}; {seeds} seeds): {len(effects)} of {len(results)} registered rows show the same "
            f"effect on every set: {found}; of the other {len(rest)}, {rest_clause(rest)}{_then(results)}."
        )
    named = next((r for r in results if r.row.primary), results[0])
    return (
        f"{registration.title} ({where}; {seeds} seeds): none of its {len(results)} rows shows an effect on every set; "
        f"this is not 'no change': on {metric_names.get(named.row.metric, named.row.metric)} (`{named.row.method}` against "
        f"`{named.row.control}`) the seeds could detect only a change of about {max(v.detectable for v in named.per_set):.3g} or "
        f"more{_then(results)}."
    )


def _then(results: Sequence[RowResult]) -> str:
    clause = ceiling_clause(results)
    return f"; {clause}" if clause else ""


def status_from_evidence(stored: Mapping) -> RowStatus:
    """The ``RowStatus`` a stored registered experiment (docs/attribution/data/NAME.json) recorded when it was stored."""
    return RowStatus(
        stored["registering_commit"],
        datetime.fromisoformat(stored["registered_at"]),
        datetime.fromisoformat(stored["data_started"]),
        frozenset(tuple(k) for k in stored["registered_rows"]),
    )


def evaluate_stored(registration: Registration, stored: Mapping) -> list[RowResult]:
    """``evaluate`` on a stored registered experiment's tables."""
    docs = {name: data["doc"] for name, data in stored["sets"].items()}
    return evaluate(registration, docs, status_from_evidence(stored))


def _spread(values: np.ndarray) -> str:
    """'median m (range lo-hi)' of finite values, 3 significant digits."""
    return f"median {np.median(values):.3g} (range {values.min():.3g} to {values.max():.3g})"


def coefficient_clause(method: np.ndarray, control: np.ndarray) -> str:
    """What the coefficient mass at whole-group positions (``coef_whole``, mean over a cell's steps) is under the method
    and its control; '' where the cells did not log it. Exactly 0 is said as a count of cells (no gradient reached those
    positions in any step), never as a rounded median."""
    method, control = method[np.isfinite(method)], control[np.isfinite(control)]
    if not method.size:
        return ""
    zero = int(np.sum(method == 0.0))
    said = (
        f"exactly 0 in {zero} of its {method.size} cells"
        if zero == method.size
        else f"{_spread(method)}, exactly 0 in {zero} of {method.size} cells"
    )
    return f"coefficient mass at the positions a whole group shares (mean over steps) {said}" + (
        f", its control's {_spread(control)}" if control.size else ""
    )


def update_norm_clause(method: np.ndarray, control: np.ndarray) -> str:
    """The method's update norm per step over its control's, per paired seed (both finite and the control's > 0); ''
    where no seed has both."""
    both = np.isfinite(method) & np.isfinite(control) & (control > 0)
    if not both.any():
        return ""
    ratio = method[both] / control[both]  # (paired seeds,)
    return f"update norm per step {_spread(ratio)} times its control's over {int(both.sum())} paired seeds"


def mechanism_lines(registration: Registration, stored: Mapping) -> list[str]:
    """Reported beside the rows, not tested (issue 58 stage 1: B's whole-group residual, 0 by construction, and B's
    update norm against A's): per seed set and per registered (method, control) pair, ``coefficient_clause`` and
    ``update_norm_clause`` from the stored records; a pair whose cells logged neither says nothing."""
    pairs = list(dict.fromkeys((r.method, r.control) for r in registration.rows))
    lines = []
    for s in registration.sets:
        doc = stored["sets"][s.name]["doc"]
        seeds = s.seed_list()
        for method, control in pairs:
            clauses = [
                clause(set_values(doc, method, metric, seeds), set_values(doc, control, metric, seeds))
                for clause, metric in ((coefficient_clause, "coef_whole"), (update_norm_clause, "update_norm"))
            ]
            said = "; ".join(c for c in clauses if c)
            if said:
                lines.append(f"`{method}` against `{control}` on `{s.name}` (not tested): {said}.")
    return lines


def pending_sentence(registration: Registration, commit: str | None, docs: str = "docs/") -> str:
    """What a registered experiment whose tables are not stored yet says: registered where, and nothing found yet."""
    where = f"registered before its data in {commit[:7]}" if commit else "registered, not yet committed"
    seeds = " and ".join(f"{s.seeds}" for s in registration.sets)
    return (
        f"{registration.title} ({where}; {len(registration.rows)} rows, {seeds} seeds): no table is stored yet, so it has "
        "found nothing yet; its rows and commands are in "
        f"[docs/attribution/registered/{registration.experiment}.toml]({docs}attribution/registered/{registration.experiment}.toml)."
    )


def registered_sentences(root: Path, metric_names: Mapping[str, str], docs: str = "docs/") -> list[str]:
    """One generated sentence per registered experiment (docs/attribution/registered/*.toml), in name order: what its
    stored tables found (``stage_sentence``), or that none is stored yet (``pending_sentence``; its link relative to a
    page whose path to docs/ is ``docs``: 'docs/' from README, '' from a page in docs/)."""
    import json

    out = []
    for path in sorted((root / "docs" / "attribution" / "registered").glob("*.toml")):
        registration = read_registration(path)
        stored_path = root / "docs" / "attribution" / "data" / f"{registration.experiment}.json"
        if stored_path.is_file():
            stored = json.loads(stored_path.read_text(encoding="utf-8"))
            results = evaluate_stored(registration, stored)
            out.append(stage_sentence(registration, results, status_from_evidence(stored), metric_names))
        else:
            history = file_history(path.relative_to(root), root) if (root / ".git").exists() else []
            out.append(pending_sentence(registration, history[0][0] if history else None, docs))
    return out


def rows_table(registration: Registration) -> str:
    """Markdown: the registered rows as committed (method, control, outcome, predicted directions, margin)."""
    lines = ["| method | control | outcome | the paper predicts | the hypothesis | negligible within |", "|---|---|---|---|---|---|"]
    for r in registration.rows:
        margin = f"+-{r.margin:g}" if r.margin_kind == "absolute" else f"+-{r.margin:.0%} of the control's mean"
        primary = " (primary)" if r.primary else ""
        lines.append(f"| `{r.method}` | `{r.control}` | {r.metric}{primary} | {r.paper} | {r.hypothesis} | {margin} |")
    return "\n".join(lines)
