"""Rollout/trainer mismatch correction and rejection: every mode against the loop reference (ragged masks with holes,
so segments differ from whole completions), the peers' own recipes written from their code as read, the identity
when the sampler is pi_old, and what each mode does to shared-token cancellation (token-level weights and rejections
keep it, completion-level ones break it)."""

from __future__ import annotations

import math

import pytest
import torch
from reference import reference_loss

from dfpo import policy_loss, resolve_objective
from dfpo.core.loss.cancellation import make_shared_prefix_group, rejecting_one
from dfpo.core.loss.correction import CORRECTIONS, correction_metrics
from dfpo.core.loss.ratios import level_log_ratio, segment_ids
from dfpo.core.loss.rejection import REJECTIONS, TOKEN_LEVEL

MODES = [m for m in CORRECTIONS if m != "none"]
REJECTION_MODES = [m for m in REJECTIONS if m != "none"]


def _batch(seed=0, B=6, T=7, holes=True):
    """Two groups of three; row 0 has a hole (two segments), row 4 a single token."""
    g = torch.Generator().manual_seed(seed)
    logp = (-0.2 - torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    rollout = old + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)  # some rho far from 1
    lengths = torch.tensor([7, 3, 5, 7, 1, 4])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if holes:
        mask[0, 3] = False  # row 0: segments {0, 1, 2} and {4, 5, 6}
        mask[3, 1:3] = False  # row 3: segments {0} and {3, 4, 5, 6}
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, -1.0], dtype=torch.float64)[:B]
    return logp, old, rollout, mask, adv, torch.tensor([0, 0, 0, 1, 1, 1])[:B]


def _check_against_reference(name: str, **overrides) -> dict:
    logp, old, rollout, mask, adv, gid = _batch()
    kw = dict(old_logp=old, advantages=adv, mask=mask, group_ids=gid, rollout_logp=rollout)
    loss, metrics = policy_loss(name, logp=logp, **kw, **overrides)
    (grad,) = torch.autograd.grad(loss, logp)
    leaf = logp.detach().clone().requires_grad_()
    ref = reference_loss(resolve_objective(name, **overrides), logp=leaf, **kw)
    (grad_ref,) = torch.autograd.grad(ref, leaf)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-14)
    return metrics


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["grpo", "dapo", "dfpo_min"])
def test_each_correction_equals_the_loop_reference(name, mode):
    """Loss and gradient of every level x treatment, on ragged masks with holes, equal the per-token loop."""
    metrics = _check_against_reference(name, rollout_correction=mode, rollout_low=0.7, rollout_cap=1.5)
    assert 0 < float(metrics["rollout/weight_mean"])


@pytest.mark.parametrize(
    "overrides",
    [
        {"rollout_correction": "token_truncate", "rollout_floor": 0.8, "rollout_cap": 1.3},
        {"rollout_correction": "token_truncate", "rollout_is_batch_normalise": True},
        {"rollout_correction": "sequence_truncate", "rollout_is_batch_normalise": True},
        {"rollout_correction": "geometric_mask", "rollout_is_batch_normalise": True, "rollout_low": 0.9, "rollout_cap": 1.1},
        {"rollout_correction": "segment_truncate", "rollout_is_batch_normalise": True, "rollout_cap": 1.2},
        {"rollout_correction": "token_truncate", "rollout_bypass": True},
        {"rollout_correction": "sequence_mask", "rollout_bypass": True, "rollout_low": 0.3},
        {"rollout_rejection": "seq_mean_k1", "rollout_bypass": True, "rollout_rs_low": 0.97, "rollout_rs_high": 1.03},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_floor_batch_normalisation_and_bypass_equal_the_loop_reference(overrides):
    _check_against_reference("grpo", **overrides)


# the thresholds that reject some but not all tokens of _batch (checked below)
BITING = {"k1": {"rollout_rs_low": 0.7, "rollout_rs_high": 1.4}, "k2": {"rollout_rs_max": 0.05}, "k3": {"rollout_rs_max": 0.05}}


@pytest.mark.parametrize("mode", REJECTION_MODES)
@pytest.mark.parametrize("renormalise", [True, False])
@pytest.mark.parametrize("name", ["grpo", "dapo", "gspo"])
def test_each_rejection_equals_the_loop_reference(name, mode, renormalise):
    """Every rejection, renormalised (verl) or zeroed (OpenRLHF), alone and under a token-level IS weight."""
    bite = BITING[mode[-2:]]
    metrics = _check_against_reference(name, rollout_rejection=mode, rollout_rs_renormalise=renormalise, **bite)
    assert 0 < float(metrics["rollout/rejected_frac"]) < 1, "the thresholds must reject some tokens, not all"
    _check_against_reference(name, rollout_rejection=mode, rollout_rs_renormalise=renormalise, rollout_correction="token_truncate", **bite)


def test_segments_and_levels_by_hand():
    """Row [x x _ x x x _]: segments 1 1 0 2 2 2 0; the level log-ratios read by hand."""
    mask = torch.tensor([[True, True, False, True, True, True, False]])
    assert segment_ids(mask).tolist() == [[1, 1, 0, 2, 2, 2, 0]]
    lr = torch.tensor([[1.0, 3.0, 9.0, 2.0, 2.0, 5.0, 9.0]], dtype=torch.float64)
    assert level_log_ratio(lr, mask, "token").tolist() == [[1.0, 3.0, 0.0, 2.0, 2.0, 5.0, 0.0]]
    assert level_log_ratio(lr, mask, "sequence").tolist() == [[13.0, 13.0, 0.0, 13.0, 13.0, 13.0, 0.0]]
    assert level_log_ratio(lr, mask, "geometric").tolist() == [[2.6, 2.6, 0.0, 2.6, 2.6, 2.6, 0.0]]
    assert level_log_ratio(lr, mask, "segment").tolist() == [[2.0, 2.0, 0.0, 3.0, 3.0, 3.0, 0.0]]


# --- the peers' recipes, written from their code as read ---------------------------------------------------------


def _openrlhf_loss(logp, old, rollout, mask, adv, kind: str, low: float, high: float) -> torch.Tensor:
    """OpenRLHF 0.11 models/loss.py PolicyLoss.forward (policy_loss_type='ppo', token-level loss), as read: the PPO loss
    times vllm_is per token, vllm_is by kind (tis: clamp(rho, low, high); icepop: rho inside [low, high] else 0;
    seq-mask-tis: rho times [low <= exp(mean log rho) <= high]), then the token mean over the action mask."""
    total, count = logp.sum() * 0.0, 0
    for i in range(logp.shape[0]):
        real = [t for t in range(logp.shape[1]) if mask[i, t]]
        geo = math.exp(sum(float(old[i, t] - rollout[i, t]) for t in real) / max(len(real), 1))
        for t in real:
            r = torch.exp(logp[i, t] - old[i, t])
            a = float(adv[i])
            ppo = -torch.minimum(r * a, r.clamp(0.8, 1.2) * a)
            rho = math.exp(float(old[i, t] - rollout[i, t]))
            if kind == "tis":
                w = min(max(rho, low), high)
            elif kind == "icepop":
                w = rho if low <= rho <= high else 0.0
            else:
                w = rho if low <= geo <= high else 0.0
            total, count = total + w * ppo, count + 1
    return total / count


@pytest.mark.parametrize(
    "kind,overrides",
    [
        ("tis", {"rollout_correction": "token_truncate", "rollout_floor": 0.5, "rollout_cap": 5.0}),
        ("icepop", {"rollout_correction": "token_mask", "rollout_low": 0.5, "rollout_cap": 5.0}),
        (
            "seq-mask-tis",
            {
                "rollout_correction": "token_truncate",
                "rollout_cap": 1e9,  # past e^20, the largest rho: no truncation
                "rollout_rejection": "seq_mean_k1",
                "rollout_rs_low": 0.5,
                "rollout_rs_high": 5.0,
                "rollout_rs_renormalise": False,
            },
        ),
    ],
)
def test_openrlhf_corrections_are_these_overrides(kind, overrides):
    """OpenRLHF's three is_correction_type values at its default thresholds [0.5, 5.0], as dfpo overrides of dapo
    (token-mean PPO): loss and gradient to 1e-12 on ragged masks with holes."""
    logp, old, rollout, mask, adv, gid = _batch(3)
    rollout = old + 1.2 * (rollout - old)  # rho past 5 and below 0.5 at some tokens
    loss, _ = policy_loss(
        "dapo", logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid, rollout_logp=rollout, eps_high=0.2, **overrides
    )
    (grad,) = torch.autograd.grad(loss, logp)
    leaf = logp.detach().clone().requires_grad_()
    ref = _openrlhf_loss(leaf, old, rollout, mask, adv, kind, 0.5, 5.0)
    (grad_ref,) = torch.autograd.grad(ref, leaf)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-14)


def test_roll_segment_weight_is_segment_truncate():
    """ROLL utils/train_infer_corrections.py, as read: is_weight = exp(segment mean of log rho) clamped to [0, 1.2]
    (its upper_bound default), multiplying the per-token loss: segment_truncate with cap 1.2 (floor 0)."""
    logp, old, rollout, mask, adv, gid = _batch(4)
    kw = dict(old_logp=old, advantages=adv, mask=mask, group_ids=gid)
    loss, _ = policy_loss("dapo", logp=logp, **kw, rollout_logp=rollout, rollout_correction="segment_truncate", rollout_cap=1.2)
    (grad,) = torch.autograd.grad(loss, logp)
    w = torch.ones_like(old)
    for i in range(old.shape[0]):
        run: list[int] = []
        for t in [*range(old.shape[1]), None]:
            if t is not None and mask[i, t]:
                run.append(t)
                continue
            if run:
                mean = sum(float(old[i, s] - rollout[i, s]) for s in run) / len(run)
                for s in run:
                    w[i, s] = min(math.exp(mean), 1.2)
            run = []
    leaf = logp.detach().clone().requires_grad_()
    per_token = torch.where(
        mask, -torch.minimum(torch.exp(leaf - old) * adv[:, None], torch.exp(leaf - old).clamp(0.8, 1.28) * adv[:, None]), 0.0
    )
    ref = (per_token * w).sum() / mask.sum()
    (grad_ref,) = torch.autograd.grad(ref, leaf)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-12, atol=1e-14)


# --- identities and refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [{"rollout_correction": m} for m in MODES] + [{"rollout_rejection": m} for m in REJECTION_MODES])
def test_no_mismatch_means_no_correction(overrides):
    """pi_rollout == pi_old: every weight is 1, nothing is rejected, the loss and gradient are the uncorrected ones."""
    logp, old, _, mask, adv, gid = _batch(1)
    kw = dict(logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid)
    plain, _ = policy_loss("dfpo_min", **kw)
    corrected, m = policy_loss("dfpo_min", **kw, rollout_logp=old, **overrides)
    assert float(corrected.detach()) == float(plain.detach())
    assert float(m.get("rollout/weight_mean", 1.0)) == 1.0 and float(m.get("rollout/rejected_frac", 0.0)) == 0.0


@pytest.mark.parametrize("key,mode", [("rollout_correction", "token_mask"), ("rollout_rejection", "seq_sum_k3")])
def test_correction_needs_the_sampler_log_probs_unless_bypassed(key, mode):
    logp, old, _, mask, adv, gid = _batch()
    kw = dict(logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid)
    with pytest.raises(ValueError, match=f"rollout_logp is required for {key}='{mode}'"):
        policy_loss("grpo", **kw, **{key: mode})
    policy_loss("grpo", **kw, **{key: mode}, rollout_bypass=True)  # bypass: old_logp is the sampler's


def test_bypass_reads_rho_off_the_policy_and_old_logp():
    """rollout_bypass: rho_t = sg(pi_theta) / pi_old, i.e. the decoupled correction with pi_old := sg(pi_theta) and
    pi_rollout := pi_old (verl apply_bypass_mode + compute_policy_loss_bypass_mode, as read)."""
    logp, old, _, mask, adv, gid = _batch(5)
    kw = dict(advantages=adv, mask=mask, group_ids=gid)
    bypass, _ = policy_loss("gpg", logp=logp, old_logp=old, **kw, rollout_correction="sequence_truncate", rollout_bypass=True)
    decoupled, _ = policy_loss("gpg", logp=logp, old_logp=logp.detach(), rollout_logp=old, **kw, rollout_correction="sequence_truncate")
    torch.testing.assert_close(bypass, decoupled, rtol=1e-12, atol=1e-14)


def test_correction_is_a_separate_factor_after_the_group_transform():
    """DFPO's transform acts on pi/pi_old; the correction multiplies the transformed surrogate: with a weight
    shared by the whole batch (a constant rho) the loss is the uncorrected one times that constant."""
    logp, old, _, mask, adv, gid = _batch(2)
    rollout = old - math.log(1.5)  # rho = 1.5 at every token, below the cap
    kw = dict(logp=logp, old_logp=old, advantages=adv, mask=mask, group_ids=gid)
    plain, _ = policy_loss("dfpo_orth_pos", **kw)
    corrected, _ = policy_loss("dfpo_orth_pos", **kw, rollout_logp=rollout, rollout_correction="token_truncate")
    assert float(corrected) == pytest.approx(1.5 * float(plain), rel=1e-12)
    normalised, _ = policy_loss(
        "dfpo_orth_pos", **kw, rollout_logp=rollout, rollout_correction="token_truncate", rollout_is_batch_normalise=True
    )
    assert float(normalised) == pytest.approx(float(plain), rel=1e-12)  # the batch mean 1.5 divided out


def test_batch_normalisation_and_renormalised_rejection_couple_the_batch():
    assert resolve_objective("dapo", rollout_correction="token_truncate", rollout_is_batch_normalise=True).batch_coupled
    assert resolve_objective("dapo", rollout_rejection="token_k3").batch_coupled
    assert not resolve_objective("dapo", rollout_rejection="token_k3", rollout_rs_renormalise=False).batch_coupled
    assert not resolve_objective("dapo", rollout_correction="sequence_mask").batch_coupled


def test_correction_metrics_by_hand():
    """Two completions, rho = (2, 0.5 | 4): token shares above the cap 2 and the sequence ratios' min/mean/max."""
    log_rho = torch.log(torch.tensor([[2.0, 0.5], [4.0, 1.0]], dtype=torch.float64))
    mask = torch.tensor([[True, True], [True, False]])
    weight = torch.tensor([[2.0, 0.5], [2.0, 1.0]], dtype=torch.float64)  # token_truncate at cap 2
    m = correction_metrics(torch.where(mask, log_rho, 0.0), mask, weight, cap=2.0)
    assert float(m["rollout/weight_mean"]) == pytest.approx(4.5 / 3)
    assert float(m["rollout/token_truncated_frac"]) == pytest.approx(1 / 3)  # only rho = 4 is above 2
    assert float(m["rollout/weight_zero_frac"]) == 0.0
    assert (float(m["rollout/seq_ratio_min"]), float(m["rollout/seq_ratio_mean"]), float(m["rollout/seq_ratio_max"])) == pytest.approx(
        (1.0, 2.5, 4.0)
    )


# --- cancellation -------------------------------------------------------------------------------------------------


def _shared_residual(name: str, equal_lengths: bool, seed: int, **overrides) -> float:
    """The shared token's gradient on a group whose sampler log-probs differ at the completions' own tokens and are one
    value at the shared event (as pi_old is)."""
    lengths = [8, 8, 8, 8] if equal_lengths else [5, 9, 12, 7]
    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0]), lengths, seed=seed)
    loss, _ = policy_loss(
        name, logp=group.logp(), old_logp=group.old_logp, advantages=group.advantages, mask=group.mask,
        group_ids=group.group_ids, rollout_logp=group.rollout_logp, **overrides,
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, group.shared_logp)
    return float(grad.abs().max())


CORRECTION_CANCELS = {mode: mode.startswith("token") for mode in MODES}
"""The stated verdict: a token-level weight reads the shared token alone (one value in every copy) and keeps the
cancellation of the uncorrected objective; a sequence / geometric / segment weight reads each completion's own tokens
and breaks it."""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("equal_lengths", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_weights_keep_cancellation_completion_weights_break_it(mode, equal_lengths, seed):
    """dapo (token-mean PPO, r* = 1) cancels a shared token at any lengths; each correction keeps or breaks that."""
    residual = _shared_residual("dapo", equal_lengths, seed, rollout_correction=mode, rollout_low=0.01, rollout_cap=100.0)
    assert (residual < 1e-12) == CORRECTION_CANCELS[mode], residual


@pytest.mark.parametrize("mode", REJECTION_MODES)
@pytest.mark.parametrize("renormalise", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_rejections_keep_cancellation_under_a_length_free_mean(mode, renormalise, seed):
    """A token-level rejection keeps or drops every copy of the shared token together: dapo keeps cancelling. A
    completion-level rejection (thresholds that reject one completion) drops that copy and breaks it."""
    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0]), [5, 9, 12, 7], seed=seed)
    residual = _shared_residual(
        "dapo", False, seed, rollout_rejection=mode, rollout_rs_renormalise=renormalise, **rejecting_one(mode, group)
    )
    assert (residual < 1e-12) == (mode in TOKEN_LEVEL), residual


@pytest.mark.parametrize("mode", ["token_k1", "token_k3"])
def test_a_renormalised_token_rejection_breaks_the_per_sequence_mean_at_equal_lengths(mode):
    """Under GRPO's per-sequence mean the renormalised rejection shortens each completion by its own rejected tokens:
    1/L_i' differs across the group even at equal lengths, and the shared token no longer cancels; zeroed instead
    (OpenRLHF), the lengths stay and it cancels."""
    bite = {"rollout_rs_low": 0.6, "rollout_rs_high": 1.6} if mode.endswith("k1") else {"rollout_rs_max": 0.04}
    renormalised = max(_shared_residual("grpo", True, s, rollout_rejection=mode, **bite) for s in range(4))
    zeroed = max(_shared_residual("grpo", True, s, rollout_rejection=mode, rollout_rs_renormalise=False, **bite) for s in range(4))
    assert renormalised > 1e-6 and zeroed < 1e-12


def test_rejection_estimators_by_hand():
    """log rho = (1, -1): k1 = (1, -1), k2 = (0.5, 0.5), k3 = (e - 2, 1/e) = (0.718, 0.368); at rollout_rs_max 0.6 the
    token k3 rejection drops only the first, k2 neither; at 0.4 k2 drops both, k3 the first only."""
    from dfpo.core.loss.rejection import rejected_tokens, token_divergence

    log_rho = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert token_divergence(log_rho, "k3").tolist()[0] == pytest.approx([math.e - 2, 1 / math.e])
    assert token_divergence(log_rho, "k2").tolist()[0] == pytest.approx([0.5, 0.5])
    assert rejected_tokens(log_rho, mask, "token_k3", 0.5, 2.0, 0.6).tolist() == [[True, False]]
    assert rejected_tokens(log_rho, mask, "token_k2", 0.5, 2.0, 0.6).tolist() == [[False, False]]
    assert rejected_tokens(log_rho, mask, "token_k2", 0.5, 2.0, 0.4).tolist() == [[True, True]]
    assert rejected_tokens(log_rho, mask, "token_k3", 0.5, 2.0, 0.4).tolist() == [[True, False]]
    assert rejected_tokens(log_rho, mask, "token_k1", 0.5, 2.0, 0.4).tolist() == [[True, True]]  # rho 2.72 > 2, 0.37 < 0.5
    assert rejected_tokens(log_rho, mask, "token_k1", 0.3, 3.0, 0.4).tolist() == [[False, False]]
