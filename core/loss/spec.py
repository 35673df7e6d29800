"""``ObjectiveSpec``: one objective as a composition of orthogonal components, and what follows from its fields.

Each component field is declared in the module of the component that reads it, with a ``FieldInfo``
(``dfpo.core.loss.fields``): its owner component, its bounds or choices, the source of its shared default, when
the loss core reads it, whether a matched control must hold it equal and what it means. ``validate_spec``'s value
checks, ``COMMON_SOURCES``, ``TRUST_REGION_FIELDS``, ``unmatched_components`` and ``component_rows`` (the docs of
``dfpo objectives``) are derived from those declarations; each component's cross-field rules, required inputs
and batch coupling come from its ``Component`` record (``COMPONENTS``). The presets are in ``objectives``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .adaptive_entropy import ENTROPY_COEF_DELTA, ENTROPY_COEF_MAX, ENTROPY_COEF_MIN, ENTROPY_CONTROL_COMPONENT, ENTROPY_TARGET
from .advantages import ADV_EPS, ADV_SCALE, ADVANTAGE_COMPONENT
from .aggregation import AGGREGATION, AGGREGATION_COMPONENT, MAX_COMPLETION_LENGTH
from .cancel import CANCEL, CANCEL_COMPONENT
from .clipping import (
    CLIP,
    CLIP_COMPONENT,
    DUAL_CLIP_C,
    EPS_HIGH,
    EPS_LOW,
    SAPO_TAU_NEG,
    SAPO_TAU_POS,
    VESPO_K_NEG,
    VESPO_K_POS,
    VESPO_LAMBDA_NEG,
    VESPO_LAMBDA_POS,
)
from .correction import (
    CORRECTION_COMPONENT,
    ROLLOUT_BYPASS,
    ROLLOUT_CAP,
    ROLLOUT_CORRECTION,
    ROLLOUT_FLOOR,
    ROLLOUT_IS_BATCH_NORMALISE,
    ROLLOUT_LOW,
)
from .covariance import COV_CLIP_HIGH, COV_CLIP_LOW, COV_COMPONENT, COV_CONTROL, COV_RATIO, KL_COV_COEF
from .entropy import ENTROPY_COEF, ENTROPY_COMPONENT
from .fields import META_KEY, Component, FieldInfo, check_value, field_infos, spec_field
from .imitation import IMITATION_COMPONENT, NLL_COEF
from .kl import BETA, KL_COMPONENT, KL_ESTIMATOR, KL_RATIO_WEIGHT
from .m2po import M2PO_BUDGET, M2PO_MIN_EPS_HIGH, M2PO_MIN_EPS_LOW
from .masks import MASK_RENORMALISE, OPSM_DELTA, STAPO_Q, STAPO_TAU_P, TOKEN_MASK, TOKEN_MASK_COMPONENT, TOP_ENTROPY_FRAC
from .old_kl import OLD_KL_COEF, OLD_KL_COMPONENT, OLD_KL_ESTIMATOR
from .preference import IPO_BETA, PREFERENCE_COMPONENT
from .proximal import PROXIMAL_COEF, PROXIMAL_COMPONENT
from .rejection import ROLLOUT_REJECTION, ROLLOUT_RS_HIGH, ROLLOUT_RS_LOW, ROLLOUT_RS_MAX, ROLLOUT_RS_RENORMALISE
from .shapes import RATIO_COMPONENT, RATIO_LEVEL, RATIO_SHAPES
from .transforms import LENGTH_AWARE, STOPGRAD, TR_FLOOR, TRANSFORM, TRANSFORM_COMPONENT

COMPONENTS: tuple[Component, ...] = (
    CANCEL_COMPONENT,
    RATIO_COMPONENT,
    CLIP_COMPONENT,
    TRANSFORM_COMPONENT,
    TOKEN_MASK_COMPONENT,
    PREFERENCE_COMPONENT,
    COV_COMPONENT,
    PROXIMAL_COMPONENT,
    AGGREGATION_COMPONENT,
    KL_COMPONENT,
    OLD_KL_COMPONENT,
    CORRECTION_COMPONENT,
    ENTROPY_COMPONENT,
    IMITATION_COMPONENT,
    ENTROPY_CONTROL_COMPONENT,
    ADVANTAGE_COMPONENT,
)
"""Every component, in the order the loss core applies them (``fields.OWNERS``): its cross-field rules, its inputs,
why it couples a batch, and its step of the loss pipeline. Its fields are declared in its module."""
RATIO_LEVELS = tuple(RATIO_SHAPES)


def _bookkeeping(source: str) -> FieldInfo:
    return FieldInfo(owner="preset", kind="label", source=source, trust_region=False)


@dataclass(frozen=True)
class ObjectiveSpec:
    """One objective as a composition of components; valid by construction (``validate_spec`` runs on init).

    Each component field is declared (default, bounds or choices, source, when it is read, what it means) in the
    module of the component that reads it, named in the comment above it; ``dfpo objectives`` lists them all.
    """

    name: str = spec_field(dataclasses.MISSING, _bookkeeping("the preset's name (not a component)"))
    """Preset name, e.g. ``"dfpo_min"``."""
    description: str = spec_field(dataclasses.MISSING, _bookkeeping("the preset's one-line description (not a component)"))
    """One line saying what the objective is."""
    # cancel: dfpo.core.loss.cancel
    cancel: str = CANCEL
    # ratio: dfpo.core.loss.shapes
    ratio_level: str = RATIO_LEVEL
    # clip: dfpo.core.loss.clipping
    clip: str = CLIP
    eps_low: float = EPS_LOW
    eps_high: float = EPS_HIGH
    dual_clip_c: float | None = DUAL_CLIP_C
    sapo_tau_pos: float = SAPO_TAU_POS
    sapo_tau_neg: float = SAPO_TAU_NEG
    vespo_k_pos: float = VESPO_K_POS
    vespo_lambda_pos: float = VESPO_LAMBDA_POS
    vespo_k_neg: float = VESPO_K_NEG
    vespo_lambda_neg: float = VESPO_LAMBDA_NEG
    # clip (M2PO's batch bound): dfpo.core.loss.m2po
    m2po_budget: float = M2PO_BUDGET
    m2po_min_eps_low: float | None = M2PO_MIN_EPS_LOW
    m2po_min_eps_high: float | None = M2PO_MIN_EPS_HIGH
    # transform: dfpo.core.loss.transforms
    transform: str = TRANSFORM
    tr_floor: float = TR_FLOOR
    stopgrad: str = STOPGRAD
    length_aware: bool = LENGTH_AWARE
    # token_mask: dfpo.core.loss.masks
    token_mask: str = TOKEN_MASK
    mask_renormalise: bool = MASK_RENORMALISE
    stapo_tau_p: float = STAPO_TAU_P
    stapo_q: float = STAPO_Q
    top_entropy_frac: float = TOP_ENTROPY_FRAC
    opsm_delta: float = OPSM_DELTA
    # preference: dfpo.core.loss.preference
    ipo_beta: float = IPO_BETA
    # cov_control: dfpo.core.loss.covariance
    cov_control: str = COV_CONTROL
    cov_ratio: float = COV_RATIO
    cov_clip_low: float = COV_CLIP_LOW
    cov_clip_high: float = COV_CLIP_HIGH
    kl_cov_coef: float = KL_COV_COEF
    # proximal: dfpo.core.loss.proximal
    proximal_coef: float = PROXIMAL_COEF
    # aggregation: dfpo.core.loss.aggregation
    aggregation: str = AGGREGATION
    max_completion_length: int | None = MAX_COMPLETION_LENGTH
    # kl: dfpo.core.loss.kl
    beta: float = BETA
    kl_estimator: str = KL_ESTIMATOR
    kl_ratio_weight: str = KL_RATIO_WEIGHT
    # old_kl: dfpo.core.loss.old_kl
    old_kl_coef: float = OLD_KL_COEF
    old_kl_estimator: str = OLD_KL_ESTIMATOR
    # correction: dfpo.core.loss.correction
    rollout_correction: str = ROLLOUT_CORRECTION
    rollout_low: float = ROLLOUT_LOW
    rollout_cap: float = ROLLOUT_CAP
    rollout_floor: float = ROLLOUT_FLOOR
    rollout_is_batch_normalise: bool = ROLLOUT_IS_BATCH_NORMALISE
    rollout_bypass: bool = ROLLOUT_BYPASS
    # correction (rejection): dfpo.core.loss.rejection
    rollout_rejection: str = ROLLOUT_REJECTION
    rollout_rs_low: float = ROLLOUT_RS_LOW
    rollout_rs_high: float = ROLLOUT_RS_HIGH
    rollout_rs_max: float = ROLLOUT_RS_MAX
    rollout_rs_renormalise: bool = ROLLOUT_RS_RENORMALISE
    # entropy: dfpo.core.loss.entropy
    entropy_coef: float = ENTROPY_COEF
    # imitation: dfpo.core.loss.imitation
    nll_coef: float = NLL_COEF
    # entropy_control (Skywork-OR1's adaptive coefficient, moved by the trainer): dfpo.core.loss.adaptive_entropy
    entropy_target: float | None = ENTROPY_TARGET
    entropy_coef_delta: float = ENTROPY_COEF_DELTA
    entropy_coef_min: float = ENTROPY_COEF_MIN
    entropy_coef_max: float = ENTROPY_COEF_MAX
    # advantage: dfpo.core.loss.advantages
    adv_scale: str = ADV_SCALE
    adv_eps: float = ADV_EPS
    sources: Mapping[str, str] = field(
        default_factory=dict,
        compare=False,
        metadata={META_KEY: _bookkeeping("each preset's own sources, keyed by field name (not a component)")},
    )
    """Where each default comes from, keyed by field name."""

    def __post_init__(self) -> None:
        validate_spec(self)

    def source(self, component: str) -> str:
        """Where this preset's value of ``component`` comes from (preset-specific, else the shared default's)."""
        if component not in COMPONENT_FIELDS:
            raise ValueError(f"unknown component={component!r}; known: {', '.join(COMPONENT_FIELDS)}")
        return self.sources.get(component) or COMMON_SOURCES[component]

    def components(self) -> dict[str, object]:
        """The component fields (everything but name, description and sources)."""
        return {name: getattr(self, name) for name in COMPONENT_FIELDS}

    def is_active(self, component: str) -> bool:
        """Whether the loss core reads ``component`` for this spec (its ``FieldInfo.active_when``)."""
        condition = SPEC_FIELDS[component].active_when
        return condition is None or condition.holds(self)

    def required_inputs(self) -> dict[str, str]:
        """The optional ``policy_loss`` arguments this spec needs, each with the component setting that needs it
        (the first component that needs an argument names it)."""
        needs: dict[str, str] = {}
        for component in COMPONENTS:
            for name, why in (component.required_inputs(self) if component.required_inputs else {}).items():
                needs.setdefault(name, why)
        return needs

    @property
    def needs_entropy(self) -> bool:
        """``policy_loss`` needs ``entropy``: an entropy token mask (stapo, top_entropy) or an entropy bonus (entropy_coef > 0)."""
        return "entropy" in self.required_inputs()

    @property
    def needs_ref_logp(self) -> bool:
        """``policy_loss`` needs ``ref_logp``: a KL term to the reference policy (beta > 0)."""
        return "ref_logp" in self.required_inputs()

    @property
    def needs_rollout_logp(self) -> bool:
        """``policy_loss`` needs ``rollout_logp``: a rollout correction or rejection outside bypass mode."""
        return "rollout_logp" in self.required_inputs()

    @property
    def needs_token_ids(self) -> bool:
        """``policy_loss`` needs ``token_ids``: the exact-cancellation arm (cancel != 'none') finds the shared tokens."""
        return "token_ids" in self.required_inputs()

    def completion_advantage_reasons(self) -> list[str]:
        """What in this spec reads one advantage per completion, so that per-token advantages (B, T), such as the
        optimal token baseline's, are refused ([]: every component reads them token by token)."""
        reasons = (c.completion_advantage(self) for c in COMPONENTS if c.completion_advantage)
        return [why for why in reasons if why]

    @property
    def takes_token_advantages(self) -> bool:
        """``policy_loss`` accepts advantages of shape (B, T) for this spec (``completion_advantage_reasons``)."""
        return not self.completion_advantage_reasons()

    def coupling_by_component(self) -> dict[str, list[str]]:
        """The reasons of ``batch_coupling``, keyed by the component that gives them (components with none left out)."""
        reasons = {c.owner: c.batch_coupling(self) for c in COMPONENTS if c.batch_coupling}
        return {owner: why for owner, why in reasons.items() if why}

    def batch_coupling(self) -> list[str]:
        """Why the loss of a batch is not the weighted sum of its micro-batches' losses ([] when it is).

        The micro-batches hold whole groups and keep the batch's padded width; each is weighted by
        ``aggregation_count`` of its real-token mask over the batch's (what a trainer knows before the loss).
        """
        return [reason for why in self.coupling_by_component().values() for reason in why]

    @property
    def batch_coupled(self) -> bool:
        """True when accumulating micro-batches (whole groups, weighted by ``aggregation_count``) is not exact:
        see ``batch_coupling`` for the reasons. Token masks with batch thresholds (stapo, top_entropy),
        renormalised token masks, covariance controls, and an entropy bonus outside ``token_mean`` couple a batch."""
        return bool(self.batch_coupling())


SPEC_FIELDS: Mapping[str, FieldInfo] = MappingProxyType(field_infos(ObjectiveSpec))
"""Every field's declaration, in field order."""
COMPONENT_FIELDS = tuple(name for name, info in SPEC_FIELDS.items() if info.owner != "preset")
COMMON_SOURCES: Mapping[str, str] = MappingProxyType({name: SPEC_FIELDS[name].source for name in COMPONENT_FIELDS})
"""The source of each component's shared default (a preset that changes it cites its own)."""
TRUST_REGION_FIELDS = tuple(name for name in COMPONENT_FIELDS if SPEC_FIELDS[name].trust_region)
"""What a matched control must hold equal: everything but the DFPO transform and its parameters."""


def validate_spec(spec: ObjectiveSpec) -> ObjectiveSpec:
    """Raise ValueError naming the first bad component; return the spec unchanged otherwise.

    Each field is checked against its ``FieldInfo`` (choices first, then values), then each component's rules
    that tie its fields to other components' (``Component.validate``).
    """
    for name, info in SPEC_FIELDS.items():
        if info.kind == "choice":
            check_value(name, info, spec)
    for name, info in SPEC_FIELDS.items():
        if info.kind != "choice":
            check_value(name, info, spec)
    for component in COMPONENTS:
        if component.validate:
            component.validate(spec)
    return spec


def component_rows() -> list[dict[str, str]]:
    """One row per component field, from its declaration: owner, default, allowed values, when it is read,
    whether a matched control holds it equal, and the source of its shared default."""
    defaults = {f.name: f.default for f in dataclasses.fields(ObjectiveSpec)}
    rows = []
    for name in COMPONENT_FIELDS:
        info = SPEC_FIELDS[name]
        if info.kind == "choice":
            allowed = " / ".join(info.choices)
        elif info.kind in ("number", "optional_number"):
            allowed = info.bounds.describe() + (" or None" if info.kind == "optional_number" else "")
            allowed += "".join(f"; {b.describe() if b else 'unchecked'} when {w.describe()}" for w, b in info.bounds_when)
        else:
            allowed = {"bool": "true / false", "count": "positive int or None"}[info.kind]
        rows.append(
            {
                "field": name,
                "owner": info.owner,
                "default": f"{defaults[name]:g}" if isinstance(defaults[name], float) else str(defaults[name]),
                "allowed": allowed,
                "read when": "always" if info.active_when is None else info.active_when.describe(),
                "trust region": "yes" if info.trust_region else "no",
                "source": info.source,
            }
        )
    return rows


def trust_region(spec: ObjectiveSpec) -> dict[str, object]:
    """What a fair comparison must hold fixed between two objectives: every ``TRUST_REGION_FIELDS`` value
    the loss core reads for this spec (None for a field it does not read, e.g. ``stapo_q`` without STAPO's mask).

    Score-form DFPO (eq 68) gives clipped sequences a gradient, so its effective clipping is none;
    ratio-form DFPO (eqs 59-62) keeps its clip range. Two specs with equal ``trust_region`` differ
    only in the in-group transform, which is the mechanism a comparison should isolate.
    """
    effective = spec
    if spec.transform != "none" and spec.stopgrad == "score":
        effective = dataclasses.replace(spec, clip="none")
    return {key: getattr(effective, key) if effective.is_active(key) else None for key in TRUST_REGION_FIELDS}


def unmatched_components(method: ObjectiveSpec, baseline: ObjectiveSpec) -> list[str]:
    """Components (of ``trust_region``) in which ``method`` and ``baseline`` differ; [] for a matched control."""
    a, b = trust_region(method), trust_region(baseline)
    return [key for key in TRUST_REGION_FIELDS if a[key] != b[key]]
