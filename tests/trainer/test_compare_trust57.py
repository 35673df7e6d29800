"""Issue 57 (Trust 5): ``dfpo compare`` reuses a cell only under every setting it was trained with, says how a cell
that trains is getting on, and draws compare.png with a panel for each outcome that has something to draw."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.cli import main
from dfpo.trainer import compare as C
from dfpo.trainer.config import Config, config_to_dict, config_to_toml, load_config
from dfpo.trainer.run.folder import run_identity
from dfpo.trainer.run.layout import RunDir
from dfpo.trainer.run.resume import flat_items

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_compare import _fake_runs, _mark_as, _write_run  # noqa: E402

TINY = "configs/tiny-cpu.toml"


def _plan(tmp_path, sets, out="cmp", seeds=2):
    return C.make_plan("gspo,dfpo_min", None, seeds, 10, TINY, sets, str(tmp_path / out))


def _never_train(monkeypatch):
    """Any cell compare would train fails the test: a refusal must come before anything trains."""

    def train(*args, **kwargs):
        raise AssertionError("compare trained a cell")

    monkeypatch.setattr(C, "run_watched", train)


# ----- a cell is reused only under every setting it was trained with -----


def test_cells_of_a_shorter_run_are_refused_naming_the_length_before_anything_trains(tmp_path, monkeypatch):
    """The issue's case: --set train.steps=5, then train.steps=6 into the same --out. Every cell was 'done before,
    skipped' and the report, headed train.steps=6, was built from 5-step runs; now nothing runs and one sentence names
    the setting and both values."""
    _never_train(monkeypatch)
    _fake_runs(_plan(tmp_path, ["train.steps=5"]))
    longer = _plan(tmp_path, ["train.steps=6"])
    lines = []
    with pytest.raises(ValueError) as err:
        C.compare(longer, progress=lines.append, warn=lambda _: None)
    assert str(err.value) == (
        f"{C.run_dir(longer, 'gspo', 10)} was trained with train.steps=5, this command asks 6: nothing was run or reported; "
        "use another --out for these settings, or run this command with the settings that folder was trained with"
    )
    assert lines == [] and not (longer.out / "compare.md").exists()


def test_the_command_line_refuses_it_in_one_line_with_exit_2(tmp_path, capsys):
    _fake_runs(_plan(tmp_path, ["train.steps=5", "eval.every=5"]))
    argv = ["compare", "--config", TINY, "--objectives", "gspo,dfpo_min", "--seeds", "2", "--first-seed", "10"]
    argv += ["--set", "train.steps=6", "--set", "eval.every=3", "--out", str(tmp_path / "cmp")]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "skipped" not in captured.out and "Traceback" not in captured.err
    (line,) = captured.err.strip().splitlines()
    assert "was trained with eval.every=5, this command asks 3, train.steps=5 where it asks 6: nothing was run" in line


def test_an_unfinished_cell_of_another_length_is_not_resumed(tmp_path, monkeypatch):
    """A cell with a checkpoint and no summary would be resumed with its own config.toml (its own length) and then
    reported under this command's: it is refused as a finished one is."""
    _never_train(monkeypatch)
    plan = _plan(tmp_path, ["train.steps=5"])
    _fake_runs(plan)
    cell = C.run_dir(plan, "dfpo_min", 11)
    RunDir(cell).summary.unlink()
    RunDir(cell).checkpoint.write_bytes(b"ckpt")
    longer = _plan(tmp_path, ["train.steps=6"])
    for label in longer.labels:  # every other cell was trained as this command asks
        for seed in longer.seeds:
            if (label, seed) != ("dfpo_min", 11):
                _mark_as(longer, C.run_dir(longer, label, seed), label, seed)
    with pytest.raises(ValueError, match=r"dfpo_min/seed11 was trained with train.steps=5, this command asks 6"):
        C.compare(longer, progress=lambda _: None, warn=lambda _: None)


def test_a_cell_of_other_code_is_read_under_its_settings_and_refused_under_others(tmp_path, capsys):
    """An experiment other code finished (a pinned worktree's) is still read and reported when this command asks the
    settings its cells were trained with; asked other settings, the settings sentence refuses it (not the mixed-code
    one, which is about training)."""
    plan = _plan(tmp_path, ["train.steps=5"])
    _fake_runs(plan)
    for label in plan.labels:
        for seed in plan.seeds:
            mark_path = RunDir(C.run_dir(plan, label, seed)).mark
            mark = json.loads(mark_path.read_text()) | {"code": [{"dfpo": "0.1.0", "source_sha256": "c" * 64}]}
            mark_path.write_text(json.dumps(mark))
    argv = ["compare", "--config", TINY, "--objectives", "gspo,dfpo_min", "--seeds", "2", "--first-seed", "10", "--out", str(plan.out)]
    assert main([*argv, "--set", "train.steps=5"]) == 0
    assert "Trained by: source cccccccccccc (4 cells)." in capsys.readouterr().out
    assert main([*argv, "--set", "train.steps=6"]) == 2
    assert "was trained with train.steps=5, this command asks 6" in capsys.readouterr().err


def _as_older_dfpo(plan, lacking: str) -> None:
    """Rewrite every cell as a dfpo that had no setting ``lacking`` would have left it: a config.toml without the key
    and a mark whose identity hashes only the keys it had."""
    import tomllib

    import tomli_w

    from dfpo.trainer.run.folder import write_mark

    section, key = lacking.split(".")
    for label in plan.labels:
        for s in plan.seeds:
            path = C.run_dir(plan, label, s)
            config = tomllib.loads((path / RunDir.CONFIG).read_text())
            del config[section][key]
            (path / RunDir.CONFIG).write_text(tomli_w.dumps(config))
            keys = set(flat_items(config))
            write_mark(path, checkpointed=True, identity=run_identity(config_to_dict(C.run_config(plan, label, s)), keys=keys))


def test_cells_of_an_older_dfpo_are_read_where_a_new_setting_keeps_its_default(tmp_path, monkeypatch):
    """A cell trained before eval.greedy existed is the same run as one asked with eval.greedy at its default (false),
    and is refused, naming the setting, when the command asks it on."""
    _never_train(monkeypatch)
    plan = _plan(tmp_path, [], seeds=8)
    _fake_runs(plan)
    _as_older_dfpo(plan, "eval.greedy")
    assert C.compare(plan, progress=lambda _: None, warn=lambda _: None).is_file()
    with pytest.raises(ValueError, match=r"eval\.greedy=\(not set\), this command asks true"):
        C.compare(_plan(tmp_path, ["eval.greedy=true"], seeds=8), progress=lambda _: None, warn=lambda _: None)


def test_a_moved_out_folder_is_reused_its_run_dir_aside(tmp_path):
    """run_dir is where the cell's folder is, not how it trained: an --out moved elsewhere is still reported."""
    elsewhere = _plan(tmp_path, [], out="before-the-move")
    plan = _plan(tmp_path, [])
    _fake_runs(plan)
    for label in plan.labels:
        for seed in plan.seeds:
            RunDir(C.run_dir(plan, label, seed)).config.write_text(config_to_toml(C.run_config(elsewhere, label, seed)))
    assert C.compare(plan, progress=lambda _: None, warn=lambda _: None).is_file()


@pytest.mark.parametrize(
    "damage, message",
    [
        ("missing", r"dfpo_min/seed10 holds a run but no config.toml, so the settings it was trained with are unknown; nothing was run"),
        ("not toml", r"dfpo_min/seed10/config.toml cannot be read as TOML \(.*\), so the settings its run was trained with are unknown"),
        ("not utf-8", r"dfpo_min/seed10/config.toml cannot be read as TOML \(.*not UTF-8.*\), so the settings"),
    ],
)
def test_a_cell_whose_settings_cannot_be_read_is_refused(tmp_path, damage, message):
    plan = _plan(tmp_path, [])
    _fake_runs(plan)
    config = RunDir(C.run_dir(plan, "dfpo_min", 10)).config
    if damage == "missing":
        config.unlink()
    else:
        config.write_bytes(b"seed = [" if damage == "not toml" else b"seed = 10\n\xff\n")
    with pytest.raises(ValueError, match=message):
        C.compare(plan, progress=lambda _: None, warn=lambda _: None)


_FLAT = flat_items(config_to_dict(load_config(TINY)))


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(_FLAT)), new=st.one_of(st.integers(-3, 3), st.text(max_size=3), st.booleans(), st.floats()))
def test_every_setting_but_the_folder_counts(key, new):
    """Invariant: a cell's config differs from the command's exactly in the keys whose values differ, run_dir aside."""
    wanted = dict(_FLAT) | {key: new}
    expected = [] if key in C.PER_CELL_SETTINGS or _FLAT[key] == new else [key]
    assert [k for k, _, _ in C.settings_differences(_FLAT, wanted)] == expected
    lacking = C.settings_differences(_FLAT, {k: v for k, v in _FLAT.items() if k != key})  # a key one side lacks counts
    assert lacking == ([] if key in C.PER_CELL_SETTINGS else [(key, _FLAT[key], C.MISSING)])


_DEFAULTS = flat_items(config_to_dict(Config()))


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(_DEFAULTS)), new=st.one_of(st.integers(-3, 3), st.text(max_size=3), st.booleans()))
def test_a_setting_added_after_the_cell_counts_only_at_its_default(key, new):
    """Invariant: a setting a cell's config lacks (added to dfpo later) matches only where the command asks its default."""
    stored = {k: v for k, v in _DEFAULTS.items() if k != key}
    asked = C.settings_differences(stored, dict(_DEFAULTS), _DEFAULTS)
    assert asked == []
    other = C.settings_differences(stored, dict(_DEFAULTS) | {key: new}, _DEFAULTS)
    assert other == ([] if key in C.PER_CELL_SETTINGS or new == _DEFAULTS[key] else [(key, C.MISSING, new)])


# ----- a cell that trains says how it is getting on -----

_CHILD = textwrap.dedent(
    """
    import json, sys, time
    path = sys.argv[1]
    time.sleep(0.5)
    for step in (1, 2):
        with open(path, "a") as fh:
            fh.write(json.dumps({"step": step, "reward/mean": 0.5}) + "\\n")
        time.sleep(0.5)
    with open(path, "a") as fh:
        fh.write('{"step": 3, "rew')  # a line being written when compare looks: the last whole line counts
    time.sleep(0.5)
    """
)


def test_a_training_cell_prints_its_step_and_time_every_interval(tmp_path, monkeypatch):
    """While a cell's process runs, compare prints a line every ``every_s`` seconds with the label, the seed, the last
    step its metrics.jsonl logged out of train.steps, and the seconds since it started; then the cell's own line."""
    plan = _plan(tmp_path, ["train.steps=12"])
    cell = C.run_dir(plan, "gspo", 10)
    cell.mkdir(parents=True)
    child = [sys.executable, "-c", _CHILD, str(RunDir(cell).metrics)]
    monkeypatch.setattr(C, "command_for", lambda plan, label, seed: (child, "trained"))
    lines = []
    assert C.run_one(plan, "gspo", 10, progress=lines.append, every_s=0.1) == "compare: gspo seed 10: trained"
    assert len(lines) >= 8, lines  # about 2 s at one line per 0.1 s
    assert lines[0] == "compare: gspo seed 10: training, step 0/12 (starting up: no step logged yet), 0 s elapsed"
    steps = [int(line.split("step ")[1].split("/")[0]) for line in lines]
    assert steps == sorted(steps) and set(steps) == {0, 1, 2}  # step 3's line was never whole
    assert all(line.startswith("compare: gspo seed 10: training, step ") and line.endswith(" s elapsed") for line in lines)
    assert lines[-1].endswith(("1 s elapsed", "2 s elapsed", "3 s elapsed"))


def test_compare_passes_its_interval_to_every_cell_and_prints_each_line_whole(tmp_path, monkeypatch):
    plan = _plan(tmp_path, ["train.steps=3"])
    seen = []

    def fake_run_one(plan, label, seed, *, progress, every_s):
        seen.append(every_s)
        progress(f"compare: {label} seed {seed}: training, step 1/3, 0 s elapsed")
        _write_run(C.run_dir(plan, label, seed), 0.3, [0.5] * 3, 2)
        _mark_as(plan, C.run_dir(plan, label, seed), label, seed)
        return f"compare: {label} seed {seed}: trained"

    monkeypatch.setattr(C, "run_one", fake_run_one)
    lines = []
    C.compare(plan, progress=lines.append, warn=lambda _: None, every_s=0.25, jobs=2)
    assert seen == [0.25] * 4 and len(lines) == 8 and sum(line.endswith(": trained") for line in lines) == 4


def test_a_failing_cell_still_stops_the_comparison_with_its_error(tmp_path, monkeypatch):
    plan = _plan(tmp_path, [])
    child = [sys.executable, "-c", "import sys; print('dfpo: error: the model is gone', file=sys.stderr); sys.exit(2)"]
    monkeypatch.setattr(C, "command_for", lambda plan, label, seed: (child, "trained"))
    with pytest.raises(C.RunFailed, match=r"^gspo seed 10 failed \(exit 2\): the model is gone$"):
        C.run_one(plan, "gspo", 10, progress=lambda _: None, every_s=0.05)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(0, 10**6), max_size=30), torn=st.text(max_size=20).filter(lambda t: "\n" not in t))
def test_the_last_whole_line_gives_the_step(tmp_path_factory, steps, torn):
    """Invariant: whatever is being written after the last newline, the step is that of the last whole line (0: none)."""
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in steps) + torn)
    assert C.last_logged_step(path) == (steps[-1] if steps else 0)
    assert C.last_logged_step(path.parent / "missing.jsonl") == 0


# ----- compare.png: a panel for each outcome with something to draw, titles apart -----


def _doc(tmp_path, *, censored: bool):
    """compare.json of a fake comparison whose runs logged no tax, equivalent-answer entropy or update norm (and, when
    ``censored``, never reached kappa)."""
    plan = C.make_plan("gspo,dfpo_min,dfpo_min:stopgrad=score:length_aware=true", None, 3, 10, TINY, [], str(tmp_path / "cmp"))
    _fake_runs(plan, reached=lambda label, seed: not censored)
    C.compare(plan, progress=lambda _: None, warn=lambda _: None)
    return json.loads((plan.out / "compare.json").read_text())


@pytest.mark.parametrize("censored", [False, True])
def test_compare_png_draws_only_outcomes_with_data_with_titles_apart(tmp_path, censored):
    from matplotlib import pyplot as plt

    from dfpo.trainer.compare_report import OUTCOMES, difference_figure, drawable_outcomes, pair_intervals

    doc = _doc(tmp_path, censored=censored)
    records = {label: {int(s): r for s, r in by_seed.items()} for label, by_seed in doc["records"].items()}
    pairs = [tuple(p) for p in doc["pairs"]]
    drawn = [key for key, _ in drawable_outcomes(records, pairs, pair_intervals(records, pairs))]
    empty = {"jitter2", "entropy_last10", "residual", "tax_kl", "equiv_entropy", "shared_events", "residual_length"}
    empty |= {"update_norm", "cpu_s", "template_kl", "greedy_eval", "shared_whole", "residual_whole", "coef_whole", "weights_spread"}
    empty |= {"steps_to_kappa"} if censored else set()
    assert drawn == [key for key, _, _ in OUTCOMES if key not in empty]
    fig = difference_figure(doc)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        assert len(fig.axes) == len(drawn)  # no blank panel after the last one
        assert all(ax.collections or ax.lines[1:] for ax in fig.axes)  # points or an interval besides the zero line
        titles = [ax.title.get_window_extent(renderer) for ax in fig.axes] + [fig._suptitle.get_window_extent(renderer)]
        for i, a in enumerate(titles):
            assert not any(a.overlaps(b) for b in titles[i + 1 :]), "two titles overlap"
            assert not any(a.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes), "a title runs into a panel"
        note = fig._supxlabel.get_text().replace("\n", " ")
        assert note.startswith("not drawn (no finite difference in any pair): ") and ("steps to kappa" in note) == censored
    finally:
        plt.close(fig)
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000


# ----- the case on real (tiny) runs -----


@pytest.mark.slow
def test_a_longer_run_into_the_same_out_is_refused_after_real_training(tmp_path, capsys):
    """Real tiny runs: train.steps=2 trains and reports; train.steps=3 into the same --out is refused naming the
    length, nothing trained or reported; the config.toml dfpo train wrote equals the command's config, run_dir aside."""
    out = tmp_path / "cmp"
    argv = ["compare", "--config", TINY, "--objectives", "gspo,dfpo_min", "--seeds", "2", "--out", str(out)]
    argv += ["--set", "model.sft_steps=2", "--set", "eval.k=2", "--set", "eval.every=2"]
    assert main([*argv, "--set", "train.steps=2"]) == 0
    first = (out / "compare.md").read_text()
    capsys.readouterr()
    assert main([*argv, "--set", "train.steps=3"]) == 2
    captured = capsys.readouterr()
    assert "gspo/seed0 was trained with train.steps=2, this command asks 3" in captured.err and "skipped" not in captured.out
    assert (out / "compare.md").read_text() == first
    plan = C.make_plan("gspo,dfpo_min", None, 2, 0, TINY, ["model.sft_steps=2", "eval.k=2", "eval.every=2", "train.steps=2"], str(out))
    for label in plan.labels:
        config = C.run_config(plan, label, 1)
        assert C.settings_differences(C.stored_settings(C.run_dir(plan, label, 1)), flat_items(config_to_dict(config))) == []
        assert run_identity(config_to_dict(config))["objective"] == label and not math.isnan(C.read_run(C.run_dir(plan, label, 1))["eval"])
