"""End-to-end tiny runs on CPU: every objective trains (parameters move, metrics finite)."""

import dataclasses
import json
import math

import pytest
import torch
from tiny_run import FORMAT_REWARD_SETS, TINY_MODEL_SETS

from dfpo import OBJECTIVES
from dfpo.trainer.config import apply_overrides, config_from_dict
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.train import NonFiniteLossError, Trainer

# A reward with variance from the first step: the format reward pays completions that start
# with a letter or digit (about 2 in 3 characters), so groups are rarely all-equal.
TINY = [
    *TINY_MODEL_SETS,
    "data.train_size=50",
    "data.eval_size=4",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    *FORMAT_REWARD_SETS,
    "optim.lr=1e-2",
    "optim.minibatch_groups=1",
    "optim.epochs=2",
    "train.steps=2",
    "train.save_every=1",
    "threads=1",
    "eval.every=2",
    "eval.k=2",
    "log.tensorboard=false",
    "log.progress=false",
    "log.samples_every=1",
]


def tiny_config(tmp_path, *extra):
    return config_from_dict(apply_overrides({}, TINY + [f'run_dir="{tmp_path / "run"}"', *extra]))


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_every_objective_moves_parameters_and_logs_finite_metrics(tmp_path, objective):
    cfg = tiny_config(tmp_path, f"objective.name={objective}")
    trainer = Trainer(cfg, quiet=True)
    initial = _params(trainer.model)  # built in __init__: the parameters before any update
    summary = trainer.run()
    after = _params(trainer.model)
    moved = sum(float((after[n] - initial[n]).abs().sum()) for n in after)
    assert moved > 0, f"{objective}: no parameter changed"
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for k, v in r.items():
            assert not isinstance(v, float) or math.isfinite(v), (objective, k, v)
        for key in ("reward/mean", "loss/policy", "clip/frac_low", "weights/asym", "entropy/rollout", "grad/norm", "optim/lr"):
            assert key in r, (objective, key)
        assert r["optim/updates"] == 4 * r["step"]  # K = epochs * prompts / minibatch_groups = 4
    assert summary["steps"] == 2
    evals = [json.loads(line) for line in (tmp_path / "run" / RunDir.EVALS).read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2] and all(0 <= e["eval/avg@2"] <= 1 for e in evals)


def test_run_folder_holds_config_logs_samples_and_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path, "log.tensorboard=true", "log.diagnostics=true")
    Trainer(cfg, quiet=True).run()
    run = tmp_path / "run"
    for name in (RunDir.CONFIG, RunDir.METRICS, RunDir.EVALS, RunDir.SAMPLES, RunDir.SUMMARY, RunDir.CHECKPOINT, RunDir.INIT_MODEL):
        assert (run / name).exists(), name
    assert any((run / "tb").iterdir())
    state = torch.load(run / RunDir.CHECKPOINT, weights_only=True)
    assert state["step"] == 2 and {"model", "optimizer", "scheduler", "rng", "sampler"} <= set(state)
    summary = json.loads((run / RunDir.SUMMARY).read_text())
    assert "reward/jitter2" in summary and "reward/steps_to_kappa" in summary


def test_existing_run_dir_is_refused_before_any_work(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("")
    with pytest.raises(ValueError, match=r"is not empty \(x\) and was not started by dfpo train .*; nothing was deleted"):
        Trainer(tiny_config(tmp_path), quiet=True)
    assert (tmp_path / "run" / "x").exists()  # nothing of the user's is touched


def test_nonfinite_losses_skip_steps_then_stop_keeping_last_good_checkpoint(tmp_path, monkeypatch):
    import dfpo.trainer.stages.update as update_mod

    real = update_mod.micro_loss  # every micro-batch's loss, fused head or not
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls["n"] += 1
        return dataclasses.replace(out, loss=out.loss * float("nan")) if calls["n"] > 4 else out  # step 1 fine, then NaN

    monkeypatch.setattr(update_mod, "micro_loss", poisoned)
    cfg = tiny_config(tmp_path, "train.steps=4", "train.max_nonfinite_in_row=3")
    trainer = Trainer(cfg, quiet=True)
    with pytest.raises(NonFiniteLossError, match=r"3 optimiser steps in a row.*last good checkpoint.*step 1"):
        trainer.run()
    state = torch.load(tmp_path / "run" / RunDir.CHECKPOINT, weights_only=True)
    assert state["step"] == 1
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    text = (tmp_path / "run" / RunDir.METRICS).read_text()
    assert "NaN" not in text and "Infinity" not in text


def test_tokenizer_without_pad_token_fails_with_what_to_set():
    from dfpo.trainer.policy import build_char_tokenizer, check_pad_token

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


def test_cli_bad_input_exits_2_naming_the_problem(tmp_path, capsys):
    from dfpo.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text("[optim]\nlrr = 1e-4\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert "unknown config key optim.lrr" in capsys.readouterr().err
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"question": "2+2="}\n')
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'run_dir = "{tmp_path / "run"}"\n[data]\ntask = "jsonl"\npath = "{data}"\neval_size = 1\n')
    assert main(["train", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2: missing field 'prompt'" in err
    assert not (tmp_path / "run").exists()  # failed before any work


@pytest.mark.slow
def test_tiny_cpu_config_raises_reward(tmp_path):
    """configs/tiny-cpu.toml as shipped: the last 50 steps beat the first 20, and the last three
    held-out evaluations beat the one at step 0."""
    from pathlib import Path

    from dfpo.trainer.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs" / "tiny-cpu.toml", [f'run_dir="{tmp_path / "run"}"', "log.progress=false"])
    Trainer(cfg, quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    first = sum(r["reward/mean"] for r in rows[:20]) / 20
    last = sum(r["reward/mean"] for r in rows[-50:]) / 50
    evals = [json.loads(line) for line in (tmp_path / "run" / RunDir.EVALS).read_text().splitlines()]
    assert last > first + 0.05, (first, last)
    assert sum(e["eval/avg@4"] for e in evals[-3:]) / 3 > evals[0]["eval/avg@4"], evals


def test_lora_and_reference_kl_train_only_adapters(tmp_path):
    cfg = tiny_config(tmp_path, "model.lora_r=4", "objective.name=grpo", "objective.overrides.beta=0.1")
    trainer = Trainer(cfg, quiet=True)
    initial = _params(trainer.model)
    trainer.run()
    after = _params(trainer.model)
    changed = {n for n in after if not torch.equal(after[n], initial[n])}
    assert changed and all("lora_" in n for n in changed)
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert all("kl/ref" in r and r["kl/ref"] >= 0 for r in rows)


def test_full_finetune_with_reference_model_logs_kl(tmp_path):
    cfg = tiny_config(tmp_path, "objective.name=dapo", "objective.overrides.beta=0.05")
    Trainer(cfg, quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert rows[-1]["kl/ref"] > 0  # the policy moved away from the frozen initial model


def test_chat_template_is_applied_when_the_tokenizer_has_one():
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.policy import build_char_tokenizer
    from dfpo.trainer.prompts import encode_prompts
    from dfpo.trainer.tasks import Example

    tok = build_char_tokenizer()
    ex = [Example("1+2=", "3")]
    plain = encode_prompts(tok, ex, DataConfig(prompt_template="Q {prompt} \\boxed{}"))
    assert tok.decode(plain[0]) == "Q 1+2= \\boxed{}"
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompts(tok, ex, DataConfig(chat_template="on"))
    tok.chat_template = "{% for m in messages %}U:{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    assert tok.decode(encode_prompts(tok, ex, DataConfig())[0]) == "U:1+2=A:"
    assert tok.decode(encode_prompts(tok, ex, DataConfig(chat_template="off"))[0]) == "1+2="


def test_reasoning_gym_problems_load_offline_and_score():
    from dfpo.trainer.config import DataConfig
    from dfpo.trainer.rewards.compute import correctness_fn
    from dfpo.trainer.tasks import load_splits

    train, evals = load_splits(DataConfig(task="reasoning_gym", name="gsm_symbolic", train_size=3, eval_size=2), seed=0)
    assert len(train) == 3 and len(evals) == 2
    fn = correctness_fn("auto", "reasoning_gym")
    ex = train[0]
    assert fn(ex.prompt, f"so \\boxed{{{ex.answer}}}", ex) == 1.0
    assert fn(ex.prompt, "\\boxed{-1}", ex) < 0.5  # reasoning-gym gives small partial credit


def test_equiv_task_logs_surface_forms_and_a_local_model_directory_loads(tmp_path):
    cfg = tiny_config(tmp_path, "data.task=equiv", "reward.format_weight=0.0", "model.sft_steps=20")
    Trainer(cfg, quiet=True).run()
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    forms = ("number", "swap", "split", "echo", "invalid")
    assert all(sum(r[f"forms/{f}"] for f in forms) == pytest.approx(1.0) for r in rows)
    # the saved warm-started model is an ordinary transformers directory: train from it by path
    cfg2 = config_from_dict(
        apply_overrides({}, TINY + [f'run_dir="{tmp_path / "run2"}"', f'model.name="{tmp_path / "run" / RunDir.INIT_MODEL}"'])
    )
    Trainer(cfg2, quiet=True).run()
    assert (tmp_path / "run2" / RunDir.CHECKPOINT).exists() and not (tmp_path / "run2" / RunDir.INIT_MODEL).exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tiny_run_on_cuda_with_bf16_autocast(tmp_path):
    cfg = tiny_config(tmp_path, "device=cuda", "objective.name=dfpo_min")
    trainer = Trainer(cfg, quiet=True)
    initial = _params(trainer.model)
    trainer.run()
    assert next(trainer.model.parameters()).is_cuda
    assert next(trainer.model.parameters()).dtype == torch.float32  # master weights stay float32
    after = _params(trainer.model)
    assert sum(float((after[n] - initial[n]).abs().sum()) for n in after) > 0
    rows = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))


def test_identical_runs_write_identical_random_states(tmp_path):
    """Every generator a checkpoint saves is seeded from the config: two runs of one config save equal states."""
    states = []
    for name in ("a", "b"):
        Trainer(tiny_config(tmp_path / name, "train.steps=1", "eval.every=0"), quiet=True).run()
        states.append(torch.load(tmp_path / name / "run" / RunDir.CHECKPOINT, weights_only=True)["rng"])
    assert states[0]["python"] == states[1]["python"]
    assert all((x == y).all() if hasattr(x, "all") else x == y for x, y in zip(states[0]["numpy"], states[1]["numpy"]))
    assert torch.equal(states[0]["torch"], states[1]["torch"])


def test_the_logged_update_norm_is_the_norm_of_the_step_s_parameter_change(tmp_path):
    """optim/update_norm = ||theta_after - theta_before|| over the step's optimiser steps (here two epochs of one batch)."""
    cfg = tiny_config(tmp_path, "train.steps=1", "log.update_norm=true", "eval.every=0")
    trainer = Trainer(cfg, quiet=True)
    initial = _params(trainer.model)
    trainer.run()
    after = _params(trainer.model)
    expected = math.sqrt(sum(float((after[n].double() - initial[n].double()).square().sum()) for n in after))
    (row,) = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert row["optim/updates"] >= 1 and expected > 0
    assert row["optim/update_norm"] == pytest.approx(expected, rel=1e-6)


def test_without_log_update_norm_no_update_norm_is_logged(tmp_path):
    Trainer(tiny_config(tmp_path, "train.steps=1", "eval.every=0"), quiet=True).run()
    (row,) = [json.loads(line) for line in (tmp_path / "run" / RunDir.METRICS).read_text().splitlines()]
    assert "optim/update_norm" not in row
