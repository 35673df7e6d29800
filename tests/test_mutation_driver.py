"""The mutation driver (scripts/mutation.py): its list format is checked and its rates are counted right."""

from __future__ import annotations

import pathlib

import pytest
from script_modules import load_script

_PATH = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "mutation.py"
mutation = load_script(_PATH, "mutation_driver")


def _write(tmp_path, text):
    (tmp_path / "a.toml").write_text(text, encoding="utf-8")
    return tmp_path


def test_every_mutant_in_the_repository_loads_and_names_a_unique_id():
    mutants = mutation.load_mutants()
    assert len({m.id for m in mutants}) == len(mutants)
    assert all(m.tests and m.find != m.replace for m in mutants)


def test_every_mutant_finds_its_text_exactly_once():
    """A refactor that moves the code a mutant targets must move the mutant too (else it is silently left out)."""
    root = _PATH.parents[1]
    stale = [f"{m.id}: {m.file}" for m in mutation.load_mutants() if (root / m.file).read_text().count(m.find) != 1]
    assert not stale


def test_mutant_inherits_the_file_default_tests(tmp_path):
    d = _write(tmp_path, 'part = "toy"\ntests = ["tests/a.py"]\n[[mutant]]\nid = "x"\nfile = "f.py"\nfind = "a"\nreplace = "b"\n')
    (m,) = mutation.load_mutants(d)
    assert (m.part, m.tests, m.why) == ("toy", ("tests/a.py",), "")


@pytest.mark.parametrize(
    "text, message",
    [
        ('tests = ["t"]\n[[mutant]]\nid="x"\nfile="f"\nfind="a"\nreplace="b"\n', "'part'"),
        ('part = "p"\n[[mutant]]\nid="x"\nfile="f"\nfind="a"\n', "['replace']"),
        ('part = "p"\n[[mutant]]\nid="x"\nfile="f"\nfind="a"\nreplace="b"\n', "names no tests"),
        ('part = "p"\ntests=["t"]\n[[mutant]]\nid="x"\nfile="f"\nfind="a"\nreplace="a"\n', "with itself"),
        (
            'part = "p"\ntests=["t"]\n[[mutant]]\nid="x"\nfile="f"\nfind="a"\nreplace="b"\n[[mutant]]\nid="x"\nfile="f"\nfind="c"\nreplace="d"\n',
            "duplicate mutant id='x'",
        ),
    ],
)
def test_bad_mutant_lists_are_refused_naming_the_problem(tmp_path, text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        mutation.load_mutants(_write(tmp_path, text))


def test_kill_rates_count_timeouts_as_kills_and_leave_stale_mutants_out():
    def outcome(part, status):
        m = mutation.Mutant(f"{part}-{status}", part, "f", "a", "b", "", ("t",))
        return mutation.Outcome(m, status, 0.0)

    outcomes = [outcome("loss", s) for s in ("killed", "timeout", "survived", "stale")] + [outcome("toy", "killed")]
    assert mutation.kill_rates(outcomes) == {"loss": (2, 3), "toy": (1, 1)}


def test_a_stale_mutant_is_reported_without_touching_the_file(tmp_path):
    m = mutation.Mutant("gone", "loss", "scripts/mutation.py", "text that is not in the driver" * 2, "b", "", ("t",))
    before = _PATH.read_text()
    assert mutation.run_mutant(m, timeout=5).status == "stale"
    assert _PATH.read_text() == before
