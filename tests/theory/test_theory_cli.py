"""`dfpo theory`: table on stdout, --json / --markdown files, --only, and bad input refused early."""

from __future__ import annotations

import json

from dfpo.cli import main


def test_theory_writes_json_and_markdown_for_a_subset(tmp_path, capsys):
    js, md = tmp_path / "ledger.json", tmp_path / "ledger.md"
    rc = main(["theory", "--only", "eq-55", "eq-30", "--json", str(js), "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "eq-30" in out and "eq-55" in out and "fails" in out and "2 claims" in out
    doc = json.loads(js.read_text())
    assert [c["id"] for c in doc["claims"]] == ["eq-30", "eq-55"]
    assert doc["claims"][1]["verdict"] == "fails"
    assert "### `eq-55` — fails" in md.read_text()


def test_verbose_prints_the_evidence(capsys):
    assert main(["theory", "--only", "eq-30", "--verbose"]) == 0
    assert "evidence:" in capsys.readouterr().out


def test_unknown_claim_id_is_a_usage_error(capsys):
    assert main(["theory", "--only", "eq-999"]) == 2
    err = capsys.readouterr().err
    assert "dfpo: error:" in err and "eq-999" in err


def test_unwritable_output_is_refused_before_any_check_runs(tmp_path, capsys):
    assert main(["theory", "--json", str(tmp_path / "missing" / "x.json")]) == 2
    captured = capsys.readouterr()
    assert "--json" in captured.err and "ID" not in captured.out  # no table: nothing ran
