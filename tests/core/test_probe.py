"""The parameter-space drift probe (dfpo.core.probe): first order against a real step, the tabular closed form,
the split's invariants, and its refusals."""

from __future__ import annotations

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


def test_predicted_is_direct_plus_cross_and_restores_the_model():
    model = TinyLM()
    batch = grouped_batch(model, 2)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    report = probe_step(scorer(model, batch), opt, batch, "gspo_noclip")
    assert len(report.shared) > 0 and len(report.pairs) > 0
    for e in (report.shared, report.pairs):
        torch.testing.assert_close(e.predicted, e.direct + e.cross)
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
    """A shared event's coefficient is sum_i d L / d log pi_i,t over the group, as dfpo.core.metrics reads it."""
    from dfpo.core.loss import policy_loss
    from dfpo.core.metrics import shared_mask, shared_residual

    model = TinyLM()
    batch = grouped_batch(model, 5)
    report = probe_step(scorer(model, batch), torch.optim.SGD(model.parameters(), lr=0.01), batch, "gspo_noclip")
    logp = torch.where(batch.mask, model(batch.tokens), 0.0).detach().requires_grad_()
    loss, _ = policy_loss(
        "gspo_noclip", logp=logp, old_logp=batch.old_logp, advantages=batch.advantages, mask=batch.mask, group_ids=batch.group_ids
    )
    (coef,) = torch.autograd.grad(loss, logp)
    res = shared_residual(coef, shared_mask(batch.tokens, batch.mask, batch.group_ids), batch.group_ids)
    assert math.isclose(float(report.shared.coef.abs().sum()), float(res.net.sum()), rel_tol=1e-9)


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
