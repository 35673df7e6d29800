"""Eq 2's shared events held by part of a group (dfpo.core.metrics.shared_events / event_residual) against a plain
loop, the whole-group events against today's shared_residual, and the residual's length part (eq 67's 1/|y_i|)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core import metrics


def reference_events(keys, mask, group_ids, prefix=True):
    """{(group, t, members): None} by plain loops: members (a sorted tuple of rows, two or more) hold the same key at t
    and, with ``prefix``, the same keys at 0..t, every one of them real there."""
    B, T = keys.shape
    out = {}
    for g in sorted(set(group_ids.tolist())):
        rows = [i for i in range(B) if int(group_ids[i]) == g]
        for t in range(T):
            classes: dict = {}
            for i in rows:
                span = range(t + 1) if prefix else [t]
                if not all(bool(mask[i, s]) for s in span):
                    continue
                classes.setdefault(tuple(int(keys[i, s]) for s in span), []).append(i)
            for members in classes.values():
                if len(members) >= 2:
                    out[(g, t, tuple(members))] = None
    return list(out)


def reference_residual(coef, events):
    """(sum over events of |sum_S c|, sum over events of sum_S |c|) by loops, in float64."""
    net = gross = 0.0
    for _, t, members in events:
        values = [float(coef[i, t]) for i in members]
        net += abs(sum(values))
        gross += sum(abs(v) for v in values)
    return net, gross


def _as_set(ev: metrics.SharedEvents):
    """The events of ``shared_events`` in the reference's form."""
    out = set()
    for e in range(ev.sizes.numel()):
        rows = tuple(sorted(ev.ids[:, int(ev.positions[e])].eq(e).nonzero().flatten().tolist()))
        out.add((int(ev.groups[e]), int(ev.positions[e]), rows))
    return out


@st.composite
def batches(draw, prefix_mask: bool = True):
    """Rows in 1-3 groups with 1-5 members each, tokens from a 1-3 letter alphabet (so prefixes are often shared),
    real tokens a prefix of each row (or, with ``prefix_mask`` False, any pattern), coefficients of both signs."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    T = draw(st.integers(1, 6))
    alphabet = draw(st.integers(1, 3))
    B = sum(sizes)
    group_ids = torch.tensor([g * 3 + 1 for g, n in enumerate(sizes) for _ in range(n)])
    perm = torch.tensor(draw(st.permutations(list(range(B)))))
    group_ids = group_ids[perm]  # groups interleaved
    keys = torch.tensor(draw(st.lists(st.lists(st.integers(0, alphabet - 1), min_size=T, max_size=T), min_size=B, max_size=B)))
    if prefix_mask:
        lengths = draw(st.lists(st.integers(0, T), min_size=B, max_size=B))
        mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    else:
        mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B)))
    coef = torch.tensor(
        draw(st.lists(st.lists(st.floats(-2, 2, allow_nan=False, width=32), min_size=T, max_size=T), min_size=B, max_size=B))
    )
    return keys, mask, group_ids, coef


@settings(max_examples=150, deadline=None)
@given(batches(), st.booleans())
def test_shared_events_and_their_residual_equal_the_loop_reference(batch, prefix):
    """Every subset of two or more members of a group with the same key at t (and at 0..t with prefix) is one event,
    and the residual sums over those events are the loop's."""
    keys, mask, group_ids, coef = batch
    ev = metrics.shared_events(keys, mask, group_ids, prefix=prefix)
    ref = reference_events(keys, mask, group_ids, prefix=prefix)
    assert _as_set(ev) == set(ref) and ev.sizes.numel() == len(ref)
    assert sorted(ev.sizes.tolist()) == sorted(len(m) for _, _, m in ref)
    net, gross = metrics.event_residual(coef, ev)
    ref_net, ref_gross = reference_residual(coef, ref)
    assert float(net.sum()) == pytest.approx(ref_net, rel=1e-12, abs=1e-12)
    assert float(gross.sum()) == pytest.approx(ref_gross, rel=1e-12, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(batches(prefix_mask=False), st.booleans())
def test_the_residual_over_events_a_whole_group_holds_is_todays_shared_residual(batch, prefix):
    """The events whose size is their group's size are shared_mask's positions, and their residual is
    shared_residual's (any mask, both keys)."""
    keys, mask, group_ids, coef = batch
    ev = metrics.shared_events(keys, mask, group_ids, prefix=prefix)
    net, gross = metrics.event_residual(coef, ev)
    whole = ev.whole
    old = metrics.shared_residual(coef, metrics.shared_mask(keys, mask, group_ids, prefix=prefix), group_ids)
    assert int(whole.sum()) == int(old.positions.sum())
    torch.testing.assert_close(net[whole].sum(), old.net.sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gross[whole].sum(), old.gross.sum(), rtol=1e-12, atol=1e-12)


def test_events_by_hand():
    """Group 0: rows 0, 1, 2 share token 5 at t = 0; rows 0 and 1 share 5 6 up to t = 1, then part; row 2 took 7.
    Group 1: rows 3, 4 share 5 at t = 0 but row 4 is padding from t = 1. 5 events, one whole-group in each group."""
    keys = torch.tensor([[5, 6, 8], [5, 6, 9], [5, 7, 8], [5, 6, 8], [5, 6, 8]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 0]]).bool()
    groups = torch.tensor([0, 0, 0, 1, 1])
    coef = torch.tensor([[1.0, 2.0, 0.0], [-0.5, 1.0, 0.0], [-0.5, 3.0, 0.0], [0.25, 0.0, 0.0], [-0.75, 0.0, 0.0]])
    ev = metrics.shared_events(keys, mask, groups)
    assert _as_set(ev) == {(0, 0, (0, 1, 2)), (0, 1, (0, 1)), (1, 0, (3, 4))}
    net, gross = metrics.event_residual(coef, ev)
    assert float(net.sum()) == pytest.approx(0.0 + 3.0 + 0.5) and float(gross.sum()) == pytest.approx(2.0 + 3.0 + 1.0)
    assert ev.whole.tolist() == [s == g for s, g in zip(ev.sizes.tolist(), ev.group_sizes.tolist(), strict=True)]
    assert int(ev.whole.sum()) == 2


def _grpo_coef(lengths: list[int], advantages: list[float], T: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(coef, mask): d L / d logp of on-policy GRPO (seq_mean_token_mean) on one group of the given lengths."""
    from dfpo import policy_loss

    G = len(lengths)
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]  # (G, T)
    logp = (-torch.rand(G, T, generator=torch.Generator().manual_seed(3)) - 0.1).requires_grad_()
    loss, _ = policy_loss(
        "grpo",
        logp=logp,
        old_logp=logp.detach(),
        advantages=torch.tensor(advantages),
        mask=mask,
        group_ids=torch.zeros(G, dtype=torch.long),
    )
    (coef,) = torch.autograd.grad(loss, logp)
    return coef, mask


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(1, 8), st.lists(st.floats(-2, 2, allow_nan=False), min_size=6, max_size=6))
def test_a_group_of_identical_members_cancels_under_grpo_at_equal_lengths(G, L, raw):
    """Identical completions of equal length, advantages summing to 0: GRPO's on-policy coefficients leave a residual
    at float32 rounding (eq 2 holds), and its length part is exactly 0."""
    adv = torch.tensor(raw[:G], dtype=torch.float64)
    adv = (adv - adv.mean()).float().tolist()
    coef, mask = _grpo_coef([L] * G, adv)
    keys = torch.full((G, 8), 4)
    ev = metrics.shared_events(keys, mask, torch.zeros(G, dtype=torch.long))
    assert ev.sizes.numel() == L and bool(ev.whole.all())
    net, gross = metrics.event_residual(coef, ev)
    assert float(net.sum()) <= 1e-6 * float(gross.sum()) + 1e-30
    equal = metrics.equal_weight_coef(coef, metrics.sequence_weights(mask, "seq_mean_token_mean"), torch.zeros(G, dtype=torch.long))
    assert torch.equal(equal, coef.double())  # equal weights: c' = c, so the length part is exactly 0


def test_grpos_residual_at_unequal_lengths_is_its_length_part():
    """A whole group shares its first 3 tokens, lengths 3, 5, 8, 6: GRPO's residual there is large (the 1/|y_i| of
    eq 67 break exchangeability), and the same coefficients with equal weights cancel, so the length part is all of it."""
    lengths, adv = [3, 5, 8, 6], [1.0, -1.0, 0.5, -0.5]
    coef, mask = _grpo_coef(lengths, adv)
    keys = torch.cat([torch.full((4, 3), 1), 10 + torch.arange(20).reshape(4, 5)], dim=1)  # (4, 8) shared prefix, own tokens
    rows = torch.zeros(4, dtype=torch.long)
    ev = metrics.shared_events(keys, mask, rows)
    assert ev.sizes.tolist() == [4, 4, 4]
    net, gross = metrics.event_residual(coef, ev)
    equal, _ = metrics.event_residual(metrics.equal_weight_coef(coef, metrics.sequence_weights(mask, "seq_mean_token_mean"), rows), ev)
    assert float(net.sum() / gross.sum()) > 0.05
    assert float(equal.sum()) < 1e-6 * float(gross.sum())  # the rest: 0 up to rounding
    for aggregation in ("token_mean", "constant", "seq_mean_token_sum"):  # one weight for every sequence: no length part
        assert torch.equal(metrics.equal_weight_coef(coef, metrics.sequence_weights(mask, aggregation), rows), coef.double())


def test_trainers_diagnostics_count_partial_events_and_the_length_part():
    """StepDiagnostics sums every event (whole or partial) and keeps the whole-group sums apart; the length part is 0
    without the aggregation, and diagnostic_metrics logs all of them."""
    from dfpo.trainer.diagnostics import StepDiagnostics
    from dfpo.trainer.stages.metrics import diagnostic_metrics

    keys = torch.tensor([[5, 6, 8], [5, 6, 9], [5, 7, 8], [5, 6, 8], [5, 6, 8]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 0, 0]]).bool()
    groups = torch.tensor([0, 0, 0, 1, 1])
    coef = torch.tensor([[1.0, 2.0, 0.0], [-0.5, 1.0, 0.0], [-0.5, 3.0, 0.0], [0.25, 0.0, 0.0], [-0.75, 0.0, 0.0]])
    ones = torch.ones_like(coef)
    d = StepDiagnostics()
    d.add(coef, ones, ones, keys, mask, groups, None)
    assert (d.events, d.shared_positions) == (3, 2)
    assert (d.event_num, d.event_den) == pytest.approx((3.5, 6.0)) and (d.shared_num, d.shared_den) == pytest.approx((0.5, 3.0))
    assert d.length_num == 0.0
    d.add(coef, ones, ones, keys, mask, groups, None, "seq_mean_token_mean")  # lengths 3 3 3 | 3 1
    # the length part: group 1's weights 1/3 and 1 -> mean 2/3: c' = 0.25 * 2 and -0.75 * 2/3 -> |0.5 - 0.5| = 0 vs 0.5
    assert d.length_num == pytest.approx(0.5)
    m = diagnostic_metrics(d)
    assert m["diag/shared_events"] == 6 and m["diag/shared_positions"] == 4
    assert m["diag/shared_residual"] == pytest.approx(7.0 / 12.0)
    assert m["diag/shared_residual_length"] == pytest.approx(0.5 / 12.0)
    assert m["diag/shared_residual_whole"] == pytest.approx(1.0 / 6.0)
    assert m["diag/shared_coef_whole"] == pytest.approx(6.0)  # twice the micro-batch's 3.0: the residual's denominator
    assert diagnostic_metrics(StepDiagnostics())["diag/shared_coef_whole"] == 0.0  # logged at 0 (0/0 has no residual)
    merged = StepDiagnostics()
    merged.merge(d)
    merged.merge(d)  # what the data-parallel strategy does with every process's sums
    assert (merged.events, merged.event_num, merged.length_num) == (12, pytest.approx(14.0), pytest.approx(1.0))
