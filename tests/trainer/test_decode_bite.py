"""Tests that bite the decode loop (issue 57 item 11, mutation/rollout.toml): the inverse-CDF draw at its edges, a row
that ended stays ended (the loop stops once every row has), and the sampling distribution's entropy under top-k."""

from __future__ import annotations

import math

import torch
from transformers.generation.logits_process import TopKLogitsWarper

from dfpo.trainer.decode import StepOut, decode_loop, inverse_cdf_draw, score_step

EOS, PAD, OTHER = 9, 0, 5


def test_a_uniform_on_a_cumulative_boundary_draws_the_next_token_and_zero_mass_is_never_drawn():
    """The token drawn is the first whose cumulative mass exceeds u * total: u = 0 skips leading tokens of zero mass,
    and u * total equal to a token's cumulative mass draws the next token of positive mass."""
    probs = torch.tensor([[0.0, 0.0, 2.0], [0.5, 0.0, 0.5], [0.25, 0.25, 0.5]])  # (3, 3), the first row unnormalised
    u = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    assert inverse_cdf_draw(probs, u).tolist() == [2, 2, 2]


def _fixed_steps(script: dict[int, list[int]], calls: list[int]):
    """A step function that returns, at decode step k, the tokens ``script[k]`` for the rows it is given (their batch
    rows are all rows: a static cache keeps them), and records k."""

    def step(ids, mask, positions, u) -> StepOut:
        k = len(calls)
        calls.append(k)
        tokens = torch.tensor(script[k])  # (n,)
        zeros = torch.zeros(len(tokens))
        return StepOut(tokens, zeros - 1.0, zeros - 1.0, zeros + 0.5)

    return step


def test_a_row_that_ended_stays_ended_and_the_loop_stops_when_every_row_has():
    """Row 0 samples EOS at step 0, row 1 at step 2; afterwards each would sample OTHER if still decoding. Read every
    step (sync_every 1), the loop stops after step 2, and row 0 keeps pad / 0 after its EOS."""
    calls: list[int] = []
    step = _fixed_steps({0: [EOS, OTHER], 1: [OTHER, OTHER], 2: [OTHER, EOS], 3: [OTHER, OTHER], 4: [OTHER, OTHER]}, calls)
    prompt = torch.tensor([[1, 2], [3, 4]])  # (N, W)
    buffers, steps = decode_loop(
        step, step, prompt, torch.ones_like(prompt), torch.zeros(2, 5, dtype=torch.float64),
        eos=torch.tensor([EOS]), pad_id=PAD, sync_every=1, static_width=8, drop_rows=None,
    )  # fmt: skip
    assert steps == 3 and calls == [0, 1, 2]
    assert buffers.tokens[:, :3].tolist() == [[EOS, PAD, PAD], [OTHER, OTHER, EOS]]
    assert buffers.logp[0, 1:3].tolist() == [0.0, 0.0] and buffers.entropy[0, 1:3].tolist() == [0.0, 0.0]


def test_the_entropy_under_top_k_is_the_renormalised_distributions():
    """Top-2 of four logits: the entropy is that of the two kept tokens' renormalised probabilities, finite."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])  # (1, V)
    out = score_step(logits, torch.tensor([0.3], dtype=torch.float64), [], [TopKLogitsWarper(2)], greedy=False)
    p = torch.softmax(torch.tensor([2.0, 1.0]), -1)
    expected = -float((p * p.log()).sum())
    assert math.isfinite(float(out.entropy[0])) and math.isclose(float(out.entropy[0]), expected, rel_tol=1e-6)
    assert int(out.tokens[0]) == 0  # u = 0.3 < p(0) = 0.73
