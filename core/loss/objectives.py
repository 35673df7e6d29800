"""Objective presets: each objective is data, an ``ObjectiveSpec`` (``dfpo.core.loss.spec``) citing the source of
each default in ``sources``, and how a name or a label (``"dfpo_min:stopgrad=score"``) becomes a validated spec.

``OBJECTIVES[name]`` is a frozen spec; ``resolve_objective(name, **overrides)`` returns a validated copy with some
components changed. ``policy_loss`` reads only the spec.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from ..settings import parse_value, type_hints
from .registry import ObjectiveRegistry, caller_module, make_objective
from .spec import COMPONENT_FIELDS, ObjectiveSpec


def resolve_objective(objective: str | ObjectiveSpec, **overrides: object) -> ObjectiveSpec:
    """The preset named ``objective``, an objective label (``"dfpo_min:stopgrad=score"``) or a spec, with ``overrides``
    applied and validated. A label's components and ``overrides`` merge (``objective_parts``); a component both set
    to different values is refused."""
    if isinstance(objective, ObjectiveSpec):
        spec = objective
    else:
        name, overrides = objective_parts(objective, overrides)
        spec = OBJECTIVES[name]
    unknown = sorted(set(overrides) - set(COMPONENT_FIELDS))
    if unknown:
        hint = did_you_mean(unknown[0], COMPONENT_FIELDS)
        known = f": {hint}" if hint else f"; known: {', '.join(COMPONENT_FIELDS)}"
        raise ValueError(f"unknown override(s) {unknown} for objective {spec.name!r}{known}")
    return dataclasses.replace(spec, **overrides) if overrides else spec


_GRPO_SRC = "DeepSeekMath (arXiv 2402.03300); TRL GRPOConfig defaults"
_GSPO_CLIP = "GSPO (arXiv 2507.18071) sec. 5.1: eps_low=3e-4, eps_high=4e-4"
_DFPO_CLIP = "paper gives no clip range for DFPO; GSPO's sec. 5.1 values used (DFPO is built on GSPO, App. B)"
_DFPO_STOPGRAD = (
    "paper eqs 59-62 (ratio form: sg(stilde/sbar) * sbar(theta), GSPO's zero gradient on clipped sequences kept); "
    "the override stopgrad='score' (eq 68/85) removes the trust region on clipped sequences"
)
_SEQ_AGG = "GSPO objective eq 42: mean over the group of per-sequence terms"
_LUSPO_CLIP = (
    "LUSPO (arXiv 2602.05261) sec. 5.1: eps_low=2e-3, eps_high=2.5e-3, as TRL's paper index sets it for loss_type='luspo' "
    "(TRL's GRPOConfig default epsilon=0.2 is GRPO's range: luspo:eps_low=0.2:eps_high=0.2)"
)
_ROLL_AGG = "ROLL's default loss_agg_mode='seq-mean-token-mean' (roll/configs/base_config.py; its off-policy guide sets none)"
_GMPO_CLIP = "GMPO (arXiv 2507.20673): token log-ratios clipped to [-0.4, 0.4], i.e. r in [e^-0.4, e^0.4]"


def _preset(name: str, description: str, sources: dict[str, str], **components: object) -> ObjectiveSpec:
    return ObjectiveSpec(name=name, description=description, sources=MappingProxyType(sources), **components)


def _dfpo(name: str, transform: str, description: str, eq: str) -> ObjectiveSpec:
    return _preset(
        name,
        description,
        {
            "ratio_level": "paper eq 44 (GSPO sequence ratio)",
            "eps_low": _DFPO_CLIP,
            "eps_high": _DFPO_CLIP,
            "transform": eq,
            "stopgrad": _DFPO_STOPGRAD,
            "aggregation": _SEQ_AGG,
        },
        ratio_level="sequence",
        eps_low=3e-4,
        eps_high=4e-4,
        transform=transform,
    )


def _dppo(name: str, divergence: str, bound: float, description: str) -> ObjectiveSpec:
    """DPPO (arXiv 2602.04879, verl ``dppo_tv`` / ``dppo_kl``): score-function loss with a divergence mask."""
    return _preset(
        name,
        description,
        {
            "clip": f"DPPO (arXiv 2602.04879) binary-{divergence} mask; verl policy loss {name!r}",
            "eps_low": f"DPPO recipe: {divergence} bound {bound}",
            "eps_high": f"DPPO recipe: {divergence} bound {bound}",
            "dual_clip_c": f"verl {name}: ratio truncated at clip_ratio_c = 20",
            "aggregation": f"verl {name!r} default loss_agg_mode='token-mean'",
        },
        clip=name,
        eps_low=bound,
        eps_high=bound,
        dual_clip_c=20.0,
        aggregation="token_mean",
    )


OBJECTIVES = ObjectiveRegistry(
    (
        _preset(
            "grpo",
            "GRPO: token ratio, PPO clipping, per-sequence token mean",
            {"eps_low": _GRPO_SRC, "eps_high": _GRPO_SRC, "aggregation": "DeepSeekMath eq 3; TRL loss_type='grpo'"},
        ),
        _preset(
            "dr_grpo",
            "Dr. GRPO: GRPO without std scaling and without length normalisation",
            {
                "eps_low": _GRPO_SRC,
                "eps_high": _GRPO_SRC,
                "aggregation": "Dr. GRPO (arXiv 2503.20783); TRL loss_type='dr_grpo'",
                "adv_scale": "Dr. GRPO (arXiv 2503.20783): no std normalisation",
            },
            aggregation="constant",
            adv_scale="none",
        ),
        _preset(
            "dapo",
            "DAPO: clip-higher and token-level mean",
            {
                "eps_low": "DAPO (arXiv 2503.14476)",
                "eps_high": "DAPO (arXiv 2503.14476) clip-higher",
                "aggregation": "DAPO token-level loss; TRL loss_type='dapo'",
            },
            eps_high=0.28,
            aggregation="token_mean",
        ),
        _preset(
            "gspo",
            "GSPO: length-normalised sequence ratio, PPO clipping per sequence",
            {"ratio_level": "GSPO eq (paper eq 44)", "eps_low": _GSPO_CLIP, "eps_high": _GSPO_CLIP, "aggregation": _SEQ_AGG},
            ratio_level="sequence",
            eps_low=3e-4,
            eps_high=4e-4,
        ),
        _preset(
            "gspo_noclip",
            "GSPO without clipping: the matched control for score-form DFPO (stopgrad='score' has no trust region on clipped sequences)",
            {
                "ratio_level": "GSPO eq (paper eq 44)",
                "clip": "clipping off: what stopgrad='score' does to clipped sequences, as a baseline",
                "eps_low": "unused with clip='none' (GSPO sec. 5.1 values kept for reference)",
                "eps_high": "unused with clip='none' (GSPO sec. 5.1 values kept for reference)",
                "aggregation": _SEQ_AGG,
            },
            ratio_level="sequence",
            clip="none",
            eps_low=3e-4,
            eps_high=4e-4,
        ),
        _preset(
            "gspo_token",
            "GSPO-token: sequence ratio value, token-wise gradient",
            {
                "ratio_level": "GSPO (arXiv 2507.18071) GSPO-token",
                "eps_low": _GSPO_CLIP,
                "eps_high": _GSPO_CLIP,
                "aggregation": _SEQ_AGG,
            },
            ratio_level="sequence_token",
            eps_low=3e-4,
            eps_high=4e-4,
        ),
        _preset(
            "grpo_fix",
            "GRPO-fix: symmetric clipping A * clip(r, 0, 1+eps) per token",
            {
                "clip": "paper App. H eq 79-80",
                "eps_low": "paper eq 79: lower bound 0 (eps_low = 1)",
                "eps_high": "paper App. H (eps as GRPO's 0.2)",
                "aggregation": "paper eq 80: (1/G) sum_i sum_t, no 1/|y_i| (so shared tokens cancel at any lengths, Cor. H.1)",
            },
            clip="symmetric",
            eps_low=1.0,
            eps_high=0.2,
            aggregation="seq_mean_token_sum",
        ),
        _dfpo("dfpo_min", "min", "DFPO Min-Replace: GSPO with stilde_i = min_j sbar_j", "paper eq 50 (App. B.4.1)"),
        _dfpo("dfpo_orth", "orth", "DFPO Orth-Proj: GSPO with sbar projected orthogonal to A", "paper eq 18 (sec. 4.4.2)"),
        _dfpo(
            "dfpo_orth_pos",
            "orth_pos",
            "DFPO Positive Orth-Proj: exact non-negative projection QP",
            "paper eq 51 (App. B.4.2), solved exactly",
        ),
        _dfpo("dfpo_orth_tr", "orth_tr", "DFPO truncate-and-rebalance approximation of eq 51", "paper eqs 52-55 (beta sign corrected)"),
        _preset(
            "stapo",
            "STAPO: DAPO with spurious tokens masked and the loss renormalised",
            {
                "eps_high": "DAPO clip-higher (STAPO builds on DAPO)",
                "token_mask": "STAPO (arXiv 2602.15620)",
                "stapo_tau_p": "STAPO latest version: tau_p = 0.002",
                "stapo_q": "STAPO latest version: q = 0.75",
                "aggregation": "STAPO: loss divided by the number of kept tokens",
            },
            eps_high=0.28,
            token_mask="stapo",
            aggregation="token_mean",
        ),
        _preset(
            "cispo",
            "CISPO: sg(min(r, eps_high)) * A * log pi, every token keeps a gradient",
            {
                "clip": "MiniMax-M1 (arXiv 2506.13585)",
                "eps_low": "unused: CISPO only caps the ratio from above",
                "eps_high": "ScaleRL (arXiv 2510.13786) eps_max = 5.0, TRL's recommended epsilon_high for loss_type='cispo' "
                "(TRL's GRPOConfig default leaves epsilon_high = epsilon = 0.2: cispo:eps_high=0.2)",
                "aggregation": "TRL cispo: token mean",
            },
            clip="cispo",
            eps_low=0.0,
            eps_high=5.0,
            aggregation="token_mean",
        ),
        _preset(
            "sapo",
            "SAPO: a soft, temperature-controlled gate on the token ratio instead of a hard clip",
            {
                "clip": "SAPO (arXiv 2511.20347) gate sigmoid(tau (r - 1)) * 4 / tau; TRL loss_type='sapo'",
                "eps_low": "unused: the gate has no clip range",
                "eps_high": "unused: the gate has no clip range",
                "aggregation": "SAPO: per-sequence token mean (TRL 'sapo', verl forces seq-mean-token-mean)",
            },
            clip="sapo",
        ),
        _preset(
            "luspo",
            "LUSPO: GSPO with each sequence's loss scaled by its length",
            {
                "ratio_level": "GSPO eq (paper eq 44); TRL requires importance_sampling_level='sequence' for luspo",
                "eps_low": _LUSPO_CLIP,
                "eps_high": _LUSPO_CLIP,
                "aggregation": "LUSPO (arXiv 2602.05261); TRL 'luspo': sum over tokens, mean over sequences",
            },
            ratio_level="sequence",
            eps_low=2e-3,
            eps_high=2.5e-3,
            aggregation="seq_mean_token_sum",
        ),
        _preset(
            "vespo",
            "VESPO: a detached Gamma weight of the sequence ratio prod_t r_it times A * log pi",
            {
                "ratio_level": "VESPO (arXiv 2602.10693): w = prod_t r_it (TRL get_gamma_weights)",
                "clip": "VESPO Gamma weighting phi(w) = e^lambda w^k e^(-lambda w); TRL loss_type='vespo'",
                "eps_low": "unused: VESPO has no clip range",
                "eps_high": "unused: VESPO has no clip range",
                "aggregation": "TRL 'vespo': token sum over the batch's real tokens",
            },
            ratio_level="sequence_product",
            clip="vespo",
            aggregation="token_mean",
        ),
        _preset(
            "gpg",
            "GPG: plain policy gradient A * log pi, no ratio and no clip",
            {
                "clip": "GPG (arXiv 2504.02546); verl policy loss 'gpg': -A * log pi",
                "eps_low": "unused: no clip",
                "eps_high": "unused: no clip",
                "aggregation": "verl 'gpg' default loss_agg_mode='token-mean'",
            },
            clip="pg",
            aggregation="token_mean",
        ),
        _dppo("dppo_tv", "TV", 0.15, "DPPO-TV: A * sg(min(r, c)) * log pi, tokens whose probability moved more than the TV bound masked"),
        _dppo("dppo_kl", "KL", 0.05, "DPPO-KL: as DPPO-TV with the binary KL between old and new token probability as the bound"),
        _preset(
            "opsm",
            "GRPO with off-policy sequence masking: negative samples the policy has moved away from are dropped",
            {
                "eps_low": _GRPO_SRC,
                "eps_high": _GRPO_SRC,
                "token_mask": "DeepSeek-V3.2 (arXiv 2512.02556) eq 9; TRL off_policy_mask_threshold",
                "mask_renormalise": "TRL multiplies the per-token loss by the mask: the normaliser keeps every real token",
                "aggregation": "DeepSeekMath eq 3; TRL loss_type='grpo'",
            },
            token_mask="opsm",
            mask_renormalise=False,
        ),
        _preset(
            "clip_cov",
            "Clip-Cov: GRPO with the highest advantage/log-prob covariance tokens dropped from the gradient",
            {
                "eps_low": "verl clip_cov (PPO clipping, clip_ratio 0.2)",
                "eps_high": "verl clip_cov (PPO clipping, clip_ratio 0.2)",
                "cov_control": "Cui et al. 2025 (arXiv 2505.22617) Clip-Cov; verl policy loss 'clip_cov'",
                "aggregation": "verl 'clip_cov' default loss_agg_mode='token-mean'",
            },
            cov_control="clip_cov",
            aggregation="token_mean",
        ),
        _preset(
            "kl_cov",
            "KL-Cov: unclipped policy gradient with a |log r| penalty on the top-covariance tokens",
            {
                "clip": "verl kl_cov: -A * r without clipping",
                "eps_low": "unused: no clip",
                "eps_high": "unused: no clip",
                "cov_control": "Cui et al. 2025 (arXiv 2505.22617) KL-Cov; verl policy loss 'kl_cov'",
                "aggregation": "verl 'kl_cov' default loss_agg_mode='token-mean'",
            },
            clip="none",
            cov_control="kl_cov",
            aggregation="token_mean",
        ),
        _preset(
            "gmpo",
            "GMPO: geometric mean of per-token clipped ratios, one weight per sequence",
            {
                "ratio_level": "GMPO (arXiv 2507.20673) eq 4: geometric mean of token-level clipped ratios",
                "eps_low": _GMPO_CLIP,
                "eps_high": _GMPO_CLIP,
                "aggregation": "GMPO eq 4: (1/G) sum_i of per-sequence terms (verl geo_mean: mean over sequences)",
            },
            ratio_level="geometric",
            eps_low=1.0 - math.exp(-0.4),
            eps_high=math.exp(0.4) - 1.0,
        ),
        # issue 30: peers' losses (TOPR, Kimi k1.5, Tinker's DRO, VAPO's NLL on positive samples, TRL's online IPO)
        _preset(
            "topr",
            "TOPR: A * log pi for positive samples, sg(clamp(r, 0, 1)) * A * log pi for the others",
            {
                "clip": "TOPR (arXiv 2503.14286) eq 8; ROLL pg_variant='topr' (roll/pipeline/rlvr/actor_pg_worker.py "
                "_compute_topr_loss, topr_positive_weight = topr_negative_weight = 1.0), split by A > 0 where ROLL reads score > 0",
                "eps_low": "unused: TOPR's truncation is the fixed interval [0, 1]",
                "eps_high": "unused: TOPR's truncation is the fixed interval [0, 1]",
                "aggregation": _ROLL_AGG,
            },
            clip="topr",
        ),
        _preset(
            "kimi15",
            "Kimi k1.5: -A * log pi plus tau/2 (log pi - log pi_old)^2 per token",
            {
                "clip": "Kimi k1.5 (arXiv 2501.12599) eq 3: plain policy gradient; ROLL pg_variant='kimi15' "
                "(roll/pipeline/rlvr/actor_pg_worker.py _compute_kimi15_loss: -advantages * log_probs)",
                "eps_low": "unused: no clip",
                "eps_high": "unused: no clip",
                "proximal_coef": "ROLL _compute_kimi15_loss: kimi15_tau = 0.1 (Kimi k1.5's tau)",
                "aggregation": _ROLL_AGG,
            },
            clip="pg",
            proximal_coef=0.1,
        ),
        _preset(
            "dro",
            "DRO: -A * log pi plus beta/2 (log pi - log q)^2 per token, summed over each completion",
            {
                "clip": "DRO (Richemond et al., arXiv 2405.19107); Tinker's built-in loss_fn='dro' "
                "(tinker-docs.thinkingmachines.ai/tinker/losses: -(target_logprobs * advantages - 0.5 * beta * quadratic_term))",
                "eps_low": "unused: no clip",
                "eps_high": "unused: no clip",
                "proximal_coef": "Tinker's DRO docs example loss_fn_config={'beta': 0.05} (the service's own default is not published)",
                "aggregation": "Tinker sums token losses (loss = -dro_objective.sum()); the mean over completions divides by B, a "
                "constant step-size factor",
            },
            clip="pg",
            proximal_coef=0.05,
            aggregation="seq_mean_token_sum",
        ),
        _preset(
            "vapo_nll",
            "DAPO's loss plus VAPO's NLL (mu = 0.1) on the positive-advantage samples",
            {
                "eps_low": "VAPO (arXiv 2504.05118) sec. 5.1: eps_low = 0.2",
                "eps_high": "VAPO (arXiv 2504.05118) sec. 5.1 clip-higher: eps_high = 0.28 (as DAPO)",
                "aggregation": "VAPO (arXiv 2504.05118) sec. 4.2: token-level policy gradient loss (as DAPO)",
                "nll_coef": "VAPO (arXiv 2504.05118) sec. 4.3 eq 9 and sec. 5.1: mu = 0.1; cosmos-rl positive_nll_coef",
            },
            eps_high=0.28,
            aggregation="token_mean",
            nll_coef=0.1,
        ),
        _preset(
            "online_ipo",
            "online IPO on each group: (h - 1/(2 beta))^2 between its best and its worst completion, h their log-ratio gap to pi_ref",
            {
                "ipo_beta": "TRL OnlineDPOConfig.beta = 0.1 (trl/experimental/online_dpo/online_dpo_config.py), read by "
                "OnlineDPOTrainer.training_step with loss_type='ipo': (logits - 1 / (2 * beta)) ** 2, Azar et al. (arXiv 2310.12036) eq 17",
                "clip": "unused: the IPO loss replaces the policy term (TRL's online DPO has no ratio or clip)",
                "eps_low": "unused: no clip",
                "eps_high": "unused: no clip",
                "aggregation": "unused by the IPO loss, a mean over pairs of sequence sums (TRL: losses.mean() of "
                "(cr_logprobs * ~cr_padding_mask).sum(1) differences)",
            },
            clip="none",
            ipo_beta=0.1,
        ),
        # issue 30: prime-rl, M2PO, Skywork-OR1
        _preset(
            "prime_rl",
            "prime-rl's default loss: A * r where DPPO's binary TV bound holds, plus 1e-3 (log r)^2 to the sampling policy",
            {
                "clip": "prime-rl src/prime_rl/trainer/rl/loss.py default_loss_fn: DPPO-Binary-TV (arXiv 2602.04879) as -A * r "
                "on the kept tokens, r with its gradient and no cap (verl's dppo_tv is sg(min(r, 20)) A log pi: the same gradient "
                "below r = 20, another value)",
                "eps_low": "prime-rl DefaultLossConfig.dppo_mask_low = 0.2 (verl's DPPO-TV recipe uses 0.15)",
                "eps_high": "prime-rl DefaultLossConfig.dppo_mask_high = 0.2",
                "aggregation": "prime-rl train.py: the step's loss summed over tokens and divided by rl_scale, its real-token count",
                "old_kl_coef": "prime-rl DefaultLossConfig.kl_tau = 1e-3 times log_importance_ratio**2 = 2 k2 (Kimi K2.5, arXiv 2602.02276): "
                "to the sampling policy, not a reference model (verl's 'mse' KL reads the reference)",
                "old_kl_estimator": "prime-rl default_loss_fn: log_importance_ratio**2, the squared log-ratio (k2 up to the factor 2)",
                "adv_scale": "prime-rl GRPOAlgoConfig: reward minus the per-group mean baseline, no std normalisation",
            },
            clip="dppo_tv_ratio",
            eps_low=0.2,
            eps_high=0.2,
            aggregation="token_mean",
            old_kl_coef=2e-3,
            old_kl_estimator="k2",
            adv_scale="none",
        ),
        _preset(
            "m2po",
            "M2PO: PPO clipping at the batch's second-moment bound, only harmful outlier tokens lose their gradient",
            {
                "clip": "M2PO (arXiv 2510.01161); Infini-AI-Lab/M2PO verl/trainer/ppo/core_algos.py compute_m2po_policy_loss",
                "m2po_budget": "M2PO train-scripts/m2po-qwen-math-7b-s*.sh: actor.M2_budget=0.04",
                "eps_low": "unused: M2PO's clip range is read off the batch (m2po_budget)",
                "eps_high": "unused: M2PO's clip range is read off the batch (m2po_budget)",
                "aggregation": "M2PO's verl ppo_trainer.yaml: loss_agg_mode 'token-mean' (the scripts keep it)",
                "beta": "M2PO scripts: use_kl_loss=True with kl_loss_coef=0.00, i.e. no KL term",
            },
            clip="m2po",
            aggregation="token_mean",
        ),
    )
)
"""Every objective by name: dfpo's presets above, then users' own (``register_objective``, the ``dfpo.objectives``
entry points, loaded on the first read): ``dfpo.core.loss.registry``."""


def register_objective(
    name: str,
    *,
    base: str | ObjectiveSpec,
    source: str | Mapping[str, str],
    description: str | None = None,
    **components: object,
) -> ObjectiveSpec:
    """Register objective ``name``: the preset ``base`` with ``components`` changed, each citing ``source`` (one text for
    every change, or a mapping component -> text), and return its validated spec.

    From then on ``name`` is a preset like dfpo's own: ``policy_loss(name, ...)``, labels ``name:KEY=VALUE``, the toy,
    ``dfpo train``, the TRL and verl integrations, the cancellation matrix and ``dfpo objectives`` read it. Raises
    ValueError naming the bad part (a taken or malformed name, an unknown base or component, a missing source, a value
    the component refuses). Called from a ``dfpo.objectives`` entry point, it registers in every dfpo process.
    """
    spec = make_objective(OBJECTIVES, name, base, source, description, components)
    return OBJECTIVES.add(spec, f"register_objective in {caller_module()}")


def override_type(key: str) -> object:
    """The declared type of objective override ``key`` (``float``, ``int | None``, ``bool``, ``str``); untyped
    (``object``) for a key that is not a component, which ``resolve_objective`` then refuses by name."""
    return type_hints(ObjectiveSpec)[key] if key in COMPONENT_FIELDS else object


def parse_override(key: str, text: str) -> object:
    """The value of one ``key=text`` objective override in the component's declared type: the one grammar of
    ``dfpo.core.settings.parse_value`` (labels, ``dfpo toy --override``, ``dfpo train --set objective.overrides.KEY``)."""
    return parse_value(key, text, override_type(key))


def close_names(word: str, known: Iterable[str]) -> list[str]:
    """The known names within a typo or two of ``word`` (difflib's ratio >= 0.75: one letter wrong in four), closest first."""
    return difflib.get_close_matches(word, list(known), n=3, cutoff=0.75)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``did you mean 'gspo'?`` for a typo of a known name (``close_names``); "" when no name is close."""
    close = close_names(word, known)
    return f"did you mean {' or '.join(map(repr, close))}?" if close else ""


def unknown_objective(name: str, label: str | None = None) -> ValueError:
    """The one sentence for an objective name that is not registered: the close names when there are some, else all."""
    where = f" in {label.strip()!r}" if label is not None and label.strip() != name else ""
    hint = did_you_mean(name, OBJECTIVES)
    if hint:
        return ValueError(f"unknown objective={name!r}{where}: {hint} (`dfpo objectives` lists all {len(OBJECTIVES)})")
    return ValueError(f"unknown objective={name!r}{where}; known: {', '.join(OBJECTIVES)}")


def parse_objective_label(label: str) -> tuple[str, dict[str, object]]:
    """``"dfpo_min:stopgrad=score:eps_low=0.2"`` -> ``("dfpo_min", {"stopgrad": "score", "eps_low": 0.2})``.

    A label names a preset and, after colons, component overrides of that one objective; values take
    the type of the component (bool, number, string). Raises ValueError naming the bad part. This is the one
    parser of labels: ``resolve_objective`` (so ``policy_loss``, ``dfpo objectives LABEL``, the trainer's
    ``objective.name``) and ``objective_from_label`` (the toy, ``dfpo compare``, ``dfpo probe``) call it.
    """
    name, *parts = [p.strip() for p in str(label).strip().split(":")]
    if name not in OBJECTIVES:
        raise unknown_objective(name, label)
    overrides: dict[str, object] = {}
    for part in parts:
        key, sep, text = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"objective {label!r}: override {part!r} is not KEY=VALUE")
        if key not in COMPONENT_FIELDS:
            known = did_you_mean(key, COMPONENT_FIELDS) or f"known: {', '.join(COMPONENT_FIELDS)}"
            raise ValueError(f"objective {label!r}: unknown component {key!r}; {known}")
        overrides[key] = parse_override(key, text)
    return name, overrides


def format_override(key: str, value: object) -> str:
    """``key=value`` as a label writes one override: a bool as ``true`` / ``false``, anything else as ``str(value)``
    (``eps_low=0.2``, ``stopgrad=score``, ``dual_clip_c=None``); ``parse_override`` reads the value back."""
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


def format_objective_label(name: str, overrides: Mapping[str, object] = MappingProxyType({})) -> str:
    """``("dfpo_min", {"stopgrad": "score", "length_aware": True})`` -> ``"dfpo_min:length_aware=true:stopgrad=score"``.

    The inverse of ``parse_objective_label``: the preset, then each override (``format_override``) after a colon,
    sorted by key, so a run's label does not depend on the order its overrides were given in; ``dfpo compare``, the
    run folder's identity and ``dfpo probe``'s store spell labels with it."""
    return ":".join([name, *(format_override(k, v) for k, v in sorted(overrides.items()))])


def objective_parts(
    objective: str, overrides: Mapping[str, object] = MappingProxyType({}), *, overrides_name: str = "the overrides given with it"
) -> tuple[str, dict[str, object]]:
    """A name or label and further ``overrides`` of it -> (the preset's name, every override). The rule: both sets of
    overrides apply, and a component that both set must take the same value (ValueError naming it and
    ``overrides_name`` otherwise), so ``objective.name = "dfpo_min:stopgrad=score"`` with ``objective.overrides.eps_low =
    0.2`` is the label ``dfpo_min:eps_low=0.2:stopgrad=score``."""
    name, own = parse_objective_label(objective)
    clash = sorted(k for k in own.keys() & overrides.keys() if own[k] != overrides[k])
    if clash:
        key = clash[0]
        raise ValueError(
            f"the label {objective.strip()!r} sets {key}={own[key]!r} and {overrides_name} set {key}={overrides[key]!r}: "
            f"set {key} in one place"
        )
    return name, {**overrides, **own}


def objective_from_label(label: str, **base_overrides: object) -> ObjectiveSpec:
    """The validated spec of an objective label on top of ``base_overrides``, overrides shared by every label of a run
    (the toy's ``--override``): the label's own overrides win over them."""
    name, overrides = parse_objective_label(label)
    return resolve_objective(name, **{**base_overrides, **overrides})
