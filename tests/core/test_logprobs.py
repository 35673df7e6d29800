"""``token_logprobs``: chunked log-probs and entropy from hidden states equal the full-logits path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core.logprobs import naive_token_logprobs, token_logprobs

CASES = dict(
    seed=st.integers(0, 2**16),
    lead=st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple),
    hidden=st.integers(1, 9),
    vocab=st.integers(1, 13),
    temperature=st.floats(0.25, 3.0),
    chunk=st.integers(1, 7),
)
"""Shapes (any leading dims, empty ones included), temperature and chunk size of one property example."""


def _case(seed: int, lead: tuple[int, ...], hidden: int, vocab: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, hidden, generator=g, dtype=dtype).requires_grad_()
    w = torch.randn(vocab, hidden, generator=g, dtype=dtype).requires_grad_()
    t = torch.randint(0, vocab, lead, generator=g)
    return h, w, t


def _grads(fn, h, w, t, g_logp, g_ent, **kw):
    logp, ent = fn(h, w, t, **kw)
    (logp * g_logp + ent * g_ent).sum().backward()
    out = logp.detach(), ent.detach(), h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    return out


@settings(max_examples=40, deadline=None)
@given(**CASES)
def test_chunked_logprobs_entropy_and_gradients_equal_the_full_logits_path(seed, lead, hidden, vocab, temperature, chunk):
    """For any shapes, temperature and chunk size, values and both gradients match log_softmax of the full logits."""
    h, w, t = _case(seed, lead, hidden, vocab, torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    g_logp, g_ent = torch.randn(lead, generator=g, dtype=torch.float64), torch.randn(lead, generator=g, dtype=torch.float64)
    fast = _grads(lambda *a, **k: token_logprobs(*a, chunk_size=chunk, **k), h, w, t, g_logp, g_ent, temperature=temperature)
    slow = _grads(naive_token_logprobs, h, w, t, g_logp, g_ent, temperature=temperature)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@settings(max_examples=40, deadline=None)
@given(**CASES)
def test_log_prob_gradients_without_entropy_equal_the_full_logits_path(seed, lead, hidden, vocab, temperature, chunk):
    """The backward that folds sign(g) out of the (n, V) pass gives the full-logits gradient, for upstream
    gradients of either sign and exactly zero."""
    h, w, t = _case(seed, lead, hidden, vocab, torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    g_logp = torch.randn(lead, generator=g, dtype=torch.float64)  # (...)
    g_logp = torch.where(torch.rand(lead, generator=g) < 0.25, 0.0, g_logp)  # some positions get no gradient

    def logp_only(fn, **kw):
        logp = fn(h, w, t, temperature=temperature, **kw)[0]
        (logp * g_logp).sum().backward()
        out = logp.detach(), h.grad.clone(), w.grad.clone()
        h.grad = w.grad = None
        return out

    fast = logp_only(token_logprobs, chunk_size=chunk, with_entropy=False)
    slow = logp_only(naive_token_logprobs)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("with_entropy", [True, False])
def test_on_cuda_chunked_logprobs_and_gradients_equal_the_full_logits_path(with_entropy):
    """On a CUDA device, in float64: log-probs and both gradients match log_softmax of the full logits to round-off."""
    h, w, t = (x.detach().cuda() for x in _case(3, (4, 9), 16, 300, torch.float64))
    h, w = h.requires_grad_(), w.requires_grad_()
    g_logp, g_ent = torch.randn(2, 4, 9, dtype=torch.float64, device="cuda")

    def run(fn, **kw):
        logp, ent = fn(h, w, t, temperature=0.8, **kw)
        ((logp * g_logp).sum() + ((ent * g_ent).sum() if with_entropy else 0)).backward()
        out = logp.detach(), h.grad.clone(), w.grad.clone()
        h.grad = w.grad = None
        return out

    fast, slow = run(token_logprobs, chunk_size=7, with_entropy=with_entropy), run(naive_token_logprobs)
    assert all(x.is_cuda for x in fast)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_float32_and_bf16_inputs_give_float32_results_close_to_the_reference():
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        h, w, t = _case(0, (4, 6), 16, 50, dtype)
        logp, ent = token_logprobs(h, w, t, chunk_size=5)
        ref_logp, ref_ent = naive_token_logprobs(h.double(), w.double(), t)
        assert logp.dtype == ent.dtype == torch.float32
        torch.testing.assert_close(logp.double(), ref_logp, rtol=tol, atol=tol)
        torch.testing.assert_close(ent.double(), ref_ent, rtol=tol, atol=tol)


def test_hand_computed_two_token_vocabulary():
    """h = 1, W = [[0], [ln 3]]: p = (1/4, 3/4), so logp(y=1) = ln(3/4), H = ln 4 - (3/4) ln 3."""
    import math

    h = torch.ones(1, 1, dtype=torch.float64)
    w = torch.tensor([[0.0], [math.log(3.0)]], dtype=torch.float64)
    logp, ent = token_logprobs(h, w, torch.tensor([1]))
    assert logp.item() == pytest.approx(math.log(0.75))
    assert ent.item() == pytest.approx(math.log(4.0) - 0.75 * math.log(3.0))


def test_without_entropy_only_log_probs_come_back_and_a_frozen_head_gets_no_gradient():
    h, w, t = _case(3, (2, 3), 4, 7, torch.float64)
    w.requires_grad_(False)
    logp, ent = token_logprobs(h, w, t, with_entropy=False)
    assert ent is None
    logp.sum().backward()
    ref, _ = naive_token_logprobs(h.detach().requires_grad_(), w, t)
    assert h.grad is not None and w.grad is None
    torch.testing.assert_close(logp.detach(), ref.detach())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": 0.0}, "temperature=0.0"),
        ({"chunk_size": 0}, "chunk_size=0"),
        ({"targets": torch.tensor([[0, 9]])}, r"targets must lie in \[0, 7\)"),
        ({"targets": torch.tensor([0, 1])}, "targets.shape=(2,)"),
        ({"lm_head_weight": torch.zeros(7, 3)}, r"lm_head_weight.shape=\(7, 3\)"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(kwargs, message):
    args = {"hidden": torch.zeros(1, 2, 4), "lm_head_weight": torch.zeros(7, 4), "targets": torch.zeros(1, 2, dtype=torch.long)}
    args.update({k: v for k, v in kwargs.items() if k in args})
    options = {k: v for k, v in kwargs.items() if k not in args}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)") if "\\" not in message else message):
        token_logprobs(args["hidden"], args["lm_head_weight"], args["targets"], **options)
