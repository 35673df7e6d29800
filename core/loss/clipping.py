"""Clipping as a map from ratio to effective weight (paper eqs 46-49, 77-79).

Every clipped surrogate here is written "clip first, then multiply by the advantage"
(eq 49): surrogate = A * w(r, A). For PPO-style clipping the sign-aware post-clip weight
w is eq (47); for symmetric clipping (GRPO-fix, eq 79) w does not depend on the sign of A.
Score-function rules (CISPO, VESPO, DPPO, GPG) give a detached weight that multiplies A * log pi instead.

Each clip mode is one ``ClipRule`` in ``CLIP_RULES``: its weight, where it zeroes the gradient
(the clip-fraction flags) and its surrogate form. A new clip mode is one new entry there.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..settings import Bounds
from .fields import NONNEG, POSITIVE, UNIT, Component, When, component_field
from .m2po import m2po_coupling, m2po_flags, m2po_weight

if TYPE_CHECKING:  # spec imports this module
    from .spec import ObjectiveSpec

Flags = tuple[Tensor, Tensor]


def sign_aware_clip(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Eq (47): sbar = min(r, c) if A >= 0 else max(r, c), with c = clip(r, 1-eps_low, 1+eps_high).

    Then min(r A, c A) = A * sbar exactly (eq 49). ``adv`` broadcasts against ``ratio``.
    """
    # min(r, clip(r, lo, hi)) = min(r, hi) and max(r, clip(r, lo, hi)) = max(r, lo): one clamp
    # whose bound depends on the sign of A (a single pass over (B, T), forward and backward).
    inf = torch.tensor(float("inf"), dtype=ratio.dtype, device=ratio.device)
    low = torch.where(adv >= 0, -inf, torch.tensor(1.0 - eps_low, dtype=ratio.dtype, device=ratio.device))
    high = torch.where(adv >= 0, torch.tensor(1.0 + eps_high, dtype=ratio.dtype, device=ratio.device), inf)
    return torch.clamp(ratio, min=low, max=high)


def symmetric_clip(ratio: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Eq (79): phi(r) = clip(r, 1-eps_low, 1+eps_high); GRPO-fix uses eps_low = 1 (lower bound 0)."""
    return ratio.clamp(1.0 - eps_low, 1.0 + eps_high)


def _ppo_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """Eq (47), with dual-clip (Ye et al. 2020; verl clip_ratio_c, TRL delta) when ``dual_clip_c`` is set:
    for A < 0 the weight is also capped at c, so min(r A, clip(r) A) never falls below c A."""
    weight = sign_aware_clip(ratio, adv, spec.eps_low, spec.eps_high)
    if spec.dual_clip_c is None:
        return weight
    return torch.where(adv < 0, weight.clamp(max=spec.dual_clip_c), weight)


def _ppo_flags(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Flags:
    """PPO (as TRL logs it): low when A < 0 and r < 1-eps_low, high when A > 0 and r > 1+eps_high;
    dual-clip adds A < 0 and r > c to the high side (its gradient is zero there too)."""
    low = (adv < 0) & (ratio < 1.0 - spec.eps_low)
    high = (adv > 0) & (ratio > 1.0 + spec.eps_high)
    if spec.dual_clip_c is not None:
        high = high | ((adv < 0) & (ratio > spec.dual_clip_c))
    return low, high


def _symmetric_flags(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Flags:
    """Symmetric: r below / above the clip range whatever the sign of A."""
    return ratio < 1.0 - spec.eps_low, ratio > 1.0 + spec.eps_high


def _cispo_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """CISPO (MiniMax-M1; TRL loss_type='cispo'): the detached cap sg(min(r, eps_high))."""
    return ratio.clamp(max=spec.eps_high).detach()


def _cispo_flags(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Flags:
    """CISPO: the cap binds where r > eps_high."""
    return torch.zeros_like(ratio, dtype=torch.bool), ratio > spec.eps_high


def _no_flags(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Flags:
    no = torch.zeros_like(ratio, dtype=torch.bool)
    return no, no


def _by_sign(condition: Tensor, if_true: float, if_false: float, like: Tensor) -> Tensor:
    """A per-element parameter chosen by ``condition``, in ``like``'s dtype (no float32 rounding of the values)."""
    return torch.where(
        condition, torch.tensor(if_true, dtype=like.dtype, device=like.device), torch.tensor(if_false, dtype=like.dtype, device=like.device)
    )


def _sapo_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """SAPO (arXiv 2511.20347) soft gate f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau by the sign of A.

    Its gradient in log pi is 4 sigmoid (1 - sigmoid) r: 1 at r = 1 whatever tau, decaying smoothly
    away from it instead of a hard clip.
    """
    tau = _by_sign(adv > 0, spec.sapo_tau_pos, spec.sapo_tau_neg, ratio)
    return torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau


def _vespo_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """VESPO (arXiv 2602.10693) Gamma weight phi(w) = e^lambda w^k e^(-lambda w), detached (phi(1) = 1).

    log w is clamped to [log 1e-8, 20] as in TRL; k and lambda by the sign of A (A >= 0: the positive pair).
    """
    nonneg = adv >= 0
    k = _by_sign(nonneg, spec.vespo_k_pos, spec.vespo_k_neg, ratio)
    lam = _by_sign(nonneg, spec.vespo_lambda_pos, spec.vespo_lambda_neg, ratio).clamp(min=1e-4)
    log_w = torch.log(ratio.detach()).clamp(math.log(1e-8), 20.0)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _pg_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """GPG / REINFORCE (verl 'gpg'): weight 1, so the surrogate is A * log pi."""
    return torch.ones_like(ratio)


def _dppo_inside(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor) -> Tensor:
    """DPPO (arXiv 2602.04879): True where the token's probability change stays inside the divergence bound.

    ``dppo_tv``: p - p_old <= eps_high for A > 0, >= -eps_low otherwise. ``dppo_kl``: the binary KL
    between Bernoulli(p_old) and Bernoulli(p) <= eps_high (A > 0, when p rises) or eps_low (A <= 0, when p falls).
    """
    p_old = torch.exp(old_logp).clamp(max=1.0)  # (B, T); a log-prob above 0 (no softmax gives one) reads as 1
    p = (ratio.detach() * p_old).clamp(max=1.0)  # (B, T)
    if spec.clip in ("dppo_tv", "dppo_tv_ratio"):
        return torch.where(adv > 0, p - p_old <= spec.eps_high, p - p_old >= -spec.eps_low)
    log_r = torch.log(ratio.detach())
    binary_kl = p_old * (-log_r) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    return torch.where(adv > 0, (binary_kl <= spec.eps_high) | (p <= p_old), (binary_kl <= spec.eps_low) | (p >= p_old))


def _dppo_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """DPPO: sg(min(r, c)) where the divergence bound holds, 0 elsewhere (multiplies A * log pi)."""
    cap = 20.0 if spec.dual_clip_c is None else spec.dual_clip_c
    return torch.where(_dppo_inside(ratio, adv, spec, old_logp), ratio.clamp(max=cap), 0.0).detach()


def _dppo_ratio_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """prime-rl's DPPO-Binary-TV (``src/prime_rl/trainer/rl/loss.py``: ``default_loss_fn``): the ratio r itself, with its
    gradient, where the TV bound holds, 0 elsewhere (surrogate A * r). Its gradient is DPPO's sg(r) A grad log pi without
    the cap at 20, and its value A * r rather than sg(r) A log pi."""
    return torch.where(_dppo_inside(ratio, adv, spec, old_logp), ratio, 0.0)


def _dppo_flags(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Flags:
    """DPPO: outside the bound, on the side where the probability fell (low) or rose (high)."""
    outside = ~_dppo_inside(ratio, adv, spec, old_logp)
    return outside & (ratio < 1), outside & (ratio >= 1)


def _topr_weight(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Tensor:
    """TOPR (Tapered Off-Policy REINFORCE, arXiv 2503.14286 eq 8; ROLL ``pg_variant='topr'``, ``_compute_topr_loss`` in
    roll/pipeline/rlvr/actor_pg_worker.py): weight 1 for a positive sample (an SFT-like update, no ratio), the detached
    truncated ratio sg(clamp(r, 0, 1)) for the others; it multiplies A * log pi.

    ROLL splits by the raw score (> 0 positive) and the paper by the sign of the return; ``policy_loss`` has no reward
    input, so the split here is A > 0. With 0/1 rewards and a group baseline the two agree on every row with A != 0, and
    a row with A = 0 adds nothing either way."""
    return torch.where(adv > 0, torch.ones_like(ratio), ratio.clamp(0.0, 1.0)).detach()


def _topr_flags(ratio: Tensor, adv: Tensor, spec: ObjectiveSpec, old_logp: Tensor | None) -> Flags:
    """TOPR: the taper binds on a non-positive sample whose ratio is above 1 (ROLL topr_negative_upper_clipfrac)."""
    return torch.zeros_like(ratio, dtype=torch.bool), (adv <= 0) & (ratio > 1.0)


@dataclass(frozen=True)
class ClipRule:
    """One clip mode: weight w(r, A, spec, old_logp), clip flags, and how w enters the surrogate."""

    weight: Callable[[Tensor, Tensor, object, Tensor | None], Tensor]
    flags: Callable[[Tensor, Tensor, object, Tensor | None], Flags]
    score_function: bool = False
    """False: surrogate = A * w (eq 49). True: surrogate = w * A * log pi with w detached (CISPO, VESPO, DPPO, GPG)."""
    sequence_level: bool = True
    """Whether the rule may act on a sequence weight (the token-probability rules are defined per token only)."""
    reads: tuple[str, ...] = ()
    """The clip fields of the spec the rule reads (eps_low, eps_high, dual_clip_c): the loss reads them, and a matched
    control holds them equal, only under a rule that reads them."""

    def surrogate(self, weight: Tensor, adv: Tensor, logp: Tensor) -> Tensor:
        """Per-token surrogate to maximise from the clipped weight; shapes broadcast (B, T)."""
        return weight * adv * logp if self.score_function else adv * weight


_EPS = ("eps_low", "eps_high")
CLIP_RULES: dict[str, ClipRule] = {
    "ppo": ClipRule(_ppo_weight, _ppo_flags, reads=(*_EPS, "dual_clip_c")),
    "symmetric": ClipRule(lambda r, a, spec, old: symmetric_clip(r, spec.eps_low, spec.eps_high), _symmetric_flags, reads=_EPS),
    "cispo": ClipRule(_cispo_weight, _cispo_flags, score_function=True, sequence_level=False, reads=("eps_high",)),
    "none": ClipRule(lambda r, a, spec, old: r, _no_flags),
    "sapo": ClipRule(_sapo_weight, _no_flags),
    "vespo": ClipRule(_vespo_weight, _no_flags, score_function=True),
    "pg": ClipRule(_pg_weight, _no_flags, score_function=True),
    "dppo_tv": ClipRule(_dppo_weight, _dppo_flags, score_function=True, sequence_level=False, reads=(*_EPS, "dual_clip_c")),
    "dppo_kl": ClipRule(_dppo_weight, _dppo_flags, score_function=True, sequence_level=False, reads=(*_EPS, "dual_clip_c")),
    "topr": ClipRule(_topr_weight, _topr_flags, score_function=True, sequence_level=False),
    # issue 30: prime-rl, M2PO, Skywork-OR1
    "dppo_tv_ratio": ClipRule(_dppo_ratio_weight, _dppo_flags, sequence_level=False, reads=_EPS),
    "m2po": ClipRule(m2po_weight, m2po_flags, sequence_level=False, reads=("m2po_budget", "m2po_min_eps_low", "m2po_min_eps_high")),
}
"""Every clip mode, keyed by the ``clip`` component; ``register_clip_rule`` adds one."""
CLIP_MODES = tuple(CLIP_RULES)
"""dfpo's own clip modes (``CLIP_RULES`` also holds those registered later)."""


def register_clip_rule(mode: str, rule: ClipRule) -> ClipRule:
    """Register ``rule`` as ``clip=mode`` (a name not taken): from then on a spec, a preset or ``register_objective``
    may name it. ValueError naming the mode otherwise."""
    if not isinstance(mode, str) or not mode.isidentifier() or mode in CLIP_RULES:
        raise ValueError(f"clip mode {mode!r} must be a new identifier (registered: {', '.join(CLIP_RULES)})")
    if not isinstance(rule, ClipRule):
        raise ValueError(f"clip mode {mode!r}: rule must be a ClipRule, got {type(rule).__name__}")
    CLIP_RULES[mode] = rule
    return rule


class _RulesReading:
    """The clip modes whose rule reads ``field``: a live view of ``CLIP_RULES`` (a rule registered later counts)."""

    def __init__(self, field: str):
        self.field = field

    def __contains__(self, mode: object) -> bool:
        return mode in CLIP_RULES and self.field in CLIP_RULES[mode].reads

    def __iter__(self):
        return iter([mode for mode, rule in CLIP_RULES.items() if self.field in rule.reads])

    def __len__(self) -> int:
        return len(list(iter(self)))


def clip_rule(mode: str) -> ClipRule:
    """The registered rule of a clip mode; ValueError naming the mode otherwise."""
    if mode not in CLIP_RULES:
        raise ValueError(f"clip must be one of {tuple(CLIP_RULES)}, got clip={mode!r}")
    return CLIP_RULES[mode]


# ----------------------------------------------------------------------------- the clip component's settings

_READS_EPS_LOW = When("clip", _RulesReading("eps_low"))
_READS_EPS_HIGH = When("clip", _RulesReading("eps_high"))
_READS_DUAL_CLIP = When("clip", _RulesReading("dual_clip_c"))
_CISPO = When("clip", ("cispo",))

CLIP = component_field(
    "ppo",
    "clip",
    "choice",
    "PPO clipped surrogate min(rA, clip(r)A) (paper eq 77)",
    trust_region=True,
    choices=CLIP_RULES,
    doc="How the ratio becomes a weight (``CLIP_RULES``): ``ppo`` sign-aware min form (eq 47/77); ``symmetric`` clip(r, 1-el, 1+eh) (eq 79); ``cispo``; ``none``; ``sapo`` soft gate; ``vespo`` Gamma weight; ``pg`` weight 1 (GPG); ``dppo_tv`` / ``dppo_kl`` divergence masks; ``topr`` weight 1 for A > 0, sg(clamp(r, 0, 1)) otherwise (TOPR); ``dppo_tv_ratio`` prime-rl's ratio form of the TV mask; ``m2po`` PPO at M2PO's batch second-moment bound.",
)
EPS_LOW = component_field(
    0.2,
    "clip",
    "number",
    "PPO/GRPO clip range 0.2 (TRL GRPOConfig epsilon)",
    trust_region=True,
    bounds=UNIT,
    bounds_when=((_CISPO, None),),
    active_when=_READS_EPS_LOW,
    doc="Lower clip range: the clip interval starts at 1 - eps_low (DPPO: the divergence bound when p falls).",
)
EPS_HIGH = component_field(
    0.2,
    "clip",
    "number",
    "PPO/GRPO clip range 0.2 (TRL GRPOConfig epsilon)",
    trust_region=True,
    bounds=NONNEG,
    bounds_when=((_CISPO, POSITIVE),),
    active_when=_READS_EPS_HIGH,
    doc="Upper clip range: 1 + eps_high (CISPO: the ratio cap itself; DPPO: the divergence bound when p rises).",
)
DUAL_CLIP_C = component_field(
    None,
    "clip",
    "optional_number",
    "None: no dual-clip (TRL GRPOConfig delta=None; verl's clip_ratio_c=3 applies only when set)",
    trust_region=True,
    bounds=Bounds(1.0, math.inf, low_open=True),
    active_when=_READS_DUAL_CLIP,
    doc="Dual-clip: for A < 0 the weight is capped at c > 1 (verl clip_ratio_c, TRL delta); DPPO's ratio cap. None: off.",
)
SAPO_TAU_POS = component_field(
    1.0,
    "clip",
    "number",
    "SAPO (arXiv 2511.20347); TRL GRPOConfig sapo_temperature_pos=1.0",
    trust_region=True,
    bounds=POSITIVE,
    active_when=When("clip", ("sapo",)),
    doc="SAPO gate temperature for A > 0.",
)
SAPO_TAU_NEG = component_field(
    1.05,
    "clip",
    "number",
    "SAPO (arXiv 2511.20347); TRL GRPOConfig sapo_temperature_neg=1.05",
    trust_region=True,
    bounds=POSITIVE,
    active_when=When("clip", ("sapo",)),
    doc="SAPO gate temperature for A <= 0.",
)
VESPO_K_POS = component_field(
    2.0,
    "clip",
    "number",
    "VESPO (arXiv 2602.10693); TRL GRPOConfig vespo_k_pos=2.0",
    trust_region=True,
    bounds=NONNEG,
    active_when=When("clip", ("vespo",)),
    doc="VESPO Gamma power k for A >= 0.",
)
VESPO_LAMBDA_POS = component_field(
    3.0,
    "clip",
    "number",
    "VESPO (arXiv 2602.10693); TRL GRPOConfig vespo_lambda_pos=3.0",
    trust_region=True,
    bounds=POSITIVE,
    active_when=When("clip", ("vespo",)),
    doc="VESPO Gamma decay lambda for A >= 0.",
)
VESPO_K_NEG = component_field(
    3.0,
    "clip",
    "number",
    "VESPO (arXiv 2602.10693); TRL GRPOConfig vespo_k_neg=3.0",
    trust_region=True,
    bounds=NONNEG,
    active_when=When("clip", ("vespo",)),
    doc="VESPO Gamma power k for A < 0.",
)
VESPO_LAMBDA_NEG = component_field(
    2.0,
    "clip",
    "number",
    "VESPO (arXiv 2602.10693); TRL GRPOConfig vespo_lambda_neg=2.0",
    trust_region=True,
    bounds=POSITIVE,
    active_when=When("clip", ("vespo",)),
    doc="VESPO Gamma decay lambda for A < 0.",
)


def _check_clip(spec: ObjectiveSpec) -> None:
    """A DFPO transform reweights A_i * w_i, which a score-function rule does not have; a token-probability rule
    has no sequence-level form."""
    if spec.transform != "none" and CLIP_RULES[spec.clip].score_function:
        raise ValueError(f"transform={spec.transform!r} reweights A_i * w_i and has no meaning for the score-function clip={spec.clip!r}")
    if not CLIP_RULES[spec.clip].sequence_level and spec.ratio_level != "token":
        raise ValueError(f"clip={spec.clip!r} is a token-level objective, got ratio_level={spec.ratio_level!r}")


CLIP_COMPONENT = Component("clip", validate=_check_clip, batch_coupling=m2po_coupling)
