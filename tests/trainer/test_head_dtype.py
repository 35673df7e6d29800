"""The LM head under autocast (``optim.head_dtype``): with "autocast" its matmuls (the logits, and the backward's
dz W and dz^T h) run in the autocast dtype with float32 statistics and a float32 gradient for the float32 master
weight; with "float32", or without autocast, in the weight's dtype, bit for bit as before. On the CPU, whose
autocast runs bf16: the dtypes of the matmuls are recorded by a ``TorchDispatchMode`` (``MatmulDtypes``), and the
head's are those with V in a shape."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from dfpo import resolve_objective
from dfpo.core.fused import fused_head_loss
from dfpo.core.logprobs import token_logprobs
from dfpo.trainer import forward
from dfpo.trainer.config import ModelConfig
from dfpo.trainer.minibatches import micro_batch
from dfpo.trainer.parallel import OneProcess
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.sampler import build_batch
from dfpo.trainer.stages.old_logp import FirstPass, OldLogpStage, batch_logp
from dfpo.trainer.stages.update import accumulate_gradients

pytestmark = pytest.mark.usefixtures("one_thread")

aten = torch.ops.aten
U = 2.0**-8
"""bf16's unit round-off: 8 significand bits (7 stored), round to nearest."""

# (op, index of the first matrix operand): mm(a, b); addmm(bias, a, b); baddbmm(bias, a, b)
_OPERANDS = {aten.mm: 0, aten.bmm: 0, aten.matmul: 0, aten.addmm: 1, aten.addmm_: 1, aten.baddbmm: 1}


class MatmulDtypes(TorchDispatchMode):
    """Records the two matrix operands' dtypes and shapes of every matmul dispatched (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[tuple[torch.dtype, torch.dtype], tuple[tuple[int, ...], tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = _OPERANDS.get(func.overloadpacket)
        if first is not None:
            a, b = args[first], args[first + 1]
            self.seen.append(((a.dtype, b.dtype), (tuple(a.shape), tuple(b.shape))))
        return func(*args, **(kwargs or {}))

    def head(self, vocab: int) -> list[tuple[torch.dtype, torch.dtype]]:
        """The operand dtypes of the head's matmuls: those with ``vocab`` in an operand's shape."""
        return [dtypes for dtypes, shapes in self.seen if any(vocab in shape for shape in shapes)]


def _logit_scale(hidden: Tensor, weight: Tensor) -> Tensor:
    """A_n = max_v sum_i |h_ni W_vi| (N,): the size of the sums each logit z_nv = sum_i h_ni W_vi adds up."""
    return (hidden.abs().double() @ weight.abs().double().T).amax(-1)


def logp_bound(hidden: Tensor, weight: Tensor) -> Tensor:
    """(N,) how far a bf16 head's log-prob may lie from the float32 head's. Each bf16 logit rounds its two inputs and
    its output once (float32 accumulation): |dz_v| <= 3u(1 + u)^2 A plus float32 accumulation H 2^-24 A on either
    side; log p_y = z_y - logsumexp(z) moves by at most |dz_y| + max_v |dz_v|; 1e-5 for float32's own logsumexp."""
    H = hidden.shape[-1]
    return 2 * (3 * U * (1 + U) ** 2 + 2 * H * 2.0**-24) * _logit_scale(hidden, weight) + 1e-5


# ---------------------------------------------------------------------------------------------------------- the core


def _head(N=40, H=16, V=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g) / math.sqrt(H) * 3  # logits of a few units: a softmax far from uniform
    w = torch.randn(V, H, generator=g)
    y = torch.randint(0, V, (N,), generator=g)
    return h.requires_grad_(), w.requires_grad_(), y


@pytest.mark.parametrize("matmul_dtype", [torch.bfloat16, None], ids=["bf16", "weight's dtype"])
def test_token_logprobs_runs_each_head_matmul_in_matmul_dtype_and_gives_float32_gradients(matmul_dtype):
    h, w, y = _head()
    with MatmulDtypes() as seen:
        logp, ent = token_logprobs(h, w, y, chunk_size=16, matmul_dtype=matmul_dtype)
        (logp.sum() + 0.1 * ent.sum()).backward()
    expected = matmul_dtype or torch.float32
    # per chunk of 16 (3 chunks): the forward's logits, the backward's logits again, dz W and dz^T h
    assert seen.head(96) == [(expected, expected)] * 12
    assert logp.dtype == ent.dtype == torch.float32  # the statistics in float32
    assert w.grad.dtype == h.grad.dtype == torch.float32


def test_an_ambient_autocast_does_not_change_the_heads_dtypes_between_forward_and_backward():
    h, w, y = _head()
    with MatmulDtypes() as seen, torch.autocast("cpu", torch.bfloat16):
        logp, _ = token_logprobs(h, w, y, chunk_size=64, with_entropy=False)
        logp.sum().backward()
    assert seen.head(96) == [(torch.float32, torch.float32)] * 4  # matmul_dtype None: the weight's, forward and backward
    plain = _head()
    expected, _ = token_logprobs(*plain, chunk_size=64, with_entropy=False)
    expected.sum().backward()
    assert torch.equal(logp, expected) and torch.equal(w.grad, plain[1].grad)


def test_a_bf16_head_agrees_with_the_float32_head_within_bf16_round_off():
    h, w, y = _head()
    lp16, ent16 = token_logprobs(h, w, y, matmul_dtype=torch.bfloat16)
    (lp16.sum() + ent16.sum()).backward()
    g16 = w.grad.clone()
    w.grad = None
    lp32, ent32 = token_logprobs(h, w, y)
    (lp32.sum() + ent32.sum()).backward()
    assert ((lp16 - lp32).abs() <= logp_bound(h.detach(), w.detach())).all()
    assert not torch.equal(lp16, lp32)  # it did run in bf16
    # entropy and W's gradient: bf16 round-off of the logits (3u A, A about 2-3 here) moves p by a few per cent
    assert (ent16 - ent32).abs().max() <= 0.1 * ent32.abs().max()
    assert (g16 - w.grad).norm() <= 0.1 * w.grad.norm()


@given(seed=st.integers(0, 2**16), H=st.sampled_from([8, 32, 128]), scale=st.floats(0.1, 8.0))
def test_property_bf16_log_probs_lie_within_the_round_off_bound_of_the_float32_ones(seed, H, scale):
    """Each position's bf16-head log-prob is within 2 * 3u * max_v sum_i |h_i W_vi| (u = 2^-8) of the float32 head's."""
    g = torch.Generator().manual_seed(seed)
    h, w = torch.randn(12, H, generator=g) * scale / math.sqrt(H), torch.randn(50, H, generator=g)
    y = torch.randint(0, 50, (12,), generator=g)
    lp16, _ = token_logprobs(h, w, y, with_entropy=False, matmul_dtype=torch.bfloat16)
    lp32, _ = token_logprobs(h, w, y, with_entropy=False)
    assert ((lp16 - lp32).abs() <= logp_bound(h, w)).all()


def _fused(h, w, y, matmul_dtype, objective="grpo", **kw):
    B = 4
    T = h.shape[0] // B
    g = torch.Generator().manual_seed(3)
    out = fused_head_loss(
        objective,
        hidden=h.view(B, T, -1),
        lm_head_weight=w,
        targets=y.view(B, T),
        old_logp=-4.0 + 0.5 * torch.randn(B, T, generator=g),
        advantages=torch.randn(B, generator=g),
        mask=torch.ones(B, T, dtype=torch.bool),
        group_ids=torch.tensor([0, 0, 1, 1]),
        matmul_dtype=matmul_dtype,
        **kw,
    )
    out.loss.backward()
    return out


@pytest.mark.parametrize("solve_once", [False, True], ids=["a solve per chunk", "one solve"])
@pytest.mark.parametrize("objective", ["grpo", "dapo"])  # dapo: an entropy term in d loss / d z
def test_the_fused_head_runs_its_three_matmuls_in_bf16_and_agrees_with_float32(objective, solve_once):
    over = {"entropy_coef": 0.01} if objective == "dapo" else {}
    h, w, y = _head()
    with MatmulDtypes() as seen:
        out16 = _fused(h, w, y, torch.bfloat16, objective, solve_once=solve_once, **over)
    heads = seen.head(96)
    assert heads and set(heads) == {(torch.bfloat16, torch.bfloat16)}
    assert len(heads) == (4 if solve_once else 3)  # logits (twice in two passes), dz W, dz^T h
    assert w.grad.dtype == h.grad.dtype == torch.float32 and out16.logp.dtype == torch.float32
    g16, gh16 = w.grad.clone(), h.grad.clone()
    w.grad = h.grad = None
    with MatmulDtypes() as seen:
        out32 = _fused(h, w, y, None, objective, solve_once=solve_once, **over)
    assert set(seen.head(96)) == {(torch.float32, torch.float32)}
    assert ((out16.logp - out32.logp).abs().flatten() <= logp_bound(h.detach(), w.detach())).all()
    assert abs(float(out16.loss.detach() - out32.loss.detach())) <= 0.05 * abs(float(out32.loss.detach())) + 1e-3
    assert (g16 - w.grad).norm() <= 0.1 * w.grad.norm() and (gh16 - h.grad).norm() <= 0.1 * h.grad.norm()


@pytest.mark.parametrize("objective", ["gspo", "dfpo_min"])
@pytest.mark.parametrize("max_logits_mib", [2048.0, 0.0], ids=["held", "over the budget"])
def test_row_scaled_and_two_pass_units_run_in_bf16_too(objective, max_logits_mib):
    """Completions longer than a block (blocks of 4 positions) and units over the logits budget
    (two passes; DFPO's Min-Replace groups folded) take the same bf16 matmuls and float32 sums."""
    h, w, y = _head(N=160)  # completions of 40 positions: more than a block (4) + H (16), so scaled once
    with MatmulDtypes() as seen:
        out16 = _fused(h, w, y, torch.bfloat16, objective, chunk_size=4, max_logits_mib=max_logits_mib, solve_once=False)
    assert seen.head(96) and set(seen.head(96)) == {(torch.bfloat16, torch.bfloat16)}
    g16 = w.grad.clone()
    w.grad = h.grad = None
    out32 = _fused(h, w, y, None, objective, chunk_size=4, max_logits_mib=max_logits_mib, solve_once=False)
    scaled = out16.metrics["fused/row_scaled"]
    assert scaled == out32.metrics["fused/row_scaled"]
    assert scaled > 0 or (objective == "dfpo_min" and max_logits_mib > 0)  # a group held in one pass is not scaled
    assert ((out16.logp - out32.logp).abs().flatten() <= logp_bound(h.detach(), w.detach())).all()
    assert w.grad.dtype == torch.float32 and (g16 - w.grad).norm() <= 0.1 * w.grad.norm()


def test_matmul_dtype_of_the_weights_own_dtype_is_todays_head_bit_for_bit():
    h, w, y = _head()
    a = _fused(h, w, y, torch.float32)
    ga = w.grad.clone()
    w.grad = h.grad = None
    b = _fused(h, w, y, None)
    assert torch.equal(a.logp, b.logp) and torch.equal(a.loss, b.loss) and torch.equal(ga, w.grad)


@pytest.mark.parametrize("bad", ["bf16", torch.int64, 2])
def test_a_matmul_dtype_that_is_not_a_floating_dtype_is_refused_in_one_sentence(bad):
    h, w, y = _head()
    with pytest.raises(ValueError, match=r"^matmul_dtype must be None .* got matmul_dtype="):
        token_logprobs(h, w, y, matmul_dtype=bad)
    with pytest.raises(ValueError, match=r"^matmul_dtype must be None .* got matmul_dtype="):
        _fused(h, w, y, bad)


# ------------------------------------------------------------------------------------------------------- the trainer


def test_head_matmul_dtype_is_the_autocast_dtype_only_under_autocast_with_head_dtype_autocast():
    assert forward.head_matmul_dtype(torch.bfloat16, "autocast") is torch.bfloat16
    assert forward.head_matmul_dtype(torch.float16, "autocast") is torch.float16
    assert forward.head_matmul_dtype(torch.bfloat16, "float32") is None
    assert forward.head_matmul_dtype(None, "autocast") is None and forward.head_matmul_dtype(None, "float32") is None
    with pytest.raises(ValueError, match=r"^head_dtype must be one of autocast, float32, got head_dtype='bf16'$"):
        forward.head_matmul_dtype(torch.bfloat16, "bf16")


def _setup():
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=16, tiny_layers=1, tiny_heads=2, tiny_intermediate=48), tok, seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [tok(f"{i * 37}+{i}=", add_special_tokens=False).input_ids for i in range(2)]
    completions = [torch.randint(3, 60, (6,), generator=g).tolist() for _ in range(8)]  # 48 positions >= H: one block
    batch = build_batch(prompts, completions, 4, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=6)
    return model, batch, len(tok)


def _update(model, batch, amp, fused_head, head_dtype):
    """One micro-batch's forward and backward through the update (old log-probs given), its head's matmul dtypes."""
    B, T = batch.mask.shape
    old = -4.0 + 0.3 * torch.randn(B, T, generator=torch.Generator().manual_seed(1))
    adv = torch.randn(B, generator=torch.Generator().manual_seed(2))
    micro = micro_batch(batch, torch.arange(B), old, None, adv, 1.0)
    model.zero_grad(set_to_none=True)
    with MatmulDtypes() as seen:
        _, finite = accumulate_gradients(
            model, [micro], resolve_objective("grpo"), torch.device("cpu"), amp_dtype=amp, fused_head=fused_head, head_dtype=head_dtype
        )
    assert finite
    return seen


@pytest.mark.parametrize("fused_head", ["eager", "off"])
@pytest.mark.parametrize("head_dtype, expected", [("autocast", torch.bfloat16), ("float32", torch.float32)])
def test_the_updates_head_under_bf16_autocast_runs_in_the_head_dtype_and_the_master_weight_gets_a_float32_gradient(
    fused_head, head_dtype, expected
):
    model, batch, V = _setup()
    seen = _update(model, batch, torch.bfloat16, fused_head, head_dtype)
    heads = seen.head(V)
    # eager: logits, dz W, dz^T h; off: the backward also makes the logits again
    assert heads == [(expected, expected)] * (3 if fused_head == "eager" else 4)
    weight = forward.plain_lm_head(model)
    assert weight.dtype == weight.grad.dtype == torch.float32 and bool(torch.isfinite(weight.grad).all())
    # the decoder ran under autocast, whatever head_dtype; left out: RoPE's outer product of frequencies and positions
    # (inner dimension 1), which transformers 5.17 computes as a float32 matmul with autocast off (5.25: no matmul)
    decoder = [dtypes for dtypes, (a, b) in seen.seen if V not in a + b and a[-1] > 1]
    assert set(decoder) == {(torch.bfloat16, torch.bfloat16)}


def test_the_old_and_reference_log_prob_passes_follow_head_dtype():
    model, batch, V = _setup()
    for head_dtype, expected in [("autocast", torch.bfloat16), ("float32", torch.float32)]:
        with MatmulDtypes() as seen:
            batch_logp(model, batch, "cpu", 4, torch.bfloat16, head_dtype)
        assert seen.head(V) == [(expected, expected)] * 2  # two chunks of 4 rows
        stage = OldLogpStage(
            model, None, resolve_objective("grpo"), OneProcess(), device=torch.device("cpu"), amp=torch.bfloat16,
            from_sampler=False, rows_per_forward=8, head_dtype=head_dtype,
        )  # fmt: skip
        with MatmulDtypes() as seen:
            stage.recompute(batch, FirstPass.empty(batch.mask), torch.ones(batch.mask.shape[0], dtype=torch.bool))
            stage.token_baseline_inputs(batch)
        assert seen.head(V)[:2] == [(expected, expected)] * 2  # (vocab_stats' no-grad diagnostics pass follows in float32)


def test_bf16_head_log_probs_lie_within_the_round_off_bound_of_the_float32_heads_under_autocast():
    model, batch, _ = _setup()
    bf16 = forward.completion_logprobs(model, batch, "cpu", torch.bfloat16, head_dtype="autocast", keep_hidden=True)
    fp32 = forward.completion_logprobs(model, batch, "cpu", torch.bfloat16, head_dtype="float32")
    real = batch.mask
    hidden = bf16.kept[real].float()  # (N, H) the same decoder output for both (one autocast)
    bound = logp_bound(hidden, forward.plain_lm_head(model).detach())
    assert ((bf16.logp[real] - fp32.logp[real]).abs() <= bound).all()
    assert not torch.equal(bf16.logp, fp32.logp)


@pytest.mark.parametrize("fused_head", ["eager", "off"])
def test_without_autocast_head_dtype_changes_nothing_bit_for_bit(fused_head):
    model, batch, V = _setup()
    grads, seen = {}, {}
    for head_dtype in ("autocast", "float32"):
        seen[head_dtype] = _update(model, batch, None, fused_head, head_dtype).head(V)
        grads[head_dtype] = [p.grad.clone() for p in model.parameters()]
    assert set(seen["autocast"]) == {(torch.float32, torch.float32)} and seen["autocast"] == seen["float32"]
    assert all(torch.equal(a, b) for a, b in zip(grads["autocast"], grads["float32"]))
    # and the log-probs are today's: the weight's dtype, token_logprobs on the real positions
    scores = forward.completion_logprobs(model, batch, "cpu", None, head_dtype="autocast", keep_hidden=True)
    w = forward.plain_lm_head(model)
    today, _ = token_logprobs(scores.kept[batch.mask], w, batch.completion_ids[batch.mask])
    assert torch.equal(scores.logp[batch.mask], today)
