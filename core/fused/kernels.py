"""The elementwise work on one (n, V) block of logits: the softmax statistics (the target's log-prob, the entropy) and
d loss / d logits, eager in place or through ``torch.compile`` (package doc: the paragraph on ``compile``)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

_LOG_P_EXACT = -64.0
"""Below this log-prob (p about 1.6e-28) the eager kernel takes the target's log-prob as z_y - logsumexp rather than
log p_y: float32's normal range ends at 1.2e-38, where p_y would lose digits (and 0 would give -inf)."""


def _syncs_are_dear(device: torch.device) -> bool:
    """Whether reading a value back from ``device`` stalls it: off the CPU a host synchronisation waits for every
    queued kernel and leaves the device idle while the next ones are launched; on the CPU it is free."""
    return device.type != "cpu"


def _eager_stats_(
    z: Tensor,
    targets: Tensor,
    spare: Tensor | None,
    logits_of: Callable[[Tensor], Tensor],
    *,
    sync_free: bool = False,
    keep_p: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """logp of the targets (n,) and, when ``spare`` is given, the entropy (n,), from logits ``z`` (n, V).

    ``z`` is overwritten with what ``_eager_grad_`` needs: p without entropy; p log p with it (and p in ``spare``).
    PyTorch's row-wise softmax kernels run in place, so no (n, V) temporary is made. Rows whose p_y nears float
    underflow (rare) take z_y - logsumexp from their logits made again by ``logits_of`` (row indices -> (k, V)),
    so no pass over the block keeps the maximum for them. Finding those rows reads a count back from the device;
    ``sync_free`` (off the CPU, ``_syncs_are_dear``) reads log p_y off an in-place log-softmax instead and makes p
    from it, one more pass over the block and no synchronisation, which a block of statistics alone skips
    (``keep_p=False``: ``z`` is then left holding log p).
    """
    if spare is None and sync_free:
        torch._log_softmax(z, -1, False, out=z)  # (n, V) log p
        logp = z.gather(-1, targets[:, None]).squeeze(-1)  # (n,)
        if keep_p:
            z.exp_()  # (n, V) p
        return logp, None
    if spare is None:
        z_y = z.gather(-1, targets[:, None]).squeeze(-1)  # (n,)
        torch._softmax(z, -1, False, out=z)  # (n, V) p
        logp = z.gather(-1, targets[:, None]).squeeze(-1).log()  # (n,) log p_y, exact to round-off while p_y is normal
        tiny = (logp < _LOG_P_EXACT).nonzero().squeeze(-1)  # (k,) rows where p_y nears float underflow: rare
        if tiny.numel():
            logp[tiny] = z_y[tiny] - torch.logsumexp(logits_of(tiny), -1)
        return logp, None
    torch._log_softmax(z, -1, False, out=z)  # (n, V) log p
    logp = z.gather(-1, targets[:, None]).squeeze(-1)  # (n,)
    p = torch.exp(z, out=spare)  # (n, V)
    return logp, -z.mul_(p).sum(-1)  # z: p log p; H = -sum p log p


def _eager_grad_(z: Tensor, targets: Tensor, spare: Tensor | None, entropy: Tensor | None, c: Tensor, e: Tensor | None) -> Tensor:
    """d loss / d z (n, V) = c (onehot - p) - e p (log p + H), written over ``z`` (or ``spare``) after ``_eager_stats_``."""
    if spare is None:
        dz = z.mul_(-c[:, None])  # -c p
    elif e is None:
        dz = spare.mul_(-c[:, None])  # -c p
    else:
        dz = z.mul_(-e[:, None]).addcmul_(spare, -(c + e * entropy)[:, None])  # -e p log p - (c + e H) p
    return dz.scatter_add_(-1, targets[:, None], c[:, None])


def _softmax_stats(z: Tensor, targets: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """(logsumexp (n,), logp of the targets (n,), entropy (n,) or None) of logits ``z`` (n, V); ``z`` is left as it is.
    Written for ``torch.compile`` (one fused kernel); the entropy is log S - sum_k s_k (z_k - max) / S, s = exp(z - max)."""
    top = z.amax(-1, keepdim=True)  # (n, 1)
    shifted = z - top  # (n, V)
    total = shifted.exp().sum(-1)  # (n,)
    log_total = total.log()
    logp = shifted.gather(-1, targets[:, None]).squeeze(-1) - log_total  # (n,)
    entropy = log_total - (shifted.exp() * shifted).sum(-1) / total if with_entropy else None
    return top.squeeze(-1) + log_total, logp, entropy


def _logits_grad_(z: Tensor, lse: Tensor, entropy: Tensor | None, c: Tensor, e: Tensor | None) -> None:
    """Write -p (c + e (log p + H)) over ``z`` (n, V), the part of d loss / d z off the targets (``torch.compile``d)."""
    logp_all = z - lse[:, None]  # (n, V)
    coef = c[:, None] if e is None else c[:, None] + e[:, None] * (logp_all + entropy[:, None])
    z.copy_(-logp_all.exp() * coef)


class _Kernels:
    """The elementwise work of one (n, V) block: ``stats`` (logp, entropy) and ``grad`` (d loss / d z), eager or compiled."""

    def __init__(self, compile: bool):
        self.compiled = compile
        if compile:
            self._stats = torch.compile(_softmax_stats, dynamic=True)
            self._grad = torch.compile(_logits_grad_, dynamic=True)

    def _fall_back(self, err: Exception) -> None:
        warnings.warn(
            f"torch.compile failed ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); the eager kernels run instead",
            stacklevel=4,
        )
        self.compiled = False

    def stats(
        self,
        z: Tensor,
        targets: Tensor,
        spare: Callable[[], Tensor | None],
        with_entropy: bool,
        logits_of: Callable[[Tensor], Tensor],
        keep_p: bool = True,
    ) -> tuple[Tensor, Tensor | None, object]:
        """(logp (n,), entropy (n,) or None, state for ``grad``); ``spare()`` gives the eager entropy kernels' second
        block, asked for only when they run (a compiler failure at the first call included); ``logits_of(rows)``
        makes some rows' logits (k, V) again; ``keep_p=False``: no gradient follows, so p need not be left in the
        block (``_eager_stats_``)."""
        if self.compiled:
            try:
                lse, logp, entropy = self._stats(z, targets, with_entropy)
                return logp, entropy, lse
            except Exception as err:  # noqa: BLE001 -- any compiler failure: run eagerly instead, said in a warning
                self._fall_back(err)
        sync_free = _syncs_are_dear(z.device)
        logp, entropy = _eager_stats_(z, targets, spare() if with_entropy else None, logits_of, sync_free=sync_free, keep_p=keep_p)
        return logp, entropy, None

    @staticmethod
    def probs_(z: Tensor) -> Tensor:
        """p (n, V) written over logits ``z``: one in-place softmax, for a block whose statistics a pass before took."""
        return torch._softmax(z, -1, False, out=z)

    def probs(self, z: Tensor, spare: Tensor | None, state: object, entropy: Tensor | None, e: Tensor | None) -> Tensor | None:
        """The block holding p (n, V) after the eager statistics, where d loss / d z = c (onehot - p) has no entropy
        term (``e`` None); None where it has one or the compiled kernels ran (their z holds the logits). Arguments as
        ``grad``'s."""
        if state is not None or e is not None:
            return None
        return z if entropy is None else spare

    def grad(
        self, z: Tensor, targets: Tensor, spare: Tensor | None, state: object, entropy: Tensor | None, c: Tensor, e: Tensor | None
    ) -> Tensor:
        """d loss / d z (n, V), in one of the blocks' buffers."""
        if state is not None:  # compiled stats ran: z still holds the logits
            self._grad(z, state, entropy, c, e)
            return z.scatter_add_(-1, targets[:, None], c[:, None])
        return _eager_grad_(z, targets, spare if entropy is not None else None, entropy, c, e)
