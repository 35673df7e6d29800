"""Tests that bite the drift probe's optimiser split and its first-order flags (issue 57 item 11, mutation/probe.toml):
the preconditioner P against real SGD and Adam steps, momentum and decay apart on equivalent pairs, Adam's decoupled
weight decay, no error ratio where nothing moved, and the flag's worst seed, mean and limit."""

from __future__ import annotations

import math

import pytest
import torch

from dfpo.core.drift_tables import first_order_flags
from dfpo.core.loss import group_advantages
from dfpo.core.param_atlas import SharedWeightsLM
from dfpo.core.probe import DriftBatch, EventDrift, preconditioner, probe_step, summary


def _stepped(opt: torch.optim.Optimizer, p: torch.nn.Parameter, grad: torch.Tensor) -> torch.Tensor:
    """The update (Delta p) of one step of ``opt`` with gradient ``grad``."""
    before = p.detach().clone()
    p.grad = grad.clone()
    opt.step()
    return p.detach() - before


def test_sgds_preconditioner_is_lr_then_lr_times_one_minus_dampening_as_the_real_update():
    """Heavy-ball SGD (momentum 0.9, dampening 0.3): the first step's buffer is the gradient (P = lr); later the
    gradient enters the buffer damped: Delta = -lr (0.9 b + 0.7 g), so this step's part is -lr 0.7 g."""
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.3)
    g1, g2 = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), torch.tensor([0.3, 0.4, -1.0], dtype=torch.float64)
    d1 = _stepped(opt, p, g1)
    (P1,) = preconditioner(opt, [p], had_momentum=[False], stepped=[True])
    torch.testing.assert_close(-P1 * g1, d1, rtol=1e-12, atol=0)
    d2 = _stepped(opt, p, g2)
    (P2,) = preconditioner(opt, [p], had_momentum=[True], stepped=[True])
    torch.testing.assert_close(-P2 * g2, d2 + 0.1 * 0.9 * g1, rtol=1e-12, atol=1e-15)  # the update less the buffer's part


@pytest.mark.parametrize("steps", [1, 3])
def test_adams_preconditioner_is_this_gradients_part_of_the_real_update(steps):
    """From one state, a step with g and one with -g see the same second moment (g^2) and first moments
    beta1 m +- (1 - beta1) g: half their updates' difference is this gradient's part, -P g, whatever P's formula."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(4, dtype=torch.float64))
    opt = torch.optim.Adam([p], lr=1e-2, betas=(0.9, 0.999), eps=1e-8)
    for _ in range(steps - 1):
        _stepped(opt, p, torch.randn(4, dtype=torch.float64))
    g = torch.randn(4, dtype=torch.float64)
    state, theta = {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}, p.detach().clone()
    minus = _stepped(opt, p, -g)
    with torch.no_grad():
        p.copy_(theta)
    opt.state[p] = state
    plus = _stepped(opt, p, g)
    (P,) = preconditioner(opt, [p], had_momentum=[False], stepped=[True])
    torch.testing.assert_close(-P * g, (plus - minus) / 2, rtol=1e-9, atol=1e-15)


def _batch(model: SharedWeightsLM, seed: int) -> DriftBatch:
    """Three groups of four completions sharing a 2-token prefix; two correct rows a group (an equivalent pair)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(3):
        prefix = torch.randint(0, 6, (2,), generator=gen)
        rows += [torch.cat([prefix, torch.randint(0, 6, (3,), generator=gen)]) for _ in range(4)]
    tokens = torch.stack(rows)  # (12, 5)
    mask = torch.arange(5)[None, :] < torch.randint(3, 6, (12,), generator=gen)[:, None]  # (12, 5)
    groups = torch.arange(3).repeat_interleave(4)
    correct = torch.zeros(12, dtype=torch.bool)
    correct[0::4] = correct[1::4] = True
    with torch.no_grad():
        old = model(tokens) + 0.2 * torch.randn(12, 5, generator=gen, dtype=torch.float64)
    adv = group_advantages(correct.double(), groups)
    return DriftBatch(tokens=tokens, mask=mask, group_ids=groups, advantages=adv, old_logp=torch.where(mask, old, 0.0), correct=correct)


def _score(model, batch):
    return lambda rows: (torch.where(batch.mask[rows], model(batch.tokens[rows]), 0.0), None)


def test_a_pairs_momentum_holds_no_weight_decay_on_the_first_step():
    """AdamW's first step has no earlier state: every equivalent pair's momentum part is 0 while its decay part is not
    (weight decay is its own part, not the momentum's)."""
    model = SharedWeightsLM(max_len=6, seed=0)
    batch = _batch(model, 11)
    report = probe_step(_score(model, batch), torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1), batch, "gspo")
    pairs = report.pairs
    assert len(pairs) > 0 and float(pairs.decay.abs().max()) > 0
    assert float(pairs.momentum.abs().max()) <= 1e-9 * float(pairs.predicted.abs().max())


def test_adams_decoupled_weight_decay_is_minus_lr_wd_theta():
    """Adam(decoupled_weight_decay=True) decays as AdamW does: the decay part is <g_e, -lr wd theta_0>, the same as
    AdamW's on the same step."""
    parts = {}
    for name, make in (
        ("adam", lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.1, decoupled_weight_decay=True)),
        ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1)),
    ):
        model = SharedWeightsLM(max_len=6, seed=0)
        batch = _batch(model, 12)
        parts[name] = probe_step(_score(model, batch), make(model.parameters()), batch, "gspo").shared.decay
    assert float(parts["adamw"].abs().max()) > 0
    torch.testing.assert_close(parts["adam"], parts["adamw"], rtol=1e-12, atol=0)


def test_events_that_did_not_move_have_no_error_ratio():
    z = torch.zeros(2, dtype=torch.float64)
    still = EventDrift(torch.zeros(2, 2, dtype=torch.long), z + 1, z + 0.1, z, z, z)  # measured 0
    assert "error_ratio" not in summary(still) and summary(still)["measured"] == 0.0


def _doc(ratios: list[float]) -> dict:
    records = [
        {"seed": s, "objective": "gspo", "kind": "shared", "events": 3, "measured": 0.2, "error_ratio": r} for s, r in enumerate(ratios)
    ]
    return {"command": "dfpo probe", "objectives": ["gspo"], "controls": {}, "seeds": list(range(len(ratios))), "records": records}


def test_the_flag_names_the_largest_error_and_the_mean_over_every_seed():
    (flag,) = first_order_flags(_doc([5.3, 5.2, 0.1, 0.2]))
    assert "on 2 of 4 seeds (0, 1; worst 5.3x on seed 0, mean over seeds 2.7x)" in flag
    assert math.isclose((5.3 + 5.2 + 0.1 + 0.2) / 4, 2.7)


def test_a_seed_exactly_at_the_limit_is_not_flagged():
    assert first_order_flags(_doc([0.5, 0.5, 0.1])) == []
    assert len(first_order_flags(_doc([0.5, 0.5000001, 0.1]))) == 1
