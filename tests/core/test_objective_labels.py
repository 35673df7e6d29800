"""Objective labels (a preset plus its own overrides) and the matched-control check used by every comparison."""

from __future__ import annotations

import pytest

from dfpo.core.loss import OBJECTIVES, objective_from_label, parse_objective_label, trust_region, unmatched_components


def test_a_label_parses_into_typed_overrides():
    name, overrides = parse_objective_label(" dfpo_min:stopgrad=score:eps_low=0.2:length-aware=true:max_completion_length=5 ")
    assert name == "dfpo_min"
    assert overrides == {"stopgrad": "score", "eps_low": 0.2, "length_aware": True, "max_completion_length": 5}
    assert isinstance(overrides["eps_low"], float) and isinstance(overrides["max_completion_length"], int)
    assert parse_objective_label("gspo") == ("gspo", {})


def test_a_label_override_wins_over_the_shared_overrides():
    spec = objective_from_label("gspo:eps_high=0.3", eps_low=0.1, eps_high=0.9)
    assert (spec.eps_low, spec.eps_high) == (0.1, 0.3)


@pytest.mark.parametrize(
    "label, message",
    [
        ("ppo2", "unknown objective='ppo2'"),
        ("gspo:foo=1", "unknown component 'foo'"),
        ("gspo:eps_low", "'eps_low' is not KEY=VALUE"),
        ("gspo:eps_low=abc", "eps_low takes a float value, got eps_low='abc'"),
        ("gspo:length_aware=2", "length_aware takes a bool value"),
        ("gspo:stopgrad=sideways", "stopgrad must be one of"),
        ("gspo:eps_low=-1", "eps_low must be in"),
    ],
)
def test_a_bad_label_is_refused_naming_the_bad_part(label, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        objective_from_label(label)


@pytest.mark.parametrize(
    "method, baseline, unmatched",
    [
        ("dfpo_min", "gspo", []),  # ratio form keeps GSPO's clip range
        ("dfpo_min:stopgrad=score", "gspo_noclip", []),  # score form: no trust region on clipped sequences
        ("dfpo_min:clip=none", "gspo_noclip", []),
        ("dfpo_min:stopgrad=score", "gspo", ["clip", "eps_low", "eps_high"]),
        ("dfpo_min:eps_low=0.2:eps_high=0.2", "gspo", ["eps_low", "eps_high"]),
        ("dfpo_min:aggregation=token_mean", "gspo", ["aggregation"]),
        ("dfpo_orth_pos", "dapo", ["ratio_level", "eps_low", "eps_high", "aggregation"]),
    ],
)
def test_matched_controls_differ_only_in_the_transform(method, baseline, unmatched):
    assert unmatched_components(objective_from_label(method), objective_from_label(baseline)) == unmatched


def test_every_preset_has_a_trust_region_and_gspo_noclip_is_gspo_without_clipping():
    for spec in OBJECTIVES.values():
        assert set(trust_region(spec)) >= {"clip", "eps_low", "eps_high", "aggregation"}
    gspo, noclip = OBJECTIVES["gspo"], OBJECTIVES["gspo_noclip"]
    assert noclip.clip == "none" and {k: v for k, v in noclip.components().items() if k != "clip"} == {
        k: v for k, v in gspo.components().items() if k != "clip"
    }


def test_dfpo_presets_default_to_the_ratio_form():
    """Eqs 59-62: the transforms keep GSPO's clipping; the score form is an override."""
    assert {OBJECTIVES[o].stopgrad for o in OBJECTIVES if o.startswith("dfpo")} == {"ratio"}
