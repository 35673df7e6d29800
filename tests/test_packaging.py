"""One distribution `dfpo`, one namespace, one console command."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MAPPING = PYPROJECT["tool"]["setuptools"]["package-dir"]


def test_every_package_folder_is_listed_under_the_dfpo_namespace():
    """A folder with __init__.py that pyproject does not list would silently not install."""
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = set()
    for name, folder in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found == listed
    assert all(name == "dfpo" or name.startswith("dfpo.") for name in listed)


def test_installed_distribution_has_no_bare_top_level_modules(tmp_path):
    """Outside the source tree, `import app` / `import trainer` must fail: only `dfpo.*` is installed."""
    code = "import importlib.util as u; print([m for m in ('app', 'trainer', 'toy', 'theory') if u.find_spec(m)]); import dfpo.core.loss, dfpo.app, dfpo.toy, dfpo.theory"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_public_api():
    import dfpo

    assert callable(dfpo.policy_loss) and callable(dfpo.group_advantages)
    assert {
        "grpo",
        "dr_grpo",
        "dapo",
        "gspo",
        "gspo_token",
        "grpo_fix",
        "dfpo_min",
        "dfpo_orth",
        "dfpo_orth_pos",
        "dfpo_orth_tr",
        "stapo",
    } <= set(dfpo.OBJECTIVES)


def _dfpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dfpo", *args], capture_output=True, text=True, timeout=120)


def test_cli_version():
    import dfpo

    out = _dfpo("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"dfpo {dfpo.__version__}"


def test_cli_objectives_lists_every_preset_with_its_sources():
    import dfpo

    out = _dfpo("objectives", "--long")  # the default is the compact table (tests/test_cli_objectives.py)
    assert out.returncode == 0
    for name, spec in dfpo.OBJECTIVES.items():
        assert name in out.stdout
        for source in spec.sources.values():
            assert source in out.stdout
    assert "paper gives no clip range for DFPO" in out.stdout


def test_cli_objectives_unknown_name_is_a_clear_error():
    out = _dfpo("objectives", "ppo2")
    assert out.returncode == 2 and "ppo2" in out.stderr and "Traceback" not in out.stderr


def test_cli_demo_shows_gspo_failing_and_dfpo_cancelling():
    """Default (ratio-form) DFPO at GSPO's clip range does not cancel once part of the group clips;
    the score form and the unclipped ratio form cancel at equal lengths, length-aware at all lengths."""
    out = _dfpo("demo")
    assert out.returncode == 0
    rows = {
        line.split("  ")[0].strip(): line
        for line in out.stdout.splitlines()
        if line.split()[:1] and line.split()[0] in {"gspo", "dfpo_min"}
    }
    assert "cancels" not in rows["gspo"]
    assert "cancels" not in rows["dfpo_min"]
    assert rows["dfpo_min clip=none"].count("0 (cancels)") == 2
    assert rows["dfpo_min stopgrad=score"].count("0 (cancels)") == 2
    assert rows["dfpo_min stopgrad=score length_aware=True"].count("0 (cancels)") == 4


def test_every_preset_value_that_differs_from_the_shared_default_cites_its_own_source():
    """Each preset is data: a component it changes must say where the new value comes from."""
    import dataclasses

    import dfpo
    from dfpo.core.loss.spec import COMMON_SOURCES

    defaults = {f.name: f.default for f in dataclasses.fields(dfpo.ObjectiveSpec) if f.name in COMMON_SOURCES}
    assert set(COMMON_SOURCES) == set(dfpo.core.loss.COMPONENT_FIELDS)
    for name, spec in dfpo.OBJECTIVES.items():
        for component, default in defaults.items():
            assert spec.source(component)
            if getattr(spec, component) != default:
                assert component in spec.sources, f"{name}.{component} changes the default without a source"


def test_the_python_floor_in_pyproject_is_the_one_the_code_needs():
    """The code imports tomllib (3.11+); requires-python states that floor, and this interpreter meets it."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"].startswith(">=3.11")
    assert sys.version_info >= (3, 11)


PARTS = {name.split(".", 1)[1]: folder for name, folder in MAPPING.items() if name.count(".") == 1 and name != "dfpo.integrations"}
SCRIPTS = {"app/main.py", "trainer/rewards/worker.py"}
"""Files run as scripts (Streamlit runs app/main.py and the pages by path; the reward worker runs as ``python -P``):
a relative import cannot run there, so they import ``dfpo.*`` absolutely."""


def _part_modules() -> list[pathlib.Path]:
    files = [p for folder in PARTS.values() for p in (ROOT / folder).rglob("*.py")]
    return [p for p in files if str(p.relative_to(ROOT)) not in SCRIPTS and not p.name.startswith("page_")]


def _imports_of_dfpo(path: pathlib.Path) -> list[tuple[int, str, int]]:
    """(line, module, level) of every ``from X import``/``import X`` that names dfpo (absolute) or is relative."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "dfpo"):
            found.append((node.lineno, node.module or "", node.level))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, 0) for a in node.names if a.name.split(".")[0] == "dfpo"]
    return found


def test_every_import_between_dfpo_modules_in_a_part_is_relative_and_lands_on_a_file():
    """A static tool (an editor, an import graph) follows an import by the file tree, not by pyproject's package-dir
    mapping: inside core/, theory/, toy/, trainer/ and app/ every import of dfpo is relative, and resolving it by
    folders from the importing file reaches a module or package of the tree (the root folders sit side by side, as
    their packages do under dfpo)."""
    problems = []
    for path in _part_modules():
        for line, module, level in _imports_of_dfpo(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if level == 0:
                problems.append(f"{where}: absolute import of {module}")
                continue
            base = path.parent
            for _ in range(level - 1):
                base = base.parent
            target = base.joinpath(*module.split(".")) if module else base
            if not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()):
                problems.append(f"{where}: {'.' * level}{module} resolves to no file ({target.relative_to(ROOT)})")
    assert not problems, "\n".join(problems)


LAYERS = {"core": set(), "theory": {"core"}, "toy": {"core"}, "trainer": {"core"}, "app": {"core", "theory", "toy", "trainer"}}
"""Which parts each part may import: the shared core imports none, the ledger, the toy and the trainer only the core
(the toy does not depend on the LLM trainer, nor the trainer on the toy), the explorer any of them."""


def test_the_parts_depend_on_each_other_in_one_direction():
    """Every import between parts goes down the layers (resolved statically, by files, as the test above checks)."""
    assert set(LAYERS) == set(PARTS)
    wrong = []
    for path in [p for folder in PARTS.values() for p in (ROOT / folder).rglob("*.py")]:
        part = path.relative_to(ROOT).parts[0]
        for line, module, level in _imports_of_dfpo(path):
            if level:
                base = path.parent
                for _ in range(level - 1):
                    base = base.parent
                target = base.joinpath(*module.split(".")).relative_to(ROOT).parts[0]
            else:
                target = module.split(".")[1] if module.count(".") else "dfpo"
            if target != part and target not in LAYERS[part] | {"dfpo"}:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {part} imports {target}")
    assert not wrong, "\n".join(wrong)


def _runtime_import_targets(path: pathlib.Path) -> set[pathlib.Path]:
    """The files of the tree that importing ``path`` runs at once: its module-level relative imports (inside a
    top-level ``if``/``try`` too), not those under ``if TYPE_CHECKING:`` nor those deferred into a function."""
    import ast

    def top_level(body):
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                yield from top_level(node.body + node.orelse + [n for h in getattr(node, "handlers", []) for n in h.body])
            elif isinstance(node, ast.ImportFrom) and node.level:
                yield node

    found = set()
    for node in top_level(ast.parse(path.read_text()).body):
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        target = base.joinpath(*(node.module or "").split(".")) if node.module else base
        for candidate in [target, *(target / a.name for a in node.names)]:
            for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
                if file.is_file() and file != path:
                    found.add(file)
    return found


def test_no_module_imports_itself_round_a_circle_when_it_loads():
    """Loading any module of a part never comes back to a module still loading (annotation-only imports aside)."""
    graph = {p: _runtime_import_targets(p) for folder in PARTS.values() for p in (ROOT / folder).rglob("*.py")}
    state: dict[pathlib.Path, int] = {}  # 1: on the current path, 2: done

    def circle_from(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in state and (found := circle_from(nxt, [*path, node])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := circle_from(start, [])):
            raise AssertionError(" -> ".join(str(p.relative_to(ROOT)) for p in found))
