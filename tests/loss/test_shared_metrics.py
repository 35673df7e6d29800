"""The paper's run and mechanism metrics (dfpo.trainer.metrics), pinned by hand, and the proof that the
LLM trainer's Energy is the tested function: its bucket sums equal autograd's logit gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfpo.trainer import metrics


def test_jitter2_is_undefined_below_three_points_and_pinned_above():
    """Eq 20 divides by T - 2: None for 0, 1 or 2 points, never 0 ('perfectly smooth')."""
    for curve in ([], [0.3], [0.1, 0.9]):
        assert metrics.jitter2(curve) is None
    assert float(metrics.jitter2([0.0, 1.0, 0.0])) == pytest.approx(2.0)  # |0 - 2 + 0|
    assert float(metrics.jitter2([0.1, 0.4, 0.6, 1.0])) == pytest.approx((abs(0.6 - 0.8 + 0.1) + abs(1.0 - 1.2 + 0.4)) / 2)
    np.testing.assert_allclose(metrics.jitter2(np.array([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])), [2.0, 0.0])


def test_steps_to_threshold_on_arrays_and_on_logged_curves():
    """Eq 19: the first step at or above kappa; arrays are censored at T + 1, logged curves give None."""
    steps, reached = metrics.steps_to(np.array([[0.1, 0.5, 0.9], [0.1, 0.2, 0.3]]), 0.5)
    assert steps.tolist() == [2.0, 4.0] and reached.tolist() == [True, False]
    assert metrics.steps_to_threshold([10, 20, 30], [0.1, None, 0.7], 0.5) == 30
    assert metrics.steps_to_threshold([10, 20], [0.1, float("nan")], 0.05) == 10
    assert metrics.steps_to_threshold([10, 20], [0.1, 0.2], 0.5) is None


def test_frequent_bucket_is_the_most_frequent_types_covering_half_the_occurrences():
    """Tokens (1 1 2 3 | 1 1 2 4): type 1 makes 4 of 8 occurrences, so it alone is 'frequent' at share 0.5."""
    ids = torch.tensor([[1, 1, 2, 3], [1, 1, 2, 4]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    buckets = metrics.frequency_buckets(ids, mask, [0.5], vocab_size=6)
    assert buckets.tolist() == [1, 0, 1, 1, 1, 1]  # unseen types 0 and 5 fall in the last bucket
    norm = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    assert float(metrics.frequent_energy(norm, ids, mask, 6)) == pytest.approx((1 + 2 + 5 + 6) / 36)
    padded = mask.clone()
    padded[1, 2:] = False  # padding is neither counted nor summed
    assert float(metrics.frequent_energy(norm, ids, padded, 6)) == pytest.approx((1 + 2 + 5 + 6) / (36 - 15))
    assert float(metrics.frequent_energy(torch.zeros(2, 4), ids, mask, 6)) == 0.0


def test_trainers_energy_is_the_logit_gradient_norm_autograd_gives():
    """accumulate_gradients' Energy bucket sums equal sum_t |d loss / d logits_t| per bucket, from autograd."""
    from dfpo import resolve_objective
    from dfpo.trainer.llm.config import ModelConfig
    from dfpo.trainer.llm.policy import build_char_tokenizer, build_tiny_model
    from dfpo.trainer.llm.rollout import build_batch, completion_logits, token_logp
    from dfpo.trainer.llm.train import MicroBatch, StepDiagnostics, accumulate_gradients

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    prompt = [tok("3+4=", add_special_tokens=False).input_ids]
    batch = build_batch(
        prompt,
        [[10, 11, 12, 13], [10, 14, 15], [10, 11, 16, 13], [17, 11]],
        4,
        pad_id=tok.pad_token_id,
        eos_ids={tok.eos_token_id},
        max_new_tokens=4,
    )
    spec = resolve_objective("grpo")
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    with torch.no_grad():
        old = token_logp(completion_logits(model, batch, "cpu"), batch.completion_ids) + 0.1 * batch.mask  # off-policy
    buckets = metrics.frequency_buckets(batch.completion_ids, batch.mask, [0.5], len(tok))
    diag = StepDiagnostics()
    accumulate_gradients(model, [MicroBatch(batch, old, None, adv, 1.0)], spec, torch.device("cpu"), buckets=buckets, diagnostics=diag)

    logits = completion_logits(model, batch, "cpu").detach().requires_grad_()  # (4, T, V)
    from dfpo import policy_loss

    loss, _ = policy_loss(
        spec, logp=token_logp(logits, batch.completion_ids), old_logp=old, advantages=adv, mask=batch.mask, group_ids=batch.group_ids
    )
    (grad,) = torch.autograd.grad(loss, logits)
    per_token = grad.norm(dim=-1).double()  # (4, T)
    expected = torch.zeros(2, dtype=torch.float64)
    for i, t in batch.mask.nonzero().tolist():
        expected[buckets[batch.completion_ids[i, t]]] += per_token[i, t]
    torch.testing.assert_close(diag.energy.double(), expected, rtol=1e-4, atol=1e-7)
