"""The KL term to a reference policy: beta times the aggregated k3 estimator (DeepSeekMath GRPO; TRL ``beta``).

    k3_t = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1      (Schulman's k3, unbiased, >= 0)

aggregated like the policy term (same mode, same tokens), as TRL adds ``beta * per_token_kl`` before its
aggregation. The log-ratio is clamped to +-LOG_RATIO_BOUND like every ratio of the core.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .aggregation import aggregate
from .fields import NONNEG, Component, component_field
from .ratios import LOG_RATIO_BOUND


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (B, T), the log-ratio bounded like the core's ratios."""
    ref_gap = (ref_logp - logp).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T)
    return torch.exp(ref_gap) - ref_gap - 1


def kl_term(spec, ctx) -> tuple[Tensor | None, dict[str, Tensor]]:
    """beta * aggregate(k3) and ``kl/ref``, the token mean of k3 over real tokens (nothing when beta = 0)."""
    if spec.beta <= 0:
        return None, {}
    x = ctx.x
    k3 = k3_kl(x.logp, ctx.ref_logp)  # (B, T)
    term = spec.beta * aggregate(k3, ctx.agg_mask, spec.aggregation, spec.max_completion_length, ctx.agg_lengths)
    n_real = x.lengths.sum().clamp(min=1).to(x.logp.dtype)
    return term, {"kl/ref": torch.where(x.mask, k3.detach(), 0.0).sum() / n_real}


# ----------------------------------------------------------------------------- the KL component's settings

BETA = component_field(
    0.0,
    "kl",
    "number",
    "0: no KL term (TRL GRPOConfig default; DAPO, Dr. GRPO and GSPO drop it)",
    True,
    bounds=NONNEG,
    doc="Weight of the k3 KL to ``ref_logp``.",
)


def _kl_inputs(spec) -> dict[str, str]:
    return {"ref_logp": f"beta={spec.beta!r} (the k3 KL to the reference policy)"} if spec.beta > 0 else {}


KL_COMPONENT = Component("kl", required_inputs=_kl_inputs, loss_term=kl_term)
