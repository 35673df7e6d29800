"""benchmarks/fused_head.py runs every mode it names at a tiny size and skips Liger or the full logits saying why."""

from __future__ import annotations

import pathlib
import statistics
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from script_modules import load_script

import dfpo.core.fused

PATH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "fused_head.py"


@pytest.fixture(scope="module")
def bench():
    return load_script(PATH, "fused_head_bench")


@pytest.mark.parametrize("mode", ["floor", "floor_softmax", "floor_autograd", "naive", "chunked", "fused", "fused_once", "fused_per_unit"])
def test_every_local_mode_measures_a_tiny_case(bench, mode):
    for objective in bench.OBJECTIVE_ROWS[mode]:
        out = bench.measure(mode, objective, 8, 4, 16, 64, repeats=1, threads=1)
        assert out["seconds"] >= 0 and out["wall"] >= 0 and out["extra_mib"] == out["extra_mib"]
        if mode in ("fused", "fused_per_unit"):
            assert out["two_pass"] == 0.0  # a tiny batch fits the logits budget: one pass
        if mode == "fused_once":
            assert out["two_pass"] == 1.0  # solved once: every block twice


def test_full_logits_past_the_memory_are_skipped_saying_how_many_gib_they_need(bench):
    reason = bench._skip_reason("naive", 8, 2048, 151936, 20.0)
    assert reason == "needs about 37.1 GiB (4 (N, V) float32 tensors of 9.3 GiB) > 20.0 GiB of memory available (--max-gib)"
    assert bench._skip_reason("floor_autograd", 8, 2048, 32768, 20.0) is None  # 2 x 2.0 GiB fit
    for mode in ("floor", "chunked", "fused", "fused_compiled"):  # no (N, V) tensor: never skipped for memory
        assert bench._skip_reason(mode, 8, 2048, 151936, 0.0) is None
    assert 0 < bench.available_gib()


def test_a_subset_of_modes_and_objectives_runs_and_bad_counts_are_refused(bench, capsys):
    argv = ["--sizes", "2x4", "--vocab", "64", "--hidden", "16", "--rounds", "1", "--modes", "floor", "fused", "--objectives", "gspo"]
    bench.main([*argv, "--chunk", "3"])
    out = capsys.readouterr().out
    assert "chunked and fused blocks of 3 positions (fused_policy_loss's default at H=16: 256; the floor's: 1024)" in out
    assert "fused            gspo" in out and "fused            grpo" not in out and "floor            -" in out
    assert "blocks of 3 positions:" not in out  # one block size: the goals as before
    assert "goal fused gspo <= 1.05x floor:" in out and "goal fused grpo <= 1.05x floor: not measured" in out
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    for chunks in (["0"], ["4", "4"]):
        with pytest.raises(SystemExit):
            bench.main(["--chunk", *chunks])
        assert f"--chunk values must be distinct and at least 1, got {[int(c) for c in chunks]}" in capsys.readouterr().err


def test_the_default_block_is_decided_by_fused_policy_loss_own_rule_for_the_head_it_makes(bench, capsys, monkeypatch):
    """A bf16 head on the CPU keeps whole blocks (512 at H = 512); where fused's rule calls a head half precision
    off the CPU (as on a GPU), the header's default is 3/4 of H: the benchmark asks that rule, not a copy of it."""
    from dfpo.core import fused

    argv = ["--sizes", "2x4", "--vocab", "64", "--hidden", "512", "--rounds", "1", "--modes", "floor", "--dtype", "bfloat16"]
    bench.main(argv)
    assert "(fused_policy_loss's default at H=512: 512;" in capsys.readouterr().out
    seen = []
    monkeypatch.setattr(fused, "_half_precision_off_cpu", lambda w: seen.append((w.dtype, w.device.type)) or True)
    bench.main(argv)
    assert "(fused_policy_loss's default at H=512: 384;" in capsys.readouterr().out and seen == [(torch.bfloat16, "cpu")]


def test_without_chunk_the_fused_rows_run_the_fused_default_block(bench, capsys):
    """No --chunk: the block is fused_policy_loss's default at --hidden (here 512 positions at H = 512)."""
    argv = ["--sizes", "2x4", "--vocab", "64", "--hidden", "512", "--rounds", "1", "--modes", "floor", "fused", "--objectives", "grpo"]
    bench.main(argv)
    out = capsys.readouterr().out
    assert "chunked and fused blocks of 512 positions (fused_policy_loss's default at H=512: 512; the floor's: 1024)" in out
    assert "fused            grpo        512 |" in out


def test_several_block_sizes_run_side_by_side_with_the_goals_at_each(bench, capsys):
    """--chunk 3 5: the fused rows at both blocks in the same rounds, one floor, the goals read at each block."""
    argv = ["--sizes", "2x4", "--vocab", "64", "--hidden", "16", "--rounds", "1", "--modes", "floor", "fused", "--objectives", "grpo"]
    bench.main([*argv, "--chunk", "3", "5"])
    out = capsys.readouterr().out
    assert "chunked and fused blocks of 3, 5 positions" in out
    assert "fused            grpo          3 |" in out and "fused            grpo          5 |" in out
    assert out.count("floor            -             - |") == 1
    assert "blocks of 3 positions:" in out and "blocks of 5 positions:" in out
    assert out.count("goal fused grpo <= 1.05x floor:") == 2


def test_the_goals_are_read_off_the_table_and_a_missing_row_never_passes(bench):
    rows = {
        ("fused", "grpo"): {"x_floor": 1.04, "extra_mib": 100.0},
        ("liger_compiled", "grpo"): {"x_floor": 1.10, "extra_mib": 200.0},
        ("fused", "gspo"): {"x_floor": 1.20, "extra_mib": 100.0},
    }
    lines = bench.goal_lines(rows)
    assert "goal fused grpo <= 1.05x floor: 1.04x, met" in lines
    assert "goal fused grpo faster than liger_compiled, in less memory: time 0.95x, extra memory 0.50x, met" in lines
    assert "goal fused gspo <= 1.05x floor: 1.20x, missed" in lines
    assert "goal fused gspo faster than liger_compiled, in less memory: no liger_compiled row" in lines
    assert "goal fused_compiled dfpo_min <= 1.05x floor: not measured" in lines
    assert not any("fused_once" in line or "fused_per_unit" in line for line in lines)  # optional rows: silent when absent
    assert "goal fused grpo faster than liger_compiled, in less memory: Liger has no dfpo_min" not in lines
    assert "goal fused dfpo_min faster than liger_compiled, in less memory: Liger has no dfpo_min" not in lines  # no row
    rows[("fused_once", "grpo")] = {"x_floor": 1.30, "extra_mib": 150.0}
    lines = bench.goal_lines(rows)
    assert "goal fused_once grpo <= 1.05x floor: 1.30x, missed" in lines
    assert "goal fused_once grpo faster than liger_compiled, in less memory: time 1.18x, extra memory 0.75x, missed" in lines


def test_the_goals_name_only_the_modes_a_run_asked_for_and_what_liger_lacks(bench):
    """A run of --modes floor fused_once liger_compiled prints no "not measured" line for fused or fused_compiled, and
    dfpo_min's comparison with Liger says Liger has no such objective rather than that a row is missing."""
    rows = {
        ("fused_once", "dfpo_min"): {"x_floor": 1.5, "extra_mib": 100.0},
        ("liger_compiled", "grpo"): {"x_floor": 2.0, "extra_mib": 200.0},
    }
    lines = bench.goal_lines(rows, ["floor", "fused_once", "liger_compiled"])
    assert not any(line.startswith(("goal fused ", "goal fused_compiled ")) for line in lines)
    assert "goal fused_once dfpo_min faster than liger_compiled, in less memory: Liger has no dfpo_min" in lines
    assert "goal fused_once dfpo_min <= 1.05x floor: 1.50x, missed" in lines
    assert bench.goal_lines({}, ["floor", "fused"]).count("goal fused grpo <= 1.05x floor: not measured") == 1


@pytest.mark.parametrize(
    "rounds, reading",
    [
        ([1.01, 1.03], "1.02x, met (2 rounds: the median's 50% interval 1.010x to 1.030x)"),
        ([1.06, 1.08], "1.07x, missed (2 rounds: the median's 50% interval 1.060x to 1.080x)"),
        ([1.02, 1.08], "1.05x, inconclusive (2 rounds: the median's 50% interval 1.020x to 1.080x)"),
        ([], "1.04x, met"),  # no paired round (a failed floor): the ratio of the medians decides, as with one round
    ],
    ids=["every round within", "no round within", "rounds on both sides", "no rounds"],
)
def test_below_six_rounds_a_time_goal_is_decided_only_where_every_round_agrees(bench, rounds, reading):
    """The goal's figure is the rounds' median, inside the interval its verdict reads (the table's ratio of the medians,
    1.04x here, only where no round paired); met, missed or inconclusive by where the rounds fall against 1.05x."""
    lines = bench.goal_lines({("fused", "grpo"): {"x_floor": 1.04, "extra_mib": 1.0, "rounds": rounds}})
    assert f"goal fused grpo <= 1.05x floor: {reading}" in lines


@pytest.mark.parametrize("n", range(1, 13))
def test_the_median_coverage_is_the_share_of_sign_patterns_whose_kth_order_statistics_enclose_the_median(bench, n):
    """Each of n draws falls below the median with chance 1/2: the interval [x_(k), x_(n+1-k)] encloses it unless
    fewer than k fall on one side, counted over all 2^n sign patterns."""
    import itertools

    for k in range(1, (n + 1) // 2 + 1):
        enclosed = sum(k <= sum(below) <= n - k for below in itertools.product((0, 1), repeat=n))
        assert bench.median_coverage(n, k) == pytest.approx(enclosed / 2**n)


def test_the_median_interval_takes_the_innermost_order_statistics_that_reach_the_confidence(bench):
    for n in range(1, 60):
        xs = [float(i) for i in range(n)]
        low, high, coverage = bench.median_interval(xs[::-1])
        k = int(low) + 1
        assert high == n - k and low <= statistics.median(xs) <= high
        if n < 6:  # no k reaches 95%: every round's range, whose coverage is 1 - 2^(1-n)
            assert (low, high) == (0.0, n - 1.0) and coverage == pytest.approx(1 - 2 ** (1 - n)) and coverage < 0.95
        else:
            assert coverage >= 0.95 > bench.median_coverage(n, k + 1) and (k > 1) == (n >= 9)


@given(
    inside=st.lists(st.floats(0.95, 1.049), min_size=8, max_size=30),
    outside=st.floats(1.06, 2.0),
    seed=st.randoms(use_true_random=False),
)
def test_from_nine_rounds_one_slow_round_no_longer_undecides_a_goal_the_others_meet(bench, inside, outside, seed):
    """The goal is read off the interval of the rounds' median, the same in any order of the rounds; one round past
    1.05x among eight or more within it leaves the goal met (every round had to agree before)."""
    rounds = [*inside, outside]
    seed.shuffle(rounds)
    assert bench.floor_verdict(1.0, rounds).startswith("met (")
    assert bench.floor_verdict(1.0, rounds) == bench.floor_verdict(1.0, sorted(rounds))


def test_the_median_interval_covers_a_skewed_distributions_median_as_often_as_it_says(bench):
    """Rounds drawn from a lognormal (a machine's slow rounds make a long right tail): over 4000 runs of 9 and of 20
    rounds, the interval encloses the true median at least as often as its stated coverage, less sampling error."""
    import numpy as np

    rng = np.random.default_rng(0)
    for n in (9, 20):
        draws = np.exp(rng.normal(0.03, 0.04, size=(4000, n)))  # true median exp(0.03)
        hits = []
        for row in draws:
            low, high, coverage = bench.median_interval(row.tolist())
            hits.append(low <= np.exp(0.03) <= high)
        assert np.mean(hits) >= coverage - 3 * (coverage * (1 - coverage) / 4000) ** 0.5


def test_where_the_autograd_floor_ran_the_goal_is_also_read_against_it_round_by_round(bench):
    """The issue's table is against h @ W.T forward + backward by autograd: where that row ran, each mode's goal is
    also read against it, each round's seconds over the autograd floor's in the same round (failed rounds left out)."""
    rows = {
        ("fused", "grpo"): {"x_floor": 1.04, "extra_mib": 1.0, "rounds": [1.04, 1.03, 1.05], "by_round": [2.0, None, 2.2, 2.1]},
        ("floor_autograd", None): {"x_floor": 1.10, "extra_mib": 1.0, "by_round": [2.5, 2.4, None, 1.9]},
    }
    lines = bench.goal_lines(rows, ["floor", "floor_autograd", "fused"])
    issue = "goal fused grpo <= 1.05x the issue's floor (h @ W.T, forward + backward, by autograd): 0.95x, "
    assert issue + "inconclusive (2 rounds: the median's 50% interval 0.800x to 1.105x)" in lines
    del rows[("floor_autograd", None)]
    assert not any("the issue's floor" in line for line in bench.goal_lines(rows))


def test_each_round_is_read_against_the_floor_of_its_own_round(bench):
    """A round where the mode or the floor failed (None) is left out; the others pair by position."""
    assert bench.paired_ratios([2.0, None, 3.3], [2.0, 1.0, 3.0]) == pytest.approx([1.0, 1.1])
    assert bench.paired_ratios([2.0, 2.2], [None, 2.0]) == pytest.approx([1.1])


def test_the_run_comparison_reports_the_largest_relative_difference_and_one_sided_nan():
    runs = load_script(PATH.with_name("fused_head_runs.py"))
    a = [{"loss": 1.0, "x": 4.0, "n": float("nan"), "wall_s": 1.0}, {"loss": 2.0, "x": 0.5, "n": 1.0, "only": 1}]
    b = [{"loss": 1.0, "x": 2.0, "n": float("nan"), "wall_s": 9.0}, {"loss": 2.0, "x": 0.25, "n": float("nan")}]
    worst, one_side = runs.largest_differences(a, b)
    assert worst == {"loss": 0.0, "x": 0.5, "n": float("inf")}  # |4 - 2| / 4; timings left out
    assert one_side == {"only"}


def test_the_split_timing_prints_every_part_of_each_objectives_step(capsys):
    split = load_script(PATH.with_name("fused_head_split.py"))
    split.main(["--size", "2x8", "--vocab", "64", "--hidden", "16", "--rounds", "1", "--objectives", "grpo", "dfpo_min", "--floors", "floor", "floor_autograd"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert "coefficients" in lines[1] and "rounds x floor" in lines[1]
    assert lines[2].startswith("floor          -") and lines[3].startswith("floor_autograd -")
    assert lines[4].startswith("floor_softmax  -")
    rows, reach, goals = lines[5:7], lines[7], lines[8:]
    assert [line.split()[1] for line in rows] == ["grpo", "dfpo_min"] and all(len(line.split()) == 12 for line in rows)
    assert reach.startswith("reach floor_softmax <= 1.05x floor, in one process: ")
    floors = ("floor", "the issue's floor (h @ W.T, forward + backward, by autograd)")
    assert [g.split(", in one process")[0] for g in goals] == [f"goal fused {o} <= 1.05x {f}" for o in ("grpo", "dfpo_min") for f in floors]
    assert all(g.split("in one process: ")[1].split(", ")[1].split(" ")[0] in ("met", "missed", "inconclusive") for g in goals)


def test_the_split_timing_reads_the_issues_floor_only_where_asked_and_where_its_logits_fit(capsys, monkeypatch):
    """By default (--floors floor) the autograd floor, whose fresh (N, V) tensors slow the other cases of the process,
    is left out silently; asked for, where its (N, V) logits exceed the memory available it is left out saying how
    much it would need, and the goal is read against the floor alone."""
    split = load_script(PATH.with_name("fused_head_split.py"))
    argv = ["--size", "2x8", "--vocab", "64", "--hidden", "16", "--rounds", "1", "--objectives", "grpo"]
    split.main(argv)
    out = capsys.readouterr().out
    assert "floor_autograd" not in out and out.count("goal fused grpo <= 1.05x floor, in one process") == 1
    import fused_head

    monkeypatch.setattr(fused_head, "available_gib", lambda device="cpu": 0.0)
    split.main([*argv, "--floors", "floor", "floor_autograd"])
    out = capsys.readouterr().out
    assert "floor_autograd left out: needs about 0.0 GiB (2 (N, V) float32 tensors of 0.0 GiB) > 0.0 GiB" in out
    assert "issue's floor" not in out and out.count("goal fused grpo <= 1.05x floor, in one process") == 1


def test_the_split_timing_reads_the_current_step_against_an_earlier_revision_in_the_same_rounds(capsys):
    """--before REV times the fused path as git shows it at REV (the package core/fused/, materialised file by file)
    beside today's, objective by objective, and reads today's against it off the paired rounds; a revision git cannot
    show is refused in one sentence before any timing."""
    split = load_script(PATH.with_name("fused_head_split.py"))
    split.main(["--size", "2x8", "--vocab", "64", "--hidden", "16", "--rounds", "2", "--objectives", "grpo", "--before", "HEAD"])
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.startswith("fused_before"))
    assert row.split()[1] == "grpo" and row.split()[-5:] == ["-"] * 5
    assert lines[-1].startswith("now against before fused grpo (core/fused/ at HEAD), in one process: ")
    before = sys.modules["dfpo.core._fused_before"]
    assert before.fused_policy_loss is not dfpo.core.fused.fused_policy_loss and hasattr(before, "__path__")  # a package
    assert sys.modules["dfpo.core._fused_before.head"].fused_head_loss is before.fused_head_loss  # its own parts, not today's
    with pytest.raises(SystemExit, match="--before 'no-such-rev': git cannot show core/fused.py at that revision .*name a commit"):
        split.main(["--before", "no-such-rev"])


def test_the_split_timing_reads_a_revision_from_before_the_package_from_its_single_file(capsys):
    """A revision from before core/fused/ was a package (the parent of the commit that removed core/fused.py) is read
    from the single file core/fused.py, named so in the verdict line; a revision whose fused path does not import
    against today's package would be refused in one sentence, not a traceback."""
    root = PATH.parents[1]
    last = subprocess.run(["git", "rev-list", "-1", "HEAD", "--", "core/fused.py"], cwd=root, capture_output=True, text=True)
    if last.returncode != 0 or not last.stdout.strip():
        pytest.skip(f"no git history with core/fused.py here ({last.stderr.strip() or 'no such commit'})")
    rev = last.stdout.strip()[:12] + "^"  # the split removed core/fused.py: its parent has the single file
    split = load_script(PATH.with_name("fused_head_split.py"))
    split.main(["--size", "2x8", "--vocab", "64", "--hidden", "16", "--rounds", "2", "--objectives", "grpo", "--before", rev])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(f"now against before fused grpo (core/fused.py at {rev}), in one process: ")
    before = sys.modules["dfpo.core._fused_before"]
    assert not hasattr(before, "__path__") and before.fused_policy_loss is not dfpo.core.fused.fused_policy_loss
    assert not [name for name in sys.modules if name.startswith("dfpo.core._fused_before.")]  # no part of an earlier load left


@pytest.mark.parametrize(
    ("rounds", "said"),
    [([0.97, 0.98, 0.99] * 3, "faster"), ([1.01, 1.02, 1.03] * 3, "slower"), ([0.98, 1.0, 1.02] * 3, "not shown either way")],
)
def test_the_step_against_its_earlier_code_is_decided_only_where_the_medians_interval_is_on_one_side_of_one(rounds, said):
    split = load_script(PATH.with_name("fused_head_split.py"))
    line = split.before_line("grpo", "abc123", rounds)
    assert f", {said} (9 rounds: the median's" in line and "core/fused.py at abc123" in line


def test_the_fused_budget_is_fused_policy_loss_default_and_max_logits_mib_reaches_the_fused_rows(bench, capsys):
    """--max-logits-mib 0: DFPO's Min-Replace group of two (2 x 4 positions, blocks of 3) no longer fits and is scaled
    whole, summed in W's gradient as its completions come (it is held at the default budget); a negative budget is
    refused in one sentence."""
    import inspect

    from dfpo.core.fused import fused_policy_loss

    assert bench.BUDGET_MIB == inspect.signature(fused_policy_loss).parameters["max_logits_mib"].default
    argv = ["--sizes", "2x4", "--vocab", "64", "--hidden", "16", "--rounds", "1", "--modes", "floor", "fused", "--chunk", "3"]
    for budget, shares in (("2048", ["0.00", "0.00"]), ("0", ["0.00", "1.00"])):
        bench.main([*argv, "--objectives", "dfpo_min", "--max-logits-mib", budget])
        out = capsys.readouterr().out
        assert f"fused max_logits_mib {budget};" in out
        row = next(line for line in out.splitlines() if line.startswith("fused            dfpo_min"))
        assert row.split()[-2:] == shares  # two_pass, scaled
    with pytest.raises(SystemExit):
        bench.main(["--max-logits-mib", "-1"])
    assert "--max-logits-mib must be a number >= 0, got -1.0" in capsys.readouterr().err


def test_cuda_is_refused_in_one_sentence_where_torch_sees_no_gpu(bench, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: nothing to refuse")
    with pytest.raises(SystemExit):
        bench.main(["--device", "cuda"])
    assert "--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)" in capsys.readouterr().err


def _split_log(seed: int, goals: list[str]) -> list[str]:
    head = f"B x T = 2 x 8, V = 64, H = 16; fused blocks of 256 positions, the floor's 1024; one process, one thread, median of 9 interleaved rounds; input set {seed}; CPU s"  # fmt: skip
    return [head, *goals, ""]


def _goal(objective: str, floor: str, verdict: str, low: float, high: float) -> str:
    return f"goal fused {objective} <= 1.05x {floor}, in one process: 1.030x, {verdict} (9 rounds: the median's 96% interval {low:.3f}x to {high:.3f}x)"  # fmt: skip


def test_the_verdicts_of_two_input_sets_agree_or_show_nothing_either_way_and_one_set_is_a_hypothesis():
    """Met (or missed) together only where every input set says so; a goal read on one set is labelled as such; a
    reading run again replaces the earlier one; the issue's floor is named by its mode."""
    verdicts = load_script(PATH.with_name("fused_head_verdicts.py"))
    issue = "the issue's floor (h @ W.T, forward + backward, by autograd)"
    lines = _split_log(0, [_goal("grpo", "floor", "inconclusive", 1.0, 1.06), _goal("gspo", "floor", "met", 1.0, 1.04)])
    lines += _split_log(1, [_goal("grpo", "floor", "met", 1.0, 1.04), _goal("gspo", "floor", "met", 1.0, 1.04)])
    lines += _split_log(0, [_goal("grpo", "floor", "met", 1.0, 1.03), _goal("grpo", issue, "missed", 1.06, 1.07)])
    found = verdicts.readings(lines)
    cells = {seed: reading.cell() for seed, reading in found[("2 x 8", 64, "grpo", "floor")].items()}
    assert cells == {0: "1.030x met [1.000, 1.030], 9 rounds", 1: "1.030x met [1.000, 1.040], 9 rounds"}
    assert [verdicts.together(found[k]) for k in found] == ["met", "met", "one input set: missed"]
    met, missed = verdicts.Reading("1.0", "met", "1", "1", "9"), verdicts.Reading("1.1", "missed", "1", "1", "9")
    assert verdicts.together({0: met, 1: missed}) == "not shown either way"
    rows = verdicts.table(found)
    assert rows[0] == "| size | V | objective | floor | input set 0 | input set 1 | together |"
    assert rows[-1] == "| 2 x 8 | 64 | grpo | floor_autograd | 1.030x missed [1.060, 1.070], 9 rounds | not run | one input set: missed |"


def test_the_verdicts_read_the_before_lines_and_call_them_faster_or_slower_only_where_every_input_set_agrees():
    """The split's --before lines, as it prints them (of core/fused.py or, since the split, of core/fused/), are rows
    against ``before REV``: faster (or slower) together only where every input set says so, a slower reading beside one
    not shown is not shown either way."""
    verdicts = load_script(PATH.with_name("fused_head_verdicts.py"))
    split = load_script(PATH.with_name("fused_head_split.py"))
    faster, slower, unclear = [0.97, 0.98, 0.99] * 3, [1.01, 1.02, 1.03] * 3, [0.98, 1.0, 1.02] * 3
    lines = _split_log(0, [split.before_line("grpo", "abc123", faster), split.before_line("gspo", "abc123", slower)])
    lines += _split_log(1, [split.before_line("grpo", "abc123", faster), split.before_line("gspo", "abc123", unclear, "core/fused/")])
    found = verdicts.readings(lines)
    assert list(found) == [("2 x 8", 64, "grpo", "before abc123"), ("2 x 8", 64, "gspo", "before abc123")]
    assert found[("2 x 8", 64, "gspo", "before abc123")][0].cell() == "1.020x slower [1.010, 1.030], 9 rounds"
    assert [verdicts.together(cells) for cells in found.values()] == ["faster", "not shown either way"]


def test_the_verdicts_refuse_a_missing_log_and_a_log_without_goal_lines_in_one_sentence(tmp_path, capsys):
    verdicts = load_script(PATH.with_name("fused_head_verdicts.py"))
    with pytest.raises(SystemExit):
        verdicts.main([str(tmp_path / "absent.log")])
    assert f"no log at {tmp_path / 'absent.log'}: pass the files" in capsys.readouterr().err
    (tmp_path / "empty.log").write_text("nothing here\n")
    with pytest.raises(SystemExit):
        verdicts.main([str(tmp_path / "empty.log")])
    assert "no goal line of fused_head_split.py in" in capsys.readouterr().err


def test_the_floor_with_a_softmax_backpropagates_the_softmax_of_the_logits_through_the_head(bench):
    """floor_softmax's three matmuls carry p = softmax(h W^T) where the floor's carry the logits themselves."""
    step = bench._step_fn("floor_softmax", None, 2, 3, 8, 16)
    step()
    gh, gw = step.grads
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(2, 3, 8, generator=g) / 8**0.5).reshape(6, 8)  # (N, H): the inputs _step_fn draws first
    w = torch.randn(16, 8, generator=g)  # (V, H)
    p = torch.softmax(h @ w.T, -1)  # (N, V)
    torch.testing.assert_close(gh, p @ w)
    torch.testing.assert_close(gw, p.T @ h)
    floor = bench._step_fn("floor", None, 2, 3, 8, 16)
    floor()
    torch.testing.assert_close(floor.grads[1], (h @ w.T).T @ h)


@pytest.mark.parametrize(
    ("rounds", "verdict", "means"),
    [
        ([1.01] * 9, "met", "; a path that writes the logits to memory can meet the time goal here"),
        ([1.20] * 9, "missed", "; no path that writes the logits to memory and takes PyTorch's softmax over them meets"),
        ([1.01, 1.2] * 5, "inconclusive", None),
    ],
)
def test_the_reach_line_says_what_the_floor_with_a_softmax_means_for_the_goal_only_where_it_is_decided(bench, rounds, verdict, means):
    """Met: a path writing the logits can meet the goal; missed: none built on that softmax can; inconclusive: no claim."""
    rows = {("floor_softmax", None): {"x_floor": statistics.median(rounds), "extra_mib": 0.0, "rounds": rounds}}
    line = bench.goal_lines(rows)[0]
    assert line.startswith("reach floor_softmax <= 1.05x floor: ") and f", {verdict} (" in line
    assert (means in line) if means else ";" not in line
    assert not any(line.startswith("reach") for line in bench.goal_lines({}))  # no floor_softmax row: no claim


def test_the_verdicts_read_the_reach_line_under_its_own_row():
    verdicts = load_script(PATH.with_name("fused_head_verdicts.py"))
    bench = load_script(PATH, "fused_head_reach")
    reach = bench.reach_line(1.02, [1.01] * 9, where=", in one process", digits=3)
    found = verdicts.readings(_split_log(1, [reach]))
    assert found[("2 x 8", 64, "floor_softmax", "floor")][1].cell() == "1.010x met [1.010, 1.010], 9 rounds"  # the rounds' median
