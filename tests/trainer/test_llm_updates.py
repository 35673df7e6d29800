"""Update mechanics: mini-batches hold whole groups; accumulation is exact; LR schedule."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo import resolve_objective
from dfpo.trainer.config import ModelConfig
from dfpo.trainer.minibatches import MicroBatch, accumulation_weights, group_minibatches, split_groups
from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
from dfpo.trainer.sampler import build_batch
from dfpo.trainer.stages.update import accumulate_gradients, lr_factor, lr_schedule


@settings(max_examples=40, deadline=None)
@given(
    n_groups=st.integers(1, 8),
    g=st.integers(2, 5),
    per_batch=st.integers(1, 8),
    per_micro=st.integers(0, 4),
    seed=st.integers(0, 1000),
)
def test_no_minibatch_or_microbatch_holds_part_of_a_group(n_groups, g, per_batch, per_micro, seed):
    labels = torch.randperm(n_groups * 10, generator=torch.Generator().manual_seed(seed))[:n_groups]
    group_ids = labels.repeat_interleave(g)[torch.randperm(n_groups * g, generator=torch.Generator().manual_seed(seed + 1))]
    batches = group_minibatches(group_ids, per_batch, torch.Generator().manual_seed(seed))
    seen = torch.cat(batches)
    assert sorted(seen.tolist()) == list(range(n_groups * g))  # every row exactly once
    for rows in batches:
        for gid in group_ids[rows].unique():
            assert int((group_ids[rows] == gid).sum()) == g  # the whole group is here
        assert len(group_ids[rows].unique()) <= per_batch
        for micro in split_groups(rows, group_ids, per_micro):
            for gid in group_ids[micro].unique():
                assert int((group_ids[micro] == gid).sum()) == g


pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny():
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    return model, tok


def _batch(tok, n_groups=4, g=3, seed=0):
    rng = torch.Generator().manual_seed(seed)
    prompts = [tok(f"{i}+{i + 1}=", add_special_tokens=False).input_ids for i in range(n_groups)]
    completions = []
    for _ in range(n_groups * g):
        length = int(torch.randint(1, 6, (1,), generator=rng))
        completions.append(torch.randint(3, 13, (length,), generator=rng).tolist())
    return build_batch(prompts, completions, g, pad_id=tok.pad_token_id, eos_ids={tok.eos_token_id}, max_new_tokens=6)


CASES = [
    ("grpo", {}),
    ("dapo", {}),
    ("dr_grpo", {"max_completion_length": 6}),
    ("gspo", {"eps_low": 0.05, "eps_high": 0.05}),
    ("dfpo_min", {"eps_low": 0.05, "eps_high": 0.05}),
    ("dfpo_orth_pos", {"eps_low": 0.05, "eps_high": 0.05}),
    ("grpo", {"aggregation": "seq_mean_token_sum", "beta": 0.1}),
]


@pytest.mark.parametrize("objective, overrides", CASES)
def test_accumulated_gradient_equals_whole_minibatch_gradient(objective, overrides):
    torch.manual_seed(0)
    model, tok = _tiny()
    batch = _batch(tok)
    B, T = batch.mask.shape
    old = -2.0 + 0.3 * torch.randn(B, T)  # off-policy: ratios far from 1, some clipped
    ref = -2.0 + 0.3 * torch.randn(B, T)
    adv = torch.randn(B)
    agg = {"dapo": "token_mean", "dr_grpo": "constant"}.get(objective, overrides.get("aggregation", "seq_mean_token_mean"))
    rows = torch.arange(B)

    def grads(groups_per_micro):
        model.zero_grad(set_to_none=True)
        micro_rows = split_groups(rows, batch.group_ids, groups_per_micro)
        weights = accumulation_weights([batch.mask[r] for r in micro_rows], agg)
        micros = [MicroBatch(batch.rows(r), old[r], ref[r], adv[r], w) for r, w in zip(micro_rows, weights)]
        _, finite = accumulate_gradients(model, micros, resolve_objective(objective, **overrides), torch.device("cpu"))
        assert finite
        return [p.grad.clone() for p in model.parameters()]

    whole = grads(0)
    assert any(float(g.abs().sum()) > 0 for g in whole)
    for per_micro in (1, 2):
        for a, b in zip(whole, grads(per_micro)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_accumulation_weights_sum_to_one_and_follow_the_normaliser():
    masks = [torch.tensor([[1, 1, 0], [1, 0, 0]]).bool(), torch.tensor([[1, 1, 1], [0, 0, 0]]).bool()]
    assert accumulation_weights(masks, "token_mean") == [0.5, 0.5]  # 3 and 3 tokens
    assert accumulation_weights(masks, "seq_mean_token_mean") == [2 / 3, 1 / 3]  # empty row not counted
    assert accumulation_weights(masks, "constant") == [0.5, 0.5]


def test_lr_schedule_warms_up_linearly_then_decays_to_the_floor():
    f = [lr_factor(s, total=100, warmup=10, min_ratio=0.2) for s in range(101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    assert f[100] == pytest.approx(0.2)
    assert f[55] == pytest.approx(0.2 + 0.8 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def _cosine_floor(k: int, *, total: int, warmup: int, floor: float) -> float:
    """The factor optimiser step k (1-based) applies after the warm-up, written as cos^2 (half-angle form), not as
    the code's 0.5 * (1 + cos): floor + (1 - floor) cos^2(pi/2 * (steps after the warm-up before k) / (total - warmup))."""
    return floor + (1 - floor) * math.cos(math.pi / 2 * (k - 1 - warmup) / (total - warmup)) ** 2


def test_each_optimiser_step_applies_the_schedules_value_at_the_boundaries():
    """20 optimiser steps, warm-up 20% (4 steps), floor 0.1, lr 0.5: the lr each optimiser.step() applies, read off the
    optimiser, at the warm-up's first and last steps, the first step after it, the last step, and after it."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.5)
    schedule = lr_schedule(opt, total=20, warmup_ratio=0.2, min_ratio=0.1)
    applied = {}  # optimiser step (1-based) -> the lr it applied
    for k in range(1, 21):
        applied[k] = opt.param_groups[0]["lr"]
        opt.step()
        schedule.step()
    assert applied[1] == pytest.approx(0.5 * 1 / 4)  # the first warm-up step: a quarter of the lr, not 0
    assert applied[3] == pytest.approx(0.5 * 3 / 4)
    assert applied[4] == pytest.approx(0.5)  # the last warm-up step reaches the full lr
    assert applied[5] == pytest.approx(0.5)  # the first step after it: the cosine at its start
    assert applied[6] == pytest.approx(0.5 * _cosine_floor(6, total=20, warmup=4, floor=0.1))  # 0.4957, below the peak
    assert applied[6] < applied[5]
    assert applied[20] == pytest.approx(0.5 * _cosine_floor(20, total=20, warmup=4, floor=0.1))  # 0.05432: 15/16 of the way
    assert applied[20] == pytest.approx(0.5 * (0.1 + 0.9 * 0.0096073598))  # cos^2(15 pi / 32), by hand
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)  # after the last step: the floor


def test_the_trainer_logs_its_schedule_at_the_boundaries(tmp_path):
    """A tiny run of 8 steps of one optimiser step each, warm-up 3/8 (3 steps), floor 0.2, lr 0.01: optim/lr is the
    lr after the step's optimiser step, i.e. the one the next step applies (docs/metrics.md)."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_llm_e2e import tiny_config

    from dfpo.trainer.run.layout import RunDir
    from dfpo.trainer.train import Trainer

    sets = ["train.steps=8", "eval.every=0", "optim.epochs=1", "optim.minibatch_groups=2", "optim.warmup_ratio=0.375"]
    cfg = tiny_config(tmp_path, *sets, "optim.min_lr_ratio=0.2", "optim.lr=0.01", "rollout.prompts_per_step=2")
    Trainer(cfg, quiet=True).run()
    logged = {r["step"]: r["optim/lr"] for r in map(json.loads, (cfg.folder.path / RunDir.METRICS).read_text().splitlines())}
    assert logged[1] == pytest.approx(0.01 * 2 / 3)  # optimiser step 2 of the warm-up's 3
    assert logged[2] == pytest.approx(0.01)  # step 3: the last warm-up step
    assert logged[3] == pytest.approx(0.01)  # step 4: the first after it
    assert logged[4] == pytest.approx(0.01 * _cosine_floor(5, total=8, warmup=3, floor=0.2))
    assert logged[7] == pytest.approx(0.01 * _cosine_floor(8, total=8, warmup=3, floor=0.2))  # step 8, the last
    assert logged[8] == pytest.approx(0.01 * 0.2)  # after it: the floor


@pytest.mark.parametrize("objective", ["grpo", "gspo", "dfpo_min"])
def test_a_small_step_raises_positive_advantage_completions_relative_to_negative(objective):
    from dfpo.trainer.sampler import completion_logits, token_logp

    torch.manual_seed(1)
    model, tok = _tiny()
    batch = _batch(tok, n_groups=2, g=4, seed=3)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 1.0, -1.0, -1.0])

    def seq_logp():
        with torch.no_grad():
            lp = token_logp(completion_logits(model, batch, "cpu"), batch.completion_ids)
        return torch.where(batch.mask, lp, torch.zeros_like(lp)).sum(-1)  # (B,)

    before = seq_logp()
    micro = MicroBatch(
        batch,
        torch.where(batch.mask, 0.0, 0.0) + token_logp(completion_logits(model, batch, "cpu"), batch.completion_ids).detach(),
        None,
        adv,
        1.0,
    )
    accumulate_gradients(model, [micro], resolve_objective(objective), torch.device("cpu"))
    with torch.no_grad():
        for p in model.parameters():
            p -= 1e-2 * p.grad
    delta = seq_logp() - before
    assert float(delta[adv > 0].mean()) > float(delta[adv < 0].mean())


@pytest.mark.parametrize(
    "objective, sets, warned",
    [
        ("stapo", ["optim.minibatch_groups=2", "optim.microbatch_groups=1"], True),
        ("clip_cov", ["optim.max_tokens_per_microbatch=16"], True),
        ("stapo", ["optim.minibatch_groups=2", "optim.microbatch_groups=0"], False),
        ("grpo", ["optim.minibatch_groups=2", "optim.microbatch_groups=1"], False),
    ],
)
def test_a_batch_coupled_objective_split_over_loss_calls_is_warned_about(tmp_path, capsys, objective, sets, warned):
    """The spec says whether micro-batch accumulation is exact (batch_coupled); the trainer says so when it splits."""
    import sys as _sys
    from pathlib import Path as _Path

    _sys.path.insert(0, str(_Path(__file__).parent))
    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    trainer = Trainer(tiny_config(tmp_path, f"objective.name={objective}", *sets), quiet=False)
    trainer.close()
    err = capsys.readouterr().err
    assert (f"warning: objective {objective!r} is coupled across a mini-batch" in err) is warned, err
