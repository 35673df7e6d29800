"""The paper's run and mechanism metrics (dfpo.core.metrics), pinned by hand, and the proof that the
LLM trainer's Energy is the tested function: its bucket sums equal autograd's logit gradients. The shared
residual (eq 2) is one function for the toy and the trainer: pinned by hand, equal to the loss core's
cancellation probe, and the same number from both on one group."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfpo.core import metrics


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
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
    from dfpo.trainer.sampler import build_batch, completion_logits, token_logp
    from dfpo.trainer.train import MicroBatch, StepDiagnostics, accumulate_gradients

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


# ----- the shared residual (eq 2) -----

# Three groups, rows interleaved: g7 = rows 0, 2, 4 (agree on tokens 0-1, differ at 2, agree again at 3);
# g2 = rows 1, 3 (agree on 0-2, row 1 is padded at 3); g9 = row 5 alone (never shared).
_TOKENS = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 0], [5, 6, 9, 8], [1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4]])
_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]).bool()
_GROUPS = torch.tensor([7, 2, 7, 2, 7, 9])
_COEF = torch.tensor(
    [
        [1.0, 0.5, 0.3, 0.2],
        [2.0, -1.0, 0.5, 0.0],
        [-0.5, -0.5, 0.1, -0.2],
        [-2.0, 0.5, -0.5, 0.7],
        [-0.25, 0.25, 0.4, 0.1],
        [3.0, 3.0, 3.0, 3.0],
    ]
)


def test_shared_mask_is_prefix_agreement_or_agreement_at_t():
    prefix = metrics.shared_mask(_TOKENS, _MASK, _GROUPS)
    assert prefix.tolist() == [[True, True, False, False], [True, True, True, False]] * 2 + [[True, True, False, False]] + [[False] * 4]
    at_t = metrics.shared_mask(_TOKENS, _MASK, _GROUPS, prefix=False)  # the tabular toy: t = 3 of g7 agrees again
    assert at_t[[0, 2, 4]].tolist() == [[True, True, False, True]] * 3 and torch.equal(at_t[[1, 3, 5]], prefix[[1, 3, 5]])


def test_shared_residual_by_hand():
    """g7: t=0 |1 - 0.5 - 0.25| = 0.25 of 1.75, t=1 |0.5 - 0.5 + 0.25| = 0.25 of 1.25; g2: t=0 0 of 4, t=1 0.5 of 1.5,
    t=2 0 of 1; g9 none. Relative residual 1 / 9.5."""
    res = metrics.shared_residual(_COEF, metrics.shared_mask(_TOKENS, _MASK, _GROUPS), _GROUPS)
    assert res.groups.tolist() == [2, 7, 9] and res.positions.tolist() == [3, 2, 0]
    torch.testing.assert_close(res.net, torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(res.gross, torch.tensor([6.5, 3.0, 0.0], dtype=torch.float64))
    at_t = metrics.shared_residual(_COEF, metrics.shared_mask(_TOKENS, _MASK, _GROUPS, prefix=False), _GROUPS)
    torch.testing.assert_close(at_t.net[1], torch.tensor(0.6, dtype=torch.float64))  # + |0.2 - 0.2 + 0.1| at t=3
    partly = metrics.shared_mask(_TOKENS, _MASK, _GROUPS).clone()
    partly[4, 0] = False  # a position counts only where every member of the group is marked
    assert metrics.shared_residual(_COEF, partly, _GROUPS).positions.tolist() == [3, 1, 0]


def test_trainers_diagnostics_sum_the_shared_residual():
    from dfpo.trainer.diagnostics import StepDiagnostics

    d = StepDiagnostics()
    ones = torch.ones_like(_COEF)
    d.add(_COEF, 0.5 * ones, 0.5 * ones, _TOKENS, _MASK, _GROUPS, None)
    d.add(_COEF, 0.5 * ones, 0.5 * ones, _TOKENS, _MASK, _GROUPS, None)  # a second micro-batch adds up
    assert d.shared_positions == 10
    assert d.shared_num == pytest.approx(2.0) and d.shared_den == pytest.approx(19.0)


@pytest.mark.parametrize("objective, cancels", [("grpo", True), ("gspo", False), ("dfpo_min", True)])
def test_shared_residual_is_the_loss_cores_probe_zero_exactly_when_the_objective_cancels(objective, cancels):
    """d L / d logp read off autograd on a group that shares 3 tokens: the residual at each shared position is
    |the gradient on the shared leaf| of ``dfpo.core.loss.cancellation`` (eq 2). GRPO at r* = 1 (its linear
    segment) cancels, GSPO's sequence weights s_i (eq 13) do not, Min-Replace restores it (wide clip: nothing clipped)."""
    from dfpo import policy_loss
    from dfpo.core.loss.cancellation import make_shared_prefix_group, shared_token_gradient

    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0]), [7, 7, 7, 7], prefix_len=3, seed=5)
    overrides = {"eps_low": 0.5, "eps_high": 0.5}
    probe = shared_token_gradient(objective, group, **overrides).abs().sum()
    logp = group.logp().detach().requires_grad_()
    loss, _ = policy_loss(
        objective, logp=logp, old_logp=group.old_logp, advantages=group.advantages, mask=group.mask, group_ids=group.group_ids, **overrides
    )
    (coef,) = torch.autograd.grad(loss, logp)  # (G, T) d L / d logp
    ids = torch.cat([torch.full((4, 3), 1), 10 + torch.arange(16).reshape(4, 4)], dim=1)  # shared prefix, own tokens
    res = metrics.shared_residual(coef, metrics.shared_mask(ids, group.mask, group.group_ids), group.group_ids)
    assert int(res.positions.sum()) == 3
    torch.testing.assert_close(res.net.sum(), probe.double(), rtol=1e-9, atol=1e-15)
    rel = float(res.net.sum() / res.gross.sum())
    assert (rel < 1e-12) if cancels else (rel > 1e-3)


@pytest.mark.parametrize("case", ["gspo-off-policy", "grpo-clipped-shared-token"])
def test_toy_and_trainer_give_the_same_residual_on_one_group(case):
    """Four tenplusten completions sharing 'The answer is' (rewards 0 1 1 0): the toy's row-and-token residual and
    the trainer's prefix residual on the same completions as token sequences agree. GSPO off-policy (eq 13), and
    GRPO whose shared 'answer' moved past its clip range (Cor. F.1): one sign's copies lose their gradient there
    while 'The' and 'is' still cancel, and the policy is nearly sure of 'answer' (|e_y - pi| ~ 0.02), so a residual
    weighted by the logit-gradient norm would read 10x smaller than the coefficients' own."""
    from dfpo import group_advantages, resolve_objective
    from dfpo.toy.policy import gather_tokens, init_params, log_policy, row_entropy
    from dfpo.toy.tasks import enumerate_completions, tenplusten
    from dfpo.toy.train import _shared_residual, loss_coefficients
    from dfpo.trainer.diagnostics import StepDiagnostics

    task = tenplusten()
    enum = enumerate_completions(task)
    texts = [task.decode(enum.tokens[i][enum.mask[i]].tolist()) for i in range(enum.size)]
    i25, i20 = texts.index("The answer is 25 ."), texts.index("The answer is 20 .")
    group = torch.tensor([i25, i20, i20, i25])
    gen = torch.Generator().manual_seed(7)
    theta_old = init_params(task, 2, noise=0.5, generator=gen)
    if case == "gspo-off-policy":
        objective, overrides, seeds = "gspo", {"eps_low": 0.5, "eps_high": 0.5}, [0, 1]
        theta = theta_old + 0.05 * torch.randn(theta_old.shape, generator=gen)
    else:
        objective, overrides, seeds = "grpo", {}, [0]  # seed 0's ratio on 'answer' leaves [0.8, 1.2]
        theta = theta_old.clone()
        theta[:, int(enum.rows[i25, 1]), task.vocab.index("answer")] += 3.0
    spec = resolve_objective(objective, **overrides)
    ex = lambda x: x[group][None].expand(2, *x[group].shape)  # noqa: E731 (S=2 seeds, G=4)
    rows, toks, mask, reward = ex(enum.rows), ex(enum.tokens), ex(enum.mask), ex(enum.reward)
    logpi_old, logpi = log_policy(theta_old, task.legal), log_policy(theta, task.legal)
    old = torch.where(mask, gather_tokens(logpi_old, rows, toks), torch.zeros(()))  # (S, G, T)
    lp = torch.where(mask, gather_tokens(logpi, rows, toks), torch.zeros(()))
    ent = gather_tokens(row_entropy(logpi_old)[..., None].expand_as(logpi_old), rows, toks)
    gid = torch.zeros(2, 4, dtype=torch.long)
    adv = group_advantages(reward.reshape(-1), torch.arange(2).repeat_interleave(4), scale=spec.adv_scale).reshape(2, 4)
    coef, _ = loss_coefficients(spec, lp, old, adv, mask, gid, ent, 1, task.max_len)  # (S, G, T) the toy's d loss_s / d logp
    toy = _shared_residual(coef, rows, toks, mask, gid, 1, len(task.vocab))  # what the toy's training loop logs
    per_pair, rel = toy["residual/shared"], toy["residual/shared_rel"]
    pi = logpi.exp()  # (S, R, V) the policy's own pi(y_t) and sum_v pi_v^2, as the trainer's
    prob, coll = gather_tokens(pi, rows, toks), (pi**2).sum(-1).gather(1, rows.reshape(2, -1)).reshape(rows.shape)
    for s in seeds:
        d = StepDiagnostics()
        d.add(coef[s], prob[s], coll[s], toks[s], mask[s], torch.zeros(4, dtype=torch.long), None)
        assert d.shared_positions == 3  # 'The', 'answer', 'is'
        assert float(rel[s]) > 1e-4  # a residual is left
        assert d.shared_num / d.shared_den == pytest.approx(float(rel[s]), rel=1e-6)
        assert d.shared_num / d.shared_positions == pytest.approx(float(per_pair[s]), rel=1e-6)
    if case == "grpo-clipped-shared-token":
        assert float(rel[0]) > 0.2
