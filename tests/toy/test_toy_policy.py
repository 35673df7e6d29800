"""The tabular policy and the tasks: closed forms, enumeration and sampling agree with each other."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.toy.policy import gather_tokens, init_params, log_policy, sample, sequence_logprob, table_gradient
from dfpo.toy.tasks import END, ILLEGAL, count_completions, enumerate_completions, family, make_task, tenplusten

pytestmark = pytest.mark.usefixtures("one_thread")


def _np_log_softmax_grad(logits: np.ndarray, y: int) -> np.ndarray:
    """numpy closed form: d log softmax(z)_y / dz = e_y - pi."""
    p = np.exp(logits - logits.max())
    p /= p.sum()
    e = np.zeros_like(p)
    e[y] = 1.0
    return e - p


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=2, max_value=7), st.integers(min_value=0, max_value=10_000))
def test_log_softmax_gradient_at_a_table_entry_is_e_y_minus_pi(V, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    y = int(torch.randint(V, (1,), generator=g))
    torch.log_softmax(z, -1)[y].backward()
    np.testing.assert_allclose(z.grad.numpy(), _np_log_softmax_grad(z.detach().numpy(), y), atol=1e-12)


@pytest.mark.parametrize("task", [tenplusten(), family(k=2, distractors=2, prompts=2)], ids=["tenplusten", "family"])
def test_closed_form_table_gradient_equals_autograd(task):
    """sum_occurrences coef * (e_y - pi_row), the toy's fast path, is torch's gradient through gather + log_softmax."""
    g = torch.Generator().manual_seed(0)
    theta = init_params(task, 3, noise=0.5, generator=g).requires_grad_(True)  # (S, R, V)
    enum = enumerate_completions(task)
    S = 3
    ex = lambda x: x[None].expand(S, *x.shape)  # noqa: E731
    rows, toks, mask = ex(enum.rows), ex(enum.tokens), ex(enum.mask)
    coef = torch.randn(rows.shape, generator=g)
    logpi = log_policy(theta, task.legal)
    lp = torch.where(mask, gather_tokens(logpi, rows, toks), torch.zeros(()))
    (coef * lp).sum().backward()
    fast = table_gradient(coef, logpi.detach(), rows, toks, mask)
    torch.testing.assert_close(fast, theta.grad, atol=1e-5, rtol=1e-5)
    assert torch.all(fast[:, ~task.legal] == 0)


def test_tenplusten_is_the_paper_example_with_word_tokens():
    """App. A: three trajectories, rewards 0/1/1, shared prefix 'The answer is', lengths 5, 5, 6."""
    task = tenplusten(distractors=False)
    enum = enumerate_completions(task)
    texts = {task.decode(enum.tokens[i][enum.mask[i]].tolist()): float(enum.reward[i]) for i in range(enum.size)}
    assert texts == {"The answer is 25 .": 0.0, "The answer is 20 .": 1.0, "10 + 10 = 20 .": 1.0}
    assert sorted(enum.mask.sum(-1).tolist()) == [5, 5, 6]
    assert not bool(task.template_rows.any())  # without synonyms no context is reward-irrelevant


def test_tenplusten_synonyms_are_reward_irrelevant_template_rows():
    task = tenplusten()
    tpl_rows = torch.nonzero(task.template_rows).flatten().tolist()
    assert len(tpl_rows) == 2
    for state in range(task.next_state.shape[0]):
        if int(task.state_row[state]) in tpl_rows:  # every legal token leads to the same next state
            nxt = task.next_state[state][task.next_state[state] != ILLEGAL]
            assert nxt.numel() == 2 and bool((nxt == nxt[0]).all()) and int(nxt[0]) != END


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 3), st.integers(1, 3), st.integers(0, 2), st.integers(0, 3), st.integers(1, 3))
def test_family_enumerates_every_completion_once_with_probabilities_summing_to_one(k, n_correct, n_wrong, distractors, prompts):
    if n_correct + n_wrong < 2:
        n_wrong = 2 - n_correct
    task = family(k=k, n_correct=n_correct, n_wrong=n_wrong, distractors=distractors, prompts=prompts)
    enum = enumerate_completions(task)
    assert enum.size == count_completions(task) == prompts * (1 + distractors) ** k * (n_correct + n_wrong)
    seqs = {(int(enum.prompt[i]), tuple(enum.tokens[i][enum.mask[i]].tolist())) for i in range(enum.size)}
    assert len(seqs) == enum.size
    theta = init_params(task, 2, noise=1.0, generator=torch.Generator().manual_seed(1))
    p = sequence_logprob(
        log_policy(theta, task.legal),
        enum.rows[None].expand(2, -1, -1),
        enum.tokens[None].expand(2, -1, -1),
        enum.mask[None].expand(2, -1, -1),
    ).exp()
    per_prompt = torch.zeros(2, prompts).index_add(1, enum.prompt, p)
    torch.testing.assert_close(per_prompt, torch.ones(2, prompts), atol=1e-5, rtol=0)
    assert float((enum.reward > 0).float().sum()) == prompts * (1 + distractors) ** k * n_correct


def test_family_template_rows_are_shared_by_every_prompt():
    task = family(k=3, prompts=4)
    enum = enumerate_completions(task)
    tpl = torch.nonzero(task.template_rows).flatten()
    for p in range(4):
        rows_p = set(enum.rows[enum.prompt == p][:, :3].flatten().tolist())
        assert rows_p == set(tpl.tolist())


def test_sampling_frequencies_match_exact_probabilities():
    task = tenplusten()
    enum = enumerate_completions(task)
    S, G = 500, 16
    theta = init_params(task, S, noise=0.0, generator=torch.Generator().manual_seed(0))
    logpi = log_policy(theta, task.legal)
    roll = sample(task, logpi, torch.tensor([0]), G, torch.Generator().manual_seed(1))
    # map each sample to its enumerated completion
    key = lambda toks, m: tuple(toks[m].tolist())  # noqa: E731
    index = {key(enum.tokens[i], enum.mask[i]): i for i in range(enum.size)}
    counts = np.zeros(enum.size)
    flat_t, flat_m = roll.tokens.reshape(-1, task.max_len), roll.mask.reshape(-1, task.max_len)
    for t, m in zip(flat_t, flat_m):
        counts[index[key(t, m)]] += 1
    p = sequence_logprob(logpi[:1], enum.rows[None], enum.tokens[None], enum.mask[None]).exp()[0].numpy()
    n = S * G
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(counts / n - p) < 5 * se + 1e-9)
    # rewards are the enumerated rewards of the sampled completions
    assert set(roll.reward.unique().tolist()) <= {0.0, 1.0}


def test_unknown_task_and_options_are_refused():
    with pytest.raises(ValueError, match="unknown task='nope'"):
        make_task("nope")
    with pytest.raises(ValueError, match="unknown option"):
        make_task("family", width=3)
    with pytest.raises(ValueError, match="n_correct"):
        family(n_correct=0)


def test_exact_enumeration_refuses_too_many_completions():
    task = family(k=6, distractors=9, n_correct=2, n_wrong=2, prompts=1)
    assert count_completions(task) == 4 * 10**6
    with pytest.raises(ValueError, match="more than the exact-mode limit"):
        enumerate_completions(task, limit=10**5)


def test_prior_is_a_pretrained_policy():
    task = tenplusten(p_template=0.7, p_canonical=0.8)
    logpi = log_policy(task.prior_logits.where(task.legal, torch.zeros(()))[None], task.legal)[0]
    enum = enumerate_completions(task)
    p = sequence_logprob(logpi[None], enum.rows[None], enum.tokens[None], enum.mask[None]).exp()[0]
    assert math.isclose(float((p * enum.reward).sum()), 0.7 * 0.5 + 0.3, rel_tol=1e-5)
