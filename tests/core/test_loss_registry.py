"""The loss core's component registry: new ratio shapes plug in at one place, GMPO is one of them.

GMPO (arXiv 2507.20673) is checked against its own log-space form (as verl's ``geo_mean`` loss
writes it): w_i = exp((1/L_i) sum_t sgn(A_i) min(sgn(A_i) l_it, sgn(A_i) clip(l_it, -0.4, 0.4))).
"""

from __future__ import annotations

import math

import pytest
import torch

from dfpo import ObjectiveSpec, policy_loss, resolve_objective
from dfpo.core.loss import OBJECTIVES, RATIO_SHAPES, PolicyTerms, register_ratio_shape
from dfpo.core.loss import core as core_module
from dfpo.core.loss.batch import LossBatch
from dfpo.core.loss.shapes import SEQUENCE_WEIGHT_LEVELS
from dfpo.core.loss.transforms import sequence_surrogate


def _batch(seed: int = 0, B: int = 6, T: int = 7):
    gen = torch.Generator().manual_seed(seed)
    logp = (-0.2 - torch.rand(B, T, generator=gen, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)  # some tokens beyond e^+-0.4
    lengths = torch.tensor([7, 3, 5, 7, 1, 4])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.0, 0.3], dtype=torch.float64)[:B]
    groups = torch.tensor([0, 0, 0, 1, 1, 1])[:B]
    return logp, old, mask, adv, groups


def _gmpo_log_space(logp, old, mask, adv, eps: float = 0.4) -> torch.Tensor:
    """GMPO's loss written in log space, row by row: -(1/B) sum_i A_i w_i."""
    terms = []
    for i in range(logp.shape[0]):
        L = int(mask[i].sum())
        log_r = logp[i, :L] - old[i, :L]  # (L,)
        sgn = math.copysign(1.0, float(adv[i])) if float(adv[i]) != 0 else 0.0
        l_min = sgn * torch.minimum(sgn * log_r, sgn * log_r.clamp(-eps, eps))
        terms.append(adv[i] * torch.exp(l_min.mean()))
    return -torch.stack(terms).mean()


def test_gmpo_preset_is_the_log_space_clip_of_the_paper():
    """GMPO's ratio-space clip range is exactly |log r| <= 0.4."""
    spec = OBJECTIVES["gmpo"]
    assert (spec.ratio_level, spec.clip, spec.aggregation) == ("geometric", "ppo", "seq_mean_token_mean")
    assert math.log(1 - spec.eps_low) == pytest.approx(-0.4, abs=1e-15)
    assert math.log(1 + spec.eps_high) == pytest.approx(0.4, abs=1e-15)
    assert "2507.20673" in spec.source("ratio_level")


@pytest.mark.parametrize("seed", range(5))
def test_gmpo_equals_its_log_space_form_in_value_and_gradient(seed):
    """policy_loss('gmpo') is GMPO's own objective: same value, same gradient (clipped tokens get none)."""
    logp, old, mask, adv, groups = _batch(seed)
    loss, _ = policy_loss("gmpo", logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=groups)
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_()
    ref = _gmpo_log_space(logp2, old, mask, adv)
    (grad_ref,) = torch.autograd.grad(ref, logp2)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-14)


def test_gmpo_gradient_by_hand_on_one_sequence():
    """One sequence, A = 1, log-ratios (0.1, 0.6): the second token is clipped at 0.4, so
    w = exp((0.1 + 0.4) / 2), and only the first token gets the gradient -A w / L."""
    logp = torch.tensor([[0.1 - 1.0, 0.6 - 1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 2), -1.0, dtype=torch.float64)
    loss, m = policy_loss(
        "gmpo",
        logp=logp,
        old_logp=old,
        advantages=torch.tensor([1.0], dtype=torch.float64),
        mask=torch.ones(1, 2, dtype=torch.bool),
        group_ids=torch.zeros(1, dtype=torch.long),
    )
    (grad,) = torch.autograd.grad(loss, logp)
    w = math.exp(0.25)
    assert float(loss.detach()) == pytest.approx(-w, rel=1e-12)
    torch.testing.assert_close(grad, torch.tensor([[-w / 2, 0.0]], dtype=torch.float64))
    assert float(m["clip/frac_high"]) == pytest.approx(0.5)  # one of two tokens, counted per token
    assert float(m["ratio/max"]) == pytest.approx(math.exp(0.6))


def test_a_spec_is_validated_on_construction_and_used_as_it_is(monkeypatch):
    """policy_loss takes an ObjectiveSpec without resolving it again; a bad spec cannot be built."""
    with pytest.raises(ValueError, match="ratio_level"):
        ObjectiveSpec(name="x", description="", ratio_level="arithmetic")
    spec = resolve_objective("gspo", eps_high=0.1)
    monkeypatch.setattr(core_module, "resolve_objective", lambda *a, **k: pytest.fail("the spec was resolved again"))
    logp, old, mask, adv, groups = _batch()
    loss, _ = policy_loss(spec, logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=groups)
    assert torch.isfinite(loss)


@pytest.fixture
def arithmetic_shape():
    """A new ratio shape registered for the length of one test: the arithmetic mean of token ratios,
    clipped per sequence; it gives one weight per sequence, so DFPO's transforms apply to it."""

    def arithmetic(spec, x: LossBatch) -> PolicyTerms:
        from dfpo.core.loss.clipping import clip_rule

        ratio = torch.exp(torch.where(x.mask, x.logp - x.old_logp, 0.0))  # (B, T)
        mean = torch.where(x.mask, ratio, 0.0).sum(-1) / x.lengths.clamp(min=1)  # (B,)
        rule = clip_rule(spec.clip)
        sbar = rule.weight(mean, x.adv, spec, None)  # (B,)
        surrogate, weight = sequence_surrogate(spec, sbar, x)
        low, high = rule.flags(mean.detach(), x.adv, spec, None)
        return PolicyTerms(
            surrogate,
            mean.detach()[:, None].expand_as(x.logp),
            sbar.detach(),
            weight,
            low[:, None].expand_as(x.mask),
            high[:, None].expand_as(x.mask),
            True,
        )

    register_ratio_shape("arithmetic", sequence_weight=True)(arithmetic)
    yield
    del RATIO_SHAPES["arithmetic"]
    SEQUENCE_WEIGHT_LEVELS.discard("arithmetic")


def test_a_new_ratio_shape_is_one_registered_function(arithmetic_shape):
    """Registering a shape is all a new sequence-weight objective needs: its spec validates, its loss
    is A * clip(mean r) per sequence, and a DFPO transform composes with it (zero net A . stilde)."""
    logp, old, mask, adv, groups = _batch(3)
    spec = ObjectiveSpec(name="arith", description="arithmetic-mean ratio", ratio_level="arithmetic", clip="none")
    loss, m = policy_loss(spec, logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=groups)
    ratio = torch.exp(torch.where(mask, logp.detach() - old, 0.0))
    mean = torch.where(mask, ratio, 0.0).sum(-1) / mask.sum(-1)
    assert float(loss.detach()) == pytest.approx(float(-(adv * mean).mean()), rel=1e-12)
    assert float(m["ratio/max"]) == pytest.approx(float(mean.max()), rel=1e-12)
    orth = ObjectiveSpec(name="arith_orth", description="", ratio_level="arithmetic", clip="none", transform="orth")
    _, m_orth = policy_loss(orth, logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=groups)
    assert float(m_orth["loss/policy"]) == pytest.approx(0.0, abs=1e-12)  # sum_i A_i stilde_i = 0 in every group


def test_registries_are_the_component_choices():
    """Each component's allowed values are exactly its registry's keys (one list per component)."""
    from dfpo.core.loss import (
        CLIP_MODES,
        CLIP_RULES,
        STOPGRAD_FUNCTIONS,
        TOKEN_MASK_FUNCTIONS,
        TOKEN_MASKS,
        TRANSFORM_FUNCTIONS,
        TRANSFORMS,
    )
    from dfpo.core.loss.spec import RATIO_LEVELS
    from dfpo.core.loss.transforms import STOPGRAD_FORMS

    assert RATIO_LEVELS == tuple(RATIO_SHAPES) == ("token", "sequence_token", "sequence", "sequence_product", "geometric")
    assert CLIP_MODES == tuple(CLIP_RULES) and TRANSFORMS == tuple(TRANSFORM_FUNCTIONS)
    assert TOKEN_MASKS == tuple(TOKEN_MASK_FUNCTIONS) and STOPGRAD_FORMS == tuple(STOPGRAD_FUNCTIONS)
    assert ObjectiveSpec(name="x", description="", clip="cispo").ratio_level == "token"
    for level in ("sequence_token", "sequence", "sequence_product", "geometric"):  # CISPO's cap is defined per token only
        with pytest.raises(ValueError, match="token-level"):
            ObjectiveSpec(name="x", description="", ratio_level=level, clip="cispo")
