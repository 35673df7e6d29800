"""prime-rl's default loss and M2PO (issue 30), checked against loops written from the peers' code as read
(tests/core/reference.py: ``reference_prime_rl_default`` from prime-rl's ``default_loss_fn``, ``reference_m2po`` from
M2PO's ``compute_m2po_policy_loss``) on ragged masks with holes, loss and gradient; and their invariants."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from batches import random_batch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import m2po_bounds_loop, reference_m2po, reference_prime_rl_default

from dfpo import OBJECTIVES, policy_loss
from dfpo.core.loss.m2po import harmful_tokens, m2po_bounds, m2po_tau


def holed(seed: int, **kw):
    """A random batch whose masks are ragged and have holes (a multi-turn completion's environment tokens)."""
    batch = random_batch(seed, empty_row=(seed % 2 == 1), **kw)
    gen = torch.Generator().manual_seed(seed + 100)
    holes = torch.rand(batch.mask.shape, generator=gen) < 0.2
    batch.mask = batch.mask & ~holes
    return batch


def loss_and_grad(name: str, batch, **overrides):
    loss, metrics = policy_loss(name, **batch.kwargs(), **overrides)
    (grad,) = torch.autograd.grad(loss, batch.logp)
    return loss, grad, metrics


def ref_and_grad(fn, batch, **kwargs):
    logp = batch.logp.detach().clone().requires_grad_()
    loss = fn(logp, batch.old_logp, batch.advantages, batch.mask, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss, grad


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("bound", [0.2, 0.01])
def test_prime_rl_equals_its_default_loss_fn(seed, bound):
    """The prime_rl preset is prime-rl's default_loss_fn (DPPO-Binary-TV + kl_tau (log r)^2, divided by the real tokens)."""
    batch = holed(seed, ratio_scale=0.5)
    loss, grad, metrics = loss_and_grad("prime_rl", batch, eps_low=bound, eps_high=bound)
    ref, grad_ref = ref_and_grad(reference_prime_rl_default, batch, dppo_mask_low=bound, dppo_mask_high=bound)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-9, atol=1e-12)
    if bound == 0.01:  # the bound bites here
        assert metrics["clip/frac_low"] + metrics["clip/frac_high"] > 0
    assert metrics["kl/old"] > 0


def test_prime_rl_defaults_are_prime_rls():
    """eps = dppo_mask_low/high = 0.2, old_kl_coef * k2 = kl_tau * d^2 with kl_tau = 1e-3, token mean, no std scaling."""
    spec = OBJECTIVES["prime_rl"]
    assert (spec.clip, spec.eps_low, spec.eps_high, spec.aggregation, spec.adv_scale) == ("dppo_tv_ratio", 0.2, 0.2, "token_mean", "none")
    assert (spec.old_kl_coef, spec.old_kl_estimator, spec.beta) == (2e-3, "k2", 0.0)
    assert not spec.needs_ref_logp  # the penalty reads pi_old, not a reference model


@given(seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_prime_rl_policy_gradient_is_dppo_tvs_below_the_cap(seed):
    """Without the penalty, prime-rl's ratio form has verl dppo_tv's gradient at the same bound wherever r < 20."""
    batch = random_batch(seed, ratio_scale=0.5)
    _, grad, _ = loss_and_grad("prime_rl", batch, old_kl_coef=0.0)
    _, grad_dppo, _ = loss_and_grad("dppo_tv", batch, eps_low=0.2, eps_high=0.2, adv_scale="none")
    torch.testing.assert_close(grad, grad_dppo, rtol=1e-9, atol=1e-12)


@given(seed=st.integers(0, 2**16), coef=st.floats(1e-4, 1.0))
@settings(max_examples=25, deadline=None)
def test_old_kl_vanishes_on_policy(seed, coef):
    """At pi = pi_old (a fresh batch's first step) the k2 penalty to pi_old is 0 and adds no gradient."""
    batch = random_batch(seed)
    batch.old_logp = batch.logp.detach().clone()
    loss, grad, metrics = loss_and_grad("prime_rl", batch, old_kl_coef=coef)
    _, grad_without, _ = loss_and_grad("prime_rl", batch, old_kl_coef=0.0)
    assert float(metrics["kl/old"]) == 0.0
    torch.testing.assert_close(grad, grad_without, rtol=0, atol=1e-15)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"m2po_budget": 0.01}, {"m2po_budget": 10.0}, {"m2po_min_eps_low": 0.3, "m2po_min_eps_high": 0.5}],
    ids=["default", "tight", "unbound", "miniclip"],
)
def test_m2po_equals_its_compute_m2po_policy_loss(seed, overrides):
    """The m2po preset is M2PO's compute_m2po_policy_loss with its bound over the whole batch."""
    batch = holed(seed)
    loss, grad, metrics = loss_and_grad("m2po", batch, **overrides)
    kwargs = {
        "budget": overrides.get("m2po_budget", 0.04),
        "miniclip_low": overrides.get("m2po_min_eps_low"),
        "miniclip_high": overrides.get("m2po_min_eps_high"),
    }
    ref, grad_ref = ref_and_grad(reference_m2po, batch, **kwargs)
    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-9, atol=1e-12)
    clipped = float(metrics["clip/frac_low"] + metrics["clip/frac_high"])
    assert (clipped > 0) == (overrides.get("m2po_budget", 0.04) < 1.0)  # the default budget binds at this mismatch


@given(seed=st.integers(0, 2**16), budget=st.floats(1e-4, 0.5), scale=st.floats(0.05, 1.0))
@settings(max_examples=50, deadline=None)
def test_m2po_cap_keeps_the_capped_second_moment_within_the_budget(seed, budget, scale):
    """Capping every harmful |log r| at M2PO's tau keeps their mean squared log-ratio within the budget."""
    batch = random_batch(seed, ratio_scale=scale)
    mask = batch.mask
    log_r = torch.where(mask, batch.logp.detach() - batch.old_logp, 0.0)
    harmful = harmful_tokens(torch.exp(log_r), batch.advantages[:, None]) & mask
    tau, applies = m2po_tau(log_r**2, harmful, budget)
    capped = torch.minimum(log_r[harmful] ** 2, tau**2)
    if bool(applies):
        assert float(capped.mean()) <= budget + 1e-9
    else:
        assert harmful.sum() == 0 or float((log_r[harmful] ** 2).mean()) <= budget + 1e-12


@given(seed=st.integers(0, 2**16), budget=st.floats(1e-3, 0.5))
@settings(max_examples=25, deadline=None)
def test_m2po_bounds_equal_the_authors_loop(seed, budget):
    """The vectorised breakpoint search gives the bounds of _solve_tau_from_sorted_delta2's loop."""
    batch = random_batch(seed)
    spec = OBJECTIVES["m2po"]

    log_r = torch.where(batch.mask, batch.logp.detach() - batch.old_logp, 0.0)
    low, high = m2po_bounds(torch.exp(log_r), batch.advantages[:, None], dataclasses.replace(spec, m2po_budget=budget))
    low_ref, high_ref = m2po_bounds_loop(batch.logp.detach(), batch.old_logp, batch.advantages, batch.mask, budget)
    assert math.isclose(float(low), low_ref, rel_tol=1e-9) and math.isclose(float(high), high_ref, rel_tol=1e-9)


def test_m2po_is_batch_coupled_and_prime_rl_is_not():
    """M2PO's bound is a statistic of the whole batch (micro-batches must not compute their own); prime-rl's loss is local."""
    assert OBJECTIVES["m2po"].batch_coupled
    assert not OBJECTIVES["prime_rl"].batch_coupled


def test_the_toy_runs_both_sampled_and_refuses_m2po_in_exact_mode():
    """The toy trains prime_rl and m2po on sampled groups; its exact mode cannot take M2PO's batch bound's expectation."""
    from dfpo.toy.config import ToyConfig
    from dfpo.toy.train import validate

    _, specs = validate(ToyConfig(objectives=("prime_rl", "m2po")))
    assert set(specs) == {"prime_rl", "m2po"}
    validate(ToyConfig(objectives=("prime_rl",), mode="exact"))
    with pytest.raises(ValueError, match="clip='m2po'.*use mode='sampled'"):
        validate(ToyConfig(objectives=("m2po",), mode="exact"))
