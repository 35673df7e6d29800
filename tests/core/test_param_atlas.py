"""Cancellation verdicts in parameter space (dfpo.core.param_atlas): each setting's and each objective's shared-token
residual, split by one real SGD step of a shared-weights model into direct and cross, agrees with the logit-space
tables, and the docs' sentences are read from the tables."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core import param_atlas as pa
from dfpo.core.loss import register_objective
from dfpo.core.loss.cancellation import correction_atlas


@functools.cache
def _tables(seeds: tuple[int, ...]):
    return pa.param_setting_atlas(seeds), pa.param_objective_atlas(seeds)


def test_every_setting_has_the_logit_space_tables_verdict():
    """On the correction table's own groups, a setting cancels in parameter space's coefficient exactly where the
    logit-space table says it cancels (both cases: dapo at unequal lengths, grpo at equal lengths)."""
    logit = {row["setting"]: row for row in correction_atlas()}
    rows = _tables(pa.DISCOVERY_SEEDS)[0]
    checked = 0
    for row in rows:
        if row["setting"] in logit:
            assert row["verdict"].cancels == (logit[row["setting"]][row["case"]] == "cancels"), (row["setting"], row["case"])
            checked += 1
    assert checked == len(logit) * len(pa.PARAM_CASES)


@pytest.mark.parametrize("seeds", [pa.DISCOVERY_SEEDS, pa.CONFIRMATION_SEEDS], ids=["discovery", "confirmation"])
def test_the_direct_part_vanishes_exactly_where_the_coefficients_cancel(seeds):
    """SGD's preconditioner is positive definite, so a shared token's direct drift is zero iff eq 2's residual is."""
    setting, objective = _tables(seeds)
    verdicts = [r["verdict"] for r in setting + objective if r["verdict"] is not None]
    assert any(v.cancels for v in verdicts) and any(not v.cancels for v in verdicts)
    for v in verdicts:
        assert (v.direct < pa.CANCEL_TOL) == v.cancels, v


@pytest.mark.parametrize("seeds", [pa.DISCOVERY_SEEDS, pa.CONFIRMATION_SEEDS], ids=["discovery", "confirmation"])
def test_a_cancelling_shared_token_still_moves_by_the_cross_term_alone(seeds):
    """Cancelling coefficients do not pin a shared token: shared weights move it, all of it cross."""
    setting, objective = _tables(seeds)
    for v in [r["verdict"] for r in setting + objective if r["verdict"] is not None]:
        if v.cancels:
            assert v.cross_share == pytest.approx(1.0) and v.drift > 1e-6


def test_the_split_is_first_order_on_every_row():
    """predicted = direct + cross is the real step's change up to a second-order remainder, small against the drift."""
    setting, objective = _tables(pa.DISCOVERY_SEEDS)
    for v in [r["verdict"] for r in setting + objective if r["verdict"] is not None]:
        assert v.first_order_error < 0.2 * max(v.drift, 1e-3), v


def test_a_sequence_level_correction_moves_the_shared_token_more_than_a_token_level_one():
    """On both seed sets, where cancellation breaks (sequence weights) the shared token drifts more than where it holds."""
    for seeds in (pa.DISCOVERY_SEEDS, pa.CONFIRMATION_SEEDS):
        rows = {(r["setting"], r["case"]): r["verdict"] for r in _tables(seeds)[0]}
        for case in ("dapo, unequal L", "grpo, equal L"):
            token = rows[("rollout_correction=token_truncate", case)]
            sequence = rows[("rollout_correction=sequence_truncate", case)]
            assert token.cancels and not sequence.cancels and sequence.drift > token.drift


def test_an_estimator_cancels_in_parameter_space_exactly_when_its_group_sums_to_zero():
    """Under dapo at unequal lengths: the zero-sum estimators (GDPO's included) keep a shared token's direct drift at
    zero; OPO and REINFORCE++ with a group baseline (zero-sum only at equal lengths), pass@k (never zero-sum) and ReMax
    (zero-sum only when the greedy reward is the group's mean) do not."""
    for seeds in (pa.DISCOVERY_SEEDS, pa.CONFIRMATION_SEEDS):
        rows = {r["setting"]: r["verdict"] for r in _tables(seeds)[0] if r["setting"].startswith("adv_scale=")}
        for scale in ("batch", "none", "rloo", "reinforce_pp", "gdpo"):
            assert rows[f"adv_scale={scale}"].cancels and rows[f"adv_scale={scale}"].direct < pa.CANCEL_TOL
        for scale in ("opo", "reinforce_pp_baseline", "grpo_passk", "remax"):
            assert not rows[f"adv_scale={scale}"].cancels and rows[f"adv_scale={scale}"].direct > 0


def test_the_optimal_token_baseline_cancels_a_shared_token_up_to_its_epsilon_in_parameter_space():
    """OTB's per-token advantages sum to zero at a shared position up to the 1e-8 in its baseline's denominator, so
    under dapo a shared token's residual is of that order, far below the non-zero-sum estimators'."""
    for seeds in (pa.DISCOVERY_SEEDS, pa.CONFIRMATION_SEEDS):
        rows = {r["setting"]: r["verdict"] for r in _tables(seeds)[0] if r["setting"].startswith("adv_scale=")}
        otb = rows["adv_scale=otb"]
        assert otb.coefficient < 1e-8 and otb.direct < 1e-8 and otb.cross_share > 0.999
        assert all(otb.coefficient < 1e-4 * rows[f"adv_scale={s}"].coefficient for s in ("opo", "grpo_passk", "remax"))


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), mode=st.sampled_from(["token_truncate", "token_mask"]))
def test_a_token_level_correction_never_gives_a_shared_token_a_direct_drift(seed, mode):
    """A token-level rollout weight keeps dapo's shared-token cancellation in parameter space on any group."""
    case = pa.probe_case((5, 9, 12, 7), seed)
    verdict = pa.probe_setting("dapo", [case], rollout_correction=mode, rollout_low=0.01, rollout_cap=100.0)
    assert verdict.direct < pa.CANCEL_TOL and verdict.cross_share == pytest.approx(1.0)


def test_a_registered_objective_gets_a_parameter_space_row(registered):
    """The objective table reads the registry, so a user's objective is probed without touching this module."""
    register_objective("grpo_tm_param", base="grpo", source="test: token-mean GRPO", aggregation="token_mean")
    registered.append("grpo_tm_param")
    rows = {r["objective"]: r for r in pa.param_objective_atlas((0,))}
    assert rows["grpo_tm_param"]["verdict"].cancels and not rows["grpo"]["verdict"].cancels


def _fake(cancels: bool, direct: float, share: float, drift: float = 1e-3):
    return pa.ParamVerdict(coefficient=0.0 if cancels else 1e-2, direct=direct, cross_share=share, drift=drift, first_order_error=1e-6)


def test_the_sentences_are_read_from_the_tables():
    """Change a row and the sentence changes: counts, shares, and a verdict a second seed set does not reproduce."""
    setting = [
        {"setting": "a", "case": "c", "verdict": _fake(True, 0.0, 1.0)},
        {"setting": "b", "case": "c", "verdict": _fake(False, 1e-3, 0.4)},
    ]
    objective = [{"objective": "x", "verdict": _fake(True, 0.0, 1.0), "why": ""}, {"objective": "y", "verdict": None, "why": "no"}]
    lines = pa.param_summary(setting, objective)
    assert lines[0].startswith("- Of the 3 (setting, case) and objective rows, 2 cancel in logit space; 2 of those")
    assert "1 of the 1 that do not cancel" in lines[0] and "(cross share 100% to 100%)" in lines[1]
    flipped = [dict(setting[0], verdict=_fake(False, 1e-3, 0.5)), setting[1]]
    agree = pa.param_summary(setting, objective, (setting, objective), ((0,), (1,)))[-1]
    differ = pa.param_summary(setting, objective, (flipped, objective), ((0,), (1,)))[-1]
    assert "every row has the same" in agree
    assert "1 row changes its verdict (a | c)" in differ


def test_an_objective_the_groups_cannot_feed_says_why():
    """A row that cannot be probed is one sentence in the table, never a silent gap."""
    rows = pa.objective_rows([{"objective": "z", "verdict": None, "why": "needs rewards per function"}])
    assert rows == [
        {"objective": "z", "coefficient": "not probed", "direct": "", "cross share": "", "mean drift": "needs rewards per function"}
    ]


def test_the_probe_leaves_the_case_model_as_it_was():
    case = pa.probe_case((8, 8, 8, 8), 0)
    before = [p.detach().clone() for p in case.model.parameters()]
    pa.probe_setting("grpo", [case], rollout_rejection="seq_sum_k2")
    assert all(torch.equal(a, b) for a, b in zip(before, case.model.parameters()))
