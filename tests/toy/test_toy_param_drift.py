"""The toy's closed form of parameter-space drift (dfpo.toy.param_drift) against the core probe, and its driver."""

from __future__ import annotations

import pytest
import torch

from dfpo.core.loss import group_advantages
from dfpo.core.probe import DriftBatch, probe_step, shared_events


def tabular_setup(seed: int):
    """A toy family task's batch on one seed, its table as a leaf, and a scorer for the core probe."""
    from dfpo.toy.policy import gather_tokens, init_params, log_policy, sample
    from dfpo.toy.tasks import make_task

    task = make_task("family")
    gen = torch.Generator().manual_seed(seed)
    theta0 = init_params(task, 1, noise=0.3, generator=gen)[0].double()  # (R, V)
    roll = sample(task, log_policy(theta0[None].float(), task.legal), torch.arange(2), 4, gen)
    rows, toks, mask, group = roll.rows[0], roll.tokens[0], roll.mask[0], roll.group[0]
    theta = torch.nn.Parameter(theta0 + 0.1 * torch.randn(theta0.shape, generator=gen, dtype=torch.float64))  # off-policy
    old = torch.where(mask, gather_tokens(log_policy(theta0[None], task.legal), rows[None], toks[None])[0], 0.0)
    V = len(task.vocab)
    batch = DriftBatch(
        tokens=rows * V + toks,  # the tabular context is the row: the key of an event is (row, token)
        mask=mask,
        group_ids=group,
        advantages=group_advantages(roll.reward[0].double(), group),
        old_logp=old,
        correct=roll.form[0] >= 0,
    )

    def score(r):
        lp = gather_tokens(log_policy(theta[None], task.legal), rows[r][None], toks[r][None])[0]
        return torch.where(mask[r], lp, 0.0), None

    return task, theta, batch, score, (rows, toks, mask, group)


@pytest.mark.parametrize("objective", ["gspo_noclip", "dfpo_min:stopgrad=score", "grpo"])
def test_tabular_split_equals_the_closed_form(objective):
    """On a tabular softmax the probe's direct and cross terms are the toy's closed form (cross: the softmax coupling
    of the event's own row, zero across rows). The closed form sums an event's coefficient over its whole group, as
    the toy's own probe does, so the core probe takes the whole-group events here (events="whole")."""
    from dfpo.core.loss import objective_from_label, policy_loss
    from dfpo.toy.param_drift import pair_terms, shared_event_terms
    from dfpo.toy.policy import log_policy

    task, theta, batch, score, (rows, toks, mask, group) = tabular_setup(0)
    spec = objective_from_label(objective)
    lr = 0.3
    logpi = log_policy(theta.detach()[None], task.legal)[0]
    logp = score(torch.arange(rows.shape[0]))[0].detach().requires_grad_()
    loss, _ = policy_loss(spec, logp=logp, old_logp=batch.old_logp, advantages=batch.advantages, mask=mask, group_ids=group)
    (coef,) = torch.autograd.grad(loss, logp)
    report = probe_step(score, torch.optim.SGD([theta], lr=lr), batch, spec, events="whole")
    assert len(report.shared) > 0 and len(report.pairs) > 0
    c_e, direct, cross = shared_event_terms(coef, logpi, rows, toks, mask, group, report.shared.where, lr)
    torch.testing.assert_close(report.shared.coef, c_e)
    torch.testing.assert_close(report.shared.direct, direct)
    torch.testing.assert_close(report.shared.cross, cross)
    gap, pd, pc = pair_terms(coef, logpi, rows, toks, mask, report.pairs.where, lr)
    torch.testing.assert_close(report.pairs.direct, pd)
    torch.testing.assert_close(report.pairs.cross, pc)
    torch.testing.assert_close(report.pairs.coef, gap)


def test_tabular_cross_term_is_zero_across_contexts():
    """An event's cross term reads only its own row: changing the coefficients of every other row leaves it alone."""
    from dfpo.toy.param_drift import shared_event_terms
    from dfpo.toy.policy import log_policy

    task, theta, batch, _, (rows, toks, mask, group) = tabular_setup(1)
    logpi = log_policy(theta.detach()[None], task.legal)[0]
    events = shared_events(batch.tokens, mask, group)
    coef = torch.randn(rows.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    _, _, cross = shared_event_terms(coef, logpi, rows, toks, mask, group, events, 0.1)
    for k, (b, t) in enumerate(events.tolist()):
        other = rows != rows[b, t]
        changed = torch.where(other, 10 * coef + 1, coef)
        _, _, cross2 = shared_event_terms(changed, logpi, rows, toks, mask, group, events[k : k + 1], 0.1)
        torch.testing.assert_close(cross2[0], cross[k])


def test_untied_rows_make_the_token_level_argument_exact():
    """tenplusten has one group and no tied rows: a shared event's row holds only the event's own copies, so its cross
    term is zero and the paper's token-level argument is exact; family ties its template rows across prompts, so
    another group's tokens couple in (a non-zero cross term)."""
    from dfpo.toy.param_drift import default_probe_config, probe_toy

    exact = probe_toy(default_probe_config(task="tenplusten", group_size=3, seeds=16, objectives=("gspo_noclip",)))
    events = [e for e in exact.shared["gspo_noclip"] if len(e)]
    assert events and all(float(e.cross.abs().max()) <= 1e-5 * float(e.direct.abs().max()) for e in events)  # float32 rounding
    tied = probe_toy(default_probe_config(task="family", objectives=("gspo_noclip",)))
    assert any(float(e.cross.abs().max()) > float(e.direct.abs().max()) for e in tied.shared["gspo_noclip"] if len(e))


def test_probe_toy_rows_and_common_start():
    """Every label is probed on the same rollouts from the same theta: on-policy (K = 1) every objective of the
    matched pairs takes the same step, so their rows agree."""
    from dfpo.toy.param_drift import default_probe_config, probe_toy

    result = probe_toy(default_probe_config(task="family", inner_steps=1, seeds=2))
    rows = {(r["objective"], r["events"]): r for r in result.rows()}
    assert rows[("gspo", "shared")]["measured"] == pytest.approx(rows[("dfpo_min:stopgrad=score", "shared")]["measured"])
    for r in result.rows():
        assert r["seeds"] >= 1 and r["error"] is not None and r["error"] < 1e-3


@pytest.mark.parametrize(
    ("change", "message"), [({"mode": "exact"}, "mode='sampled'"), ({"optimizer": "adam", "lr": 0.05}, "optimizer='sgd'")]
)
def test_probe_toy_refusals(change, message):
    from dfpo.toy.param_drift import default_probe_config, probe_toy

    with pytest.raises(ValueError, match=message):
        probe_toy(default_probe_config(**change))
