"""Every logged key is declared once with a reduction, and every path that combines values uses it: a maximum over
micro-batches, processes or optimiser steps stays the maximum, a minimum the minimum, a count a sum."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from dfpo.core.loss import OBJECTIVES, policy_loss, resolve_objective
from dfpo.core.metric_registry import METRICS, lookup, markdown_table, reduce_records, reduce_values
from dfpo.trainer.run.layout import RunDir

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import tiny_config  # noqa: E402


def test_reductions_are_pinned_by_value():
    assert reduce_values("ratio/max", [1.0, 3.0, 2.0]) == 3.0
    assert reduce_values("rollout/seq_ratio_min", [1.0, 0.5, 2.0]) == 0.5
    assert reduce_values("reward/errors", [1, 2, 3]) == 6
    assert reduce_values("optim/lr", [3e-4, 2e-4, 1e-4]) == 1e-4
    assert reduce_values("loss/policy", [1.0, 4.0], [0.75, 0.25]) == 1.75
    assert reduce_values("loss/policy", [1.0, 4.0]) == 2.5
    assert reduce_values("loss/policy", [1.0, math.nan, 4.0]) == 2.5  # NaN never reaches a log
    assert math.isnan(reduce_values("ratio/max", [math.nan]))
    assert reduce_values("energy/bucket1", [0.25, 0.75]) == 0.5  # a template key matches its filled-in forms
    assert reduce_records([{"ratio/max": 2.0, "loss/policy": 1.0}, {"ratio/max": 1.0}], [0.5, 0.5]) == {
        "ratio/max": 2.0,
        "loss/policy": 1.0,
    }


def test_an_undeclared_key_is_named():
    with pytest.raises(KeyError, match="'loss/made_up' is not declared"):
        lookup("loss/made_up")


def test_every_key_is_declared_once():
    keys = [m.key for m in METRICS]
    assert len(keys) == len(set(keys))


def _loss_keys(spec, **inputs) -> set[str]:
    g = torch.Generator().manual_seed(0)
    B, T = 8, 5
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[::3, 3:] = False
    logp = (-torch.rand(B, T, generator=g) - 0.1).requires_grad_()
    _, metrics = policy_loss(
        spec,
        logp=logp,
        old_logp=logp.detach() + 0.1 * torch.randn(B, T, generator=g),
        advantages=torch.randn(B, generator=g),
        mask=mask,
        group_ids=torch.arange(B) // 4,
        entropy=torch.rand(B, T, generator=g),
        ref_logp=logp.detach() - 0.05,
        rollout_logp=logp.detach() + 0.05 * torch.randn(B, T, generator=g),
    )
    return set(metrics)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_key_the_loss_core_returns_is_declared(name):
    """With every optional term on (KL, entropy bonus, rollout correction) where the objective takes it."""
    correction = "none" if OBJECTIVES[name].ipo_beta > 0 else "sequence_mask"  # online IPO has no token term to correct
    spec = resolve_objective(name, beta=0.1, entropy_coef=0.01, rollout_correction=correction)
    for key in _loss_keys(spec):
        assert lookup(key).where == "policy_loss", key


def test_every_key_a_training_run_logs_is_declared(tmp_path):
    from dfpo.trainer.train import Trainer

    cfg = tiny_config(
        tmp_path,
        "rollout.dynamic_sampling=true",
        "objective.overrides.rollout_correction=sequence_truncate",
        "objective.overrides.beta=0.05",
        "optim.microbatch_groups=1",
    )
    Trainer(cfg, quiet=True).run()
    for log in (RunDir.METRICS, RunDir.EVALS):
        for row in (tmp_path / "run" / log).read_text().splitlines():
            for key in json.loads(row):
                if key != "step":
                    lookup(key)


def test_micro_batches_keep_a_minimum_and_a_maximum(tmp_path):
    """One optimiser step over two micro-batches logs the min and max of the sequence correction ratio over the
    whole mini-batch, as one micro-batch does (they were averaged over micro-batches before)."""
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.minibatches import MicroBatch
    from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
    from dfpo.trainer.sampler import build_batch
    from dfpo.trainer.stages.update import accumulate_gradients

    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    prompts = [tok(p, add_special_tokens=False).input_ids for p in ("1+2=", "3+4=")]
    completions = [[5, 6], [7], [8, 9, 10], [5], [6, 6], [7, 8], [9], [10, 11, 12]]
    batch = build_batch(prompts, completions, 4, pad_id=tok.pad_token_id, eos_ids=set(), max_new_tokens=4)
    g = torch.Generator().manual_seed(0)
    old = torch.where(batch.mask, -2.0 + 0.3 * torch.randn(batch.mask.shape, generator=g), 0.0)  # (B, T)
    rollout = torch.where(batch.mask, old + 0.5 * torch.randn(batch.mask.shape, generator=g), 0.0)  # (B, T)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.0, 1.0, -1.0, -1.0])  # (B,)
    spec = resolve_objective("grpo", rollout_correction="sequence_truncate")
    rows = [torch.arange(0, 4), torch.arange(4, 8)]
    whole = MicroBatch(batch, old, None, adv, 1.0, torch.arange(8), rollout)
    parts = [MicroBatch(*batch.rows(r).trimmed()[:1], old[r], None, adv[r], 0.5, r, rollout[r]) for r in rows]
    one, _ = accumulate_gradients(model, [whole], spec, torch.device("cpu"))
    two, _ = accumulate_gradients(model, parts, spec, torch.device("cpu"))
    assert two["rollout/seq_ratio_min"] == pytest.approx(one["rollout/seq_ratio_min"])
    assert two["rollout/seq_ratio_max"] == pytest.approx(one["rollout/seq_ratio_max"])
    assert two["ratio/max"] == pytest.approx(one["ratio/max"])
    assert one["rollout/seq_ratio_min"] < one["rollout/seq_ratio_mean"] < one["rollout/seq_ratio_max"]


def test_docs_metrics_md_is_generated_from_the_registry():
    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert markdown_table() in text
