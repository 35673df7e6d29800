"""benchmarks/decode_step.py: its counts on a CPU, and its refusals as one line each."""

import pytest
from script_modules import load_script

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/decode_step.py", "decode_step_bench")


def test_the_cpu_counts_show_one_read_per_sync_interval(bench, capsys):
    """The static loop reads back once every 16 steps (1/16 a step); the dynamic one, which drops rows at once, reads at
    every step."""
    assert bench.main(["--rows", "3", "--prompt-len", "4", "--short", "2", "--long", "34"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[2:]}
    assert float(rows["static"][0]) == pytest.approx(2 / 32, abs=1e-3)
    assert 1 <= float(rows["dynamic"][0]) <= 2


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--short", "8", "--long", "8"], "need 1 <= --short < --long"),
        (["--modes", "static+graph"], "--modes static+graph captures a CUDA graph: it needs --device cuda"),
    ],
)
def test_bad_arguments_are_one_line(bench, capsys, argv, words):
    with pytest.raises(SystemExit) as stop:
        bench.main(argv)
    assert stop.value.code == 2 and words in capsys.readouterr().err


def test_the_floor_counts_each_weight_once_and_the_kv_cache_at_the_mean_length(bench):
    import torch

    model = bench.build("tiny", "cpu")
    params = sum(p.numel() for p in model.parameters())
    c = model.config
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4 * (10 + 20 / 2) * 2
    assert bench.floor_ms(model, rows=4, prompt_len=10, long=20, amp=torch.bfloat16, bandwidth=1e9) == pytest.approx(
        (2 * params + kv) / 1e9 * 1e3
    )


def test_with_the_cuda_defaults_the_two_rollouts_share_one_compiled_step(bench, capsys, monkeypatch):
    """DFPO_CUDA_DEFAULTS=1 rehearses the CUDA run on the CPU: static+graph (compiled with aot_eager, bf16 autocast)
    compiles one decode step for its short and its long rollout, and reads back once a sync interval."""
    import torch._dynamo

    monkeypatch.setenv("DFPO_CUDA_DEFAULTS", "1")
    torch._dynamo.reset()
    assert bench.main(["--rows", "3", "--prompt-len", "4", "--short", "2", "--long", "34", "--modes", "static+graph"]) == 0
    out = capsys.readouterr().out
    assert "autocast torch.bfloat16" in out.splitlines()[0]
    (row,) = [line.split() for line in out.splitlines() if line.startswith("static+graph")]
    assert float(row[1]) == pytest.approx(2 / 32, abs=1e-3) and row[4] == "1" and "failed" not in out


def test_rollouts_that_would_need_two_caches_are_refused_before_any_work(bench, capsys, monkeypatch):
    monkeypatch.setenv("DFPO_CUDA_DEFAULTS", "1")
    with pytest.raises(SystemExit) as stop:
        bench.main(["--prompt-len", "60", "--short", "2", "--long", "10"])
    assert stop.value.code == 2
    assert "needs caches of 64 and 128 columns, so the decode step would compile twice; keep --prompt-len + --long within 64" in (
        capsys.readouterr().err
    )
