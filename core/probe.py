"""Parameter-space drift probe: how one real optimiser step moves a shared token and an equivalent pair.

The paper's cancellation (eq 2) and its drift corollaries (Prop. 3.1, Cor. 3.2, eq 5) are statements about the
coefficients c_it = d L / d log pi_it a group puts on each token's log-prob. A model moves parameters, and
parameters are shared between tokens and contexts. For an event e (a log-prob or a log-odds), to first order

    Delta log pi(e) = <g_e, Delta theta>,    g_e = grad_theta log pi(e),
    Delta theta     = -P s grad L + r,       grad L = sum_{i,t} c_it grad log pi_it,

with P the optimiser's diagonal preconditioner for this step's gradient, s the gradient-clipping factor and r
what the step does besides this step's gradient (earlier momentum, weight decay). ``probe_step`` splits the
first-order change (``predicted`` = <g_e, Delta theta>, Delta theta the parameters' real change) into four parts
that add up to it exactly (to float error):

- **direct**: the part the event's own coefficients put there through its own gradient,
  shared event (h*, v) held by members S of a group:  direct = -s (sum_{i in S} c_i,t*) <g_e, P g_e>  (eq 2's
  coefficient sum C_e over the members that hold the event),
  equivalent pair (y_a, y_b):       direct = -s (<g_a, P u_a> - <g_b, P u_b>),  u_a = sum_t c_a,t grad log pi_a,t,
  the log-odds log pi(y_a) - log pi(y_b) of eq 5 (Cor. 3.2; eq 5's eta c(x) (kappa_a - kappa_b));
- **cross**: the rest of THIS batch's gradient overlapping with g_e, cross = <g_e, -P s grad L> - direct: the
  other tokens' gradients through shared parameters (and, for a pair, a's own update seen by b);
- **decay**: weight decay's part: AdamW's decoupled decay <g_e, -lr wd theta_0>; Adam's and SGD's coupled
  ``weight_decay`` adds wd theta_0 to the gradient inside the optimiser (after clipping, so unclipped) and goes
  through P: <g_e, -P wd theta_0>;
- **momentum**: the optimiser's state from earlier steps (SGD's momentum buffer, Adam's first moment before this
  step's gradient entered it): what is left, momentum = predicted - direct - cross - decay. It is 0 (to the
  float rounding of the real update) on a first Adam step and on plain SGD, and carries the earlier steps'
  direction after ``--move-steps``;

and re-forwards the event after the step for the **measured** change, so predicted - measured is the
second-order remainder (O(eta^2): a test halves eta and sees it fall fourfold).

P, exactly (``preconditioner``): SGD, lr (times 1 - dampening once a momentum buffer exists); Adam and AdamW,
lr (1 - beta1) / (1 - beta1^t) / (sqrt(v_t / (1 - beta2^t)) + eps) per coordinate, with v_t the second moment
after the step (which has seen this step's gradient): the factor that multiplies this step's gradient in the
update torch takes; 0 for a parameter without a gradient this step (torch's optimisers skip it: no update, no
decay, whatever state it holds). So for AdamW "direct" is the event's own coefficients through the same
per-coordinate scale the whole update went through, and the first Adam steps (where v_t ~ g^2, an update ~ lr
sign(g)) put the non-linearity of that scale in "cross" too.

Which shared events (``EVENT_RULES``): "subset" (the default) takes eq 2's events as the paper sums them, every
(h*, v) that two or more members of a group hold: a subset S of the group with the same tokens at 0..t
(``dfpo.core.metrics.shared_events``); its log pi(v | h*) is one value for every member of S (one context), read at
a representative row (S's first). "whole" takes only the events every member of the group holds (S = the group,
``dfpo.core.metrics.shared_mask``), the rule of the probe documents stored before the subset rule; whole-group events
are the subset rule's events with S = the group, and give the same figures under either rule.

Where this departs from the paper: the paper's Delta theta is eta g_t* for one event alone (Prop. 3.1) or a sum
of per-output updates eta kappa(y) g(y) (Cor. 3.2), whose overlap eq 5 leaves out (its c(x) assumes the outputs'
scores orthogonal with equal norms); here Delta theta is the whole batch's update and the overlap is the cross
term. A pair's direct term counts the pair's own coefficients on every one of its tokens, shared prefix
included; predicted has no shared-prefix part (g_a - g_b cancels there), so a prefix the pair shares with
unequal coefficients shows up as a cross term of the opposite sign.

Cost: one backward pass for the step, one per shared event and two per row of an equivalent pair (its g and
its u), on a forward of the event rows only, and one forward of the event rows after the step; at most
``max_events`` shared events and ``max_events`` pairs. The optimiser's state and the parameters are restored
afterwards unless ``keep_step`` (six copies of the trainable parameters: theta_0, theta_1, Delta theta, the
clipped gradient, P and the batch's and decay's update, and one of the optimiser state).

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
from .metrics import shared_events as subset_shared_events
from .metrics import shared_mask

Score = Callable[[Tensor], tuple[Tensor, Tensor | None]]
"""``score(rows)`` -> (log pi of the batch's completion tokens at those rows (len(rows), T), their entropy (same
shape) or None), with the graph to the parameters unless called under ``torch.no_grad()``."""

MAX_EVENTS = 16
"""Default bound on the shared events (and, separately, on the equivalent pairs) one step probes."""
FIRST_ORDER_ERROR_LIMIT = 0.5
"""``summary``'s error_ratio (mean |measured - predicted| / mean |measured|) above which the first-order split is
flagged: past 0.5 the prediction misses the measured change by more than half its size on average (the second-order
remainder is that large: a long step, or a change that nearly cancels to first order), so the four parts are shares
of a prediction that is not the change the step made, and ``dfpo probe`` says so next to its table. 0.5 because below
it the prediction has the measured change's sign and size to within a factor 2 on average, which is what reading
its parts as "where the drift comes from" needs."""
EVENT_RULES = ("subset", "whole")
"""How ``probe_step`` picks its shared events (module docstring): "subset", every (context, token) that two or more
members of a group hold (eq 2); "whole", only those every member holds (the rule before the subset one)."""
RULE_WORDS = {
    "subset": "a (context, token) that two or more completions of a group hold after the same prefix (eq 2)",
    "whole": "a (context, token) that every completion of a group holds after the same prefix",
}
"""What a shared event is under each rule, in words (for the documents' readers)."""
OLD_RULE = "whole"
"""The rule of a ``dfpo probe`` document without ``shared_events`` (one stored before the subset rule)."""


def document_rule(doc: dict) -> str:
    """The rule that picked a ``dfpo probe`` document's shared events: its ``shared_events``, else ``OLD_RULE``."""
    return str(doc.get("shared_events", OLD_RULE))


PARTS = ("direct", "cross", "momentum", "decay")
"""The four parts of the first-order prediction, in table order (module docstring)."""


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
    """Per probed event (n of them), float64 (n,) each; ``where`` (n, 2): (row, t) of a shared event's first member
    (the first row of its member set S), or the rows (a, b) of an equivalent pair."""

    where: Tensor
    coef: Tensor
    """Logit-space coefficient: a shared event's sum_{i in S} c_i,t over its members S (eq 2's residual, 0 when it
    cancels); a pair's
    mean c over a's real tokens minus b's (eq 5's kappa gap, c = d L / d log pi: an increase of log pi lowers L
    where c < 0)."""
    direct: Tensor
    """The event's own coefficients through its own gradient (module docstring)."""
    cross: Tensor
    """The rest of this batch's (clipped) gradient overlapping the event: <g_e, -P s grad L> - direct."""
    measured: Tensor
    """log pi(e) after the step minus before, both by a forward pass."""
    value: Tensor
    """log pi(e) before the step (a pair: its log-odds log pi(y_a) - log pi(y_b))."""
    momentum: Tensor | None = None
    """The optimiser's state from earlier steps (momentum buffer, Adam's earlier first moment): predicted - direct -
    cross - decay. None given: zeros (an update with no earlier state, e.g. the toy's plain SGD)."""
    decay: Tensor | None = None
    """Weight decay's part: <g_e, -lr wd theta_0> (AdamW), <g_e, -P wd theta_0> (Adam's, SGD's coupled decay). None
    given: zeros."""
    members: Tensor | None = None
    """(n,) long: |S|, how many members hold a shared event (None: not recorded, e.g. pairs)."""
    whole: Tensor | None = None
    """(n,) bool: the event is held by its whole group (S = the group; None: not recorded)."""

    def __post_init__(self) -> None:
        for name in ("momentum", "decay"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, torch.zeros_like(self.direct))

    @property
    def predicted(self) -> Tensor:
        """<g_e, Delta theta> = direct + cross + momentum + decay (n,)."""
        return self.direct + self.cross + self.momentum + self.decay

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
    rule: str = "subset"
    """Which shared events (``EVENT_RULES``)."""
    found: int = 0
    """Shared events the rule found in the batch, before the ``max_events`` cap."""
    found_whole: int = 0
    """Of those, the ones every member of their group holds (S = the group)."""


# ----------------------------------------------------------------------------- events


def shared_events(tokens: Tensor, mask: Tensor, group_ids: Tensor) -> Tensor:
    """(n, 2) long: (first member's row, t) of every whole-group shared (context, token) event, i.e. every position t
    at which every completion of a group of two or more has the same token after the same prefix (``shared_mask``;
    the "whole" rule, the probe's before the subset rule of ``probe_events``)."""
    shared = shared_mask(tokens, mask, group_ids, prefix=True)  # (B, T)
    _, first = _first_rows(group_ids)  # (B,) whether the row is its group's first
    return torch.nonzero(shared & first[:, None])  # (n, 2), row-major: groups in row order, t ascending


@dataclass(frozen=True)
class ProbeEvents:
    """The shared events a rule finds in a batch (n of them), in (representative row, t) order."""

    where: Tensor
    """(n, 2) long: (first row of the member set S, t)."""
    members: Tensor
    """(n, B) bool: the member set S of each event (>= 2 rows of one group, the same tokens at 0..t)."""
    whole: Tensor
    """(n,) bool: S is the whole group."""


def probe_events(tokens: Tensor, mask: Tensor, group_ids: Tensor, rule: str = "subset") -> ProbeEvents:
    """The shared (context, token) events of eq 2 under ``rule`` (``EVENT_RULES``): "subset", every (h*, v) that a
    subset S of two or more members of a group holds (``dfpo.core.metrics.shared_events``); "whole", those with S =
    the whole group (``shared_mask``'s positions). tokens, mask (B, T); group_ids (B,). ValueError naming the rule."""
    if rule not in EVENT_RULES:
        raise ValueError(f"the shared-event rule must be one of {', '.join(EVENT_RULES)}, got {rule!r}")
    B, T = tokens.shape
    ev = subset_shared_events(tokens, mask, group_ids, prefix=True)
    E = int(ev.sizes.numel())
    sel = ev.ids >= 0  # (B, T)
    row_idx = torch.arange(B).unsqueeze(1).expand(B, T)[sel]  # (N,)
    eid = ev.ids[sel]  # (N,)
    members = torch.zeros(E, B, dtype=torch.bool)
    members[eid, row_idx] = True  # (E, B)
    rep = torch.full((E,), B, dtype=torch.long).scatter_reduce(0, eid, row_idx, reduce="amin")  # (E,) S's first row
    keep = ev.whole if rule == "whole" else torch.ones(E, dtype=torch.bool)  # (E,)
    order = torch.argsort(rep * (T + 1) + ev.positions)  # row-major, t ascending
    order = order[keep[order]]
    where = torch.stack([rep[order], ev.positions[order]], 1).reshape(-1, 2)  # (n, 2)
    return ProbeEvents(where, members[order].reshape(-1, B), ev.whole[order].reshape(-1))


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


def preconditioner(
    optimizer: torch.optim.Optimizer,
    params: Sequence[Tensor],
    *,
    had_momentum: Sequence[bool],
    stepped: Sequence[bool] | None = None,
) -> list[Tensor]:
    """The diagonal P (one tensor per parameter) that multiplies this step's gradient in the update the optimiser
    just took (read after ``optimizer.step()``; the module docstring states it per optimiser). ``had_momentum``:
    per parameter, whether an SGD momentum buffer existed before the step (the first one is the gradient itself).
    ``stepped``: per parameter, whether it had a gradient this step (torch's optimisers skip one without: its P is
    0, whatever state earlier steps left); None: every parameter with optimiser state. ValueError naming the
    optimiser for one whose update is not SGD's or Adam's, or naming the parameter for state the probe cannot read."""
    out = []
    for k, (p, had) in enumerate(zip(params, had_momentum)):
        group = _group_of(optimizer, p)
        lr = float(group["lr"])
        if group.get("maximize", False):
            raise ValueError(f"the drift probe needs a minimising optimiser, got {type(optimizer).__name__} with maximize=True")
        if isinstance(optimizer, torch.optim.SGD):
            if group["momentum"] and group["nesterov"]:
                raise ValueError("the drift probe knows SGD's plain and heavy-ball momentum, not nesterov=True")
        elif isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            if group.get("amsgrad", False):
                raise ValueError("the drift probe knows Adam's and AdamW's update, not amsgrad=True")
        else:
            raise ValueError(
                f"the drift probe knows the update of SGD, Adam and AdamW, got optimizer {type(optimizer).__name__}; "
                "probe with one of those"
            )
        state = optimizer.state.get(p, {})
        if not (bool(state) if stepped is None else stepped[k]):
            out.append(torch.zeros_like(p))  # no gradient this step: torch's optimisers leave the parameter alone
        elif isinstance(optimizer, torch.optim.SGD):
            scale = lr * ((1 - group["dampening"]) if (group["momentum"] and had) else 1.0)
            out.append(torch.full_like(p, scale))
        else:
            if "step" not in state or "exp_avg_sq" not in state:
                raise ValueError(
                    f"the drift probe cannot read {type(optimizer).__name__}'s state of parameter {k} (shape {tuple(p.shape)}): "
                    f"it holds {sorted(state)}, not 'step' and 'exp_avg_sq'; probe with torch's own Adam or AdamW"
                )
            t = float(state["step"])
            beta1, beta2 = group["betas"]
            denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt() + group["eps"]
            out.append(lr * (1 - beta1) / (1 - beta1**t) / denom)
    return out


def decay_update(
    optimizer: torch.optim.Optimizer, params: Sequence[Tensor], theta0: Sequence[Tensor], precond: Sequence[Tensor], stepped: Sequence[bool]
) -> list[Tensor]:
    """Weight decay's part of the update, one tensor per parameter: -lr wd theta_0 for AdamW's decoupled decay (and
    Adam's ``decoupled_weight_decay``), -P wd theta_0 for Adam's and SGD's coupled ``weight_decay`` (wd theta_0 joins
    the gradient inside the optimiser, after clipping, and goes through P); 0 for a parameter not ``stepped`` (no
    gradient this step: torch skips it, decay included)."""
    out = []
    for p, t0, pc, moved in zip(params, theta0, precond, stepped):
        group = _group_of(optimizer, p)
        wd = float(group.get("weight_decay", 0.0) or 0.0)
        decoupled = isinstance(optimizer, torch.optim.AdamW) or bool(group.get("decoupled_weight_decay", False))
        if wd == 0 or not moved:
            out.append(torch.zeros_like(t0))
        elif decoupled:
            out.append(-float(group["lr"]) * wd * t0)
        else:
            out.append(-pc * wd * t0)
    return out


def _group_of(optimizer: torch.optim.Optimizer, p: Tensor) -> dict:
    return next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))


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
        token_ids=batch.tokens if spec.needs_token_ids else None,  # the exact-cancellation arm's shared tokens
    )


def _grads(value: Tensor, params: Sequence[Tensor]) -> tuple[Tensor | None, ...]:
    return torch.autograd.grad(value, list(params), retain_graph=True, allow_unused=True)


def _empty() -> EventDrift:
    z = torch.zeros(0, dtype=torch.float64)
    return EventDrift(torch.zeros(0, 2, dtype=torch.long), z, z, z, z, z, z, z)


_FIELDS = ("coef", "direct", "cross", "measured", "value", "momentum", "decay")
"""``EventDrift``'s float fields in constructor order."""


@dataclass(frozen=True)
class _Step:
    """What one real optimiser step on the batch gives the first-order split: per trainable parameter (lists in
    ``params`` order), the update and its parts; per token, the loss core's coefficients."""

    params: list[Tensor]
    coef: Tensor
    """(B, T) c = d L / d log pi at the batch's real tokens (0 elsewhere), on the model's device."""
    grad_scale: float
    """s: the factor gradient clipping put on the gradient (1 when it did not clip)."""
    delta: list[Tensor]
    """Delta theta = theta_1 - theta_0, the real update."""
    own: list[Tensor]
    """-P s grad L: this batch's part of the update."""
    decay: list[Tensor]
    """Weight decay's part of the update (``decay_update``)."""
    precond: list[Tensor]
    """P (``preconditioner``)."""
    theta1: list[Tensor]
    """The parameters after the step."""
    metrics: dict[str, Tensor]
    """The loss core's metrics of the step (detached)."""

    @property
    def coef_cpu(self) -> Tensor:
        return self.coef.double().cpu()  # (B, T)


@dataclass(frozen=True)
class _EventRows:
    """The rows any probed event reads: log pi of their completion tokens after the step and, with the graph to the
    parameters, at theta_0."""

    local: dict[int, int]
    """A batch row -> its index in ``before`` and ``after``."""
    before: Tensor | None
    """(m, T) log pi at theta_0, with the graph (None: no rows)."""
    after: Tensor | None
    """(m, T) float64 on the CPU: log pi after the step (None: no rows)."""


def _pick_events(batch: DriftBatch, rule: str, max_events: int) -> tuple[ProbeEvents, ProbeEvents, Tensor]:
    """The shared events ``rule`` finds in the batch, the at most ``max_events`` of them the probe takes (spread
    round-robin over the groups), and the equivalent pairs it takes ((n, 2), at most ``max_events``; none without
    ``batch.correct``)."""
    tokens, mask, groups = batch.tokens.cpu(), batch.mask.bool().cpu(), batch.group_ids.cpu()  # the events' bookkeeping
    found = probe_events(tokens, mask, groups, rule)
    picked = spread(torch.arange(found.where.shape[0])[:, None], groups[found.where[:, 0]], max_events)[:, 0]  # (n,)
    taken = ProbeEvents(found.where[picked], found.members[picked], found.whole[picked])  # (n, 2), (n, B), (n,)
    pairs = torch.zeros(0, 2, dtype=torch.long)
    if batch.correct is not None:
        pairs = equivalent_pairs(tokens, mask, groups, batch.correct.cpu())
        pairs = spread(pairs, groups[pairs[:, 0]], max_events)
    return found, taken, pairs


def _take_step(
    score: Score,
    optimizer: torch.optim.Optimizer,
    params: list[Tensor],
    theta0: list[Tensor],
    batch: DriftBatch,
    spec: ObjectiveSpec,
    max_grad_norm: float,
) -> _Step:
    """One optimiser step on the batch: the loss core's loss and coefficients c = d L / d log pi, the (clipped)
    gradient, the update and its parts (module docstring). The parameters are left at theta_1."""
    optimizer.zero_grad(set_to_none=True)
    logp, entropy = score(torch.arange(batch.tokens.shape[0]))  # (B, T)
    logp.retain_grad()
    loss, metrics = _loss(spec, batch, logp, entropy)
    loss.backward()
    mask = batch.mask.bool().to(logp.device)
    coef = torch.zeros_like(logp) if logp.grad is None else torch.where(mask, logp.grad.detach(), 0.0)  # (B, T)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)) if math.isfinite(max_grad_norm) else None
    grad_scale = 1.0 if norm is None or norm <= max_grad_norm else max_grad_norm / (norm + 1e-6)  # torch's clip_coef
    had = _momentum_flags(optimizer, params)
    stepped = [p.grad is not None for p in params]  # torch's optimisers skip a parameter without a gradient
    grad = [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone() for p in params]  # s grad L, as the optimiser sees it
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    delta = [p.detach() - t0 for p, t0 in zip(params, theta0)]
    precond = preconditioner(optimizer, params, had_momentum=had, stepped=stepped)
    own = [-pc * g for pc, g in zip(precond, grad)]
    del grad
    decay = decay_update(optimizer, params, theta0, precond, stepped)
    theta1 = [p.detach().clone() for p in params]
    return _Step(params, coef, grad_scale, delta, own, decay, precond, theta1, {k: v.detach() for k, v in metrics.items()})


def _score_event_rows(score: Score, params: Sequence[Tensor], theta0: Sequence[Tensor], rows: Tensor) -> _EventRows:
    """The event rows ``rows`` (m,) scored after the step, then the parameters put back to theta_0 and the rows scored
    again there with their graph."""
    with torch.no_grad():
        after = score(rows)[0].double().cpu() if rows.numel() else None  # (m, T)
        for p, t0 in zip(params, theta0):
            p.copy_(t0)
    before = score(rows)[0] if rows.numel() else None  # (m, T) with the graph at theta_0
    return _EventRows({int(r): k for k, r in enumerate(rows.tolist())}, before, after)


def _drift(where: Tensor, parts: list[dict[str, Tensor]], **extra: Tensor) -> EventDrift:
    """``EventDrift`` of the events at ``where`` from each event's parts (``_FIELDS``)."""
    return EventDrift(where, *(torch.stack([p[key] for p in parts]) for key in _FIELDS), **extra)


def _shared_event_parts(step: _Step, rows: _EventRows, row: int, t: int, members: Tensor, coef_cpu: Tensor) -> dict[str, Tensor]:
    """The first-order parts of one shared event (h*, v) at (``row``, ``t``), held by ``members`` (B,) bool."""
    k = rows.local[row]
    c_sum = coef_cpu[members, t].sum()  # eq 2's sum over the event's members S of c_i,t*
    g = _grads(rows.before[k, t], step.params)
    predicted, batch_part, decay_part = _dot(g, step.delta), _dot(g, step.own), _dot(g, step.decay)
    direct = -step.grad_scale * c_sum * _weighted_dot(g, step.precond, g)
    value = rows.before[k, t].detach().double().cpu()
    parts = dict(coef=c_sum, direct=direct, cross=batch_part - direct, measured=rows.after[k, t] - value, value=value)
    parts.update(momentum=predicted - batch_part - decay_part, decay=decay_part)
    return parts


def _shared_drift(step: _Step, rows: _EventRows, shared: ProbeEvents) -> EventDrift:
    """The probed shared events' first-order split and measured change."""
    if shared.where.shape[0] == 0:
        return _empty()
    coef_cpu = step.coef_cpu
    parts = [_shared_event_parts(step, rows, row, t, shared.members[e], coef_cpu) for e, (row, t) in enumerate(shared.where.tolist())]
    return _drift(shared.where, parts, members=shared.members.sum(-1), whole=shared.whole)


def _row_terms(step: _Step, rows: _EventRows, row: int, mask_row: Tensor) -> dict[str, Tensor]:
    """<g_row, .> of Delta theta, of the batch's and decay's update and of P u_row; log pi(y_row) before and after.
    ``mask_row`` (T,) bool on the CPU: the row's real tokens."""
    k, m = rows.local[row], mask_row.to(rows.before.device)
    seq = torch.where(m, rows.before[k], 0.0).sum()
    own_c = torch.where(m, rows.before[k] * step.coef[row].to(rows.before.device), 0.0).sum()  # sum_t c_t log pi_t, c detached
    g, u = _grads(seq, step.params), _grads(own_c, step.params)
    return {
        "delta": _dot(g, step.delta),
        "batch": _dot(g, step.own),
        "decay": _dot(g, step.decay),
        "self": _weighted_dot(g, step.precond, u),
        "before": seq.detach().double().cpu(),
        "after": torch.where(mask_row, rows.after[k], 0.0).sum(),
    }


def _mean_coef(coef_cpu: Tensor, mask_cpu: Tensor, row: int) -> Tensor:
    """The mean c over a row's real tokens (0 for a row without any)."""
    return coef_cpu[row][mask_cpu[row]].mean() if bool(mask_cpu[row].any()) else coef_cpu.new_zeros(())


def _pair_drift(step: _Step, rows: _EventRows, pairs: Tensor, mask_cpu: Tensor) -> EventDrift:
    """The equivalent pairs' (n, 2) first-order split and measured change of their log-odds (eq 5)."""
    if pairs.shape[0] == 0:
        return _empty()
    terms = {r: _row_terms(step, rows, r, mask_cpu[r]) for r in torch.unique(pairs.flatten()).tolist()}
    coef_cpu, parts = step.coef_cpu, []
    for a, b in pairs.tolist():
        gap = {key: terms[a][key] - terms[b][key] for key in terms[a]}  # the log-odds' <g_a - g_b, .>
        direct = -step.grad_scale * gap["self"]
        coef = _mean_coef(coef_cpu, mask_cpu, a) - _mean_coef(coef_cpu, mask_cpu, b)
        pair = dict(coef=coef, direct=direct, cross=gap["batch"] - direct, measured=gap["after"] - gap["before"])
        pair.update(value=gap["before"], momentum=gap["delta"] - gap["batch"] - gap["decay"], decay=gap["decay"])
        parts.append(pair)
    return _drift(pairs, parts)


def _put_back(optimizer: torch.optim.Optimizer, params: Sequence[Tensor], theta: Sequence[Tensor], state: dict | None) -> None:
    """The parameters set to ``theta`` and, unless ``state`` is None, the optimiser's state to ``state``."""
    with torch.no_grad():
        for p, t in zip(params, theta):
            p.copy_(t)
    if state is not None:
        optimizer.load_state_dict(state)
    optimizer.zero_grad(set_to_none=True)


def probe_step(
    score: Score,
    optimizer: torch.optim.Optimizer,
    batch: DriftBatch,
    objective: str | ObjectiveSpec,
    *,
    max_events: int = MAX_EVENTS,
    max_grad_norm: float = math.inf,
    keep_step: bool = False,
    events: str = "subset",
) -> DriftReport:
    """Take one real optimiser step on ``batch`` with ``objective`` and split each probed event's change of log pi
    into direct + cross + momentum + decay (first order) beside the measured change (module docstring).

    ``score(rows)`` scores rows of the batch with the model whose trainable parameters ``optimizer`` holds;
    ``max_grad_norm`` clips the gradient's global norm as the trainer does; ``keep_step`` keeps the step (else the
    parameters and the optimiser's state are put back as they were, so several objectives can be probed from one
    starting point); ``events`` picks the shared events (``EVENT_RULES``; at most ``max_events`` of them, spread
    round-robin over the groups). ValueError naming the setting for ``max_events < 0``, an unknown rule or an
    optimiser the probe cannot read.
    """
    if max_events < 0:
        raise ValueError(f"max_events must be >= 0, got max_events={max_events}")
    if not (max_grad_norm > 0):
        raise ValueError(f"max_grad_norm must be > 0 (math.inf: no clipping), got max_grad_norm={max_grad_norm}")
    spec = resolve_objective(objective)
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    found, shared, pairs = _pick_events(batch, events, max_events)
    saved_state = copy.deepcopy(optimizer.state_dict())
    theta0 = [p.detach().clone() for p in params]
    step = None
    try:  # an optimiser the probe cannot read is found after its step: the model and its state are put back all the same
        step = _take_step(score, optimizer, params, theta0, batch, spec, max_grad_norm)
        rows = _score_event_rows(score, params, theta0, torch.unique(torch.cat([shared.where[:, 0], pairs.flatten()])))
        report = DriftReport(
            _shared_drift(step, rows, shared),
            _pair_drift(step, rows, pairs, batch.mask.bool().cpu()),
            step.metrics,
            float(step.grad_scale),
            rule=events,
            found=int(found.where.shape[0]),
            found_whole=int(found.whole.sum()),
        )
    finally:
        kept = keep_step and step is not None
        _put_back(optimizer, params, step.theta1 if kept else theta0, None if kept else saved_state)
    return report


# ----------------------------------------------------------------------------- summaries


def summary(events: EventDrift) -> dict[str, float]:
    """Over the events: the mean absolute coef, each part of the first-order prediction (``PARTS``), predicted and
    measured change, and the first-order error mean |measured - predicted|; each part's share OF THE FIRST-ORDER
    PREDICTION, ``<part>_share`` = sum |part| / (sum over the four parts of sum |part|) (absent when that is 0);
    ``batch_cross_share`` = sum |cross| / (sum |direct| + sum |cross|), the cross term's share of this batch's own
    gradient's part (the update without the optimiser's state and weight decay); ``error_ratio`` = error / mean
    |measured| (absent when nothing moved), flagged above ``FIRST_ORDER_ERROR_LIMIT``. {} for no events."""
    if len(events) == 0:
        return {}
    size = {part: getattr(events, part).abs() for part in PARTS}  # (n,) each
    total = sum(float(x.sum()) for x in size.values())
    out = {"events": float(len(events)), "coef": float(events.coef.abs().mean())}
    out.update({part: float(x.mean()) for part, x in size.items()})
    out.update(
        predicted=float(events.predicted.abs().mean()),
        measured=float(events.measured.abs().mean()),
        error=float((events.measured - events.predicted).abs().mean()),
    )
    if total > 0:
        out.update({f"{part}_share": float(x.sum()) / total for part, x in size.items()})
    own = float(size["direct"].sum() + size["cross"].sum())
    if own > 0:
        out["batch_cross_share"] = float(size["cross"].sum()) / own
    if out["measured"] > 0:
        out["error_ratio"] = out["error"] / out["measured"]
    return {k: v for k, v in out.items() if math.isfinite(v)}
