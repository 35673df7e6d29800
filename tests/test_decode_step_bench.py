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
