"""rollout.engine = "vllm": the sampling-parameter mapping and the refusal without vLLM (here, no vLLM needed),
and the engine end to end in the separate vLLM environment (scripts/vllm_env.sh) when it exists."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.sampler import SamplingParams
from dfpo.trainer.vllm_engine import check_vllm_available, vllm_sampling_kwargs

ROOT = Path(__file__).resolve().parents[2]


def _vllm_python() -> str | None:
    """The vLLM environment's python: $DFPO_VLLM_PYTHON, else .venv-vllm of the repository."""
    candidate = os.environ.get("DFPO_VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    return str(Path(candidate).absolute()) if Path(candidate).exists() else None  # absolute, not resolved: a venv python is a symlink


def test_sampling_parameters_map_one_to_one():
    kw = vllm_sampling_kwargs(SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, top_k=0), 8, {2, 5}, seed=11)
    assert kw == {
        "n": 8,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 16,
        "stop_token_ids": [2, 5],
        "logprobs": 0,
        "seed": 11,
    }
    assert vllm_sampling_kwargs(SamplingParams(max_new_tokens=4, top_k=20), 2, {1}, None)["top_k"] == 20


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this environment")
def test_greedy_decoding_is_vllms_temperature_zero():
    """ReMax's baseline completion (SamplingParams.greedy) asks vLLM for temperature 0 and no truncation."""
    from dfpo.trainer.sampler import greedy_params

    kw = vllm_sampling_kwargs(greedy_params(6), 1, {2}, seed=None)
    assert (kw["temperature"], kw["top_p"], kw["top_k"], kw["max_tokens"], kw["n"]) == (0.0, 1.0, -1, 6, 1)


def test_asking_for_vllm_without_it_fails_before_any_work_naming_what_to_install(tmp_path):
    with pytest.raises(ValueError, match="needs vLLM in this environment.*scripts/vllm_env.sh"):
        check_vllm_available("cpu")
    from test_llm_e2e import tiny_config

    from dfpo.trainer.train import Trainer

    with pytest.raises(ValueError, match="needs vLLM"):
        Trainer(tiny_config(tmp_path, "rollout.engine=vllm"), quiet=True)
    assert not (tmp_path / "run").exists()  # nothing left behind


def test_an_unsupported_device_is_refused():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the device check runs after the install check")
    with pytest.raises(ValueError, match="runs on cuda or cpu"):
        check_vllm_available("mps")


@pytest.mark.slow
def test_vllm_engine_end_to_end_in_its_environment(tmp_path):
    """In the vLLM environment: sampler log-probs equal the HF model's (1e-4), a weight sync makes the next
    rollout sample from the updated weights, and two training steps with rollout.engine = "vllm" log rewards
    and a sampler / trainer mismatch below 1e-4."""
    python = _vllm_python()
    if python is None:
        pytest.skip("no vLLM environment: build it with scripts/vllm_env.sh (or set DFPO_VLLM_PYTHON)")
    smoke = subprocess.run([python, str(ROOT / "scripts" / "vllm_smoke.py")], capture_output=True, text=True, timeout=900)
    assert smoke.returncode == 0 and "vllm smoke: ok" in smoke.stdout, smoke.stdout[-2000:] + smoke.stderr[-2000:]
    run = tmp_path / "run"
    sets = [
        "rollout.engine=vllm",
        "model.tiny_hidden=128",
        "model.tiny_heads=2",
        "train.steps=2",
        "eval.every=0",
        f"run_dir={run}",
        "log.progress=false",
        "log.tensorboard=false",
    ]
    cmd = [python, "-m", "dfpo", "train", "--config", str(ROOT / "configs" / "tiny-cpu.toml"), "--quiet"] + [
        a for s in sets for a in ("--set", s)
    ]
    train = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(line) for line in (run / RunDir.METRICS).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 0 <= r["reward/mean"] <= 2 and r["rollout/logp_gap_max"] < 1e-4
