"""format_objective_label, the inverse of parse_objective_label, and the three places that spell a label with it.

dfpo compare's --set assignments of a cell, a run folder's identity (dfpo.trainer.run.folder.objective_label) and
dfpo probe's store (dfpo.trainer.probe.across.run_label) all turn a preset and its overrides back into text; one
formatter does it, so a label written by one is read the same by the others."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dfpo.core.loss import COMPONENT_FIELDS, OBJECTIVES, parse_objective_label
from dfpo.core.loss.objectives import format_objective_label, format_override, override_type, parse_override

PRESET_VALUES: dict[str, list[object]] = {
    key: sorted({getattr(spec, key) for spec in OBJECTIVES.values()}, key=repr) for key in COMPONENT_FIELDS
}
"""Every value each component takes in some preset: values a real label carries, of the component's own type."""


def _values(key: str) -> st.SearchStrategy:
    """A component's preset values, and for a number any other finite one (bools both ways)."""
    kind = override_type(key)
    extra = st.nothing()
    if kind is bool:
        extra = st.booleans()
    elif float in getattr(kind, "__args__", (kind,)):
        extra = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
    elif int in getattr(kind, "__args__", (kind,)):
        extra = st.integers(min_value=1, max_value=100_000)
    return st.one_of(st.sampled_from(PRESET_VALUES[key]), extra)


overrides = st.lists(st.sampled_from(list(COMPONENT_FIELDS)), max_size=4, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({k: _values(k) for k in keys})
)
"""A few overrides: up to four components, each with a value of its type."""


def _same(a: object, b: object) -> bool:
    """Equal and of the same type (True is not 1, 0.0 is not 0)."""
    return type(a) is type(b) and a == b


@given(name=st.sampled_from(list(OBJECTIVES)), given_overrides=overrides)
def test_parsing_a_formatted_label_gives_back_the_preset_and_every_override_with_its_type(name, given_overrides):
    """parse(format(name, overrides)) == (name, overrides), each value of the same type."""
    parsed_name, parsed = parse_objective_label(format_objective_label(name, given_overrides))
    assert parsed_name == name and parsed.keys() == given_overrides.keys()
    assert all(_same(parsed[k], given_overrides[k]) for k in given_overrides), (given_overrides, parsed)


@given(name=st.sampled_from(list(OBJECTIVES)), given_overrides=overrides, data=st.data())
def test_formatting_a_parsed_label_gives_the_label_back_whatever_order_its_overrides_came_in(name, given_overrides, data):
    """format(parse(label)) == label for a label built from a preset and a few overrides, in any order."""
    label = format_objective_label(name, given_overrides)
    assert format_objective_label(*parse_objective_label(label)) == label
    shuffled = data.draw(st.permutations(list(given_overrides.items())))
    assert format_objective_label(name, dict(shuffled)) == label


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_a_bare_preset_is_its_own_label(name):
    assert format_objective_label(name, {}) == name == format_objective_label(*parse_objective_label(name))


def test_the_spelling_is_the_one_dfpo_compare_always_used():
    """Overrides sorted by key, bools lower case, numbers and None as str() writes them (stored identities read so)."""
    label = format_objective_label("dfpo_min", {"stopgrad": "score", "length_aware": True, "eps_low": 0.2, "dual_clip_c": None})
    assert label == "dfpo_min:dual_clip_c=None:eps_low=0.2:length_aware=true:stopgrad=score"
    assert format_override("mask_renormalise", False) == "mask_renormalise=false"
    assert parse_override("dual_clip_c", "None") is None


LABEL = "dfpo_min:stopgrad=score:length_aware=true:eps_low=0.2"
"""Overrides given out of order, a bool and a float among them."""


def test_a_run_folders_identity_and_the_probe_store_spell_a_label_with_the_formatter():
    from dfpo.trainer.probe.across import run_label
    from dfpo.trainer.run.folder import objective_label

    name, given_overrides = parse_objective_label(LABEL)
    expected = "dfpo_min:eps_low=0.2:length_aware=true:stopgrad=score"
    assert objective_label(name, given_overrides) == expected
    assert run_label(SimpleNamespace(objective=SimpleNamespace(name=name, overrides=given_overrides))) == expected


def test_dfpo_compares_set_assignments_give_the_trainer_the_labels_overrides_in_the_labels_order():
    from dfpo.trainer.compare import Plan, run_sets

    plan = Plan(labels=(LABEL, "gspo_noclip"), baseline="gspo_noclip", seeds=(0,), config="c.toml", sets=(), out=Path("out"))
    prefix = "objective.overrides."
    assigned = [s.removeprefix(prefix).partition("=") for s in run_sets(plan, LABEL, 0) if s.startswith(prefix)]
    assert [f"{k}={v}" for k, _, v in assigned] == ["stopgrad=score", "length_aware=true", "eps_low=0.2"]
    assert {k: parse_override(k, v) for k, _, v in assigned} == parse_objective_label(LABEL)[1]
