"""Diagnostics: closed-form logit-gradient norm, Energy buckets, shared-prefix residual, run metrics."""

import pytest
import torch

from dfpo import resolve_objective
from dfpo.core import metrics
from dfpo.trainer import diagnostics as diag
from dfpo.trainer.diagnostics import StepDiagnostics
from dfpo.trainer.minibatches import MicroBatch
from dfpo.trainer.sampler import build_batch
from dfpo.trainer.stages.update import accumulate_gradients


def test_closed_form_logit_gradient_norm_matches_autograd():
    torch.manual_seed(0)
    z = torch.randn(5, 7, requires_grad=True)  # 5 positions, vocab 7
    y = torch.randint(0, 7, (5,))
    coef = torch.randn(5)
    logp = torch.log_softmax(z, -1)
    (coef * logp[torch.arange(5), y]).sum().backward()
    p = torch.softmax(z.detach(), -1)
    closed = metrics.logit_grad_norm(coef, p[torch.arange(5), y], (p * p).sum(-1))
    torch.testing.assert_close(closed, z.grad.norm(dim=-1))


def test_frequency_buckets_put_the_most_frequent_tokens_first():
    ids = torch.tensor([[5, 5, 5, 5, 6, 6, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]]).bool()
    buckets = metrics.frequency_buckets(ids, mask, [0.5, 0.8], vocab_size=9)
    assert buckets[5] == 0 and buckets[6] == 1 and buckets[7] == 2  # 4/7, then 2/7 (cum 6/7), then rare
    assert buckets[0] == 2 and buckets[8] == 2  # unseen tokens (padding included) are "rare"
    norm = torch.ones(1, 8)
    sums = metrics.energy_sums(norm, ids, mask, buckets)
    assert sums.tolist() == [4.0, 2.0, 1.0]


def test_jitter2_and_steps_to_threshold():
    assert metrics.jitter2([0, 1, 0, 1]) == pytest.approx(2.0)  # |0-2+0|, |1-0+1| -> (2+2)/2
    assert metrics.jitter2([0.0, 0.5, 1.0, 1.5]) == pytest.approx(0.0)  # a straight line has no jitter
    assert metrics.jitter2([1.0, 2.0]) is None
    assert metrics.steps_to_threshold([1, 2, 3], [0.1, 0.6, 0.9], 0.5) == 2
    assert metrics.steps_to_threshold([1, 2], [0.1, 0.2], 0.5) is None


def test_trailing_mean_smooths_a_single_spike():
    curve = [0.0, 0.0, 1.0, 0.0, 0.0]
    assert metrics.trailing_mean(curve, 2) == [0.0, 0.0, 0.5, 0.5, 0.0]
    assert metrics.steps_to_threshold([1, 2, 3, 4, 5], metrics.trailing_mean(curve, 3), 0.5) is None


def test_zero_variance_fraction_counts_all_equal_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert diag.zero_variance_fraction(rewards, torch.tensor([0, 0, 1, 1, 2, 2])) == pytest.approx(2 / 3)


def _shared_prefix_batch(tok):
    """One group of 4 equal-length completions sharing their first 2 tokens."""
    prompt = [tok("3+4=", add_special_tokens=False).input_ids]
    comps = [[10, 11, 12, 13], [10, 11, 14, 15], [10, 11, 12, 16], [10, 11, 17, 13]]
    return build_batch(prompt, comps, 4, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=4)


@pytest.mark.parametrize("objective, cancels", [("grpo", True), ("gspo", False), ("dfpo_min", True)])
def test_shared_prefix_residual_is_zero_exactly_when_the_objective_cancels(objective, cancels):
    """Paper sec. 3: with sum_i A_i = 0 and equal lengths, GRPO's shared-token gradients cancel
    on-policy; GSPO's sequence weights s_i break it off-policy; Min-Replace restores it."""
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    batch = _shared_prefix_batch(tok)
    from dfpo.trainer.sampler import completion_logits, token_logp

    with torch.no_grad():
        logp = token_logp(completion_logits(model, batch, "cpu"), batch.completion_ids)  # (4, 4)
    shift = torch.tensor([0.0, 0.1, -0.1, 0.05])[:, None] if objective != "grpo" else 0.0
    old = logp + shift * batch.mask  # off-policy ratios for the sequence-level objectives
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    d = StepDiagnostics()
    accumulate_gradients(
        model,
        [MicroBatch(batch, old, None, adv, 1.0)],
        resolve_objective(objective, eps_low=0.2, eps_high=0.2),
        torch.device("cpu"),
        buckets=None,
        diagnostics=d,
    )
    assert d.shared_positions == 2
    residual = d.shared_num / d.shared_den
    if cancels:
        assert residual < 1e-5
    else:
        assert residual > 1e-3
