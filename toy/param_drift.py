"""Parameter-space drift on the tabular policy, in closed form: where the paper's token-level argument is exact.

The toy's parameters are one logit row per context, so grad_theta log pi(v | r) = e_(r,v) - pi_r lives in row r
alone, and two token events meet in parameter space through the kernel

    K_r(v, w) = <e_v - pi_r, e_w - pi_r> = delta_vw - pi_r(v) - pi_r(w) + sum_u pi_r(u)^2      (same row r)
    0                                                                                          (different rows).

One SGD step theta <- theta - eta grad L, grad L = sum_j c_j (e_(r_j, v_j) - pi_(r_j)) (``policy.table_gradient``),
changes log pi(v | r) to first order by

    predicted = -eta sum_w C_r(w) K_r(v, w) = -eta [C_r(v) - (pi_r(v) - q_r) sum_w C_r(w) - sum_w C_r(w) pi_r(w)],

with C_r(w) the summed coefficients of every occurrence of (r, w) in the batch and q_r = sum_u pi_r(u)^2. For a
shared event e = (r*, v*) of a group (every member has v* at row r* at position t, eq 2), ``dfpo.core.probe``'s
split is, here exactly:

    direct = -eta C_e K_r*(v*, v*) = -eta C_e (1 - 2 pi(v*) + q),        C_e = sum_i c_i,t  (eq 2's residual)
    cross  = -eta [sum_w (C_r*(w) - C_e delta_(w v*)) K_r*(v*, w)]

so the cross term is **zero across contexts** (rows) and, inside one context, the **softmax coupling** of the other
tokens of row r* (the other tokens of the group at that row, and every other group's use of it: the ``family``
task ties its template rows across prompts). Equivalent answers (two correct completions of one group with different
tokens) get the same split for their log-odds log pi(y_a) - log pi(y_b) (eq 5), with g_y = sum_t (e_(r_t, y_t) -
pi_(r_t)) and u_y = sum_t c_y,t (e_(r_t, y_t) - pi_(r_t)) built by ``table_gradient``.

``probe_toy`` runs it on a sampled batch of a toy task for several objectives from one starting point (common
random numbers: the same rollouts and the same theta; the starting point is moved off-policy by K - 1 SGD steps of
the first objective, as the K optimiser steps of a rollout batch would) and measures each objective's real SGD step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core import metrics
from ..core.probe import EventDrift, equivalent_pairs, summary
from .config import ToyConfig
from .policy import gather_tokens, init_params, log_policy, table_gradient
from .train import loss_coefficients, make_batch, validate


def score_kernel(logpi: Tensor) -> Tensor:
    """K_r(v, w) = <e_v - pi_r, e_w - pi_r> for every row: (..., R, V) -> (..., R, V, V)."""
    pi = logpi.exp()
    q = (pi**2).sum(-1)[..., None, None]  # (..., R, 1, 1)
    eye = torch.eye(pi.shape[-1], dtype=pi.dtype)
    return eye - pi[..., :, None] - pi[..., None, :] + q


def coefficient_table(coef: Tensor, rows: Tensor, tokens: Tensor, mask: Tensor, n_rows: int, vocab: int) -> Tensor:
    """C_r(w): the summed coefficients of every occurrence of (r, w); (B, T) inputs of one seed -> (R, V)."""
    c = torch.where(mask, coef, torch.zeros_like(coef)).reshape(-1)
    return torch.zeros(n_rows * vocab, dtype=coef.dtype).index_add_(0, (rows * vocab + tokens).reshape(-1), c).reshape(n_rows, vocab)


def shared_event_terms(
    coef: Tensor, logpi: Tensor, rows: Tensor, tokens: Tensor, mask: Tensor, group: Tensor, events: Tensor, lr: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(coefficient sum C_e, direct, cross), each (n,), of the shared events ``events`` (n, 2) = (row b, position t)
    of one seed under one SGD step of size ``lr`` (module docstring). coef, rows, tokens, mask: (B, T); group (B,);
    logpi (R, V)."""
    R, V = logpi.shape
    C = coefficient_table(coef, rows, tokens, mask, R, V)  # (R, V)
    pi = logpi.exp()  # (R, V)
    b, t = events[:, 0], events[:, 1]
    r, v = rows[b, t], tokens[b, t]  # (n,)
    members = group[None, :] == group[b][:, None]  # (n, B)
    c_e = (coef[:, t].T * members).sum(-1)  # (n,) sum over the group's members at t
    q = (pi[r] ** 2).sum(-1)  # (n,)
    row_sum, row_dot = C[r].sum(-1), (C[r] * pi[r]).sum(-1)  # (n,)
    predicted = -lr * (C[r, v] - (pi[r, v] - q) * row_sum - row_dot)
    direct = -lr * c_e * (1 - 2 * pi[r, v] + q)
    return c_e, direct, predicted - direct


def pair_terms(
    coef: Tensor, logpi: Tensor, rows: Tensor, tokens: Tensor, mask: Tensor, pairs: Tensor, lr: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(coefficient gap, direct, cross), each (n,), of the log-odds of the equivalent pairs ``pairs`` (n, 2) = (a, b)
    of one seed under one SGD step of size ``lr``: predicted = <g_a - g_b, Delta theta>, direct = -lr (<g_a, u_a> -
    <g_b, u_b>) (module docstring); the gap is the mean coefficient over a's tokens minus b's."""
    one = lambda x: x[None]  # noqa: E731  (S = 1 for table_gradient)
    delta = -lr * table_gradient(one(coef), one(logpi), one(rows), one(tokens), one(mask))[0]  # (R, V)

    def table(row: int, weights: Tensor) -> Tensor:
        keep = torch.zeros_like(mask)
        keep[row] = mask[row]
        return table_gradient(one(weights), one(logpi), one(rows), one(tokens), one(keep))[0]  # (R, V)

    gap, direct, cross = [], [], []
    for a, b in pairs.tolist():
        g_a, g_b = table(a, torch.ones_like(coef)), table(b, torch.ones_like(coef))
        u_a, u_b = table(a, coef), table(b, coef)
        predicted = ((g_a - g_b) * delta).sum()
        d = -lr * ((g_a * u_a).sum() - (g_b * u_b).sum())
        gap.append(coef[a][mask[a]].mean() - coef[b][mask[b]].mean())
        direct.append(d)
        cross.append(predicted - d)
    if not gap:
        z = torch.zeros(0, dtype=coef.dtype)
        return z, z, z
    return torch.stack(gap), torch.stack(direct), torch.stack(cross)


def toy_shared_events(rows: Tensor, tokens: Tensor, mask: Tensor, group: Tensor, vocab: int) -> Tensor:
    """(n, 2) = (first member's row b, t): positions where every member of a group has the same parameter row and
    token (the tabular context is the row itself: ``shared_mask(prefix=False)``, as the toy's residual reads it)."""
    shared = metrics.shared_mask(rows * vocab + tokens, mask, group, prefix=False)  # (B, T)
    first = torch.zeros_like(group, dtype=torch.bool)
    for g in torch.unique(group).tolist():
        first[int(torch.nonzero(group == g)[0])] = True
    return torch.nonzero(shared & first[:, None])


ROW_FIGURES = ("coef", "direct", "cross", "momentum", "decay", "measured", "error", "error_ratio", "cross_share", "momentum_share")
"""The figures of ``core.probe.summary`` a row of ``ToyProbe.rows`` keeps (the mean over seeds). The toy's step is plain
SGD without weight decay, so momentum and decay are 0 (its events' ``EventDrift`` leaves them at their zero default)
and cross is the whole prediction less direct."""


@dataclass(frozen=True)
class ToyProbe:
    """Per objective label and seed: the shared events' and the equivalent pairs' ``EventDrift`` under one SGD step."""

    shared: dict[str, list[EventDrift]]
    pairs: dict[str, list[EventDrift]]

    def rows(self) -> list[dict[str, object]]:
        """One row per objective and kind (shared / equivalent): the mean over seeds of ``core.probe.summary``."""
        out = []
        for label in self.shared:
            for kind, per_seed in (("shared", self.shared[label]), ("equivalent", self.pairs[label])):
                sums = [summary(e) for e in per_seed if len(e)]
                row: dict[str, object] = {"objective": label, "events": kind, "seeds": len(per_seed), "seeds with events": len(sums)}
                for key in ROW_FIGURES:
                    vals = [s[key] for s in sums if key in s]
                    row[key] = sum(vals) / len(vals) if vals else None
                out.append(row)
        return out


@dataclass(frozen=True)
class ProbeStart:
    """The point ``probe_toy`` steps from: the batch drawn at the initial policy (the same rollouts for every label,
    one generator state), then ``config.inner_steps - 1`` SGD steps of the first objective on it."""

    task: object
    specs: dict
    labels: tuple[str, ...]
    batch_of: dict
    theta: Tensor  # (S, R, V)
    logpi: Tensor  # (S, R, V) log pi at theta

    @property
    def roll(self):
        return self.batch_of[self.labels[0]].roll

    def coefficients(self, name: str, logpi: Tensor) -> tuple[Tensor, dict]:
        """(d loss / d log pi (S, B, T), the loss core's metrics) of objective ``name`` on the batch at ``logpi``."""
        b, roll = self.batch_of[name], self.roll
        lp = torch.where(roll.mask, gather_tokens(logpi, roll.rows, roll.tokens), torch.zeros(()))  # (S, B, T)
        return loss_coefficients(
            self.specs[name], lp, b.old_logp, b.adv, roll.mask, roll.group, b.entropy, b.n_groups, self.task.max_len,
            tokens=roll.tokens, rows=roll.rows,
        )  # fmt: skip


def probe_start(config: ToyConfig) -> ProbeStart:
    """``ProbeStart`` of ``config`` (read by ``probe_toy`` and by the explorer's notes on its zero cells)."""
    task, specs = validate(config)
    labels = tuple(config.objectives)
    theta = init_params(task, config.seeds, noise=config.init_noise, generator=torch.Generator().manual_seed(config.seed))  # (S, R, V)
    logpi_old = log_policy(theta, task.legal)
    batch_of = {
        name: make_batch(task, specs[name], logpi_old, config, 0, None, torch.Generator().manual_seed(config.seed + 1)) for name in labels
    }
    start = ProbeStart(task, specs, labels, batch_of, theta, logpi_old)
    roll = start.roll
    for _ in range(config.inner_steps - 1):  # off-policy, as step k of a rollout batch: the first objective moves theta
        logpi = log_policy(theta, task.legal)
        theta = theta - config.lr * table_gradient(start.coefficients(labels[0], logpi)[0], logpi, roll.rows, roll.tokens, roll.mask)
    return dataclasses.replace(start, theta=theta, logpi=log_policy(theta, task.legal))


def probe_toy(config: ToyConfig, *, max_events: int = 64) -> ToyProbe:
    """Every objective of ``config`` from one starting point on one sampled batch per seed (sampled mode, SGD):
    the batch drawn at the initial policy, ``config.inner_steps - 1`` SGD steps of the first objective on it, then
    each objective's own SGD step of size ``config.lr``, split into direct + cross in closed form beside the
    measured change. ValueError (naming the option) for exact mode or Adam: the closed form is SGD's on sampled groups."""
    if config.mode != "sampled":
        raise ValueError(f"the toy drift probe needs mode='sampled' (groups of G completions), got mode={config.mode!r}")
    if config.optimizer != "sgd":
        raise ValueError(f"the toy drift probe's closed form is SGD's update, got optimizer={config.optimizer!r}; use optimizer='sgd'")
    start = probe_start(config)
    task, labels, roll, theta, logpi = start.task, start.labels, start.roll, start.theta, start.logpi
    S, V = config.seeds, len(task.vocab)
    rows, toks, mask, group = roll.rows, roll.tokens, roll.mask, roll.group

    def coefficients(name: str, logpi: Tensor) -> Tensor:
        return start.coefficients(name, logpi)[0]

    correct = roll.form >= 0  # (S, B) completions with a correct answer form
    shared_out: dict[str, list[EventDrift]] = {}
    pairs_out: dict[str, list[EventDrift]] = {}
    for name in labels:
        coef = coefficients(name, logpi)  # (S, B, T)
        after = log_policy(theta - config.lr * table_gradient(coef, logpi, rows, toks, mask), task.legal)  # the real SGD step
        shared_out[name], pairs_out[name] = [], []
        for s in range(S):
            lp0 = gather_tokens(logpi[s : s + 1], rows[s : s + 1], toks[s : s + 1])[0]  # (B, T)
            lp1 = gather_tokens(after[s : s + 1], rows[s : s + 1], toks[s : s + 1])[0]
            events = toy_shared_events(rows[s], toks[s], mask[s], group[s], V)[:max_events]
            c_e, direct, cross = shared_event_terms(coef[s], logpi[s], rows[s], toks[s], mask[s], group[s], events, config.lr)
            measured = lp1[events[:, 0], events[:, 1]] - lp0[events[:, 0], events[:, 1]]
            value = lp0[events[:, 0], events[:, 1]]
            shared_out[name].append(EventDrift(events, *(x.double() for x in (c_e, direct, cross, measured, value))))
            pairs = equivalent_pairs(toks[s], mask[s], group[s], correct[s])[:max_events]
            gap, pd, pc = pair_terms(coef[s], logpi[s], rows[s], toks[s], mask[s], pairs, config.lr)
            seq0, seq1 = (torch.where(mask[s], x, torch.zeros(())).sum(-1) for x in (lp0, lp1))  # (B,)
            odds = (seq1[pairs[:, 0]] - seq1[pairs[:, 1]]) - (seq0[pairs[:, 0]] - seq0[pairs[:, 1]])
            value = seq0[pairs[:, 0]] - seq0[pairs[:, 1]]
            pairs_out[name].append(EventDrift(pairs, *(x.double() for x in (gap, pd, pc, odds, value))))
    return ToyProbe(shared_out, pairs_out)


def default_probe_config(**changes: object) -> ToyConfig:
    """The toy probe's defaults: App. A's task, the matched pairs of the README's ablation, SGD, 8 seeds, K = 4."""
    base = dict(
        task="tenplusten",
        objectives=("gspo", "dfpo_min", "gspo_noclip", "dfpo_min:stopgrad=score"),
        optimizer="sgd",
        lr=0.5,
        seeds=8,
        inner_steps=4,
        group_size=8,
        steps=1,
    )
    base.update(changes)
    return ToyConfig(**base)


__all__ = [
    "ToyProbe",
    "coefficient_table",
    "default_probe_config",
    "pair_terms",
    "probe_toy",
    "score_kernel",
    "shared_event_terms",
    "toy_shared_events",
]
