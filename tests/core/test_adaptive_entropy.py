"""Skywork-OR1's adaptive entropy coefficient (issue 30): the controller against a loop written from the authors'
EntController, its invariants, what the loss core reads of it, and where it is refused up front (the toy, TRL, verl)."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import ReferenceEntController

from dfpo import policy_loss, resolve_objective
from dfpo.core.loss.adaptive_entropy import EntropyControl, initial_entropy_control, measured_entropy, next_entropy_control

entropies = st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40)


@given(measured=entropies, target=st.floats(0.0, 2.0), delta=st.floats(0.0, 0.01), init=st.floats(0.0, 0.01))
@settings(max_examples=60, deadline=None)
def test_the_controller_is_skyworks_ent_controller(measured, target, delta, init):
    """Every step's coefficient in the loss equals EntController's value * entropy_loss_enabled, bit for bit."""
    spec = resolve_objective("dapo", entropy_coef=init, entropy_target=target, entropy_coef_delta=delta, entropy_coef_max=0.005)
    ref = ReferenceEntController(init, 0.005, 0.0, delta, target)
    state = initial_entropy_control(spec)
    for h in measured:
        assert state.coef_in_loss == ref.value * ref.entropy_loss_enabled
        state, _ = next_entropy_control(state, h, spec), ref.update(h)
        assert state.coef == ref.value and state.enabled == bool(ref.entropy_loss_enabled)


@given(measured=entropies, target=st.floats(0.0, 2.0))
@settings(max_examples=60, deadline=None)
def test_the_coefficient_stays_in_its_range_and_moves_at_most_one_step(measured, target):
    """The coefficient stays within [min, max] and each step changes it by at most entropy_coef_delta."""
    spec = resolve_objective("dapo", entropy_target=target, entropy_coef_min=0.001, entropy_coef_max=0.003, entropy_coef=0.002)
    state = initial_entropy_control(spec)
    for h in measured:
        new = next_entropy_control(state, h, spec)
        assert 0.001 <= new.coef <= 0.003 and abs(new.coef - state.coef) <= spec.entropy_coef_delta + 1e-18
        assert new.enabled == (h < target)
        state = new


def test_measured_entropy_is_the_mean_surprisal_of_the_real_tokens():
    """Skywork-OR1's 'actor/entropy_loss': -mean log pi_old over real tokens, padding (even NaN-free garbage) ignored."""
    old = torch.tensor([[-1.0, -3.0, -99.0], [-2.0, -99.0, -99.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert measured_entropy(old, mask) == pytest.approx(2.0)


def test_the_loss_reads_entropy_coef_as_this_steps_coefficient():
    """policy_loss with entropy_target set is the fixed-coefficient loss at entropy_coef (the trainer moves it), and
    needs the entropy even at coefficient 0 (it may rise later)."""
    b = random_batch(0)
    adaptive = resolve_objective("dapo", entropy_target=0.2, entropy_coef=0.003)
    assert "entropy" in adaptive.required_inputs()
    loss, _ = policy_loss(adaptive, **b.kwargs())
    fixed, _ = policy_loss("dapo", **b.kwargs(), entropy_coef=0.003)
    torch.testing.assert_close(loss, fixed, rtol=0, atol=0)
    with pytest.raises(ValueError, match="entropy is required for entropy_target=0.2"):
        policy_loss(resolve_objective("dapo", entropy_target=0.2), **{**b.kwargs(), "entropy": None})


def test_a_range_upside_down_is_refused():
    with pytest.raises(ValueError, match="entropy_coef_min=0.01 must be at most entropy_coef_max=0.005"):
        resolve_objective("dapo", entropy_target=0.2, entropy_coef_min=0.01)


def test_a_non_finite_entropy_does_not_move_the_coefficient():
    spec = resolve_objective("dapo", entropy_target=0.2)
    with pytest.raises(ValueError, match="measured entropy must be finite"):
        next_entropy_control(EntropyControl(0.001), float("nan"), spec)


def test_verl_and_the_toy_refuse_it_up_front():
    """A verl policy loss has no place to keep the state between steps (TRL's DFPOGRPOTrainer keeps it in a callback:
    tests/integrations/test_trl_adaptive_entropy.py); the toy has no entropy bonus."""
    spec = resolve_objective("dapo", entropy_target=0.2)
    from dfpo.integrations.verl import make_verl_policy_loss

    with pytest.raises(
        ValueError,
        match="entropy_target=0.2 .*verl calls a registered policy loss per micro-batch .* so the coefficient could neither "
        "move between steps nor survive a resume: train it with dfpo train or TRL's DFPOGRPOTrainer, or in verl drop "
        "entropy_target and set a fixed actor.entropy_coeff",
    ):
        make_verl_policy_loss(spec, group_size=4)
    from dfpo.toy.config import ToyConfig
    from dfpo.toy.train import validate

    with pytest.raises(ValueError, match="needs entropy for entropy_target=0.2.*toy lab does not provide"):
        validate(ToyConfig(objectives=("dapo",), overrides=(("entropy_target", 0.2),)))
