"""dfpo's objectives as verl policy losses, registered in verl's own registry.

    # nothing to call: with dfpo installed in verl's environment, verl loads ``dfpo.integrations.verl_plugin``
    # (entry point group "verl.plugins") in every process that imports verl, Ray workers included, and that
    # registers every preset; then in verl's config:
    # actor_rollout_ref.actor.policy_loss.loss_mode = "dfpo_min"   (any preset; "dfpo_" + name for the others)
    # (``register_dfpo_losses()`` does the same by hand; examples/verl_dfpo_grpo.sh is a complete GRPO run)

verl hands a policy loss (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) and nothing that names a row's prompt, so the group of a row is read from its place:
verl lays out ``rollout.n`` consecutive rows per prompt (the group size: ``config.rollout_n`` of the actor config
verl passes to the loss, unless one is given at registration), and a micro-batch holds whole groups only when the
mini-batch and micro-batch sizes are multiples of ``rollout.n``, ``shuffle`` is off and ``balance_batch``
(which reorders rows across ranks) is off. ``check_groups_stay_whole`` refuses a config that breaks any of
these, and the loss itself refuses a batch whose size is not a multiple of the group size.

Advantages are verl's (``algorithm.adv_estimator``): ``check_advantage_estimator`` refuses a config whose estimator is
not the objective's where verl ships it (opo, reinforce_plus_plus_baseline, grpo_passk, remax: verl generates ReMax's
greedy completion itself), and an objective whose estimator verl lacks (gdpo) is refused at registration.

The objective's own aggregation is used (verl's ``loss_agg_mode`` is ignored, and a warning says so once), the
loss is normalised per micro-batch, and verl's rollout importance weights, when given, multiply the per-token
policy term as verl's own losses do. verl's advantages are (B, T): an objective whose components read them token by
token (``ObjectiveSpec.takes_token_advantages``) gets them as they are, so verl's optimal_token_baseline trains it
(``algorithm.adv_estimator='optimal_token_baseline'``, with verl's ``actor.calculate_sum_pi_squared=True``); one that
reads one per completion (a sequence ratio, DFPO's transforms) gets each completion's mean over its real tokens, and
advantages that vary along a completion are refused in one sentence.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch

from dfpo.core.loss import OBJECTIVES, ObjectiveSpec, policy_loss


def loss_mode_name(preset: str) -> str:
    """The verl loss_mode a preset is registered under: its own name for dfpo_*, else ``dfpo_<name>``."""
    return preset if preset.startswith("dfpo") else f"dfpo_{preset}"


def group_size_of(config, group_size: int | None) -> int:
    """The rows per group of a verl loss call: ``group_size`` if given, else the actor config's ``rollout_n``."""
    n = group_size if group_size is not None else getattr(config, "rollout_n", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(
            f"dfpo's verl losses need the group size: the actor config's rollout_n (got {n!r}); "
            "verl sets it from actor_rollout_ref.rollout.n, or pass group_size to register_dfpo_losses"
        )
    return n


def check_no_adaptive_entropy(spec: ObjectiveSpec) -> None:
    """Skywork-OR1's adaptive entropy coefficient (``entropy_target``) is refused: its state moves once per training step,
    but verl calls a registered policy loss per micro-batch with that micro-batch's tensors and the actor config alone (no
    step boundary, no collective across the actor's ranks) and its checkpoints keep nothing of the loss, and its trainer
    loop (``RayPPOTrainer.fit``) offers no per-step hook that could move ``actor.entropy_coeff``."""
    if spec.entropy_target is not None:
        raise ValueError(
            f"objective {spec.name!r} sets entropy_target={spec.entropy_target!r} (Skywork-OR1's adaptive entropy coefficient), "
            "whose coefficient moves once per training step, but verl calls a registered policy loss per micro-batch with only "
            "that micro-batch and the actor config and saves nothing of it in its checkpoints, so the coefficient could neither "
            "move between steps nor survive a resume: train it with dfpo train or TRL's DFPOGRPOTrainer, or in verl drop "
            "entropy_target and set a fixed actor.entropy_coeff"
        )


def make_verl_policy_loss(spec: ObjectiveSpec, group_size: int | None = None):
    """A function with verl's policy-loss signature computing ``dfpo.policy_loss(spec)``; groups = runs of
    ``group_size`` consecutive rows (None: the ``rollout_n`` of the config verl passes).

    An objective whose correction or rejection reads the sampler's log-probs is refused here: verl hands a policy loss
    only its own ``rollout_is_weights`` (configure verl's ``algorithm.rollout_correction`` for those modes); in
    ``rollout_bypass`` mode the correction reads ``old_log_prob`` and needs nothing more."""
    check_no_adaptive_entropy(spec)
    if spec.adv_scale in NOT_IN_VERL:
        raise ValueError(
            f"objective {spec.name!r} uses adv_scale={spec.adv_scale!r}, which verl does not compute (its advantages are "
            f"algorithm.adv_estimator's, one of verl's own: {', '.join(VERL_ESTIMATORS.values())} ...): train it with dfpo train, "
            "or GDPO in TRL with multi_objective_aggregation='normalize_then_sum'"
        )
    needs = spec.required_inputs().get("rollout_logp")
    if needs is not None:
        raise ValueError(
            f"objective {spec.name!r} reads the sampler's log-probs ({needs}), which verl does not pass to a policy loss: use "
            "verl's algorithm.rollout_correction (its rollout_is / rollout_rs modes reach the loss as rollout_is_weights), or "
            "rollout_bypass=true"
        )
    needs_ref = spec.required_inputs().get("ref_logp")
    if needs_ref is not None:
        raise ValueError(
            f"objective {spec.name!r} reads the reference policy's log-probs ({needs_ref}), which verl does not pass to a policy "
            "loss: use verl's own KL (actor.use_kl_loss) for a KL term, or dfpo train / the TRL integration for online IPO"
        )
    needs_tokens = spec.required_inputs().get("token_ids")
    if needs_tokens is not None:
        raise ValueError(
            f"objective {spec.name!r} reads the completions' token ids ({needs_tokens}), which verl does not pass to a policy "
            "loss: use dfpo train or the TRL integration for it"
        )
    warned = []
    per_token = spec.takes_token_advantages  # verl's (B, T) advantages reach the loss core as they are

    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None, rollout_is_weights=None):
        B, n = log_prob.shape[0], group_size_of(config, group_size)
        if B % n:
            raise ValueError(f"a micro-batch of {B} rows holds part of a group (rollout.n={n}); see check_groups_stay_whole")
        if not warned and loss_agg_mode not in (None, ""):
            warnings.warn(
                f"dfpo objective {spec.name!r} aggregates by its own {spec.aggregation!r}; verl's loss_agg_mode={loss_agg_mode!r} is ignored",
                stacklevel=2,
            )
            warned.append(True)
        mask = response_mask.bool()
        adv = advantages if per_token else completion_advantages(advantages, mask, spec)  # (B, T) or (B,)
        rollout_logp = None
        extra = {}
        if rollout_is_weights is not None:  # verl's weights multiply the policy term: pass them as log pi_old - log pi_rollout
            rollout_logp = old_log_prob - torch.log(rollout_is_weights.clamp(min=1e-30))
            extra = {"rollout_correction": "token_truncate", "rollout_cap": float("inf")}
        value, metrics = policy_loss(
            spec, logp=log_prob, old_logp=old_log_prob, advantages=adv, mask=mask,
            group_ids=torch.arange(B, device=log_prob.device) // n, rollout_logp=rollout_logp, **extra,
        )  # fmt: skip
        return value, {f"actor/dfpo/{k}": float(v) for k, v in metrics.items()}

    return loss


def completion_advantages(advantages: torch.Tensor, mask: torch.Tensor, spec: ObjectiveSpec) -> torch.Tensor:
    """One advantage per completion (B,) from verl's (B, T): the mean over its real tokens, refused (ValueError) where
    they vary along a completion (verl's optimal_token_baseline), which ``spec`` cannot read."""
    seq_adv = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # (B,)
    spread = torch.where(mask, (advantages - seq_adv[:, None]).abs(), 0.0).amax() if bool(mask.any()) else 0.0
    if float(spread) > 1e-6 * max(1.0, float(seq_adv.abs().max())):
        raise ValueError(
            f"verl handed advantages that vary along a completion (by up to {float(spread):.3g}: a per-token estimator such as "
            f"algorithm.adv_estimator='optimal_token_baseline'), but objective {spec.name!r} needs one per completion "
            f"({'; '.join(spec.completion_advantage_reasons())}): use a token-level objective or an outcome estimator"
        )
    return seq_adv


def verl_presets() -> list[str]:
    """The objectives ``register_dfpo_losses`` registers by default: every one but those that read the reference's
    log-probs, which verl's policy loss does not receive (online_ipo)."""
    return [name for name, spec in OBJECTIVES.items() if "ref_logp" not in spec.required_inputs()]


def register_dfpo_losses(group_size: int | None = None, objectives: list[str] | None = None) -> list[str]:
    """Register each preset (by default all but those that read the reference's log-probs, which verl's policy loss does
    not receive: online_ipo) in verl's policy-loss registry; returns the loss_mode names.
    ``group_size`` None: each call reads the group size from verl's actor config (``rollout_n``)."""
    try:
        from verl.trainer.ppo.core_algos import register_policy_loss
    except ImportError as err:
        raise ImportError(
            "dfpo.integrations.verl needs verl in this environment (it pins its own transformers: python3 -m venv .venv-verl && .venv-verl/bin/pip install -c constraints.txt verl)"
        ) from err
    names = []
    for preset in objectives or verl_presets():
        name = loss_mode_name(preset)
        register_policy_loss(name)(make_verl_policy_loss(OBJECTIVES[preset], group_size))
        names.append(name)
    return names


VERL_ESTIMATORS = {
    "reinforce_pp_baseline": "reinforce_plus_plus_baseline",
    "opo": "opo",
    "grpo_passk": "grpo_passk",
    "remax": "remax",
    "otb": "optimal_token_baseline",
}
"""dfpo's advantage estimators written from verl's core_algos, and the ``algorithm.adv_estimator`` that computes each in
verl (the advantages a verl policy loss receives are verl's: the objective's estimator must be the one configured)."""
NOT_IN_VERL = ("gdpo",)
"""dfpo's estimators verl ships no ``adv_estimator`` for (a policy loss cannot change the advantages it is handed)."""


def check_advantage_estimator(spec: ObjectiveSpec, algorithm: Mapping) -> None:
    """Refuse (ValueError naming the setting) a verl config whose ``algorithm.adv_estimator`` is not the objective's: an
    objective with one of verl's estimators (``VERL_ESTIMATORS``; remax, whose greedy completion verl's trainer generates
    as ``reward_baselines``) needs verl to compute that one."""
    want = VERL_ESTIMATORS.get(spec.adv_scale)
    got = algorithm.get("adv_estimator")
    if want is not None and got != want:
        raise ValueError(
            f"objective {spec.name!r} uses adv_scale={spec.adv_scale!r}: set algorithm.adv_estimator={want!r} (got {got!r}), "
            "since verl computes the advantages the loss receives"
        )


def check_groups_stay_whole(actor: Mapping, rollout_n: int, trainer: Mapping | None = None) -> None:
    """Refuse verl settings that would put part of a group in a loss call (ValueError naming the setting).

    ``ppo_mini_batch_size`` counts prompts (verl multiplies it by rollout.n), so mini-batches hold whole groups;
    ``ppo_micro_batch_size_per_gpu`` counts rows and must be a multiple of rollout.n."""
    micro = actor.get("ppo_micro_batch_size_per_gpu")
    if micro and micro % rollout_n:
        raise ValueError(
            f"actor.ppo_micro_batch_size_per_gpu={micro} rows is not a multiple of rollout.n={rollout_n}: a group would be split"
        )
    if actor.get("use_dynamic_bsz"):
        raise ValueError("actor.use_dynamic_bsz=True packs rows by token count and splits groups; set it False")
    if actor.get("shuffle"):
        raise ValueError("actor.shuffle=True reorders rows inside a mini-batch and splits groups; set it False")
    if trainer and trainer.get("balance_batch"):
        raise ValueError("trainer.balance_batch=True moves rows across ranks and splits groups; set it False")
