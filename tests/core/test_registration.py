"""Registered experiments (dfpo.core.registration): rows committed before their data, one family per experiment."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpo.core import registration as reg
from dfpo.core import stats

ROOT = Path(__file__).resolve().parents[2]
REGISTERED = sorted((ROOT / "docs" / "attribution" / "registered").glob("*.toml"))

ROW = dict(method="m", control="c", metric="eval", paper="higher", hypothesis="higher", margin=0.02, margin_kind="absolute")


def document(rows=None, **extra):
    raw = {
        "experiment": "x",
        "title": "X",
        "family_alpha": 0.05,
        "sets": [{"name": "x-a", "first_seed": 0, "seeds": 4}, {"name": "x-b", "first_seed": 10, "seeds": 4}],
        "command": "dfpo compare --first-seed {first_seed} --out runs/{name}",
        "rows": rows if rows is not None else [ROW],
    }
    raw.update(extra)
    return raw


def test_every_stored_registration_loads_and_names_two_disjoint_sets():
    assert REGISTERED, "docs/attribution/registered/ holds no registration"
    for path in REGISTERED:
        r = reg.read_registration(path)
        assert len(r.sets) >= 2 and len(r.commands()) == len(r.sets)
        assert all(f"--first-seed {s.first_seed}" in c for s, c in zip(r.sets, r.commands(), strict=True))


def test_stage0_family_level_is_one_experiment_not_the_whole_ledger():
    r = reg.read_registration(ROOT / "docs" / "attribution" / "registered" / "smollm2-stage0.toml")
    assert len(r.rows) == 8
    assert r.per_row_level == pytest.approx(1 - 0.05 / 8)


@pytest.mark.parametrize(
    "change, word",
    [
        (dict(sets=[{"name": "a", "first_seed": 0, "seeds": 4}]), "at least 2"),
        (dict(sets=[{"name": "a", "first_seed": 0, "seeds": 4}, {"name": "b", "first_seed": 3, "seeds": 4}]), "disjoint"),
        (dict(rows=[]), "no rows"),
        (dict(rows=[ROW, ROW]), "twice"),
        (dict(rows=[{**ROW, "paper": "up"}]), "paper='up'"),
        (dict(rows=[{**ROW, "margin": -1}]), "margin=-1"),
        (dict(rows=[{**ROW, "margin_kind": "pct"}]), "margin_kind='pct'"),
        (dict(rows=[{**ROW, "control": ""}]), "control is empty"),
        (dict(family_alpha=1.5), "family_alpha=1.5"),
        (dict(command="dfpo compare"), "{first_seed}"),
    ],
)
def test_a_bad_registration_is_one_sentence_naming_the_value(change, word):
    with pytest.raises(ValueError, match=None) as err:
        reg.load_registration(document(**change))
    assert word in str(err.value) and "\n" not in str(err.value)


def test_verdict_words_follow_the_registered_margin():
    row = reg.load_registration(document()).rows[0]
    control = np.array([0.5, 0.6, 0.55, 0.52, 0.58, 0.61])
    assert reg.registered_verdict(control + 0.2 + 0.001 * np.arange(6), control, row, 0.99).word == "higher"
    assert reg.registered_verdict(control - 0.2 + 0.001 * np.arange(6), control, row, 0.99).word == "lower"
    assert reg.registered_verdict(control + 0.001 * np.array([1, -1, 1, -1, 1, -1]), control, row, 0.99).word == "negligible"
    noisy = control + np.array([0.3, -0.3, 0.25, -0.2, 0.1, -0.1])
    assert reg.registered_verdict(noisy, control, row, 0.99).word == "inconclusive"


def test_a_relative_margin_scales_with_the_control_mean():
    row = reg.RegisteredRow("m", "c", "tax_kl", "lower", "higher", 0.10, "relative")
    assert reg.margin_bound(row, 2.0) == pytest.approx(0.2)
    assert reg.margin_bound(row, -2.0) == pytest.approx(0.2)


def test_a_missing_value_is_refused_not_averaged():
    row = reg.load_registration(document()).rows[0]
    with pytest.raises(ValueError, match="not finite"):
        reg.registered_verdict([0.1, float("nan")], [0.1, 0.2], row, 0.95)


@pytest.mark.parametrize(
    "words, combined",
    [
        (("higher", "higher"), "higher"),
        (("higher", "inconclusive"), "inconclusive"),
        (("negligible", "negligible"), "negligible"),
        (("higher", "lower"), "did not replicate"),
        (("higher", "negligible"), "did not replicate"),
        (("inconclusive", "inconclusive"), "inconclusive"),
    ],
)
def test_an_effect_counts_only_where_every_set_agrees(words, combined):
    assert reg.combined_word(words) == combined


def test_against_prediction_never_reads_inconclusive_as_a_result():
    assert reg.against_prediction("higher", "higher") == "as predicted"
    assert reg.against_prediction("higher", "lower") == "against the prediction"
    assert reg.against_prediction("inconclusive", "lower") == ""
    assert reg.against_prediction("higher", "none") == ""


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 30), st.floats(0.01, 2.0))
def test_detectable_effect_shrinks_as_seeds_grow(n, sd):
    """At the same spread, more seeds never make the smallest detectable effect larger."""

    def at(size: int) -> float:
        z = np.resize([1.0, -1.0], size)  # sd scaled below to exactly ``sd``
        z = (z - z.mean()) / z.std(ddof=1) * sd
        return reg.detectable_effect(z, 0.99)

    assert at(4 * n) < at(n)
    assert at(n) > 0


def test_detectable_effect_is_detected_about_at_its_power():
    rng = np.random.default_rng(0)
    n, level = 8, 0.99
    unit = np.resize([1.0, -1.0], n)
    effect = reg.detectable_effect(unit / unit.std(ddof=1), level)  # n = 8 seeds of spread 1
    hits = 0
    for _ in range(2000):
        d = rng.standard_normal(n) + effect
        hits += stats.paired_interval(d, level=level).low > 0
    assert 0.7 < hits / 2000 < 0.9  # 80% power (the t approximation of the noncentral t)


def _commit(repo: Path, text: str, when: datetime) -> str:
    (repo / "r.toml").write_text(text)
    env = {"GIT_COMMITTER_DATE": when.isoformat(), "GIT_AUTHOR_DATE": when.isoformat(), "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    subprocess.run(["git", "-C", str(repo), "add", "r.toml"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "r"], check=True, env=env)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def test_a_row_added_after_the_data_began_is_exploratory(tmp_path):
    import tomli_w

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    first = _commit(tmp_path, tomli_w.dumps(document()), t0)
    later = [ROW, {**ROW, "metric": "tax_kl"}]
    _commit(tmp_path, tomli_w.dumps(document(rows=later)), t0 + timedelta(hours=3))
    status = reg.row_status(Path("r.toml"), tmp_path, data_started=t0 + timedelta(hours=1))
    rows = reg.load_registration(document(rows=later)).rows
    assert status.registering_commit == first
    assert [status.is_registered(r) for r in rows] == [True, False]
    assert not any(reg.row_status(Path("r.toml"), tmp_path, t0 - timedelta(hours=1)).is_registered(r) for r in rows)


def test_an_uncommitted_registration_is_refused(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    with pytest.raises(ValueError, match="not committed"):
        reg.row_status(Path("r.toml"), tmp_path, datetime(2026, 12, 1, tzinfo=UTC))


def _docs(shift: float, noise: float = 0.0):
    rng = np.random.default_rng(1)
    out = {}
    for name, first in (("x-a", 0), ("x-b", 10)):
        c = 0.5 + 0.05 * rng.standard_normal(4)
        m = c + shift + noise * rng.standard_normal(4)
        out[name] = {
            "records": {"c": {str(first + i): {"eval": c[i]} for i in range(4)}, "m": {str(first + i): {"eval": m[i]} for i in range(4)}}
        }
    return out


def _status(registered: bool):
    keys = frozenset({("m", "c", "eval")}) if registered else frozenset()
    t = datetime(2026, 12, 1, tzinfo=UTC)
    return reg.RowStatus("abcdef1234", t, t + timedelta(hours=1), keys)


def test_the_opening_sentence_names_a_replicated_effect_with_its_numbers():
    r = reg.load_registration(document())
    results = reg.evaluate(r, _docs(0.3, 0.001), _status(True))
    text = reg.stage_sentence(r, results, _status(True), {"eval": "final eval"})
    assert results[0].word == "higher"
    assert "registered before its data in abcdef1" in text and "1 of 1 registered rows" in text and "final eval" in text
    assert "as the paper's and the hypothesis's predictions" in reg.row_sentence(results[0], "final eval")


def test_the_rows_without_an_effect_are_said_by_kind_with_what_the_seeds_could_see():
    """rest_clause: negligible, split and inconclusive rows are counted apart; an inconclusive row names its detectable
    effect in its outcome's units, and an exploratory row is never counted."""
    r = reg.load_registration(document())
    (flat,) = reg.evaluate(r, _docs(0.0, 0.3), _status(True))
    (late,) = reg.evaluate(r, _docs(0.3, 0.001), _status(False))
    text = reg.rest_clause([flat, late])
    size = max(v.detectable for v in flat.per_set)
    assert text == (
        "1 exploratory (added after the data: never counted); 1 not shown either way, which is not 'no change': the seeds "
        f"could detect only an effect of about {size:.3g} on `eval` against `c` or more"
    )


def test_nothing_found_is_said_with_the_effect_the_seeds_could_see():
    r = reg.load_registration(document())
    results = reg.evaluate(r, _docs(0.0, 0.3), _status(True))
    text = reg.stage_sentence(r, results, _status(True), {"eval": "final eval"})
    assert results[0].word == "inconclusive"
    assert "not 'no change'" in text and "could detect only a change of about" in text
    assert "not shown either way" in reg.row_sentence(results[0], "final eval")


def test_a_row_added_after_its_data_is_called_exploratory_and_never_counted():
    r = reg.load_registration(document())
    results = reg.evaluate(r, _docs(0.3, 0.001), _status(False))
    assert "exploratory" in reg.row_sentence(results[0], "final eval")
    assert "none of its 1 rows" in reg.stage_sentence(r, results, _status(False), {})


def test_a_missing_set_names_the_command_that_makes_it():
    r = reg.load_registration(document())
    docs = _docs(0.3)
    del docs["x-b"]
    with pytest.raises(ValueError, match="--first-seed 10 --out runs/x-b"):
        reg.evaluate(r, docs, None)


def test_readme_opens_with_a_sentence_for_every_registered_experiment():
    from dfpo.core.findings import METRICS  # the outcome names README's sentences use

    sentences = reg.registered_sentences(ROOT, METRICS)
    assert len(sentences) == len(REGISTERED)
    readme = (ROOT / "README.md").read_text()
    assert all(s in readme for s in sentences)
    assert readme.index(sentences[0]) < readme.index("Generated from the findings ledger")


def test_an_experiment_without_stored_tables_has_found_nothing_yet():
    r = reg.load_registration(document())
    text = reg.pending_sentence(r, "0123456789")
    assert "registered before its data in 0123456" in text and "found nothing yet" in text and "1 rows, 4 and 4 seeds" in text


def test_the_rows_table_is_what_was_registered():
    r = reg.read_registration(ROOT / "docs" / "attribution" / "registered" / "smollm2-stage1.toml")
    table = reg.rows_table(r)
    assert table.count("\n") == 1 + len(r.rows) and "template_kl (primary)" in table
    assert "+-10% of the control's mean" in table and "+-0.02" in table
    assert r.pilot and (ROOT / r.pilot).is_file()


def _stored(coef_m, coef_c, norm_m, norm_c):
    """A stored experiment of document(): both sets hold the same per-seed coef_whole and update_norm records."""
    doc = {"records": {"m": {}, "c": {}}}
    for label, coef, norm in (("m", coef_m, norm_m), ("c", coef_c, norm_c)):
        for seeds in (range(0, 4), range(10, 14)):
            doc["records"][label].update(
                {str(s): {"coef_whole": cw, "update_norm": un} for s, cw, un in zip(seeds, coef, norm, strict=True)}
            )
    return {"sets": {"x-a": {"doc": doc}, "x-b": {"doc": doc}}}


def test_exact_cancellation_reads_as_exactly_zero_in_every_cell_beside_its_controls_mass():
    """B's whole-group coefficient mass is 0 by construction: said as a count of cells, the control's as a spread."""
    r = reg.load_registration(document())
    lines = reg.mechanism_lines(r, _stored([0.0] * 4, [0.8, 1.0, 1.2, 1.9], [1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 2.0]))
    assert len(lines) == 2 and lines[0].startswith("`m` against `c` on `x-a` (not tested)")
    assert "exactly 0 in 4 of its 4 cells, its control's median 1.1 (range 0.8 to 1.9)" in lines[0]
    assert "update norm per step median 2 (range 1 to 3) times its control's over 4 paired seeds" in lines[0]


def test_a_mass_above_zero_is_never_rounded_to_zero():
    text = reg.coefficient_clause(np.array([0.0, 1e-9]), np.array([1.0, 1.0]))
    assert "exactly 0 in 1 of 2 cells" in text and "exactly 0 in 2" not in text


def test_a_pair_that_logged_neither_outcome_says_nothing():
    r = reg.load_registration(document())
    nan = [float("nan")] * 4
    assert reg.mechanism_lines(r, _stored(nan, nan, nan, nan)) == []
    assert reg.update_norm_clause(np.array([1.0, 2.0]), np.array([0.0, float("nan")])) == ""


CANCEL_ROW = dict(ROW, method="m:cancel=shared_whole", primary=True)


@pytest.mark.parametrize(
    "shift, sd, says",
    [
        (0.3, 0.001, "it is higher on every set, so the next stage (a transform against this bound) is to run"),
        (0.0, 0.001, "within +-0.02 on every set, so no in-group transform can change it by more"),
        (0.0, 0.3, "it is not shown either way, so no in-group transform is shown to gain through this mechanism here"),
    ],
)
def test_an_exact_cancellation_primary_row_says_what_it_bounds_and_whether_the_next_stage_runs(shift, sd, says):
    """B - A bounds every in-group transform's gain through eq 2's gradient: the opening sentence says so from the row."""
    r = reg.load_registration(document(rows=[CANCEL_ROW]))
    docs = _docs(shift, sd)
    docs = {name: {"records": {"m:cancel=shared_whole": d["records"]["m"], "c": d["records"]["c"]}} for name, d in docs.items()}
    keys = frozenset({("m:cancel=shared_whole", "c", "eval")})
    t = datetime(2026, 12, 1, tzinfo=UTC)
    status = reg.RowStatus("abcdef1234", t, t + timedelta(hours=1), keys)
    text = reg.stage_sentence(r, reg.evaluate(r, docs, status), status, {"eval": "final eval"})
    assert "bounds what any in-group transform can gain" in text and says in text and text.endswith(".")


def test_a_row_without_the_exact_cancellation_arm_says_nothing_about_a_bound():
    r = reg.load_registration(document(rows=[dict(ROW, primary=True)]))
    assert reg.ceiling_clause(reg.evaluate(r, _docs(0.3, 0.001), _status(True))) == ""


def test_an_outcome_that_never_varied_is_said_to_tell_nothing_not_to_be_negligible():
    """A registered outcome equal to one value in every cell of both arms (the entropy over equivalent answers when
    every correct answer takes the template) cannot tell the arms apart: its sentence and the rest clause say so."""
    r = reg.load_registration(document())
    docs = {
        name: {"records": {lab: {str(first + i): {"eval": 0.0} for i in range(4)} for lab in "mc"}}
        for name, first in (("x-a", 0), ("x-b", 10))
    }
    (result,) = reg.evaluate(r, docs, _status(True))
    assert result.constant and result.word == "negligible"
    assert reg.row_sentence(result, "final eval").endswith(
        ": 0 in every cell of both arms on every set, so this outcome cannot tell them apart on this task."
    )
    assert reg.rest_clause([result]) == "1 took one value in every cell of both arms (it cannot tell them apart here)"
    negative_zero = {name: {"records": {lab: {s: {"eval": -0.0} for s in d["records"][lab]} for lab in "mc"}} for name, d in docs.items()}
    assert ": 0 in every cell" in reg.row_sentence(reg.evaluate(r, negative_zero, _status(True))[0], "final eval")
    (varied,) = reg.evaluate(r, _docs(0.0, 0.001), _status(True))
    assert not varied.constant


def test_a_row_not_shown_says_which_set_decided_on_its_own():
    """A row is not shown when one set is negligible and the other cannot tell (stage 1's primary row: one seed of the
    second set): its sentence and the bound's clause name the set that decided and its margin, and count nothing."""
    r = reg.load_registration(document(rows=[CANCEL_ROW]))
    docs = _docs(0.0, 0.001)
    docs["x-b"]["records"]["m"] = {s: {"eval": v["eval"] + (0.4 if s == "10" else 0.0)} for s, v in docs["x-b"]["records"]["m"].items()}
    docs = {name: {"records": {"m:cancel=shared_whole": d["records"]["m"], "c": d["records"]["c"]}} for name, d in docs.items()}
    keys = frozenset({("m:cancel=shared_whole", "c", "eval")})
    t = datetime(2026, 12, 1, tzinfo=UTC)
    status = reg.RowStatus("abcdef1234", t, t + timedelta(hours=1), keys)
    (result,) = reg.evaluate(r, docs, status)
    assert [v.word for v in result.per_set] == ["negligible", "inconclusive"] and result.word == "inconclusive"
    said = "negligible on `x-a` only, within +-0.02 there"
    assert f"; {said}; these seeds could detect only" in reg.row_sentence(result, "final eval")
    assert f"it is not shown either way ({said}), so no in-group transform is shown to gain" in reg.ceiling_clause([result])
    (flat,) = reg.evaluate(reg.load_registration(document()), _docs(0.0, 0.3), _status(True))
    assert flat.decided_on_some_sets_only() == "" and "on `x-" not in reg.row_sentence(flat, "final eval")
