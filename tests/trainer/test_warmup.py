"""The supervised warm-up of any model (issue 58): the tiny preset's warm start run on the prompts as the policy reads
them, from its own seed, cached once under a key of what makes its weights (written atomically) and reused by every
run that asks for it."""

from __future__ import annotations

import json
import os

import pytest
import torch
from tiny_run import FORMAT_REWARD_SETS, TEMPLATE_TASK_SETS

from dfpo.trainer import warmup
from dfpo.trainer.config import apply_overrides, config_from_dict
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.tasks import load_splits

pytestmark = pytest.mark.usefixtures("one_thread")

SETS = [
    *TEMPLATE_TASK_SETS,
    "warmup.steps=4",
    "warmup.batch_size=4",
    "warmup.lr=1e-2",
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    *FORMAT_REWARD_SETS,
    "optim.minibatch_groups=1",
    "train.steps=1",
    "train.save_every=0",
    "eval.every=1",
    "eval.k=1",
    "log.tensorboard=false",
    "log.progress=false",
    "threads=1",
]


def _cfg(tmp_path, *extra):
    return config_from_dict(
        apply_overrides({}, [*SETS, f'warmup.cache_dir="{tmp_path / "cache"}"', f'run_dir="{tmp_path / "run"}"', *extra])
    )


def test_a_warm_up_needs_a_fixed_eval_split():
    with pytest.raises(ValueError, match=r"warmup.steps=4 .* set data.eval_seed to a seed"):
        config_from_dict(apply_overrides({}, [s for s in SETS if s != "data.eval_seed=0"]))
    config_from_dict(apply_overrides({}, [s for s in SETS if s != "data.eval_seed=0"] + ["warmup.steps=0"]))  # no warm-up: as before


def test_the_key_follows_what_makes_the_weights_and_nothing_else(tmp_path):
    """Another run seed, objective, learning rate or cache folder: the same folder. Another warm-up setting, data
    setting or model shape: another one."""
    base = warmup.warm_folder(_cfg(tmp_path))
    same = ["seed=7", "objective.name=gspo", "optim.lr=1e-3", "rollout.group_size=8", "train.steps=9"]
    for s in same:
        assert warmup.warm_folder(_cfg(tmp_path, s)) == base, s
    other = ["warmup.seed=1", "warmup.lr=1e-3", "warmup.steps=5", "warmup.batch_size=2", "data.max_operand=8", "model.tiny_hidden=64"]
    for s in other:
        assert warmup.warm_folder(_cfg(tmp_path, s)) != base, s
    assert warmup.warm_folder(_cfg(tmp_path, "warmup.steps=0")) is None
    assert warmup.warm_folder(_cfg(tmp_path, f'warmup.cache_dir="{tmp_path / "elsewhere"}"')).name == base.name


def test_the_default_cache_is_under_dfpo_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("DFPO_CACHE", str(tmp_path / "c"))
    assert warmup.cache_root("") == tmp_path / "c" / "warmup"
    assert warmup.cache_root(str(tmp_path / "mine")) == tmp_path / "mine"


def test_the_warm_up_trains_on_its_own_seeds_train_split_never_on_a_held_out_problem(tmp_path):
    cfg = _cfg(tmp_path, "seed=3", "warmup.seed=11")
    held = {e.prompt for e in load_splits(cfg.data, cfg.seed)[1]}
    examples = warmup.warmup_examples(cfg)
    assert examples == load_splits(cfg.data, 11)[0] and not held & {e.prompt for e in examples}


def test_the_warm_up_reads_prompts_as_the_policy_does_and_lowers_the_loss_on_the_template(tmp_path):
    """Its prompts go through data.prompt_template (and a chat template where the tokenizer has one), and its
    targets are the task's template answers: their loss falls."""
    from dfpo.trainer import policy

    seen = []
    real = policy.sft_warm_start

    def spy(*args, encode_prompt, target_fn, **kwargs):
        ex = args[2][0]
        seen.append((encode_prompt(ex), target_fn(ex, None), ex))
        return real(*args, encode_prompt=encode_prompt, target_fn=target_fn, **kwargs)

    cfg = _cfg(tmp_path, 'data.prompt_template="Q: {prompt}"', "warmup.steps=30")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warmup, "sft_warm_start", spy)
        losses = warmup.build_warm_model(cfg, out, device=torch.device("cpu"))
    ids, target, ex = seen[0]
    tok = policy.build_char_tokenizer()
    assert tok.decode(ids) == "Q: " + ex.prompt
    assert target == " + ".join(map(str, ex.meta["operands"])) + " = " + ex.answer
    assert len(losses) == 30 and sum(losses[-5:]) < sum(losses[:5])
    record = json.loads((out / warmup.WARMUP_RECORD).read_text())
    assert record["losses"] == losses and record["settings"] == warmup.warmup_settings(cfg)


def test_two_runs_share_one_warm_up_and_train_the_same_as_the_one_that_built_it(tmp_path, capsys):
    """The first run builds the folder, a second run (another folder) reuses it without warming up again, and its
    logs equal the first's: a cell that finds the warm-up trains what the cell that wrote it trained."""
    from dfpo.trainer.train import Trainer

    Trainer(_cfg(tmp_path, f'run_dir="{tmp_path / "a"}"'), quiet=True).run()
    folder = warmup.warm_folder(_cfg(tmp_path))
    record = (folder / warmup.WARMUP_RECORD).stat().st_mtime_ns
    assert "warm-up: 4 supervised steps" in capsys.readouterr().err
    Trainer(_cfg(tmp_path, f'run_dir="{tmp_path / "b"}"'), quiet=True).run()
    err = capsys.readouterr().err
    assert f"warm-up: reusing {folder}" in err and "supervised steps" not in err
    assert (folder / warmup.WARMUP_RECORD).stat().st_mtime_ns == record
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temporary folder left

    def logs(run):
        rows = (tmp_path / run / RunDir.METRICS).read_text().splitlines()
        return [{k: v for k, v in json.loads(r).items() if not k.startswith("time/")} for r in rows]

    assert logs("a") == logs("b")
    assert not (tmp_path / "a" / "init_model").exists()  # the policy came from the warm-up folder


def test_an_interrupted_warm_up_leaves_nothing_under_its_key(tmp_path):
    cfg = _cfg(tmp_path)

    def dies(cfg, out, **kwargs):
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warmup, "build_warm_model", dies)
        with pytest.raises(KeyboardInterrupt):
            warmup.ensure_warm_model(cfg, device=torch.device("cpu"))
    root = warmup.cache_root(cfg.warmup.cache_dir)
    assert list(root.iterdir()) == []


def test_a_warm_up_finished_first_by_another_run_is_used(tmp_path):
    """Two runs warm up at once: the one that renames second finds the folder in place and uses it."""
    cfg = _cfg(tmp_path)
    folder = warmup.warm_folder(cfg)
    real = warmup.build_warm_model
    said = []

    def other_run_finishes_first(cfg, out, **kwargs):
        real(cfg, out, **kwargs)
        folder.mkdir()
        (folder / warmup.WARMUP_RECORD).write_text("{}")  # the other run's rename

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warmup, "build_warm_model", other_run_finishes_first)
        got = warmup.ensure_warm_model(cfg, device=torch.device("cpu"), say=said.append)
    assert got == folder and (folder / warmup.WARMUP_RECORD).read_text() == "{}"
    assert said[-1] == f"warm-up: {folder} was written by another run meanwhile; using it"
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_a_folder_without_its_record_is_refused_in_one_sentence_before_any_work(tmp_path):
    """A folder under the key that lacks the record (not written by ensure_warm_model) is neither reused nor deleted."""
    cfg = _cfg(tmp_path)
    folder = warmup.warm_folder(cfg)
    folder.mkdir(parents=True)
    (folder / "stray").write_text("x")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(warmup, "build_warm_model", lambda *a, **k: pytest.fail("warmed up before refusing"))
        with pytest.raises(ValueError, match=r"is in the way of the warm-up: it holds no warmup.json.*nothing was deleted"):
            warmup.ensure_warm_model(cfg, device=torch.device("cpu"))
    assert os.listdir(folder) == ["stray"] and [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_the_probe_starts_from_the_trainers_warm_up_not_from_the_model_it_was_made_from(tmp_path):
    """dfpo probe on a config with a warm-up probes the policy its runs start from (issue 58 item 8): the cached
    warm-up's weights, built when missing, not the tiny preset's in-memory warm start."""
    from safetensors.torch import load_file

    from dfpo.trainer.probe.one_seed import build_start
    from dfpo.trainer.probe.plan import make_plan

    sets = [*SETS, f'warmup.cache_dir="{tmp_path / "cache"}"']
    plan = make_plan(
        objectives="grpo", seeds=1, first_seed=0, config=None, sets=sets, run=None, move_steps=0, max_events=4, out=str(tmp_path / "p")
    )
    cfg = _cfg(tmp_path)
    train, _ = load_splits(cfg.data, cfg.seed)
    start = build_start(plan, plan.config, train, lambda line: None, with_ref=False)
    folder = warmup.warm_folder(cfg)
    saved = {k: v for f in folder.glob("*.safetensors") for k, v in load_file(f).items()}
    params = dict(start.model.named_parameters())
    assert saved and all(torch.equal(params[name], saved[name]) for name in saved if name in params)
