"""benchmarks/vs_trl.py: the CPU comparison's defaults and settings as they were, the GPU protocol's arguments refused
in one sentence each, its trial order, its per-side figures and its goal lines; the CPU rehearsal end to end (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import ROOT, load_script

PATH = ROOT / "benchmarks" / "vs_trl.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(PATH, "vs_trl_bench")


def refusal(bench, capsys, argv: list[str]) -> str:
    """The message argparse prints when it refuses ``argv`` (the line after the usage)."""
    with pytest.raises(SystemExit) as stop:
        bench.parse(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_the_cpu_comparison_keeps_its_defaults(bench):
    args = bench.parse([])
    assert not args.protocol
    assert (args.objectives, args.pairs, args.steps, args.hidden, args.layers, args.threads) == (["grpo", "gspo"], 3, 3, 128, 2, 2)
    assert (args.dfpo_old_logp, args.dfpo_fused_head, args.quick) == ("auto", "eager", False)


def test_the_cpu_comparisons_dfpo_settings_are_the_ones_it_always_ran(bench, tmp_path):
    sets = bench.dfpo_settings("M", "grpo", 3, 2, tmp_path, "auto", "eager", bench.Work(), [])
    assert sets == [
        'model.name="M"', "model.gradient_checkpointing=false", "data.train_size=16", "data.eval_size=1",
        "rollout.prompts_per_step=16", "rollout.group_size=8", "rollout.max_new_tokens=32", "rollout.temperature=1.0",
        "rollout.top_p=1.0", "rollout.top_k=0", "optim.minibatch_groups=4", "optim.epochs=1", "optim.lr=1e-5",
        "objective.name=grpo", "eval.every=0", "train.steps=3", "log.progress=false", "log.samples_every=0",
        "log.diagnostics=false", "threads=2", f'run_dir="{tmp_path}"', "rollout.old_logp=auto", "optim.fused_head=eager",
    ]  # fmt: skip


def test_the_protocol_runs_the_issues_work_on_the_dfpo_side(bench, tmp_path):
    work = bench.Work(prompts=8, max_new=256, device="cuda", bf16=True, checkpointing=True, protocol=True)
    sets = bench.dfpo_settings("M", "grpo", 3, 0, tmp_path, "sampler", "eager", work, ["optim.head_dtype=float32"])
    for wanted in (
        "model.gradient_checkpointing=true", "rollout.prompts_per_step=8", "rollout.group_size=8", "rollout.max_new_tokens=256",
        "optim.minibatch_groups=2", "rollout.old_logp=sampler", "device=cuda", "model.dtype=float32", "model.amp=bf16",
        "train.save_every=0", "train.save_final=false",
    ):  # fmt: skip
        assert wanted in sets
    assert sets[-1] == "optim.head_dtype=float32"  # --dfpo-set comes last, so it wins
    cpu = bench.dfpo_settings("M", "grpo", 3, 2, tmp_path, "sampler", "eager", bench.Work(prompts=8, checkpointing=True, protocol=True), [])
    assert "model.amp=none" in cpu and "device=cpu" in cpu  # dfpo's model.amp needs CUDA: the CPU rehearsal runs float32


def test_the_protocol_is_chosen_by_cuda_or_a_shape_with_its_own_defaults(bench):
    gpu = bench.parse(["--device", "cuda"])
    assert gpu.protocol and (gpu.shape, gpu.trials, gpu.steps, gpu.max_new, gpu.threads) == ("qwen3-0.6b", 6, 3, 256, 0)
    assert gpu.deadline_s == bench.CUDA_DEADLINE_S <= 280 - 20  # scripts/gpu_checks.sh's limit, less the summary's margin
    rehearsal = bench.parse(["--shape", "tiny"])
    assert rehearsal.protocol and (rehearsal.device, rehearsal.max_new, rehearsal.deadline_s, rehearsal.threads) == ("cpu", 16, 0.0, 2)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shape", "huge"], "argument --shape: invalid choice: 'huge' (choose from"),
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu' (choose from"),
        (["--shape", "tiny", "--pairs", "2"], "--pairs belongs to the CPU comparison (--device cpu, no --shape); the GPU protocol takes --trials, --steps and --max-new"),
        (["--device", "cuda", "--quick"], "--quick belongs to the CPU comparison (--device cpu, no --shape); the GPU protocol takes --trials, --steps and --max-new"),
        (["--trials", "3"], "--trials belongs to the GPU protocol: add --device cuda, or --shape tiny to rehearse it on the CPU"),
        (["--shape", "tiny", "--steps", "1"], "--steps must be at least 2 (one warm-up, then timed steps), got 1"),
        (["--shape", "tiny", "--trials", "0"], "--trials must be at least 1, got 0"),
        (["--shape", "tiny", "--deadline-s", "-5"], "--deadline-s must be 0 (none) or positive, got -5"),
        (["--shape", "tiny", "--dfpo-set", "optim.lr"], "--dfpo-set takes KEY=VALUE (a dfpo setting, as dfpo train --set), got 'optim.lr'"),
        (["--device", "cuda", "--model", "smollm2-135m-instruct"], "--model belongs to the CPU comparison (--device cpu, no --shape); the GPU protocol takes --trials, --steps and --max-new"),
        (["--model", "smollm2-135m-instruct", "--hidden", "64"], "--hidden and --layers shape the built model; --model smollm2-135m-instruct has its own shape"),
        (["--max-load", "-1"], "--max-load must be 0 (no check) or positive, got -1"),
    ],
)  # fmt: skip
def test_a_bad_argument_is_one_sentence(bench, capsys, argv, message):
    """argparse's own sentence for a bad choice (its quoting of the choices differs between Python versions)."""
    line = refusal(bench, capsys, argv)
    assert line == f"vs_trl.py: error: {message}" or (message.endswith("(choose from") and line.startswith(f"vs_trl.py: error: {message}"))


def test_cuda_without_a_device_is_one_line_and_exit_2(bench, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert bench.main(["--device", "cuda"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("no CUDA device: torch.cuda.is_available() is False")


def test_trials_alternate_a_c_b_b_c_a(bench):
    assert bench.trial_order(6) == ["dfpo-sampler", "trl", "dfpo-recompute", "dfpo-recompute", "trl", "dfpo-sampler"]
    assert sorted(bench.trial_order(3)) == sorted(bench.SIDES)  # a short run still measures every side once
    assert bench.trial_order(2) == ["dfpo-sampler", "trl"]  # TRL early: two trials already give a ratio
    assert bench.trial_order(8)[6:] == ["dfpo-sampler", "trl"]
    # each side's mean position is the same over a whole cycle: no side is favoured by coming first or last
    order = bench.trial_order(12)
    means = {s: sum(i for i, x in enumerate(order) if x == s) / order.count(s) for s in bench.SIDES}
    assert len(set(means.values())) == 1


def trial(tok_s: float, update: list[float], peak: float, step: list[float] | None = None) -> dict:
    step = step or [2.0] * len(update)
    return {
        "tokens_per_s": tok_s,
        "peak_gib": peak,
        "per_step": {"step_s": step, "rollout_s": [1.0] * len(update), "old_logp_s": [0.1] * len(update), "update_s": update},
    }


def test_a_sides_figures_are_medians_of_its_trials_and_the_largest_peak(bench):
    s = bench.side_summary([trial(100.0, [1.0, 3.0], 5.0, [2.0, 4.0]), trial(300.0, [2.0], 7.0), trial(200.0, [9.0], 6.0)])
    assert (s["trials"], s["tokens_per_s"], s["update_s"], s["peak_gib"]) == (3, 200.0, 2.5, 7.0)
    assert s["ranges"]["step_s"] == (2.0, 4.0) and s["ranges"]["update_s"] == (1.0, 9.0)


def test_goal_lines_read_each_ratio_against_the_issues_goal(bench):
    sides = {
        "trl": {"tokens_per_s": 1000.0, "update_s": 2.0, "peak_gib": 10.0},
        "dfpo-recompute": {"tokens_per_s": 2000.0, "update_s": 1.3, "peak_gib": 10.0},  # exactly at 2.0x: met
        "dfpo-sampler": {"tokens_per_s": 2400.0, "update_s": 1.0, "peak_gib": 10.5},
    }
    assert bench.goal_lines(sides) == [
        "goal dfpo / TRL completion tok/s at equal work (dfpo-recompute) >= 2.0: 2.00 (2000 tok/s / 1000 tok/s) PASS",
        "goal dfpo / TRL completion tok/s with the sampler's log-probs (dfpo-sampler) >= 2.5: 2.40 (2400 tok/s / 1000 tok/s) MISS",
        "goal dfpo's update / TRL's (dfpo-sampler) <= 0.6: 0.50 (1.00 s / 2.00 s) PASS",
        "goal dfpo's update / TRL's (dfpo-recompute) <= 0.6: 0.65 (1.30 s / 2.00 s) MISS",
        "goal dfpo's peak memory / TRL's (dfpo-sampler) <= 1.0: 1.05 (10.50 GiB / 10.00 GiB) MISS",
        "goal dfpo's peak memory / TRL's (dfpo-recompute) <= 1.0: 1.00 (10.00 GiB / 10.00 GiB) PASS",
    ]


def test_a_goal_without_both_sides_is_not_measured(bench):
    lines = bench.goal_lines({"dfpo-sampler": {"tokens_per_s": 1.0, "update_s": 1.0, "peak_gib": 1.0}})
    assert len(lines) == len(bench.GOALS) and not any("PASS" in x or "MISS" in x for x in lines)
    assert lines[0].endswith("not measured (no dfpo-recompute or trl trial finished)")
    assert lines[1].endswith("not measured (no trl trial finished)")


def test_the_gpu_shape_is_real_size_qwen3_06b(bench):
    real = load_script("scripts/real_size.py", "real_size_for_test_vs_trl")
    assert bench.shape_config("qwen3-0.6b") == real.QWEN3_06B
    assert bench.shape_config("tiny")["tie_word_embeddings"] is True  # the same kind of head as Qwen3's


def test_gpu_checks_without_cuda_says_so_in_one_line_and_exits_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    env = dict(os.environ, PYTHON=sys.executable)
    out = ROOT / "build" / "gpu-checks-never-made"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_checks.sh"), str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "" and not out.exists()
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("no CUDA device: ")


def test_gpu_checks_plan_fits_one_600_s_command_with_time_to_spare(tmp_path):
    """--plan lists the GPU run's steps with their limits: vs_trl first, then decode_step, then the gpu-marked tests,
    their limits adding up to the 540 s the header states (the fused_head runs only within it), nothing run or made."""
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_checks.sh"), "--plan", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stderr == ""
    steps = [line.removeprefix("plan: ").split(" s ", 1) for line in proc.stdout.splitlines()]
    always = {name: int(limit) for limit, name in steps if "only while" not in name}
    assert sum(always.values()) == 540 <= 600 - 60
    names = list(always)
    assert names.index("vs_trl") < names.index("decode_step") < names.index("core gpu tests") < names.index("trainer gpu test")
    assert [name for _, name in steps if "only while" in name] == [
        f"fused_head H={h}, only while the 540 s budget allows it" for h in (1024, 4096)
    ]
    text = (ROOT / "scripts" / "gpu_checks.sh").read_text()
    assert "add up to\n# 540 s" in text and not (tmp_path / "out").exists()
    commands = [x for x in map(str.strip, text.splitlines()) if x.startswith(('"$py" ', "$py ", "nvidia-smi"))]
    assert commands == []  # nothing runs without its own limit


def test_the_gpu_protocol_writes_its_json_where_asked(bench):
    args = bench.parse(["--device", "cuda", "--json", "/x/vs_trl.json"])
    assert args.json == "/x/vs_trl.json"


@pytest.mark.slow
def test_the_gpu_protocol_rehearsed_on_the_cpu(tmp_path):
    argv = ["--device", "cpu", "--shape", "tiny", "--max-new", "8", "--steps", "2", "--trials", "3", "--threads", "1"]
    proc = subprocess.run([sys.executable, str(PATH), *argv], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "peak GiB = the trial process's peak RSS" in proc.stdout and "float32 without autocast" in proc.stdout
    for side, pi_old in (("dfpo-sampler", "sampler"), ("dfpo-recompute", "recompute"), ("trl", "recompute")):
        assert any(x.split()[1:3] == [side, pi_old] for x in lines if x[:5].strip().isdigit()), side
        assert any(x.startswith(f"| {side} |") for x in lines), side
    goals = [x for x in lines if x.startswith("goal ")]
    assert len(goals) == 6 and all(x.endswith((" PASS", " MISS")) for x in goals)


def test_the_smollm2_comparison_alternates_a_b_b_a_on_raw_prompts(bench, tmp_path):
    args = bench.parse(["--model", "smollm2-135m-instruct"])
    assert (args.model, args.objectives, args.pairs, args.amp, args.max_load) == ("smollm2-135m-instruct", ["grpo"], 2, "none", 0.7)
    sets = bench.dfpo_settings("M", "grpo", 3, 2, tmp_path, "auto", "eager", bench.Work(raw_prompts=True, bf16=True), [])
    assert sets[-2:] == ["model.amp=bf16", "data.chat_template=off"]  # the settings it always ran, then these


def test_the_smollm2_comparison_does_the_work_of_its_cpu_config(bench):
    """4 prompts x 8, 16 new tokens, 2 optimiser steps a rollout: configs/smollm2-cpu.toml's work (issue 59 item 4)."""
    work = bench.comparison_work(bench.parse(["--model", "smollm2-135m-instruct", "--amp", "bf16"]))
    assert (work.prompts, work.group, work.max_new, work.minibatches, work.raw_prompts, work.bf16) == (4, 8, 16, 2, True, True)
    built = bench.comparison_work(bench.parse([]))
    assert built == bench.Work()  # the built model's comparison is unchanged


@pytest.mark.parametrize(
    "load, max_load, refused",
    [(0.3, 0.7, False), (0.7, 0.7, False), (1.9, 0.7, True), (9.0, 0.0, False)],
)
def test_the_cpu_comparison_refuses_to_time_beside_another_process_in_one_sentence(bench, load, max_load, refused):
    line = bench.load_refusal(max_load, load=load, cores=2)
    assert (line is not None) == refused
    if refused:
        assert line == (
            f"vs_trl: not timing: the 1-minute load average is {load:.2f} on 2 cores, above --max-load {max_load:g}, so another "
            "process is running and its work would be in the figures; run it on a quiet machine, or pass --max-load 0 to time anyway"
        )


def test_a_loaded_machine_is_refused_before_any_model_is_built(bench, capsys, monkeypatch):
    monkeypatch.setattr(bench, "comparison_model", lambda *a: pytest.fail("a model was built"))
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    assert bench.main(["--quick", "--max-load", "1"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("vs_trl: not timing: the 1-minute load average is 5.00")


def test_bf16_on_a_cpu_without_it_in_hardware_is_the_trainers_sentence(bench, monkeypatch):
    import dfpo.trainer.policy as policy

    monkeypatch.delenv("DFPO_CUDA_DEFAULTS", raising=False)
    monkeypatch.setattr(policy, "cpu_bf16_flags", lambda: [])
    assert bench.amp_refusal("bf16").startswith('vs_trl: --amp bf16: model.amp = "bf16" on a CPU needs bf16 in hardware')
    monkeypatch.setattr(policy, "cpu_bf16_flags", lambda: ["avx512_bf16"])
    assert bench.amp_refusal("bf16") is None and bench.amp_refusal("none") is None


DEVICE_PYTHON = os.environ.get("DFPO_DEVICE_PYTHON", str(ROOT / ".venv-device" / "bin" / "python"))
"""The device-versions environment (scripts/device_env.sh: torch 2.11, transformers 5.17), as CI builds it."""


@pytest.mark.slow
@pytest.mark.skipif(not Path(DEVICE_PYTHON).exists(), reason=f"no device-versions environment at {DEVICE_PYTHON} (scripts/device_env.sh)")
def test_gpu_checks_rehearsed_on_the_cpu_in_the_device_versions_environment(tmp_path):
    """bash scripts/gpu_checks.sh --rehearse OUT: the GPU machine's steps on the CPU with the image's versions and CUDA's
    choices (DFPO_CUDA_DEFAULTS=1), from a bundle installed with no network; every step passes, every dfpo trial keeps
    its compiled decode step, and every log and JSON lands in OUT."""
    import json

    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=DEVICE_PYTHON, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_checks.sh"), "--rehearse", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / "gpu_checks.json").read_text())
    assert record["rehearsal"] and record["exit"] == 0
    assert [s["step"] for s in record["steps"]][-4:] == ["vs_trl", "decode_step", "core gpu tests", "device-versions tests"]
    assert all((out / s["log"]).is_file() for s in record["steps"])
    trials = json.loads((out / "vs_trl.json").read_text())
    assert sorted(trials["results"]) == ["dfpo-recompute", "dfpo-sampler", "trl"]
    assert all(r["decode_graph"] for side in ("dfpo-sampler", "dfpo-recompute") for r in trials["results"][side])
    assert "torch 2.11.0" in trials["versions"] and "transformers 5.17.0" in trials["versions"]
    (graph_row,) = [x.split() for x in (out / "decode_step.log").read_text().splitlines() if x.startswith("static+graph")]
    assert graph_row[4] == "1"  # one compiled step for the short and the long rollout
