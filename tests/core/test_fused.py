"""``fused_policy_loss``: the LM head and the loss in one pass give ``policy_loss`` on ``naive_token_logprobs``.

Every preset of ``OBJECTIVES`` (the registry, iterated: presets added later are covered), with ragged masks and an
empty row, groups whose rows are interleaved and split across chunks, a temperature, entropy-reading objectives,
one-pass and two-pass layouts, half-precision inputs; and the rules around it: which positions a coefficient
depends on (``coupling_unit``), the chunk plan, bad input refused before the LM head runs, non-finite log-probs,
no (B, T, V) tensor.
"""

from __future__ import annotations

import warnings
import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import dfpo
from dfpo.core import fused as fused_module
from dfpo.core.fused import COUPLING_UNITS, chunk_plan, coupling_unit, fused_head_loss, fused_policy_loss
from dfpo.core.logprobs import naive_token_logprobs
from dfpo.core.loss import OBJECTIVES, objective_from_label, policy_loss, resolve_objective

B, T, H, V, G = 8, 6, 8, 40, 4

LAYOUTS = {
    "one chunk": dict(chunk_size=1024, max_logits_mib=64.0),
    "chunks of 5, units held": dict(chunk_size=5, max_logits_mib=64.0),
    "chunks of 3, two passes": dict(chunk_size=3, max_logits_mib=0.0),
    "chunks of 5, solved once": dict(chunk_size=5, max_logits_mib=64.0, solve_once=True),
}
"""Chunk layouts: everything in one block; blocks of 5 positions that cut token-level rows and hold larger units in
one pass; blocks of 3 with no logits budget, so every coupled unit takes two passes (groups split across chunks), but
a row-scaled objective's completions longer than a block, which run block by block, scaled once; blocks of 5 with the
coefficients solved once for the whole batch (the default on a GPU)."""

EXTRA = {
    "dapo:entropy_coef=0.01": dict(entropy_coef=0.01),  # an entropy bonus under token_mean: token units, entropy gradient
    "grpo:entropy_coef=0.01": dict(entropy_coef=0.01),  # the same under a sequence mean: batch-coupled
    "grpo:token_mask=top_entropy": dict(token_mask="top_entropy"),
    "grpo:beta=0.04": dict(beta=0.04),  # the KL term to a reference
    "grpo:rollout_correction=token_truncate": dict(rollout_correction="token_truncate"),
    "gspo:rollout_correction=sequence_mask": dict(rollout_correction="sequence_mask"),
    "dfpo_min:stopgrad=score": dict(stopgrad="score"),
    # the peers' components (issue 30), which this module knows only as "not token- or row-local"
    "grpo:rollout_correction=geometric_mask": dict(rollout_correction="geometric_mask"),
    "dapo:rollout_correction=segment_truncate": dict(rollout_correction="segment_truncate"),
    "grpo:rollout_is_batch_normalise": dict(rollout_correction="token_truncate", rollout_is_batch_normalise=True),
    "dapo:rollout_rejection=token_k3": dict(rollout_rejection="token_k3"),
    "grpo:rollout_rejection=seq_mean_k1": dict(rollout_rejection="seq_mean_k1"),
    "dapo:rollout_rejection=seq_max_k2,renormalise": dict(rollout_rejection="seq_max_k2", rollout_rs_renormalise=True),
    "grpo:kl_estimator=k2,seq_ratio": dict(beta=0.04, kl_estimator="k2", kl_ratio_weight="sequence"),
    "dapo:kl_estimator=k1,token_ratio": dict(beta=0.04, kl_estimator="k1", kl_ratio_weight="token"),
}
CASES = [(name, {}) for name in OBJECTIVES] + [(label.split(":")[0], kw) for label, kw in EXTRA.items()]
CASE_IDS = list(OBJECTIVES) + list(EXTRA)


def _batch(seed: int, dtype=torch.float32):
    """A ragged batch: B rows of G-row groups whose rows are interleaved, one empty row, every input policy_loss reads."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, H, generator=g, dtype=dtype)  # (B, T, H)
    w = torch.randn(V, H, generator=g, dtype=dtype) * 0.7  # (V, H)
    y = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[2] = 0  # an empty row
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    gid = (torch.arange(B) // G)[torch.randperm(B, generator=g)] * 7 + 3  # (B,) interleaved, not 0..n-1
    adv = torch.randn(B, generator=g, dtype=torch.float32)
    noise = torch.randn(B, T, generator=g, dtype=torch.float32)
    return h, w, y, mask, gid, adv, noise


def _inputs(spec, lp: torch.Tensor, mask, gid, adv, noise) -> dict:
    """old, reference and rollout log-probs near the policy's (some sequences clipped, some not)."""
    lp = lp.detach().float()
    kw = dict(old_logp=lp + 0.1 * noise, advantages=adv, mask=mask, group_ids=gid)
    if spec.needs_ref_logp:
        kw["ref_logp"] = lp - 0.2 * noise
    if spec.needs_rollout_logp:
        kw["rollout_logp"] = lp + 0.05 * noise.flip(0)
    return kw


def _head_calls(monkeypatch) -> list[int]:
    """The rows of each LM-head forward (``head_logits`` call) made from now on, in order."""
    calls: list[int] = []
    real = fused_module.head_logits
    monkeypatch.setattr(fused_module, "head_logits", lambda h, *a, **k: calls.append(h.shape[0]) or real(h, *a, **k))
    return calls


def _reference(spec, h, w, y, temperature: float, kw: dict):
    """policy_loss on naive_token_logprobs: loss, metrics, d hidden, d W."""
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    lp, ent = naive_token_logprobs(h, w, y, temperature=temperature)
    loss, metrics = policy_loss(spec, logp=lp, entropy=ent if spec.needs_entropy else None, **kw)
    gh, gw = torch.autograd.grad(loss, [h, w])
    return loss.detach(), metrics, gh, gw


def _fused(spec, h, w, y, temperature: float, kw: dict, **options):
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    loss, metrics = fused_policy_loss(spec, hidden=h, lm_head_weight=w, targets=y, temperature=temperature, **kw, **options)
    gh, gw = torch.autograd.grad(loss, [h, w])
    return loss.detach(), metrics, gh, gw


def _reference_error(slow, truth, index: int, key: str | None = None) -> float:
    """How far the float32 reference's loss (0), d hidden (2), d W (3) or metric ``key`` is from its float64 truth."""
    if truth is None:
        return 0.0
    a, b = (slow[index], truth[index]) if key is None else (slow[index][key], truth[index][key])
    return float((a.detach().double() - b.detach().double()).abs().max())


def _assert_equal(fast, slow, *, rtol: float, atol: float, truth=None) -> None:
    """The fused result equals the reference within ``rtol``/``atol``, or, given the float64 ``truth``, within twice the
    reference's own float32 error: a fused path no less accurate than the reference passes whatever the batch."""
    (loss, metrics, gh, gw), (loss_ref, metrics_ref, gh_ref, gw_ref) = fast, slow
    torch.testing.assert_close(loss, loss_ref, rtol=rtol, atol=max(atol, 2 * _reference_error(slow, truth, 0)))
    # round-off of a sum scales with its terms, not its result: online IPO's +c / -c rows cancel in d W with c ~ 10
    for index, grad, grad_ref in ((2, gh, gh_ref), (3, gw, gw_ref)):
        scaled = atol * max(1.0, float(grad_ref.abs().max()))
        torch.testing.assert_close(grad, grad_ref, rtol=rtol, atol=max(scaled, 2 * _reference_error(slow, truth, index)))
    T = gh.shape[1]  # a metric summed over a completion (online IPO's margin h) carries T tokens' round-off
    for key, value in metrics_ref.items():
        allowed = max(atol * T, 2 * _reference_error(slow, truth, 1, key))
        torch.testing.assert_close(metrics[key], value.detach(), rtol=rtol, atol=allowed, msg=key)


def _float64(kw: dict) -> dict:
    """The loss inputs with every floating tensor in float64 (masks and group ids unchanged)."""
    return {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kw.items()}


@pytest.fixture(params=["cpu choices", "gpu choices"])
def device_choices(request, monkeypatch):
    """The choices fused_head_loss makes by device: the CPU's, and a GPU's (solve once, no per-block read-back) made
    on the CPU, so the path a GPU takes is checked everywhere the tests run."""
    if request.param == "gpu choices":
        monkeypatch.setattr(fused_module, "_syncs_are_dear", lambda device: True)
    return request.param


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(("name", "overrides"), CASES, ids=CASE_IDS)
def test_loss_metrics_and_gradients_equal_policy_loss_on_full_logits(name, overrides, layout, device_choices):
    """Every objective, every layout, with the CPU's and a GPU's choices: loss, metrics, d hidden and d W equal the
    reference to float32 round-off."""
    _assert_fused_equals_the_reference(name, overrides, LAYOUTS[layout], seed=_case_seed(name, overrides, layout))


def _case_seed(name: str, overrides: dict, layout: str) -> int:
    return zlib.crc32(f"{name}{overrides}{layout}".encode()) % 2**16


def _assert_fused_equals_the_reference(name: str, overrides: dict, options: dict, *, seed: int, device: str = "cpu") -> None:
    """fused_policy_loss with ``options`` on ``_batch(seed)`` (on ``device``) equals policy_loss on the full logits:
    within 2e-5 / 2e-6, or twice the float32 reference's own error against its float64 truth."""
    spec = resolve_objective(name, **overrides)
    h, w, y, mask, gid, adv, noise = (t.to(device) for t in _batch(seed))
    lp, _ = naive_token_logprobs(h, w, y, temperature=0.7)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    # VESPO's weight e^(lambda) w^k e^(-lambda w) moves by (k - lambda w) per unit of log-ratio round-off, so on some
    # batches both float32 paths sit ~1e-5 from the truth: the float64 reference says how far the float32 one may be
    truth = _reference(spec, h.double(), w.double(), y, 0.7, _float64(kw))
    fast, slow = _fused(spec, h, w, y, 0.7, kw, **options), _reference(spec, h, w, y, 0.7, kw)
    assert fast[0].device.type == fast[3].device.type == device
    _assert_equal(fast, slow, rtol=2e-5, atol=2e-6, truth=truth)


@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min", "stapo"])
def test_solved_once_the_batch_takes_one_coefficient_call_and_two_passes_of_every_block(monkeypatch, name):
    """solve_once: the log-probs of every block, one coefficient call, the fused pass: the head runs twice per block and
    every token is counted in ``fused/two_pass``; on the CPU the default (None) keeps one call per chunk."""
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, noise = _batch(13)
    kw = _inputs(spec, naive_token_logprobs(h, w, y)[0], mask, gid, adv, noise)
    calls, real = [], fused_module._Inputs.coefficients
    monkeypatch.setattr(fused_module._Inputs, "coefficients", lambda self, *a: calls.append(1) or real(self, *a))
    heads = _head_calls(monkeypatch)
    _, metrics, *_ = _fused(spec, h, w, y, 1.0, kw, chunk_size=5, solve_once=True)
    n_real = int(mask.sum())
    assert len(calls) == 1 and float(metrics["fused/two_pass"]) == 1.0
    assert heads == 2 * [min(5, n_real - s) for s in range(0, n_real, 5)]
    calls.clear()
    _fused(spec, h, w, y, 1.0, kw, chunk_size=5)  # the CPU default: a call per chunk of units (one for a batch unit)
    assert (len(calls) > 1) == (coupling_unit(spec) != "batch")


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize(
    ("name", "overrides"),
    [("stapo", {}), ("grpo", {"entropy_coef": 0.01}), ("gspo", {}), ("dfpo_min", {})],
    ids=["stapo", "grpo:entropy_coef=0.01", "gspo", "dfpo_min"],
)
def test_no_buffer_is_read_back_from_another_allocation(monkeypatch, name, overrides, layout):
    """Every ``_kept`` call gives a fresh buffer full of NaN, as a GPU's allocator may give fresh memory (``_kept``
    keeps buffers on the CPU alone): results still equal the reference, so the pass reads only what it wrote in the
    same buffer (an entropy objective's p, asked for again between its statistics and its gradient, once did not)."""
    monkeypatch.setattr(fused_module, "_kept", lambda slot, shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype))
    _assert_fused_equals_the_reference(name, overrides, LAYOUTS[layout], seed=21)


def _host_reads(monkeypatch, step) -> int:
    """How many times ``step()`` reads a value back from its tensors' device (a scalar, or a nonzero's size)."""
    reads = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default):
                reads[0] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step()
    return reads[0]


@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min", "stapo"])
def test_with_a_gpus_choices_the_host_reads_do_not_grow_with_the_number_of_blocks(monkeypatch, name):
    """Off the CPU a read-back stalls the device: solved once, a step reads back as often in 15 blocks as in 2
    (the policy_loss checks and the one finite check), not once or twice per block."""
    monkeypatch.setattr(fused_module, "_syncs_are_dear", lambda device: True)
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, noise = _batch(17)
    kw = _inputs(spec, naive_token_logprobs(h, w, y)[0], mask, gid, adv, noise)
    n_real = int(mask.sum())
    few, many = n_real // 2 + 1, 2  # 2 blocks, and 15
    reads = {c: _host_reads(monkeypatch, lambda c=c: _fused(spec, h, w, y, 1.0, kw, chunk_size=c)) for c in (few, many)}
    assert -(-n_real // many) >= 12 and reads[many] == reads[few], reads


def test_the_sync_free_statistics_equal_the_cpus_with_a_target_near_underflow():
    """log p_y off an in-place log-softmax, then p: the same log-probs and p as the softmax path, also where p_y is
    about e^-90 (which the softmax path takes from logsumexp)."""
    g = torch.Generator().manual_seed(3)
    z = torch.randn(6, 50, generator=g) * 3
    y = torch.randint(0, 50, (6,), generator=g)
    z[2, y[2]] = -90.0  # p_y ~ e^-90: below float32's normal range
    ref = torch.log_softmax(z.double(), -1)
    outs = []
    for sync_free in (False, True):
        block = z.clone()
        logp, _ = fused_module._eager_stats_(block, y, None, lambda k: z[k], sync_free=sync_free)
        outs.append((logp, block))
        torch.testing.assert_close(logp.double(), ref.gather(-1, y[:, None]).squeeze(-1), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-7)


class _BlockPasses(TorchDispatchMode):
    """The ops, other than matmuls, views and allocations, that return an (n, V) tensor (a logits block, V = 40)."""

    SKIP = ("mm", "addmm", "t", "transpose", "permute", "view", "slice", "alias", "as_strided", "detach", "select", "empty")

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] == V and name.rstrip("_") not in self.SKIP:
                self.ops.append(name)
        return out


@pytest.mark.parametrize(("choices", "per_block"), [("cpu", ["_softmax"]), ("gpu", ["_log_softmax", "_softmax"])])
@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min"])
def test_a_float32_heads_logits_take_one_softmax_and_no_pass_that_writes_their_gradient(monkeypatch, name, choices, per_block):
    """A float32 head writes d loss / d z = c (onehot - p) nowhere: c goes on the (n, H) side, so a block's logits see one
    softmax and nothing else (and, solved once, one log-softmax in the statistics pass, with no exp after it)."""
    if choices == "gpu":
        monkeypatch.setattr(fused_module, "_syncs_are_dear", lambda device: True)
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, noise = _batch(43)
    kw = _inputs(spec, naive_token_logprobs(h, w, y)[0], mask, gid, adv, noise)
    heads = _head_calls(monkeypatch)
    with _BlockPasses() as mode:
        fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=6, max_logits_mib=64.0)
    blocks = len(heads) // len(per_block)  # solved once: each block's head runs in both passes
    assert blocks >= 2 and sorted(mode.ops) == sorted(per_block * blocks), mode.ops
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min"])
def test_where_the_targets_are_near_certain_the_gradients_are_as_exact_as_the_references(name):
    """p_y near 1 (targets the likeliest tokens, logits scaled): c (W_y - p W) cancels most of W_y, and the fused
    gradients still lie within twice the float32 reference's own error of the float64 truth."""
    spec = resolve_objective(name)
    h, w, _, mask, gid, adv, noise = _batch(47)
    y = (h @ w.T).argmax(-1)  # (B, T) the likeliest token at each position
    h = h * 30.0
    lp = naive_token_logprobs(h, w, y)[0]
    assert float(lp[mask].exp().median()) > 0.99
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    truth = _reference(spec, h.double(), w.double(), y, 1.0, _float64(kw))
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=64.0)
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=0.0, atol=0.0, truth=truth)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_on_cuda_every_objective_equals_policy_loss_on_full_logits(layout):
    """On a CUDA device, every objective and layout: loss, metrics, d hidden and d W equal the reference on the same
    device to float32 round-off (CUDA's own kernels, its scatter and matmul orders, not the CPU's)."""
    failed = {}
    options = {"solve_once": False, **LAYOUTS[layout]}  # each layout's own path, not only the GPU's default
    for (name, overrides), label in zip(CASES, CASE_IDS):
        try:
            _assert_fused_equals_the_reference(name, overrides, options, seed=_case_seed(name, overrides, layout), device="cuda")
        except AssertionError as err:
            failed[label] = str(err).splitlines()[0]
    assert not failed, failed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min", "stapo"])
def test_on_cuda_a_bfloat16_head_gives_a_float32_loss_near_the_float32_reference(name):
    """A bf16 model's head on CUDA (h and W bfloat16): the loss comes back in float32 and near the float32 reference."""
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, noise = (t.cuda() for t in _batch(11))
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    fast = _fused(spec, h.bfloat16(), w.bfloat16(), y, 1.0, kw, chunk_size=4)
    slow = _reference(spec, h.bfloat16().float(), w.bfloat16().float(), y, 1.0, kw)
    assert fast[0].dtype == torch.float32 and fast[2].dtype == fast[3].dtype == torch.bfloat16
    torch.testing.assert_close(fast[0], slow[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fast[2].float(), slow[2], rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(fast[3].float(), slow[3], rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize(("name", "overrides"), CASES, ids=CASE_IDS)
def test_float64_equality_is_exact_to_float64_round_off(name, overrides):
    """In float64 the fused path and the reference agree to 1e-10: no approximation, only summation order."""
    spec = resolve_objective(name, **overrides)
    h, w, y, mask, gid, adv, noise = _batch(7, torch.float64)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    kw = _float64(kw)
    _assert_equal(
        _fused(spec, h, w, y, 1.0, kw, chunk_size=3, max_logits_mib=1e-3), _reference(spec, h, w, y, 1.0, kw), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min", "stapo"])
def test_old_logp_none_is_the_policys_own_log_probs_detached(name):
    """old_logp=None (the first optimiser step: ratio 1) equals the reference with old_logp = logp.detach()."""
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, _ = _batch(11)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    lp, ent = naive_token_logprobs(hh, ww, y)
    loss_ref, _ = policy_loss(
        spec, logp=lp, old_logp=lp.detach(), advantages=adv, mask=mask, group_ids=gid, entropy=ent if spec.needs_entropy else None
    )
    gh_ref, gw_ref = torch.autograd.grad(loss_ref, [hh, ww])
    out = fused_head_loss(
        spec,
        hidden=h.requires_grad_(),
        lm_head_weight=w.requires_grad_(),
        targets=y,
        old_logp=None,
        advantages=adv,
        mask=mask,
        group_ids=gid,
        chunk_size=4,
    )
    gh, gw = torch.autograd.grad(out.loss, [h, w])
    torch.testing.assert_close(out.loss.detach(), loss_ref.detach())
    torch.testing.assert_close(gh, gh_ref, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(gw, gw_ref, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(out.logp, torch.where(mask, lp.detach(), 0.0), rtol=1e-5, atol=1e-5)


def test_entropies_are_reported_when_asked_and_zero_at_padding():
    """with_entropy gives the entropies (for a log) of an objective that does not read them, 0 at padding."""
    h, w, y, mask, gid, adv, noise = _batch(3)
    lp, ent = naive_token_logprobs(h, w, y)
    out = fused_head_loss(
        "grpo", hidden=h, lm_head_weight=w, targets=y, old_logp=lp, advantages=adv, mask=mask, group_ids=gid, with_entropy=True
    )
    torch.testing.assert_close(out.entropy, torch.where(mask, ent, 0.0), rtol=1e-5, atol=1e-5)
    assert (
        fused_head_loss("grpo", hidden=h, lm_head_weight=w, targets=y, old_logp=lp, advantages=adv, mask=mask, group_ids=gid).entropy
        is None
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_hidden_states_with_a_float32_head_equal_the_float32_reference(dtype):
    """Half-precision hidden states (autocast) under float32 master weights are computed in float32: the loss equals
    the reference on the same values in float32, and d hidden comes back in the hidden states' dtype."""
    spec = resolve_objective("dfpo_min")
    h, w, y, mask, gid, adv, noise = _batch(5)
    h = h.to(dtype)
    lp, _ = naive_token_logprobs(h.float(), w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=4)
    slow = _reference(spec, h.float(), w, y, 1.0, kw)
    assert fast[0].dtype == torch.float32 and fast[2].dtype == dtype and fast[3].dtype == torch.float32
    _assert_equal(
        (fast[0], fast[1], fast[2].float(), fast[3]), (slow[0], slow[1], slow[2].to(dtype).float(), slow[3]), rtol=1e-2, atol=1e-3
    )
    torch.testing.assert_close(fast[0], slow[0], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_head_computes_the_loss_in_float32(dtype):
    """A half-precision head: the matmul runs in its dtype, everything after in float32; the loss comes back in float32,
    the gradients in the inputs' dtypes, close to the full-logits path on the same inputs (half-precision logits)."""
    spec = resolve_objective("gspo")
    h, w, y, mask, gid, adv, noise = _batch(9)
    h, w = h.to(dtype), w.to(dtype)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=4)
    slow = _reference(spec, h, w, y, 1.0, kw)
    assert fast[0].dtype == torch.float32 and fast[2].dtype == dtype and fast[3].dtype == dtype
    torch.testing.assert_close(fast[0], slow[0], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fast[2].float(), slow[2].float(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(fast[3].float(), slow[3].float(), rtol=5e-2, atol=5e-2)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["one chunk", "chunks of 3, two passes"])
@pytest.mark.parametrize(
    ("name", "overrides"), [("grpo", {}), ("gspo", {}), ("dfpo_min", {}), ("stapo", {}), ("dapo", {"entropy_coef": 0.01})]
)
def test_compiled_kernels_give_the_eager_numbers(name, overrides, layout):
    """compile=True (the elementwise work through torch.compile) equals the reference like the eager kernels."""
    spec = resolve_objective(name, **overrides)
    h, w, y, mask, gid, adv, noise = _batch(13)
    lp, _ = naive_token_logprobs(h, w, y, temperature=0.7)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = _fused(spec, h, w, y, 0.7, kw, compile=True, **LAYOUTS[layout])
    assert not [w for w in caught if "torch.compile failed" in str(w.message)]  # the compiled kernels ran
    _assert_equal(fast, _reference(spec, h, w, y, 0.7, kw), rtol=2e-5, atol=2e-6)


def test_a_failing_compiler_falls_back_to_the_eager_kernels_with_a_warning(monkeypatch):
    """If torch.compile fails, the eager kernels run (same numbers, entropies included) and a warning names the failure."""

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    spec = resolve_objective("dapo", entropy_coef=0.01)
    h, w, y, mask, gid, adv, noise = _batch(17)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    monkeypatch.setattr(fused_module.torch, "compile", lambda fn, **kw: broken)
    with pytest.warns(UserWarning, match="torch.compile failed .*no C\\+\\+ compiler.*eager kernels run"):
        fast = _fused(spec, h, w, y, 1.0, kw, compile=True)
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min"])
def test_compile_without_entropies_runs_the_eager_kernels_and_never_calls_the_compiler(monkeypatch, name):
    """compile=True compiles only where it saves a block (entropies): without them no compiler is loaded or called."""
    monkeypatch.setattr(fused_module.torch, "compile", lambda *a, **k: pytest.fail("torch.compile was called"))
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, noise = _batch(19)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    _assert_equal(_fused(spec, h, w, y, 1.0, kw, compile=True), _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


# ----------------------------------------------------------------------------- which positions a coefficient reads


@pytest.mark.parametrize(("name", "overrides"), CASES, ids=CASE_IDS)
def test_a_coefficient_reads_only_its_coupling_unit(name, overrides):
    """d loss / d logp (and d loss / d entropy) at the positions of a unit do not change when every log-prob and entropy
    outside the unit changes: what lets a chunk's coefficients be taken with placeholders elsewhere."""
    spec = resolve_objective(name, **overrides)
    unit = coupling_unit(spec)
    assert unit in COUPLING_UNITS
    if unit == "batch":
        return  # the whole batch is one unit: nothing outside it
    h, w, y, mask, gid, adv, noise = _batch(19)
    lp, ent = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    inside = {
        "token": mask & (torch.arange(T) == 1)[None, :] & (torch.arange(B) == 0)[:, None],
        "row": mask & (torch.arange(B) == 0)[:, None],
    }.get(unit)
    if inside is None:  # group
        inside = mask & (gid == gid[0])[:, None]

    def coefficients(logp, entropy):
        logp, entropy = logp.detach().requires_grad_(), entropy.detach().requires_grad_()
        loss, _ = policy_loss(spec, logp=logp, entropy=entropy if spec.needs_entropy else None, **kw)
        grads = torch.autograd.grad(loss, [logp, entropy], allow_unused=True)
        return [torch.zeros_like(logp) if g is None else g for g in grads]

    g = torch.Generator().manual_seed(23)
    moved_lp = torch.where(inside, lp, lp - torch.rand(B, T, generator=g))  # (B, T) other log-probs, still log-probs
    moved_ent = torch.where(inside, ent, ent * torch.rand(B, T, generator=g))
    for a, b in zip(coefficients(lp, ent), coefficients(moved_lp, moved_ent)):
        torch.testing.assert_close(a[inside], b[inside], rtol=1e-5, atol=1e-7)


def test_coupling_units_of_the_presets():
    """Token-level objectives chunk anywhere; a sequence ratio needs its row; DFPO's transforms the group; batch
    statistics (STAPO, covariance controls) the batch."""
    assert [coupling_unit(OBJECTIVES[n]) for n in ("grpo", "dapo", "cispo", "gspo", "gmpo", "luspo", "opsm", "dfpo_min", "stapo", "clip_cov")] == [
        "token", "token", "token", "row", "row", "row", "row", "group", "batch", "batch"
    ]  # fmt: skip
    assert coupling_unit(resolve_objective("grpo", rollout_correction="sequence_truncate")) == "row"


def test_a_setting_this_module_does_not_know_is_taken_as_group_coupled(monkeypatch):
    """A component field added later (unknown here) at a non-default value makes the unit a group, which is exact for
    every objective that is not batch-coupled."""
    monkeypatch.setattr(fused_module, "_LOCAL_ANY_VALUE", fused_module._LOCAL_ANY_VALUE - {"eps_high"})
    assert coupling_unit(OBJECTIVES["grpo"]) == "token"  # at its default
    assert coupling_unit(resolve_objective("grpo", eps_high=0.28)) == "group"


# ----------------------------------------------------------------------------- completions scaled once (row_scaled)


def test_row_scaled_objectives_of_the_presets():
    """A sequence-level ratio, clip and weight with nothing per token: GSPO, GSPO-token, LUSPO, VESPO, and DFPO, whose
    transform maps a group's sequence weights; not GMPO (clipped per token), OPSM (a token ratio), a KL term to a
    reference, an entropy read, or a batch statistic."""
    scaled = {name for name in OBJECTIVES if fused_module.row_scaled(OBJECTIVES[name])}
    assert {"gspo", "gspo_noclip", "gspo_token", "luspo", "vespo", "dfpo_min", "dfpo_orth", "dfpo_orth_tr"} <= scaled
    assert not scaled & {"gmpo", "opsm", "grpo", "stapo", "topr", "kimi15", "prime_rl"}
    assert not fused_module.row_scaled(resolve_objective("gspo", beta=0.04))
    assert not fused_module.row_scaled(resolve_objective("dfpo_min", beta=0.04))
    assert not fused_module.row_scaled(resolve_objective("gspo", entropy_coef=0.01))
    assert fused_module.row_scaled(resolve_objective("gspo", rollout_correction="sequence_mask"))
    assert fused_module.row_scaled(resolve_objective("dfpo_min", stopgrad="score"))


ROW_SCALED_CASES = [(n, kw) for n, kw in CASES if fused_module.row_scaled(resolve_objective(n, **kw))]


def _coefficients(spec, kw: dict, mask, logp: torch.Tensor) -> torch.Tensor:
    """d loss / d logp (B, T) at ``logp``, as the fused pass takes them (``_Inputs.coefficients``)."""
    inputs = {k: kw.get(k) for k in ("old_logp", "advantages", "group_ids", "ref_logp", "rollout_logp")}
    return fused_module._Inputs(spec, mask=mask, **inputs).coefficients(logp, None)[0]


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(ROW_SCALED_CASES), seed=st.integers(0, 2**16), spread=st.floats(0.01, 3.0))
def test_a_row_scaled_completions_coefficients_are_one_factor_times_those_at_ratio_one(case, seed, spread):
    """Along a completion of a row-scaled objective, d loss / d logp is one factor times its value at ratio 1 where that is not 0."""
    name, overrides = case
    spec = resolve_objective(name, **overrides)
    h, w, y, mask, gid, adv, noise = _batch(seed)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    moved = kw["old_logp"] + spread * torch.randn(B, T, generator=torch.Generator().manual_seed(seed))  # (B, T)
    at_one, at_moved = (_coefficients(spec, kw, mask, v) for v in (kw["old_logp"], moved))
    for b in range(B):  # DFPO's truncating transforms can give a completion weight 0 at ratio 1 (it runs again, below)
        if at_one[b][mask[b]].any():
            assert fused_module._row_factor(at_moved[b][mask[b]], at_one[b][mask[b]]) is not None, b


@pytest.mark.parametrize("name", ["gmpo", "opsm"])
def test_a_row_coupled_objective_that_clips_per_token_is_not_one_factor(name):
    """GMPO's and OPSM's coefficients along a completion are not a multiple of those at ratio 1 once a token is clipped:
    what keeps them off the scaled path."""
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, noise = _batch(37)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    moved = kw["old_logp"] + torch.randn(B, T, generator=torch.Generator().manual_seed(1))  # (B, T)
    at_one, at_moved = (_coefficients(spec, kw, mask, v) for v in (kw["old_logp"], moved))
    assert any(fused_module._row_factor(at_moved[b][mask[b]], at_one[b][mask[b]]) is None for b in range(B))


def _long_rows(seed: int, rows: int = 4, length: int = 24):
    """Completions longer than the blocks of the tests below: rows x length positions, ragged, groups of 2."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, length, H, generator=g)  # (rows, length, H)
    w = torch.randn(V, H, generator=g) * 0.7  # (V, H)
    y = torch.randint(0, V, (rows, length), generator=g)
    lengths = torch.tensor([length, length - 5, 3, length - 1])[:rows]
    mask = torch.arange(length)[None, :] < lengths[:, None]  # (rows, length)
    gid = torch.arange(rows) // 2
    adv = torch.randn(rows, generator=g)
    return h, w, y, mask, gid, adv, torch.randn(rows, length, generator=g), lengths


_TWENTY = 20 * V * 4 / 2**20
"""A logits budget of 20 positions: less than the long rows' groups (43 and 26), more than their buffers (2 x H = 16)."""


@pytest.mark.parametrize(("name", "overrides"), CASES, ids=CASE_IDS)
def test_long_completions_in_blocks_of_five_equal_the_reference(name, overrides):
    """Completions of up to 24 positions in blocks of 5 (H = 8), groups of two, a budget of 20 positions: a row-scaled
    objective's units run block by block, scaled (fused/row_scaled > 0), every other one is held or takes two passes;
    all are exact."""
    spec = resolve_objective(name, **overrides)
    h, w, y, mask, gid, adv, noise, _ = _long_rows(zlib.crc32(f"{name}{overrides}".encode()) % 2**16)
    lp, _ = naive_token_logprobs(h, w, y, temperature=0.7)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    fast, slow = _fused(spec, h, w, y, 0.7, kw, chunk_size=5, max_logits_mib=_TWENTY), _reference(spec, h, w, y, 0.7, kw)
    assert (float(fast[1].pop("fused/row_scaled")) > 0) == fused_module.row_scaled(spec)
    truth = _reference(spec, h.double(), w.double(), y, 0.7, _float64(kw))
    _assert_equal(fast, slow, rtol=2e-5, atol=2e-6, truth=truth)


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "vespo", "luspo", "dfpo_min", "dfpo_orth_tr"])
def test_a_long_completion_is_scaled_once_in_blocks_with_one_pass(monkeypatch, name):
    """A completion longer than a block runs block by block, one LM-head forward per position and no block larger than
    chunk_size, even with no logits budget; fused/row_scaled is the share of its tokens, and the result is exact. DFPO's
    groups of two are scaled where the budget holds their two (V, H) buffers and not the group."""
    calls = _head_calls(monkeypatch)
    spec = resolve_objective(name)
    h, w, y, mask, gid, adv, noise, lengths = _long_rows(41)
    lp, _ = naive_token_logprobs(h, w, y, temperature=0.7)
    kw = _inputs(spec, lp, mask, gid, adv, 0.3 * noise)  # some sequences clipped
    budget = 0.0 if fused_module.coupling_unit(spec) == "row" else 2 * H * V * 4 / 2**20  # a group's two buffers only
    fast = _fused(spec, h, w, y, 0.7, kw, chunk_size=5, max_logits_mib=budget)
    assert sum(calls) == int(mask.sum()) and max(calls) <= 5
    long = lengths > 5 if budget == 0 else lengths > 0  # groups: (24, 19) and (3, 23), both longer than a block
    assert float(fast[1].pop("fused/row_scaled")) == pytest.approx(float(lengths[long].sum() / lengths.sum()))
    assert float(fast[1]["fused/two_pass"]) == 0.0
    _assert_equal(fast, _reference(spec, h, w, y, 0.7, kw), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize(
    ("halved", "length", "budget", "expected"),
    [
        (True, 10, 64.0, 0.0), (True, 11, 64.0, 1.0), (True, 7, 64.0, 0.0), (True, 7, 0.0, 1.0),
        (False, 13, 64.0, 0.0), (False, 14, 64.0, 1.0), (False, 7, 0.0, 1.0),
    ],
)  # fmt: skip
def test_a_completion_is_scaled_in_its_blocks_where_it_would_hold_more_than_its_buffer_or_take_two_passes(
    monkeypatch, halved, length, budget, expected
):
    """Blocks of 5, H = 8: a GSPO completion longer than a scaled block + 8 positions is scaled block by block (its (L, V)
    logits would outweigh the (V, H) buffer and a block), in blocks of 2 where the blocks are halved (their logits over
    HALVED_BLOCK_MIB, here 0) and of 5 where not; a shorter one is held in one pass while the logits budget allows,
    and scaled where it does not."""
    monkeypatch.setattr(fused_module, "HALVED_BLOCK_MIB", 0.0 if halved else 64.0)
    calls = _head_calls(monkeypatch)
    h, w, y, _, gid, adv, noise, _ = _long_rows(47, rows=1, length=length)
    mask = torch.ones(1, length, dtype=torch.bool)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(resolve_objective("gspo"), lp, mask, gid, adv, noise)
    fast = _fused("gspo", h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=budget)
    assert float(fast[1]["fused/row_scaled"]) == expected and float(fast[1]["fused/two_pass"]) == 0.0
    block = 2 if halved else 5
    assert calls == ([block] * (length // block) + [length % block] * (length % block > 0) if expected else [length])


@pytest.mark.parametrize(
    ("chunk", "vocab", "itemsize", "block"),
    [(512, 32768, 4, 512), (512, 151936, 4, 256), (1024, 151936, 4, 512), (1024, 32768, 4, 1024), (1024, 32769, 4, 512), (1, 10**9, 4, 1)],
)
def test_a_scaled_block_is_halved_only_where_its_logits_exceed_128_mib(chunk, vocab, itemsize, block):
    """V = 32k at H = 512 (64 MiB) keeps whole blocks, V = 152k (297 MiB) halves them; 128 MiB exactly is kept whole."""
    assert fused_module.scaled_block_size(chunk, vocab, itemsize) == block


_TWELVE = 12 * V * 4 / 2**20
"""A logits budget of 12 positions: one (V, H) buffer (H = 8 positions' worth), not two."""


@pytest.mark.parametrize(("budget", "buffers"), [(64.0, None), (_TWENTY, 2), (_TWELVE, 1), (0.0, 1)])
def test_a_dfpo_group_is_held_where_it_fits_else_scaled_as_far_as_the_budget_holds_buffers(budget, buffers):
    """DFPO's Orth-Proj groups of two (43 and 26 positions, blocks of 5, H = 8): held in one pass within the budget; else
    scaled, each group's first completions as many as the budget holds (V, H) buffers for (at least one), the rest in
    two passes."""
    spec = resolve_objective("dfpo_orth")
    assert not fused_module.group_folded(spec)
    h, w, y, mask, gid, adv, noise, lengths = _long_rows(59)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=budget)
    metrics = {k: float(fast[1].pop(k)) for k in ("fused/row_scaled", "fused/two_pass")}
    per_group = lengths.view(-1, 2).float()  # (groups, 2) completion lengths
    scaled = 0.0 if buffers is None else float(per_group[:, :buffers].sum() / per_group.sum())
    two = 0.0 if buffers is None else 1.0 - scaled
    assert metrics == {"fused/row_scaled": pytest.approx(scaled), "fused/two_pass": pytest.approx(two)}
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("overrides", [{}, {"stopgrad": "score"}, {"length_aware": True}], ids=["ratio", "score", "length_aware"])
@pytest.mark.parametrize(
    ("groups", "budget", "scaled", "slots"),
    [
        ("one of four", 0.0, 1.0, {2}),  # summed in W's gradient itself, beside one completion's buffer
        ("two of two", _TWENTY, 1.0, {2, 3}),  # the second group's sum in a buffer of its own
        ("two of two", _TWELVE, (43 + 3) / 69, {2}),  # no room for it: the second group is buffered, one completion
    ],
)
def test_a_min_replace_group_over_the_budget_is_summed_as_its_completions_come(overrides, groups, budget, scaled, slots):
    """Min-Replace's factors are own x the group's minimum (group_folded): a group over the budget is scaled in one pass
    with its d W in one running sum (rescaled as the minimum falls, sequences clipped on both sides), however many
    completions it has; the result is exact."""
    spec = resolve_objective("dfpo_min", **overrides)
    assert fused_module.group_folded(spec)
    h, w, y, mask, gid, adv, noise, lengths = _long_rows(67)  # lengths 24, 19, 3, 23
    gid = torch.zeros_like(gid) if groups == "one of four" else gid
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    fused_module.release_workspace()
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=budget)
    assert float(fast[1].pop("fused/row_scaled")) == pytest.approx(scaled)
    assert float(fast[1].pop("fused/two_pass")) == pytest.approx(1.0 - scaled)
    assert set(fused_module._WORKSPACE.slots) - {0, 1} == slots
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


def test_a_group_whose_factors_do_not_change_together_runs_again_at_its_coefficients(monkeypatch):
    """Taken for group_folded, Orth-Proj in one group of four fails the common-factor check at its third completion (the
    projection mixes the group's weights): the whole group runs again at its coefficients (fused/two_pass 1), still exact."""
    monkeypatch.setattr(fused_module, "group_folded", lambda spec: True)
    spec = resolve_objective("dfpo_orth")
    h, w, y, mask, gid, adv, noise, _ = _long_rows(71)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, torch.zeros_like(gid), adv, noise)
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=0.0)
    assert float(fast[1].pop("fused/two_pass")) == 1.0 and float(fast[1].pop("fused/row_scaled")) == 0.0
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


def test_the_common_ratio_of_factors():
    """r with now = r before; a factor that was 0 must stay 0; none is r = 1."""
    ratio = fused_module._common_ratio
    assert ratio([], [], 1e-6) == 1.0 and ratio([0.0, 0.0], [0.0, 0.0], 1e-6) == 1.0
    assert ratio([2.0, -1.0, 0.0], [1.0, -0.5, 0.0], 1e-6) == 0.5
    assert ratio([2.0, -1.0], [1.0, -0.4], 1e-6) is None
    assert ratio([2.0, 0.0], [1.0, 0.1], 1e-6) is None


def test_a_group_over_the_budget_with_a_frozen_head_is_scaled_whole_with_no_buffer():
    """With no gradient for W there is no d W to sum apart: a DFPO group over the budget is scaled whole, in one pass, and
    no (V, H) buffer is made."""
    spec = resolve_objective("dfpo_min")
    h, w, y, mask, gid, adv, noise, _ = _long_rows(61)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    fused_module.release_workspace()
    hidden = h.detach().requires_grad_()
    loss, metrics = fused_policy_loss(spec, hidden=hidden, lm_head_weight=w, targets=y, **kw, chunk_size=5, max_logits_mib=0.0)
    (grad,) = torch.autograd.grad(loss, [hidden])
    assert float(metrics["fused/row_scaled"]) == 1.0 and float(metrics["fused/two_pass"]) == 0.0
    assert 2 not in fused_module._WORKSPACE.slots
    loss_ref, _, grad_ref, _ = _reference(spec, h, w, y, 1.0, kw)
    torch.testing.assert_close(loss.detach(), loss_ref, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(grad, grad_ref, rtol=2e-5, atol=2e-6)


def test_a_completion_that_is_not_one_factor_is_done_again_at_its_coefficients(monkeypatch):
    """Taken for row-scaled, GMPO (clipped per token) fails the check on its clipped completions, which run again at their
    true coefficients (counted in fused/two_pass): the result is still exact."""
    monkeypatch.setattr(fused_module, "row_scaled", lambda spec: True)
    spec = resolve_objective("gmpo")
    h, w, y, mask, gid, adv, noise, lengths = _long_rows(43)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, 5 * noise)  # every long completion has a clipped token
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=0.0)
    long_share = float(lengths[lengths > 5].sum() / lengths.sum())
    assert float(fast[1].pop("fused/two_pass")) == pytest.approx(long_share) and float(fast[1]["fused/row_scaled"]) == 0.0
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


def test_a_group_runs_again_only_the_completions_that_are_not_one_factor(monkeypatch):
    """Taken for row-scaled, TOPR in groups of two (A = +1, -1): the A > 0 completion has weight 1 (one factor), the
    A < 0 one sg(clamp(r, 0, 1)) per token (not), so only the latter runs again at its coefficients; still exact."""
    monkeypatch.setattr(fused_module, "row_scaled", lambda spec: True)
    spec = resolve_objective("topr")
    h, w, y, mask, gid, _, noise, lengths = _long_rows(53)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(spec, lp, mask, gid, adv, noise)  # ratios on both sides of 1
    fast = _fused(spec, h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=_TWENTY)
    negative = float(lengths[adv < 0].sum() / lengths.sum())
    assert float(fast[1].pop("fused/two_pass")) == pytest.approx(negative)
    assert float(fast[1].pop("fused/row_scaled")) == pytest.approx(1 - negative)
    _assert_equal(fast, _reference(spec, h, w, y, 1.0, kw), rtol=2e-5, atol=2e-6)


# ----------------------------------------------------------------------------- the chunk plan


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 12), max_size=12),
    chunk=st.integers(1, 10),
    max_unit=st.integers(0, 20),
)
def test_the_chunk_plan_covers_every_position_once_and_never_cuts_a_unit(sizes, chunk, max_unit):
    """The ranges tile the positions in order; a one-pass range holds whole units, at most chunk_size positions unless
    it is one unit of at most max_unit; a unit goes to two passes exactly when it is longer than both."""
    plan = chunk_plan(sizes, chunk, max_unit)
    ends = [0]
    for s in sizes:
        ends.append(ends[-1] + s)
    assert [s for s, _, _ in plan] == [0, *(e for _, e, _ in plan)][: len(plan)] and (plan[-1][1] if plan else 0) == ends[-1]
    bounds = set(ends)
    for start, end, two_pass in plan:
        assert start in bounds and end in bounds  # whole units only
        units = [s for a, s in zip(ends, sizes) if start <= a < end]
        if two_pass:
            assert units == [end - start] and end - start > max(chunk, max_unit)
        else:
            assert end - start <= chunk or (len(units) == 1 and chunk < end - start <= max_unit)


def test_the_plan_of_a_small_batch_is_one_chunk():
    assert chunk_plan([3, 4, 2], 1024, 0) == [(0, 9, False)]
    assert chunk_plan([3, 4, 2], 5, 100) == [(0, 3, False), (3, 7, False), (7, 9, False)]
    assert chunk_plan([3, 8, 2], 5, 7) == [(0, 3, False), (3, 11, True), (11, 13, False)]


@pytest.mark.parametrize(
    ("name", "budget", "expected"), [("dfpo_min", 64.0, 0.0), ("gmpo", 0.0, 26 / 28), ("grpo", 0.0, 0.0), ("stapo", 0.0, 1.0)]
)
def test_the_two_pass_metric_says_which_path_ran(name, budget, expected):
    """fused/two_pass is the share of real tokens whose logits took two passes: token-level objectives never do; where
    the budget holds nothing, a row-coupled one that is not row-scaled (GMPO) does for its completions longer than a
    block (26 of the 28 tokens), a batch-coupled one (STAPO) for all."""
    h, w, y, mask, gid, adv, noise = _batch(29)
    lp, _ = naive_token_logprobs(h, w, y)
    _, metrics = fused_policy_loss(
        name,
        hidden=h.requires_grad_(),
        lm_head_weight=w,
        targets=y,
        **_inputs(resolve_objective(name), lp, mask, gid, adv, noise),
        chunk_size=3,
        max_logits_mib=budget,
    )
    assert float(metrics["fused/two_pass"]) == pytest.approx(expected)


def test_the_head_runs_three_matmuls_in_one_pass_and_four_in_two(monkeypatch):
    """One pass: one LM-head forward per chunk (its two gradient matmuls follow); two passes: two per position."""
    calls = _head_calls(monkeypatch)
    h, w, y, mask, gid, adv, noise = _batch(31)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(resolve_objective("dfpo_min"), lp, mask, gid, adv, noise)
    fused_policy_loss("dfpo_min", hidden=h.requires_grad_(), lm_head_weight=w, targets=y, **kw, chunk_size=3, max_logits_mib=64.0)
    assert sum(calls) == int(mask.sum())
    calls.clear()
    kw_stapo = _inputs(resolve_objective("stapo"), lp, mask, gid, adv, noise)
    fused_policy_loss("stapo", hidden=h, lm_head_weight=w, targets=y, **kw_stapo, chunk_size=3, max_logits_mib=0.0)
    assert sum(calls) == 2 * int(mask.sum())
    calls.clear()
    with torch.no_grad():  # no gradient asked for: the statistics alone
        loss, _ = fused_policy_loss("dfpo_min", hidden=h, lm_head_weight=w, targets=y, **kw, chunk_size=3, max_logits_mib=0.0)
    assert sum(calls) == int(mask.sum()) and not loss.requires_grad


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("name", ["grpo", "dapo:entropy_coef=0.01", "dfpo_min", "stapo"])
def test_no_tensor_holds_the_logits_of_more_than_one_chunk(name):
    """Forward and backward allocate at most one (chunk, V) block of logits (two with eager entropy), never (B, T, V)."""
    h, w, y, mask, gid, adv, noise = _batch(37)
    lp, _ = naive_token_logprobs(h, w, y)
    spec = objective_from_label(name)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    h.requires_grad_(), w.requires_grad_()
    with _LargestTensor() as mode:
        loss, _ = fused_policy_loss(spec, hidden=h, lm_head_weight=w, targets=y, **kw, chunk_size=3, max_logits_mib=0.0)
        loss.backward()
    assert mode.largest <= max(3 * V, V * H, B * T * H) < int(mask.sum()) * V


@pytest.mark.parametrize(("hidden_size", "positions"), [(8, 256), (255, 256), (512, 512), (896, 896), (1024, 1024), (4096, 1024)])
def test_the_default_block_is_the_hidden_size_within_its_bounds(hidden_size, positions):
    """chunk_size=None: a block of H positions (as many floats as the weight's gradient), at least 256, at most 1024."""
    assert fused_module.default_chunk_size(hidden_size) == positions


@pytest.mark.parametrize(
    ("hidden_size", "positions"), [(8, 256), (300, 256), (512, 384), (896, 672), (1024, 768), (1365, 1023), (2048, 1024)]
)
def test_a_half_precision_head_off_the_cpu_takes_three_quarters_of_the_hidden_size(hidden_size, positions):
    """Off the CPU in half precision: at most 3/4 of H positions (a float32 block under the weight's float32 gradient,
    so the pass holds less than Liger's bf16 step), within the same bounds, so only H from 342 to 1365 changes."""
    assert fused_module.default_chunk_size(hidden_size, half_precision_off_cpu=True) == positions


def test_only_a_half_precision_weight_off_the_cpu_takes_the_smaller_block():
    assert fused_module._half_precision_off_cpu(torch.empty(4, 2, dtype=torch.bfloat16, device="meta"))
    assert fused_module._half_precision_off_cpu(torch.empty(4, 2, dtype=torch.float16, device="meta"))
    assert not fused_module._half_precision_off_cpu(torch.empty(4, 2, dtype=torch.bfloat16))  # the CPU
    assert not fused_module._half_precision_off_cpu(torch.empty(4, 2, device="meta"))  # float32
    assert not fused_module._half_precision_off_cpu([[0.0, 1.0]])  # not a tensor: check_head_inputs names it


def test_chunk_size_none_asks_for_the_half_precision_block_off_the_cpu(monkeypatch):
    """fused_policy_loss's default block is asked for with the weight's precision and device: a bf16 weight on the
    CPU runs whole blocks of H; the choice itself is the function above."""
    asked = []
    real = fused_module.default_chunk_size
    monkeypatch.setattr(fused_module, "default_chunk_size", lambda h, **kw: asked.append(kw) or real(h, **kw))
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 5, H, generator=g).bfloat16().requires_grad_()
    w = torch.randn(V, H, generator=g).bfloat16().requires_grad_()
    y, mask = torch.randint(0, V, (2, 5), generator=g), torch.ones(2, 5, dtype=torch.bool)
    kw = {"old_logp": torch.full((2, 5), -3.0), "advantages": torch.tensor([1.0, -1.0]), "group_ids": torch.tensor([0, 0])}
    fused_policy_loss("grpo", hidden=h, lm_head_weight=w, targets=y, mask=mask, **kw)
    assert asked == [{"half_precision_off_cpu": False}]


def test_chunk_size_none_runs_the_default_block(monkeypatch):
    """The default block is what runs: a batch of 600 positions at H = 8 takes blocks of 256, 256 and 88 positions."""
    seen = _head_calls(monkeypatch)
    g = torch.Generator().manual_seed(3)
    h, w = torch.randn(4, 150, H, generator=g, requires_grad=True), torch.randn(V, H, generator=g, requires_grad=True)
    y, mask = torch.randint(0, V, (4, 150), generator=g), torch.ones(4, 150, dtype=torch.bool)
    old = torch.full((4, 150), -float(torch.log(torch.tensor(V))))
    fused_policy_loss(
        "grpo",
        hidden=h,
        lm_head_weight=w,
        targets=y,
        old_logp=old,
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
        mask=mask,
        group_ids=torch.tensor([0, 0, 1, 1]),
    )
    assert seen == [256, 256, 88]


class _HiddenSized(TorchDispatchMode):
    """The storages of the tensors ops return with as many elements as the real positions' or all positions' hidden
    states (N H or B T H)."""

    def __init__(self, sizes: set[int]):
        super().__init__()
        self.sizes, self.storages = sizes, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.numel() in self.sizes:
                self.storages.add(t.untyped_storage().data_ptr())
        return out


@pytest.mark.parametrize("name", ["grpo", "gspo", "dfpo_min"])
@pytest.mark.parametrize("padded", [False, True], ids=["every position real", "padded"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "a slice of (B, T + 2, H)"])
def test_the_only_hidden_sized_tensor_made_is_the_hidden_gradient(name, padded, strided):
    """Chunks read the hidden states in place or gather their own rows: no (N, H) copy, no second (N, H) gradient;
    the trainer's hidden states (a slice of the decoder's output) get the reference's gradient."""
    h, w, y, mask, gid, adv, noise = _batch(41)
    mask = mask if padded else torch.ones_like(mask)
    lp, _ = naive_token_logprobs(h, w, y)
    spec = objective_from_label(name)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    leaf = torch.cat([torch.zeros(B, 1, H), h, torch.zeros(B, 1, H)], 1) if strided else h  # (B, T + 2, H) or (B, T, H)
    leaf.requires_grad_(), w.requires_grad_()
    hidden = leaf[:, 1 : T + 1] if strided else leaf  # (B, T, H), not contiguous when strided
    with _HiddenSized({int(mask.sum()) * H, B * T * H}) as mode:
        loss, _ = fused_policy_loss(spec, hidden=hidden, lm_head_weight=w, targets=y, **kw, chunk_size=3, max_logits_mib=0.0)
        loss.backward()
    grad = leaf.grad[:, 1 : T + 1] if strided else leaf.grad  # (B, T, H)
    made = mode.storages - {leaf.untyped_storage().data_ptr()}  # views of the input aside
    assert len(made) == 1 and (strided or made == {grad.untyped_storage().data_ptr()})
    torch.testing.assert_close(grad, _reference(spec, h, w, y, 1.0, kw)[2], rtol=2e-5, atol=2e-6)


# ----------------------------------------------------------------------------- the backward


def test_the_backward_scales_by_the_upstream_gradient_and_runs_once():
    """(loss * 3).backward() gives three times the gradients; a second backward is refused in one sentence."""
    h, w, y, mask, gid, adv, noise = _batch(41)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(resolve_objective("grpo"), lp, mask, gid, adv, noise)
    _, _, gh, gw = _fused("grpo", h, w, y, 1.0, kw)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss, _ = fused_policy_loss("grpo", hidden=hh, lm_head_weight=ww, targets=y, **kw)
    (loss * 3).backward(retain_graph=True)
    torch.testing.assert_close(hh.grad, 3 * gh)
    torch.testing.assert_close(ww.grad, 3 * gw)
    with pytest.raises(RuntimeError, match="handed on once"):
        loss.backward()


def test_a_frozen_head_gets_no_gradient_and_a_frozen_input_none():
    """Only what requires a gradient gets one (a frozen LM head: d hidden only)."""
    h, w, y, mask, gid, adv, noise = _batch(43)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(resolve_objective("gspo"), lp, mask, gid, adv, noise)
    hh = h.clone().requires_grad_()
    loss, _ = fused_policy_loss("gspo", hidden=hh, lm_head_weight=w, targets=y, **kw)
    loss.backward()
    assert w.grad is None and hh.grad is not None
    torch.testing.assert_close(hh.grad, _reference(resolve_objective("gspo"), h, w, y, 1.0, kw)[2], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["grpo", "dapo:entropy_coef=0.01"])
def test_targets_far_in_the_tail_get_their_exact_log_probs_and_gradients(name):
    """Logits spread over hundreds of nats (targets' p underflowing float32): log-probs, loss and gradients still equal
    the reference, the eager kernel taking z_y - logsumexp where log p_y would lose digits."""
    h, w, y, mask, gid, adv, noise = _batch(59)
    w = w * 60.0  # logits of order +-100: most targets' log-probs lie far below -64, some below float32's normal p
    y = torch.where(torch.arange(T) % 2 == 0, (h @ w.T).argmax(-1), y)  # (B, T) every other target the likeliest
    lp, _ = naive_token_logprobs(h, w, y)
    assert float(lp[mask].min()) < -120 and float(lp[mask].max()) > -64  # both branches of the kernel run
    spec = objective_from_label(name)
    kw = _inputs(spec, lp, mask, gid, adv, noise)
    out = fused_head_loss(spec, hidden=h, lm_head_weight=w, targets=y, **kw, chunk_size=5)
    torch.testing.assert_close(out.logp, torch.where(mask, lp, 0.0), rtol=1e-6, atol=1e-4)
    _assert_equal(_fused(spec, h, w, y, 1.0, kw, chunk_size=5), _reference(spec, h, w, y, 1.0, kw), rtol=1e-4, atol=1e-5)


def test_the_cpu_logits_block_is_reused_by_the_next_call_and_released_on_request():
    """The second call writes into the first call's (chunk, V) block (no fresh pages to fault in); a smaller call
    takes a view of it; release_workspace frees it, and the numbers never change."""
    h, w, y, mask, gid, adv, noise = _batch(61)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(resolve_objective("grpo"), lp, mask, gid, adv, noise)
    fused_module.release_workspace()
    first = _fused("grpo", h, w, y, 1.0, kw, chunk_size=7)
    block = fused_module._WORKSPACE.slots[0]
    assert block is not None and block.numel() == 7 * V
    second = _fused("grpo", h, w, y, 1.0, kw, chunk_size=3)
    assert fused_module._WORKSPACE.slots[0] is block
    fused_module.release_workspace()
    assert fused_module._WORKSPACE.slots is None
    third = _fused("grpo", h, w, y, 1.0, kw, chunk_size=7)
    for a, b in ((first, second), (first, third)):
        _assert_equal(a, b, rtol=1e-6, atol=1e-7)


def test_a_scaled_units_buffers_are_kept_like_the_logits_block():
    """DFPO's groups of two, scaled: one (V, H) buffer per completion, kept for the next call and reused by it."""
    h, w, y, mask, gid, adv, noise, _ = _long_rows(67)
    lp, _ = naive_token_logprobs(h, w, y)
    kw = _inputs(resolve_objective("dfpo_min"), lp, mask, gid, adv, noise)
    fused_module.release_workspace()
    first = _fused("dfpo_min", h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=_TWENTY)
    buffers = [fused_module._WORKSPACE.slots[slot] for slot in (2, 3)]
    assert [b.numel() for b in buffers] == [V * H] * 2 and 4 not in fused_module._WORKSPACE.slots
    second = _fused("dfpo_min", h, w, y, 1.0, kw, chunk_size=5, max_logits_mib=_TWENTY)
    assert all(fused_module._WORKSPACE.slots[slot] is b for slot, b in zip((2, 3), buffers))
    assert float(first[1]["fused/row_scaled"]) == 1.0
    _assert_equal(first, second, rtol=0, atol=0)


def test_the_public_name_is_the_core_function():
    assert dfpo.fused_policy_loss is fused_policy_loss


# ----------------------------------------------------------------------------- bad input


def _refused_before_the_head(monkeypatch, match: str, **changes) -> None:
    monkeypatch.setattr(fused_module, "head_logits", lambda *a, **k: pytest.fail("the LM head ran before the input was checked"))
    h, w, y, mask, gid, adv, noise = _batch(47)
    kw = dict(hidden=h, lm_head_weight=w, targets=y, old_logp=noise - 3, advantages=adv, mask=mask, group_ids=gid)
    objective = changes.pop("objective", "grpo")
    kw.update(changes)
    with pytest.raises(ValueError, match=match):
        fused_policy_loss(objective, **kw)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(targets=torch.zeros(B, T + 1, dtype=torch.long)), "targets must have shape"),
        (dict(lm_head_weight=torch.zeros(V, H + 1)), "lm_head_weight must have shape"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(chunk_size=0), "chunk_size must be a positive int"),
        (dict(max_logits_mib=-1.0), "max_logits_mib must be a number >= 0"),
        (dict(solve_once="yes"), "solve_once must be True, False or None \\(by device\\), got solve_once='yes'"),
        (dict(targets=torch.full((B, T), V)), "targets must lie in"),
        (dict(old_logp=torch.zeros(B, T + 1)), "old_logp must have shape"),
        (dict(advantages=torch.zeros(B + 1)), "advantages must have shape"),
        (dict(advantages=torch.full((B,), float("nan"))), "advantages must be finite"),
        (dict(old_logp=torch.full((B, T), float("nan"))), "old_logp holds non-finite values"),
        (dict(objective=resolve_objective("grpo", beta=0.1)), "ref_logp is required"),
        (dict(objective="no_such_objective"), "no_such_objective"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_input_is_refused_in_one_sentence_before_the_lm_head_runs(monkeypatch, changes, match):
    _refused_before_the_head(monkeypatch, match, **changes)


def test_non_finite_log_probs_are_refused_and_reported_without_nan_in_the_gradients():
    """NaN hidden states at a real position: fused_policy_loss raises one sentence; fused_head_loss says finite=False
    with a NaN loss and zero gradients (the trainer skips the step)."""
    h, w, y, mask, gid, adv, noise = _batch(53)
    h[0, 0] = float("nan")
    kw = dict(old_logp=noise - 3, advantages=adv, mask=mask, group_ids=gid)
    with pytest.raises(ValueError, match="non-finite log-probs at real"):
        fused_policy_loss("gspo", hidden=h, lm_head_weight=w, targets=y, **kw)
    hh = h.clone().requires_grad_()
    out = fused_head_loss("gspo", hidden=hh, lm_head_weight=w, targets=y, **kw, chunk_size=3)
    assert not out.finite and torch.isnan(out.loss) and out.metrics["fused/two_pass"] == 0
    out.loss.backward()
    assert bool(torch.isfinite(hh.grad).all()) and float(hh.grad.abs().sum()) == 0.0
