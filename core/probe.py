"""Parameter-space drift probe: how one real optimiser step moves a shared token and an equivalent pair.

The paper's cancellation (eq 2) and its drift corollaries (Prop. 3.1, Cor. 3.2, eq 5) are statements about the
coefficients c_it = d L / d log pi_it a group puts on each token's log-prob. A model moves parameters, and
parameters are shared between tokens and contexts. For an event e (a log-prob or a log-odds), to first order

    Delta log pi(e) = <g_e, Delta theta>,    g_e = grad_theta log pi(e),
    Delta theta     = -P s grad L + r,       grad L = sum_{i,t} c_it grad log pi_it,

with P the optimiser's diagonal preconditioner for this step's gradient, s the gradient-clipping factor and r
what the step does besides this step's gradient (earlier momentum, weight decay). ``probe_step`` splits the
first-order change (``predicted`` = <g_e, Delta theta>, Delta theta the parameters' real change) into

- **direct**: the part the event's own coefficients put there through its own gradient,
  shared event (h*, v) of a group:  direct = -s (sum_i c_i,t*) <g_e, P g_e>  (the eq 2 coefficient sum, C_e),
  equivalent pair (y_a, y_b):       direct = -s (<g_a, P u_a> - <g_b, P u_b>),  u_a = sum_t c_a,t grad log pi_a,t,
  the log-odds log pi(y_a) - log pi(y_b) of eq 5 (Cor. 3.2; eq 5's eta c(x) (kappa_a - kappa_b));
- **cross**: everything else, cross = predicted - direct: the other tokens' gradients overlapping with g_e
  (and, for a pair, a's own update seen by b), momentum and weight decay;

and re-forwards the event after the step for the **measured** change, so predicted - measured is the
second-order remainder (O(eta^2): a test halves eta and sees it fall fourfold).

P, exactly (``preconditioner``): SGD, lr (times 1 - dampening once a momentum buffer exists); Adam and AdamW,
lr (1 - beta1) / (1 - beta1^t) / (sqrt(v_t / (1 - beta2^t)) + eps) per coordinate, with v_t the second moment
after the step (which has seen this step's gradient): the factor that multiplies this step's gradient in the
update torch takes. So for AdamW "direct" is the event's own coefficients through the same per-coordinate
scale the whole update went through, and the first Adam steps (where v_t ~ g^2, an update ~ lr sign(g)) put
the non-linearity of that scale in "cross" too: predicted is the real update's projection, whatever it was.

Where this departs from the paper: the paper's Delta theta is eta g_t* for one event alone (Prop. 3.1) or a sum
of per-output updates eta kappa(y) g(y) (Cor. 3.2), whose overlap eq 5 leaves out (its c(x) assumes the outputs'
scores orthogonal with equal norms); here Delta theta is the whole batch's update and the overlap is the cross
term. A pair's direct term counts the pair's own coefficients on every one of its tokens, shared prefix
included; predicted has no shared-prefix part (g_a - g_b cancels there), so a prefix the pair shares with
unequal coefficients shows up as a cross term of the opposite sign.

Cost: one backward pass for the step, one per shared event and two per row of an equivalent pair (its g and
its u), on a forward of the event rows only, and one forward of the event rows after the step; at most
``max_events`` shared events and ``max_events`` pairs. The optimiser's state and the parameters are restored
afterwards unless ``keep_step`` (three copies of the trainable parameters and one of the optimiser state).

Pure torch: the model comes in as a scoring callable, the batch as tensors, the objective as the loss core's
spec; ``dfpo.core.loss.policy_loss`` is the loss (no formula is written here). No I/O.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .loss import ObjectiveSpec, policy_loss, resolve_objective
from .metrics import shared_mask

Score = Callable[[Tensor], tuple[Tensor, Tensor | None]]
"""``score(rows)`` -> (log pi of the batch's completion tokens at those rows (len(rows), T), their entropy (same
shape) or None), with the graph to the parameters unless called under ``torch.no_grad()``."""

MAX_EVENTS = 16
"""Default bound on the shared events (and, separately, on the equivalent pairs) one step probes."""


@dataclass(frozen=True)
class DriftBatch:
    """One batch of whole groups, as the trainer's update stage holds it. Shapes: B rows, T completion tokens."""

    tokens: Tensor
    """(B, T) long: the completion token ids (what a shared event's members must agree on, with their prefix)."""
    mask: Tensor
    """(B, T) bool: real completion tokens."""
    group_ids: Tensor
    """(B,) long: the prompt-group of each row."""
    advantages: Tensor
    """(B,) the group advantages, or (B, T) one per token (the optimal token baseline)."""
    old_logp: Tensor
    """(B, T) log pi_old (detached)."""
    correct: Tensor | None = None
    """(B,) bool: completions the task scores correct; two of one group with different tokens are an equivalent pair
    (None: no pairs)."""
    ref_logp: Tensor | None = None
    """(B, T) the reference policy's log-probs, for an objective with a KL term."""
    rollout_logp: Tensor | None = None
    """(B, T) the sampler's log-probs, for an objective with a rollout correction."""


@dataclass(frozen=True)
class EventDrift:
    """Per probed event (n of them), float64 (n,) each; ``where`` (n, 2): (row, t) of a shared event's first member,
    or the rows (a, b) of an equivalent pair."""

    where: Tensor
    coef: Tensor
    """Logit-space coefficient: a shared event's sum_i c_i,t (eq 2's residual, 0 when it cancels); a pair's
    mean c over a's real tokens minus b's (eq 5's kappa gap, c = d L / d log pi: an increase of log pi lowers L
    where c < 0)."""
    direct: Tensor
    cross: Tensor
    measured: Tensor
    """log pi(e) after the step minus before, both by a forward pass."""
    value: Tensor
    """log pi(e) before the step (a pair: its log-odds log pi(y_a) - log pi(y_b))."""

    @property
    def predicted(self) -> Tensor:
        """<g_e, Delta theta> = direct + cross (n,)."""
        return self.direct + self.cross

    def __len__(self) -> int:
        return int(self.where.shape[0])


@dataclass(frozen=True)
class DriftReport:
    """What one probed step gives: the shared events, the equivalent pairs, the loss metrics and the clip factor."""

    shared: EventDrift
    pairs: EventDrift
    loss_metrics: dict[str, Tensor]
    grad_scale: float
    """s: the factor gradient clipping put on the gradient (1 when it did not clip)."""


# ----------------------------------------------------------------------------- events


def shared_events(tokens: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
    """(n, 2) long: (first member's row, t) of every shared (context, token) event, i.e. every position t at which
    every completion of a group of two or more has the same token after the same prefix (``shared_mask``)."""
    shared = shared_mask(tokens, mask, group_ids, prefix=True)  # (B, T)
    _, first = _first_rows(group_ids)  # (B,) whether the row is its group's first
    return torch.nonzero(shared & first[:, None])  # (n, 2), row-major: groups in row order, t ascending


def equivalent_pairs(tokens: Tensor, mask: Tensor, group_ids: Tensor, correct: Tensor) -> Tensor:
    """(n, 2) long: pairs (a, b) of correct completions of one group with different tokens: its distinct correct
    sequences in row order, each paired with the next (u0, u1), (u1, u2), ..."""
    pairs = []
    keys = torch.where(mask, tokens, -1)  # (B, T) padding made comparable
    for g in torch.unique(group_ids).tolist():
        rows = torch.nonzero((group_ids == g) & correct.bool()).flatten().tolist()
        distinct: list[int] = []
        for r in rows:
            if all(not torch.equal(keys[r], keys[d]) for d in distinct):
                distinct.append(r)
        pairs += list(zip(distinct, distinct[1:]))
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def spread(items: Tensor, group_of: Tensor, limit: int) -> Tensor:
    """At most ``limit`` rows of ``items`` (n, k), taken round-robin over their groups ``group_of`` (n,): every
    group's first, then every group's second, ...; order kept within a group."""
    if items.shape[0] <= limit:
        return items
    rank = torch.zeros_like(group_of)
    for g in torch.unique(group_of).tolist():
        members = group_of == g
        rank[members] = torch.arange(int(members.sum()))
    order = sorted(range(items.shape[0]), key=lambda i: (int(rank[i]), i))[:limit]
    return items[sorted(order)]


def _first_rows(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(index of each row's group, (B,) bool: the row is the first of its group)."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    rows = torch.arange(group_ids.shape[0], device=group_ids.device)
    first = torch.full((int(inverse.max()) + 1 if inverse.numel() else 0,), group_ids.shape[0], device=group_ids.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return inverse, first[inverse] == rows


# ----------------------------------------------------------------------------- the optimiser's update


def preconditioner(optimizer: torch.optim.Optimizer, params: Sequence[Tensor], *, had_momentum: Sequence[bool]) -> list[Tensor]:
    """The diagonal P (one tensor per parameter) that multiplies this step's gradient in the update the optimiser
    just took (read after ``optimizer.step()``; the module docstring states it per optimiser). ``had_momentum``:
    per parameter, whether an SGD momentum buffer existed before the step (the first one is the gradient itself).
    ValueError naming the optimiser for one whose update is not SGD's or Adam's."""
    out = []
    for p, had in zip(params, had_momentum):
        group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
        lr = float(group["lr"])
        if group.get("maximize", False):
            raise ValueError(f"the drift probe needs a minimising optimiser, got {type(optimizer).__name__} with maximize=True")
        if isinstance(optimizer, torch.optim.SGD):
            if group["momentum"] and group["nesterov"]:
                raise ValueError("the drift probe knows SGD's plain and heavy-ball momentum, not nesterov=True")
            scale = lr * ((1 - group["dampening"]) if (group["momentum"] and had) else 1.0)
            out.append(torch.full_like(p, scale))
        elif isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            if group.get("amsgrad", False):
                raise ValueError("the drift probe knows Adam's and AdamW's update, not amsgrad=True")
            state = optimizer.state[p]
            t = float(state["step"])
            beta1, beta2 = group["betas"]
            denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt() + group["eps"]
            out.append(lr * (1 - beta1) / (1 - beta1**t) / denom)
        else:
            raise ValueError(
                f"the drift probe knows the update of SGD, Adam and AdamW, got optimizer {type(optimizer).__name__}; "
                "probe with one of those"
            )
    return out


def _momentum_flags(optimizer: torch.optim.Optimizer, params: Sequence[Tensor]) -> list[bool]:
    return [optimizer.state.get(p, {}).get("momentum_buffer") is not None for p in params]


def _dot(xs: Sequence[Tensor | None], ys: Sequence[Tensor]) -> Tensor:
    """sum_k <xs_k, ys_k> in float64 (0-d); a None gradient (the parameter does not reach the event) counts 0."""
    total = torch.zeros((), dtype=torch.float64)
    for x, y in zip(xs, ys):
        if x is not None:
            total = total + (x.double() * y.double()).sum().cpu()
    return total


def _weighted_dot(xs: Sequence[Tensor | None], ws: Sequence[Tensor], ys: Sequence[Tensor | None]) -> Tensor:
    """sum_k <xs_k, ws_k * ys_k> in float64 (0-d)."""
    total = torch.zeros((), dtype=torch.float64)
    for x, w, y in zip(xs, ws, ys):
        if x is not None and y is not None:
            total = total + (x.double() * w.double() * y.double()).sum().cpu()
    return total


# ----------------------------------------------------------------------------- the probe


def _loss(spec: ObjectiveSpec, batch: DriftBatch, logp: Tensor, entropy: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss`` of the batch (the only place the objective's formula is)."""
    return policy_loss(
        spec,
        logp=logp,
        old_logp=batch.old_logp,
        advantages=batch.advantages,
        mask=batch.mask,
        group_ids=batch.group_ids,
        entropy=entropy if spec.needs_entropy else None,
        ref_logp=batch.ref_logp if spec.needs_ref_logp else None,
        rollout_logp=batch.rollout_logp if spec.needs_rollout_logp else None,
    )


def _grads(value: Tensor, params: Sequence[Tensor]) -> tuple[Tensor | None, ...]:
    return torch.autograd.grad(value, list(params), retain_graph=True, allow_unused=True)


def _empty() -> EventDrift:
    z = torch.zeros(0, dtype=torch.float64)
    return EventDrift(torch.zeros(0, 2, dtype=torch.long), z, z, z, z, z)


def probe_step(
    score: Score,
    optimizer: torch.optim.Optimizer,
    batch: DriftBatch,
    objective: str | ObjectiveSpec,
    *,
    max_events: int = MAX_EVENTS,
    max_grad_norm: float = math.inf,
    keep_step: bool = False,
) -> DriftReport:
    """Take one real optimiser step on ``batch`` with ``objective`` and split each probed event's change of log pi
    into direct + cross (first order) beside the measured change (module docstring).

    ``score(rows)`` scores rows of the batch with the model whose trainable parameters ``optimizer`` holds;
    ``max_grad_norm`` clips the gradient's global norm as the trainer does; ``keep_step`` keeps the step (else the
    parameters and the optimiser's state are put back as they were, so several objectives can be probed from one
    starting point). ValueError naming the setting for ``max_events < 0`` or an optimiser the probe cannot read.
    """
    if max_events < 0:
        raise ValueError(f"max_events must be >= 0, got max_events={max_events}")
    if not (max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be > 0 (math.inf: no clipping), got max_grad_norm={max_grad_norm}")
    spec = resolve_objective(objective)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    mask = batch.mask.bool()
    tokens_cpu, mask_cpu, groups_cpu = batch.tokens.cpu(), mask.cpu(), batch.group_ids.cpu()  # the events' bookkeeping
    shared = spread((ev := shared_events(tokens_cpu, mask_cpu, groups_cpu)), groups_cpu[ev[:, 0]], max_events)
    pairs = torch.zeros(0, 2, dtype=torch.long)
    if batch.correct is not None:
        pairs = equivalent_pairs(tokens_cpu, mask_cpu, groups_cpu, batch.correct.cpu())
        pairs = spread(pairs, groups_cpu[pairs[:, 0]], max_events)
    saved_state = copy.deepcopy(optimizer.state_dict())
    theta0 = [p.detach().clone() for p in params]

    # 1. the step: the loss core's loss and coefficients c = d L / d log pi, the (clipped) gradient, the update
    optimizer.zero_grad(set_to_none=True)
    all_rows = torch.arange(batch.tokens.shape[0])
    logp, entropy = score(all_rows)  # (B, T)
    logp.retain_grad()
    loss, metrics = _loss(spec, batch, logp, entropy)
    loss.backward()
    coef = torch.zeros_like(logp) if logp.grad is None else torch.where(mask.to(logp.device), logp.grad.detach(), 0.0)  # (B, T)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)) if math.isfinite(max_grad_norm) else None
    grad_scale = 1.0 if norm is None or norm <= max_grad_norm else max_grad_norm / (norm + 1e-6)  # torch's clip_coef
    had = _momentum_flags(optimizer, params)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    delta = [p.detach() - t0 for p, t0 in zip(params, theta0)]  # Delta theta, the real update
    precond = preconditioner(optimizer, params, had_momentum=had)
    theta1 = [p.detach().clone() for p in params]

    # 2. the event rows after the step, then back to theta_0 and their graph there
    rows = torch.unique(torch.cat([shared[:, 0], pairs.flatten()]))  # (m,) the rows any event reads
    local = {int(r): k for k, r in enumerate(rows.tolist())}
    with torch.no_grad():
        after = score(rows)[0].double().cpu() if rows.numel() else None  # (m, T)
        for p, t0 in zip(params, theta0):
            p.copy_(t0)
    before = score(rows)[0] if rows.numel() else None  # (m, T) with the graph at theta_0
    coef_cpu = coef.double().cpu()

    def shared_drift() -> EventDrift:
        if shared.shape[0] == 0:
            return _empty()
        _, members_of = torch.unique(groups_cpu, return_inverse=True)  # (B,)
        out = {"coef": [], "direct": [], "cross": [], "measured": [], "value": []}
        for row, t in shared.tolist():
            k = local[row]
            c_sum = coef_cpu[members_of == members_of[row], t].sum()  # eq 2's sum_i c_i,t*
            g = _grads(before[k, t], params)
            predicted = _dot(g, delta)
            direct = -grad_scale * c_sum * _weighted_dot(g, precond, g)
            out["coef"].append(c_sum)
            out["direct"].append(direct)
            out["cross"].append(predicted - direct)
            value = before[k, t].detach().double().cpu()
            out["measured"].append(after[k, t] - value)
            out["value"].append(value)
        return EventDrift(shared, *(torch.stack(out[key]) for key in ("coef", "direct", "cross", "measured", "value")))

    def row_terms(row: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(<g_row, Delta theta>, <g_row, P u_row>, log pi(y_row) before, after) of one completion."""
        k, m = local[row], mask_cpu[row].to(before.device)
        seq = torch.where(m, before[k], 0.0).sum()
        own = torch.where(m, before[k] * coef[row].to(before.device), 0.0).sum()  # sum_t c_t log pi_t, c detached
        g, u = _grads(seq, params), _grads(own, params)
        return _dot(g, delta), _weighted_dot(g, precond, u), seq.detach().double().cpu(), torch.where(mask_cpu[row], after[k], 0.0).sum()

    def pair_drift() -> EventDrift:
        if pairs.shape[0] == 0:
            return _empty()
        terms = {r: row_terms(r) for r in torch.unique(pairs.flatten()).tolist()}
        out = {"coef": [], "direct": [], "cross": [], "measured": [], "value": []}
        for a, b in pairs.tolist():
            (pa, da, sa0, sa1), (pb, db, sb0, sb1) = terms[a], terms[b]
            mean_c = lambda r: coef_cpu[r][mask_cpu[r]].mean() if bool(mask_cpu[r].any()) else coef_cpu.new_zeros(())  # noqa: E731
            direct = -grad_scale * (da - db)
            out["coef"].append(mean_c(a) - mean_c(b))
            out["direct"].append(direct)
            out["cross"].append(pa - pb - direct)
            out["measured"].append((sa1 - sb1) - (sa0 - sb0))
            out["value"].append(sa0 - sb0)
        return EventDrift(pairs, *(torch.stack(out[key]) for key in ("coef", "direct", "cross", "measured", "value")))

    try:
        report = DriftReport(shared_drift(), pair_drift(), {k: v.detach() for k, v in metrics.items()}, float(grad_scale))
    finally:
        with torch.no_grad():
            for p, t in zip(params, theta1 if keep_step else theta0):
                p.copy_(t)
        if not keep_step:
            optimizer.load_state_dict(saved_state)
        optimizer.zero_grad(set_to_none=True)
    return report


# ----------------------------------------------------------------------------- summaries


def summary(events: EventDrift) -> dict[str, float]:
    """Mean absolute direct, cross, predicted and measured change over the events, the first-order error
    mean |measured - predicted|, and the cross share sum |cross| / (sum |direct| + sum |cross|); {} for no events."""
    if len(events) == 0:
        return {}
    direct, cross = events.direct.abs(), events.cross.abs()
    total = float(direct.sum() + cross.sum())
    out = {
        "events": float(len(events)),
        "coef": float(events.coef.abs().mean()),
        "direct": float(direct.mean()),
        "cross": float(cross.mean()),
        "predicted": float(events.predicted.abs().mean()),
        "measured": float(events.measured.abs().mean()),
        "error": float((events.measured - events.predicted).abs().mean()),
    }
    if total > 0:
        out["cross_share"] = float(cross.sum()) / total
    return {k: v for k, v in out.items() if math.isfinite(v)}
