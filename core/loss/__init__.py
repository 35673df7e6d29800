"""The shared loss core: every objective of the paper and its peers, as pure torch functions.

from . import policy_loss, group_advantages, OBJECTIVES
"""

from .advantages import group_advantages
from .aggregation import AGGREGATIONS, aggregate, aggregation_count
from .batch import LossBatch, LossContext, PolicyTerms
from .clipping import CLIP_MODES, CLIP_RULES, ClipRule, register_clip_rule, sign_aware_clip, symmetric_clip
from .core import asymmetry, compute_dtype, group_variance, policy_loss
from .fields import Bounds, FieldInfo, When
from .masks import TOKEN_MASK_FUNCTIONS, TOKEN_MASKS, dropped_tokens, low_entropy_mask, stapo_spurious_mask
from .objectives import OBJECTIVES, objective_from_label, parse_objective_label, register_objective, resolve_objective
from .ratios import sequence_log_ratio, sequence_product_log_ratio, sequence_token_ratio, token_log_ratio
from .registry import ENTRY_POINT_GROUP, ObjectivePluginError
from .shapes import RATIO_SHAPES, register_ratio_shape
from .spec import (
    COMMON_SOURCES,
    COMPONENT_FIELDS,
    SPEC_FIELDS,
    TRUST_REGION_FIELDS,
    ObjectiveSpec,
    component_rows,
    trust_region,
    unmatched_components,
    validate_spec,
)
from .transforms import (
    STOPGRAD_FUNCTIONS,
    TRANSFORM_FUNCTIONS,
    TRANSFORMS,
    group_transform,
    min_replace,
    orth_projection,
    positive_orth_projection,
    truncate_rebalance,
)

__all__ = [
    "AGGREGATIONS",
    "Bounds",
    "CLIP_MODES",
    "CLIP_RULES",
    "COMMON_SOURCES",
    "COMPONENT_FIELDS",
    "ENTRY_POINT_GROUP",
    "ClipRule",
    "FieldInfo",
    "LossBatch",
    "LossContext",
    "OBJECTIVES",
    "ObjectivePluginError",
    "ObjectiveSpec",
    "PolicyTerms",
    "RATIO_SHAPES",
    "SPEC_FIELDS",
    "STOPGRAD_FUNCTIONS",
    "TOKEN_MASKS",
    "TOKEN_MASK_FUNCTIONS",
    "TRANSFORMS",
    "TRANSFORM_FUNCTIONS",
    "TRUST_REGION_FIELDS",
    "When",
    "aggregate",
    "aggregation_count",
    "asymmetry",
    "component_rows",
    "compute_dtype",
    "dropped_tokens",
    "group_advantages",
    "group_transform",
    "group_variance",
    "low_entropy_mask",
    "min_replace",
    "objective_from_label",
    "orth_projection",
    "parse_objective_label",
    "policy_loss",
    "positive_orth_projection",
    "register_clip_rule",
    "register_objective",
    "register_ratio_shape",
    "resolve_objective",
    "sequence_log_ratio",
    "sequence_product_log_ratio",
    "sequence_token_ratio",
    "sign_aware_clip",
    "stapo_spurious_mask",
    "symmetric_clip",
    "token_log_ratio",
    "truncate_rebalance",
    "trust_region",
    "unmatched_components",
    "validate_spec",
]
