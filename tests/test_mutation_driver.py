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


@pytest.mark.parametrize(
    "code, status",
    [(0, "survived"), (1, "killed"), (2, "killed"), (3, "error"), (4, "error"), (5, "error"), (-9, "error")],
)
def test_only_a_failing_or_uncollectable_run_kills_and_tests_that_did_not_run_are_an_error(code, status):
    got, detail = mutation.classify(code, "FAILED tests/a.py::test_x - assert 1 == 2\n1 failed")
    assert got == status
    assert (f"pytest exit code {code}" in detail) == (status == "error")


def _project(tmp_path):
    """A project of one module and its test, where a mutant of ``value`` is killed by tests/test_a.py."""
    (tmp_path / "a.py").write_text("def value():\n    return 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("from a import value\n\n\ndef test_value():\n    assert value() == 1\n")
    (tmp_path / "tests" / "test_other.py").write_text("def test_nothing_about_a():\n    assert True\n")
    (tmp_path / "conftest.py").write_text("import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\n")
    return mutation.Workspace(tmp_path)


@pytest.mark.parametrize(
    "tests, status",
    [
        (("tests/test_a.py",), "killed"),
        (("tests/test_other.py",), "survived"),
        (("tests/test_absent.py",), "error"),  # pytest exit 4: no such file
        (("tests/test_a.py::test_absent",), "error"),  # pytest exit 4: no such node id
        (("tests/test_a.py", "-k", "no_test_matches_this"), "error"),  # pytest exit 5: nothing collected
    ],
)
def test_a_mutant_whose_tests_do_not_run_is_an_error_not_a_kill(tmp_path, tests, status):
    workspace = _project(tmp_path)
    m = mutation.Mutant("v", "p", "a.py", "return 1", "return 2", "", tests)
    outcome = mutation.run_mutant(m, timeout=60, workspace=workspace)
    assert outcome.status == status
    assert (tmp_path / "a.py").read_text() == "def value():\n    return 1\n"
    assert mutation.kill_rates([outcome]) == {"p": (int(status == "killed"), 1)}


def test_a_selection_that_fails_without_the_mutant_makes_it_an_error_and_it_never_runs(tmp_path, capsys):
    workspace = _project(tmp_path)
    (tmp_path / "tests" / "test_broken.py").write_text("def test_broken():\n    assert False\n")
    m = mutation.Mutant("v", "p", "a.py", "return 1", "return 2", "", ("tests/test_broken.py",))
    (outcome,) = mutation.run_all([m], workspace, timeout=60)
    assert outcome.status == "error" and "without any mutant its tests do not pass (pytest exit code 1" in outcome.detail
    assert mutation.report([outcome], 0.9) == 1
    assert "errors (the tests did not run, or fail without the mutant):" in capsys.readouterr().out


def test_kill_rates_count_an_error_as_a_mutant_not_killed():
    def outcome(status):
        return mutation.Outcome(mutation.Mutant(status, "p", "f", "a", "b", "", ("t",)), status, 0.0)

    assert mutation.kill_rates([outcome(s) for s in ("killed", "error", "stale")]) == {"p": (1, 2)}


def test_the_copy_imports_its_own_packages_so_the_checkout_is_never_mutated(tmp_path):
    """In a copy, dfpo.core and dfpo.trainer are the copy's files (not the editable install's), and a mutant of the
    copy leaves the checkout's file as it was."""
    import subprocess
    import sys

    workspace = mutation.copy_checkout(tmp_path)
    where = subprocess.run(
        [sys.executable, "-c", "import dfpo.core.stats as s, dfpo.trainer.run.code as c; print(s.__file__); print(c.__file__)"],
        cwd=tmp_path,
        env=workspace.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert where == [str(tmp_path / "core" / "stats.py"), str(tmp_path / "trainer" / "run" / "code.py")]
    checkout = (_PATH.parents[1] / "core" / "stats.py").read_text()
    (tmp_path / "core" / "stats.py").write_text(checkout.replace("def student_t_cdf(", "def student_t_cdf_mutated("))
    probe = "import dfpo.core.stats as s; print(hasattr(s, 'student_t_cdf_mutated'))"
    seen = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=workspace.env, capture_output=True, text=True, check=True)
    assert seen.stdout.strip() == "True" and (_PATH.parents[1] / "core" / "stats.py").read_text() == checkout
