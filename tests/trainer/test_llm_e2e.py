"""End-to-end tiny runs on CPU: every objective trains (parameters move, metrics finite)."""

import json
import math

import pytest
import torch

from dfpo import OBJECTIVES
from dfpo.trainer.llm.config import apply_overrides, config_from_dict
from dfpo.trainer.llm.train import NonFiniteLossError, Trainer

# A reward with variance from the first step: the format reward pays completions that start
# with "1", so groups are rarely all-equal even before the model can add.
TINY = [
    "model.tiny_hidden=32", "model.tiny_layers=1", "model.tiny_heads=2", "model.tiny_intermediate=64",
    "model.sft_steps=3", "model.sft_batch_size=8",
    "data.max_operand=9", "data.train_size=50", "data.eval_size=4",
    "rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=3",
    "reward.format_weight=1.0", 'reward.format_regex="^1"',
    "optim.lr=1e-2", "optim.minibatch_groups=1", "optim.epochs=2",
    "train.steps=2", "train.save_every=1", "threads=1",
    "eval.every=2", "eval.k=2",
    "log.tensorboard=false", "log.progress=false", "log.samples_every=1",
]


def tiny_config(tmp_path, *extra):
    return config_from_dict(apply_overrides({}, TINY + [f'run_dir="{tmp_path / "run"}"', *extra]))


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_every_objective_moves_parameters_and_logs_finite_metrics(tmp_path, objective):
    cfg = tiny_config(tmp_path, f"objective.name={objective}")
    trainer = Trainer(cfg, quiet=True)
    trainer.setup = _capture_initial(trainer)
    summary = trainer.run()
    after = _params(trainer.model)
    moved = sum(float((after[n] - trainer.initial[n]).abs().sum()) for n in after)
    assert moved > 0, f"{objective}: no parameter changed"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for k, v in r.items():
            assert not isinstance(v, float) or math.isfinite(v), (objective, k, v)
        for key in ("reward/mean", "loss/policy", "clip/frac_low", "weights/asym", "entropy/rollout", "grad/norm", "optim/lr"):
            assert key in r, (objective, key)
        assert r["optim/updates"] == 4 * r["step"]  # K = epochs * prompts / minibatch_groups = 4
    assert summary["steps"] == 2
    evals = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2] and all(0 <= e["eval/avg@2"] <= 1 for e in evals)


def _capture_initial(trainer):
    setup = trainer.setup

    def wrapped():
        setup()
        trainer.initial = _params(trainer.model)

    return wrapped


def test_run_folder_holds_config_logs_samples_and_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path, "log.tensorboard=true", "log.diagnostics=true")
    Trainer(cfg, quiet=True).run()
    run = tmp_path / "run"
    for name in ("config.toml", "metrics.jsonl", "eval.jsonl", "samples.jsonl", "summary.json", "checkpoint.pt", "init_model"):
        assert (run / name).exists(), name
    assert any((run / "tb").iterdir())
    state = torch.load(run / "checkpoint.pt", weights_only=False)
    assert state["step"] == 2 and {"model", "optimizer", "scheduler", "rng", "sampler"} <= set(state)
    summary = json.loads((run / "summary.json").read_text())
    assert "reward/jitter2" in summary and "reward/steps_to_kappa" in summary


def test_existing_run_dir_is_refused_before_any_work(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    with pytest.raises(ValueError, match="exists and is not empty.*--resume"):
        Trainer(tiny_config(tmp_path), quiet=True)


def test_nonfinite_losses_skip_steps_then_stop_keeping_last_good_checkpoint(tmp_path, monkeypatch):
    import dfpo.trainer.llm.train as train_mod

    real = train_mod.policy_loss
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        return loss * float("nan") if calls["n"] > 4 else loss, metrics  # step 1 fine, then NaN

    monkeypatch.setattr(train_mod, "policy_loss", poisoned)
    cfg = tiny_config(tmp_path, "train.steps=4", "train.max_nonfinite_in_row=3")
    trainer = Trainer(cfg, quiet=True)
    with pytest.raises(NonFiniteLossError, match=r"3 optimiser steps in a row.*last good checkpoint.*step 1"):
        trainer.run()
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert state["step"] == 1
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text


def test_tokenizer_without_pad_token_fails_with_what_to_set():
    from dfpo.trainer.llm.policy import build_char_tokenizer, check_pad_token

    tok = build_char_tokenizer()
    tok.pad_token = None
    with pytest.raises(ValueError, match='model.pad_token = "eos"'):
        check_pad_token(tok, "")
    check_pad_token(tok, "eos")
    assert tok.pad_token == tok.eos_token


def test_missing_hub_model_fails_clearly_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = tiny_config(tmp_path, "model.name=someone/not-a-local-model")
    with pytest.raises(ValueError, match="not a local directory.*not reachable.*model.name"):
        Trainer(cfg, quiet=True)
