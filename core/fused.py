"""The LM head and the loss in one pass: any objective's loss and its gradients with three matmuls.

``token_logprobs`` returns log-probs and lets ``policy_loss`` run afterwards, so its backward recomputes every
chunk's logits: four (N, V, H) matmuls where three suffice. ``fused_policy_loss`` takes the loss's gradient inside
the forward, chunk by chunk (as Liger-Kernel's fused linear losses do), and the backward only hands it on:

    for each chunk of positions (whole coupling units, below):
        z = (h / temperature) W^T                        (n, V)  matmul 1, then float32
        logp_t = z_t[y_t] - logsumexp(z_t), H_t          (n,)    softmax statistics
        c, e = d loss / d logp, d loss / d H             (B, T)  autograd through ``policy_loss`` itself
        dz_t = c_t (onehot(y_t) - p_t) - e_t p_t (log p_t + H_t)
        d h += dz W / temperature                        (n, H)  matmul 2
        d W += dz^T h / temperature                      (V, H)  matmul 3

The coefficients c and e come from the loss core: autograd through ``policy_loss`` on leaf log-probs (and
entropies) of the whole batch, so no objective's formula is written here and every objective of ``OBJECTIVES``
(and every override) is exact. That (B, T)-sized call runs once per chunk; the V-sized work is the matmuls.

Where nothing reads the entropy (e = 0) and the head is float32 (or float64), dz = c (onehot(y) - p) is never
written: c goes on the (n, H) side, d h = c (W_y - p W) and d W += -p^T (c h) plus c h added at the target rows, so
the matmuls read p where the softmax left it and a block's logits see one pass (the softmax) besides the matmuls,
not three (softmax, scale, scatter). In float32 both orders carry round-off of the order eps c max |W_v|. A
half-precision head keeps dz: its d h leaves the matmul rounded to half precision, and c (W_y - p W) rounded there
would lose (1 - p_y) W_y to cancellation where p_y is near 1.

Coupling units (``coupling_unit``). The coefficient of a position is known once every log-prob it depends on is:
- ``token``: its own (GRPO, Dr. GRPO, DAPO, CISPO, SAPO, GPG, DPPO, token-level rollout corrections): chunks of
  ``chunk_size`` positions anywhere in the batch;
- ``row``: its completion's (a sequence ratio: GSPO, GSPO-token, GMPO, VESPO, LUSPO; the off-policy sequence mask;
  a sequence-level rollout correction);
- ``group``: its group's (DFPO's in-group transforms, and any setting this module does not know: a group is always
  exact for an objective that is not batch-coupled, as the trainer's micro-batches of whole groups are);
- ``batch``: the whole batch's (``ObjectiveSpec.batch_coupled``: STAPO, top-entropy, Clip-Cov, KL-Cov, a
  renormalised mask, an entropy bonus outside token_mean).

One pass or two (``chunk_plan``). Units are packed in order into chunks of at most ``chunk_size`` positions; a unit
longer than that is a chunk of its own, held in one pass when its float32 logits fit ``max_logits_mib``. A unit that
does not fit takes two passes: its log-probs and entropies first (the batch statistics a batch-coupled objective
needs; one matmul, in chunks of ``chunk_size``), then its coefficients, then the fused pass over it again (three
matmuls). Its cost is a fourth matmul, 4/3 of the floor, and a second softmax pass. ``fused/two_pass`` (a metric) is
the share of real tokens that took two passes: 0 when everything ran in one.

Completions scaled once (``row_scaled``). Under a sequence-level ratio, clip and weight with nothing per token (GSPO,
GSPO-token, LUSPO, VESPO, and DFPO, whose transform maps a group's sequence weights), a completion's coefficients are
c_t = k w_t: one factor k of the sequence ratios times weights w_t fixed before them. Its gradient is then k times
its gradient at any other log-probs, so a unit longer than a block runs completion by completion, in blocks, at
its placeholder coefficients c0 (ratio 1), its rows of d hidden written and each completion's d W summed apart in a
(V, H) buffer; once its last block is known, each completion's k = c / c0 scales both (d W added to the total). Three
matmuls, and a block of logits plus a (V, H) buffer per completion, where holding the unit would take its whole
(L, V) logits (256 MiB for a completion of L = 2048 at V = 32k; 2 GiB for a group of eight). Where a block's logits
are large (``scaled_block_size``: over 128 MiB) the blocks are halved, which keeps a completion's pass to the
weight's gradient, its buffer and half of one more W-sized tensor (GSPO at 8 x 2048, V = 152k, H = 512: 790 MiB
against 938 in whole blocks and Liger's 827 to 844; 1.05x the floor); at V = 32k they stay whole (1.03x against 1.06x
in half blocks, docs/throughput.md). A completion runs so where it holds less than that (L > a scaled block + H) or
where it would take two passes. A group
runs so only where it would take two passes: held, it is one sum with no scaling (DFPO's group of eight at 8 x 2048,
V = 32k: 1.02x the floor held, in one round; 1.05x and 1.06x scaled, in two runs of two rounds). Its first
completions get a buffer, as many as ``max_logits_mib`` holds (at least one, the size of W's own gradient); the
others' log-probs are taken in the same pass and their gradients in a second one, after the unit's last block (a
group of eight at V = 152k, H = 512: six buffers in 2 GiB, so a quarter of its tokens take two passes instead of all:
1.16x the floor, against 1.05x with all eight buffers in a 2.5 GiB budget). A Min-Replace group (``group_folded``)
needs no buffer per completion: its factors are k_i = u_i v, the completion's own times the group's minimum, so
each completion's d W, summed in one buffer at the coefficients it ran at, is added at its k to the group's sum after
that sum is scaled by the r every earlier factor changed by (a float beside the sum, applied once at the end); the group's sum is W's gradient itself while that is
empty (else a second buffer, where the budget has room). The common r is checked after every completion, and a
group where it breaks runs again (``dfpo_min``'s group of eight at V = 152k, H = 512: 1.04x the floor in 790 MiB,
docs/throughput.md). With no gradient for W there is nothing to sum and every completion is scaled. Each buffered completion's c is checked against k c0 (to a hundred
round-offs); one that is not a multiple (c0 = 0 where a truncating transform zeroes a weight at ratio 1, or a rule
this module does not know) runs again at its coefficients. ``fused/two_pass`` counts the tokens that ran twice,
``fused/row_scaled`` the tokens scaled.

The elementwise work on each (n, V) block runs either as PyTorch's own fused row kernels in place (``compile=False``:
softmax or log-softmax written over the logits, no (n, V) temporary) or as two ``torch.compile``d functions
(``compile=True``: the statistics in one fused kernel, d loss / d logits in another); both give the same numbers
to float round-off. ``compile=True`` compiles only where it helps: with entropies, whose eager kernels need a second
(n, V) block (p beside log p) that the compiled ones do not; without them the eager kernels are one in-place softmax
(and, in half precision, one in-place scale), as fast as the compiled pair on CPU (16 x 128, V = 32k: 2.45 s either way),
and compiling would only add the compiler's resident state (about 25 MiB, and about 190 MiB of torch._inductor loaded
at the first call), so they run eagerly. If torch.compile fails (no C++ compiler, an unsupported platform) the eager kernels run and a
warning says so. Half-precision inputs: the LM head's matmul runs in the weight's dtype (the hidden states are cast
to it), everything after it in float32; the weight's gradient accumulates in float32. The matmul's half-precision
logits and the half-precision copy of d loss / d logits live in the float32 block's own bytes, cast in place
(``cast_in_place``), and the weight gradient's half-precision product in the half of them the cast frees (in slices
of V where a block has fewer positions than H): no half-precision (n, V) block and no (V, H) temporary, which the
casts with ``.to`` made (CPU, bf16, 16 x 128, V = 32k: 214 MiB extra against 280, the same bits). Off the CPU a
half-precision head's default block is 3/4 of H positions (``default_chunk_size``): with the float32 block and W's
float32 gradient the pass then holds less than Liger's compiled bf16 step (H100: 118 MiB against 130 at
16 x 128, V = 32k; blocks of H held 134). No (B, T, V) tensor exists.

One solve on a GPU (``solve_once``). Each coefficient call is ``policy_loss`` and its gradient on (B, T) tensors:
about 360 small kernels and 11 host synchronisations (GRPO, counted with torch.profiler), which a GPU runs in about
4 ms whatever B x T, more than a block's three matmuls there (8 x 2048, V = 32k, H = 512, bf16, H200: 0.148 s for
GRPO's 33 calls against 0.028 s for ``token_logprobs`` then ``policy_loss``; docs/throughput.md). On the CPU the
matmuls dominate and the call is noise. So off the CPU the whole batch runs as one unit in two passes by default: the
log-probs (and entropies) of every block, one coefficient call, then the fused pass: four matmuls per block, an
in-place log-softmax in the first pass and a softmax in the second (whose log-probs are known, so nothing else runs
over the block without entropies), one call, exact for every objective (the two-pass path above, for the whole batch);
``fused/two_pass`` is then 1. Nor does a block read anything back from the GPU (``_syncs_are_dear``): the finite
check of a pass is one flag read at its end, the chunks' layout is read once per call, and the target's log-prob
comes off an in-place log-softmax instead of a search for rows near underflow. A step of GRPO at 8 x 2048 in blocks
of 512 reads back 17 scalars and runs one ``nonzero``, against 144 and 65 before (torch.profiler, CPU).

Where this departs from ``policy_loss(token_logprobs(...))``:
1. Positions whose logits are not computed yet hold placeholders (logp = old_logp: ratio 1; entropy 0) in a chunk's
   coefficient call. A chunk's coefficients do not depend on them (its units are whole); the tests check it for
   every preset and the equality of loss and gradients with the reference.
2. The loss and metrics returned are those of the last coefficient call, when every position is known: equal to
   ``policy_loss`` on the batch. The backward hands on gradients computed in the forward, so it runs once
   (``retain_graph`` double backward is refused), and double backward (Hessians) is not supported.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .cast_in_place import CastsOf
from .logprobs import check_head_inputs, head_logits
from .loss import ObjectiveSpec, policy_loss, resolve_objective
from .loss.core import LOGP_FLOOR

COUPLING_UNITS = ("token", "row", "group", "batch")

_TOKEN_LOCAL = {
    "ratio_level": ("token",),
    "transform": ("none",),
    "token_mask": ("none",),
    "cov_control": ("none",),
    "rollout_correction": ("none", "token_truncate", "token_mask"),
    "clip": ("ppo", "symmetric", "cispo", "sapo", "vespo", "pg", "dppo_tv", "dppo_kl", "none"),
}
"""Choice fields and the values at which a position's coefficient reads its own log-prob only."""
_ROW_LOCAL = {
    **_TOKEN_LOCAL,
    "ratio_level": ("token", "sequence_token", "sequence", "sequence_product", "geometric"),
    "token_mask": ("none", "opsm"),
    "rollout_correction": ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
}
"""The same for a position's own completion (row)."""
_LOCAL_ANY_VALUE = frozenset(
    {
        "eps_low", "eps_high", "dual_clip_c", "sapo_tau_pos", "sapo_tau_neg", "vespo_k_pos", "vespo_lambda_pos",
        "vespo_k_neg", "vespo_lambda_neg", "tr_floor", "stopgrad", "length_aware", "mask_renormalise", "stapo_tau_p",
        "stapo_q", "top_entropy_frac", "opsm_delta", "cov_ratio", "cov_clip_low", "cov_clip_high", "kl_cov_coef",
        "aggregation", "max_completion_length", "beta", "rollout_low", "rollout_cap", "entropy_coef", "adv_scale",
        "adv_eps",
    }
)  # fmt: skip
"""Fields that never couple positions beyond what the choice fields above decide (a coupling they add, e.g. an
entropy bonus outside token_mean, is a batch coupling the spec reports itself)."""


def coupling_unit(spec: ObjectiveSpec) -> str:
    """The smallest set of positions whose log-probs a position's loss coefficient depends on (``COUPLING_UNITS``).

    ``batch`` for a batch-coupled spec; ``token`` / ``row`` when every choice field holds a value known to be
    local to a position / a completion; ``group`` otherwise (DFPO's transforms, and any field or value this
    module does not know, such as a preset added later: a group is exact for every spec that is not batch-coupled).
    """
    return "batch" if spec.batch_coupled else _unit_of_fields(spec.components())


def _unit_of_fields(fields: dict[str, object]) -> str:
    """``coupling_unit`` of a spec that is not batch-coupled, from its component fields."""
    defaults = ObjectiveSpec.__dataclass_fields__
    for name, value in fields.items():  # a field added after this module: local only at its default
        if name not in _TOKEN_LOCAL and name not in _LOCAL_ANY_VALUE and value != defaults[name].default:
            return "group"
    for unit, local in (("token", _TOKEN_LOCAL), ("row", _ROW_LOCAL)):
        if all(fields[name] in values for name, values in local.items()):
            return unit
    return "group"


_ONE_WEIGHT_PER_ROW = ("sequence", "sequence_token", "sequence_product")
"""Ratio levels whose ratio, clip and weight take one value per completion (GMPO's geometric mean clips per token)."""


def row_scaled(spec: ObjectiveSpec) -> bool:
    """Whether each completion's loss coefficients are one factor times weights fixed before the log-probs.

    d loss / d logp_t = k_i w_t for t in completion i, with w_t read from the mask, the advantages and the old and
    rollout log-probs only, and k_i from the sequence ratios: a sequence-level ratio, clip and weight
    (``_ONE_WEIGHT_PER_ROW``), no entropy read, no per-token KL term, and nothing beyond the completion but DFPO's
    in-group transform (which maps the group's sequence weights to new ones, so k_i reads the group). Then a
    completion's gradient can be accumulated at placeholder log-probs and scaled once by k_i when its unit's last block
    is done: three matmuls and a (possibly halved) block of logits beside its (V, H) buffer, whatever its length
    (module doc).
    ``fused_head_loss`` checks the proportionality on each completion and runs a completion again, at its own
    coefficients, where it breaks.
    """
    if spec.batch_coupled or spec.needs_entropy or spec.ratio_level not in _ONE_WEIGHT_PER_ROW or spec.beta != 0:
        return False
    return _unit_of_fields({**spec.components(), "transform": "none"}) == "row"


def group_folded(spec: ObjectiveSpec) -> bool:
    """Whether a group's completion factors are k_i = u_i v: u_i read from completion i's own log-probs, v one factor
    of the whole group.

    DFPO's Min-Replace (eq 50) in the ``ratio`` and ``score`` forms: stilde_i = min_j sbar_j (L_i min_j sbar_j / L_j
    length-aware), so c_it = -stilde_i A_i / L_i on a sequence inside its clip range (0 outside it in the ratio form):
    u_i reads A_i, L_i and sequence i's own clip, v is the group's minimum. Then a group's d W is summed in one (V, H)
    buffer as its completions come: when a completion is done every earlier factor changes by the same r (the new
    minimum over the old), so the sum is scaled by r and the new completion added at its k (module doc). The
    projections (eqs 18, 51-55) mix the group's weights, and the ``none`` form differentiates the minimum itself, so
    neither is one factor. ``fused_head_loss`` checks the common r after every completion and runs the group again at
    its coefficients where it breaks.
    """
    return row_scaled(spec) and spec.transform == "min" and spec.stopgrad in ("ratio", "score")


CHUNK_BOUNDS = (256, 1024)
"""The least and the most positions per logits block that ``default_chunk_size`` picks."""


HALF_PRECISION_BLOCK_SHARE = 0.75
"""Off the CPU, a half-precision head's default block is at most this share of H positions (``default_chunk_size``)."""


def default_chunk_size(hidden_size: int, *, half_precision_off_cpu: bool = False) -> int:
    """Positions per logits block when ``chunk_size`` is None: the hidden size H, held within ``CHUNK_BOUNDS``.

    A block of H positions holds as many floats as the weight's gradient (n V = H V), so for H from 256 to 1024 a pass
    holds the weight's gradient and one block of its size, whatever the vocabulary. From 1024 hidden units up
    (Qwen3-0.6B and larger) blocks are 1024 positions; below 256 the per-block costs (a coefficient call, thinner
    matmuls) would show, so smaller models get 256.

    A half-precision head off the CPU (``half_precision_off_cpu``) takes at most ``HALF_PRECISION_BLOCK_SHARE`` of H
    positions (not below 256). There a float32 block of H positions and the weight's float32 gradient are together
    four times the half-precision weight, about what Liger's compiled bf16 step holds. On an H100 (H = 512, bf16,
    docs/throughput.md), blocks of 512 held 1.02x to 1.03x Liger's extra memory at three of the issue's four sizes;
    blocks of 384 held 0.53x to 0.91x at all four, still faster than Liger at each (0.05x to 0.78x). Blocks of 256
    were slower than Liger for GSPO at 8 x 2048, V = 32k (1.05x). The share is chosen from those runs at H = 512, not
    derived; for larger H the same arithmetic holds, but no GPU has run it.
    """
    low, high = CHUNK_BOUNDS
    block = min(high, max(low, int(hidden_size)))
    if half_precision_off_cpu:
        block = max(low, min(block, int(hidden_size * HALF_PRECISION_BLOCK_SHARE)))
    return block


def _half_precision_off_cpu(lm_head_weight: object) -> bool:
    """Whether ``lm_head_weight`` is a half-precision tensor off the CPU (``default_chunk_size``'s second case)."""
    return isinstance(lm_head_weight, Tensor) and lm_head_weight.dtype.itemsize == 2 and lm_head_weight.device.type != "cpu"


HALVED_BLOCK_MIB = 128.0
"""A scaled unit's logits block is halved where a whole one would hold more float32 logits than this (MiB)."""


def scaled_block_size(chunk_size: int, vocab_size: int, itemsize: int) -> int:
    """Positions per logits block of a scaled unit: ``chunk_size``, halved where that block's logits (``itemsize``
    bytes each) exceed ``HALVED_BLOCK_MIB``.

    A scaled pass holds W's gradient, the completion's (V, H) buffer and one block, at the default block of H positions
    each as large as the others. Where they are large (V = 152k, H = 512: 297 MiB) half a block takes the pass from
    three W-sized tensors to two and a half: GSPO at 8 x 2048 held 790 MiB against 938 in whole blocks and Liger
    compiled's 827 to 844, at 1.05x the floor either way. Where they are small (V = 32k: 64 MiB) halving saves 32 MiB
    and the thinner matmuls cost time: GSPO at 8 x 2048, three rounds alone, 1.06x the floor in half blocks and 1.03x
    in whole ones (207 and 240 MiB; Liger's 365). 128 MiB lies between the two measured vocabularies: chosen from
    them, not derived (docs/throughput.md).
    """
    whole_mib = chunk_size * vocab_size * itemsize / 2**20
    return max(1, chunk_size // 2) if whole_mib > HALVED_BLOCK_MIB else chunk_size


def chunk_plan(unit_sizes: list[int], chunk_size: int, max_unit: int) -> list[tuple[int, int, bool]]:
    """Ranges (start, end, two_pass) over positions laid out unit after unit, in order.

    Consecutive units are packed into chunks of at most ``chunk_size`` positions; a unit longer than
    ``chunk_size`` is a range of its own, one pass when it holds at most ``max_unit`` positions, else two
    passes (its ranges are cut into chunks of ``chunk_size`` when they run).
    """
    plan: list[tuple[int, int, bool]] = []
    pos, start = 0, 0
    for size in unit_sizes:
        if size > chunk_size:
            if pos > start:
                plan.append((start, pos, False))
            plan.append((pos, pos + size, size > max_unit))
            start = pos = pos + size
            continue
        if pos + size - start > chunk_size:
            plan.append((start, pos, False))
            start = pos
        pos += size
    if pos > start:
        plan.append((start, pos, False))
    return plan


# ----------------------------------------------------------------------------- elementwise kernels on (n, V) blocks


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


# ----------------------------------------------------------------------------- the logits blocks


_WORKSPACE = threading.local()
"""This thread's kept CPU buffers (``_kept``): ``slots``, a dict of flat tensors by slot."""


def _kept(slot: int, shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised buffer of ``shape``: slot 0 the logits block, 1 the eager entropy kernels' p (both (rows, V)),
    2 + i the (V, H) d W sum of a scaled unit's i-th completion (``row_scaled``).

    On CPU the buffer is kept per thread and reused by the next call: a fresh allocation is a fresh mapping of memory
    whose first write faults every page in (about 50 ms of system time for 128 MiB), which is more than the softmax over
    a block of that size. CUDA's caching allocator already reuses its blocks, so other devices allocate. What stays held
    between calls: the largest buffer each slot was asked for (``release_workspace`` frees them).
    """
    if device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    slots = getattr(_WORKSPACE, "slots", None) or {}
    held, size = slots.get(slot), shape[0] * shape[1]
    if held is None or held.dtype != dtype or held.numel() < size:
        slots.pop(slot, None)  # the old buffer goes before the new one is allocated
        held = slots[slot] = torch.empty(size, dtype=dtype)
    _WORKSPACE.slots = slots
    return held[:size].view(shape)


def release_workspace() -> None:
    """Free this thread's kept CPU buffers (``_kept``); the next fused call allocates them again."""
    _WORKSPACE.slots = None


# ----------------------------------------------------------------------------- the fused pass


@dataclass
class FusedHead:
    """What ``fused_head_loss`` returns."""

    loss: Tensor
    """0-d loss (``policy_loss``'s value); its backward hands on the gradients of ``hidden`` and the LM-head weight."""
    metrics: dict[str, Tensor]
    """``policy_loss``'s metrics on the batch and ``fused/two_pass``."""
    logp: Tensor
    """(B, T) detached log-probs of the targets, compute dtype, 0 at padding."""
    entropy: Tensor | None
    """(B, T) detached entropies (when the objective reads them or ``with_entropy``), 0 at padding."""
    logp_grad: Tensor | None
    """(B, T) d loss / d logp (the coefficients the gradient was built from); None without gradients."""
    finite: bool
    """False when a real position's log-prob came out non-finite: the work stopped there, loss is NaN, gradients 0."""


class _HandOn(torch.autograd.Function):
    """The loss value; its backward hands on gradients computed in the forward, times the upstream gradient."""

    @staticmethod
    def forward(ctx, loss: Tensor, hidden: Tensor, weight: Tensor, grads: list) -> Tensor:
        ctx.grads, ctx.dtypes = grads, (hidden.dtype, weight.dtype)
        return loss.detach().clone()

    @staticmethod
    def backward(ctx, upstream: Tensor):
        if ctx.grads is None:
            raise RuntimeError("fused_policy_loss's gradients are handed on once: call backward on its loss once (no retain_graph)")
        (grad_h, grad_w), ctx.grads = ctx.grads, None
        out = [None if g is None else g.mul_(upstream.to(g.dtype)).to(dt) for g, dt in zip((grad_h, grad_w), ctx.dtypes)]
        return None, out[0], out[1], None


@dataclass
class _Inputs:
    """The (B, T) loss inputs, checked and on the head's device."""

    spec: ObjectiveSpec
    old_logp: Tensor | None
    advantages: Tensor
    mask: Tensor  # bool
    group_ids: Tensor
    ref_logp: Tensor | None
    rollout_logp: Tensor | None

    def loss(self, logp: Tensor, entropy: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        """``policy_loss`` of the spec on these inputs with ``logp`` (and ``entropy``); old_logp None: ``logp`` itself, detached."""
        return policy_loss(
            self.spec,
            logp=logp,
            old_logp=logp.detach() if self.old_logp is None else self.old_logp,
            advantages=self.advantages,
            mask=self.mask,
            group_ids=self.group_ids,
            entropy=entropy,
            ref_logp=self.ref_logp,
            rollout_logp=self.rollout_logp,
        )

    def coefficients(self, logp: Tensor, entropy: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor, dict[str, Tensor]]:
        """(d loss / d logp (B, T), d loss / d entropy (B, T) or None, loss, metrics) at the values ``logp``, ``entropy``."""
        with torch.enable_grad():
            lp = logp.detach().clone().requires_grad_()  # (B, T) leaf
            ent = None if entropy is None else entropy.detach().clone().requires_grad_()
            loss, metrics = self.loss(lp, ent)
            leaves = [lp] if ent is None else [lp, ent]
            grads = torch.autograd.grad(loss, leaves, allow_unused=True) if loss.requires_grad else [None] * len(leaves)
        grads = [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]
        return grads[0], (grads[1] if ent is not None else None), loss.detach(), metrics


class _RowsOf:
    """The hidden rows of a chunk of positions, and where its rows of d hidden go.

    ``rows``, ``cols`` (N,) name the positions, unit after unit; ``flat`` = rows * T + cols indexes them in (B * T)
    order. A chunk whose positions are consecutive there is read as a view of hidden: always when hidden is
    contiguous, and within one completion when it is not (the trainer's hidden states are a (B, T, H) slice of the
    decoder's (B, L, H) output). Any other chunk gathers its own rows. d hidden is a fresh contiguous (B * T, H)
    tensor whose consecutive rows the matmul writes directly. So neither an (N, H) copy of the hidden states nor an
    (N, H) gradient beside hidden's own is held.
    """

    def __init__(self, hidden: Tensor, rows: Tensor, cols: Tensor):
        self.hidden = hidden  # (B, T, H), detached
        self.rows, self.cols = rows, cols  # (N,)
        self.flat = rows * hidden.shape[1] + cols  # (N,)
        self._runs: tuple[list[int], list[int]] | None = None

    def _start(self, s: int, e: int) -> int | None:
        """The first flat index of positions s:e when they are consecutive there, else None. Read off Python lists
        made once per call (one read-back from the device, not one per chunk)."""
        if self._runs is None:
            host = self.flat.cpu()  # (N,)
            breaks = torch.ones_like(host)
            breaks[1:] = host[1:] - host[:-1] != 1
            self._runs = host.tolist(), breaks.cumsum(0).tolist()  # flat index, and which run of +1 steps it is in
        first, run = self._runs
        return first[s] if e > s and run[e - 1] == run[s] else None

    def __call__(self, s: int, e: int) -> Tensor:
        """Hidden states (n, H) of positions s:e (detached)."""
        a, n, T = self._start(s, e), e - s, self.hidden.shape[1]
        if a is not None and self.hidden.is_contiguous():
            return self.hidden.view(-1, self.hidden.shape[-1])[a : a + n]
        if a is not None and a // T == (a + n - 1) // T:  # one completion's run of a strided hidden
            return self.hidden[a // T, a % T : a % T + n]
        return self.hidden[self.rows[s:e], self.cols[s:e]]

    def gradient(self, dtype: torch.dtype, *, full: bool) -> Tensor:
        """d hidden as (B * T, H) of ``dtype``: uninitialised when every position is real (the chunks write every row),
        else zeros (padding's rows stay 0)."""
        B, T, H = self.hidden.shape
        make = torch.empty if full else torch.zeros
        return make((B * T, H), dtype=dtype, device=self.hidden.device)

    def write(self, grad: Tensor, s: int, e: int, dz: Tensor, weight: Tensor, finish: Callable[[Tensor], object] | None = None) -> None:
        """grad's rows of positions s:e = dz (n, V) @ weight (V, H), then ``finish`` (in place on those (n, H) rows)."""
        a = self._start(s, e)
        direct = a is not None and dz.dtype == grad.dtype
        rows = torch.mm(dz, weight, out=grad[a : a + e - s]) if direct else dz @ weight  # (n, H)
        if finish is not None:
            finish(rows)
        if not direct:
            grad[self.flat[s:e] if a is None else slice(a, a + e - s)] = rows.to(grad.dtype)

    def scale(self, grad: Tensor, s: int, e: int, factor: float) -> None:
        """grad's rows of positions s:e *= factor."""
        a = self._start(s, e)
        if a is not None:
            grad[a : a + e - s].mul_(factor)
        else:
            grad[self.flat[s:e]] *= factor


class _Sum:
    """A (V, H) sum of dz^T h over blocks, in ``out``; the first block's matmul writes it (no zero-fill pass)."""

    def __init__(self, out: Tensor):
        self.out, self.written = out, False

    def add(self, dz: Tensor, h: Tensor, room: Tensor | None = None) -> None:
        """out += dz^T (V, n) h (n, H). A half-precision dz's product is made in (V, H) ``room`` (a flat scratch of
        its dtype), in slices of V that fit it (no (V, H) temporary), else in a fresh (V, H)."""
        h = h.to(dz.dtype)
        if dz.dtype != self.out.dtype:
            V, H = self.out.shape
            step = V if room is None else max(1, room.numel() // H)  # rows of V per product
            for v in range(0, V, step):
                w = min(step, V - v)
                dz_v = dz[:, v : v + w].T  # (w, n)
                part = dz_v @ h if room is None else torch.mm(dz_v, h, out=room[: w * H].view(w, H))  # (w, H)
                self.out[v : v + w].add_(part) if self.written else self.out[v : v + w].copy_(part)
        elif self.written:
            self.out.addmm_(dz.T, h)  # accumulated inside the matmul: no (V, H) temporary
        else:
            torch.mm(dz.T, h, out=self.out)
        self.written = True

    def add_onehot_minus(self, p: Tensor, h: Tensor, targets: Tensor, c: Tensor) -> None:
        """out += (c (onehot(targets) - p))^T h (V, H) for p (n, V) of out's dtype, without that (n, V) product:
        -p^T (c h), then c h added at the rows ``targets`` (``_onehot_minus_rows_`` is d hidden's side)."""
        ch = h.to(p.dtype) * -c[:, None]  # (n, H) -c h
        self.out.addmm_(p.T, ch) if self.written else torch.mm(p.T, ch, out=self.out)
        self.out.index_add_(0, targets, ch, alpha=-1)
        self.written = True

    def add_scaled(self, other: _Sum, factor: float) -> None:
        """out += factor * other's sum (nothing when other holds none)."""
        if other.written:
            self.out.add_(other.out, alpha=factor) if self.written else torch.mul(other.out, factor, out=self.out)
            self.written = True

    def total(self) -> Tensor:
        """The sum (0 when no block was added)."""
        return self.out if self.written else self.out.zero_()


def _onehot_minus_rows_(rows: Tensor, weight: Tensor, targets: Tensor, c: Tensor) -> Tensor:
    """p W (n, H) -> c (W[targets] - p W) = (c (onehot(targets) - p)) W, in place: d hidden's rows from p, never
    writing d loss / d z = c (onehot - p) over the (n, V) block."""
    return torch.sub(weight[targets], rows, out=rows).mul_(c[:, None])


def _row_factor(c: Tensor, c0: Tensor) -> float | None:
    """k with c = k c0 to a hundred round-offs of their dtype (both (n,), one completion's coefficients), or None when
    there is none (relative to the completion's largest coefficient)."""
    rtol = 100 * torch.finfo(c.dtype).eps
    c, c0 = c.double(), c0.double()  # (n,)
    top0 = float(c0.abs().max()) if c0.numel() else 0.0
    if top0 == 0.0:
        return 0.0 if not bool(c.any()) else None
    k = float((c * c0).sum() / (c0 * c0).sum())
    tolerance = rtol * max(float(c.abs().max()), abs(k) * top0)
    return k if float((c - k * c0).abs().max()) <= tolerance else None


def _common_ratio(before: list[float], now: list[float], rtol: float) -> float | None:
    """r with now_j = r before_j for every j to ``rtol`` (1 when every before_j is 0), or None when there is none: a
    factor that was 0 must still be 0 (to ``rtol`` of the largest)."""
    largest = max((abs(k) for k in now), default=0.0)
    if any(b == 0.0 and abs(k) > rtol * largest for b, k in zip(before, now)):
        return None
    ratios = [k / b for b, k in zip(before, now) if b != 0.0]
    if not ratios:
        return 1.0
    r = ratios[0]
    return r if all(abs(q - r) <= rtol * max(abs(q), abs(r)) for q in ratios) else None


def _positions(mask: Tensor, group_ids: Tensor, unit: str) -> tuple[Tensor, Tensor, list[int]]:
    """The real positions laid out unit after unit: rows (N,), columns (N,) and the size of each unit."""
    B = mask.shape[0]
    if unit == "group":
        _, inverse = torch.unique(group_ids, return_inverse=True)  # (B,)
        order = torch.argsort(inverse, stable=True)  # rows of a group next to each other
    else:
        order = torch.arange(B, device=mask.device)
    r, cols = mask[order].nonzero(as_tuple=True)  # (N,) row-major
    rows = order[r]
    n = int(rows.numel())
    if unit == "token" or n == 0:
        return rows, cols, []  # token units: no list of N ones (chunks of chunk_size are cut directly)
    if unit == "batch":
        return rows, cols, [n]
    lengths = mask[order].sum(-1)  # (B,) in layout order
    if unit == "row":
        sizes = lengths[lengths > 0]
    else:
        sizes = torch.zeros(int(inverse.max()) + 1, dtype=lengths.dtype, device=lengths.device).index_add_(0, inverse[order], lengths)
        sizes = sizes[sizes > 0]
    return rows, cols, sizes.tolist()


def fused_head_loss(
    objective: str | ObjectiveSpec,
    *,
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    ref_logp: Tensor | None = None,
    rollout_logp: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    max_logits_mib: float = 2048.0,
    compile: bool = False,
    with_entropy: bool = False,
    solve_once: bool | None = None,
    **overrides: object,
) -> FusedHead:
    """The LM head, the log-probs (and entropies) and the objective's loss with its gradients in one pass (module doc).

    Shapes: hidden (B, T, H), lm_head_weight (V, H), targets, old_logp, mask, ref_logp, rollout_logp (B, T);
    advantages, group_ids (B,). ``old_logp`` None: the policy's own log-probs, detached (the first optimiser step of a
    rollout batch, ratio 1). ``with_entropy`` computes entropies the objective does not read (for a log).
    ``solve_once``: the coefficients solved once for the whole batch, after a pass of statistics (module doc, "One
    solve on a GPU"); None: where the hidden states are not on the CPU. Inputs are
    checked (with ``policy_loss``'s own checks) before the LM head runs. A non-finite log-prob at a real position stops
    the work and returns ``finite=False`` (loss NaN, zero gradients), so a trainer can skip the step.
    """
    spec = objective if isinstance(objective, ObjectiveSpec) and not overrides else resolve_objective(objective, **overrides)
    if chunk_size is None:
        chunk_size = default_chunk_size(hidden.shape[-1], half_precision_off_cpu=_half_precision_off_cpu(lm_head_weight))
    check_head_inputs(hidden, lm_head_weight, targets, temperature=temperature, chunk_size=chunk_size)
    if not (isinstance(max_logits_mib, (int, float)) and not isinstance(max_logits_mib, bool) and max_logits_mib >= 0):
        raise ValueError(f"max_logits_mib must be a number >= 0, got max_logits_mib={max_logits_mib!r}")
    if targets.ndim != 2:
        raise ValueError(f"targets must have shape (B, T), got targets.shape={tuple(targets.shape)}")
    if solve_once is not None and not isinstance(solve_once, bool):
        raise ValueError(f"solve_once must be True, False or None (by device), got solve_once={solve_once!r}")
    solve_once = _syncs_are_dear(hidden.device) if solve_once is None else solve_once
    dtype = torch.promote_types(lm_head_weight.dtype, torch.float32)  # the compute dtype
    B, T = targets.shape
    placeholder = torch.zeros((B, T), dtype=dtype, device=hidden.device) if old_logp is None else old_logp.detach()
    if tuple(placeholder.shape) != (B, T):
        raise ValueError(f"old_logp must have shape (B, T) = {(B, T)} like targets, got old_logp.shape={tuple(placeholder.shape)}")
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"mask must have shape (B, T) = {(B, T)} like targets, got mask.shape={tuple(mask.shape)}")
    x = _Inputs(spec, old_logp, advantages, mask, group_ids, ref_logp, rollout_logp)
    needs_entropy = spec.needs_entropy
    keep_entropy = needs_entropy or with_entropy
    placeholder = torch.where(mask.bool(), placeholder.to(dtype), 0.0).nan_to_num(0.0).clamp(min=-LOGP_FLOOR)  # (B, T)
    entropy_buf = torch.zeros((B, T), dtype=dtype, device=hidden.device) if keep_entropy else None
    with torch.no_grad():  # every check of policy_loss, on (B, T) placeholders, before the V-sized work
        x.loss(placeholder, entropy_buf if needs_entropy else None)
    x.mask = mask.bool()
    logp_buf = placeholder.clone()  # (B, T): the log-probs known so far, placeholders elsewhere

    unit = coupling_unit(spec)
    rows, cols, sizes = _positions(x.mask, group_ids, unit)
    n_pos, V = int(rows.numel()), lm_head_weight.shape[0]
    max_unit = int(max_logits_mib * 2**20 // (V * dtype.itemsize))
    plan = (
        [(s, min(s + chunk_size, n_pos), False) for s in range(0, n_pos, chunk_size)]
        if unit == "token"
        else chunk_plan(sizes, chunk_size, max_unit)
    )

    flat_y = targets[rows, cols].long()  # (N,)
    if n_pos and (int(flat_y.min()) < 0 or int(flat_y.max()) >= V):
        raise ValueError(f"targets must lie in [0, {V}) at real positions, got values in [{int(flat_y.min())}, {int(flat_y.max())}]")
    need_h = torch.is_grad_enabled() and hidden.requires_grad
    need_w = torch.is_grad_enabled() and lm_head_weight.requires_grad
    with_grad = need_h or need_w
    scaled = with_grad and row_scaled(spec)  # a completion longer than a block: scaled once (module doc)
    scaled_block = scaled_block_size(chunk_size, lm_head_weight.shape[0], dtype.itemsize)  # a scaled unit's block
    folded = scaled and need_w and group_folded(spec)  # a scaled group's d W in one running sum (group_folded)

    def spans(s: int, e: int) -> list[tuple[int, int]]:
        """The completions of positions s:e (a unit's): their (start, end) in layout order."""
        r = rows[s:e]
        starts = ((r[1:] != r[:-1]).nonzero().squeeze(-1) + 1 + s).tolist()
        return list(zip([s, *starts], [*starts, e]))

    def path(s: int, e: int, two: bool) -> str:
        """How a unit (or a run of units) s:e runs: ``one`` pass held, ``two`` passes, or ``scaled`` block by block.
        A completion longer than a block is scaled where it would otherwise take two passes or hold more than its
        (V, H) buffer (H x V positions' worth, the size of W's gradient) and a scaled block. A group is scaled only
        instead of two passes (a Min-Replace group summed as it comes, ``group_folded``; else as many of its
        completions as ``buffered`` says, the others in two passes): held, it is one sum and no scaling (module doc)."""
        if scaled and e - s > chunk_size:
            if e - s > max_unit or (e - s > scaled_block + lm_head_weight.shape[1] and len(spans(s, e)) == 1):
                return "scaled"
        return "two" if two or not with_grad else "one"

    def buffered(n_rows: int) -> int:
        """How many completions of a scaled unit get a (V, H) d W buffer: all where W has no gradient to sum, else as
        many as ``max_logits_mib`` holds (H x V positions' worth each), at least one (the size of W's own gradient)."""
        return n_rows if not need_w else max(1, min(n_rows, max_unit // lm_head_weight.shape[1]))

    if solve_once:  # the whole batch as one unit in two passes: one (B, T) solve, not one per block
        paths = [(0, n_pos, "two")] if n_pos else []
    else:
        paths = [(s, e, path(s, e, two)) for s, e, two in plan]
    block_of = {"one": n_pos, "two": chunk_size, "scaled": scaled_block}  # positions per block, by path
    longest = max((min(block_of[how], e - s) for s, e, how in paths), default=0)
    buf = _kept(0, (longest, V), dtype, hidden.device)  # (n, V) the one logits block, reused
    kernels = _Kernels(compile and keep_entropy)  # compiled only where it saves the second block (module doc)
    casts_of = CastsOf(lm_head_weight.dtype)  # a half-precision head's casts in place, of buf's and spare's blocks
    rows_of = _RowsOf(hidden.detach(), rows, cols)  # a chunk's hidden rows: a view where they are consecutive
    # hidden's gradient is written chunk by chunk into its (B, T, H) place (zero only at padding)
    grad_h = rows_of.gradient(dtype, full=n_pos == B * T) if need_h else None  # (B * T, H)
    grad_w = _Sum(torch.empty(lm_head_weight.shape, dtype=dtype, device=hidden.device)) if need_w else None  # (V, H)
    weight = lm_head_weight.detach()
    c_buf = e_buf = loss = metrics = None
    two_pass_tokens, scaled_tokens, finite = 0, 0, True

    spare_block: list[Tensor] = []  # the eager entropy kernels' second block, made at its first use and kept

    def spare(n: int) -> Tensor | None:
        """(n, V) p beside log p, for the eager entropy kernels (also after a compiler failure); None otherwise. One
        buffer for the whole call: ``_kept`` allocates afresh off the CPU, and a block's gradient reads back the p its
        statistics wrote there."""
        if not keep_entropy or kernels.compiled:
            return None
        if not spare_block:
            spare_block.append(_kept(1, (longest, V), dtype, hidden.device))
        return spare_block[0][:n]

    def block(s: int, e: int, *, known: bool = False, keep_p: bool = True) -> tuple[Tensor, Tensor, Tensor | None, object, Tensor | None]:
        """Hidden states (n, H) and logits (n, V) of positions s:e and their statistics, written into the (B, T) buffers.
        ``known``: a pass before took them, so where nothing but p is needed (no entropy) z becomes p alone and the
        log-probs are None; ``keep_p=False``: no gradient follows (``_Kernels.stats``)."""
        h = rows_of(s, e)  # (n, H): a view, or this chunk's rows gathered once for its three matmuls
        out = buf[: e - s]
        z = head_logits(h, weight, temperature, out=out, casts=casts_of(out))  # (n, V)
        if known and not keep_entropy:
            return h, kernels.probs_(z), None, None, None

        def logits_of(k: Tensor) -> Tensor:  # (k, V) logits of some of these rows, made again
            return head_logits(h[k], weight, temperature, out=torch.empty((len(k), V), dtype=dtype, device=z.device))

        logp, ent, state = kernels.stats(z, flat_y[s:e], lambda: spare(e - s), keep_entropy, logits_of, keep_p)
        logp_buf[rows[s:e], cols[s:e]] = logp
        if ent is not None:
            entropy_buf[rows[s:e], cols[s:e]] = ent
        return h, z, ent, state, logp

    def backward_block(s: int, e: int, h: Tensor, z: Tensor, ent: Tensor | None, state: object, into: list[tuple[int, int, _Sum]]) -> None:
        """Gradients of positions s:e from their hidden states and logits block (after ``block``) at the coefficients
        of ``c_buf``: their rows of d hidden written, d W of positions a:b added to each (a, b, sum) of ``into``."""
        c = c_buf[rows[s:e], cols[s:e]] / temperature  # (n,): 1/temperature of d z / d h and d z / d W folded in
        e_ = None if e_buf is None else e_buf[rows[s:e], cols[s:e]] / temperature
        y, kept = flat_y[s:e], ent if keep_entropy else None
        p = kernels.probs(z, spare(e - s), state, kept, e_) if weight.dtype == dtype else None  # (n, V)
        if p is not None:  # d z = c (onehot - p): c goes on the (n, H) side, so no pass over the block writes d z
            if need_h:
                rows_of.write(grad_h, s, e, p, weight, lambda r: _onehot_minus_rows_(r, weight, y, c))  # (n, H)
            for a, b, total in into:
                total.add_onehot_minus(p[a - s : b - s], h[a - s : b - s], y[a - s : b - s], c[a - s : b - s])  # (V, H)
            return
        dz = kernels.grad(z, y, spare(e - s), state, kept, c, e_)  # (n, V) float32
        # (n, V) in the weight's dtype for the two matmuls; a half-precision one is cast in place, and ``room`` (n V,)
        # is the half of the float32 block's bytes that the cast leaves free, scratch for the d W product
        casts = casts_of(dz)
        if casts is not None:
            dz, room = casts.narrow_(), casts.free
        else:
            dz, room = dz.to(weight.dtype), None
        if need_h:
            rows_of.write(grad_h, s, e, dz, weight)  # (n, H) rows of d hidden
        for a, b, total in into:
            total.add(dz[a - s : b - s], h[a - s : b - s], room)  # (V, H), h unscaled: 1/temperature is in dz

    def solve() -> None:
        """The coefficients at the values known now (the last call's loss and metrics are the batch's)."""
        nonlocal c_buf, e_buf, loss, metrics
        c_buf, e_buf, loss, metrics = x.coefficients(logp_buf, entropy_buf if needs_entropy else None)

    def statistics(start: int, end: int, step: int = chunk_size) -> bool:
        """The log-probs (and entropies) of positions start:end in blocks of ``step``; False where one is not finite,
        read back once at the end (a pass that meets a NaN runs to its end, and no block waits for the device)."""
        finite = torch.ones((), dtype=torch.bool, device=hidden.device)
        for s in range(start, end, step):
            *_, logp = block(s, min(s + step, end), keep_p=False)
            finite &= torch.isfinite(logp).all()
        return bool(finite)

    def whole(s: int, e: int) -> list[tuple[int, int, _Sum]]:
        """``backward_block``'s ``into`` for d W of positions s:e straight into the total."""
        return [(s, e, grad_w)] if need_w else []

    def fused_pass(
        start: int,
        end: int,
        into: Callable[[int, int], list[tuple[int, int, _Sum]]] = whole,
        step: int = chunk_size,
        *,
        checked: bool = False,
    ) -> bool:
        """The fused pass over positions start:end in blocks of ``step``, at the coefficients of ``c_buf``, d W of each
        block's positions added where ``into(s, e)`` says; False at a non-finite log-prob (the pass stops there).
        ``checked``: a ``statistics`` pass has just found these log-probs finite, so no block reads them back again."""
        for s in range(start, end, step):
            e = min(s + step, end)
            h, z, ent, state, logp = block(s, e, known=checked)
            if not checked and not bool(torch.isfinite(logp).all()):
                return False
            backward_block(s, e, h, z, ent, state, into(s, e))
        return True

    def scaled_pass(start: int, end: int) -> int | None:
        """A unit's completions block by block: the first ``buffered`` at their placeholder coefficients c0, each one's
        d W summed apart, the others' log-probs only. Then each buffered completion is scaled by its k where its
        coefficients are c = k c0 (``row_scaled``); the others, and any whose c is not k c0 (c0 = 0 where a transform
        truncates a weight at ratio 1, say), run again at c. The positions run again, or None at a non-finite log-prob."""
        if c_buf is None:
            solve()  # this unit's positions hold placeholders
        completions = spans(start, end)
        if folded and len(completions) > 1 and (not grad_w.written or buffered(2) == 2):
            return folded_pass(start, end, completions)
        c0 = c_buf[rows[start:end], cols[start:end]]  # (n,)
        n_sums = buffered(len(completions))
        sums = [_Sum(_kept(2 + i, tuple(lm_head_weight.shape), dtype, hidden.device)) for i in range(n_sums)] if need_w else []

        def own_sum(i: int) -> Callable[[int, int], list[tuple[int, int, _Sum]]]:
            """``fused_pass``'s ``into`` for completion i: d W of its positions to its own sum (none without W's gradient)."""
            return lambda s, e: [(s, e, sums[i])] if need_w else []

        for i, (a, b) in enumerate(completions):
            if i < n_sums:
                done = fused_pass(a, b, own_sum(i), scaled_block)
            else:  # its log-probs only: its gradient once the unit's last block is known
                done = statistics(a, b, scaled_block)
            if not done:
                return None
        solve()
        c = c_buf[rows[start:end], cols[start:end]]  # (n,)
        again = 0
        for i, (a, b) in enumerate(completions):
            k = _row_factor(c[a - start : b - start], c0[a - start : b - start]) if i < n_sums else None
            if k is None:  # its rows of d hidden are written (again), its d W added at c
                fused_pass(a, b, step=scaled_block)
                again += b - a
                continue
            if need_h:
                rows_of.scale(grad_h, a, b, k)
            if need_w:
                grad_w.add_scaled(sums[i], k)
        return again

    def folded_pass(start: int, end: int, completions: list[tuple[int, int]]) -> int | None:
        """A ``group_folded`` unit's completions one by one, each one's d W summed in one buffer at the coefficients it
        ran at (those before it known, itself at placeholders), then added at its factor k to the group's sum, after
        the sum's scale (a float) is multiplied by the r every earlier factor changed by. The group's sum is W's gradient itself while that
        is empty, else a second buffer. Once the last completion is known each one's rows of d hidden are scaled by its
        k. Where the factors do not change by one r (or a completion's c is not k times its run), the group runs
        again: the rest's log-probs, then every completion at its coefficients. The positions run again, or None at
        a non-finite log-prob."""
        own = _Sum(_kept(2, tuple(lm_head_weight.shape), dtype, hidden.device))  # (V, H) one completion's d W
        group = grad_w if not grad_w.written else _Sum(_kept(3, tuple(lm_head_weight.shape), dtype, hidden.device))
        rtol = 100 * torch.finfo(dtype).eps
        ran: list[Tensor] = []  # each done completion's coefficients in its pass, (n_i,)
        factors: list[float] = []  # their k at the last solve
        scale = 1.0  # the group's sum is scale x group.out: a change of r is one multiplication of a float, not of (V, H)
        for i, (a, b) in enumerate(completions):
            ran.append(c_buf[rows[a:b], cols[a:b]])
            own.written = False
            if not fused_pass(a, b, lambda s, e: [(s, e, own)], scaled_block):
                return None
            solve()
            now = [_row_factor(c_buf[rows[a_:b_], cols[a_:b_]], c) for (a_, b_), c in zip(completions, ran)]
            r = None if None in now else _common_ratio(factors, now[:-1], rtol)
            if not r:  # None, or 0: every earlier factor fell to 0 (no scale comes back from it)
                if group is grad_w:
                    grad_w.written = False  # the partial sum is dropped: the group's d W is made again below
                if not all(statistics(a_, b_, scaled_block) for a_, b_ in completions[i + 1 :]):
                    return None
                solve()
                for a_, b_ in completions:
                    fused_pass(a_, b_, step=scaled_block)
                return end - start
            scale *= r
            group.add_scaled(own, now[-1] / scale)
            factors = now
        if need_h:
            for (a_, b_), k in zip(completions, factors):
                rows_of.scale(grad_h, a_, b_, k)
        if group is not grad_w:
            grad_w.add_scaled(group, scale)
        elif scale != 1.0:
            grad_w.out.mul_(scale)
        return 0

    for start, end, how in paths:
        if how == "scaled":
            again = scaled_pass(start, end)
            if again is None:
                finite = False
                break
            scaled_tokens += end - start - again
            two_pass_tokens += again
            continue
        if how == "two":
            if not statistics(start, end):  # the whole unit's log-probs first
                finite = False
                break
            if not with_grad:
                continue
            two_pass_tokens += end - start
            solve()
            fused_pass(start, end, checked=True)
            continue
        h, z, ent, state, logp = block(start, end)
        if not bool(torch.isfinite(logp).all()):
            finite = False
            break
        solve()
        backward_block(start, end, h, z, ent, state, whole(start, end))

    grad_w = None if grad_w is None else grad_w.total()
    if not finite:
        loss, metrics = torch.full((), math.nan, dtype=dtype, device=hidden.device), {}
        grad_h = None if grad_h is None else grad_h.zero_()
        grad_w = None if grad_w is None else grad_w.zero_()
    elif loss is None:  # no gradient asked for, or no real position: the loss of the values alone
        with torch.no_grad():
            loss, metrics = x.loss(logp_buf, entropy_buf if needs_entropy else None)
    metrics = {k: v.detach() for k, v in metrics.items()}
    metrics["fused/two_pass"] = torch.tensor(two_pass_tokens / max(n_pos, 1), dtype=dtype, device=hidden.device)
    metrics["fused/row_scaled"] = torch.tensor(scaled_tokens / max(n_pos, 1), dtype=dtype, device=hidden.device)
    if with_grad:
        grads = [None if grad_h is None else grad_h.view(hidden.shape), grad_w]  # (B, T, H), (V, H)
        out = _HandOn.apply(loss, hidden, lm_head_weight, grads)
    else:
        out = loss.detach()
    entropy = None if entropy_buf is None else torch.where(x.mask, entropy_buf, 0.0)
    return FusedHead(
        loss=out,
        metrics=metrics,
        logp=torch.where(x.mask, logp_buf, 0.0),
        entropy=entropy,
        logp_grad=c_buf if with_grad and finite else None,
        finite=finite,
    )


def fused_policy_loss(
    objective: str | ObjectiveSpec,
    *,
    hidden: Tensor,
    lm_head_weight: Tensor,
    targets: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    group_ids: Tensor,
    ref_logp: Tensor | None = None,
    rollout_logp: Tensor | None = None,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    max_logits_mib: float = 2048.0,
    compile: bool = False,
    solve_once: bool | None = None,
    **overrides: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss(objective, logp=token_logprobs(hidden, W, targets), ...)`` with the LM head fused in: the same loss,
    metrics and gradients (to float round-off) for every objective, from three matmuls over the logits, never a
    (B, T, V) tensor (module doc: ``dfpo.core.fused``).

    Shapes: hidden (B, T, H), lm_head_weight (V, H), targets, old_logp, mask, ref_logp, rollout_logp (B, T) (old_logp
    None: the policy's own log-probs, detached); advantages, group_ids (B,). Returns (loss, metrics) as ``policy_loss``
    does, with ``fused/two_pass``: the share of real tokens whose logits took two passes (a coupled unit larger than
    ``max_logits_mib`` of float32 logits). ``chunk_size``: positions per logits block (None: ``default_chunk_size``
    of the hidden size); ``compile``: the elementwise work through ``torch.compile``; ``solve_once``: the coefficients
    solved once for the batch, in two passes (None: off the CPU; module doc, "One solve on a GPU"). A non-finite
    log-prob at a real position is refused with a ValueError.
    """
    out = fused_head_loss(
        objective,
        hidden=hidden,
        lm_head_weight=lm_head_weight,
        targets=targets,
        old_logp=old_logp,
        advantages=advantages,
        mask=mask,
        group_ids=group_ids,
        ref_logp=ref_logp,
        rollout_logp=rollout_logp,
        temperature=temperature,
        chunk_size=chunk_size,
        max_logits_mib=max_logits_mib,
        compile=compile,
        solve_once=solve_once,
        **overrides,
    )
    if not out.finite:
        raise ValueError(
            "the LM head gives non-finite log-probs at real (unmasked) positions: check hidden and lm_head_weight for NaN or inf"
        )
    return out.loss, out.metrics


__all__ = [
    "CHUNK_BOUNDS",
    "COUPLING_UNITS",
    "HALF_PRECISION_BLOCK_SHARE",
    "FusedHead",
    "chunk_plan",
    "coupling_unit",
    "default_chunk_size",
    "fused_head_loss",
    "fused_policy_loss",
    "release_workspace",
]
