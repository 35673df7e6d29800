"""DFPOGRPOTrainer under ``accelerate launch`` with two CPU processes (gloo): how TRL's sampler and accelerate's
sharding hand groups to processes, a 2-process run whose every loss call on every rank held whole groups
(recorded by each rank, not assumed), and the refusal of a per-device batch that would split groups."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from accelerate.data_loader import BatchSamplerShard  # noqa: E402
from torch.utils.data import BatchSampler  # noqa: E402
from trl.trainer.utils import RepeatSampler  # noqa: E402

G = 4
SCRIPT = Path(__file__).resolve().with_name("trl_two_process_script.py")


def _process_rows(per_device: int, steps_per_generation: int, processes: int, n_prompts: int = 16) -> list[list[list[int]]]:
    """The prompt index of every row of every generation batch each process gets, as TRL 1.16 builds them:
    each process's own RepeatSampler (same seed: the same order on every process; each prompt ``G`` times in a
    row, each generation batch ``steps_per_generation`` times) batched by the process's data loader
    (per_device x steps_per_generation rows), then accelerate's BatchSamplerShard (batch i to process i % processes)."""

    def shard(process: int) -> list[list[int]]:
        sampler = RepeatSampler(
            list(range(n_prompts)), mini_repeat_count=G, batch_size=per_device * steps_per_generation * processes // G,
            repeat_count=steps_per_generation, seed=0,
        )  # fmt: skip
        batches = BatchSampler(sampler, batch_size=per_device * steps_per_generation, drop_last=False)
        return list(BatchSamplerShard(batches, num_processes=processes, process_index=process))

    return [shard(p) for p in range(processes)]


def _split_groups(rows: list[int]) -> bool:
    """Whether some block of G consecutive rows holds more than one prompt, or the rows are not whole blocks."""
    return len(rows) % G != 0 or any(len(set(rows[i : i + G])) != 1 for i in range(0, len(rows), G))


def test_trl_gives_each_process_whole_groups_only_when_its_batch_is_a_multiple_of_the_group():
    """per_device 8, 4 generations: every process's generation batch is whole groups. per_device 2 (TRL accepts
    it: the global batch 2 x 2 is a multiple of 4) gives each process half of every group."""
    whole = _process_rows(per_device=8, steps_per_generation=2, processes=2)
    assert all(not _split_groups(batch) for per_process in whole for batch in per_process)
    assert not set(whole[0][0]) & set(whole[1][0])  # the processes hold different prompts
    halves = _process_rows(per_device=2, steps_per_generation=1, processes=2)
    assert all(_split_groups(batch) for per_process in halves for batch in per_process)
    assert all(a == b and len(set(a)) == 1 for a, b in zip(*halves))  # 2 rows of one prompt on each process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(script: Path, *script_args: str) -> subprocess.CompletedProcess:
    """``script`` under ``accelerate launch`` with two processes: torchrun ranks that take the CPU and gloo
    because the script's GRPOConfig has use_cpu=True (accelerate's ``--cpu`` flag starts one process only)."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        str(script), *script_args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def _check_call(call: dict) -> None:
    """One loss call: every group has G rows, its rows share one prompt, and their advantages sum to 0 (TRL
    normalised these G rows together, so TRL's group is the group dfpo's loss saw)."""
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(call["group_ids"]):
        rows.setdefault(g, []).append(i)
    for members in rows.values():
        assert len(members) == G
        assert len({tuple(call["prompts"][i]) for i in members}) == 1
        assert abs(sum(call["advantages"][i] for i in members)) < 1e-4


def test_two_processes_keep_groups_whole_in_every_loss_call_and_log_dfpo_metrics(tmp_path):
    out = _launch(SCRIPT, "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2] and all(r["distributed_type"].endswith("MULTI_CPU") for r in ranks)
    for r in ranks:  # 2 optimiser steps x 2 accumulation steps = 4 loss calls, each 8 rows = 2 groups of 4
        assert r["groups_seen"] == [[G, G]] * 4  # the check's own record: it ran in every loss call of this rank
        assert len(r["calls"]) == 4
        for call in r["calls"]:
            _check_call(call)
    for a, b in zip(ranks[0]["calls"], ranks[1]["calls"]):  # the same loss call on both ranks: different groups
        assert a["step"] == b["step"] and not set(a["group_ids"]) & set(b["group_ids"])
        assert not {tuple(p) for p in a["prompts"]} & {tuple(p) for p in b["prompts"]}
    logged = {k for row in ranks[0]["log_history"] for k in row}
    assert {"dfpo/weights/asym", "dfpo/clip/frac_high", "dfpo/loss/policy", "reward"} <= logged
    dfpo_logs = [[{k: v for k, v in row.items() if k.startswith("dfpo/")} for row in r["log_history"]] for r in ranks]
    assert dfpo_logs[0] == dfpo_logs[1]  # gathered over the ranks, whose groups differ


def test_two_processes_move_the_adaptive_entropy_coefficient_from_every_ranks_tokens(tmp_path):
    """Skywork-OR1's coefficient under 2 processes x 2 accumulation steps: each optimiser step's measured entropy is
    -mean log pi_old over the real tokens of all four loss calls (both ranks), every rank logs and keeps the same state,
    and the sequence is dfpo's update rule on the logged entropies."""
    from dfpo import resolve_objective
    from dfpo.core.loss.adaptive_entropy import initial_entropy_control, next_entropy_control

    objective = "dapo:entropy_target=100.0:entropy_coef_delta=0.01:entropy_coef_max=1.0"
    out = _launch(SCRIPT, "--out", str(tmp_path), "--objective", objective, "--steps", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    keys = ("dfpo/entropy/coef", "dfpo/entropy/controlled")
    rows = [[{k: row[k] for k in keys} for row in r["log_history"] if keys[0] in row] for r in ranks]
    assert len(rows[0]) == 3 and rows[0] == rows[1]  # the same numbers on both ranks
    assert ranks[0]["entropy_control"] == ranks[1]["entropy_control"]
    for step, row in enumerate(rows[0]):
        calls = [c for r in ranks for c in r["entropy_calls"] if c["step"] == step]
        assert len(calls) == 4  # 2 accumulation steps on each of 2 ranks
        pooled = sum(c["entropy"] * c["tokens"] for c in calls) / sum(c["tokens"] for c in calls)
        assert row["dfpo/entropy/controlled"] == pytest.approx(pooled, rel=1e-12)
        assert len({c["entropy"] for c in calls}) > 1  # the calls measure different entropies: pooling is tested
    spec = resolve_objective("dapo", entropy_target=100.0, entropy_coef_delta=0.01, entropy_coef_max=1.0)
    state = initial_entropy_control(spec)
    for row in rows[0]:
        assert row["dfpo/entropy/coef"] == state.coef_in_loss
        state = next_entropy_control(state, row["dfpo/entropy/controlled"], spec)
    assert ranks[0]["entropy_control"]["attributes"] == {"coef": state.coef, "enabled": state.enabled}


@pytest.mark.slow
def test_the_example_runs_on_two_processes():
    """examples/trl_dfpo.py under the accelerate command its docstring gives: exits 0, prints once."""
    example = Path(__file__).resolve().parents[2] / "examples" / "trl_dfpo.py"
    out = _launch(example, "--steps", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("step 1:") == 1 and "dfpo/weights/asym" in out.stdout


def test_two_processes_refuse_a_per_device_batch_that_splits_groups(tmp_path):
    """TRL accepts per_device_train_batch_size=2 with 4 generations on 2 processes (global batch 4); each process
    would hold half of every group, so DFPOGRPOTrainer refuses it, naming the setting."""
    out = _launch(SCRIPT, "--out", str(tmp_path), "--per-device", "2", "--steps-per-generation", "1")
    assert out.returncode != 0
    assert "per_device_train_batch_size=2 must be a multiple of num_generations=4" in out.stderr
    assert "(2 process(es))" in out.stderr
