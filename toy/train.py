"""The toy training loop: rollouts, group advantages, K optimiser steps, exact metrics.

Every objective goes through ``dfpo.policy_loss``; seeds are folded into the batch with
distinct group ids (group = seed * n_groups + group_in_seed) so one loss call trains all seeds.

Seeds stay independent, exactly: the loss core aggregates over the whole batch, so the
batched loss is a weighted sum of the per-seed losses, sum_s loss_s * n_s / n with n_s the
seed's aggregation normaliser (its number of sequences, tokens, or B*T). Seed s's parameters
only receive gradient from seed s's rows, so rescaling seed s's gradient (and its per-token
coefficients) by n / n_s makes each seed's update the update of its own loss. Objectives whose
token mask reads batch statistics (STAPO's entropy quantile) are coupled across seeds by the
core and are run with one loss call per seed instead.

Where this departs from real training:
1. ``exact`` mode is the infinite-group limit: one "group" per prompt holding every completion,
   advantages standardised with the policy's own mean and std of the reward (eq 43 with
   population moments), each completion weighted by pi_old(y). The weight enters through the
   advantage (A_i -> c_i A_i with c_i proportional to pi_old(y_i)): every surrogate of the core is
   positively homogeneous in A and the DFPO transforms are invariant to scaling A, so the loss
   is the pi_old-weighted expectation of the per-completion terms. Min-Replace then takes the
   minimum over the whole support (the G -> infinity limit of a group minimum) and the
   projections enforce sum_y pi_old(y) A(y) stilde(y) = 0. Token-mask objectives (STAPO) depend
   on which tokens are sampled and are refused in exact mode.
2. For mean-centred advantages the sampled expected gradient is (1 - 1/G) times the exact one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core import metrics
from ..core.labels import parse_run_label
from ..core.loss import (
    aggregation_count,
    dropped_tokens,
    group_advantages,
    group_variance,
    objective_from_label,
    policy_loss,
    sequence_log_ratio,
)
from ..core.loss.advantages import GREEDY_BASELINE, MULTI_REWARD, TOKEN_LEVEL, optimal_token_baseline
from . import metrics as M
from .config import MODES, OPTIMIZERS, ToyConfig, check_config
from .policy import (
    Rollouts,
    expand_enumeration,
    gather_tokens,
    greedy_rewards,
    init_params,
    log_policy,
    row_entropy,
    sample,
    table_gradient,
)
from .tasks import Enumeration, Task, count_completions, enumerate_completions, make_task

__all__ = ["MODES", "OPTIMIZERS", "ToyConfig", "loss_coefficients", "make_batch", "run", "train_objective", "validate"]


def validate(config: ToyConfig) -> tuple[Task, dict[str, object]]:
    """Check every option before any compute; return the task and the resolved objectives.

    Raises ValueError naming the bad option and its value.
    """
    c = config
    check_config(c)  # types, bounds and choices, from the fields' declarations
    if not c.objectives:
        raise ValueError("objectives must name at least one objective, got objectives=()")
    if len(set(c.objectives)) != len(c.objectives):
        raise ValueError(f"objectives must not repeat a label, got objectives={c.objectives!r}")
    specs = {}
    for name in c.objectives:
        spec = objective_from_label(parse_run_label(name).objective, **dict(c.overrides))  # ValueError for unknown names/overrides
        provided = {"token_ids"} | ({"entropy"} if spec.token_mask != "none" else set())  # loss_coefficients passes them
        unsupported = {arg: why for arg, why in spec.required_inputs().items() if arg not in provided}
        if unsupported:
            raise ValueError(
                f"objective {name!r} needs {', '.join(f'{arg} for {why}' for arg, why in unsupported.items())}, which the toy lab "
                "does not provide (a tabular policy has no reference policy and no separate rollout engine, and its gradient "
                "flows through log pi of the sampled tokens only, so no entropy bonus); use dfpo train for it"
            )
        if c.mode == "exact" and spec.adv_scale not in POPULATION_SCALES:
            raise ValueError(
                f"objective {name!r} uses adv_scale={spec.adv_scale!r}; exact mode has the population limits of "
                f"{', '.join(POPULATION_SCALES)} only: use mode='sampled'"
            )
        if c.mode == "exact" and spec.clip == "m2po":
            raise ValueError(
                f"objective {name!r} reads its clip range off the batch's harmful tokens (clip='m2po'); exact mode weighs every "
                "completion by its probability and cannot take that bound's expectation: use mode='sampled'"
            )
        if c.mode == "exact" and spec.token_mask != "none":
            raise ValueError(
                f"objective {name!r} masks tokens by batch statistics (token_mask={spec.token_mask!r}); exact mode cannot take its expectation"
            )
        specs[name] = spec
    task = make_task(c.task, **dict(c.task_options))
    n_groups = c.groups_per_step or len(task.prompts)
    if c.mode == "exact":
        n_groups = len(task.prompts)
        total = count_completions(task)
        if total > c.exact_limit:
            raise ValueError(
                f"task {c.task!r} has {total} completions, too many for exact mode (exact_limit={c.exact_limit}); use mode='sampled' or a smaller task"
            )
    if c.minibatches > n_groups:
        raise ValueError(f"minibatches must be <= the number of groups per step ({n_groups}), got minibatches={c.minibatches}")
    return task, specs


@dataclass
class _Batch:
    """One rollout batch, per seed: S seeds, B completions, T tokens."""

    roll: Rollouts
    old_logp: Tensor  # (S, B, T)
    entropy: Tensor | None  # (S, B, T), only for token-mask objectives
    adv: Tensor  # (S, B) advantages passed to the loss (exact mode: times the weights c_i); (S, B, T) one per token (otb)
    weight: Tensor  # (S, B) weight of each completion within its group (uniform or pi_old)
    scale: Tensor  # (S, B) c_i (1 in sampled mode)
    n_groups: int


POPULATION_SCALES = ("group", "batch", "none", "rloo", "reinforce_pp", "remax")
"""The advantage estimators whose population limit exact mode computes (``_population_advantages``; remax's is R - the
greedy completion's reward, which the tabular policy gives exactly: ``greedy_rewards``)."""


def _population_advantages(enum: Enumeration, p_old: Tensor, n_prompts: int, eps: float, scale: str) -> Tensor:
    """Eq (43) with the policy's moments: (R - E R) / (std R + eps) per prompt, or the estimator's population limit. (S, C)."""
    S = p_old.shape[0]
    R = enum.reward[None].expand(S, -1)
    mass = torch.zeros(S, n_prompts).index_add(1, enum.prompt, p_old).clamp(min=1e-30)
    mean = torch.zeros(S, n_prompts).index_add(1, enum.prompt, p_old * R) / mass
    centred = R - mean[:, enum.prompt]
    if scale in ("none", "rloo"):  # RLOO's G / (G - 1) factor tends to 1: the population limit is mean-centring
        return centred
    if scale == "reinforce_pp":  # batch baseline: the mean and std over every prompt's completions
        batch_mean = (p_old * R).sum(-1, keepdim=True) / n_prompts  # (S, 1)
        batch_std = (p_old * (R - batch_mean) ** 2).sum(-1, keepdim=True).div(n_prompts).sqrt()  # (S, 1)
        return torch.where(batch_std > 1e-6, (R - batch_mean) / (batch_std + eps), torch.zeros_like(R))
    var = torch.zeros(S, n_prompts).index_add(1, enum.prompt, p_old * centred**2) / mass
    std = var.sqrt()
    if scale == "batch":
        std = (p_old * centred**2).sum(-1, keepdim=True).div(n_prompts).sqrt().expand(S, n_prompts)
    degenerate = var[:, enum.prompt] <= 1e-12
    return torch.where(degenerate, torch.zeros_like(centred), centred / (std[:, enum.prompt] + eps))


def _exact_scale(enum: Enumeration, p_old: Tensor, aggregation: str, n_prompts: int) -> Tensor:
    """c_i such that the loss core's aggregation of c_i-scaled terms is the pi_old-expectation. (S, C)."""
    C = enum.size
    if aggregation == "token_mean":
        lengths = enum.mask.sum(-1).to(p_old.dtype)  # (C,)
        expected_len = (p_old * lengths).sum(-1, keepdim=True)  # (S, 1) sum over prompts of E_p[L]
        return lengths.sum() * p_old / expected_len
    return C * p_old / n_prompts  # sequence means and the constant normaliser


def make_batch(task: Task, spec, logpi_old: Tensor, config: ToyConfig, step: int, enum: Enumeration | None, gen: torch.Generator) -> _Batch:
    """Roll out (sampled) or enumerate (exact) under the frozen policy, with advantages."""
    S = logpi_old.shape[0]
    if config.mode == "exact":
        roll = expand_enumeration(enum, S)
        n_groups = len(task.prompts)
    else:
        n_groups = config.groups_per_step or len(task.prompts)
        prompts = (torch.arange(n_groups) + step * n_groups) % len(task.prompts)
        roll = sample(task, logpi_old, prompts, config.group_size, gen)
    old = gather_tokens(logpi_old, roll.rows, roll.tokens)  # (S, B, T)
    old = torch.where(roll.mask, old, torch.zeros_like(old))
    if spec.needs_entropy:  # only token masks read the entropy (validation refuses an entropy bonus)
        ent = gather_tokens(row_entropy(logpi_old)[..., None].expand_as(logpi_old), roll.rows, roll.tokens)  # (S, B, T)
    else:
        ent = None
    if config.mode == "exact":
        p_old = old.sum(-1).exp()  # (S, C)
        if spec.adv_scale in GREEDY_BASELINE:  # ReMax: R - R(greedy completion of the prompt), no expectation to take
            adv = enum.reward[None] - greedy_rewards(task, logpi_old, torch.arange(n_groups))[:, enum.prompt]  # (S, C)
        else:
            adv = _population_advantages(enum, p_old, n_groups, spec.adv_eps, spec.adv_scale)
        scale = _exact_scale(enum, p_old, spec.aggregation, n_groups)
        weight = p_old
    else:
        gid = (torch.arange(S)[:, None] * n_groups + roll.group).reshape(-1)
        extra = {"lengths": roll.mask.sum(-1).reshape(-1)}  # (S * B,)
        rewards = roll.reward.reshape(-1)  # (S * B,)
        if spec.adv_scale in MULTI_REWARD:  # a toy task scores with one reward function: GDPO's matrix has one column
            rewards = rewards[:, None]  # (S * B, 1)
        if spec.adv_scale in GREEDY_BASELINE:
            extra["baselines"] = torch.gather(greedy_rewards(task, logpi_old, prompts), 1, roll.group).reshape(-1)  # (S * B,)
        if spec.adv_scale in TOKEN_LEVEL:
            adv = _token_baseline(logpi_old, roll, old, rewards, gid)  # (S, B, T)
        else:
            adv = group_advantages(rewards, gid, scale=spec.adv_scale, eps=spec.adv_eps, **extra).reshape(S, -1)  # (S, B)
        scale = torch.ones(roll.mask.shape[:2])  # (S, B)
        weight = torch.ones_like(scale)
    return _Batch(roll, old, ent, adv * (scale[..., None] if adv.ndim == 3 else scale), weight, scale, n_groups)


def _token_baseline(logpi_old: Tensor, roll: Rollouts, old: Tensor, rewards: Tensor, gid: Tensor) -> Tensor:
    """The optimal token baseline's advantages (S, B, T): pi_old(y_t) and sum_v pi_old(v)^2 of the table row each token
    was drawn from, exactly (a tabular policy has every token's distribution)."""
    S, B, T = roll.mask.shape
    collision = logpi_old.exp().square().sum(-1)  # (S, R) sum_v pi_v^2 of each row
    pi_squared = torch.gather(collision, 1, roll.rows.reshape(S, -1)).reshape(S, B, T)  # (S, B, T)
    flat = (S * B, T)
    adv = optimal_token_baseline(rewards, gid, roll.mask.reshape(flat), old.reshape(flat), pi_squared.reshape(flat))
    return adv.reshape(S, B, T)


def _select(batch: _Batch, groups: Tensor) -> tuple[Tensor, ...]:
    """Completions of the given groups (whole groups), per seed."""
    r = batch.roll
    if groups.numel() == batch.n_groups:  # the whole batch
        return r.rows, r.tokens, r.mask, r.group, batch.old_logp, batch.entropy, batch.adv, batch.weight, batch.scale
    keep = torch.isin(r.group[0], groups)  # (B,)
    ent = None if batch.entropy is None else batch.entropy[:, keep]
    return (
        r.rows[:, keep],
        r.tokens[:, keep],
        r.mask[:, keep],
        r.group[:, keep],
        batch.old_logp[:, keep],
        ent,
        batch.adv[:, keep],
        batch.weight[:, keep],
        batch.scale[:, keep],
    )


def _drop_mask(spec, lp: Tensor, old: Tensor, entropy: Tensor | None, adv: Tensor, mask: Tensor) -> Tensor:
    """The core's token mask (STAPO, top-entropy, OPSM), computed for each seed on its own batch. (S, B, T)."""
    return torch.stack(
        [dropped_tokens(spec, lp[s], old[s], None if entropy is None else entropy[s], adv[s], mask[s]) for s in range(lp.shape[0])]
    )


def loss_coefficients(
    spec,
    lp: Tensor,
    old: Tensor,
    adv: Tensor,
    mask: Tensor,
    group: Tensor,
    entropy: Tensor,
    n_groups: int,
    max_len: int,
    *,
    tokens: Tensor | None = None,
    rows: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Each seed's own d loss_s / d logp_it, (S, B, T), from one batched loss call, and the core's
    metrics (pooled over seeds).

    Folding the seeds into one batch is exact unless the spec says the batch is coupled
    (``ObjectiveSpec.coupling_by_component``). A token mask (STAPO's entropy quantile) is made exact for
    token-level objectives with a renormalised mask: it is computed per seed with the core's own mask function
    and passed as the completion mask (dropped tokens then leave the aggregation, which is STAPO's
    renormalisation). Any other coupling (a covariance control over the batch), and any other masked objective
    (an unrenormalised mask such as OPSM, a mask at sequence level), runs one loss call per seed.
    ``tokens`` and ``rows`` (S, B, T), the tokens and their parameter rows, reach the core as ``token_ids`` and
    ``context_ids``: the tabular policy's context at t is its row, so the exact-cancellation arm (``cancel``) finds the
    (row, token) events a whole group holds, as the toy's shared residual reads them.
    """
    S, B, T = lp.shape
    leaf = lp.detach().requires_grad_(True)
    kwargs = dict(max_completion_length=max_len)
    mask_per_seed = spec.token_mask != "none" and spec.ratio_level == "token" and spec.mask_renormalise
    others = {owner: why for owner, why in spec.coupling_by_component().items() if owner != "token_mask"}
    coupled = bool(others) or (spec.token_mask != "none" and not mask_per_seed)
    if coupled:  # batch statistics or a mask the batched call cannot express: one call per seed
        coefs, pooled = [], []
        for s in range(S):
            loss, m = policy_loss(
                spec,
                logp=leaf[s],
                old_logp=old[s],
                advantages=adv[s],
                mask=mask[s],
                group_ids=group[s],
                entropy=None if entropy is None else entropy[s],
                token_ids=None if tokens is None else tokens[s],
                context_ids=None if rows is None else rows[s],
                **kwargs,
            )
            coefs.append(torch.autograd.grad(loss, leaf)[0][s])
            pooled.append(m)
        return torch.stack(coefs), {k: torch.stack([m[k] for m in pooled]).mean() for k in pooled[0]}
    if spec.token_mask != "none":
        dropped = _drop_mask(spec, lp.detach(), old, entropy, adv, mask)  # (S, B, T)
        loss_mask = mask & ~dropped  # renormalised: the dropped tokens leave the aggregation
        kwargs["token_mask"] = "none"
    else:
        dropped, loss_mask = None, mask
    gid = (torch.arange(S)[:, None] * n_groups + group).reshape(-1)
    loss, m = policy_loss(
        spec,
        logp=leaf.reshape(S * B, T),
        old_logp=old.reshape(S * B, T),
        advantages=adv.reshape(S * B, *adv.shape[2:]),  # (S * B,) or (S * B, T)
        mask=loss_mask.reshape(S * B, T),
        group_ids=gid,
        entropy=None if entropy is None else entropy.reshape(S * B, T),
        token_ids=None if tokens is None else tokens.reshape(S * B, T),
        context_ids=None if rows is None else rows.reshape(S * B, T),
        **kwargs,
    )
    coef = torch.autograd.grad(loss, leaf)[0]
    n_s = aggregation_count(loss_mask, spec.aggregation).to(torch.float32)  # (S,)
    coef = coef * (n_s.sum() / n_s.clamp(min=1))[:, None, None]  # seed s's own loss gradient
    if dropped is not None:
        m = dict(m)
        m["mask/frac"] = dropped.sum() / mask.sum().clamp(min=1)
    return coef, m


StepCallback = Callable[[int, dict[str, Tensor]], None]


def train_objective(
    task: Task, objective: str, config: ToyConfig, *, enum: Enumeration | None = None, callback: StepCallback | None = None
) -> dict[str, Tensor]:
    """Train ``config.seeds`` tabular policies with one objective; per-step metrics (steps, S).

    Metrics (see the table of ``dfpo.toy``): reward, reward/mean, tax/kl_step, tax/kl_cum, tax/kl_init,
    grad/template, residual/shared, residual/shared_rel, equiv/logodds, equiv/entropy,
    entropy/sequence, entropy/token, asym, energy/frequent, clip/frac_low, clip/frac_high,
    weights/asym (sampled mode), update/norm (|theta after the K steps - theta before| of each rollout batch),
    ratio/spread (within-group std of the sequence log-ratio log s_i at each update, averaged over groups).
    A quantity the LLM trainer logs too carries its name (``dfpo.core.metric_registry``).
    """
    label = parse_run_label(objective)  # OBJECTIVE[@lr=VALUE]: a label may train at its own learning rate
    spec = objective_from_label(label.objective, **dict(config.overrides))
    lr = label.lr if label.lr is not None else config.lr
    S, K = config.seeds, config.inner_steps
    gen = torch.Generator().manual_seed(config.seed)
    theta = init_params(task, S, noise=config.init_noise, generator=gen).requires_grad_(True)  # (S, R, V)
    legal = task.legal
    opt = torch.optim.Adam([theta], lr=lr) if config.optimizer == "adam" else torch.optim.SGD([theta], lr=lr)
    if enum is None and count_completions(task) <= config.exact_limit:
        enum = enumerate_completions(task, limit=config.exact_limit)
    if config.mode == "exact" and enum is None:
        raise ValueError("exact mode needs the enumeration of the task")
    logpi_init = log_policy(theta.detach(), legal)
    tpl = task.template_rows
    n_forms = len(task.form_names)
    history: dict[str, list[Tensor]] = {}
    kl_cum = torch.zeros(S)
    for step in range(config.steps):
        with torch.no_grad():
            logpi_old = log_policy(theta.detach(), legal)  # (S, R, V) frozen rollout policy
            theta_old = theta.detach().clone()  # (S, R, V)
        batch = make_batch(task, spec, logpi_old, config, step, enum, gen)
        mb_groups = torch.arange(batch.n_groups).chunk(config.minibatches)
        acc: dict[str, Tensor] = {}
        for k in range(K):
            rows, toks, mask, group, old, ent, adv, weight, scale = _select(batch, mb_groups[k % len(mb_groups)])
            with torch.no_grad():
                logpi = log_policy(theta, legal)  # (S, R, V)
                lp = gather_tokens(logpi, rows, toks)  # (S, B, T)
                lp = torch.where(mask, lp, torch.zeros_like(lp))
            coef, core = loss_coefficients(spec, lp, old, adv, mask, group, ent, batch.n_groups, task.max_len, tokens=toks, rows=rows)
            with torch.no_grad():
                theta.grad = table_gradient(coef, logpi, rows, toks, mask)  # (S, R, V) closed form of autograd's
                upd = _update_metrics(
                    task, spec, config, theta.grad, logpi.detach(), coef, rows, toks, mask, group, weight, scale, batch.n_groups
                )
                seq_log_ratio = sequence_log_ratio(lp, old, mask)  # (S, B) eq 44 in log space
                upd["ratio/spread"] = _per_seed_group_variance(seq_log_ratio, group, mask.any(-1), weight).sqrt()  # (S,)
                upd["clip/frac_low"] = core["clip/frac_low"].expand(S)
                upd["clip/frac_high"] = core["clip/frac_high"].expand(S)
                if config.mode == "sampled":  # exact mode scales each advantage by pi_old(y): the core's Asym would be of A_i c_i
                    upd["weights/asym"] = core["weights/asym"].expand(S)
                for key, val in upd.items():
                    acc[key] = acc.get(key, 0) + val / K
            opt.step()
        with torch.no_grad():
            logpi_new = log_policy(theta.detach(), legal)
            kl = M.kl_rows(logpi_new, logpi_old, tpl)
            kl_cum = kl_cum + kl
            row = dict(acc)
            row["tax/kl_step"], row["tax/kl_cum"], row["tax/kl_init"] = kl, kl_cum.clone(), M.kl_rows(logpi_new, logpi_init, tpl)
            row["update/norm"] = (theta.detach() - theta_old).flatten(1).norm(dim=-1)  # (S,) the rollout batch's K steps together
            w = batch.weight / batch.weight.sum(-1, keepdim=True)
            row["reward/mean"] = (w * batch.roll.reward).sum(-1)
            ent_rows = row_entropy(logpi_new)  # (S, R)
            row["entropy/token"] = ent_rows[:, tpl].mean(-1) if bool(tpl.any()) else torch.zeros(S)
            if enum is not None:
                row.update(M.exact_policy_metrics(logpi_new, enum, len(task.prompts), n_forms))
            else:
                row["reward"] = row["reward/mean"]
            for key, val in row.items():
                if not bool(torch.isfinite(val).all()):
                    raise FloatingPointError(f"metric {key} is not finite at step {step} for objective {objective!r}")
                history.setdefault(key, []).append(val.detach().clone())
        if callback is not None:
            callback(step, row)
    return {key: torch.stack(vals) for key, vals in history.items()}


def _per_seed_group_variance(x: Tensor, group: Tensor, valid: Tensor, weight: Tensor) -> Tensor:
    """The loss core's ``group_variance`` (weighted, within groups, averaged over groups) for each seed: (S, B) -> (S,)."""
    return torch.stack([group_variance(x[s], group[s], valid[s], sample_weight=weight[s]) for s in range(x.shape[0])])


def _update_metrics(
    task: Task, spec, config: ToyConfig, grad: Tensor, logpi: Tensor, coef: Tensor, rows, toks, mask, group, weight, scale, n_groups: int
) -> dict[str, Tensor]:
    """Per-update mechanism metrics, each (S,)."""
    S = grad.shape[0]
    tpl = task.template_rows
    out = {"grad/template": grad[:, tpl].flatten(1).norm(dim=-1) if bool(tpl.any()) else torch.zeros(S)}
    kappa = M.sequence_coefficients(coef, mask, spec.aggregation, task.max_len)  # (S, B)
    if config.mode == "exact":
        kappa = torch.where(scale > 1e-30, kappa / scale.clamp(min=1e-30), torch.zeros_like(kappa))  # pi_old(y) ~ 0 rows carry no weight
    out["asym"] = _per_seed_group_variance(kappa, group, mask.any(-1), weight)  # eq 23 on kappa_i = w_i A_i
    if config.mode == "sampled":
        collision = (logpi.exp() ** 2).sum(-1)  # (S, R)
        lp_tok = gather_tokens(logpi, rows, toks)
        coll_tok = torch.gather(collision, 1, rows.reshape(S, -1)).reshape(rows.shape)
        prob_tok = torch.where(mask, lp_tok, torch.zeros_like(lp_tok)).exp()  # (S, B, T)
        grad_norm = metrics.logit_grad_norm(coef, prob_tok, coll_tok)  # (S, B, T): |d loss / d logits| per token
        out["energy/frequent"] = torch.stack(
            [metrics.frequent_energy(grad_norm[s], toks[s], mask[s], len(task.vocab)) for s in range(S)]
        ).float()
        out.update(_shared_residual(coef, rows, toks, mask, group, n_groups, len(task.vocab)))
    return out


def _shared_residual(coef: Tensor, rows: Tensor, toks: Tensor, mask: Tensor, group: Tensor, n_groups: int, vocab: int) -> dict[str, Tensor]:
    """Eq 2's residual per seed, (S,) each: ``dfpo.core.metrics.shared_residual`` on the toy's shared pairs.

    coef (S, B, T) = each seed's d loss_s / d logp; group (S, B) in [0, n_groups). A pair is shared when every
    member of the group has the same parameter row (the tabular policy's whole context) and token at t.
    ``residual/shared`` is the mean |sum_i coef_it| per shared pair, ``residual/shared_rel`` net / gross,
    ``residual/shared_net`` and ``residual/shared_gross`` the sums behind it (0 where there is none).
    """
    S, B, T = coef.shape
    gid = (torch.arange(S)[:, None] * n_groups + group).reshape(-1)  # (S*B,) seeds never share a group
    keys = (rows * vocab + toks).reshape(S * B, T)
    shared = metrics.shared_mask(keys, mask.reshape(S * B, T), gid, prefix=False)
    res = metrics.shared_residual(coef.reshape(S * B, T), shared, gid)
    seed = res.groups // n_groups
    per_seed = lambda x: torch.zeros(S, dtype=torch.float64).index_add_(0, seed, x.double())  # noqa: E731
    net, gross, positions = per_seed(res.net), per_seed(res.gross), per_seed(res.positions)
    zero = torch.zeros(S, dtype=torch.float64)
    return {
        "residual/shared": torch.where(positions > 0, net / positions.clamp(min=1), zero).float(),
        "residual/shared_rel": torch.where(gross > 0, net / gross.clamp(min=1e-300), zero).float(),
        "residual/shared_net": net.float(),
        "residual/shared_gross": gross.float(),
    }


def run(
    config: ToyConfig, *, progress: Callable[[str], None] | None = None, on_step: Callable[[str, int], None] | None = None
) -> tuple[Task, dict[str, dict[str, Tensor]]]:
    """Validate, then train every objective of ``config``: {objective: {metric: (steps, S)}}.

    ``progress(name)`` is called before each objective, ``on_step(name, step)`` after each of its
    training steps (step counted from 0). An exception raised by either stops the run at once and
    propagates (the explorer's Stop button cancels a run this way).
    """
    task, _ = validate(config)
    enum = enumerate_completions(task, limit=config.exact_limit) if count_completions(task) <= config.exact_limit else None
    results = {}
    for name in config.objectives:
        if progress:
            progress(name)
        callback = None if on_step is None else (lambda step, row, name=name: on_step(name, step))
        results[name] = train_objective(task, name, config, enum=enum, callback=callback)
    return task, results
