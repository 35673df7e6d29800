"""The probe's shared events under eq 2's subset rule (dfpo.core.probe.probe_events, probe_step's ``events``): the
events and their direct coefficient against plain loops, the four parts against a real step on subset events, and
whole-group events giving the same figures under either rule."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core.loss import group_advantages, policy_loss
from dfpo.core.param_atlas import SharedWeightsLM
from dfpo.core.probe import DriftBatch, probe_events, probe_step, shared_events

OPTIMISERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "sgd_momentum_wd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "adamw_wd": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
}


def random_batch(model: SharedWeightsLM, seed: int, *, groups: int = 2, size: int = 5, T: int = 5, vocab: int = 3) -> DriftBatch:
    """Groups of random completions over a small vocabulary (so part of a group often shares a prefix), ragged."""
    gen = torch.Generator().manual_seed(seed)
    B = groups * size
    tokens = torch.randint(0, vocab, (B, T), generator=gen)  # (B, T)
    lengths = torch.randint(2, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    group_ids = torch.arange(groups).repeat_interleave(size)
    rewards = torch.randint(0, 2, (B,), generator=gen).double()
    with torch.no_grad():
        old = model(tokens) + 0.2 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = group_advantages(rewards, group_ids)
    return DriftBatch(tokens=tokens, mask=mask, group_ids=group_ids, advantages=adv, old_logp=torch.where(mask, old, 0.0))


def reference_events(batch: DriftBatch) -> dict[tuple[int, int], tuple[int, ...]]:
    """{(first member's row, t): members} by plain loops: two or more rows of one group, all real at 0..t, with the
    same tokens at 0..t."""
    B, T = batch.tokens.shape
    out = {}
    for g in sorted(set(batch.group_ids.tolist())):
        rows = [i for i in range(B) if int(batch.group_ids[i]) == g]
        for t in range(T):
            classes: dict[tuple, list[int]] = {}
            for i in rows:
                if all(bool(batch.mask[i, s]) for s in range(t + 1)):
                    classes.setdefault(tuple(batch.tokens[i, : t + 1].tolist()), []).append(i)
            for members in classes.values():
                if len(members) >= 2:
                    out[(members[0], t)] = tuple(members)
    return out


def scorer(model: SharedWeightsLM, batch: DriftBatch):
    return lambda rows: (torch.where(batch.mask[rows], model(batch.tokens[rows]), 0.0), None)


def coefficients(model: SharedWeightsLM, batch: DriftBatch, objective: str) -> torch.Tensor:
    """(B, T) c_it = d L / d log pi_it by autograd on the loss core's loss, apart from the probe."""
    logp = torch.where(batch.mask, model(batch.tokens), 0.0).detach().requires_grad_()
    loss, _ = policy_loss(
        objective, logp=logp, old_logp=batch.old_logp, advantages=batch.advantages, mask=batch.mask, group_ids=batch.group_ids
    )
    (coef,) = torch.autograd.grad(loss, logp)
    return coef


def event_grad(model: SharedWeightsLM, batch: DriftBatch, row: int, t: int) -> list[torch.Tensor]:
    logp = torch.where(batch.mask, model(batch.tokens), 0.0)  # (B, T)
    grads = torch.autograd.grad(logp[row, t], list(model.parameters()), allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(model.parameters(), grads)]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_subset_events_match_a_plain_loop(seed):
    batch = random_batch(SharedWeightsLM(max_len=6, seed=0), seed)
    found = probe_events(batch.tokens, batch.mask, batch.group_ids)
    ref = reference_events(batch)
    got = {tuple(w): tuple(torch.nonzero(m).flatten().tolist()) for w, m in zip(found.where.tolist(), found.members)}
    assert got == ref
    sizes = {g: int((batch.group_ids == g).sum()) for g in batch.group_ids.tolist()}
    assert found.whole.tolist() == [len(ref[tuple(w)]) == sizes[int(batch.group_ids[w[0]])] for w in found.where.tolist()]
    whole = probe_events(batch.tokens, batch.mask, batch.group_ids, "whole")
    assert whole.where.tolist() == shared_events(batch.tokens, batch.mask, batch.group_ids).tolist()  # the old rule's events


def test_an_unknown_rule_is_one_sentence():
    batch = random_batch(SharedWeightsLM(max_len=6, seed=0), 0)
    with pytest.raises(ValueError, match="subset, whole, got 'all'"):
        probe_step(scorer(SharedWeightsLM(max_len=6), batch), torch.optim.SGD([torch.zeros(1)], lr=1), batch, "grpo", events="all")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_direct_coefficient_sums_over_the_members(seed):
    """Under SGD without clipping, an event's coef = sum over its members S of c_it (a plain loop over S) and direct =
    -coef lr |g_e|^2, g_e the gradient of log pi(v | h*) at any member (one context: the same gradient)."""
    model = SharedWeightsLM(max_len=6, seed=seed)
    batch = random_batch(model, 10 + seed)
    coef = coefficients(model, batch, "gspo_noclip")
    ref = reference_events(batch)
    lr = 0.05
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=lr), batch, "gspo_noclip", max_events=64)
    e = report.shared
    assert len(e) == len(ref) == report.found and int(e.whole.sum()) == report.found_whole
    assert any(not w for w in e.whole.tolist())  # the batch holds events of part of a group
    for k, (row, t) in enumerate(e.where.tolist()):
        members = ref[(row, t)]
        c_sum = sum(float(coef[i, t]) for i in members)
        assert int(e.members[k]) == len(members)
        assert math.isclose(float(e.coef[k]), c_sum, rel_tol=1e-9, abs_tol=1e-15)
        g = event_grad(model, batch, row, t)
        for other in members[1:]:  # the same context and token: the same log-prob, the same gradient
            torch.testing.assert_close(event_grad(model, batch, other, t), g, rtol=0, atol=0)
        sq = sum(float((x * x).sum()) for x in g)
        assert math.isclose(float(e.direct[k]), -c_sum * lr * sq, rel_tol=1e-9, abs_tol=1e-15)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), optimizer=st.sampled_from(sorted(OPTIMISERS)), objective=st.sampled_from(["grpo", "gspo", "dfpo_min"]))
def test_the_four_parts_sum_to_the_real_first_order_change_on_subset_events(seed, optimizer, objective):
    """On subset events, direct + cross + momentum + decay = <g_e, theta_1 - theta_0> of the real step (g_e by autograd)."""
    model = SharedWeightsLM(max_len=6, seed=seed % 7)
    batch = random_batch(model, seed)
    opt = OPTIMISERS[optimizer](model.parameters())
    theta0 = [p.detach().clone() for p in model.parameters()]
    report = probe_step(scorer(model, batch), opt, batch, objective, keep_step=True, max_events=64)
    theta1 = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, t0 in zip(model.parameters(), theta0):
            p.copy_(t0)
    real = [
        sum(float((g * (t1 - t0)).sum()) for g, t0, t1 in zip(event_grad(model, batch, row, t), theta0, theta1))
        for row, t in report.shared.where.tolist()
    ]
    torch.testing.assert_close(report.shared.predicted, torch.tensor(real, dtype=torch.float64).reshape(-1), rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("optimizer", sorted(OPTIMISERS))
def test_whole_group_events_give_the_same_figures_under_either_rule(optimizer):
    """Every whole-group event the subset rule probes has, field by field, the figures the whole-group rule gives it."""
    fields = ("coef", "direct", "cross", "measured", "value", "momentum", "decay")
    reports = {}
    for rule in ("subset", "whole"):
        model = SharedWeightsLM(max_len=6, seed=3)
        gen = torch.Generator().manual_seed(4)
        prefix = torch.randint(0, 3, (2, 2), generator=gen)  # each group's common first two tokens: whole-group events
        batch = random_batch(model, 4)
        tokens = batch.tokens.clone()
        tokens[:5, :2], tokens[5:, :2] = prefix[0], prefix[1]
        batch = DriftBatch(
            tokens=tokens, mask=torch.ones_like(batch.mask), group_ids=batch.group_ids, advantages=batch.advantages, old_logp=batch.old_logp
        )
        reports[rule] = probe_step(
            scorer(model, batch), OPTIMISERS[optimizer](model.parameters()), batch, "gspo", max_events=64, events=rule
        )
    sub, whole = reports["subset"], reports["whole"]
    assert whole.found == whole.found_whole == sub.found_whole == len(whole.shared) >= 4 and sub.found > sub.found_whole
    index = {tuple(w): k for k, w in enumerate(sub.shared.where.tolist())}
    for k, w in enumerate(whole.shared.where.tolist()):
        j = index[tuple(w)]
        assert bool(sub.shared.whole[j])
        for f in fields:
            assert float(getattr(sub.shared, f)[j]) == float(getattr(whole.shared, f)[k]), f
