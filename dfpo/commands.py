"""Text output of the light CLI subcommands (`dfpo objectives`, `dfpo demo`)."""

from __future__ import annotations

import dataclasses

import torch

from dfpo.core import settings
from dfpo.core.loss import COMPONENT_FIELDS, OBJECTIVES, SPEC_FIELDS, parse_objective_label, resolve_objective
from dfpo.core.loss.advantages import estimator_rows
from dfpo.core.loss.cancellation import atlas, atlas_rows, correction_atlas, make_shared_prefix_group, shared_token_gradient
from dfpo.core.loss.registry import BUILTIN
from dfpo.core.loss.spec import ObjectiveSpec, component_rows
from dfpo.toy.config import ToyConfig
from dfpo.trainer.config import Config

_COLUMNS = ("ratio_level", "clip", "eps_low", "eps_high", "transform", "stopgrad", "token_mask", "aggregation", "adv_scale")


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _cell(spec, column: str) -> str:
    value = getattr(spec, column)
    if column == "stopgrad" and spec.transform == "none":
        return "-"  # the stop-gradient form only matters for a group transform
    return f"{value:g}" if isinstance(value, float) else str(value)


_COMPONENT_COLUMNS = ("field", "owner", "default", "allowed", "read when", "trust region", "source")


def components_table(markdown: bool = False) -> str:
    """Every component field as ``ObjectiveSpec`` declares it: owner, default, allowed values, when the loss
    core reads it, whether a matched control must hold it equal (trust region), source of the shared default."""
    rows = [[row[c] for c in _COMPONENT_COLUMNS] for row in component_rows()]
    if markdown:
        rows = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    return _table(list(_COMPONENT_COLUMNS), rows, markdown)


_ESTIMATOR_COLUMNS = ("adv_scale", "reads", "zero-sum, equal lengths", "zero-sum, unequal lengths", "source")


def estimators_table(markdown: bool = False) -> str:
    """Every advantage estimator (``adv_scale``): what it reads, whether its advantages sum to zero in a group (the premise
    of eq 2, computed now by the loss core on a fixed two-group batch at equal and unequal lengths) and its source."""
    rows = [[row[c] for c in _ESTIMATOR_COLUMNS] for row in estimator_rows()]
    return _table(list(_ESTIMATOR_COLUMNS), rows, markdown)


def objectives_summary(markdown: bool = False) -> str:
    """``dfpo objectives``: the table of presets (one row each, the components that tell them apart), then one line
    per preset saying what it is (wrapped to the table's width) and who registered it when not dfpo, then where the
    long form is. ``objectives_table`` is the long form."""
    import textwrap

    table = objectives_table(markdown=markdown).split("\n\n")[0]  # the long form's first block: the same table
    width = max(len(line) for line in table.splitlines())
    lines = []
    for name in OBJECTIVES:
        lines += textwrap.wrap(f"{name}: {OBJECTIVES[name].description}", width=width, subsequent_indent="    ")
        if OBJECTIVES.origin(name) != BUILTIN:
            lines.append(f"    registered by {OBJECTIVES.origin(name)}")
    hint = textwrap.wrap(
        f"{len(OBJECTIVES)} objectives. `dfpo objectives NAME`: every component of one, its value and the source of each; "
        "`dfpo objectives --long`: every preset's sources, every component's declaration and the advantage estimators; "
        "`dfpo objectives NAME --trace`: one objective followed from its preset to its gradient on a small batch; "
        "`dfpo objectives --atlas`: the cancellation verdicts.",
        width=width,
    )
    if markdown:
        lines = [f"- {line}" if not line.startswith(" ") else f"  {line.strip()}" for line in lines]
    return "\n".join([table, "", *lines, "", *hint])


def objectives_table(markdown: bool = False, objective: str | None = None) -> str:
    """Every preset with its components, defaults and sources, then every component's declaration; with ``objective``
    (a name or a label), that objective alone (``objective_detail``)."""
    if objective is not None:
        return objective_detail(objective, markdown)
    names = list(OBJECTIVES)
    rows = [[name, *(_cell(OBJECTIVES[name], c) for c in _COLUMNS)] for name in names]
    out = [_table(["objective", *_COLUMNS], rows, markdown), ""]
    for name in names:
        spec = OBJECTIVES[name]
        out.append(f"{name}: {spec.description}")
        if OBJECTIVES.origin(name) != BUILTIN:
            out.append(f"    registered by {OBJECTIVES.origin(name)}")
        out.extend(f"    {key}: {src}" for key, src in spec.sources.items())
    out += [
        "",
        "Components (declared beside each field of ObjectiveSpec; every other component of a preset takes the shared",
        "default, whose source is the last column; `dfpo objectives NAME` lists all of one preset). 'trust region: yes'",
        "fields must be equal for two objectives to be a matched control, unless the loss does not read them ('read when').",
        "",
        components_table(markdown),
        "",
        "Advantage estimators (the values of adv_scale): what each reads, whether a group's advantages sum to zero (the premise",
        "of eq 2, computed now on a fixed two-group batch; ReMax's greedy reward is 1), and where each comes from.",
        "",
        estimators_table(markdown),
    ]
    return "\n".join(out)


def label_line(label: str) -> str:
    """``label dfpo_min:stopgrad=score: the dfpo_min preset with stopgrad='score'`` for a label with overrides, "" for a
    bare name (whose own line already says what it is)."""
    name, overrides = parse_objective_label(label)
    if not overrides:
        return ""
    return f"label {label.strip()}: the {name} preset with {', '.join(f'{k}={v!r}' for k, v in overrides.items())}"


def objective_detail(objective: str, markdown: bool = False) -> str:
    """``dfpo objectives NAME`` (or LABEL): every component of one objective, its value, whether the loss reads it and
    its source; a component the label sets has the label as its source."""
    name, overrides = parse_objective_label(objective)
    spec = resolve_objective(objective)
    rows = [
        [c, _cell(spec, c), "yes" if spec.is_active(c) else "no", "set by the label" if c in overrides else spec.source(c)]
        for c in COMPONENT_FIELDS
    ]
    origin = "" if OBJECTIVES.origin(name) == BUILTIN else f" (registered by {OBJECTIVES.origin(name)})"
    head = [f"{name}: {spec.description}{origin}", label_line(objective)]
    return "\n".join(filter(None, head)) + "\n\n" + _table(["component", "value", "read", "source"], rows, markdown)


def objective_trace(objective: str) -> str:
    """``dfpo objectives NAME --trace`` (or LABEL): the objective followed from its preset to its gradient on a small
    fixed batch, one stage of ``policy_loss`` a line (function, file:line, paper equation, values),
    ``dfpo.core.loss.trace``."""
    from dfpo.core.loss.trace import trace_lines, trace_objective

    lines = trace_lines(trace_objective(objective))  # resolve_objective: names a bad name, label or component
    label = label_line(objective)
    return "\n".join([lines[0], *([label] if label else []), *lines[1:]])


DEMO_VARIANTS: dict[str, tuple[dict[str, object], ...]] = {
    "dfpo_min": ({"clip": "none"}, {"stopgrad": "score"}, {"stopgrad": "score", "length_aware": True}),
    "dfpo_orth_pos": ({"stopgrad": "score"},),
}
"""The study's variants of a preset, shown right after it: DFPO without clipping, in the score form, length-aware."""


def demo_objectives() -> tuple[tuple[str, dict[str, object]], ...]:
    """Every registered objective (dfpo's presets, then users' own), each followed by its ``DEMO_VARIANTS``."""
    return tuple((name, overrides) for name in OBJECTIVES for overrides in ({}, *DEMO_VARIANTS.get(name, ())))


def cancellation_demo(seed: int = 0) -> str:
    """Gradient left on a shared 3-token prefix of one group of 4 completions (rewards 1, 0, 1, 0).

    Columns: equal lengths / unequal lengths, each with the shared token's log-ratio 0
    (no clipping on it) and +0.5 (ratio e^0.5, past every upper clip bound).
    """
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    cases = {
        "equal L, r*=1": ([8, 8, 8, 8], 0.0),
        "equal L, r*=1.65": ([8, 8, 8, 8], 0.5),
        "unequal L, r*=1": ([5, 9, 12, 7], 0.0),
        "unequal L, r*=1.65": ([5, 9, 12, 7], 0.5),
    }
    rows = []
    for name, overrides in demo_objectives():
        cells = []
        for lengths, shared in cases.values():
            group = make_shared_prefix_group(rewards, lengths, shared_log_ratio=shared, seed=seed)
            residual = shared_token_gradient(name, group, **overrides).abs().max().item()
            cells.append("0 (cancels)" if residual < 1e-12 else f"{residual:.2e}")
        label = name + "".join(f" {k}={v}" for k, v in overrides.items())
        rows.append([label, *cells])
    lines = [
        "Shared-prefix cancellation: |gradient| left on a token shared by all 4 completions of a group",
        "(rewards 1,0,1,0; other tokens' ratios random, scale 0.3; r* = the shared token's ratio).",
        "",
        _table(["objective", *cases], rows, markdown=False),
        "",
        "GSPO couples the shared token to each completion's whole-sequence ratio: it does not cancel",
        "(unless every sequence of the group is clipped and the gradient is zero).",
        "DFPO's group transforms restore cancellation at equal lengths where no sequence is clipped.",
        "In the default ratio form (eqs 59-62) a clipped sequence keeps GSPO's zero gradient, so once",
        "part of the group clips (here, at GSPO's 3e-4/4e-4 range) its share of the balance is missing",
        "and the shared token does not cancel. The score form (eq 68) cancels with clipping active,",
        "because it drops the trust region on clipped sequences (compare gspo_noclip). At unequal",
        "lengths the 1/|y_i| normalisation breaks it unless length_aware=True. GRPO-style PPO clipping",
        "breaks it once the shared token's ratio leaves the clip range (Cor. F.1); symmetric clipping does not.",
        "The peers' losses: score-function losses without a ratio-dependent mask (CISPO, GPG) cancel wherever",
        "their normalisation allows; SAPO's soft gate leaves a small residual once r* != 1 (its temperature",
        "differs by the sign of A); sequence weights (GMPO, LUSPO, VESPO) never cancel; DPPO's masks, Clip-Cov,",
        "KL-Cov and OPSM cancel like token PPO unless they treat one copy of the shared token differently.",
    ]
    return "\n".join(lines)


def atlas_table(markdown: bool = False, groups: int = 4, seed: int = 0, own_aggregation: bool = False) -> str:
    """The cancellation verdict of every objective, computed now from the loss core (as the app's atlas page).

    A cell is "cancels" when the shared token's gradient is below 1e-12 in every one of ``groups`` random
    groups, else the largest residual seen. ``own_aggregation``: one row per objective, its preset's aggregation.
    """
    columns, rows = atlas_rows(atlas(groups=groups, seed=seed))
    if own_aggregation:
        rows = [r for r in rows if r["aggregation"] == OBJECTIVES[r["objective"]].aggregation]
    return _table(
        ["objective", "aggregation", *columns], [[r["objective"], r["aggregation"], *(r[c] for c in columns)] for r in rows], markdown
    )


def correction_table(markdown: bool = False) -> str:
    """The cancellation verdict of every rollout correction and rejection, computed now from the loss core."""
    rows = correction_atlas()
    header = list(rows[0])
    return _table(header, [[r[c] for c in header] for r in rows], markdown)


def config_reference() -> str:
    """The generated block of docs/config.md: the trainer's config, section by section, the toy's config and the
    objective override keys, each key with its type, default, allowed values and meaning."""
    parts = ["### `dfpo train`: top-level keys", "", settings.markdown_table(settings.rows(Config))]
    for f in dataclasses.fields(Config):
        section = settings.type_hints(Config)[f.name]
        if dataclasses.is_dataclass(section):
            parts += [
                "",
                f"### `dfpo train`: `[{f.name}]`",
                "",
                settings.setting_of(f).doc,
                "",
                settings.markdown_table(settings.rows(section, f.name + ".")),
            ]
    toy = settings.rows(ToyConfig)
    for row, f in zip(toy, dataclasses.fields(ToyConfig)):
        row["option"] = "" if not f.metadata.get("cli", True) else f"--{f.metadata.get('flag', f.name.replace('_', '-'))}"
        if f.metadata.get("short"):
            row["option"] += f", -{f.metadata['short']}"
    toy = [{"key": r["key"], "option": r["option"], **{k: r[k] for k in ("type", "default", "allowed", "meaning")}} for r in toy]
    parts += ["", "### `dfpo toy`: `ToyConfig`", "", settings.markdown_table(toy, code=("key", "option", "default"))]
    hints = settings.type_hints(ObjectiveSpec)
    defaults = {f.name: f.default for f in dataclasses.fields(ObjectiveSpec)}
    overrides = [
        {
            "key": r["field"],
            "component": r["owner"],
            "type": settings.type_name(hints[r["field"]]),
            "default": settings.literal(defaults[r["field"]]),
            "allowed": r["allowed"],
            "read when": r["read when"],
            "meaning": SPEC_FIELDS[r["field"]].doc,
        }
        for r in component_rows()
    ]
    parts += ["", "### Objective overrides", "", settings.markdown_table(overrides)]
    return "\n".join(parts)


def param_atlas_block() -> str:
    """docs/cancellation.md's parameter-space block: every rollout correction, rejection and KL estimator, then every
    registered objective, probed by one SGD step of a shared-weights model (``dfpo.core.param_atlas``), with the
    sentences read from both tables and checked on a disjoint seed set."""
    from dfpo.core import param_atlas as pa

    setting, objective = pa.param_setting_atlas(), pa.param_objective_atlas()
    confirmation = (pa.param_setting_atlas(pa.CONFIRMATION_SEEDS), pa.param_objective_atlas(pa.CONFIRMATION_SEEDS))
    lines = pa.param_summary(setting, objective, confirmation, (pa.DISCOVERY_SEEDS, pa.CONFIRMATION_SEEDS))
    cells = pa.setting_rows(setting)
    objective_cells = pa.objective_rows(objective)
    return "\n\n".join(
        [
            "\n".join(lines),
            _table(list(cells[0]), [list(r.values()) for r in cells], True),
            _table(list(objective_cells[0]), [list(r.values()) for r in objective_cells], True),
        ]
    )
