"""ObjectiveSpec's field declarations: every field says its owner, kind, bounds, source, when it is read and
whether a matched control holds it equal; validation, the matched-control check, the shared sources and the
component docs are derived from them, and the spec says which optional inputs it needs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from batches import random_batch

from dfpo import ObjectiveSpec, policy_loss, resolve_objective
from dfpo.core.loss import OBJECTIVES, objective_from_label, trust_region, unmatched_components
from dfpo.core.loss import core as core_module
from dfpo.core.loss.fields import KINDS, META_KEY, OWNERS, FieldInfo, field_infos
from dfpo.core.loss.spec import COMMON_SOURCES, COMPONENT_FIELDS, SPEC_FIELDS, TRUST_REGION_FIELDS, component_rows


def undeclared_fields(cls) -> list[str]:
    """Fields of dataclass ``cls`` whose metadata lacks a complete ``FieldInfo`` (owner, kind, source, trust region)."""
    bad = []
    for f in dataclasses.fields(cls):
        info = f.metadata.get(META_KEY)
        if not isinstance(info, FieldInfo) or info.owner not in OWNERS or info.kind not in KINDS:
            bad.append(f.name)
        elif not info.source.strip() or not isinstance(info.trust_region, bool):
            bad.append(f.name)
    return bad


def test_every_spec_field_is_declared_with_complete_metadata():
    """A field added to ObjectiveSpec without an owner, kind, source and trust-region classification fails here."""
    assert undeclared_fields(ObjectiveSpec) == []
    assert set(SPEC_FIELDS) == {f.name for f in dataclasses.fields(ObjectiveSpec)}


def test_an_unclassified_field_is_caught():
    """The check above is not vacuous: a dataclass with one bare field and one half-declared field fails it."""
    info = FieldInfo(owner="clip", kind="bool", source="s", trust_region=True, doc="d")
    probe = dataclasses.make_dataclass(
        "Probe",
        [
            ("declared", bool, dataclasses.field(default=False, metadata={META_KEY: info})),
            ("bare", float, dataclasses.field(default=0.0)),
            ("half", float, dataclasses.field(default=0.0, metadata={"help": "no FieldInfo"})),
        ],
    )
    assert undeclared_fields(probe) == ["bare", "half"]
    with pytest.raises(ValueError, match="owner"):
        FieldInfo(owner="nowhere", kind="bool", source="s", trust_region=True, doc="d")
    with pytest.raises(ValueError, match="bounds"):
        FieldInfo(owner="clip", kind="number", source="s", trust_region=True, doc="d")
    with pytest.raises(ValueError, match="doc"):
        FieldInfo(owner="clip", kind="bool", source="s", trust_region=True)
    with pytest.raises(ValueError, match="source"):
        FieldInfo(owner="clip", kind="bool", source=" ", trust_region=True)


def test_declarations_refer_to_real_fields_and_choices():
    """Every 'read when' names a choice field and values it can take; a bound that names a field names a real one."""
    for name, info in SPEC_FIELDS.items():
        for condition in [info.active_when, *(w for w, _ in info.bounds_when)]:
            if condition is None:
                continue
            owner = SPEC_FIELDS[condition.field]
            assert owner.kind == "choice", (name, condition)
            assert set(condition.values) <= set(owner.choices), (name, condition)
        if info.bounds is not None and isinstance(info.bounds.low, str):
            assert info.bounds.low in SPEC_FIELDS


def test_shared_sources_trust_region_and_component_fields_are_derived_from_the_declarations():
    assert COMPONENT_FIELDS == tuple(n for n, i in SPEC_FIELDS.items() if i.owner != "preset")
    assert set(COMPONENT_FIELDS) == set(COMMON_SOURCES) and "name" not in COMPONENT_FIELDS
    assert all(COMMON_SOURCES[n] == SPEC_FIELDS[n].source for n in COMPONENT_FIELDS)
    assert TRUST_REGION_FIELDS == tuple(n for n in COMPONENT_FIELDS if SPEC_FIELDS[n].trust_region)
    # The mechanism under comparison is the transform and its parameters, or the exact-cancellation arm that bounds what
    # any transform gains (issue 58); everything else is held equal.
    assert {n for n in COMPONENT_FIELDS if not SPEC_FIELDS[n].trust_region} == {
        "cancel",
        "transform",
        "tr_floor",
        "stopgrad",
        "length_aware",
    }
    assert [r["field"] for r in component_rows()] == list(COMPONENT_FIELDS)


def _outside_values(name: str, spec: ObjectiveSpec) -> list[object]:
    """Values just outside the bounds that apply to ``spec`` (and NaN, a bool)."""
    bounds = SPEC_FIELDS[name].bounds_for(spec)
    low, high = bounds.resolve(spec)
    values: list[object] = [float("nan"), True]
    if math.isfinite(low):
        values.append(low if bounds.low_open else low - 0.5)
    if math.isfinite(high):
        values.append(high + 0.5)
    return values


NUMBER_FIELDS = [n for n, i in SPEC_FIELDS.items() if i.kind in ("number", "optional_number")]


@pytest.mark.parametrize("name", NUMBER_FIELDS)
@pytest.mark.parametrize("preset", ["grpo", "cispo", "clip_cov"])
def test_number_checks_follow_the_declared_bounds(name, preset):
    """A value outside a field's declared bounds (for this preset) is refused naming the field; the
    bounds themselves (closed ends) are accepted."""
    spec = OBJECTIVES[preset]
    bounds = SPEC_FIELDS[name].bounds_for(spec)
    if bounds is None:  # declared unchecked here (eps_low under CISPO): anything finite goes
        assert resolve_objective(spec, **{name: 123.0}).eps_low == 123.0
        return
    for value in _outside_values(name, spec):
        with pytest.raises(ValueError, match=name):
            resolve_objective(spec, **{name: value})
    low, high = bounds.resolve(spec)
    for value in (low if not bounds.low_open else None, high):
        if value is not None and math.isfinite(value):
            assert getattr(resolve_objective(spec, **{name: value}), name) == value


def test_cispo_checks_only_its_cap():
    """CISPO reads eps_high as the ratio cap itself (> 0) and never reads eps_low; PPO clipping allows eps_high = 0."""
    assert resolve_objective("cispo", eps_low=123.0).eps_low == 123.0
    with pytest.raises(ValueError, match=r"eps_high must be > 0, got 0.0"):
        resolve_objective("cispo", eps_high=0.0)
    assert resolve_objective("grpo", eps_high=0.0).eps_high == 0.0
    with pytest.raises(ValueError, match=r"eps_low must be in \[0, 1\], got 123.0"):
        resolve_objective("grpo", eps_low=123.0)


@pytest.mark.parametrize("name", [n for n, i in SPEC_FIELDS.items() if i.kind == "choice"])
def test_choice_checks_follow_the_declared_registry(name):
    with pytest.raises(ValueError, match=f"{name} must be one of"):
        resolve_objective("grpo", **{name: "no-such-choice"})


@pytest.mark.parametrize(
    "method, baseline, unmatched",
    [
        ("stapo:stapo_q=0.5", "stapo", ["stapo_q"]),  # STAPO reads q: a different q is a different mask
        ("grpo:stapo_q=0.5", "grpo", []),  # no STAPO mask: q is never read
        ("sapo:sapo_tau_pos=2", "sapo", ["sapo_tau_pos"]),
        ("gspo:sapo_tau_pos=2", "gspo", []),
        ("dr_grpo:max_completion_length=16", "dr_grpo", ["max_completion_length"]),
        ("grpo:max_completion_length=16", "grpo", []),
        ("opsm:mask_renormalise=true", "opsm", ["mask_renormalise"]),
        ("grpo:mask_renormalise=false", "grpo", []),
        ("grpo:rollout_correction=token_mask", "grpo", ["rollout_correction", "rollout_low", "rollout_cap", "rollout_is_batch_normalise"]),
        ("grpo:rollout_low=0.1", "grpo", []),
        ("dfpo_min:tr_floor=0.1:length_aware=true", "gspo", []),  # the transform's own parameters are the mechanism
        ("cispo:eps_low=0.5", "cispo", []),  # CISPO caps from above only
        ("stapo", "dapo", ["token_mask", "mask_renormalise", "stapo_tau_p", "stapo_q"]),
    ],
)
def test_an_inactive_field_never_unmatches_two_specs(method, baseline, unmatched):
    """A field the loss does not read for a spec (its component is off) cannot make a control unmatched."""
    assert unmatched_components(objective_from_label(method), objective_from_label(baseline)) == unmatched


def _another_value(name: str, spec: ObjectiveSpec) -> object | None:
    """A valid value of a non-choice field other than the spec's own (None if there is none)."""
    info, value = SPEC_FIELDS[name], getattr(spec, name)
    if info.kind == "bool":
        return not value
    if info.kind == "count":
        return 7 if value != 7 else 8
    bounds = info.bounds_for(spec) or info.bounds  # unchecked here: any value within the usual bounds
    low, high = bounds.resolve(spec)
    if value is None:  # an optional number that is off: 1.5, or the middle of a bounded range (M2PO's minimum ranges)
        return 1.5 if low < 1.5 <= high else (low + high) / 2
    for candidate in (value * 0.5, value * 2.0, value + 0.25, (low + high) / 2 if math.isfinite(high) else low + 1.0):
        if candidate != value and low <= candidate <= high and not (bounds.low_open and candidate == low):
            return candidate
    return None


@pytest.mark.parametrize("preset", sorted(OBJECTIVES))
def test_changing_a_trust_region_value_unmatches_exactly_when_the_loss_reads_it(preset):
    """For every preset and every non-choice trust-region field: a new value makes the spec unmatched with the
    preset (in that field alone) if the loss reads the field for that preset, and leaves it matched otherwise."""
    spec = OBJECTIVES[preset]
    for name in TRUST_REGION_FIELDS:
        if SPEC_FIELDS[name].kind == "choice" or (value := _another_value(name, spec)) is None:
            continue
        try:
            changed = resolve_objective(spec, **{name: value})
        except ValueError as refused:  # a cross-field rule (online IPO replaces the token term a mask acts on)
            assert name in str(refused) and "\n" not in str(refused), (preset, name, refused)
            continue
        assert unmatched_components(changed, spec) == ([name] if spec.is_active(name) else []), (preset, name, value)


def test_trust_region_reports_none_for_unread_fields():
    tr = trust_region(OBJECTIVES["grpo"])
    assert tr["stapo_q"] is None and tr["sapo_tau_pos"] is None and tr["eps_low"] == 0.2
    assert trust_region(OBJECTIVES["stapo"])["stapo_q"] == 0.75


@pytest.mark.parametrize(
    "label, entropy, ref_logp, rollout_logp",
    [
        ("grpo", False, False, False),
        ("stapo", True, False, False),
        ("grpo:token_mask=top_entropy", True, False, False),
        ("grpo:token_mask=opsm", False, False, False),
        ("grpo:entropy_coef=0.01", True, False, False),
        ("gspo:beta=0.04", False, True, False),
        ("dapo:rollout_correction=sequence_mask", False, False, True),
    ],
)
def test_a_spec_says_which_optional_inputs_it_needs(label, entropy, ref_logp, rollout_logp):
    spec = objective_from_label(label)
    assert (spec.needs_entropy, spec.needs_ref_logp, spec.needs_rollout_logp) == (entropy, ref_logp, rollout_logp)
    assert set(spec.required_inputs()) == {
        n for n, need in (("entropy", entropy), ("ref_logp", ref_logp), ("rollout_logp", rollout_logp)) if need
    }


@pytest.mark.parametrize(
    "label, argument, component",
    [
        ("stapo", "entropy", "token_mask='stapo'"),
        ("grpo:token_mask=top_entropy", "entropy", "token_mask='top_entropy'"),
        ("grpo:entropy_coef=0.01", "entropy", "entropy_coef=0.01"),
        ("grpo:beta=0.04", "ref_logp", "beta=0.04"),
        ("grpo:rollout_correction=token_truncate", "rollout_logp", "rollout_correction='token_truncate'"),
    ],
)
def test_a_missing_input_is_refused_before_any_maths(monkeypatch, label, argument, component):
    """policy_loss names the missing argument and the component that needs it, before checking or computing anything."""
    monkeypatch.setattr(core_module, "_check_inputs", lambda *a, **k: pytest.fail("inputs were checked before the refusal"))
    monkeypatch.setattr(core_module, "RATIO_SHAPES", {})  # any maths would raise KeyError
    kw = random_batch(0).kwargs()
    kw.update(entropy=torch.ones_like(kw["logp"]), ref_logp=kw["old_logp"], rollout_logp=kw["old_logp"])
    kw[argument] = None
    with pytest.raises(ValueError, match=f"{argument} is required for {component}".replace("(", r"\(")):
        policy_loss(objective_from_label(label), **kw)


def test_every_preset_keeps_its_components_and_sources():
    """The declarations moved the shared sources beside the fields; each preset's own values and sources stay."""
    for spec in OBJECTIVES.values():
        assert all(spec.source(c) for c in COMPONENT_FIELDS)
        assert set(spec.sources) <= set(COMPONENT_FIELDS)
    assert OBJECTIVES["stapo"].source("stapo_q") == "STAPO latest version: q = 0.75"
    assert OBJECTIVES["grpo"].source("stapo_q") == "STAPO (arXiv 2602.15620) latest version: q = 0.75"
    assert field_infos(ObjectiveSpec)["beta"].owner == "kl"


def test_cli_component_docs_come_from_the_declarations():
    """``dfpo objectives`` lists every component with its owner, when it is read and its trust-region class."""
    from dfpo.commands import components_table, objectives_table

    table, full = components_table(), objectives_table()
    for row in component_rows():
        line = next(line for line in table.splitlines() if line.split()[:1] == [row["field"]])
        assert row["owner"] in line and row["read when"] in line and row["trust region"] in line
        assert row["source"] in full
    one = objectives_table(objective="grpo")
    assert any(line.split()[:3] == ["stapo_q", "0.75", "no"] for line in one.splitlines())
