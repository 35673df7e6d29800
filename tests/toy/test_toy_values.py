"""The toy's measurements pinned by value: exact expectations on a multi-prompt task against a
brute-force loop, mini-batch selection by group, the tax KL, and the run summary statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dfpo.toy import metrics as M
from dfpo.toy.policy import init_params, log_policy
from dfpo.toy.report import summarise
from dfpo.toy.tasks import enumerate_completions, make_task
from dfpo.toy.train import ToyConfig, _select, make_batch


def test_exact_expected_reward_on_a_multi_prompt_task_equals_a_loop_over_completions():
    task = make_task("family", prompts=2, k=3, distractors=1)
    enum = enumerate_completions(task)
    theta = init_params(task, 2, noise=0.7, generator=torch.Generator().manual_seed(3))
    logpi = log_policy(theta, task.legal)  # (S, R, V)
    got = M.exact_policy_metrics(logpi, enum, len(task.prompts), len(task.form_names))["reward"]  # (S,)
    for s in range(2):
        per_prompt = [0.0] * len(task.prompts)
        for c in range(enum.size):
            lp = sum(float(logpi[s, int(enum.rows[c, t]), int(enum.tokens[c, t])]) for t in range(enum.mask.shape[1]) if enum.mask[c, t])
            per_prompt[int(enum.prompt[c])] += math.exp(lp) * float(enum.reward[c])
        assert float(got[s]) == pytest.approx(sum(per_prompt) / len(per_prompt), rel=1e-5)  # prompts weigh equally


def test_minibatch_selection_returns_exactly_the_rows_of_the_chosen_groups():
    task = make_task("family", prompts=3, k=3, distractors=1)
    config = ToyConfig(task="family", objectives=("gspo",), seeds=2, group_size=4)
    from dfpo import resolve_objective

    spec = resolve_objective("gspo")
    theta = init_params(task, 2, noise=0.1, generator=torch.Generator().manual_seed(0))
    batch = make_batch(task, spec, log_policy(theta, task.legal), config, 0, None, torch.Generator().manual_seed(1))
    chosen = torch.tensor([2, 0])
    rows, toks, mask, group, old, ent, adv, weight, scale = _select(batch, chosen)
    expected = [i for i, g in enumerate(batch.roll.group[0].tolist()) if g in (0, 2)]  # by group id, not by position
    assert set(group[0].tolist()) == {0, 2} and group.shape[1] == len(expected)
    assert torch.equal(toks, batch.roll.tokens[:, expected]) and torch.equal(adv, batch.adv[:, expected])


def test_tax_kl_is_the_mean_over_template_rows_of_an_explicit_sum():
    p_new = torch.tensor([[[0.7, 0.2, 0.1], [0.5, 0.5, 0.0], [0.1, 0.1, 0.8]]])  # (S=1, R=3, V=3), a zero entry included
    p_old = torch.tensor([[[0.4, 0.4, 0.2], [0.9, 0.05, 0.05], [0.3, 0.3, 0.4]]])
    rows = torch.tensor([True, True, False])
    by_hand = [sum(a * math.log(a / b) for a, b in zip(p_new[0, r].tolist(), p_old[0, r].tolist()) if a > 0) for r in (0, 1)]
    got = M.kl_rows(p_new.log(), p_old.log(), rows)
    assert float(got[0]) == pytest.approx(sum(by_hand) / 2)
    assert float(M.kl_rows(p_old.log(), p_new.log(), rows)[0]) != pytest.approx(float(got[0]))  # KL is not symmetric


def test_run_summary_statistics_on_a_synthetic_history():
    reward = np.array([[0.1, 0.5], [0.6, 0.7], [0.9, 0.8], [0.95, 0.85]])  # (steps, S)
    tax = np.array([[0.0, 0.0], [0.1, 0.2], [0.3, 0.5], [0.6, 0.9]])
    h = {
        "reward": reward,
        "tax/kl_cum": tax,
        "tax/kl_init": tax,
        "asym": np.ones_like(reward),
        "clip/frac_low": np.zeros_like(reward),
        "clip/frac_high": np.full_like(reward, 0.25),
    }
    s = summarise({"x": h}, kappa=0.9)["x"]
    assert s["steps_to_kappa"].tolist() == [3, 5] and s["reached"].tolist() == [
        True,
        False,
    ]  # seed 2 never reaches 0.9: censored at steps + 1
    assert s["tax_at_kappa"].tolist() == pytest.approx([0.3, 0.9])  # the tax when kappa was reached (or at the end)
    assert s["jitter2_reward"].tolist() == pytest.approx(
        [np.mean([abs(0.9 - 1.2 + 0.1), abs(0.95 - 1.8 + 0.6)]), np.mean([abs(0.8 - 1.4 + 0.5), abs(0.85 - 1.6 + 0.7)])]
    )
    assert s["final_reward"].tolist() == [0.95, 0.85] and s["clip_frac"].tolist() == [0.25, 0.25]


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "constant", "seq_mean_token_sum"])
def test_sequence_coefficients_recover_the_advantages_of_grpo_at_ratio_one(aggregation):
    """kappa_i = w_i A_i with w_i = 1 for GRPO on-policy, whatever the aggregation and the lengths."""
    from dfpo import resolve_objective
    from dfpo.toy.train import loss_coefficients

    lengths = torch.tensor([2, 5, 3, 4])
    mask = (torch.arange(5)[None, :] < lengths[:, None])[None]  # (1, 4, 5)
    lp = torch.where(mask, -0.7 * torch.ones(1, 4, 5), torch.zeros(()))
    adv = torch.tensor([[1.5, -0.5, 0.25, -1.25]])
    group = torch.zeros(1, 4, dtype=torch.long)
    spec = resolve_objective("grpo", aggregation=aggregation)
    coef, _ = loss_coefficients(spec, lp, lp.clone(), adv, mask, group, None, 1, 5)
    kappa = M.sequence_coefficients(coef, mask, aggregation, 5)
    torch.testing.assert_close(kappa, adv)
