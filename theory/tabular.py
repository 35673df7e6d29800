"""A real softmax-table policy on which the ledger runs the project's own loss core.

The policy is a table of logits, one row per context (state), ``pi(a | h) = softmax(table[h])``.
A group of G completions shares ONE context-token pair (h*, a*) at position 0 (the event
E_t* of Prop. 3.1); every other position has a context of its own, so the gradient that lands
on row h* of the table comes from the shared token alone:

    d loss / d table[h*] = c * (e_{a*} - pi(. | h*))           (softmax score of the shared token)

and ``c`` is the group's aggregate coefficient on the shared token (eq 2, eq 72). Cancellation
(eq 2) holds exactly when c = 0. The log-ratios log pi/pi_old are set directly through
``old_logp``: the shared token has the same ratio in every completion (same context, same
token, same old policy), the other tokens get whatever a check asks for.

Everything runs in float64 so that "zero" means |c| < 1e-12, not a tolerance chosen to pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.loss import policy_loss

ZERO_TOL = 1e-12
"""|coefficient| below this counts as exact cancellation (float64, coefficients of order 1)."""


@dataclass(frozen=True)
class TabularGroup:
    """A group of completions on a softmax table, with the shared token at position 0."""

    table: Tensor
    """(S, V) logits, a leaf with requires_grad; row 0 is the shared context h*."""
    states: Tensor
    """(B, T) context id of every position (0 at the shared position, padding 0)."""
    tokens: Tensor
    """(B, T) token id (a* = 0 at the shared position)."""
    mask: Tensor
    """(B, T) bool, True on real tokens."""
    log_ratio: Tensor
    """(B, T) log pi_theta - log pi_old at every real token (the shared one equal across the group)."""

    def logp(self) -> Tensor:
        """(B, T) log pi_theta(y_it | h_it), a function of ``table`` (autograd flows)."""
        logsm = torch.log_softmax(self.table, dim=-1)  # (S, V)
        out = logsm[self.states, self.tokens]  # (B, T)
        return torch.where(self.mask, out, torch.zeros_like(out))

    def old_logp(self) -> Tensor:
        """(B, T) rollout log-probs: logp - log_ratio, detached."""
        return (self.logp() - self.log_ratio).detach()

    def entropy(self) -> Tensor:
        """(B, T) entropy of pi(. | h_it)."""
        logsm = torch.log_softmax(self.table.detach(), dim=-1)  # (S, V)
        ent = -(logsm.exp() * logsm).sum(-1)  # (S,)
        return torch.where(self.mask, ent[self.states], torch.zeros_like(self.log_ratio))

    def shared_score(self) -> Tensor:
        """(V,) d log pi(a* | h*) / d table[h*] = e_{a*} - pi(. | h*)."""
        p = torch.softmax(self.table.detach()[0], -1)
        e = torch.zeros_like(p)
        e[0] = 1.0
        return e - p


def tabular_group(
    token_log_ratios: Sequence[Sequence[float]],
    *,
    vocab: int = 4,
    seed: int = 0,
    shared_logit_shift: float = 0.0,
) -> TabularGroup:
    """Build a group whose completion i has len(token_log_ratios[i]) tokens.

    ``token_log_ratios[i][t]`` is log r_it; position 0 is the shared token and must hold the
    same value in every completion (a ValueError says otherwise). ``shared_logit_shift`` is
    added to the logit of a* at h* (negative values make the shared token improbable).
    """
    lengths = [len(row) for row in token_log_ratios]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"every completion needs at least the shared token, got lengths={lengths}")
    shared = {float(row[0]) for row in token_log_ratios}
    if len(shared) != 1:
        raise ValueError(f"the shared token has one ratio in the whole group, got log-ratios {sorted(shared)}")
    B, T = len(lengths), max(lengths)
    gen = torch.Generator().manual_seed(seed)
    n_states = 1 + sum(L - 1 for L in lengths)
    table = torch.randn(n_states, vocab, generator=gen, dtype=torch.float64)
    table[0, 0] += shared_logit_shift
    table.requires_grad_(True)
    states = torch.zeros(B, T, dtype=torch.long)
    tokens = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    log_ratio = torch.zeros(B, T, dtype=torch.float64)
    nxt = 1
    for i, row in enumerate(token_log_ratios):
        for t, value in enumerate(row):
            mask[i, t] = True
            log_ratio[i, t] = float(value)
            if t > 0:
                states[i, t] = nxt
                tokens[i, t] = int(torch.randint(vocab, (1,), generator=gen))
                nxt += 1
    return TabularGroup(table=table, states=states, tokens=tokens, mask=mask, log_ratio=log_ratio)


def log_ratios_for(seq_log_ratios: Sequence[float], lengths: Sequence[int], shared: float = 0.0) -> list[list[float]]:
    """Token log-ratios giving sequence i the geometric-mean log-ratio ``seq_log_ratios[i]`` (eq 44).

    Position 0 holds ``shared``; the other L_i - 1 positions share the rest equally (L_i >= 2).
    """
    rows = []
    for value, L in zip(seq_log_ratios, lengths):
        if L < 2:
            raise ValueError(f"length must be >= 2 to set a sequence ratio freely, got L={L}")
        rest = (L * float(value) - shared) / (L - 1)
        rows.append([shared] + [rest] * (L - 1))
    return rows


@dataclass(frozen=True)
class SharedGradient:
    """What the loss core's gradient does on the shared token."""

    coef: float
    """c in d loss / d table[h*] = c * (e_{a*} - pi(.|h*)); 0 means exact cancellation."""
    off_direction: float
    """Norm of the part of row h*'s gradient not along the shared score (should be ~0)."""
    total_norm: float
    """Norm of the whole table gradient (non-zero: the update is not killed)."""
    loss: float


def shared_gradient(
    objective: str,
    group: TabularGroup,
    advantages: Sequence[float],
    *,
    group_ids: Sequence[int] | None = None,
    with_entropy: bool = False,
    **overrides: object,
) -> SharedGradient:
    """Gradient of ``dfpo.policy_loss(objective, ...)`` on the table, read on the shared row."""
    B = group.mask.shape[0]
    adv = torch.tensor([float(a) for a in advantages], dtype=torch.float64)  # (B,)
    gids = torch.tensor(list(group_ids) if group_ids is not None else [0] * B, dtype=torch.long)  # (B,)
    logp = group.logp()  # (B, T)
    loss, _ = policy_loss(
        objective,
        logp=logp,
        old_logp=group.old_logp(),
        advantages=adv,
        mask=group.mask,
        group_ids=gids,
        entropy=group.entropy() if with_entropy else None,
        **overrides,
    )
    (grad,) = torch.autograd.grad(loss, group.table)  # (S, V)
    d = group.shared_score()  # (V,)
    row = grad[0]
    coef = float(row @ d / (d @ d))
    off = float(torch.linalg.vector_norm(row - coef * d))
    if not torch.isfinite(grad).all():
        raise ValueError(f"non-finite gradient from objective={objective!r}")
    return SharedGradient(coef=coef, off_direction=off, total_norm=float(torch.linalg.vector_norm(grad)), loss=float(loss.detach()))


ROUND_OFF = 1e-13
"""Below this in size a value is float round-off: ``fmt`` prints the bound, not the digits."""


def fmt(x: float) -> str:
    """Short float for evidence strings; a value within 1e-13 of 0, exactly 0 included, prints as '0 (within 1e-13)'.

    Round-off residues differ between CPUs and BLAS builds, down to exactly 0 on one machine and 3e-16 or -3e-16 on
    another; one string for all of them keeps the generated ledger identical across machines.
    """
    if abs(x) < ROUND_OFF:
        return f"0 (within {ROUND_OFF:g})"
    return f"{x:.3g}"


def equals(x: float) -> str:
    """``fmt(x)`` after the relation it states: '= 0.0973', or '= 0 (within 1e-13)' for round-off."""
    return f"= {fmt(x)}"


def own_token_coefficients(
    objective: str,
    group: TabularGroup,
    advantages: Sequence[float],
    *,
    group_ids: Sequence[int] | None = None,
    **overrides: object,
) -> Tensor:
    """(B, T) coefficient of grad log pi(y_it) for every non-shared token (t >= 1), NaN elsewhere.

    Each non-shared position has a context of its own, so its row of d loss / d table is
    c_it * (e_{y_it} - pi(. | h_it)); c_it is read off by projection. The sign of -c_it is the
    direction in which the update moves log pi(y_it) (the loss is minimised).
    """
    B = group.mask.shape[0]
    adv = torch.tensor([float(a) for a in advantages], dtype=torch.float64)  # (B,)
    gids = torch.tensor(list(group_ids) if group_ids is not None else [0] * B, dtype=torch.long)
    loss, _ = policy_loss(
        objective, logp=group.logp(), old_logp=group.old_logp(), advantages=adv, mask=group.mask, group_ids=gids, **overrides
    )
    (grad,) = torch.autograd.grad(loss, group.table)  # (S, V)
    probs = torch.softmax(group.table.detach(), -1)  # (S, V)
    out = torch.full(group.mask.shape, float("nan"), dtype=torch.float64)
    for i in range(B):
        for t in range(1, group.mask.shape[1]):
            if group.mask[i, t]:
                s = int(group.states[i, t])
                d = -probs[s].clone()
                d[int(group.tokens[i, t])] += 1.0
                out[i, t] = grad[s] @ d / (d @ d)
    return out


def trie_group(
    token_seqs: Sequence[Sequence[str]],
    *,
    token_log_ratios: Sequence[Sequence[float]] | None = None,
    seed: int = 0,
) -> tuple[TabularGroup, dict[tuple[str, ...], int], list[str]]:
    """A group of word sequences on a softmax table whose contexts are the sequences' prefixes.

    Completions that start with the same words share those contexts (the prefix trie), as in
    the paper's App. A ("The answer is 25." / "The answer is 20."). Returns the group, the map
    prefix -> state (row of the table) and the vocabulary (column order). ``token_log_ratios``
    defaults to 0 everywhere (on-policy); it must give equal values to equal (prefix, token)
    pairs, which a ValueError enforces.
    """
    vocab = sorted({w for seq in token_seqs for w in seq})
    col = {w: k for k, w in enumerate(vocab)}
    states: dict[tuple[str, ...], int] = {}
    for seq in token_seqs:
        for t in range(len(seq)):
            states.setdefault(tuple(seq[:t]), len(states))
    B, T = len(token_seqs), max(len(s) for s in token_seqs)
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(len(states), len(vocab), generator=gen, dtype=torch.float64).requires_grad_(True)
    st = torch.zeros(B, T, dtype=torch.long)
    tok = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    lr = torch.zeros(B, T, dtype=torch.float64)
    seen: dict[tuple[tuple[str, ...], str], float] = {}
    for i, seq in enumerate(token_seqs):
        for t, w in enumerate(seq):
            st[i, t], tok[i, t], mask[i, t] = states[tuple(seq[:t])], col[w], True
            value = 0.0 if token_log_ratios is None else float(token_log_ratios[i][t])
            key = (tuple(seq[:t]), w)
            if seen.setdefault(key, value) != value:
                raise ValueError(f"the pair {key} has one ratio in the whole group, got {seen[key]} and {value}")
            lr[i, t] = value
    return TabularGroup(table=table, states=st, tokens=tok, mask=mask, log_ratio=lr), states, vocab


def row_coefficient(grad: Tensor, table: Tensor, state: int, token: int) -> float:
    """c such that grad[state] = c * (e_token - pi(.|state)) + (rest); the projection onto that score."""
    d = -torch.softmax(table.detach()[state], -1)
    d[token] += 1.0
    return float(grad[state] @ d / (d @ d))
