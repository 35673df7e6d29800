"""A half-precision head's casts in the fused pass: d loss / d logits narrowed for the two gradient matmuls inside the
float32 block's own bytes, and W's gradient product made in the half those bytes free (package doc: "Half-precision
inputs"). The casts themselves are ``dfpo.core.cast_in_place``'s, which ``head_logits`` shares."""

from __future__ import annotations

import torch
from torch import Tensor

from ..cast_in_place import CastsOf


def for_matmuls(dz: Tensor, casts_of: CastsOf, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """d loss / d z (n, V) float32 in the weight's ``dtype`` for the two gradient matmuls, and ``room``.

    A half-precision block is cast in place (``casts_of``), and ``room`` (n V,) is the half of the float32 block's
    bytes that the cast leaves free, scratch for the d W product; any other block is cast with ``.to`` (no room).
    """
    casts = casts_of(dz)
    if casts is not None:
        return casts.narrow_(), casts.free
    return dz.to(dtype), None


def add_product_in_slices(out: Tensor, dz: Tensor, h: Tensor, room: Tensor | None, *, written: bool) -> None:
    """out (V, H) float32 += dz^T (V, n) h (n, H) of a half-precision dz and h (``=`` where not ``written``).

    The product is made in ``room`` (a flat scratch of dz's dtype) in slices of V that fit it, so no (V, H)
    half-precision temporary exists; without room, in one fresh (V, H).
    """
    V, H = out.shape
    step = V if room is None else max(1, room.numel() // H)  # rows of V per product
    for v in range(0, V, step):
        w = min(step, V - v)
        dz_v = dz[:, v : v + w].T  # (w, n)
        part = dz_v @ h if room is None else torch.mm(dz_v, h, out=room[: w * H].view(w, H))  # (w, H)
        out[v : v + w].add_(part) if written else out[v : v + w].copy_(part)
