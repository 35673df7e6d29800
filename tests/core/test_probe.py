"""The parameter-space drift probe (dfpo.core.probe): first order against a real step, the tabular closed form,
the split's invariants, and its refusals."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core.loss import group_advantages
from dfpo.core.param_atlas import SharedWeightsLM
from dfpo.core.probe import DriftBatch, equivalent_pairs, preconditioner, probe_step, shared_events, spread, summary


def TinyLM(seed: int = 0) -> SharedWeightsLM:
    """The parameter-space atlas's shared-weights model, six positions long."""
    return SharedWeightsLM(max_len=6, seed=seed)


def grouped_batch(model: SharedWeightsLM, seed: int, *, groups: int = 3, size: int = 4, T: int = 5, off_policy: float = 0.2) -> DriftBatch:
    """Groups whose completions share a prefix of 2 tokens (so there are shared events) and end differently; the
    first two rows of each group are correct, one of them a different sequence (an equivalent pair)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(groups):
        prefix = torch.randint(0, 6, (2,), generator=gen)
        for _ in range(size):
            rows.append(torch.cat([prefix, torch.randint(0, 6, (T - 2,), generator=gen)]))
    tokens = torch.stack(rows)  # (B, T)
    B = tokens.shape[0]
    lengths = torch.randint(3, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    group_ids = torch.arange(groups).repeat_interleave(size)
    correct = torch.zeros(B, dtype=torch.bool)
    correct[0::size] = correct[1::size] = True
    rewards = correct.double()
    with torch.no_grad():
        old = model(tokens) + off_policy * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = group_advantages(rewards, group_ids)
    return DriftBatch(tokens=tokens, mask=mask, group_ids=group_ids, advantages=adv, old_logp=torch.where(mask, old, 0.0), correct=correct)


def scorer(model: SharedWeightsLM, batch: DriftBatch):
    return lambda rows: (torch.where(batch.mask[rows], model(batch.tokens[rows]), 0.0), None)


def first_order_error(lr: float, objective: str = "gspo_noclip") -> tuple[float, float]:
    model = TinyLM()
    batch = grouped_batch(model, 1)
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=lr), batch, objective)
    events = [report.shared, report.pairs]
    err = max(float((e.measured - e.predicted).abs().max()) for e in events)
    size = max(float(e.measured.abs().max()) for e in events)
    return err, size


def test_sgd_prediction_is_first_order():
    """Halving eta divides the error of the first-order prediction by about four (it is O(eta^2))."""
    errors = [first_order_error(lr)[0] for lr in (0.08, 0.04, 0.02)]
    sizes = [first_order_error(lr)[1] for lr in (0.08, 0.04, 0.02)]
    assert all(s > 1e-5 for s in sizes)  # the step really moves the events
    for big, small in zip(errors, errors[1:]):
        assert 3.2 < big / small < 4.8, errors


def test_predicted_is_the_sum_of_the_four_parts_and_restores_the_model():
    model = TinyLM()
    batch = grouped_batch(model, 2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    report = probe_step(scorer(model, batch), opt, batch, "gspo_noclip")
    assert len(report.shared) > 0 and len(report.pairs) > 0
    for e in (report.shared, report.pairs):
        torch.testing.assert_close(e.predicted, e.direct + e.cross + e.momentum + e.decay)
        assert bool(e.decay.abs().max() > 0)  # AdamW's weight decay has a part of its own
        assert bool(torch.isfinite(e.measured).all())
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)
    assert not opt.state  # the optimiser's state is put back as it was (none before the first step)


def test_adamw_prediction_tracks_the_measured_change():
    """With AdamW the prediction projects the real update: at a small lr it matches the re-forward closely."""
    model = TinyLM()
    batch = grouped_batch(model, 3)
    report = probe_step(scorer(model, batch), torch.optim.AdamW(model.parameters(), lr=1e-4), batch, "grpo")
    e = report.shared
    assert float((e.measured - e.predicted).abs().max()) < 1e-3 * float(e.measured.abs().max()) + 1e-12


def test_keep_step_keeps_the_update():
    model = TinyLM()
    batch = grouped_batch(model, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    probe_step(scorer(model, batch), opt, batch, "grpo", keep_step=True)
    assert any(not torch.equal(p.detach(), b) for p, b in zip(model.parameters(), before))


def test_the_shared_coefficient_is_eq_2s_residual():
    """A shared event's coefficient is sum_i d L / d log pi_i,t over its members, as dfpo.core.metrics reads it: over
    the whole group under the "whole" rule (shared_residual), over the subset S under the "subset" rule
    (event_residual)."""
    from dfpo.core.loss import policy_loss
    from dfpo.core.metrics import event_residual, shared_mask, shared_residual
    from dfpo.core.metrics import shared_events as subset_events

    model = TinyLM()
    batch = grouped_batch(model, 5)
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "gspo_noclip", events="whole")
    subset = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "gspo_noclip", max_events=64)
    logp = torch.where(batch.mask, model(batch.tokens), 0.0).detach().requires_grad_()
    loss, _ = policy_loss(
        "gspo_noclip", logp=logp, old_logp=batch.old_logp, advantages=batch.advantages, mask=batch.mask, group_ids=batch.group_ids
    )
    (coef,) = torch.autograd.grad(loss, logp)
    res = shared_residual(coef, shared_mask(batch.tokens, batch.mask, batch.group_ids), batch.group_ids)
    assert math.isclose(float(report.shared.coef.abs().sum()), float(res.net.sum()), rel_tol=1e-9)
    net, _ = event_residual(coef, subset_events(batch.tokens, batch.mask, batch.group_ids))
    assert len(subset.shared) == net.numel() > len(report.shared)
    assert math.isclose(float(subset.shared.coef.abs().sum()), float(net.sum()), rel_tol=1e-9)


# ----------------------------------------------------------------------------- property


class OneParameterPerEvent(torch.nn.Module):
    """log pi of a token = log sigmoid of a parameter of its own (context = the whole prefix, then the token), so
    distinct events have orthogonal gradients and a shared event's copies one parameter."""

    def __init__(self, keys: list[tuple], seed: int):
        super().__init__()
        self.index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        gen = torch.Generator().manual_seed(seed)
        self.theta = torch.nn.Parameter(torch.randn(len(self.index), generator=gen, dtype=torch.float64))

    def forward(self, tokens: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        idx = torch.tensor(
            [[self.index[(int(g), *tokens[i, : t + 1].tolist())] for t in range(tokens.shape[1])] for i, g in enumerate(group_ids)]
        )
        return torch.nn.functional.logsigmoid(self.theta[idx])  # (B, T)


@settings(max_examples=30)
@given(
    size=st.integers(2, 5),
    T=st.integers(2, 5),
    prefix=st.integers(0, 5),
    seed=st.integers(0, 2**16),
    optimizer=st.sampled_from(["sgd", "adamw"]),
)
def test_one_group_equal_coefficients_orthogonal_events_have_no_cross_term(size, T, prefix, seed, optimizer):
    """With one group, equal coefficients and orthogonal per-event gradients the cross term is zero."""
    gen = torch.Generator().manual_seed(seed)
    prefix = min(prefix, T - 1)
    shared = torch.randint(0, 3, (prefix,), generator=gen)
    # after the shared prefix each completion branches off on a token of its own: every (context, token) event is
    # held by the whole group (a shared event) or by one completion, never by part of the group
    tokens = torch.stack(
        [torch.cat([shared, torch.tensor([10 + i]), torch.randint(0, 3, (T - prefix - 1,), generator=gen)]) for i in range(size)]
    )
    group_ids = torch.zeros(size, dtype=torch.long)
    keys = [(0, *tokens[i, : t + 1].tolist()) for i in range(size) for t in range(T)]
    model = OneParameterPerEvent(keys, seed)
    mask = torch.ones(size, T, dtype=torch.bool)
    correct = torch.ones(size, dtype=torch.bool)
    with torch.no_grad():
        old = model(tokens, group_ids)
    # equal coefficients: on-policy GRPO with equal lengths and one advantage for every row gives c_it = -A / (B T)
    adv = torch.full((size,), 0.5, dtype=torch.float64)
    batch = DriftBatch(tokens=tokens, mask=mask, group_ids=group_ids, advantages=adv, old_logp=old, correct=correct)
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    )
    report = probe_step(lambda r: (model(tokens[r], group_ids[r]), None), opt, batch, "grpo", max_events=64)
    for e in (report.shared, report.pairs):
        assert float(e.cross.abs().sum()) < 1e-12


# ----------------------------------------------------------------------------- events and refusals


def test_the_exact_cancellation_arm_leaves_whole_group_events_no_coefficient_and_no_direct_part():
    """Under cancel=shared_whole a token every completion of a group holds gets no gradient (issue 58): the probe's
    whole-group events have coefficient 0 and direct part 0, where the control's do not."""
    model = TinyLM()
    batch = grouped_batch(model, 5)
    arm = probe_step(
        scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "gspo_noclip:cancel=shared_whole", events="whole"
    )
    control = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "gspo_noclip", events="whole")
    assert len(arm.shared) == len(control.shared) > 0
    assert float(arm.shared.coef.abs().max()) == 0.0 and float(arm.shared.direct.abs().max()) == 0.0
    assert float(control.shared.coef.abs().max()) > 0.0


def test_events_and_pairs():
    tokens = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 3], [7, 7, 7], [7, 7, 8]])
    mask = torch.ones(5, 3, dtype=torch.bool)
    groups = torch.tensor([0, 0, 0, 1, 1])
    assert shared_events(tokens, mask, groups).tolist() == [[0, 0], [3, 0], [3, 1]]
    correct = torch.tensor([True, True, True, True, False])
    assert equivalent_pairs(tokens, mask, groups, correct).tolist() == [[0, 1], [1, 2]]
    same = torch.tensor([[1, 2], [1, 2]])
    assert equivalent_pairs(
        same, torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool)
    ).shape == (0, 2)
    items = torch.arange(10).reshape(5, 2)
    assert spread(items, torch.tensor([0, 0, 0, 1, 1]), 3).tolist() == [[0, 1], [2, 3], [6, 7]]


def test_max_events_bounds_the_probe():
    model = TinyLM()
    batch = grouped_batch(model, 6)
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "grpo", max_events=1)
    assert len(report.shared) == 1 and len(report.pairs) == 1
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "grpo", max_events=0)
    assert len(report.shared) == 0 and len(report.pairs) == 0 and summary(report.shared) == {}


def test_refusals_are_one_sentence():
    model = TinyLM()
    batch = grouped_batch(model, 7)
    with pytest.raises(ValueError, match="max_events must be >= 0"):
        probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "grpo", max_events=-1)
    with pytest.raises(ValueError, match="SGD, Adam and AdamW"):
        probe_step(scorer(model, batch), torch.optim.Adagrad(model.parameters(), lr=0.01), batch, "grpo")
    with pytest.raises(ValueError, match="nesterov"):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        preconditioner(opt, list(model.parameters()), had_momentum=[True, True, True])


def test_summary_is_finite_and_reads_the_split():
    model = TinyLM()
    batch = grouped_batch(model, 8)
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.05), batch, "gspo_noclip")
    s = summary(report.shared)
    assert set(s) >= {"direct", "cross", "measured", "error", "cross_share"}
    assert 0 <= s["cross_share"] <= 1 and all(math.isfinite(v) for v in s.values())


# ----------------------------------------------------------------------------- the four parts (issue 45 items 1, 3, 12)


class WithUnused(torch.nn.Module):
    """The shared-weights model beside a Linear the score never reaches (``use_extra``: reach it, to give it state)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.lm = TinyLM(seed)
        self.extra = torch.nn.Linear(3, 2, dtype=torch.float64)
        self.use_extra = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.lm(tokens)  # (B, T)
        if self.use_extra:
            out = out + 1e-3 * self.extra.weight.sum() + 1e-3 * self.extra.bias.sum()
        return out


def _event_grad(model: torch.nn.Module, batch: DriftBatch, row: int, t: int) -> list[torch.Tensor]:
    """grad_theta log pi(e) of the shared event at (row, t), at the model's current parameters, by autograd alone."""
    logp = torch.where(batch.mask, model(batch.tokens), 0.0)  # (B, T)
    return [
        torch.zeros_like(p) if g is None else g
        for p, g in zip(model.parameters(), torch.autograd.grad(logp[row, t], list(model.parameters()), allow_unused=True))
    ]


def _real_projection(model, batch, opt, objective: str, **kw) -> tuple[object, torch.Tensor]:
    """The probe's report of one step, and <g_e, Delta theta> of each shared event from the real step (keep_step,
    then the parameters' difference), g_e by autograd at theta_0: an independent predicted (n,)."""
    theta0 = [p.detach().clone() for p in model.parameters()]
    grads = None
    report = probe_step(scorer(model, batch), opt, batch, objective, keep_step=True, max_events=64, **kw)
    theta1 = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, t0 in zip(model.parameters(), theta0):
            p.copy_(t0)
    out = []
    for row, t in report.shared.where.tolist():
        grads = _event_grad(model, batch, row, t)
        out.append(sum(float((g * (t1 - t0)).sum()) for g, t0, t1 in zip(grads, theta0, theta1)))
    with torch.no_grad():
        for p, t1 in zip(model.parameters(), theta1):
            p.copy_(t1)
    return report, torch.tensor(out, dtype=torch.float64)


OPTIMISERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05),
    "sgd_momentum_wd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "adam_wd": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01),
    "adamw_wd": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_momentum_is_zero_without_earlier_state_and_carries_it_after_move_steps(name):
    """Invariant: direct + cross + momentum + decay = <g_e, Delta theta> of the real update (computed apart here);
    momentum is 0 (to float64 rounding) on the first step and on plain SGD, and not 0 after two kept steps of an
    optimiser with momentum."""
    model = TinyLM()
    batch = grouped_batch(model, 11)
    opt = OPTIMISERS[name](model.parameters())
    first, real = _real_projection(model, batch, opt, "gspo")
    e = first.shared
    assert len(e) > 0
    torch.testing.assert_close(e.direct + e.cross + e.momentum + e.decay, real, rtol=1e-9, atol=1e-14)
    assert float(e.momentum.abs().max()) <= 1e-9 * float(real.abs().max())  # no earlier state: nothing from it
    for _ in range(2):  # the move steps
        probe_step(scorer(model, batch), opt, batch, "gspo", max_events=0, keep_step=True)
    later, real = _real_projection(model, batch, opt, "gspo")
    e = later.shared
    torch.testing.assert_close(e.direct + e.cross + e.momentum + e.decay, real, rtol=1e-9, atol=1e-14)
    if name == "sgd":  # plain SGD has no state: still nothing
        assert float(e.momentum.abs().max()) <= 1e-9 * float(real.abs().max())
    else:
        assert float(e.momentum.abs().max()) > 1e-3 * float(real.abs().max())
    s = summary(e)
    shares = [s.get(f"{part}_share", 0.0) for part in ("direct", "cross", "momentum", "decay")]
    assert math.isclose(sum(shares), 1.0, rel_tol=1e-12)  # shares of the first-order prediction add up to 1


def test_decay_is_weight_decays_own_update():
    """AdamW's decay part is <g_e, -lr wd theta_0> (decoupled); Adam's coupled decay goes through P and is 0 without
    weight_decay."""
    model = TinyLM()
    batch = grouped_batch(model, 12)
    theta0 = [p.detach().clone() for p in model.parameters()]
    report = probe_step(scorer(model, batch), torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1), batch, "gspo")
    row, t = report.shared.where[0].tolist()
    g = _event_grad(model, batch, row, t)
    expected = sum(float((gk * (-1e-3 * 0.1 * t0)).sum()) for gk, t0 in zip(g, theta0))
    assert math.isclose(float(report.shared.decay[0]), expected, rel_tol=1e-10)
    plain = probe_step(scorer(model, batch), torch.optim.Adam(model.parameters(), lr=1e-3), batch, "gspo")
    assert float(plain.shared.decay.abs().max()) == 0.0 and float(plain.pairs.decay.abs().max()) == 0.0


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_a_parameter_without_a_gradient_has_no_part(kind):
    """Adam/AdamW skip a parameter whose gradient is None (no state on the first step, stale state later): the
    probe gives it P = 0 instead of raising KeyError 'step', and the four parts still add up to the real update."""
    model = WithUnused()
    batch = grouped_batch(model.lm, 13)
    make = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    opt = make(model.parameters(), lr=1e-3, weight_decay=0.1)
    report, real = _real_projection(model, batch, opt, "gspo")  # first step: the unused Linear has no state
    e = report.shared
    torch.testing.assert_close(e.predicted, real, rtol=1e-9, atol=1e-14)
    assert model.extra not in opt.state or not opt.state[model.extra.weight]
    for _ in range(2):  # later steps, the Linear still unused
        probe_step(scorer(model, batch), opt, batch, "gspo", max_events=4, keep_step=True)
    report, real = _real_projection(model, batch, opt, "gspo")
    torch.testing.assert_close(report.shared.predicted, real, rtol=1e-9, atol=1e-14)
    model.use_extra = True  # now it gets a gradient and state ...
    probe_step(scorer(model, batch), opt, batch, "gspo", max_events=4, keep_step=True)
    assert "step" in opt.state[model.extra.weight]
    model.use_extra = False  # ... and then none again: its stale state must not enter P
    report, real = _real_projection(model, batch, opt, "gspo")
    torch.testing.assert_close(report.shared.predicted, real, rtol=1e-9, atol=1e-14)


def test_clipping_scales_the_direct_term():
    """With the gradient clipped (s < 1), direct = -s (sum_i c_i,t) lr |g_e|^2 under SGD, s = max_norm / (|grad L| +
    1e-6) computed here apart from the probe; without s the direct term would be 1/s times larger."""
    from dfpo.core.loss import policy_loss

    model = TinyLM()
    batch = grouped_batch(model, 14)
    logp = torch.where(batch.mask, model(batch.tokens), 0.0)  # (B, T)
    loss, _ = policy_loss(
        "gspo", logp=logp, old_logp=batch.old_logp, advantages=batch.advantages, mask=batch.mask, group_ids=batch.group_ids
    )
    coef, *grads = torch.autograd.grad(loss, [logp, *model.parameters()], retain_graph=True)
    norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
    max_norm = 0.1 * norm
    s = max_norm / (norm + 1e-6)
    lr = 0.05
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=lr), batch, "gspo", max_grad_norm=max_norm)
    assert math.isclose(report.grad_scale, s, rel_tol=1e-9) and s < 0.2
    e = report.shared
    assert len(e) > 0
    for k, (row, t) in enumerate(e.where.tolist()):
        holds = [  # the event's members S: the row's group-mates with its tokens at 0..t, all real
            i
            for i in range(batch.tokens.shape[0])
            if batch.group_ids[i] == batch.group_ids[row]
            and bool(batch.mask[i, : t + 1].all())
            and torch.equal(batch.tokens[i, : t + 1], batch.tokens[row, : t + 1])
        ]
        c_sum = float(coef[holds, t].sum())
        g = _event_grad(model, batch, row, t)
        sq = sum(float((x * x).sum()) for x in g)
        batch_part = -lr * s * sum(float((x * y).sum()) for x, y in zip(g, grads))
        assert math.isclose(float(e.direct[k]), -s * c_sum * lr * sq, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(float(e.direct[k] + e.cross[k]), batch_part, rel_tol=1e-9, abs_tol=1e-15)
    assert float(e.direct.abs().max()) > 0


def test_summary_shares_are_of_the_first_order_prediction():
    from dfpo.core.probe import EventDrift

    where = torch.zeros(2, 2, dtype=torch.long)
    f = lambda *x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    e = EventDrift(where, f(1, 1), f(1, -1), f(2, 2), f(10, -10), f(0, 0), momentum=f(-3, 3), decay=f(0, 0))
    s = summary(e)
    assert s["direct_share"] == pytest.approx(2 / 12) and s["cross_share"] == pytest.approx(4 / 12)
    assert s["momentum_share"] == pytest.approx(6 / 12) and s["decay_share"] == 0.0
    assert s["batch_cross_share"] == pytest.approx(4 / 6)
    assert s["predicted"] == pytest.approx(2.0) and s["error"] == pytest.approx(12.0) and s["error_ratio"] == pytest.approx(12 / 10)
    still = summary(EventDrift(where, f(0, 0), f(0, 0), f(0, 0), f(0, 0), f(0, 0)))
    assert "cross_share" not in still and "error_ratio" not in still and still["momentum"] == 0.0


def test_an_optimiser_the_probe_cannot_read_leaves_the_model_as_it_was():
    """The Adagrad refusal comes after its step; the parameters and the optimiser's state are put back before it."""
    model = TinyLM()
    batch = grouped_batch(model, 7)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adagrad(model.parameters(), lr=0.5)
    state = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match="SGD, Adam and AdamW"):
        probe_step(scorer(model, batch), opt, batch, "grpo", keep_step=True)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(torch.equal(a["sum"], b["sum"]) for a, b in zip(state["state"].values(), opt.state_dict()["state"].values(), strict=True))
