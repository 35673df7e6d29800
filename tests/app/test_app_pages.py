"""Every page of the explorer renders without an exception, and one interaction per page changes
what it shows the way the maths says (Streamlit's AppTest, no browser)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dfpo.app.cli import RUNS_ENV  # noqa: E402

APP = Path(__file__).resolve().parents[2] / "app"


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(APP / f"page_{name}.py"), default_timeout=180).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def verdict(at: AppTest) -> str:
    return next(m.value for m in at.metric if m.label == "verdict")


def test_entry_script_lists_the_five_pages():
    text = (APP / "main.py").read_text()
    for name in ("cancel", "atlas", "toy", "ledger", "runs"):
        assert f"page_{name}.py" in text and (APP / f"page_{name}.py").is_file()


def test_cancellation_by_hand_gspo_to_dfpo_and_back_with_unequal_lengths():
    at = page("cancel")
    assert verdict(at) == "does not cancel"  # GSPO couples the shared token to each s_i (eq 13)
    at.selectbox(key="objective").set_value("dfpo_min").run()
    at.selectbox(key="stopgrad").set_value("score").run()
    assert verdict(at) == "cancels"  # score form, equal lengths (eq 72-73)
    at.text_input(key="lengths").set_value("4, 6, 9, 5").run()
    assert verdict(at) == "does not cancel"  # 1/|y_i| at unequal lengths (eq 72)
    at.checkbox(key="length_aware").check().run()
    assert verdict(at) == "cancels"  # a_i = A_i / L_i
    assert not at.exception


def test_cancellation_by_hand_ratio_form_cancels_once_nothing_clips():
    at = page("cancel")
    at.selectbox(key="objective").set_value("dfpo_min").run()
    at.selectbox(key="stopgrad").set_value("ratio").run()
    at.number_input(key="seed").set_value(1).run()
    assert verdict(at) == "does not cancel"  # GSPO's 3e-4 / 4e-4 range clips one completion of the group
    at.number_input(key="seed").set_value(3).run()
    assert verdict(at) == "no gradient at all"  # every completion clipped
    at.number_input(key="eps_low").set_value(0.9).run()
    at.number_input(key="eps_high").set_value(5.0).run()
    assert verdict(at) == "cancels"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("rewards", "1, 1, 1, 1", "all rewards are equal"),
        ("rewards", "1", "G >= 2"),
        ("rewards", "1, x, 0, 1", "'x' is not a number"),
        ("lengths", "5, 5", "one length per completion"),
    ],
)
def test_cancellation_by_hand_explains_bad_input_without_a_traceback(field, value, message):
    at = page("cancel")
    at.text_input(key=field).set_value(value).run()
    assert not at.exception
    assert any(message in e.value for e in at.error)


def test_cancellation_by_hand_negative_eps_is_a_message():
    at = page("cancel")
    at.number_input(key="eps_low").set_value(-0.1).run()
    assert not at.exception and any("eps_low must be in" in e.value for e in at.error)


def test_atlas_covers_every_objective_and_grpo_fix_cancels_with_a_length_free_aggregation():
    from dfpo.trainer.loss import OBJECTIVES

    at = page("atlas")
    frame = at.dataframe[0].value
    assert set(frame["objective"]) == set(OBJECTIVES)
    at.multiselect(key="atlas_objectives").set_value(["grpo_fix", "gspo"]).run()
    frame = at.dataframe[0].value
    assert len(frame) == 8
    row = frame[(frame["objective"] == "grpo_fix") & (frame["aggregation"] == "token_mean")].iloc[0]
    assert (row.drop(["objective", "aggregation"]) == "cancels").all()  # Cor. H.1
    gspo = frame[(frame["objective"] == "gspo") & (frame["aggregation"] == "seq_mean_token_mean")].iloc[0]
    assert gspo["equal L, r*=1"] != "cancels"  # eq 13


def test_ledger_filters_by_verdict_and_expands_each_claim():
    at = page("ledger")
    n = len(at.dataframe[0].value)
    assert n >= 30
    at.multiselect(key="ledger_verdicts").set_value(["fails"]).run()
    shown = at.dataframe[0].value
    assert 0 < len(shown) < n and set(shown["verdict"]) == {"fails"}
    assert any(e.label.startswith("eq-55: fails") for e in at.expander)


def test_toy_lab_default_comparison_then_a_small_run():
    at = page("toy")
    assert any("matched control" in m.value for m in at.markdown)
    at.text_input[0].set_value("gspo_noclip,dfpo_min:stopgrad=score")
    nums = at.number_input
    nums[2].set_value(2)  # K
    nums[3].set_value(5)  # steps
    nums[4].set_value(2)  # seeds
    at.button[0].click().run()
    assert not at.exception
    summary = "\n".join(m.value for m in at.markdown)
    assert "| dfpo_min:stopgrad=score | gspo_noclip | yes |" in summary


def test_toy_lab_bad_label_is_a_message():
    at = page("toy")
    at.text_input[0].set_value("gspo,nope")
    at.button[0].click().run()
    assert not at.exception and any("unknown objective='nope'" in e.value for e in at.error)


def _fake_run(folder: Path, lr: float, rewards: list[float], corrupt: bool = False) -> None:
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(f'seed = 0\n\n[optim]\nlr = {lr}\n\n[objective]\nname = "gspo"\n')
    lines = [json.dumps({"step": i + 1, "reward/mean": r, "clip/frac_high": 0.1}) for i, r in enumerate(rewards)]
    if corrupt:
        lines.append('{"step": 99, "reward/me')  # a torn last line
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "eval.jsonl").write_text(json.dumps({"step": 0, "eval/avg@4": 0.25}) + "\n")
    (folder / "samples.jsonl").write_text(json.dumps({"step": 2, "prompt": "1+1=", "completion": "2", "reward": 1.0}) + "\n")


def test_runs_page_overlays_runs_flags_config_differences_and_counts_torn_lines(tmp_path, monkeypatch):
    _fake_run(tmp_path / "a", 1e-4, [0.1, 0.2, 0.3], corrupt=True)
    _fake_run(tmp_path / "b", 3e-4, [0.2, 0.4, 0.5])
    (tmp_path / "not-a-run").mkdir()
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    assert any("1 torn or corrupt" in w.value for w in at.warning)
    diff = at.dataframe[0].value
    assert diff.iloc[0]["key"] == "optim.lr" and bool(diff.iloc[0]["differs"])
    assert not diff[diff["key"] == "seed"]["differs"].iloc[0]
    at.multiselect(key="runs_chosen").set_value(["b"]).run()
    assert not at.warning


def test_runs_page_without_runs_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    assert any("No run folder found" in i.value for i in at.info)


def test_dfpo_app_refuses_bad_options_before_starting(tmp_path, capsys):
    from dfpo.cli import main

    assert main(["app", "--port", "0"]) == 2
    assert "--port must be in 1..65535, got --port 0" in capsys.readouterr().err
    assert main(["app", "--runs", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_dfpo_app_binds_to_loopback_by_default():
    from dfpo.app.cli import streamlit_command
    from dfpo.cli import build_parser

    args = build_parser().parse_args(["app"])
    assert args.address == "127.0.0.1" and args.port == 8501
    cmd = streamlit_command(args.port, args.address, True)
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1" and cmd[cmd.index("--server.headless") + 1] == "true"
