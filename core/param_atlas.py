"""Cancellation verdicts in parameter space: every rollout correction, rejection, KL estimator and objective,
probed by one real optimiser step of a small model whose parameters every context shares.

The logit-space verdicts (``dfpo.core.loss.cancellation``: eq 2's residual sum_i c_i,t* at a shared token) say
whether a shared token's coefficients cancel. ``dfpo.core.probe.probe_step`` splits the first-order change of the
shared token's log-prob over one real step into the direct part its own coefficients put there,
direct = -s (sum_i c_i,t*) <g_e, P g_e>, and the cross part the rest of the batch puts there through shared
parameters (module docstring of ``core/probe.py``). Here each setting is probed on the same groups as the logit-space
tables (``make_shared_prefix_group``: G = 4, rewards 1, 0, 1, 0, the same log-ratios and sampler mismatch, a rejection
at the thresholds that reject one completion), with the log-probs now a model's (``SharedWeightsLM``) on real tokens
whose first three positions every completion of the group shares. Per setting and case:

- ``coefficient``: the largest |eq 2 residual| over the shared events ("cancels" below ``CANCEL_TOL``);
- ``direct``: the largest |direct| (zero exactly where the coefficient cancels: P is positive definite);
- ``cross share``: sum |cross| / (sum |direct| + sum |cross|) over the events;
- ``drift / none``: mean |measured change of log pi at the shared token| over the step, relative to the same
  objective without the setting (the same groups, model and step size): what the setting does to the real drift.

Plain SGD (P = lr), no momentum, the gradient's norm clipped to ``MAX_GRAD_NORM``: the split is exact to first order.
Pure torch, deterministic for the given seeds; no I/O. Callers: ``dfpo.commands.param_atlas_block``
(docs/cancellation.md), tests/core/test_param_atlas.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .loss import OBJECTIVES, group_advantages, resolve_objective
from .loss.advantages import ADVANTAGE_SCALES, GREEDY_BASELINE, MULTI_REWARD, TOKEN_LEVEL, optimal_token_baseline, sum_pi_squared
from .loss.cancellation import CANCEL_TOL, CORRECTION_BOUNDS, correction_settings, make_shared_prefix_group, rejecting_one
from .probe import DriftBatch, probe_step

PREFIX_LEN = 3
"""Positions every completion of a group shares (the shared events), as in ``make_shared_prefix_group``."""
VOCAB = 6
LEARNING_RATE = 0.05
"""SGD's step: small enough that the measured change is first order (the tests bound predicted - measured)."""
MAX_GRAD_NORM = 1.0
"""Gradient clipping as the trainer's default (``optim.max_grad_norm``, TRL's 1.0): it bounds the step of a loss with
large coefficients (online IPO's are about 10), so every row's split stays first order; ``direct`` carries the factor."""
REWARDS = (1.0, 0.0, 1.0, 0.0)
GRADED_REWARDS = (1.0, 0.0, 0.5, 0.0)
"""The advantage estimators' rows: one best completion, so verl's pass@k (which gives a tie for the best nothing)
has a gradient to probe."""
PARAM_CASES = (("dapo", (5, 9, 12, 7)), ("grpo", (8, 8, 8, 8)))
"""(objective, lengths) of the setting table: dapo at unequal lengths (where token-level settings keep cancelling and
completion-level ones do not) and grpo at equal lengths (where a renormalised token rejection breaks the mean)."""
DISCOVERY_SEEDS = (0, 1, 2, 3)
"""The seeds of the tables shown (the logit-space correction table's groups are these seeds too)."""
CONFIRMATION_SEEDS = (100, 101, 102, 103)
"""A disjoint seed set every row's verdict must reproduce on before the docs state it."""
KL_BETA = 0.04
"""beta of the KL rows (TRL's GRPOConfig beta before 0.17 and DeepSeekMath's)."""


class SharedWeightsLM(torch.nn.Module):
    """A small autoregressive model whose parameters every context shares: log pi(y_t | y_<t) from an embedding of
    the previous token and of the position through one hidden layer (float64)."""

    def __init__(self, vocab: int = VOCAB, width: int = 8, max_len: int = 16, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = torch.nn.Parameter(0.5 * torch.randn(vocab + 1, width, generator=gen, dtype=torch.float64))
        self.pos = torch.nn.Parameter(0.5 * torch.randn(max_len, width, generator=gen, dtype=torch.float64))
        self.out = torch.nn.Parameter(0.5 * torch.randn(width, vocab, generator=gen, dtype=torch.float64))
        self.bos = vocab

    def score(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """(log pi of each token, the entropy of the distribution it was drawn from), both (B, T)."""
        prev = torch.cat([torch.full_like(tokens[:, :1], self.bos), tokens[:, :-1]], dim=1)  # (B, T)
        h = torch.tanh(self.emb[prev] + self.pos[: tokens.shape[1]])  # (B, T, W)
        logp_all = torch.log_softmax(h @ self.out, dim=-1)  # (B, T, V)
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
        return logp_all.gather(-1, tokens[..., None]).squeeze(-1), entropy

    def forward(self, tokens: Tensor) -> Tensor:
        """log pi of each token (B, T)."""
        return self.score(tokens)[0]

    @torch.no_grad()
    def sum_pi_squared(self, tokens: Tensor) -> Tensor:
        """sum_v pi(v)^2 of the distribution each token was drawn from (B, T) (the optimal token baseline's statistic)."""
        prev = torch.cat([torch.full_like(tokens[:, :1], self.bos), tokens[:, :-1]], dim=1)  # (B, T)
        h = torch.tanh(self.emb[prev] + self.pos[: tokens.shape[1]])  # (B, T, W)
        return sum_pi_squared(h @ self.out)  # (B, T)


@dataclass(frozen=True)
class ProbeCase:
    """One group on a model: the probe's batch and the model that scores it."""

    model: SharedWeightsLM
    batch: DriftBatch


SECOND_REWARD = (0.0, 1.0, 1.0, 0.5)
"""GDPO's second reward function on the estimator rows (a format-like score that disagrees with the first)."""
GREEDY_REWARD = 0.25
"""ReMax's greedy completion's reward on the estimator rows (not the group's mean, where its advantages would sum to 0)."""


def estimator_inputs(rewards: tuple[float, ...], adv_scale: str) -> dict[str, Tensor]:
    """What ``group_advantages`` reads besides the rewards for ``adv_scale``: GDPO a second reward column
    (``SECOND_REWARD``), ReMax the greedy completion's reward (``GREEDY_REWARD``); the rewards alone otherwise."""
    r = torch.tensor(rewards, dtype=torch.float64)  # (G,)
    if adv_scale in MULTI_REWARD:
        return {"rewards": torch.stack([r, torch.tensor(SECOND_REWARD, dtype=torch.float64)], dim=1)}  # (G, 2)
    if adv_scale in GREEDY_BASELINE:
        return {"rewards": r, "baselines": torch.full_like(r, GREEDY_REWARD)}
    return {"rewards": r}


def probe_case(lengths: tuple[int, ...], seed: int, *, adv_scale: str = "group", rewards: tuple[float, ...] = REWARDS) -> ProbeCase:
    """The logit-space table's group for ``seed`` (its log-ratios, sampler mismatch and rewards) on real tokens:
    the first ``PREFIX_LEN`` tokens shared by every completion, then random tokens; pi_old and pi_rollout are the
    model's log-probs shifted by the group's log-ratio and mismatch (one value per shared event, as it must be)."""
    group = make_shared_prefix_group(torch.tensor(REWARDS, dtype=torch.float64), list(lengths), prefix_len=PREFIX_LEN, seed=seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    G, T = group.mask.shape
    prefix = torch.randint(0, VOCAB, (PREFIX_LEN,), generator=gen)
    tokens = torch.cat([prefix.expand(G, -1), torch.randint(0, VOCAB, (G, T - PREFIX_LEN), generator=gen)], dim=1)  # (G, T)
    tokens[:, PREFIX_LEN] = torch.randperm(VOCAB, generator=gen)[:G]  # the rows part here: no shared event after the prefix
    model = SharedWeightsLM(seed=seed)
    with torch.no_grad():
        logp = model(tokens)  # (G, T)
    log_ratio = (group.logp() - group.old_logp).detach()  # (G, T) log pi / pi_old of the table's group
    mismatch = (group.old_logp - group.rollout_logp).detach()  # (G, T) log pi_old / pi_rollout
    old_logp = torch.where(group.mask, logp - log_ratio, 0.0)
    lengths = group.mask.sum(1).double()  # (G,)
    if adv_scale in TOKEN_LEVEL:  # one advantage per token, from pi_old's log-probs and the model's sum pi^2
        r = torch.tensor(rewards, dtype=torch.float64)  # (G,)
        advantages = optimal_token_baseline(r, group.group_ids, group.mask, old_logp, model.sum_pi_squared(tokens))  # (G, T)
    else:
        advantages = group_advantages(
            **estimator_inputs(rewards, adv_scale), group_ids=group.group_ids, scale=adv_scale, lengths=lengths
        )  # (G,)
    batch = DriftBatch(
        tokens=tokens,
        mask=group.mask,
        group_ids=group.group_ids,
        advantages=advantages,
        old_logp=old_logp,
        ref_logp=torch.where(group.mask, old_logp - 0.5 * mismatch, 0.0),
        rollout_logp=torch.where(group.mask, old_logp - mismatch, 0.0),
    )
    return ProbeCase(model, batch)


@dataclass(frozen=True)
class ParamVerdict:
    """What one setting does to the shared tokens of a case's groups, over seeds (module docstring)."""

    coefficient: float
    direct: float
    cross_share: float
    drift: float
    """Mean |measured change of log pi| at the shared events."""
    first_order_error: float
    """Largest |measured - (direct + cross)|: the second-order remainder of the split."""

    @property
    def cancels(self) -> bool:
        return self.coefficient < CANCEL_TOL


def probe_setting(objective: str, cases: list[ProbeCase], **overrides: object) -> ParamVerdict:
    """One SGD step of each case's model with ``objective`` and ``overrides`` (a rejection's thresholds are found
    per case by ``rejecting_one``), its shared events split by ``probe_step``, pooled over the cases."""
    coef, direct, cross, measured, error = [], [], [], [], []
    for case in cases:
        extra = dict(overrides)
        if overrides.get("rollout_rejection", "none") != "none":
            extra |= rejecting_one(str(overrides["rollout_rejection"]), case.batch)  # reads mask, old_logp, rollout_logp
        spec = resolve_objective(objective, **extra) if extra else resolve_objective(objective)
        batch, model = case.batch, case.model

        def score(rows: Tensor, batch: DriftBatch = batch, model: SharedWeightsLM = model) -> tuple[Tensor, Tensor]:
            logp, entropy = model.score(batch.tokens[rows])  # (len(rows), T) each
            return torch.where(batch.mask[rows], logp, 0.0), torch.where(batch.mask[rows], entropy, 0.0)

        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        report = probe_step(score, optimizer, batch, spec, max_events=PREFIX_LEN, max_grad_norm=MAX_GRAD_NORM)
        shared = report.shared
        coef.append(shared.coef.abs())
        direct.append(shared.direct.abs())
        cross.append(shared.cross.abs())
        measured.append(shared.measured.abs())
        error.append((shared.measured - shared.predicted).abs())
    c, d, x, m, e = (torch.cat(v) for v in (coef, direct, cross, measured, error))
    total = float(d.sum() + x.sum())
    return ParamVerdict(
        coefficient=float(c.max()),
        direct=float(d.max()),
        cross_share=float(x.sum()) / total if total > 0 else math.nan,
        drift=float(m.mean()),
        first_order_error=float(e.max()),
    )


def setting_overrides() -> list[dict[str, object]]:
    """Every rollout correction (truncate/mask at token, sequence, geometric, segment level), every rollout rejection
    and every KL estimator, as the overrides that turn it on (the logit-space correction table's settings, plus KL)."""
    from .loss.kl import KL_ESTIMATORS

    out: list[dict[str, object]] = [
        {key: mode, **(CORRECTION_BOUNDS if key == "rollout_correction" else {})} for key, mode in correction_settings()
    ]
    out += [{"beta": KL_BETA, "kl_estimator": k} for k in KL_ESTIMATORS]
    return out


def setting_label(overrides: dict[str, object]) -> str:
    """The override that names the setting: ``rollout_correction=token_mask``, ``kl_estimator=k2 (beta=0.04)``."""
    if "kl_estimator" in overrides:
        return f"kl_estimator={overrides['kl_estimator']} (beta={overrides['beta']})"
    key = "rollout_correction" if "rollout_correction" in overrides else "rollout_rejection"
    return f"{key}={overrides[key]}"


def _cell(verdict: ParamVerdict, baseline: ParamVerdict) -> dict[str, str]:
    return {
        "coefficient": "cancels" if verdict.cancels else f"{verdict.coefficient:.1e}",
        "direct": "0" if verdict.direct < CANCEL_TOL else f"{verdict.direct:.1e}",
        "cross share": f"{verdict.cross_share:.0%}",
        "drift / none": f"{verdict.drift / baseline.drift:.2f}",
    }


def param_setting_atlas(seeds: tuple[int, ...] = DISCOVERY_SEEDS) -> list[dict[str, object]]:
    """One row per (setting, case): its ``ParamVerdict`` over ``seeds`` beside the same objective without it; then
    every advantage estimator under dapo on graded rewards beside the group estimator (``verdict`` None and ``why``
    where the groups cannot feed an estimator)."""
    rows = []
    for objective, lengths in PARAM_CASES:
        cases = [probe_case(lengths, s) for s in seeds]
        baseline = probe_setting(objective, cases)
        case = f"{objective}, {'equal' if len(set(lengths)) == 1 else 'unequal'} L"
        for overrides in setting_overrides():
            verdict = probe_setting(objective, cases, **overrides)
            rows.append({"setting": setting_label(overrides), "case": case, "verdict": verdict, "baseline": baseline})
    lengths = PARAM_CASES[0][1]
    baseline = probe_setting("dapo", [probe_case(lengths, s, rewards=GRADED_REWARDS) for s in seeds])
    case = "dapo, unequal L, rewards " + ", ".join(f"{r:g}" for r in GRADED_REWARDS)
    for scale in ADVANTAGE_SCALES:
        if scale == "group":
            continue
        row = {"setting": f"adv_scale={scale}", "case": case, "baseline": baseline, "why": ""}
        try:
            row["verdict"] = probe_setting("dapo", [probe_case(lengths, s, adv_scale=scale, rewards=GRADED_REWARDS) for s in seeds])
        except ValueError as err:  # an estimator these groups cannot feed (several rewards, a greedy baseline)
            row |= {"verdict": None, "why": str(err)}
        rows.append(row)
    return rows


def param_objective_atlas(
    seeds: tuple[int, ...] = DISCOVERY_SEEDS, lengths: tuple[int, ...] = PARAM_CASES[0][1]
) -> list[dict[str, object]]:
    """One row per registered objective (presets and users' own): its ``ParamVerdict`` on the unequal-length groups
    with its own advantage estimator, or the one sentence saying why these groups cannot feed it."""
    rows = []
    for name in OBJECTIVES:
        spec = resolve_objective(name)
        try:
            cases = [probe_case(lengths, s, adv_scale=spec.adv_scale) for s in seeds]
            verdict = probe_setting(name, cases)
        except ValueError as err:
            rows.append({"objective": name, "verdict": None, "why": str(err)})
            continue
        rows.append({"objective": name, "verdict": verdict, "why": ""})
    return rows


def setting_rows(rows: list[dict[str, object]]) -> list[dict[str, str]]:
    """``param_setting_atlas`` as table cells (a row it could not probe says why)."""
    out = []
    for r in rows:
        if r["verdict"] is None:
            out.append(
                {
                    "setting": r["setting"],
                    "case": r["case"],
                    "coefficient": "not probed",
                    "direct": "",
                    "cross share": "",
                    "drift / none": r["why"],
                }
            )
        else:
            out.append({"setting": r["setting"], "case": r["case"], **_cell(r["verdict"], r["baseline"])})
    return out


def objective_rows(rows: list[dict[str, object]]) -> list[dict[str, str]]:
    """``param_objective_atlas`` as table cells (a row it could not probe says why)."""
    out = []
    for r in rows:
        v = r["verdict"]
        if v is None:
            out.append({"objective": r["objective"], "coefficient": "not probed", "direct": "", "cross share": "", "mean drift": r["why"]})
            continue
        out.append(
            {
                "objective": r["objective"],
                "coefficient": "cancels" if v.cancels else f"{v.coefficient:.1e}",
                "direct": "0" if v.direct < CANCEL_TOL else f"{v.direct:.1e}",
                "cross share": f"{v.cross_share:.0%}",
                "mean drift": f"{v.drift:.1e}",
            }
        )
    return out


def _classes(setting: list[dict[str, object]], objective: list[dict[str, object]]) -> list[tuple[str, bool, bool]]:
    """Each row's (label, cancels, zero direct part): what a second seed set must reproduce."""
    out = [(f"{r['setting']} | {r['case']}", r["verdict"].cancels, r["verdict"].direct < CANCEL_TOL) for r in setting if r["verdict"]]
    return out + [(str(r["objective"]), r["verdict"].cancels, r["verdict"].direct < CANCEL_TOL) for r in objective if r["verdict"]]


def param_summary(
    setting: list[dict[str, object]],
    objective: list[dict[str, object]],
    confirmation: tuple[list[dict[str, object]], list[dict[str, object]]] | None = None,
    seeds: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
) -> list[str]:
    """The sentences docs/cancellation.md says about the two tables, read from them (never typed); with
    ``confirmation`` (the same tables on a disjoint seed set) and ``seeds`` (both sets), whether it agrees."""
    verdicts = [r["verdict"] for r in setting + objective if r["verdict"] is not None]
    cancelling = [v for v in verdicts if v.cancels]
    zero_direct = [v for v in cancelling if v.direct < CANCEL_TOL]
    lines = [
        f"- Of the {len(verdicts)} (setting, case) and objective rows, {len(cancelling)} cancel in logit space; "
        f"{len(zero_direct)} of those have zero direct drift in parameter space too, "
        f"and {len([v for v in verdicts if not v.cancels and v.direct >= CANCEL_TOL])} of the "
        f"{len(verdicts) - len(cancelling)} that do not cancel have a non-zero direct part."
    ]
    if cancelling:
        shares = [v.cross_share for v in cancelling]
        moving = [v for v in cancelling if v.drift > 0]
        lines.append(
            f"- The shared tokens of the {len(cancelling)} cancelling rows still move: {len(moving)} of them with a mean "
            f"|Delta log pi| above zero, carried by the cross term alone (cross share {min(shares):.0%} to {max(shares):.0%})."
        )
    worst = max(v.first_order_error for v in verdicts)
    lines.append(f"- First-order check: |measured - (direct + cross)| is at most {worst:.1e} over every row.")
    if confirmation is not None and seeds is not None:
        first, second = _classes(setting, objective), _classes(*confirmation)
        differ = [a[0] for a, b in zip(first, second) if a != b]
        names = ", ".join(str(s) for s in seeds[1])
        lines.append(
            f"- On a disjoint seed set ({names}) every row has the same logit-space verdict and the same zero or non-zero direct part."
            if not differ and len(first) == len(second)
            else f"- On a disjoint seed set ({names}) {len(differ)} {'row changes its' if len(differ) == 1 else 'rows change their'} "
            f"verdict ({', '.join(differ)}): there the verdict depends on the batch, and the row above is one draw, not a "
            "property of the setting."
        )
    return lines
