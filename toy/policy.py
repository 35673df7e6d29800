"""An autoregressive tabular softmax policy, batched over seeds.

The parameters are one logit vector per context row: ``theta`` of shape (S, R, V), S seeds
(a batch dimension, never a Python loop), R rows, V tokens. Illegal tokens of a row get
logit -inf, so pi(. | row) is a softmax over the row's legal tokens. The log-probability of
a completion is the sum of its token log-probabilities, gathered from the table, so
``dfpo.policy_loss`` trains the table unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .tasks import END, Enumeration, Task


def init_params(task: Task, seeds: int, *, noise: float, generator: torch.Generator) -> Tensor:
    """Prior logits plus N(0, noise^2) per legal entry and seed; (S, R, V), 0 where illegal."""
    legal = task.legal  # (R, V)
    base = torch.where(legal, task.prior_logits, torch.zeros(()))  # (R, V)
    eps = noise * torch.randn((seeds, *base.shape), generator=generator)  # (S, R, V)
    return torch.where(legal, base + eps, torch.zeros(()))


ILLEGAL_LOGIT = -1e4
"""Logit of an illegal token: finite (fast, NaN-free arithmetic) and exp() of it is exactly 0."""


def log_policy(theta: Tensor, legal: Tensor) -> Tensor:
    """log pi(v | row) per seed: (S, R, V), about -1e4 (probability exactly 0) where illegal."""
    logits = torch.where(legal, theta, torch.full_like(theta, ILLEGAL_LOGIT))  # (S, R, V)
    return torch.log_softmax(logits, dim=-1)


def row_entropy(logpi: Tensor) -> Tensor:
    """Entropy of each row (S, R), illegal entries contributing 0."""
    return -(logpi.exp() * logpi).sum(-1)


def gather_tokens(table: Tensor, rows: Tensor, tokens: Tensor) -> Tensor:
    """table[s, rows[s, b, t], tokens[s, b, t]] for a per-seed table (S, R, V) -> (S, B, T)."""
    S, R, V = table.shape
    flat = table.reshape(S, R * V)  # (S, R*V)
    return torch.gather(flat, 1, (rows * V + tokens).reshape(S, -1)).reshape(rows.shape)


@dataclass(frozen=True)
class Rollouts:
    """Sampled completions, per seed. S seeds, B completions per seed, T = task.max_len."""

    prompt: Tensor  # (S, B)
    group: Tensor  # (S, B) group index within the seed
    rows: Tensor  # (S, B, T)
    tokens: Tensor  # (S, B, T)
    mask: Tensor  # (S, B, T) bool
    reward: Tensor  # (S, B)
    form: Tensor  # (S, B)


def sample(task: Task, logpi: Tensor, prompts: Tensor, group_size: int, generator: torch.Generator) -> Rollouts:
    """Draw ``group_size`` completions for each prompt of ``prompts`` (M,), for every seed.

    Walkers for all seeds, groups and members step together (Gumbel-max sampling from the
    table rows); a finished walker stays finished. logpi: (S, R, V) -> Rollouts with B = M * G.
    """
    S = logpi.shape[0]
    M, T = prompts.shape[0], task.max_len
    prompt = prompts.repeat_interleave(group_size)[None, :].expand(S, -1)  # (S, B)
    group = torch.arange(M).repeat_interleave(group_size)[None, :].expand(S, -1)  # (S, B)
    B = prompt.shape[1]
    state = task.start[prompt]  # (S, B)
    alive = torch.ones(S, B, dtype=torch.bool)
    rows = torch.zeros(S, B, T, dtype=torch.long)
    tokens = torch.zeros_like(rows)
    mask = torch.zeros(S, B, T, dtype=torch.bool)
    reward = torch.zeros(S, B)
    form = torch.zeros(S, B, dtype=torch.long)
    seed_idx = torch.arange(S)[:, None].expand(S, B)
    for t in range(T):
        safe_state = torch.where(alive, state, torch.zeros_like(state))
        row = task.state_row[safe_state]  # (S, B)
        lp = logpi[seed_idx, row]  # (S, B, V)
        u = torch.rand(lp.shape, generator=generator).clamp_(1e-12, 1 - 1e-12)
        tok = torch.argmax(lp - torch.log(-torch.log(u)), dim=-1)  # (S, B) Gumbel-max
        rows[:, :, t] = torch.where(alive, row, 0)
        tokens[:, :, t] = torch.where(alive, tok, 0)
        mask[:, :, t] = alive
        nxt = task.next_state[safe_state, tok]  # (S, B)
        ends = alive & (nxt == END)
        reward = torch.where(ends, task.end_reward[safe_state, tok], reward)
        form = torch.where(ends, task.end_form[safe_state, tok], form)
        alive = alive & ~ends
        state = torch.where(alive, nxt, state)
        if not bool(alive.any()):
            break
    return Rollouts(prompt, group, rows, tokens, mask, reward, form)


def greedy_rewards(task: Task, logpi: Tensor, prompts: Tensor) -> Tensor:
    """The reward of each prompt's greedy completion (the most probable token of every row in turn; ReMax's baseline,
    arXiv 2310.10505), per seed: logpi (S, R, V), prompts (M,) -> (S, M). Deterministic: nothing is drawn."""
    S, M = logpi.shape[0], prompts.shape[0]
    state = task.start[prompts][None, :].expand(S, -1).clone()  # (S, M)
    alive = torch.ones(S, M, dtype=torch.bool)
    reward = torch.zeros(S, M)
    seed_idx = torch.arange(S)[:, None].expand(S, M)
    for _ in range(task.max_len):
        safe_state = torch.where(alive, state, torch.zeros_like(state))
        tok = logpi[seed_idx, task.state_row[safe_state]].argmax(-1)  # (S, M) illegal tokens sit at -1e4
        nxt = task.next_state[safe_state, tok]  # (S, M)
        ends = alive & (nxt == END)
        reward = torch.where(ends, task.end_reward[safe_state, tok], reward)
        alive = alive & ~ends
        state = torch.where(alive, nxt, state)
        if not bool(alive.any()):
            break
    return reward


def sequence_logprob(logpi: Tensor, rows: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
    """log pi(y | x) of each completion: (S, R, V) with (S, B, T) indices -> (S, B)."""
    lp = gather_tokens(logpi, rows, tokens)  # (S, B, T)
    return torch.where(mask, lp, torch.zeros_like(lp)).sum(-1)


def expand_enumeration(enum: Enumeration, seeds: int) -> Rollouts:
    """The enumeration as a Rollouts batch shared by every seed (one group per prompt)."""
    ex = lambda x: x[None].expand(seeds, *x.shape)  # noqa: E731
    return Rollouts(ex(enum.prompt), ex(enum.prompt), ex(enum.rows), ex(enum.tokens), ex(enum.mask), ex(enum.reward), ex(enum.form))


def table_gradient(coef: Tensor, logpi: Tensor, rows: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
    """d loss / d theta from d loss / d logp, in closed form: (S, B, T) -> (S, R, V).

    For a softmax row, d log pi(y | r) / d theta_r = e_y - pi_r, so the table gradient is
    sum over the token occurrences at row r of coef * (e_y - pi_r); illegal entries get 0.
    """
    S, R, V = logpi.shape
    c = torch.where(mask, coef, torch.zeros_like(coef)).reshape(S, -1)  # (S, B*T)
    onehot = torch.zeros(S, R * V, dtype=coef.dtype).scatter_add_(1, (rows * V + tokens).reshape(S, -1), c)  # (S, R*V)
    row_sum = torch.zeros(S, R, dtype=coef.dtype).scatter_add_(1, rows.reshape(S, -1), c)  # (S, R)
    return onehot.reshape(S, R, V) - row_sum[..., None] * logpi.exp()
