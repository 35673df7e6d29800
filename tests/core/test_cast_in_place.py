"""A float32 block cast to and from half precision inside its own bytes gives exactly what ``.to`` gives, and a
half-precision LM head's fused pass makes no second (n, V) block and no (V, H) half-precision temporary."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from dfpo.core.cast_in_place import TAIL, CastsOf, castable_in_place, free_half, half_rows, narrow_, widen_
from dfpo.core.fused import fused_head_loss
from dfpo.core.logprobs import head_logits

HALF = st.sampled_from([torch.bfloat16, torch.float16])
SHAPE = {"n": st.integers(1, 3 * TAIL + 5), "V": st.integers(1, 37)}


@settings(max_examples=60, deadline=None)
@given(dtype=HALF, seed=st.integers(0, 2**16), **SHAPE)
def test_narrowing_in_place_equals_to_and_leaves_the_upper_half_free(dtype, seed, n, V):
    """Narrowed in place, every row equals .to(dtype) of the float32 row it came from, whatever n and V."""
    block = torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 50
    expected = block.to(dtype)
    out = narrow_(block, dtype)
    assert out.dtype == dtype and out.shape == (n, V) and out.data_ptr() == block.data_ptr()
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))  # bit for bit
    free_half(block, dtype).fill_(7)  # the scratch after it does not touch the narrowed rows
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))


@settings(max_examples=60, deadline=None)
@given(dtype=HALF, seed=st.integers(0, 2**16), **SHAPE)
def test_widening_in_place_equals_to_float32(dtype, seed, n, V):
    """Half-precision rows in the upper half of a float32 block, widened in place, equal .float() of those rows."""
    values = (torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 50).to(dtype)
    block = torch.full((n, V), float("nan"))
    half_rows(block, dtype, upper=True).copy_(values)
    assert widen_(block, dtype) is block
    assert torch.equal(block, values.float())


def test_only_a_contiguous_float32_block_and_a_two_byte_dtype_are_cast_in_place():
    block = torch.zeros(4, 6)
    assert castable_in_place(block, torch.bfloat16) and castable_in_place(block, torch.float16)
    assert not castable_in_place(block, torch.float32)
    assert not castable_in_place(block[:, :3], torch.bfloat16)  # rows not contiguous
    assert not castable_in_place(block.double(), torch.bfloat16)


@settings(max_examples=30, deadline=None)
@given(dtype=HALF, seed=st.integers(0, 2**16), rows=st.lists(st.integers(1, 2 * TAIL + 3), min_size=1, max_size=6))
def test_casts_kept_for_a_reused_buffer_cast_each_new_block_exactly(dtype, seed, rows):
    """Blocks of a reused float32 buffer (a whole block, then shorter last ones), each widened and narrowed through
    the casts kept for its shape, give what .float() and .to give, bit for bit, whatever came before them."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.empty(max(rows), 5)
    casts_of = CastsOf(dtype)
    for n in rows:
        block = buf[:n]
        casts = casts_of(block)
        assert casts is casts_of(buf[:n])  # made once per block shape
        values = (torch.randn(n, 5, generator=g) * 50).to(dtype)
        casts.upper.copy_(values)
        assert torch.equal(casts.widen_(), values.float())
        expected = block.to(dtype)
        assert torch.equal(casts.narrow_().view(torch.int16), expected.view(torch.int16))


def test_the_head_refuses_casts_made_for_another_block_and_takes_those_of_its_own_in_a_new_view():
    """Casts kept for one block would write another block's logits into its bytes: refused in one sentence naming
    both; a fresh view of the same rows of the same buffer is the same block."""
    h, w = torch.randn(3, 4).bfloat16(), torch.randn(5, 4).bfloat16()
    buf = torch.empty(3, 5)
    casts = CastsOf(torch.bfloat16)(buf[:2])
    with pytest.raises(ValueError, match=r"casts were made for a \(2, 5\) block at 0x[0-9a-f]+ in torch.bfloat16, not for out \(3, 5\)"):
        head_logits(h, w, 1.0, out=buf, casts=casts)
    with pytest.raises(ValueError, match=r"in torch.bfloat16, not for out \(2, 5\) at 0x[0-9a-f]+ in torch.float16"):
        head_logits(h[:2], w.half(), 1.0, out=buf[:2], casts=casts)
    assert torch.equal(head_logits(h[:2], w, 1.0, out=buf[:2], casts=casts), (h[:2] @ w.T).float())
    assert free_half(buf[:2], torch.bfloat16).data_ptr() == casts.free.data_ptr()


def test_no_casts_are_kept_for_a_block_that_cannot_hold_them():
    assert CastsOf(torch.bfloat16)(torch.zeros(4, 6)[:, :3]) is None
    assert CastsOf(torch.float32)(torch.zeros(4, 6)) is None


class _Calls(TorchDispatchMode):
    """Counts the operations dispatched."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _dispatched(dtype: torch.dtype, chunk: int) -> int:
    """Operations one fused GRPO step of 8 x 64 positions dispatches, h and W in ``dtype``, in blocks of ``chunk``."""
    B, T, H, V = 8, 64, 8, 32
    g = torch.Generator().manual_seed(0)
    h = torch.randn(B, T, H, generator=g).to(dtype).requires_grad_()
    w = torch.randn(V, H, generator=g).to(dtype).requires_grad_()
    y = torch.randint(0, V, (B, T), generator=g)
    kw = {"old_logp": torch.full((B, T), -3.0), "advantages": torch.randn(B, generator=g)}
    kw |= {"mask": torch.ones(B, T, dtype=torch.bool), "group_ids": torch.arange(B) // 4}
    fused_head_loss("grpo", hidden=h, lm_head_weight=w, targets=y, chunk_size=chunk, solve_once=True, **kw)
    with _Calls() as calls:
        fused_head_loss("grpo", hidden=h, lm_head_weight=w, targets=y, chunk_size=chunk, solve_once=True, **kw).loss.backward()
    return calls.count


def test_a_half_precision_block_adds_a_few_dozen_operations_not_a_hundred():
    """The casts' row-range views are made once per block shape, so a bf16 head adds under 40 dispatched operations
    per block to a float32 head's step (its five copies a cast, twice widened and once narrowed; about 86 when every
    cast sliced the block afresh): host work that a GPU waits on between a block's kernels."""
    blocks = 8 * 64 // 32
    extra = (_dispatched(torch.bfloat16, 32) - _dispatched(torch.float32, 32)) / blocks
    assert 0 < extra < 40, extra


class _FreshTensors(TorchDispatchMode):
    """Records every tensor an op returns in storage none of its inputs (out= included) holds."""

    def __init__(self):
        super().__init__()
        self.fresh: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        held = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **kwargs)
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() not in held:
                self.fresh.append((t.dtype, tuple(t.shape)))
        return out


@pytest.mark.parametrize("name", ["grpo", "gspo", "stapo"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_head_makes_no_half_precision_block_or_weight_sized_temporary(name, dtype):
    """A half-precision head's fused pass (a token, a row-scaled and a two-pass batch-coupled objective): no fresh
    half-precision tensor of a block's n x V / 2 or the weight's V x H elements (the tail of a cast is a sixteenth of a
    block, d hidden's rows n x H); the casts run in the float32 block."""
    B, T, H, V, chunk = 4, 12, 8, 64, 16
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(B, T, H, generator=g) / H**0.5).to(dtype).requires_grad_()
    w = torch.randn(V, H, generator=g).to(dtype).requires_grad_()
    y = torch.randint(0, V, (B, T), generator=g)
    kw = {
        "old_logp": torch.full((B, T), -3.0),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "mask": torch.ones(B, T, dtype=torch.bool),
        "group_ids": torch.tensor([0, 0, 1, 1]),
    }
    fused_head_loss(name, hidden=h, lm_head_weight=w, targets=y, chunk_size=chunk, **kw)  # warm-up: the kept buffers
    with _FreshTensors() as seen:
        out = fused_head_loss(name, hidden=h, lm_head_weight=w, targets=y, chunk_size=chunk, **kw)
    half = [shape for dt, shape in seen.fresh if dt == dtype]
    assert half, "the dispatch mode saw nothing: the test measures nothing"
    assert max(torch.Size(s).numel() for s in half) < min(V * H, chunk * V // 2), half
    assert torch.isfinite(out.loss) and out.finite


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")])


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize(("name", "chunk"), [("grpo", 8), ("gspo", 8), ("dfpo_min", 8), ("stapo", 8), ("grpo", 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_casting_in_place_changes_no_number(name, chunk, dtype, device, monkeypatch):
    """A half-precision head's loss, log-probs and both gradients are the same bits with the casts in place as with
    ``.to`` copies, where W's gradient is summed in slices of V (blocks of 8 < H = 32) and where it is one product.
    On CUDA a slice's product may take another kernel than the whole one: the gradients agree to half precision."""
    from dfpo.core import cast_in_place, logprobs

    B, T, H, V = 4, 12, 32, 64
    g = torch.Generator().manual_seed(1)
    h = (torch.randn(B, T, H, generator=g) / H**0.5).to(dtype).to(device)
    w = torch.randn(V, H, generator=g).to(dtype).to(device)
    y = torch.randint(0, V, (B, T), generator=g).to(device)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 9:] = False
    kw = {
        "old_logp": torch.randn(B, T, generator=g) - 3.0,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "mask": mask,
        "group_ids": torch.tensor([0, 0, 1, 1]),
    }
    kw = {k: v.to(device) for k, v in kw.items()}

    def run():
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        out = fused_head_loss(name, hidden=hh, lm_head_weight=ww, targets=y, chunk_size=chunk, **kw)
        out.loss.backward()
        return out.loss, out.logp, hh.grad, ww.grad

    in_place = run()
    for module in (cast_in_place, logprobs):  # CastsOf's check and head_logits'
        monkeypatch.setattr(module, "castable_in_place", lambda block, dtype: False)
    copied = run()
    for i, (a, b) in enumerate(zip(in_place, copied)):
        assert a.dtype == b.dtype and a.device == b.device
        if device == "cpu" or i < 2:  # the loss and log-probs: no product of W's gradient in them
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-3)
