"""`dfpo train` on two gloo processes (CPU) trains exactly like one process on the same data.

With per-group sampling seeds (rollout.seed_per_group, always on with more than one process) the rollouts do
not depend on the world size, so a 2-rank run and a 1-process run see the same batches and, with the global
loss normalisation, take the same optimiser steps: their checkpoints agree to float round-off. A run resumed
on another world size continues the same way. Bad world sizes are refused before any work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_run import FORMAT_REWARD_SETS, LOG_EVERY_STEP_SETS, TINY_MODEL_SETS

from dfpo.trainer.cli import relaunch_command
from dfpo.trainer.config import apply_overrides, config_from_dict
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.train import Trainer

SETS = [
    *TINY_MODEL_SETS,
    "data.train_size=40",
    "data.eval_size=5",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    "rollout.seed_per_group=true",
    *FORMAT_REWARD_SETS,
    "optim.lr=1e-2",
    # Adam's first steps turn float round-off in a near-zero gradient into a whole lr-sized step (update ~ sign(g));
    # a larger epsilon keeps round-off (different summation orders on 1 and 2 processes) at round-off size
    "optim.adam_eps=1e-5",
    "optim.minibatch_groups=2",
    "optim.epochs=2",
    "optim.warmup_ratio=0.0",
    "optim.min_lr_ratio=1.0",  # a constant learning rate: extending train.steps on resume keeps the schedule
    *LOG_EVERY_STEP_SETS,
]
ENV = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1", MKL_CBWR="COMPATIBLE")  # MKL: the same result every run
ENV["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p)  # reward_fixtures


def children(pid: int) -> list[int]:
    """PIDs of the live processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _cmd(run_dir: Path, *extra: str, nproc: int | None = None, resume: bool = False) -> list[str]:
    cmd = [sys.executable, "-m", "dfpo", "train", "--quiet"]
    if nproc is not None:
        cmd += ["--nproc", str(nproc)]
    if resume:
        cmd += ["--resume", str(run_dir)]
        sets = list(extra)
    else:
        config = run_dir.parent / "empty.toml"
        config.write_text("# every key comes from --set\n")
        cmd += ["--config", str(config)]
        sets = SETS + [f"run_dir={run_dir}", *extra]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, env=ENV, timeout=300, capture_output=True, text=True)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-1000:]}\n{out.stderr[-3000:]}"
    return out


def _one_process(run_dir: Path, *extra: str) -> None:
    """The reference run: one process, launched like the others (same environment, same thread count)."""
    _run(_cmd(run_dir, *extra))


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / RunDir.CHECKPOINT, map_location="cpu", weights_only=True)["model"]


def _initial(run_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / RunDir.INIT_MODEL)
    return {n: p.detach() for n, p in model.named_parameters()}


def _records(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _assert_same_run(a: Path, b: Path, steps: int) -> None:
    pa, pb, init = _params(a), _params(b), _initial(a)
    assert set(pa) == set(pb)
    moved = max(float((pa[n] - init[n]).abs().max()) for n in pa)
    assert moved > 1e-2, "the parameters hardly moved: the comparison would say nothing"
    ma, mb = _records(a / RunDir.METRICS), _records(b / RunDir.METRICS)
    assert [r["reward/mean"] for r in ma] == [r["reward/mean"] for r in mb]  # the same rollouts
    for n in pa:
        torch.testing.assert_close(pa[n], pb[n], rtol=1e-4, atol=1e-4, msg=lambda m, n=n: f"{n} differs: {m}")
    assert [r["step"] for r in ma] == [r["step"] for r in mb] == list(range(1, steps + 1))  # one line per step: rank 0 alone logs
    for ra, rb in zip(ma, mb):
        for key in ("reward/mean", "reward/correct", "reward/format", "completion/length", "optim/updates"):
            assert ra[key] == rb[key], (key, ra["step"], ra[key], rb[key])
        assert ra["grad/norm"] == pytest.approx(rb["grad/norm"], rel=1e-4)
        assert ("optim/update_norm" in ra) == ("optim/update_norm" in rb)
        if "optim/update_norm" in ra:
            assert ra["optim/update_norm"] == pytest.approx(rb["optim/update_norm"], rel=1e-4) and ra["optim/update_norm"] > 0
    ea, eb = _records(a / RunDir.EVALS), _records(b / RunDir.EVALS)
    tax_a, tax_b = [r.pop("eval/tax_kl") for r in ea], [r.pop("eval/tax_kl") for r in eb]
    assert tax_a == pytest.approx(tax_b, rel=1e-4, abs=1e-12)  # a function of the parameters, which agree to 1e-4
    assert ea == eb
    assert _records(a / RunDir.SAMPLES) == _records(b / RunDir.SAMPLES)


@pytest.mark.parametrize(
    "objective, parallel, more",
    [
        ("grpo", "ddp", ("log.update_norm=true",)),  # the step's parameter change: rank 0's whole parameters
        ("dfpo_min", "ddp", ()),
        # pi_old recomputed by the trainer, a reference model, micro-batches, a batch-wide advantage scale
        ("dfpo_min", "fsdp2", ("rollout.old_logp=recompute", "optim.microbatch_groups=1", "objective.overrides.beta=0.04",
                               'objective.overrides.adv_scale="reinforce_pp"', "log.update_norm=true")),  # over the shards
        # issue 30: each rank decodes its share of ReMax's greedy completions; GDPO's further reward functions gathered
        ("grpo", "ddp", ('objective.overrides.adv_scale="remax"',)),
        ("grpo", "ddp", ('objective.overrides.adv_scale="gdpo"', 'reward.functions=["reward_fixtures:half_informative_reward"]')),
    ],
)  # fmt: skip
def test_two_gloo_ranks_train_like_one_process(tmp_path, objective, parallel, more):
    """K = 2 steps x 2 epochs x 2 mini-batches = 8 optimiser steps on 2 ranks == on 1 process (DDP and FSDP2 on CPU)."""
    extra = (f"objective.name={objective}", f"train.parallel={parallel}", "train.steps=2", *more)
    _one_process(tmp_path / "one", *extra)
    _run(_cmd(tmp_path / "two", *extra, nproc=2))
    _assert_same_run(tmp_path / "one", tmp_path / "two", steps=2)
    logged = {"optim/update_norm" in r for r in _records(tmp_path / "two" / RunDir.METRICS)}
    assert logged == {"log.update_norm=true" in more}
    record = json.loads((tmp_path / "two" / RunDir.CHECKPOINT_META).read_text())
    assert (record["step"], record["world_size"]) == (2, 2)


@pytest.mark.parametrize(
    "first, then, parallel, seeded",
    [
        (2, 1, "ddp", "false"),  # seeded per group because it started on 2 processes; it stays so on 1
        (1, 2, "fsdp2", "true"),
    ],
)
def test_a_run_resumed_on_another_world_size_continues_exactly(tmp_path, first, then, parallel, seeded):
    extra = ("objective.name=dfpo_min", f"train.parallel={parallel}", f"rollout.seed_per_group={seeded}")
    _run(_cmd(tmp_path / "full", *extra, "train.steps=3", nproc=first))
    part = tmp_path / "part"
    _run(_cmd(part, *extra, "train.steps=2", nproc=first))
    out = _run(_cmd(part, "train.steps=3", nproc=then, resume=True))
    assert f"on {then} process(es); the checkpoint (step 2) was written by a run on {first}: the world size changed" in out.stderr
    _assert_same_run(tmp_path / "full", part, steps=3)
    assert json.loads((part / RunDir.CHECKPOINT_META).read_text())["world_size"] == then


@pytest.mark.slow
def test_a_two_rank_run_killed_with_sigkill_resumes_on_one_process_exactly(tmp_path):
    """SIGKILL to the launcher and both ranks once a step-2 checkpoint exists (maybe mid-write of the next), then
    --resume on one process: the finished run equals an uninterrupted one."""
    import signal
    import time

    extra = ("objective.name=dfpo_min", "train.steps=4")
    _one_process(tmp_path / "full", *extra)
    part = tmp_path / "part"
    proc = subprocess.Popen(
        _cmd(part, *extra, nproc=2), env=ENV, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            marker = part / RunDir.CHECKPOINT_META
            if marker.exists() and json.loads(marker.read_text() or "{}").get("step", 0) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    finally:
        ranks = children(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, no chance to clean up
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)  # and both ranks (a process group of their own), before they notice
        proc.wait()
    killed_at = json.loads((part / RunDir.CHECKPOINT_META).read_text())["step"]
    assert 2 <= killed_at < 4
    out = _run(_cmd(part, nproc=1, resume=True))
    assert "the world size changed" in out.stderr
    _assert_same_run(tmp_path / "full", part, steps=4)


def test_group_seeds_make_completions_independent_of_their_batch():
    from dfpo.trainer.config import ModelConfig
    from dfpo.trainer.policy import build_char_tokenizer, build_tiny_model
    from dfpo.trainer.sampler import HFGenerateEngine, SamplingParams

    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny_hidden=32, tiny_layers=1, tiny_heads=2, tiny_intermediate=64), tok, seed=0)
    engine = HFGenerateEngine(model, tok.pad_token_id, {tok.eos_token_id})
    prompts = [tok(t, add_special_tokens=False).input_ids for t in ("1+2=", "13+40=", "7+7=")]
    params = SamplingParams(max_new_tokens=6)
    together = engine.sample(prompts, 3, params, seeds=[10, 11, 12])
    torch.manual_seed(123)  # the global RNG plays no part
    alone = engine.sample(prompts[1:2], 3, params, seeds=[11])
    assert together.tokens[3:6] == alone.tokens
    torch.testing.assert_close(torch.tensor(together.logprobs[3][:1]), torch.tensor(alone.logprobs[0][:1]))
    in_chunks = HFGenerateEngine(model, tok.pad_token_id, {tok.eos_token_id}, batch_size=2).sample(prompts, 3, params, seeds=[10, 11, 12])
    assert in_chunks.tokens == together.tokens


@pytest.mark.parametrize(
    "nproc, sets, message",
    [
        (3, [], "rollout.prompts_per_step=4 is not divisible by the world size 3"),
        (4, ["optim.minibatch_groups=2"], "optim.minibatch_groups=2 is not divisible by the world size 4"),
        (0, [], "--nproc must be >= 1, got 0"),
        (2, ["train.parallel=fsdp2", "optim.max_tokens_per_microbatch=64"], "optim.max_tokens_per_microbatch=64 splits by tokens"),
    ],
)
def test_bad_world_sizes_are_refused_before_any_work(tmp_path, nproc, sets, message):
    run = tmp_path / "run"
    out = subprocess.run(_cmd(run, "train.steps=2", *sets, nproc=nproc), env=ENV, timeout=120, capture_output=True, text=True)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not run.exists()  # no run folder, no model


def test_under_torchrun_a_bad_world_size_is_refused_before_the_model_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    cfg = config_from_dict(apply_overrides({}, SETS + [f'run_dir="{tmp_path / "run"}"']))
    with pytest.raises(ValueError, match=r"rollout.prompts_per_step=4 is not divisible by the world size 3"):
        Trainer(cfg, quiet=True)
    assert not (tmp_path / "run").exists()


def test_each_rank_runs_the_same_command_without_nproc():
    from dfpo.cli import build_parser

    args = build_parser().parse_args(["train", "--nproc", "2", "--config", "c.toml", "--set", "a.b=1", "--set", "c.d=x", "--quiet"])
    cmd = relaunch_command(args)
    assert cmd == [sys.executable, "-m", "dfpo", "train", "--config", "c.toml", "--set", "a.b=1", "--set", "c.d=x", "--quiet"]


def test_group_seeds_need_the_hf_engine():
    with pytest.raises(ValueError, match=r"rollout.seed_per_group = true needs rollout.engine = 'hf'; got rollout.engine = 'vllm'"):
        config_from_dict(apply_overrides({}, ["rollout.seed_per_group=true", "rollout.engine=vllm"]))


def test_a_run_folder_in_the_way_is_reported_once(tmp_path):
    """The launcher checks the run folder before it starts any rank: one message, exit 2."""
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run folder should be\n")
    out = subprocess.run(_cmd(blocker, "train.steps=2", nproc=2), env=ENV, timeout=120, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("dfpo: error:") == 1, out.stderr[-3000:]
    assert "rank 0 failed" not in out.stderr
    assert blocker.read_text() == "a file where the run folder should be\n"  # nothing written over it
