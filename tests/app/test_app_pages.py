"""Every page of the explorer renders without an exception, and the inputs a user changes change
what it shows the way the maths says (Streamlit's AppTest, no browser)."""

from __future__ import annotations

import ast
import base64
import html
import json
import random
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit")
import streamlit as st  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from dfpo.app import data  # noqa: E402
from dfpo.app.cli import RUNS_ENV  # noqa: E402
from dfpo.app.text import markdown_text, plotly_text  # noqa: E402
from dfpo.trainer.run.layout import RunDir

APP = Path(__file__).resolve().parents[2] / "app"
SMALL_TOY = data.ToySettings(steps=5, seeds=2)


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(APP / f"page_{name}.py"), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def verdict(at: AppTest) -> str:
    return metric(at, "verdict")


def test_entry_script_builds_every_page_of_the_table_and_fetches_no_icon_from_the_web():
    from dfpo.app.pages import PAGES

    text = (APP / "main.py").read_text()
    assert "for page in PAGES" in text  # the navigation is the page table (tests/app/test_pages.py checks its lists)
    for name in ("cancel", "atlas", "toy", "ledger", "runs", "drift"):
        assert f"page_{name}.py" in [p.file for p in PAGES] and (APP / f"page_{name}.py").is_file()
    assert 'page_icon=":material' not in text  # a material page icon is fetched from fonts.gstatic.com


def app() -> AppTest:
    """The whole explorer (its navigation), on its first page."""
    at = AppTest.from_file(str(APP / "main.py"), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _leave_and_come_back(at: AppTest, page_file: str, elsewhere: str = "page_ledger.py") -> AppTest:
    at.switch_page(elsewhere).run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page(page_file).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


CANCEL_INPUTS = {  # every input of the page, each away from its default
    ("selectbox", "objective"): "dfpo_min",
    ("text_input", "rewards"): "1, 0, 0, 1, 0.5",
    ("text_input", "lengths"): "4, 6, 9, 5, 7",
    ("slider", "shared"): 0.25,
    ("slider", "scale"): 0.5,
    ("number_input", "seed"): 7,
    ("selectbox", "stopgrad"): "score",
    ("selectbox", "aggregation"): "token_mean",
    ("checkbox", "length_aware"): True,
    ("number_input", "eps_low"): 0.1,
    ("number_input", "eps_high"): 0.3,
}
ATLAS_INPUTS = {
    ("multiselect", "atlas_objectives"): ["grpo_fix", "gspo"],
    ("number_input", "atlas_groups"): 2,
    ("number_input", "atlas_seed"): 5,
}


def _set_all(at: AppTest, inputs: dict) -> None:
    for (kind, key), value in inputs.items():  # one at a time, as a user does: the objective resets the components
        getattr(at, kind)(key=key).set_value(value).run()
        assert not at.exception, [e.value for e in at.exception]


def _shown(at: AppTest, inputs: dict) -> dict:
    return {(kind, key): getattr(at, kind)(key=key).value for kind, key in inputs}


def test_every_input_of_the_cancellation_page_and_the_atlas_is_kept_when_the_user_comes_back():
    """Before the fix leaving a page and coming back reset every input to its default."""
    at = app()
    _set_all(at, CANCEL_INPUTS)
    residual = metric(at, "residual")
    at.switch_page("page_atlas.py").run()
    _set_all(at, ATLAS_INPUTS)
    cells = at.dataframe[0].value
    _leave_and_come_back(at, "page_cancel.py")
    assert _shown(at, CANCEL_INPUTS) == CANCEL_INPUTS
    assert metric(at, "residual") == residual
    _leave_and_come_back(at, "page_atlas.py")
    assert _shown(at, ATLAS_INPUTS) == ATLAS_INPUTS
    assert at.dataframe[0].value.equals(cells)


def _bare_strings(tree: ast.AST) -> list[str]:
    """String expression statements that are not a docstring (the first statement of a module, class or function)."""
    docstrings = {
        id(node.body[0]) for node in ast.walk(tree) if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
    }
    return [
        node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and id(node) not in docstrings
    ]


def test_no_page_holds_a_bare_string_that_streamlit_would_write_onto_it():
    """Streamlit's magic writes every bare string of a page script onto the page: a constant's docstring there showed
    'After a script run is interrupted, ...' above the toy lab's title."""
    for script in [APP / "main.py", *sorted(APP.glob("page_*.py"))]:
        assert _bare_strings(ast.parse(script.read_text())) == [], script.name


# ----------------------------------------------------------------------------- cancellation by hand


def _direct(objective: str, lengths: list[int], seed: int = 0):
    """The breakdown computed with the cancellation helpers, no page involved: the preset, no overrides."""
    import torch

    from dfpo.core.loss.cancellation import group_breakdown, make_shared_prefix_group

    group = make_shared_prefix_group(
        torch.tensor(data.DEFAULT_REWARDS, dtype=torch.float64), lengths, prefix_len=3, shared_log_ratio=0.0, log_ratio_scale=0.3, seed=seed
    )
    return group_breakdown(objective, group)


COMPONENTS = ("stopgrad", "aggregation", "length_aware", "eps_low", "eps_high")


def _expected_verdict(b) -> str:
    """The page's verdict rule applied to a breakdown computed without the page."""
    from dfpo.core.loss.cancellation import CANCEL_TOL

    if bool((b.coefficient.abs() < CANCEL_TOL).all()):
        return "no gradient at all"
    return "cancels" if abs(b.residual) < CANCEL_TOL else "does not cancel"


def _components_shown(at: AppTest) -> dict:
    return {
        "stopgrad": at.selectbox(key="stopgrad").value,
        "aggregation": at.selectbox(key="aggregation").value,
        "length_aware": at.checkbox(key="length_aware").value,
        "eps_low": at.number_input(key="eps_low").value,
        "eps_high": at.number_input(key="eps_high").value,
    }


def test_cancellation_by_hand_switching_objectives_shows_each_presets_components_and_its_verdict():
    """grpo -> gspo -> grpo_fix -> dapo differ in clip range and aggregation: each shows its own and the
    verdict and residual of the preset itself (before the fix grpo_fix and dapo kept GSPO's components)."""
    from dfpo.core.loss import OBJECTIVES

    at = page("cancel")
    lengths = [4, 6, 9, 5]
    at.text_input(key="lengths").set_value("4, 6, 9, 5").run()
    expected = {"grpo": "does not cancel", "gspo": "does not cancel", "grpo_fix": "cancels", "dapo": "cancels"}
    for objective, want in expected.items():
        at.selectbox(key="objective").set_value(objective).run()
        assert not at.exception
        spec = OBJECTIVES[objective]
        assert _components_shown(at) == {k: getattr(spec, k) for k in COMPONENTS}
        direct = _direct(objective, lengths)
        assert verdict(at) == _expected_verdict(direct) == want
        assert metric(at, "residual") == f"{direct.residual:.3e}"
        assert any(c.value == "Overrides sent to `policy_loss`: none" for c in at.caption)
    assert _components_shown(at)["eps_high"] == 0.28 and _components_shown(at)["aggregation"] == "token_mean"  # DAPO's own


def test_cancellation_by_hand_a_changed_component_is_an_override_until_the_objective_changes():
    at = page("cancel")
    at.text_input(key="lengths").set_value("4, 6, 9, 5").run()
    at.selectbox(key="objective").set_value("grpo").run()
    at.selectbox(key="aggregation").set_value("seq_mean_token_sum").run()  # GRPO-fix's aggregation on GRPO
    assert verdict(at) == "cancels"  # Cor. H.1: a length-free aggregation cancels
    assert any("`aggregation=seq_mean_token_sum`" in c.value for c in at.caption)
    at.selectbox(key="objective").set_value("gspo").run()
    assert at.selectbox(key="aggregation").value == "seq_mean_token_mean" and verdict(at) == "does not cancel"


def test_cancellation_by_hand_random_seed_button_draws_a_seed(monkeypatch):
    monkeypatch.setattr(random, "randrange", lambda n: 1234)
    at = page("cancel")
    at.text_input(key="lengths").set_value("4, 6, 9, 5").run()
    at.selectbox(key="objective").set_value("grpo").run()
    at.button(key="random").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.number_input(key="seed").value == 1234
    assert metric(at, "residual") == f"{_direct('grpo', [4, 6, 9, 5], seed=1234).residual:.3e}"


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


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("lengths", "1000000000000, 5, 5, 5", "every length must be at most 4096 tokens on this page, got lengths=[1000000000000, 5, 5, 5]: give shorter ones"),
        ("lengths", "5, 5.5, 5, 5", "lengths: '5.5' is not a whole number"),
        ("rewards", ", ".join(["0", "1"] * 40), "this page takes at most 64 completions, got G=80 rewards: give fewer"),
    ],
)  # fmt: skip
def test_cancellation_by_hand_refuses_a_group_too_large_to_draw_in_one_sentence(field, value, message):
    """Before the fix a length of 10^12 tokens asked torch for 32 TB and the page showed a RuntimeError traceback."""
    at = page("cancel")
    at.text_input(key=field).set_value(value).run()
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [f"Nothing to show: {message}"]
    assert not at.metric  # nothing computed from the earlier input is left on the page


@pytest.mark.parametrize("value, shown", [(70000, "70000"), (2.5, "2.5"), (-1, "-1")])
def test_cancellation_by_hand_a_seed_out_of_range_or_not_whole_shows_no_numbers(value, shown):
    """Before the fix the browser held back a seed outside the box's bounds (drawn red) and rounded 2.5 to 2,
    while the page went on showing the numbers of the old seed; now the box passes any value on and the page names it."""
    at = page("cancel")
    assert at.metric
    at.number_input(key="seed").set_value(value).run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"Nothing to show: seed must be a whole number from 0 to 65536, got seed={shown}"]
    assert not at.metric
    assert at.number_input(key="seed").proto.has_min is False and at.number_input(key="seed").proto.has_max is False


def test_atlas_a_seed_or_group_count_out_of_range_shows_no_table():
    at = page("atlas")
    at.number_input(key="atlas_seed").set_value(70000).run()
    assert [e.value for e in at.error] == ["Nothing to show: seed must be a whole number from 0 to 65536, got seed=70000"]
    assert not at.dataframe
    at.number_input(key="atlas_seed").set_value(3).run()
    at.number_input(key="atlas_groups").set_value(1.5).run()
    assert [e.value for e in at.error] == ["Nothing to show: groups must be a whole number from 1 to 16, got groups=1.5"]
    assert not at.dataframe


@pytest.mark.parametrize(("rewards", "lengths"), [("0, 1, 1, 0", "5, 5, 5, 5"), ("1, 0", "5, 5"), ("1, 0, 0, 0.2, 0.9", "5, 9, 4, 12, 30")])
def test_cancellation_by_hand_draws_the_sum_label_beside_the_plot_never_over_a_bar(rewards, lengths):
    at = page("cancel")
    at.text_input(key="rewards").set_value(rewards)
    at.text_input(key="lengths").set_value(lengths).run()
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    (label,) = [a for a in spec["layout"]["annotations"] if a["text"].startswith("sum = ")]
    # Bars live inside the plotting area (paper x from 0 to 1): a label anchored by its left edge at x >= 1 is outside it.
    assert label["xref"] == "paper" and label["x"] >= 1 and label["xanchor"] == "left" and not label["showarrow"]
    assert spec["layout"]["margin"]["r"] >= 100  # room for 'sum = -1.23e-02' in the margin
    low, high = spec["layout"]["yaxis"]["range"]
    bars = _plain(spec["data"][0]["y"])
    assert label["yref"] == "y" and low < label["y"] < high and low < min(bars) and max(bars) < high  # level with its line, in view
    assert float(label["text"].removeprefix("sum = ")) == pytest.approx(float(metric(at, "residual")), rel=1e-2, abs=1e-300)


def test_padded_range_holds_every_value_with_room_around_it():
    assert data.padded_range([0.0, 1.0, -1.0]) == pytest.approx([-1.16, 1.16])
    assert data.padded_range([2.0, 2.0]) == pytest.approx([1.84, 2.16])
    assert data.padded_range([0.0, 0.0]) == pytest.approx([-0.08, 0.08])


def test_cancellation_by_hand_negative_eps_is_a_message():
    at = page("cancel")
    at.number_input(key="eps_low").set_value(-0.1).run()
    assert not at.exception and any("eps_low must be in" in e.value for e in at.error)


def test_cancellation_by_hand_metric_labels_are_short_and_explained():
    at = page("cancel")
    assert [m.label for m in at.metric] == ["residual", "verdict", "Asym (eq 23)"]
    assert all(m.proto.help for m in at.metric)


# ----------------------------------------------------------------------------- atlas and ledger


def test_atlas_covers_every_objective_and_grpo_fix_cancels_with_a_length_free_aggregation():
    from dfpo.core.loss import OBJECTIVES

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


def test_atlas_page_shows_the_cores_atlas_as_groups_are_added_and_taken_away():
    from dfpo.core.loss.cancellation import atlas, atlas_rows

    at = page("atlas")
    names = ["gspo", "dfpo_min", "kl_cov"]
    at.multiselect(key="atlas_objectives").set_value(names).run()
    for groups, seed in ((2, 5), (3, 5), (1, 5), (2, 6)):  # more groups reuse the first ones; fewer read them back
        at.number_input(key="atlas_groups").set_value(groups)
        at.number_input(key="atlas_seed").set_value(seed).run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.dataframe[0].value.to_dict("records") == atlas_rows(atlas(names, groups=groups, seed=seed))[1]


def test_ledger_filters_by_verdict_expands_each_claim_and_wraps_statements():
    at = page("ledger")
    n = len(at.dataframe[0].value)
    assert n >= 30
    assert at.dataframe[0].proto.row_height > 64  # over 4 rem: Streamlit wraps long text instead of cutting it
    at.multiselect(key="ledger_verdicts").set_value(["fails"]).run()
    shown = at.dataframe[0].value
    assert 0 < len(shown) < n and set(shown["verdict"]) == {"fails"}
    assert any(e.label.startswith("eq-55: fails") for e in at.expander)


def _claims_line(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "claims shown" in m.value]


def test_ledger_a_filter_that_keeps_no_claim_says_what_to_change():
    """Before the fix the page printed '**0 of 38 claims shown**: ' with nothing after it."""
    claims = data.ledger_records()
    holds = next(c for c in claims if c["verdict"] == "holds")
    at = page("ledger")
    at.text_input(key="ledger_search").set_value("no claim says this").run()
    assert [w.value for w in at.warning] == [
        markdown_text("No claim mentions 'no claim says this' in its id, source or statement: change or clear the search.")
    ]
    assert not _claims_line(at) and not at.dataframe and not at.expander
    at.text_input(key="ledger_search").set_value(holds["id"]).run()
    at.multiselect(key="ledger_verdicts").set_value(["fails"]).run()
    (hint,) = [w.value for w in at.warning]
    assert hint.startswith(markdown_text(f"No claim with the chosen verdicts and methods mentions {holds['id']!r}"))
    assert markdown_text(f"holds ({holds['method']})") in hint and hint.endswith(markdown_text("Add those, or clear the search."))
    at.multiselect(key="ledger_verdicts").set_value([]).run()
    assert [w.value for w in at.warning] == [markdown_text("No claim shown: choose at least one verdict.")]
    at.multiselect(key="ledger_verdicts").set_value(["holds"]).run()
    assert not at.warning and _claims_line(at)[0].startswith("**1 of ")


def test_ledger_filter_is_kept_when_the_user_comes_back():
    records = data.ledger_records()
    ids = [c["id"] for c in records]
    # a failing claim whose id the search finds alone (cor-3.2 would find cor-3.2-params too)
    fails = next(c for c in records if c["verdict"] == "fails" and sum(c["id"] in other for other in ids) == 1)
    inputs = {
        ("multiselect", "ledger_verdicts"): ["fails", "holds-under-conditions"],
        ("multiselect", "ledger_methods"): [fails["method"]],
        ("text_input", "ledger_search"): fails["id"],
    }
    at = app()
    at.switch_page("page_ledger.py").run()
    _set_all(at, inputs)
    assert _claims_line(at)[0].startswith("**1 of ")
    _leave_and_come_back(at, "page_ledger.py", elsewhere="page_cancel.py")
    assert _shown(at, inputs) == inputs and _claims_line(at)[0].startswith("**1 of ")


def test_ledger_is_stored_once_per_code_version_and_read_back(app_cache, monkeypatch):
    from dfpo.app import cache

    data.ledger_records()  # computed, or read back when an earlier test stored it
    assert cache.cache_path("ledger").is_file()
    import dfpo.theory.ledger

    monkeypatch.setattr(dfpo.theory.ledger, "run_ledger", lambda: pytest.fail("the ledger ran again"))
    assert len(data.ledger_records()) >= 30


# ----------------------------------------------------------------------------- toy lab


@pytest.fixture
def small_toy(monkeypatch):
    """A default comparison of 5 steps x 2 seeds (the real one takes tens of seconds), no result kept from other tests."""
    monkeypatch.setattr(data, "TOY_DEFAULT", SMALL_TOY)
    st.cache_resource.clear()
    yield SMALL_TOY
    st.cache_resource.clear()


def _kinds(at: AppTest) -> list[str]:
    return [type(e).__name__ for e in at.main.children.values()]


def _tables(at: AppTest) -> list[str]:
    """The markdown tables of the page (the toy summary and the predictions)."""
    return [m.value for m in at.markdown if m.value.startswith("|")]


def test_toy_lab_default_comparison_then_a_small_run(small_toy):
    at = page("toy")
    assert any("matched GSPO control" in c.value for c in at.caption)
    summary = _tables(at)[0]
    assert summary.startswith("| metric | " + " | ".join(SMALL_TOY.labels) + " |")  # a column per objective: it fits the page
    assert "Button" not in _kinds(at)  # the Stop button and the progress bar are gone once the run is done
    at.text_input(key="toy_labels").set_value("gspo_noclip,dfpo_min:stopgrad=score")
    at.number_input(key="toy_K").set_value(2)
    at.number_input(key="toy_steps").set_value(5)
    at.number_input(key="toy_seeds").set_value(2)
    at.button[0].click().run()
    assert not at.exception
    summary, checks = _tables(at)
    assert summary.startswith("| metric | gspo_noclip | dfpo_min:stopgrad=score |")
    assert "| dfpo_min:stopgrad=score | gspo_noclip | yes |" in checks


def test_toy_lab_default_comparison_is_stored_and_read_back_without_training(small_toy, monkeypatch):
    page("toy")  # computes and stores the (small) default
    st.cache_resource.clear()  # a new server process: nothing in memory
    monkeypatch.setattr(data, "run_toy", lambda *a, **k: pytest.fail("the default comparison was trained again"))
    at = page("toy")
    assert _tables(at)[0].startswith("| metric | " + " | ".join(SMALL_TOY.labels) + " |")


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("toy_lr", 1e6, "the learning rate lr must be between 1e-06 and 100 on this page, got lr=1e+06"),
        ("toy_lr", 0.0, "the learning rate lr must be between 1e-06 and 100 on this page, got lr=0"),
        ("toy_G", 100, "the group size G must be between 2 and 64 on this page, got group_size=100"),
        ("toy_K", 0, "K (optimiser steps per batch) must be between 1 and 64 on this page, got inner_steps=0"),
        ("toy_steps", 5000, "the number of steps must be between 1 and 2000 on this page, got steps=5000"),
        ("toy_seeds", 65, "the number of seeds must be between 1 and 64 on this page, got seeds=65"),
    ],
)
def test_toy_lab_out_of_range_input_is_named_and_nothing_runs(small_toy, monkeypatch, key, value, message):
    """Before the fix the widgets kept the old value silently (and lr=1e6 failed deep in the core)."""
    at = page("toy")
    monkeypatch.setattr(data, "run_toy", lambda *a, **k: pytest.fail("trained despite a bad input"))
    at.number_input(key=key).set_value(value)
    at.button[0].click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"Cannot run this configuration: {message}"]
    assert not at.tabs and not _tables(at)  # the previous experiment is not shown as if it were this one


def test_toy_lab_bad_label_is_a_message(small_toy):
    at = page("toy")
    at.text_input(key="toy_labels").set_value("gspo,nope")
    at.button[0].click().run()
    assert not at.exception and any("unknown objective='nope'" in e.value for e in at.error)


def _no_training(*args, **kwargs):
    raise AssertionError("trained despite a bad input")  # an Exception: the job fails and the page shows it


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("toy_steps", 2.5, "the number of steps must be a whole number, got steps=2.5"),
        ("toy_G", 4.5, "the group size G must be a whole number, got group_size=4.5"),
        ("toy_seeds", 1.5, "the number of seeds must be a whole number, got seeds=1.5"),
    ],
)
def test_toy_lab_a_fraction_where_a_whole_number_belongs_is_refused(small_toy, monkeypatch, key, value, message):
    """Before the fix the box rounded steps 2.5 down to 2 in the browser and the page trained 2 steps."""
    at = page("toy")
    monkeypatch.setattr(data, "run_toy", _no_training)
    at.number_input(key=key).set_value(value)
    at.button[0].click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"Cannot run this configuration: {message}"]
    assert not at.tabs and not _tables(at)


TOY_INPUTS = {  # every input of the form, each away from its default
    ("selectbox", "toy_task"): "tenplusten",
    ("selectbox", "toy_mode"): "exact",
    ("selectbox", "toy_optimizer"): "adam",
    ("number_input", "toy_lr"): 0.05,
    ("text_input", "toy_labels"): "gspo_noclip,dfpo_min:stopgrad=score",
    ("number_input", "toy_G"): 4,
    ("number_input", "toy_K"): 2,
    ("number_input", "toy_steps"): 3,
    ("number_input", "toy_seeds"): 1,
}


def test_toy_lab_inputs_and_result_are_kept_when_the_user_comes_back(small_toy):
    """Before the fix leaving the page and coming back reset the form to the default comparison."""
    at = app()
    at.switch_page("page_toy.py").run()
    for (kind, key), value in TOY_INPUTS.items():  # a form: nothing runs until Run
        getattr(at, kind)(key=key).set_value(value)
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    summary = _tables(at)[0]
    assert summary.startswith("| metric | gspo_noclip | dfpo_min:stopgrad=score |")
    _leave_and_come_back(at, "page_toy.py")
    assert _shown(at, TOY_INPUTS) == TOY_INPUTS
    assert _tables(at)[0] == summary


def _stop_like_streamlit_after(steps: int, monkeypatch) -> None:
    """Streamlit's own Stop (top right) while the page polls a run: the script run is stopped at its next
    Streamlit call, which raises StopException in the script's thread; here the page's poll raises it."""
    from streamlit.runtime.scriptrunner import StopException

    from dfpo.app import jobs

    poll = jobs.Job.poll

    def poll_then_stop(self, watcher):
        p = poll(self, watcher)
        if p.done >= steps:
            raise StopException()
        return p

    monkeypatch.setattr(jobs.Job, "poll", poll_then_stop)


def test_toy_lab_streamlits_own_stop_ends_the_run_and_shows_what_finished(monkeypatch, tmp_path):
    """Before the fix Streamlit's Stop left the page frozen mid-run (its progress bar and the page's Stop still shown)
    while training went on for 5 s, and the steps that had finished were never shown."""
    long = data.ToySettings(steps=2000, seeds=2)
    monkeypatch.setattr(data, "TOY_DEFAULT", long)
    monkeypatch.setenv("DFPO_APP_CACHE", str(tmp_path))  # no stored default comparison: the page trains
    st.cache_resource.clear()
    _stop_like_streamlit_after(3, monkeypatch)
    at = AppTest.from_file(str(APP / "page_toy.py"), default_timeout=300).run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Button" not in _kinds(at) and not at.get("progress")  # the page's Stop and the progress bar are gone
    (notice,) = [i.value for i in at.info]
    done = int(notice.split("Stopped after ")[1].split(" ")[0])
    assert (
        3 <= done < long.steps
        and notice == f"Stopped after {done} of 8000 steps: below, what those steps show. Press Run to start it again."
    )
    assert at.tabs and _tables(at)[0].startswith("| metric | gspo |\n")  # the summary of the steps that finished
    assert any(m.value.startswith(f"Stopped early: gspo {done} of 2000 steps.") for m in at.markdown)
    monkeypatch.setattr(data, "run_toy", lambda *a, **k: pytest.fail("trained again without Run"))
    at.run()  # a later run of the page shows the stopped run again
    assert not at.exception and [i.value for i in at.info] == [notice] and at.tabs
    st.cache_resource.clear()


def test_toy_lab_training_error_is_a_sentence_and_the_progress_bar_goes(small_toy, monkeypatch, tmp_path):
    monkeypatch.setenv("DFPO_APP_CACHE", str(tmp_path))  # no stored default comparison: the page trains

    def diverge(settings, tick):
        for done in range(3):
            tick("gspo", done, settings.total_steps)
        raise FloatingPointError("metric reward is not finite at step 2 for objective 'gspo'")

    monkeypatch.setattr(data, "run_toy", diverge)
    at = page("toy")
    assert [e.value for e in at.error] == [
        "Training stopped during gspo at step 3 of 5: metric reward is not finite at step 2 for objective 'gspo'. The settings were "
        "accepted, so the numbers left their valid range while training; a smaller learning rate than lr=0.5 usually keeps them finite."
    ]
    assert "Button" not in _kinds(at) and not at.tabs


# ----------------------------------------------------------------------------- training runs


def _fake_run(folder: Path, lr: float, rewards: list[float], corrupt: bool = False, extra_lines: tuple[str, ...] = ()) -> None:
    folder.mkdir(parents=True)
    (folder / RunDir.CONFIG).write_text(f'seed = 0\n\n[optim]\nlr = {lr}\n\n[objective]\nname = "gspo"\n')
    lines = [json.dumps({"step": i + 1, "reward/mean": r, "clip/frac_high": 0.1}) for i, r in enumerate(rewards)]
    lines += list(extra_lines)
    if corrupt:
        lines.append('{"step": 99, "reward/me')  # a torn last line
    (folder / RunDir.METRICS).write_text("\n".join(lines) + "\n")
    (folder / RunDir.EVALS).write_text(json.dumps({"step": 0, "eval/avg@4": 0.25}) + "\n")
    (folder / RunDir.SAMPLES).write_text(json.dumps({"step": 2, "prompt": "1+1=", "completion": "2", "reward": 1.0}) + "\n")


def _plain(value):
    """A trace's x or y as a list (plotly sends numpy arrays base64-encoded)."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return value


def _traces(at: AppTest, title: str) -> list[dict]:
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if spec["layout"]["title"]["text"].startswith(title):
            return [{**t, "x": _plain(t.get("x")), "y": _plain(t.get("y"))} for t in spec["data"]]
    raise AssertionError(f"no chart titled {title!r}")


def _chosen(at: AppTest) -> list[str]:
    return list(at.multiselect(key="runs_chosen").value)  # run ids: their folders


def _options(at: AppTest) -> list[str]:
    return list(at.multiselect(key="runs_chosen").options)  # run names as shown


def test_runs_page_overlays_runs_flags_config_differences_and_counts_torn_lines(tmp_path, monkeypatch):
    _fake_run(tmp_path / "a", 1e-4, [0.1, 0.2, 0.3], corrupt=True)
    _fake_run(tmp_path / "b", 3e-4, [0.2, 0.4, 0.5])
    (tmp_path / "not-a-run").mkdir()
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    assert any("1 log line(s) skipped" in w.value for w in at.warning)
    diff = at.dataframe[0].value
    assert diff.iloc[0]["key"] == "optim.lr" and bool(diff.iloc[0]["differs"])
    assert not diff[diff["key"] == "seed"]["differs"].iloc[0]
    at.multiselect(key="runs_chosen").set_value([str(tmp_path / "b")]).run()
    assert not at.warning


def test_runs_page_draws_each_run_in_its_own_colour_and_smooths_on_request(tmp_path, monkeypatch):
    _fake_run(tmp_path / "a", 1e-4, [0.1, 0.2, 0.6, 0.3])
    _fake_run(tmp_path / "b", 3e-4, [0.2, 0.4, 0.5, 0.9])
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    traces = _traces(at, "reward/mean")
    assert [t["name"] for t in traces] == ["a", "b"]
    assert len({t["line"]["color"] for t in traces}) == 2  # before: the theme's two blues
    at.slider(key="runs_smooth").set_value(2).run()
    smoothed = [t for t in _traces(at, "reward/mean") if t.get("name") == "a"][0]
    assert smoothed["y"] == pytest.approx([0.1, 0.15, 0.4, 0.45])  # trailing mean over 2 logged steps


def test_runs_page_accepts_a_relative_folder_and_home_and_keeps_the_selection(tmp_path, monkeypatch):
    """dfpo app passes absolute folders; a relative one typed in the page made os.path.commonpath raise
    "Can't mix absolute and relative paths", '~' was not expanded, and a new folder wiped the selection."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _fake_run(tmp_path / "runs" / "a", 1e-4, [0.1, 0.2])
    _fake_run(tmp_path / "runs" / "b", 2e-4, [0.1, 0.2])
    _fake_run(tmp_path / "more" / "c", 3e-4, [0.3, 0.4])
    _fake_run(tmp_path / "home" / "mine" / "d", 4e-4, [0.5, 0.6])
    at = page("runs")
    b = _chosen(at)[1]
    at.multiselect(key="runs_chosen").set_value([b]).run()
    at.text_input(key="runs_extra").set_value("more").run()
    assert not at.exception and not at.error, [e.value for e in at.exception]
    assert _chosen(at) == [b] and _options(at) == ["a", "b", "c"]  # the selection survives the new folder
    at.text_input(key="runs_extra").set_value("~/mine").run()
    assert not at.exception and not at.error
    assert _chosen(at) == [b] and _options(at) == ["a", "b", "d"]


def test_runs_page_default_folder_is_runs_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(RUNS_ENV, raising=False)
    _fake_run(tmp_path / "runs" / "a", 1e-4, [0.1, 0.2])
    at = page("runs")
    assert _options(at) == ["a"] and _chosen(at) == [str(tmp_path / "runs" / "a")]


def test_runs_page_says_when_an_added_folder_holds_no_run(tmp_path, monkeypatch):
    _fake_run(tmp_path / "runs" / "a", 1e-4, [0.1, 0.2])
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs"))
    at = page("runs")
    at.text_input(key="runs_extra").set_value(str(tmp_path / "empty")).run()
    assert any(w.value.startswith(f"No run folder in {markdown_text(tmp_path / 'empty')}") for w in at.warning)
    at.text_input(key="runs_extra").set_value(str(tmp_path / "missing")).run()
    assert any(f"{markdown_text(tmp_path / 'missing')} is not a folder" in e.value for e in at.error)


IMAGE_NAME = "![x](http:/127.0.0.1:8600/pixel.png)"
LINK_NAME = '<a href="http:/x">CLICK</a>'
"""Run folder names (relative to their root, so each spans three folders) that are markup: an image
request and a live link wherever they are rendered instead of shown."""


def _markdown_bodies(at: AppTest) -> list[str]:
    """The source of every element Streamlit renders as markdown."""
    elements = [*at.markdown, *at.caption, *at.error, *at.warning, *at.info, *at.success, *at.subheader, *at.title]
    return [e.value for e in elements] + [e.label for e in at.expander]


def test_runs_page_shows_run_folder_names_as_text_never_as_markup(tmp_path, monkeypatch):
    """Before the fix the samples heading rendered IMAGE_NAME as an image (a request to its URL) and the
    legends rendered LINK_NAME as a live link."""
    for name, lr in ((IMAGE_NAME, 1e-4), (LINK_NAME, 3e-4)):
        _fake_run(tmp_path / name, lr, [0.1, 0.2, 0.3])
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    assert sorted(_options(at)) == sorted([IMAGE_NAME, LINK_NAME])  # widget options are plain text: shown as they are
    bodies = _markdown_bodies(at)
    for name in (IMAGE_NAME, LINK_NAME):
        assert not any(name in body for body in bodies)
        assert f"**{markdown_text(name)}**, step 2" in bodies  # the samples heading shows the name, escaped
    charts = [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]
    names = sorted(t["name"] for spec in charts for t in spec["data"] if "name" in t)
    assert names and all("<" not in n and ">" not in n for n in names)
    assert plotly_text(IMAGE_NAME) in names and plotly_text(LINK_NAME + " eval/avg@4") in names  # the eval legend too
    assert html.unescape(plotly_text(LINK_NAME)) == LINK_NAME  # entities: Plotly shows the name as it is


def test_runs_page_shows_a_metric_key_from_a_log_as_text(tmp_path, monkeypatch):
    key = "<b>reward</b>"
    _fake_run(tmp_path / "a", 1e-4, [0.1, 0.2], extra_lines=(json.dumps({"step": 3, key: 1.0}),))
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    at.multiselect(key="runs_metrics").set_value([key]).run()
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]
    assert titles[0] == plotly_text(key)


def test_runs_page_skips_lines_with_a_bad_step_instead_of_failing(tmp_path, monkeypatch):
    bad = ('{"step": NaN, "reward/mean": 1}', '{"step": 1e400, "reward/mean": 1}', '{"step": "7", "reward/mean": 1}')
    _fake_run(tmp_path / "a", 1e-4, [0.1, 0.2, 0.3], extra_lines=bad)
    samples = tmp_path / "a" / RunDir.SAMPLES
    samples.write_text(samples.read_text() + '{"step": "late", "completion": "x"}\n')
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    assert any("4 log line(s) skipped" in w.value for w in at.warning)
    assert _traces(at, "reward/mean")[0]["y"] == [0.1, 0.2, 0.3]


def test_runs_page_shows_a_toy_run_folder_per_objective(tmp_path, monkeypatch):
    from dfpo.cli import main

    out = tmp_path / "runs" / "toy-demo"
    assert main(["toy", "run", "--task", "tenplusten", "--objectives", "gspo,dfpo_min", "--seeds", "2", "--steps", "3", "--no-plots", "--out", str(out)]) == 0  # fmt: skip
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs"))
    at = page("runs")
    assert _options(at) == ["toy-demo: dfpo_min", "toy-demo: gspo"]
    assert [t["name"] for t in _traces(at, "reward")] == ["toy-demo: dfpo_min", "toy-demo: gspo"]
    diff = at.dataframe[0].value
    assert diff.iloc[0]["key"] == "objective"


def test_runs_page_draws_toy_and_trainer_runs_in_the_same_default_charts(tmp_path, monkeypatch):
    """Before the fix the toy logged reward and asym and the trainer reward/mean and weights/asym, so a toy run was
    missing from the default charts whenever a trainer run was chosen beside it."""
    from dfpo.cli import main

    _fake_run(tmp_path / "runs" / "tiny", 1e-4, [0.1, 0.2, 0.3], extra_lines=(json.dumps({"step": 4, "weights/asym": 0.5}),))
    out = tmp_path / "runs" / "toy"
    assert main(["toy", "run", "--task", "tenplusten", "--objectives", "gspo", "--seeds", "2", "--steps", "3", "--no-plots", "--out", str(out)]) == 0  # fmt: skip
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs"))
    at = page("runs")
    assert _options(at) == ["tiny", "toy: gspo"] and len(_chosen(at)) == 2
    assert list(at.multiselect(key="runs_metrics").value) == ["reward/mean", "clip/frac_high", "weights/asym"]
    for title in ("reward/mean", "clip/frac_high", "weights/asym"):
        assert [t["name"] for t in _traces(at, title)] == ["tiny", "toy: gspo"], title


def test_runs_page_inputs_are_kept_when_the_user_comes_back_and_a_run_deleted_meanwhile_is_dropped(tmp_path, monkeypatch):
    import shutil

    for name, lr in (("a", 1e-4), ("b", 2e-4), ("c", 3e-4)):
        _fake_run(tmp_path / "runs" / name, lr, [0.1, 0.2, 0.3], extra_lines=(json.dumps({"step": 4, "loss/policy": 0.5}),))
    _fake_run(tmp_path / "more" / "d", 4e-4, [0.3, 0.4])
    monkeypatch.setenv(RUNS_ENV, str(tmp_path / "runs"))
    at = app()
    at.switch_page("page_runs.py").run()
    ids = {name: str(tmp_path / root / name) for root, names in (("runs", "abc"), ("more", "d")) for name in names}
    inputs = {  # every input away from its default (runs a, b; the three default metrics; no smoothing; no folder)
        ("text_input", "runs_extra"): str(tmp_path / "more"),
        ("multiselect", "runs_chosen"): [ids["c"], ids["d"]],
        ("multiselect", "runs_metrics"): ["loss/policy"],
        ("slider", "runs_smooth"): 3,
    }
    _set_all(at, inputs)
    assert [t["name"] for t in _traces(at, "loss/policy") if "name" in t] == ["c"]  # and its faint raw curve
    _leave_and_come_back(at, "page_runs.py")
    assert _shown(at, inputs) == inputs
    assert [t["name"] for t in _traces(at, "loss/policy") if "name" in t] == ["c"]  # and its faint raw curve
    at.switch_page("page_ledger.py").run()
    shutil.rmtree(tmp_path / "runs" / "c")
    at.switch_page("page_runs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert _chosen(at) == [ids["d"]] and list(at.multiselect(key="runs_metrics").value) == []  # d logs no loss/policy


def test_runs_page_without_runs_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv(RUNS_ENV, str(tmp_path))
    at = page("runs")
    assert any("No run folder found" in i.value for i in at.info)
