"""The exact-cancellation arm (issue 58): eq 2's cancellation of the tokens a whole group shares, and nothing else.

Eq 2 sums, over the completions of a group that hold one (context, token) event (h*, v), the coefficients c_it of
grad log pi(v | h*): they cancel when sum_i c_it = 0. ``cancel = "shared_whole"`` finds the positions whose event EVERY
completion of the group holds (``whole_group_shared``: two or more members, each real at t with the same token at t
and the same context) and stops the gradient of log pi there (``stop_gradient_at``: sg(log pi) at those positions, log
pi elsewhere). So, on any preset:

- the loss's value and every metric computed from values are bit for bit those without the setting (sg is the
  identity on values);
- every other position's gradient is bit for bit the one without the setting (``torch.where``'s backward hands the
  upstream gradient through unchanged where the condition is False);
- every copy of a whole-group shared token gets d loss / d log pi = 0, so their net, eq 2's residual, is exactly 0.

It is an upper bound on what any in-group transform (DFPO's eqs 18, 50-55, or another) can gain from cancelling those
tokens: it cancels them exactly and changes nothing else, where a transform also reweights every other token of the
group. It takes every term that reads log pi at those positions out of the gradient (a KL or proximal penalty, an
NLL term, the online IPO loss); an entropy bonus reads ``entropy``, not log pi, and keeps its gradient. Events that
only part of a group holds (eq 2's partial events, ``dfpo.core.metrics.shared_events``) are left alone.

Context. ``token_ids`` alone: the context at t is the group's common prompt and the completion's tokens before t, so t
is shared when every member holds the same tokens at 0..t (a sequence model: ``shared_mask`` with ``prefix=True``, the
one definition, which ``dfpo.core.metrics`` re-exports for the residual metrics). With ``context_ids`` too, the context
at t is ``context_ids[:, t]`` itself (the toy's tabular policy, whose parameter row at t is its whole context:
``shared_mask(prefix=False)`` of both). A group of one completion shares nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .batch import TokenEvents
from .fields import Component, component_field
from .groups import group_index

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

CANCELS = ("none", "shared_whole")
"""none: the objective as it is; shared_whole: log pi gets no gradient at the tokens a whole group shares."""

CANCEL = component_field(
    "none",
    "cancel",
    "choice",
    "off by default: issue 58's exact-cancellation arm (this project's; no peer or paper setting), the mechanism under "
    "comparison like DFPO's transform",
    trust_region=False,
    choices=CANCELS,
    doc="shared_whole: sg(log pi) at every position whose (context, token) every completion of the group holds (eq 2's "
    "whole-group events): the loss and every other position's gradient unchanged, the shared tokens' gradient exactly 0. "
    "Needs token_ids.",
)


def shared_mask(keys: Tensor, mask: Tensor, group_ids: Tensor, *, prefix: bool = True) -> Tensor:
    """(B, T) bool: the positions whose context-token pair every member of the row's group holds (eq 2's h*, v).

    keys (B, T): what must agree (token ids; in the tabular toy, row * V + token); mask (B, T): real tokens;
    group_ids (B,). Position t of a group is shared when the group has at least two members, every member
    is real at t and has the first member's key at t, and, with ``prefix`` (a sequence model, whose
    context at t is the prefix 0..t-1 after the group's common prompt), at every earlier position too.
    """
    mask = mask.bool()
    B, T = keys.shape
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n = counts.numel()
    rows = torch.arange(B, device=keys.device)
    first = torch.full((n,), B, dtype=torch.long, device=keys.device).scatter_reduce(0, inverse, rows, reduce="amin")  # (n,)
    agree = (keys == keys.index_select(0, first.index_select(0, inverse))) & mask  # (B, T) the first member's key at t
    disagree = torch.zeros(n, T, dtype=torch.long, device=keys.device).index_add_(0, inverse, (~agree).long())
    shared = (disagree == 0) & (counts >= 2)[:, None]  # (n, T)
    if prefix:
        shared = shared.long().cumprod(-1).bool()
    return shared.index_select(0, inverse)  # (index_select: advanced indexing is ~100x slower on small CPU tensors)


def whole_group_shared(token_ids: Tensor, mask: Tensor, group_ids: Tensor, context_ids: Tensor | None = None) -> Tensor:
    """(B, T) bool: the positions whose (context, token) event, eq 2's (h*, v), every member of a group of two or more holds.

    token_ids, mask (B, T); group_ids (B,). ``context_ids`` None: the context is the prefix (every member holds the same
    tokens at 0..t, and is real there); (B, T): the context is ``context_ids`` at t (every member holds the same context
    id and token at t). ``shared_mask``, the one definition of a whole-group event.
    """
    if context_ids is None:
        return shared_mask(token_ids, mask, group_ids, prefix=True)  # (B, T)
    return shared_mask(token_ids, mask, group_ids, prefix=False) & shared_mask(context_ids, mask, group_ids, prefix=False)


def whole_group_events(shared: Tensor, group_ids: Tensor) -> Tensor:
    """The number of whole-group events: (group, position) pairs marked in ``shared`` (B, T), one per group however many
    members hold it (0-d long). Every member of a group has the same row of a ``whole_group_shared`` mask, so a group's
    marked positions divide by its size exactly (integers: no round-off)."""
    index, n = group_index(group_ids)
    sizes = torch.bincount(index, minlength=n).clamp(min=1)  # (n,)
    marked = torch.zeros(n, dtype=torch.long, device=shared.device).index_add_(0, index, shared.sum(-1))  # (n,)
    return (marked // sizes).sum()


def stop_gradient_at(logp: Tensor, where: Tensor) -> Tensor:
    """sg(logp) where ``where`` (B, T) holds, logp elsewhere (B, T): the same values; no gradient to logp at ``where``."""
    return torch.where(where, logp.detach(), logp)


def cancel_step(spec: ObjectiveSpec, logp: Tensor, events: TokenEvents) -> tuple[Tensor, dict[str, Tensor]]:
    """The log-probs every later step of ``policy_loss`` reads (B, T), and ``shared/whole_group_positions``: ``logp``
    itself for ``cancel="none"``; for ``"shared_whole"``, sg(log pi) at the whole-group shared positions (eq 2)."""
    if spec.cancel == "none":
        return logp, {}
    shared = whole_group_shared(events.token_ids, events.mask, events.group_ids, events.context_ids)  # (B, T)
    count = whole_group_events(shared, events.group_ids).to(logp.dtype)
    return stop_gradient_at(logp, shared), {"shared/whole_group_positions": count}


def _cancel_inputs(spec: ObjectiveSpec) -> dict[str, str]:
    return {"token_ids": f"cancel={spec.cancel!r}"} if spec.cancel != "none" else {}


CANCEL_COMPONENT = Component("cancel", required_inputs=_cancel_inputs, logp_step=cancel_step)
"""The exact-cancellation arm: reads token_ids (and context_ids where given); a group is its unit, so micro-batches of
whole groups stay exact (no batch coupling)."""
