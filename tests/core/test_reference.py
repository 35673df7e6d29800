"""Vectorised loss core == slow per-sequence loop reference, for every objective, value and gradient."""

from __future__ import annotations

import pytest
import torch
from batches import random_batch
from reference import reference_loss

from dfpo import OBJECTIVES, policy_loss, resolve_objective

VARIANTS = [(name, {}) for name in OBJECTIVES] + [
    ("dfpo_min", {"length_aware": True}),
    ("dfpo_orth", {"length_aware": True}),
    ("dfpo_orth_pos", {"length_aware": True}),
    ("dfpo_orth_tr", {"length_aware": True}),
    ("dfpo_min", {"stopgrad": "ratio"}),
    ("dfpo_orth_pos", {"stopgrad": "ratio", "eps_low": 0.2, "eps_high": 0.2}),
    ("dfpo_orth_tr", {"aggregation": "token_mean"}),
    ("gspo", {"aggregation": "token_mean"}),
    ("grpo", {"aggregation": "seq_mean_token_sum"}),
    ("grpo", {"beta": 0.04}),
    ("grpo", {"beta": 0.04, "kl_estimator": "k2"}),
    ("dapo", {"beta": 0.04, "kl_estimator": "k1", "kl_ratio_weight": "token"}),
    ("grpo", {"beta": 0.04, "kl_ratio_weight": "token"}),
    ("gspo", {"beta": 0.04, "kl_estimator": "k2", "kl_ratio_weight": "sequence"}),
    ("dapo", {"token_mask": "top_entropy", "mask_renormalise": False}),
    ("stapo", {"stapo_tau_p": 0.5, "stapo_q": 0.5}),  # thresholds that mask real tokens here
    ("grpo", {"clip": "none"}),
    ("dr_grpo", {"max_completion_length": 16}),
    ("grpo", {"dual_clip_c": 1.05}),  # tight, so that negative-advantage tokens hit the dual clip here
    ("gspo", {"dual_clip_c": 1.0001, "eps_low": 0.2, "eps_high": 0.2}),
    ("sapo", {"sapo_tau_neg": 2.0}),
    ("opsm", {"opsm_delta": 0.0}),  # every negative sample the policy moved away from is dropped
    ("grpo", {"entropy_coef": 0.1}),
    ("dppo_tv", {"eps_low": 0.01, "eps_high": 0.01}),  # bounds that mask real tokens here
    ("dppo_kl", {"eps_low": 0.001, "eps_high": 0.001}),
    ("gpg", {"aggregation": "seq_mean_token_mean"}),
    ("clip_cov", {"cov_clip_low": -1.0, "cov_ratio": 0.2}),  # a band and a share that select several tokens here
    ("kl_cov", {"cov_ratio": 0.2}),
]


@pytest.mark.parametrize("name,overrides", VARIANTS, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in VARIANTS])
@pytest.mark.parametrize("seed", [0, 1])
def test_vectorised_equals_loop_reference(name, overrides, seed):
    batch = random_batch(seed, empty_row=(seed == 1))
    loss, metrics = policy_loss(name, **batch.kwargs(), **overrides)
    (grad,) = torch.autograd.grad(loss, batch.logp)

    logp_ref = batch.logp.detach().clone().requires_grad_()
    ref = reference_loss(resolve_objective(name, **overrides), **batch.kwargs(logp_ref))
    (grad_ref,) = torch.autograd.grad(ref, logp_ref)

    torch.testing.assert_close(loss, ref, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-9, atol=1e-12)
    assert all(torch.isfinite(v) for v in metrics.values())


def test_stapo_thresholds_in_variants_really_mask_tokens():
    """The STAPO variant above must exercise the mask, or its reference check proves nothing."""
    batch = random_batch(0)
    _, metrics = policy_loss("stapo", **batch.kwargs(), stapo_tau_p=0.5, stapo_q=0.5)
    assert 0 < metrics["mask/frac"] < 1


@pytest.mark.parametrize(
    "name,overrides,metric",
    [
        ("grpo", {"dual_clip_c": 1.05}, "clip/frac_high"),
        ("opsm", {"opsm_delta": 0.0}, "mask/frac"),
        ("dppo_tv", {"eps_low": 0.01, "eps_high": 0.01}, "clip/frac_high"),
        ("dppo_kl", {"eps_low": 0.001, "eps_high": 0.001}, "clip/frac_high"),
        ("clip_cov", {"cov_clip_low": -1.0, "cov_ratio": 0.2}, "cov/frac"),
        ("kl_cov", {"cov_ratio": 0.2}, "cov/frac"),
    ],
)
def test_variants_that_should_bite_do_bite(name, overrides, metric):
    """A variant above checks its mechanism only if the batch triggers it: dual-clip, OPSM and DPPO's masks act here."""
    batch = random_batch(0)
    base, _ = policy_loss(name, **batch.kwargs(), **{k: v for k, v in overrides.items() if k == "aggregation"})
    _, metrics = policy_loss(name, **batch.kwargs(), **overrides)
    assert metrics[metric] > 0
