"""The LM head and the loss in one pass: any objective's loss and its gradients with three matmuls.

``token_logprobs`` returns log-probs and lets ``policy_loss`` run afterwards, so its backward recomputes every
chunk's logits: four (N, V, H) matmuls where three suffice. ``fused_policy_loss`` takes the loss's gradient inside
the forward, chunk by chunk (as Liger-Kernel's fused linear losses do), and the backward only hands it on:

    for each chunk of positions (whole coupling units, below):
        z = (h / temperature) W^T                        (n, V)  matmul 1, then float32          statistics.py
        logp_t = z_t[y_t] - logsumexp(z_t), H_t          (n,)    softmax statistics              statistics.py, kernels.py
        c, e = d loss / d logp, d loss / d H             (B, T)  autograd through ``policy_loss``   solve.py
        dz_t = c_t (onehot(y_t) - p_t) - e_t p_t (log p_t + H_t)                                 kernels.py
        d h += dz W / temperature                        (n, H)  matmul 2                        gradient.py, rows.py
        d W += dz^T h / temperature                      (V, H)  matmul 3                        gradient.py

Files, one concern each: ``coupling.py`` which positions a coefficient reads; ``blocks.py`` how many positions a
block holds and how units are packed into chunks; ``statistics.py`` the statistics pass; ``solve.py`` the
coefficient solve; ``gradient.py`` the gradient accumulation; ``scaled.py`` units scaled once; ``half_precision.py``
a half-precision head's casts (the in-place casts themselves are ``dfpo.core.cast_in_place``'s, which
``head_logits`` in ``dfpo.core.logprobs`` shares, so they stay beside it); ``kernels.py`` the elementwise work on a
block; ``rows.py`` a chunk's hidden rows; ``workspace.py`` the CPU buffers kept between calls; ``state.py`` the
state of one call, passed to every pass; ``head.py`` the entry points. Measured figures behind the rules below live
in docs/throughput.md ("Figures behind the fused path's rules"), each with its machine and command.

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
- ``group``: its group's (DFPO's in-group transforms, and any setting this package does not know: a group is always
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
weight's gradient, its buffer and half of one more W-sized tensor; where they are small they stay whole. A
completion runs so where it holds less than that (L > a scaled block + H) or where it would take two passes. A group
runs so only where it would take two passes: held, it is one sum with no scaling. Its first completions get a buffer,
as many as ``max_logits_mib`` holds (at least one, the size of W's own gradient); the others' log-probs are taken in
the same pass and their gradients in a second one, after the unit's last block. A Min-Replace group
(``group_folded``) needs no buffer per completion: its factors are k_i = u_i v, the completion's own times the
group's minimum, so each completion's d W, summed in one buffer at the coefficients it ran at, is added at its k to
the group's sum after that sum is scaled by the r every earlier factor changed by (a float beside the sum, applied
once at the end); the group's sum is W's gradient itself while that is empty (else a second buffer, where the budget
has room). The common r is checked after every completion, and a group where it breaks runs again. With no gradient
for W there is nothing to sum and every completion is scaled. Each buffered completion's c is checked against k c0
(to a hundred round-offs); one that is not a multiple (c0 = 0 where a truncating transform zeroes a weight at ratio
1, or a rule this package does not know) runs again at its coefficients. ``fused/two_pass`` counts the tokens that
ran twice, ``fused/row_scaled`` the tokens scaled.

The elementwise work on each (n, V) block runs either as PyTorch's own fused row kernels in place (``compile=False``:
softmax or log-softmax written over the logits, no (n, V) temporary) or as two ``torch.compile``d functions
(``compile=True``: the statistics in one fused kernel, d loss / d logits in another); both give the same numbers
to float round-off. ``compile=True`` compiles only where it helps: with entropies, whose eager kernels need a second
(n, V) block (p beside log p) that the compiled ones do not; without them the eager kernels are one in-place softmax
(and, in half precision, one in-place scale), as fast as the compiled pair on the CPU, and compiling would only add
the compiler's resident state and torch._inductor's import, so they run eagerly. If torch.compile fails (no C++
compiler, an unsupported platform) the eager kernels run and a warning says so. Half-precision inputs: the LM head's
matmul runs in the weight's dtype (the hidden states are cast to it), everything after it in float32; the weight's
gradient accumulates in float32. The matmul's half-precision logits and the half-precision copy of d loss / d logits
live in the float32 block's own bytes, cast in place (``cast_in_place``), and the weight gradient's half-precision
product in the half of them the cast frees (in slices of V where a block has fewer positions than H): no
half-precision (n, V) block and no (V, H) temporary, which the casts with ``.to`` made, and the same bits. Off the
CPU a half-precision head's default block is 3/4 of H positions (``default_chunk_size``): with the float32 block and
W's float32 gradient the pass then holds less than Liger's compiled bf16 step. No (B, T, V) tensor exists.

One solve on a GPU (``solve_once``). Each coefficient call is ``policy_loss`` and its gradient on (B, T) tensors:
hundreds of small kernels and about a dozen host synchronisations, which a GPU runs in a few milliseconds whatever
B x T, more than a block's three matmuls there. On the CPU the matmuls dominate and the call is noise. So off the CPU
the whole batch runs as one unit in two passes by default: the log-probs (and entropies) of every block, one
coefficient call, then the fused pass: four matmuls per block, an in-place log-softmax in the first pass and a
softmax in the second (whose log-probs are known, so nothing else runs over the block without entropies), one call,
exact for every objective (the two-pass path above, for the whole batch); ``fused/two_pass`` is then 1. Nor does a
block read anything back from the GPU (``_syncs_are_dear``): the finite check of a pass is one flag read at its end,
the chunks' layout is read once per call, and the target's log-prob comes off an in-place log-softmax instead of a
search for rows near underflow, so the scalars a step reads back do not grow with its number of blocks.

Where this departs from ``policy_loss(token_logprobs(...))``:
1. Positions whose logits are not computed yet hold placeholders (logp = old_logp: ratio 1; entropy 0) in a chunk's
   coefficient call. A chunk's coefficients do not depend on them (its units are whole); the tests check it for
   every preset and the equality of loss and gradients with the reference.
2. The loss and metrics returned are those of the last coefficient call, when every position is known: equal to
   ``policy_loss`` on the batch. The backward hands on gradients computed in the forward, so it runs once
   (``retain_graph`` double backward is refused), and double backward (Hessians) is not supported.

Names set on this package (``monkeypatch.setattr(dfpo.core.fused, name, value)``, as the tests and
benchmarks/fused_head_split.py do) are set in every file of it that holds the same object, so they act as they did
on the single module this package was split from (``_Package``).
"""

from __future__ import annotations

import sys
import types

import torch as torch  # tests reach torch.compile through this package (``fused.torch``)

from ..logprobs import head_logits as head_logits
from .blocks import CHUNK_BOUNDS, HALF_PRECISION_BLOCK_SHARE, chunk_plan, default_chunk_size
from .blocks import HALVED_BLOCK_MIB as HALVED_BLOCK_MIB
from .blocks import _half_precision_off_cpu as _half_precision_off_cpu
from .blocks import scaled_block_size as scaled_block_size
from .coupling import _LOCAL_ANY_VALUE as _LOCAL_ANY_VALUE
from .coupling import COUPLING_UNITS, coupling_unit
from .coupling import group_folded as group_folded
from .coupling import row_scaled as row_scaled
from .head import FusedHead, fused_head_loss, fused_policy_loss
from .kernels import _eager_grad_ as _eager_grad_
from .kernels import _eager_stats_ as _eager_stats_
from .kernels import _syncs_are_dear as _syncs_are_dear
from .scaled import _common_ratio as _common_ratio
from .scaled import _row_factor as _row_factor
from .solve import _Inputs as _Inputs
from .workspace import _WORKSPACE as _WORKSPACE
from .workspace import _kept as _kept
from .workspace import release_workspace

_UNSET = object()


class _Package(types.ModuleType):
    """This package's module type: setting a name sets it in each file of the package that holds the object the
    package held under that name (a part that imported it, or defined it), so the parts read the new value."""

    def __setattr__(self, name: str, value: object) -> None:
        held = self.__dict__.get(name, _UNSET)
        if held is not _UNSET:
            prefix = self.__name__ + "."
            for part in [m for key, m in list(sys.modules.items()) if key.startswith(prefix) and m is not None]:
                if part.__dict__.get(name, _UNSET) is held:
                    setattr(part, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

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
