"""The toy training loop: seeds stay independent, exact mode is the expectation, cancellation shows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfpo import OBJECTIVES, group_advantages, policy_loss, resolve_objective
from dfpo.core.loss import parse_objective_label
from dfpo.toy.policy import gather_tokens, init_params, log_policy, row_entropy, sample, table_gradient
from dfpo.toy.tasks import enumerate_completions, family, tenplusten
from dfpo.toy.train import ToyConfig, _shared_residual, loss_coefficients, make_batch, train_objective, validate

pytestmark = pytest.mark.usefixtures("one_thread")


BATCHABLE = sorted(n for n in OBJECTIVES if "ref_logp" not in OBJECTIVES[n].required_inputs())
"""Every objective the toy runs (it refuses one that reads a reference policy, e.g. online_ipo): the batched toy loss
must equal a loop over seeds."""


def _perturbed_batch(task, S, G, seed, noise=0.3):
    """A sampled batch under theta_old and the log-probs under a perturbed theta (ratios != 1)."""
    g = torch.Generator().manual_seed(seed)
    theta_old = init_params(task, S, noise=0.5, generator=g)
    theta = theta_old + noise * torch.randn(theta_old.shape, generator=g)
    logpi_old, logpi = log_policy(theta_old, task.legal), log_policy(theta, task.legal)
    n_groups = len(task.prompts)
    roll = sample(task, logpi_old, torch.arange(n_groups), G, g)
    z = torch.zeros(())
    old = torch.where(roll.mask, gather_tokens(logpi_old, roll.rows, roll.tokens), z)
    lp = torch.where(roll.mask, gather_tokens(logpi, roll.rows, roll.tokens), z)
    ent = gather_tokens(row_entropy(logpi_old)[..., None].expand_as(logpi_old), roll.rows, roll.tokens)
    return roll, old, lp, ent, n_groups


@pytest.mark.parametrize("objective", BATCHABLE)
def test_batched_seeds_give_each_seed_its_own_loss_gradient(objective):
    """One loss call over S seeds (group ids seed * n + g) == a naive loop calling policy_loss per seed."""
    task = family(k=2, distractors=2, prompts=3)
    spec = resolve_objective(objective, eps_low=min(OBJECTIVES[objective].eps_low, 0.9), stapo_tau_p=0.3)
    S, G = 4, 6
    roll, old, lp, ent, n_groups = _perturbed_batch(task, S, G, seed=3)
    gid = (torch.arange(S)[:, None] * n_groups + roll.group).reshape(-1)
    adv = group_advantages(roll.reward.reshape(-1), gid, scale=spec.adv_scale).reshape(S, -1)
    coef, _ = loss_coefficients(spec, lp, old, adv, roll.mask, roll.group, ent, n_groups, task.max_len)
    for s in range(S):  # the naive per-seed reference
        leaf = lp[s].detach().requires_grad_(True)
        loss, _ = policy_loss(
            spec,
            logp=leaf,
            old_logp=old[s],
            advantages=adv[s],
            mask=roll.mask[s],
            group_ids=roll.group[s],
            entropy=ent[s],
            max_completion_length=task.max_len,
        )
        (ref,) = torch.autograd.grad(loss, leaf)
        torch.testing.assert_close(coef[s], ref, atol=1e-6, rtol=1e-4)


def test_stapo_mask_is_exercised_in_the_batched_check():
    """Guard for the test above: with tau_p = 0.3 some tokens really are masked."""
    task = family(k=2, distractors=2, prompts=3)
    roll, old, lp, ent, n_groups = _perturbed_batch(task, 4, 6, seed=3)
    spec = resolve_objective("stapo", stapo_tau_p=0.3)
    gid = (torch.arange(4)[:, None] * n_groups + roll.group).reshape(-1)
    adv = group_advantages(roll.reward.reshape(-1), gid).reshape(4, -1)
    _, metrics = loss_coefficients(spec, lp, old, adv, roll.mask, roll.group, ent, n_groups, task.max_len)
    assert float(metrics["mask/frac"]) > 0


def test_with_one_update_per_batch_every_dfpo_transform_is_the_identity():
    """K = 1, on-policy: every ratio is 1, so DFPO's transforms change nothing and DFPO == GSPO == GRPO.
    With K = 4 at GSPO's own clip range ratio-form DFPO still trains as GSPO (everything past the first
    inner step is clipped); only a wider, matched clip range lets the transform act."""
    config = ToyConfig(objectives=("gspo",), seeds=3, steps=10, inner_steps=1, lr=0.5)
    task, _ = validate(config)
    runs = {o: train_objective(task, o, config) for o in ("gspo", "dfpo_min", "dfpo_orth_pos", "grpo")}
    for o in ("dfpo_min", "dfpo_orth_pos", "grpo"):
        torch.testing.assert_close(runs[o]["reward"], runs["gspo"]["reward"], atol=1e-5, rtol=0)
        torch.testing.assert_close(runs[o]["tax/kl_cum"], runs["gspo"]["tax/kl_cum"], atol=1e-6, rtol=1e-3)
    # K = 4 at GSPO's clip range (3e-4, 4e-4): after the first inner step every sequence of a group is
    # clipped, and ratio-form DFPO (eqs 59-62) keeps GSPO's zero gradient there, so it trains as GSPO.
    config4 = ToyConfig(objectives=("gspo",), seeds=3, steps=10, inner_steps=4, lr=0.5)
    a, b = train_objective(task, "gspo", config4), train_objective(task, "dfpo_min", config4)
    torch.testing.assert_close(b["reward"], a["reward"], atol=1e-5, rtol=0)
    # at a matched clip range the sequences stay unclipped and the transform changes the update
    wide = ":eps_low=0.2:eps_high=0.2"
    a, b = train_objective(task, "gspo" + wide, config4), train_objective(task, "dfpo_min" + wide, config4)
    assert not torch.allclose(a["reward"], b["reward"], atol=1e-4)


def test_exact_mode_is_the_expectation_of_sampled_steps():
    """Dr. GRPO (mean-centred advantages) at ratio 1: E[sampled gradient] = (1 - 1/G) * exact gradient.

    Many seeds with the same initial policy are many independent groups in one batched call.
    """
    task = tenplusten()
    S, G = 4000, 4
    exact_cfg = ToyConfig(objectives=("dr_grpo",), mode="exact", seeds=1, init_noise=0.0)
    spec = resolve_objective("dr_grpo")
    enum = enumerate_completions(task)
    theta = init_params(task, 1, noise=0.0, generator=torch.Generator().manual_seed(0))
    logpi = log_policy(theta, task.legal)

    def grad_of(config, logpi_s, S_):
        batch = make_batch(task, spec, logpi_s, config, 0, enum, torch.Generator().manual_seed(5))
        r = batch.roll
        lp = batch.old_logp  # ratio 1
        coef, _ = loss_coefficients(spec, lp, batch.old_logp, batch.adv, r.mask, r.group, batch.entropy, batch.n_groups, task.max_len)
        return table_gradient(coef, logpi_s, r.rows, r.tokens, r.mask)  # (S, R, V)

    exact = grad_of(exact_cfg, logpi, 1)[0]
    sampled_cfg = ToyConfig(objectives=("dr_grpo",), mode="sampled", seeds=S, group_size=G, init_noise=0.0)
    per_seed = grad_of(sampled_cfg, logpi.expand(S, -1, -1), S)  # (S, R, V), independent groups
    mean = per_seed.mean(0) * G / (G - 1)
    se = per_seed.std(0) / np.sqrt(S) * G / (G - 1)
    assert float(exact.abs().max()) > 1e-3  # a real gradient
    assert bool((torch.abs(mean - exact) <= 4 * se + 1e-6).all()), (mean - exact).abs().max()


def test_exact_mode_loss_is_the_probability_weighted_sum():
    """With fixed advantages, the exact batch's gradient equals sum_y pi(y) A(y) grad log pi(y) / (P * L) for GRPO at ratio 1."""
    task = tenplusten()
    enum = enumerate_completions(task)
    spec = resolve_objective("grpo")
    theta = init_params(task, 1, noise=0.3, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    logpi = log_policy(theta, task.legal)
    batch = make_batch(task, spec, logpi.detach(), ToyConfig(mode="exact", seeds=1), 0, enum, torch.Generator())
    r = batch.roll
    coef, _ = loss_coefficients(spec, batch.old_logp, batch.old_logp, batch.adv, r.mask, r.group, batch.entropy, 1, task.max_len)
    fast = table_gradient(coef, logpi.detach(), r.rows, r.tokens, r.mask)[0]
    # reference: population advantages, loss = -sum_y pi(y) A(y) (1/L) sum_t log pi(y_t)
    lp = torch.where(r.mask, gather_tokens(logpi, r.rows, r.tokens), torch.zeros(()))[0]  # (C, T)
    p = lp.sum(-1).exp().detach()
    R = enum.reward
    mean = (p * R).sum()
    std = (p * (R - mean) ** 2).sum().sqrt()
    A = (R - mean) / (std + 1e-4)
    L = enum.mask.sum(-1)
    loss = -(p * A * lp.sum(-1) / L).sum()
    loss.backward()
    torch.testing.assert_close(fast, theta.grad[0], atol=1e-5, rtol=1e-4)


def _tenplusten_group():
    """Four completions sharing 'The answer is': rewards 0, 1, 1, 0 (equal lengths, App. A.2)."""
    task = tenplusten(distractors=False)
    enum = enumerate_completions(task)
    texts = [task.decode(enum.tokens[i][enum.mask[i]].tolist()) for i in range(enum.size)]
    i25, i20 = texts.index("The answer is 25 ."), texts.index("The answer is 20 .")
    return task, enum, torch.tensor([i25, i20, i20, i25])


def group_coefficients(task, objective, theta_old, theta, completions, enum, **overrides):
    """d loss / d logp (S, G, T) of one hand-picked group of ``enum``'s completions (one prompt), with their rows,
    tokens and mask; theta_old / theta (S, R, V) are the rollout and current parameters."""
    spec = resolve_objective(objective, **overrides)
    S, G = theta.shape[0], completions.shape[0]
    ex = lambda x: x[completions][None].expand(S, *x[completions].shape)  # noqa: E731
    rows, toks, mask, reward = ex(enum.rows), ex(enum.tokens), ex(enum.mask), ex(enum.reward)
    logpi_old, logpi = log_policy(theta_old, task.legal), log_policy(theta, task.legal)
    old = torch.where(mask, gather_tokens(logpi_old, rows, toks), torch.zeros(()))  # (S, G, T)
    lp = torch.where(mask, gather_tokens(logpi, rows, toks), torch.zeros(()))
    ent = gather_tokens(row_entropy(logpi_old)[..., None].expand_as(logpi_old), rows, toks)
    group = torch.zeros(S, G, dtype=torch.long)
    gid = (torch.arange(S)[:, None] + group).reshape(-1)
    adv = group_advantages(reward.reshape(-1), gid, scale=spec.adv_scale).reshape(S, G)
    coef, _ = loss_coefficients(spec, lp, old, adv, mask, group, ent, 1, task.max_len)
    return coef, rows, toks, mask


def shared_prefix_residual(task, objective, theta_old, theta, completions, enum, **overrides):
    """The toy's residual (eq 2) on the pairs a hand-picked group shares, through the training loop's own metric:
    (mean |sum_i coef| per shared pair, net / gross) per seed. Zero for objectives that cancel on shared tokens,
    non-zero for GSPO with unclipped ratios away from 1 (eq 13, eq 38)."""
    coef, rows, toks, mask = group_coefficients(task, objective, theta_old, theta, completions, enum, **overrides)
    res = _shared_residual(coef, rows, toks, mask, torch.zeros(mask.shape[:2], dtype=torch.long), 1, len(task.vocab))
    return res["residual/shared"], res["residual/shared_rel"]


def _perturbed_params(task, scale):
    g = torch.Generator().manual_seed(7)
    theta_old = init_params(task, 2, noise=0.5, generator=g)
    return theta_old, theta_old + scale * torch.randn(theta_old.shape, generator=g)


DFPO_CANCELS = [
    f"{o}:{form}"
    for o in ("dfpo_min", "dfpo_orth", "dfpo_orth_pos", "dfpo_orth_tr")
    for form in ("stopgrad=score", "eps_low=0.5:eps_high=0.5")
]


@pytest.mark.parametrize("objective", ["grpo", "dapo", "grpo_fix", "cispo", *DFPO_CANCELS])
def test_shared_prefix_residual_is_zero_for_cancelling_objectives(objective):
    """Eq 2 / eq 9: on the shared 'The answer is' (equal lengths) these objectives cancel exactly.

    DFPO cancels in the score form (eq 68), and in the default ratio form where no sequence clips."""
    task, enum, group = _tenplusten_group()
    theta_old, theta = _perturbed_params(task, 0.05)  # shared-token ratios inside GRPO's clip range
    name, overrides = parse_objective_label(objective)
    norm, rel = shared_prefix_residual(task, name, theta_old, theta, group, enum, **overrides)
    assert float(rel.max()) < 1e-5 and float(norm.max()) < 1e-6


@pytest.mark.parametrize("overrides", [{}, {"eps_low": 0.5, "eps_high": 0.5}], ids=["paper-clip", "wide-clip"])
def test_shared_prefix_residual_is_nonzero_for_gspo_with_ratios_away_from_one(overrides):
    """Eq 13 / eq 38: GSPO's shared-prefix coefficient is A (s_2 - s_1) != 0 when s_1 != s_2 (unclipped)."""
    task, enum, group = _tenplusten_group()
    scale = 1e-4 if not overrides else 0.05  # the paper's clip range (3e-4, 4e-4) needs tiny moves
    theta_old, theta = _perturbed_params(task, scale)
    norm, rel = shared_prefix_residual(task, "gspo", theta_old, theta, group, enum, **overrides)
    assert float(rel.min()) > 1e-6 and float(norm.min()) > 0
    same_norm, same_rel = shared_prefix_residual(task, "gspo", theta_old, theta_old, group, enum, **overrides)
    assert float(same_rel.max()) < 1e-6  # at ratio 1 GSPO cancels too (K = 1 on-policy)


def test_gspo_clipping_hides_the_residual_when_every_ratio_is_clipped():
    """After a step towards "20", s > 1 + eps_high where A > 0 and s < 1 - eps_low where A < 0: GSPO
    clips the whole group, so its shared-prefix gradient is zero (clipped away, not cancelled)."""
    task, enum, group = _tenplusten_group()
    theta_old, _ = _perturbed_params(task, 0.0)
    theta = theta_old.clone()
    row = int(enum.rows[group[1], 3])  # the context 'The answer is'
    theta[:, row, task.vocab.index("20")] += 0.5
    norm, rel = shared_prefix_residual(task, "gspo", theta_old, theta, group, enum)
    assert float(norm.max()) == 0.0
    wide, _ = shared_prefix_residual(task, "gspo", theta_old, theta, group, enum, eps_low=0.5, eps_high=0.5)
    assert float(wide.min()) > 0


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"group_size": 1}, "group_size must be >= 2, got 1"),
        ({"inner_steps": 0}, "inner_steps must be >= 1, got 0"),
        ({"task": "nope"}, "unknown task='nope'"),
        ({"objectives": ("gspo", "nope")}, "unknown objective='nope'"),
        (
            {"mode": "exact", "objectives": ("gspo",), "task": "family", "task_options": {"k": 6, "distractors": 9}},
            "too many for exact mode",
        ),
        ({"mode": "exact", "objectives": ("stapo",)}, "exact mode cannot take its expectation"),
        (
            {"mode": "exact", "objectives": ("grpo:adv_scale=opo",)},
            r"adv_scale='opo'; exact mode has the population limits .*mode='sampled'",
        ),
        ({"mode": "exact", "objectives": ("grpo:adv_scale=grpo_passk",)}, r"adv_scale='grpo_passk'; exact mode"),
        ({"mode": "exact", "objectives": ("grpo:adv_scale=gdpo",)}, r"adv_scale='gdpo'; exact mode"),
        ({"mode": "exact", "objectives": ("grpo:adv_scale=otb",)}, r"adv_scale='otb'; exact mode"),
        ({"mode": "sampled", "objectives": ("gspo:adv_scale=otb",)}, r"adv_scale='otb' gives one advantage per token, but ratio_level"),
        ({"optimizer": "lbfgs"}, "optimizer must be one of"),
        ({"lr": 0.0}, "lr must be > 0"),
        ({"minibatches": 3}, "minibatches must be <="),
        ({"overrides": {"eps_lo": 0.1}}, "unknown override"),
        ({"objectives": ("grpo:entropy_coef=0.01",)}, r"'grpo:entropy_coef=0.01' needs entropy for entropy_coef=0.01 .*no entropy bonus"),
        ({"objectives": ("grpo:beta=0.1",)}, r"needs ref_logp for beta=0.1 .*no reference policy"),
        ({"objectives": ("grpo:rollout_correction=token_truncate",)}, r"needs rollout_logp for rollout_correction='token_truncate'"),
    ],
)
def test_bad_options_fail_with_a_clear_message(changes, message):
    with pytest.raises(ValueError, match=message):
        validate(ToyConfig(**changes))


@pytest.mark.parametrize("objective", ["grpo:adv_scale=otb", "dapo:adv_scale=otb"])
def test_the_optimal_token_baseline_trains_the_toy_on_one_advantage_per_token(objective):
    """Sampled mode: pi_old(y_t) and sum pi^2 come from the table row of each token, exactly; the reward rises."""
    config = ToyConfig(objectives=(objective,), mode="sampled", seeds=3, steps=25)
    task, _ = validate(config)
    h = train_objective(task, objective, config)
    for key, val in h.items():
        assert bool(torch.isfinite(val).all()), key
    assert float(h["reward"][-1].mean()) > float(h["reward"][0].mean()) + 0.1


def test_training_metrics_are_finite_and_reward_rises():
    config = ToyConfig(objectives=("grpo",), seeds=3, steps=25)
    task, _ = validate(config)
    h = train_objective(task, "grpo", config)
    for key, val in h.items():
        assert val.shape == (25, 3) and bool(torch.isfinite(val).all()), key
    assert float(h["reward"][-1].mean()) > float(h["reward"][0].mean()) + 0.1
    assert bool((h["tax/kl_cum"][1:] >= h["tax/kl_cum"][:-1] - 1e-9).all())


def test_exact_mode_is_deterministic_and_minibatches_keep_groups_whole():
    config = ToyConfig(
        task="family",
        task_options={"k": 2, "prompts": 4},
        objectives=("dfpo_min",),
        mode="exact",
        seeds=2,
        steps=5,
        minibatches=2,
        inner_steps=4,
    )
    task, _ = validate(config)
    a = train_objective(task, "dfpo_min", config)
    b = train_objective(task, "dfpo_min", config)
    for key in a:
        torch.testing.assert_close(a[key], b[key])
    assert float(a["reward"][-1].mean()) > float(a["reward"][0].mean())


@pytest.mark.parametrize("objective", ["dfpo_min", "dfpo_orth_pos"])
def test_ratio_form_dfpo_leaves_a_residual_when_part_of_the_group_clips(objective):
    """Eqs 59-62 at GSPO's range: the clipped completions drop out of the balance, so the shared prefix
    keeps a gradient, which the score form (eq 68) cancels."""
    task, enum, group = _tenplusten_group()
    theta_old, theta = _perturbed_params(task, 0.05)
    _, rel_ratio = shared_prefix_residual(task, objective, theta_old, theta, group, enum)
    _, rel_score = shared_prefix_residual(task, objective, theta_old, theta, group, enum, stopgrad="score")
    assert float(rel_ratio.min()) > 1e-3 and float(rel_score.max()) < 1e-5


def test_ratio_spread_is_the_within_group_std_of_the_sequence_log_ratio():
    """K = 1: the only update of each batch is on-policy, so every log s_i is 0 and the spread is 0;
    with K = 4 the later updates see s_i != 1."""
    config = ToyConfig(objectives=("gspo",), seeds=2, steps=3, inner_steps=1, lr=0.5)
    task, _ = validate(config)
    assert float(train_objective(task, "gspo", config)["ratio/spread"].abs().max()) < 1e-7
    spread = train_objective(task, "gspo", ToyConfig(objectives=("gspo",), seeds=2, steps=3, inner_steps=4, lr=0.5))["ratio/spread"]
    assert float(spread.mean()) > 1e-3  # (a batch whose rewards are all equal moves nothing: its spread stays 0)


@pytest.mark.parametrize("scale", ["opo", "reinforce_pp_baseline", "grpo_passk", "gdpo", "remax"])
def test_length_weighted_and_passk_advantages_train_in_sampled_mode(scale):
    """OPO and REINFORCE++-baseline read each sampled completion's length, GDPO the task's one reward function as a
    one-column matrix, ReMax each prompt's greedy reward; with each (and verl's pass@k) a short run stays finite."""
    config = ToyConfig(objectives=(f"grpo:adv_scale={scale}",), seeds=2, steps=4)
    task, _ = validate(config)
    h = train_objective(task, f"grpo:adv_scale={scale}", config)
    assert all(bool(torch.isfinite(v).all()) for v in h.values())


def test_the_greedy_reward_is_the_reward_of_the_all_argmax_completion():
    """greedy_rewards walks the table's argmax; by enumeration, exactly one completion of each prompt takes the argmax of
    every row it visits, and its reward is the walk's."""
    from dfpo.toy.policy import greedy_rewards

    task = family()
    enum = enumerate_completions(task)
    logpi = log_policy(init_params(task, 2, noise=1.0, generator=torch.Generator().manual_seed(5)), task.legal)  # (S, R, V)
    greedy = greedy_rewards(task, logpi, torch.arange(len(task.prompts)))  # (S, P)
    for s in range(2):
        best = logpi[s].argmax(-1)  # (R,) each row's most probable token
        all_argmax = ((enum.tokens == best[enum.rows]) | ~enum.mask).all(-1)  # (C,)
        for p in range(len(task.prompts)):
            (index,) = torch.nonzero(all_argmax & (enum.prompt == p), as_tuple=True)
            assert index.numel() == 1 and float(enum.reward[index]) == float(greedy[s, p])


def test_remax_in_exact_mode_is_the_reward_minus_the_greedy_reward():
    """Exact mode's ReMax advantage needs no expectation: R_i - R(greedy completion of its prompt), per seed."""
    from dfpo.toy.policy import greedy_rewards

    task = family()
    config = ToyConfig(mode="exact", task="family", objectives=("grpo:adv_scale=remax",), seeds=2)
    _, specs = validate(config)
    enum = enumerate_completions(task)
    logpi = log_policy(init_params(task, 2, noise=1.0, generator=torch.Generator().manual_seed(0)), task.legal)
    batch = make_batch(task, specs["grpo:adv_scale=remax"], logpi, config, 0, enum, torch.Generator())
    expected = enum.reward[None] - greedy_rewards(task, logpi, torch.arange(len(task.prompts)))[:, enum.prompt]  # (S, C)
    torch.testing.assert_close(batch.adv / batch.scale, expected)
    h = train_objective(
        task, "grpo:adv_scale=remax", ToyConfig(mode="exact", task="family", objectives=("grpo:adv_scale=remax",), seeds=2, steps=3)
    )
    assert all(bool(torch.isfinite(v).all()) for v in h.values())
