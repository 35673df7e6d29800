"""Slow reference: every objective written as plain per-sequence / per-group Python loops.

It shares no code with ``dfpo.core.loss`` except the spec (the presets are data). The
positive orthogonal projection (eq 51) is solved here by enumerating every active set, an
independent check of the core's breakpoint solver. Use on small batches only.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch
from torch import Tensor

from dfpo import ObjectiveSpec


def _clip_weight(spec: ObjectiveSpec, r: Tensor, a: float) -> Tensor:
    """The weight w with surrogate a * w, for the ratio-times-advantage rules."""
    if spec.clip == "none":
        return r
    if spec.clip == "sapo":
        tau = spec.sapo_tau_pos if a > 0 else spec.sapo_tau_neg
        return 4.0 / tau / (1.0 + torch.exp(-tau * (r - 1.0)))
    lo, hi = 1.0 - spec.eps_low, 1.0 + spec.eps_high
    c = torch.clamp(r, lo, hi)
    if spec.clip == "symmetric":
        return c
    # PPO: the surrogate is min(r a, c a); return it divided by a (a != 0) or r's min form.
    w = torch.minimum(r, c) if a >= 0 else torch.maximum(r, c)
    if spec.dual_clip_c is not None and a < 0:  # dual-clip: max(min(r a, c a), dual_c a) for a < 0
        w = torch.clamp(w, max=spec.dual_clip_c)
    return w


def _score_weight(spec: ObjectiveSpec, r: float, a: float, p_old: float, log_w_seq: float | None = None) -> float:
    """The detached weight of the score-function rules (surrogate w * a * log pi)."""
    if spec.clip == "cispo":
        return min(r, spec.eps_high)
    if spec.clip == "pg":
        return 1.0
    if spec.clip == "topr":  # ROLL _compute_topr_loss: 1 on positive samples, clamp(ratio, 0, 1) on the others
        return 1.0 if a > 0 else min(max(r, 0.0), 1.0)
    if spec.clip == "vespo":
        k, lam = (spec.vespo_k_pos, spec.vespo_lambda_pos) if a >= 0 else (spec.vespo_k_neg, spec.vespo_lambda_neg)
        log_w = min(max(log_w_seq, math.log(1e-8)), 20.0)
        return math.exp(lam + k * log_w - lam * math.exp(log_w))
    p_old = min(p_old, 1.0)  # DPPO: is the probability change inside the divergence bound? (log-probs > 0 read as 1)
    p = min(r * p_old, 1.0)
    if spec.clip == "dppo_tv":
        inside = (p - p_old <= spec.eps_high) if a > 0 else (p - p_old >= -spec.eps_low)
    else:
        kl = -p_old * math.log(r) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        inside = (kl <= spec.eps_high or p <= p_old) if a > 0 else (kl <= spec.eps_low or p >= p_old)
    return min(r, spec.dual_clip_c) if inside else 0.0


def qp_by_active_sets(s: list[float], a: list[float]) -> list[float]:
    """argmin 1/2|v - s|^2 s.t. a.v = 0, v >= 0 by enumerating zero sets Z (v_Z = 0)."""
    G = len(s)
    best, best_val = None, math.inf
    # a.v = 0 up to round-off relative to a's scale (an absolute 1e-9 let every v pass once |a| ~ 1e-13)
    feasible_tol = 1e-12 * sum(abs(x) for x in a) * max(abs(x) for x in s)
    for k in range(G + 1):
        for zero in itertools.combinations(range(G), k):
            free = [i for i in range(G) if i not in zero]
            den = sum(a[i] ** 2 for i in free)
            lam = sum(a[i] * s[i] for i in free) / den if den > 0 else 0.0
            if den == 0 and abs(sum(a[i] * s[i] for i in free)) > 1e-12:
                continue
            v = [0.0 if i in zero else s[i] - lam * a[i] for i in range(G)]
            if min(v) < -1e-12 or abs(sum(a[i] * v[i] for i in range(G))) > feasible_tol:
                continue
            val = sum((v[i] - s[i]) ** 2 for i in range(G))
            if val < best_val - 1e-15:
                best, best_val = v, val
    return best


def _transform(spec: ObjectiveSpec, sbar: list[float], adv: list[float], lengths: list[int]) -> list[float]:
    G = len(sbar)
    a = [adv[i] / lengths[i] for i in range(G)] if spec.length_aware else list(adv)
    if spec.transform == "min":
        if spec.length_aware:
            m = min(sbar[j] / lengths[j] for j in range(G))
            return [lengths[i] * m for i in range(G)]
        return [min(sbar)] * G
    if spec.transform == "orth":
        den = sum(x * x for x in a)
        coef = sum(a[i] * sbar[i] for i in range(G)) / den if den > 0 else 0.0
        return [sbar[i] - coef * a[i] for i in range(G)]
    if spec.transform == "orth_pos":
        if all(x == 0 for x in a):
            return list(sbar)
        return qp_by_active_sets(sbar, a)
    if spec.transform == "orth_tr":
        sp = [max(x, spec.tr_floor) for x in sbar]
        pos = sum(a[i] * sp[i] for i in range(G) if a[i] > 0)
        neg = sum(-a[i] * sp[i] for i in range(G) if a[i] < 0)
        if pos > neg:
            return [sp[i] * (neg / pos) if a[i] > 0 else sp[i] for i in range(G)]
        if pos < neg:
            return [sp[i] * (pos / neg) if a[i] < 0 else sp[i] for i in range(G)]
        return sp
    raise AssertionError(spec.transform)


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), written out."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _dropped(
    spec: ObjectiveSpec, logp: Tensor, old_logp: Tensor, entropy: Tensor, adv: Tensor, lengths: list[int], positions: list[list[int]]
) -> set[tuple[int, int]]:
    B = len(lengths)
    real = [(i, t) for i in range(B) for t in positions[i]]
    if spec.token_mask == "none":
        return set()
    if spec.token_mask == "opsm":  # whole sequences: A < 0 and mean log(pi_old / pi) > delta
        gone = {
            i
            for i in range(B)
            if lengths[i] and adv[i] < 0 and sum(float(old_logp[i, t] - logp[i, t]) for t in positions[i]) / lengths[i] > spec.opsm_delta
        }
        return {(i, t) for i, t in real if i in gone}
    if spec.token_mask == "stapo":
        cand = [(i, t) for i, t in real if adv[i] > 0 and math.exp(float(logp[i, t])) < spec.stapo_tau_p]
        if not cand:
            return set()
        thr = _quantile([float(entropy[i, t]) for i, t in cand], spec.stapo_q)
        return {(i, t) for i, t in cand if float(entropy[i, t]) < thr}
    if spec.top_entropy_frac >= 1.0:
        return set()
    thr = _quantile([float(entropy[i, t]) for i, t in real], 1.0 - spec.top_entropy_frac)
    return {(i, t) for i, t in real if float(entropy[i, t]) < thr}


def _runs(row_mask) -> list[list[int]]:
    """The runs of consecutive real positions of one row, in order."""
    runs, current = [], []
    for t, real in enumerate(bool(x) for x in row_mask):
        if real:
            current.append(t)
        elif current:
            runs, current = runs + [current], []
    return runs + [current] if current else runs


def _level_value(level: str, values: dict[int, float], runs: list[list[int]], t: int) -> float:
    """A row's per-token values read at one level, for position t: token / sum / mean / max over the row / run mean."""
    if level == "token":
        return values[t]
    if level in ("sequence", "seq_sum"):
        return sum(values.values())
    if level in ("geometric", "seq_mean"):
        return sum(values.values()) / len(values)
    if level == "seq_max":
        return max(values.values())
    run = next(r for r in runs if t in r)  # segment / segment_mean
    return sum(values[s] for s in run) / len(run)


def _log_rho(spec: ObjectiveSpec, logp, old_logp, rollout_logp, i: int, t: int) -> float:
    """log rho_t = log pi_old - log pi_rollout (bypass: log pi_theta - log pi_old), clamped to +-20 like every ratio."""
    gap = float(logp[i, t] - old_logp[i, t]) if spec.rollout_bypass else float(old_logp[i, t] - rollout_logp[i, t])
    return min(max(gap, -20.0), 20.0)


def _correction_weights(spec: ObjectiveSpec, logp, old_logp, rollout_logp, mask) -> dict[tuple[int, int], float]:
    """The rollout correction's weight of each real token (verl rollout_corr_helper.compute_rollout_correction_weights,
    OpenRLHF models/loss.py PolicyLoss (tis, icepop), ROLL utils/train_infer_corrections.py, as read)."""
    B = mask.shape[0]
    if spec.rollout_correction == "none":
        return {}
    level, treatment = spec.rollout_correction.rsplit("_", 1)
    weights: dict[tuple[int, int], float] = {}
    for i in range(B):
        runs = _runs(mask[i])
        lr = {t: _log_rho(spec, logp, old_logp, rollout_logp, i, t) for run in runs for t in run}
        for t in lr:
            rho = math.exp(min(max(_level_value(level, lr, runs, t), -20.0), 20.0))
            if treatment == "truncate":
                weights[i, t] = min(max(rho, spec.rollout_floor), spec.rollout_cap)
            else:
                weights[i, t] = rho if spec.rollout_low <= rho <= spec.rollout_cap else 0.0
    if spec.rollout_is_batch_normalise:
        if level in ("token", "segment"):
            mean = sum(weights.values()) / max(len(weights), 1)
        else:
            rows = sorted({i for i, _ in weights})
            mean = sum(next(w for (j, _), w in weights.items() if j == i) for i in rows) / max(len(rows), 1)
        weights = {k: w / max(mean, 1e-8) for k, w in weights.items()}
    return weights


def _rejected(spec: ObjectiveSpec, logp, old_logp, rollout_logp, mask) -> set[tuple[int, int]]:
    """Tokens the rollout rejection drops (verl rollout_corr_helper.compute_rollout_rejection_mask, as read; the k1
    band on rho = pi_old / pi_rollout itself, see dfpo.core.loss.rejection)."""
    if spec.rollout_rejection == "none":
        return set()
    level, estimator = spec.rollout_rejection.rsplit("_", 1)
    out = set()
    for i in range(mask.shape[0]):
        runs = _runs(mask[i])
        stat = {}
        for run in runs:
            for t in run:
                lr = _log_rho(spec, logp, old_logp, rollout_logp, i, t)
                stat[t] = {"k1": lr, "k2": 0.5 * lr * lr, "k3": math.exp(lr) - 1.0 - lr}[estimator]
        for t in stat:
            value = _level_value(level, stat, runs, t)
            if estimator == "k1":
                low = -math.inf if spec.rollout_rs_low <= 0 else math.log(spec.rollout_rs_low)
                keep = low <= value <= math.log(spec.rollout_rs_high)
            else:
                keep = value <= spec.rollout_rs_max
            if not keep:
                out.add((i, t))
    return out


def reference_loss(
    spec: ObjectiveSpec, *, logp, old_logp, advantages, mask, group_ids, entropy=None, ref_logp=None, rollout_logp=None
) -> Tensor:
    B, T = logp.shape
    lengths = [int(mask[i].sum()) for i in range(B)]
    positions = [[t for t in range(T) if bool(mask[i, t])] for i in range(B)]  # each row's real tokens (masks may have holes)
    adv = [float(a) for a in advantages]
    if spec.ipo_beta > 0:  # online IPO replaces the policy term: TRL's ipo loss on each group's best/worst pair
        gids = [int(g) for g in group_ids]
        return trl_online_ipo_loss(logp, ref_logp, mask, adv, gids, spec.ipo_beta)
    if spec.clip == "m2po":  # M2PO is PPO at bounds read off the whole batch (by the loop below)
        low, high = m2po_bounds_loop(
            logp.detach(), old_logp, advantages, mask, spec.m2po_budget, spec.m2po_min_eps_low, spec.m2po_min_eps_high
        )
        spec = dataclasses.replace(spec, clip="ppo", eps_low=1.0 - low, eps_high=high - 1.0, dual_clip_c=None)
    # per-token surrogate terms u[i][t] (with autograd through logp)
    u: dict[tuple[int, int], Tensor] = {}
    if spec.clip == "vespo":  # a detached Gamma weight of prod_t r_it times a * log pi at every token
        for i in range(B):
            log_w = sum(float(logp[i, t] - old_logp[i, t]) for t in positions[i])
            for t in positions[i]:
                u[i, t] = _score_weight(spec, 0.0, adv[i], 0.0, log_w) * adv[i] * logp[i, t]
    elif spec.ratio_level in ("sequence", "geometric"):
        sbar = {}
        for i in range(B):
            if lengths[i] == 0:
                continue
            if spec.ratio_level == "sequence":  # GSPO: clip the geometric mean of the token ratios
                log_s = sum(logp[i, t] - old_logp[i, t] for t in positions[i]) / lengths[i]
                sbar[i] = _clip_weight(spec, torch.exp(log_s), adv[i])
            else:  # GMPO: the geometric mean of the clipped token ratios
                logs = [torch.log(_clip_weight(spec, torch.exp(logp[i, t] - old_logp[i, t]), adv[i])) for t in positions[i]]
                sbar[i] = torch.exp(sum(logs) / lengths[i])
        weight = dict(sbar)
        if spec.transform != "none":
            for g in set(int(x) for x in group_ids):
                members = [i for i in range(B) if int(group_ids[i]) == g and lengths[i] > 0]
                if not members:
                    continue
                new = _transform(spec, [float(sbar[i].detach()) for i in members], [adv[i] for i in members], [lengths[i] for i in members])
                for i, v in zip(members, new):
                    if spec.stopgrad == "score":
                        weight[i] = v  # float: no gradient through the weight
                    elif spec.stopgrad == "ratio":
                        weight[i] = (v / float(sbar[i].detach()) if float(sbar[i].detach()) > 0 else 0.0) * sbar[i]
                    else:
                        raise AssertionError("stopgrad='none' is not in the reference")
        for i in weight:
            for t in positions[i]:
                if spec.transform != "none" and spec.stopgrad == "score":
                    u[i, t] = adv[i] * weight[i] * torch.exp(logp[i, t] - logp[i, t].detach())
                else:
                    u[i, t] = adv[i] * weight[i]
    else:
        for i in range(B):
            if lengths[i] == 0:
                continue
            log_s = sum(logp[i, t] - old_logp[i, t] for t in positions[i]) / lengths[i]
            for t in positions[i]:
                if spec.ratio_level == "sequence_token":
                    r = torch.exp(log_s).detach() * torch.exp(logp[i, t] - logp[i, t].detach())
                else:
                    r = torch.exp(logp[i, t] - old_logp[i, t])
                if spec.clip in ("cispo", "pg", "dppo_tv", "dppo_kl", "topr"):
                    w = _score_weight(spec, float(r.detach()), adv[i], math.exp(float(old_logp[i, t])))
                    u[i, t] = w * adv[i] * logp[i, t]
                elif spec.clip == "dppo_tv_ratio":  # prime-rl default_loss_fn: A * r inside the TV bound, 0 outside
                    p_old = min(math.exp(float(old_logp[i, t])), 1.0)
                    p = min(float(r.detach()) * p_old, 1.0)
                    inside = (p - p_old <= spec.eps_high) if adv[i] > 0 else (p - p_old >= -spec.eps_low)
                    u[i, t] = adv[i] * r * (1.0 if inside else 0.0)
                else:
                    u[i, t] = adv[i] * _clip_weight(spec, r, adv[i])
    masked = _dropped(spec, logp.detach(), old_logp, entropy, advantages, lengths, positions)
    rejected = _rejected(spec, logp.detach(), old_logp, rollout_logp, mask)
    dropped = masked | rejected
    uncounted = (masked if spec.mask_renormalise else set()) | (rejected if spec.rollout_rs_renormalise else set())
    norm_len = [sum(1 for t in positions[i] if (i, t) not in uncounted) for i in range(B)]

    def agg(terms: dict[tuple[int, int], Tensor]) -> Tensor:
        rows = [i for i in range(B) if norm_len[i] > 0]
        total = logp.sum() * 0.0
        if spec.aggregation == "seq_mean_token_mean":
            for i in rows:
                total = total + sum(terms[i, t] for t in positions[i] if (i, t) in terms) / norm_len[i]
            return total / max(len(rows), 1)
        s = sum((v for v in terms.values()), logp.sum() * 0.0)
        if spec.aggregation == "token_mean":
            return s / max(sum(norm_len), 1)
        if spec.aggregation == "constant":
            return s / (B * (spec.max_completion_length or T))
        return s / max(len(rows), 1)

    kept = {k: -v for k, v in u.items() if k not in dropped}
    if spec.cov_control != "none":  # covariance of A and log pi over the kept real tokens, by hand
        real = sorted(k for k in u if k not in dropped)
        a_mean = sum(adv[i] for i, _ in real) / len(real)
        lp_mean = sum(float(logp[i, t]) for i, t in real) / len(real)
        cov = {(i, t): (adv[i] - a_mean) * (float(logp[i, t]) - lp_mean) for i, t in real}
        count = max(int(spec.cov_ratio * len(real)), 1)
        if spec.cov_control == "clip_cov":

            def clipped(i, t):
                r = math.exp(float(logp[i, t] - old_logp[i, t]))
                return (adv[i] > 0 and r > 1 + spec.eps_high) or (adv[i] < 0 and r < 1 - spec.eps_low)

            band = [k for k in real if spec.cov_clip_low < cov[k] < spec.cov_clip_high and not clipped(*k)]
            for k in sorted(band, key=lambda k: -cov[k])[:count]:
                kept[k] = kept[k] * 0.0  # no gradient, still counted by the aggregation
        else:
            for i, t in sorted(real, key=lambda k: -cov[k])[:count]:
                kept[i, t] = kept[i, t] + spec.kl_cov_coef * torch.abs(logp[i, t] - old_logp[i, t])
    if spec.proximal_coef > 0:  # Kimi k1.5's tau/2 (log pi - log pi_old)^2 on each kept token (roll_kimi15_token_loss)
        for i, t in kept:
            kept[i, t] = kept[i, t] + 0.5 * spec.proximal_coef * (logp[i, t] - old_logp[i, t]) ** 2
    for k, w in _correction_weights(spec, logp.detach(), old_logp, rollout_logp, mask).items():
        if k in kept:
            kept[k] = kept[k] * w
    loss = agg(kept)
    if spec.entropy_coef > 0:  # minus the coefficient times the mean entropy of the kept tokens
        kept_tokens = [(i, t) for i in range(B) for t in positions[i] if (i, t) not in dropped]
        loss = loss - spec.entropy_coef * sum(entropy[i, t] for i, t in kept_tokens) / max(len(kept_tokens), 1)
    if spec.nll_coef > 0:  # VAPO's NLL: mean -log pi over the positive samples' kept tokens (cosmos_positive_nll)
        positive = [(i, t) for i in range(B) for t in positions[i] if (i, t) not in dropped and adv[i] > 0]
        loss = loss + spec.nll_coef * cosmos_positive_nll([logp[i, t] for i, t in positive], logp)
    if spec.beta > 0:
        kl = {}
        for i in range(B):
            for t in positions[i]:
                if (i, t) in uncounted:
                    continue
                d = logp[i, t] - ref_logp[i, t]  # verl core_algos.kl_penalty's names: k3 'low_var_kl', k2 'mse', k1 'kl'
                kl[i, t] = {"k3": lambda d: torch.exp(-d) + d - 1, "k2": lambda d: 0.5 * d * d, "k1": lambda d: d}[spec.kl_estimator](d)
                if spec.kl_ratio_weight == "token":  # TRL use_bias_correction_kl: per_token_kl * coef_1, with its gradient
                    kl[i, t] = kl[i, t] * torch.exp(logp[i, t] - old_logp[i, t])
                elif spec.kl_ratio_weight == "sequence":
                    kl[i, t] = kl[i, t] * torch.exp(sum(logp[i, s] - old_logp[i, s] for s in positions[i]) / lengths[i])
        loss = loss + spec.beta * agg(kl)
    if spec.old_kl_coef > 0:  # the penalty to pi_old at every real token, aggregated over all of them
        d = {(i, t): logp[i, t] - old_logp[i, t] for i in range(B) for t in positions[i]}
        k = {key: {"k3": torch.exp(-v) + v - 1, "k2": 0.5 * v * v, "k1": v}[spec.old_kl_estimator] for key, v in d.items()}
        rows = [i for i in range(B) if lengths[i] > 0]
        zero = logp.sum() * 0.0
        if spec.aggregation == "seq_mean_token_mean":
            penalty = sum((sum(k[i, t] for t in positions[i]) / lengths[i] for i in rows), zero) / max(len(rows), 1)
        elif spec.aggregation == "token_mean":
            penalty = sum(k.values(), zero) / max(sum(lengths), 1)
        elif spec.aggregation == "constant":
            penalty = sum(k.values(), zero) / (B * (spec.max_completion_length or T))
        else:
            penalty = sum(k.values(), zero) / max(len(rows), 1)
        loss = loss + spec.old_kl_coef * penalty
    return loss


def reference_opo(rewards: list[float], group_ids: list[int], lengths: list[int]) -> list[float]:
    """verl core_algos.compute_opo_outcome_advantage, as read: per group the baseline sum(L * R) / sum(L), subtracted
    from each score (dfpo: 0 for a single-completion or all-equal group, as every dfpo estimator)."""
    out = []
    for i, r in enumerate(rewards):
        members = [j for j, g in enumerate(group_ids) if g == group_ids[i]]
        if len(members) < 2 or len({rewards[j] for j in members}) == 1:
            out.append(0.0)
            continue
        out.append(r - sum(lengths[j] * rewards[j] for j in members) / sum(lengths[j] for j in members))
    return out


def reference_reinforce_pp_baseline(rewards: list[float], group_ids: list[int], lengths: list[int]) -> list[float]:
    """verl core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage, as read: scores minus the group mean,
    tiled over the response tokens, then verl_F.masked_whiten (mean and Bessel-corrected variance over the masked
    tokens, (x - mean) * rsqrt(var + 1e-8)); one value per completion (dfpo: 0 centring for a single or all-equal group)."""
    centred = []
    for i, r in enumerate(rewards):
        members = [j for j, g in enumerate(group_ids) if g == group_ids[i]]
        same = len(members) < 2 or len({rewards[j] for j in members}) == 1
        centred.append(0.0 if same else r - sum(rewards[j] for j in members) / len(members))
    tokens = [c for c, L in zip(centred, lengths) for _ in range(L)]
    if len(tokens) < 2:
        return [0.0] * len(rewards)
    mean = sum(tokens) / len(tokens)
    var = sum((x - mean) ** 2 for x in tokens) / len(tokens) * len(tokens) / (len(tokens) - 1)
    return [(c - mean) / math.sqrt(var + 1e-8) for c in centred]


def reference_grpo_passk(rewards: list[float], group_ids: list[int], eps: float) -> list[float]:
    """verl core_algos.compute_grpo_passk_outcome_advantage (norm_adv_by_std_in_grpo=True), as read: per group,
    torch.topk(rewards, 2) -> (r_max, r_second_max); the top index gets (r_max - r_second_max) / (torch.std + eps),
    all others 0 (dfpo: a single-completion group gets 0 where verl raises)."""
    out = [0.0] * len(rewards)
    for g in sorted(set(group_ids)):
        members = [j for j, h in enumerate(group_ids) if h == g]
        if len(members) < 2:
            continue
        top = torch.topk(torch.tensor([rewards[j] for j in members], dtype=torch.float64), 2)
        std = float(torch.tensor([rewards[j] for j in members], dtype=torch.float64).std())
        out[members[int(top.indices[0])]] = float(top.values[0] - top.values[1]) / (std + eps)
    return out


# ----------------------------------------------------------------------------- issue 30: the peers' losses, as read
# Each function below is written from the peer's own code (file and function cited), one token at a time; the tests in
# tests/core/test_peer_losses.py compare them with the core (and reference_loss above calls cosmos_positive_nll).


def roll_topr_token_loss(ratio: float, advantage: float, logp: Tensor, score: float) -> Tensor:
    """ROLL roll/pipeline/rlvr/actor_pg_worker.py ActorWorker._compute_topr_loss at one token (topr_positive_weight =
    topr_negative_weight = 1.0): -A * log pi for a sample with score > 0, -clamp(ratio, 0, 1).detach() * A * log pi for
    the others."""
    if score > 0:
        return -advantage * logp
    return -min(max(ratio, 0.0), 1.0) * advantage * logp


def roll_kimi15_token_loss(advantage: float, logp: Tensor, old_logp: float, tau: float = 0.1) -> Tensor:
    """ROLL roll/pipeline/rlvr/actor_pg_worker.py ActorWorker._compute_kimi15_loss at one token:
    -advantages * log_probs + tau * 0.5 * (log_probs - old_log_probs)^2 (kimi15_tau = 0.1)."""
    return -advantage * logp + tau * 0.5 * (logp - old_logp) ** 2


def cosmos_positive_nll(positive_logps: list[Tensor], like: Tensor) -> Tensor:
    """NVIDIA cosmos-rl GRPO trainer, positive example LM loss (positive_nll_coef): -logp[positive tokens].mean(), skipped
    (0 here) when no token is positive; VAPO (arXiv 2504.05118) eq 9's L_NLL."""
    if not positive_logps:
        return like.sum() * 0.0
    return -sum(positive_logps) / len(positive_logps)


def roll_agg_seq_mean_token_mean(per_token: dict[tuple[int, int], Tensor], rows: list[list[int]]) -> Tensor:
    """ROLL's default loss_agg_mode 'seq-mean-token-mean' (roll/utils/functionals.py agg_loss): each non-empty row's mean
    over its tokens, then the mean over those rows."""
    means = [sum(per_token[i, t] for t in ts) / len(ts) for i, ts in enumerate(rows) if ts]
    return sum(means) / len(means)


def tinker_dro_datum_loss(logps: list[Tensor], sampling_logps: list[float], advantages: list[float], beta: float) -> Tensor:
    """Tinker's built-in loss_fn='dro' on one datum (tinker-docs.thinkingmachines.ai/tinker/losses, DRO): quadratic_term =
    (target_logprobs - sampling_logprobs)^2, dro_objective = target_logprobs * advantages - 0.5 * beta * quadratic_term,
    loss = -dro_objective.sum() over the datum's tokens."""
    return -sum(lp * a - 0.5 * beta * (lp - q) ** 2 for lp, q, a in zip(logps, sampling_logps, advantages))


def trl_online_ipo_loss(logp: Tensor, ref_logp: Tensor, mask: Tensor, rewards: list[float], group_ids: list[int], beta: float) -> Tensor:
    """TRL 1.16 trl/experimental/online_dpo/online_dpo_trainer.py OnlineDPOTrainer.training_step, loss_type='ipo', with
    each group's pair picked here (TRL's two completions per prompt generalised; the pick is dfpo's rule, stated in
    core/loss/preference.py): y_w the first non-empty row with the group's highest reward, y_l the last with its lowest,
    no pair when they are equal. Then as TRL: cr_logprobs_sum = (cr_logprobs * ~cr_padding_mask).sum(1) for the policy
    and the reference, logits = (chosen - rejected) - (chosen_ref - rejected_ref), losses = (logits - 1 / (2 * beta)) ** 2,
    loss = losses.mean() over the pairs. One loop per token, one per row."""
    B, T = mask.shape
    sums, ref_sums = [], []
    for i in range(B):
        s, r = logp.new_zeros(()), 0.0
        for t in range(T):
            if bool(mask[i, t]):
                s = s + logp[i, t]
                r += float(ref_logp[i, t])
        sums.append(s)
        ref_sums.append(r)
    losses = []
    for g in sorted(set(group_ids)):
        rows = [i for i in range(B) if group_ids[i] == g and bool(mask[i].any())]
        if not rows:
            continue
        high, low = max(rewards[i] for i in rows), min(rewards[i] for i in rows)
        if high == low:
            continue
        chosen = next(i for i in rows if rewards[i] == high)
        rejected = [i for i in rows if rewards[i] == low][-1]
        logits = (sums[chosen] - sums[rejected]) - (ref_sums[chosen] - ref_sums[rejected])
        losses.append((logits - 1 / (2 * beta)) ** 2)
    if not losses:
        return logp.sum() * 0.0
    return sum(losses) / len(losses)


# --- issue 30: prime-rl, M2PO, Skywork-OR1 ---------------------------------------------------------------------------


def reference_prime_rl_default(logp, old_logp, advantages, mask, *, dppo_mask_low=0.2, dppo_mask_high=0.2, adv_tau=1.0, kl_tau=1e-3):
    """prime-rl's default loss, written from ``src/prime_rl/trainer/rl/loss.py`` as read: ``default_loss_fn`` per sample
    (the DPPO-Binary-TV keep mask by the sign of A, ``-keep * adv_tau * A * r + kl_tau * (log r)^2`` at every token of the
    loss mask, summed), summed over samples by ``compute_loss`` and divided by ``rl_scale``, the real-token count
    (``train.py``). Ragged rows come as a padded batch here; prime-rl packs them, which the per-sample loop undoes."""
    total, n = logp.sum() * 0.0, 0
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not bool(mask[i, t]):
                continue
            n += 1
            log_r = logp[i, t] - old_logp[i, t]
            r = torch.exp(log_r)
            probs_diff = float(torch.exp(logp[i, t].detach()) - torch.exp(old_logp[i, t]))
            a = float(advantages[i])
            masked = probs_diff > dppo_mask_high if a > 0 else probs_diff < -dppo_mask_low
            pg = 0.0 if masked else adv_tau * a * r
            total = total + (-pg + kl_tau * log_r**2)
    return total / max(n, 1)


def m2po_bounds_loop(logp, old_logp, advantages, mask, budget, miniclip_low=None, miniclip_high=None) -> tuple[float, float]:
    """M2PO's ratio bounds (low, high), written from Infini-AI-Lab/M2PO ``verl/trainer/ppo/core_algos.py`` as read:
    ``_get_trust_region_tokens_delta_sq`` (harmful tokens), ``kpo_clip_harmful_tokens`` (the budget test) and
    ``_solve_tau_from_sorted_delta2`` (the breakpoint loop), then ``compute_m2po_policy_loss``'s miniclip widening."""
    delta_sq = []
    for i in range(logp.shape[0]):
        a = float(advantages[i])
        for t in range(logp.shape[1]):
            if not bool(mask[i, t]):
                continue
            delta = float(old_logp[i, t]) - float(logp[i, t])
            r = math.exp(-delta)
            if (a > 1e-12 and r > 1.0 + 1e-12) or (a < -1e-12 and r < 1.0 - 1e-12):
                delta_sq.append(delta**2)
    n = len(delta_sq)
    clip_low, clip_high = 0.0, 100000.0  # no harmful token, or M2 within the budget: no constraint
    if n and sum(delta_sq) / n > budget + 1e-12:
        v = sorted(delta_sq)
        target, left = budget * n, 0.0
        for k in range(n):
            left += v[k]
            if (v[k] - 1e-12) * (n - k - 1) + left >= target - 1e-12:
                tau = 0.0 if k == 0 else max(v[k - 1] - 1e-12, 0.0) ** 0.5
                break
        clip_low, clip_high = math.exp(-tau), math.exp(tau)
    eps_low, eps_high = 1 - clip_low, clip_high - 1  # compute_m2po_policy_loss
    if miniclip_low is not None and eps_low < miniclip_low:
        eps_low = miniclip_low
    if miniclip_high is not None and eps_high < miniclip_high:
        eps_high = miniclip_high
    return 1 - eps_low, 1 + eps_high


def reference_m2po(logp, old_logp, advantages, mask, *, budget=0.04, miniclip_low=None, miniclip_high=None):
    """M2PO's loss, written from ``compute_m2po_policy_loss`` as read: max(-A r, -A clamp(r, low, high)) at every real
    token, token-mean (verl ``agg_loss`` 'token-mean'), at the bounds of ``m2po_bounds_loop`` over the whole batch."""
    low, high = m2po_bounds_loop(logp.detach(), old_logp, advantages, mask, budget, miniclip_low, miniclip_high)
    total, n = logp.sum() * 0.0, 0
    for i in range(logp.shape[0]):
        a = float(advantages[i])
        for t in range(logp.shape[1]):
            if bool(mask[i, t]):
                r = torch.exp(logp[i, t] - old_logp[i, t])
                total = total + torch.maximum(-a * r, -a * torch.clamp(r, low, high))
                n += 1
    return total / max(n, 1)


class ReferenceEntController:
    """Skywork-OR1's adaptive entropy controller, written from ``verl/trainer/ppo/core_algos.py`` ``EntController`` as read
    (SkyworkAI/Skywork-OR1): ``value`` moves by ``delta_ent_coef`` toward the target and is clipped with np.clip;
    ``entropy_loss_enabled`` is 1 while the entropy is below the target. The loss reads value * entropy_loss_enabled."""

    def __init__(self, init_ent_coef, max_ent_coef, min_ent_coef, delta_ent_coef, target_ent):
        self.value, self.max_value, self.min_value = init_ent_coef, max_ent_coef, min_ent_coef
        self.delta_ent_coef, self.target_ent, self.entropy_loss_enabled = delta_ent_coef, target_ent, 1

    def update(self, current_ent):
        import numpy as np

        if current_ent < self.target_ent:
            self.value += self.delta_ent_coef
        else:
            self.value -= self.delta_ent_coef
        self.value = float(np.clip(self.value, self.min_value, self.max_value))
        self.entropy_loss_enabled = int(current_ent < self.target_ent)


# --- issue 30: GDPO and ReMax (written from the peers' code as read) -------------------------------------------------


def _unbiased_std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def reference_gdpo(rewards: list[list[float]], group_ids: list[int], weights: list[float], eps: float) -> list[float]:
    """TRL 1.16 GRPOTrainer._generate_and_score_completions, multi_objective_aggregation='normalize_then_sum', as read:
    per group and reward function (r - mean) / (nanstd + 1e-4), nanstd Bessel-corrected; the weighted sum over the
    functions; then (s - mean_batch s) / (std_batch s + 1e-4). (dfpo: a single-completion group gets 0 where TRL's
    nanstd gives NaN, and a group whose every function is constant gets exactly 0, TRL's value up to round-off.)"""
    B, K = len(rewards), len(weights)
    summed = [0.0] * B
    for i in range(B):
        members = [j for j, g in enumerate(group_ids) if g == group_ids[i]]
        for k in range(K):
            column = [rewards[j][k] for j in members]
            if len(members) > 1:
                summed[i] += weights[k] * (rewards[i][k] - sum(column) / len(column)) / (_unbiased_std(column) + eps)
    if B < 2 or max(summed) == min(summed):
        return [0.0] * B
    mean, std = sum(summed) / B, _unbiased_std(summed)
    out = []
    for i in range(B):
        members = [j for j, g in enumerate(group_ids) if g == group_ids[i]]
        flat = len(members) < 2 or all(len({rewards[j][k] for j in members}) == 1 for k in range(K))
        out.append(0.0 if flat else (summed[i] - mean) / (std + eps))
    return out


def reference_remax(rewards: list[float], greedy_rewards: list[float], lengths: list[int]) -> list[list[float]]:
    """verl core_algos.compute_remax_outcome_advantage, as read: token_level_rewards hold the outcome reward at the last
    real token; returns = reverse cumsum over the response; advantages = returns - reward_baselines * response_mask. One
    list per completion with its per-token advantages (the value dfpo gives the whole completion, at every token)."""
    out = []
    for r, b, L in zip(rewards, greedy_rewards, lengths):
        token_rewards = [0.0] * (L - 1) + [r]
        returns = [sum(token_rewards[t:]) for t in range(L)]
        out.append([g - b for g in returns])
    return out


def reference_otb(
    rewards: list[float],
    group_ids: list[int],
    lengths: list[int],
    old_logp: list[list[float]],
    pi_squared: list[list[float]],
    is_weights: list[list[float]] | None = None,
    eps: float = 1e-8,
    handle_zero_tail: bool = False,
) -> list[list[float]]:
    """verl core_algos.compute_optimal_token_baseline_advantage, as read: returns = reverse cumsum of the token rewards
    (the outcome reward at the last real token); w_t = 1 - 2 exp(old_log_prob) + sum_pi_squared, times
    rollout_is_weights**2 when given; W = cumsum(w * mask); per prompt group of N > 1 trajectories and timestep,
    B_t = sum(G_t W_t mask) / (sum(W_t mask) + eps); with handle_zero_tail the unique longest trajectory's baselines
    from the second-longest length on are 0; advantages = (returns - baselines) * mask. Padded to max(lengths)."""
    B, T = len(rewards), max(lengths)
    returns, energy = [[0.0] * T for _ in range(B)], [[0.0] * T for _ in range(B)]
    for i in range(B):
        token_rewards = [0.0] * T
        token_rewards[lengths[i] - 1] = rewards[i]
        running = 0.0
        for t in range(T):
            returns[i][t] = sum(token_rewards[t:]) if t < lengths[i] else 0.0
            if t < lengths[i]:
                w = 1 - 2 * math.exp(old_logp[i][t]) + pi_squared[i][t]
                running += w * (is_weights[i][t] ** 2 if is_weights is not None else 1.0)
            energy[i][t] = running
    baselines = [[0.0] * T for _ in range(B)]
    for g in sorted(set(group_ids)):
        members = [i for i in range(B) if group_ids[i] == g]
        if len(members) == 1:
            continue
        for t in range(T):
            alive = [i for i in members if t < lengths[i]]
            b = sum(returns[i][t] * energy[i][t] for i in alive) / (sum(energy[i][t] for i in alive) + eps)
            for i in members:
                baselines[i][t] = b
        if handle_zero_tail:
            ordered = sorted(lengths[i] for i in members)
            longest = [i for i in members if lengths[i] == ordered[-1]]
            if len(longest) == 1 and ordered[-1] > ordered[-2]:
                for t in range(ordered[-2], T):
                    baselines[longest[0]][t] = 0.0
    return [[(returns[i][t] - baselines[i][t]) if t < lengths[i] else 0.0 for t in range(T)] for i in range(B)]
