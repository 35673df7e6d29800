"""Users' own objectives: ``dfpo.register_objective`` and the ``dfpo.objectives`` entry-point group.

A package outside dfpo (``plugin_fixture``: its own dist-info and entry_points.txt on a path the test controls) gets
its objective into ``dfpo objectives``, the cancellation atlas and matrix, the toy, the trainer and both integrations
without an edit to dfpo.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from plugin_fixture import OBJECTIVE, PACKAGE, SOURCE, write_plugin

import dfpo
from dfpo import OBJECTIVES, policy_loss, register_objective
from dfpo.core.loss import ObjectivePluginError, objective_from_label
from dfpo.core.loss.objectives import OBJECTIVES as CORE_OBJECTIVES
from dfpo.core.loss.registry import BUILTIN, ObjectiveRegistry

ROOT = Path(__file__).resolve().parents[2]


def test_one_registry_behind_every_name():
    assert dfpo.OBJECTIVES is CORE_OBJECTIVES and dfpo.register_objective is register_objective
    assert OBJECTIVES.builtin == tuple(list(OBJECTIVES)[: len(OBJECTIVES.builtin)])
    assert all(OBJECTIVES.origin(name) == BUILTIN for name in OBJECTIVES.builtin)


def test_a_registered_objective_is_a_preset_like_dfpos_own(registered):
    """base's spec with the components changed, each citing the source; policy_loss, labels and resolve read it."""
    spec = register_objective("grpo_tm_test", base="grpo", source="a test: token-mean GRPO", aggregation="token_mean")
    registered.append("grpo_tm_test")
    assert OBJECTIVES["grpo_tm_test"] is spec
    assert spec.aggregation == "token_mean" and spec.eps_low == OBJECTIVES["grpo"].eps_low
    assert spec.source("aggregation") == "a test: token-mean GRPO"
    assert spec.source("eps_low") == OBJECTIVES["grpo"].source("eps_low")
    assert spec.description == "grpo with aggregation='token_mean'"
    assert OBJECTIVES.origin("grpo_tm_test") == f"register_objective in {__name__}"
    assert objective_from_label("grpo_tm_test:eps_high=0.3").eps_high == 0.3
    g = torch.Generator().manual_seed(0)
    logp, mask = -torch.rand(4, 5, generator=g, dtype=torch.float64), torch.ones(4, 5, dtype=torch.bool)
    kwargs = dict(
        logp=logp, old_logp=logp - 0.1, advantages=torch.tensor([1.0, -1, 0.5, -0.5]), mask=mask, group_ids=torch.tensor([0, 0, 1, 1])
    )
    torch.testing.assert_close(policy_loss("grpo_tm_test", **kwargs)[0], policy_loss("grpo", aggregation="token_mean", **kwargs)[0])


def test_per_component_sources_and_a_description(registered):
    spec = register_objective(
        "dapo_tight_test",
        base="dapo",
        source={"eps_high": "paper X, table 2", "beta": "paper X, eq 4"},
        description="DAPO with a KL term",
        eps_high=0.25,
        beta=0.01,
    )
    registered.append("dapo_tight_test")
    assert (spec.source("eps_high"), spec.source("beta"), spec.description) == ("paper X, table 2", "paper X, eq 4", "DAPO with a KL term")


@pytest.mark.parametrize(
    "name,kwargs,match",
    [
        ("grpo", dict(base="grpo", source="s"), "objective 'grpo' is already registered \\(by dfpo\\)"),
        ("My Loss", dict(base="grpo", source="s"), "lower-case letters, digits and underscores.*'My Loss'"),
        ("a:b", dict(base="grpo", source="s"), "'a:b'"),
        ("fresh_test", dict(base="ppo2", source="s"), "base='ppo2' is not a registered objective"),
        ("fresh_test", dict(base="grpo", source="  ", eps_low=0.1), "needs a source"),
        ("fresh_test", dict(base="grpo", source={"eps_low": "s"}, eps_low=0.1, beta=0.1), "missing \\['beta'\\]"),
        ("fresh_test", dict(base="grpo", source={"beta": "s"}), "not changed \\['beta'\\]"),
        ("fresh_test", dict(base="grpo", source="s", epsilon=0.1), "unknown component\\(s\\) \\['epsilon'\\] for objective 'fresh_test'"),
        ("fresh_test", dict(base="grpo", source="s", eps_low=3.0), "objective 'fresh_test': eps_low must be in \\[0, 1\\], got 3.0"),
        ("fresh_test", dict(base="gspo", source="s", clip="cispo"), "objective 'fresh_test': clip='cispo' is a token-level objective"),
    ],
)
def test_a_bad_registration_is_one_sentence_naming_the_value(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        register_objective(name, **kwargs)
    assert "fresh_test" not in OBJECTIVES


def test_dfpos_presets_cannot_be_removed():
    with pytest.raises(ValueError, match="one of dfpo's presets"):
        OBJECTIVES.remove("grpo")


# --- the dfpo.objectives entry points, in a fresh registry of this process -------------------------------------


def _fresh_registry(monkeypatch, folder: Path) -> ObjectiveRegistry:
    """A registry with dfpo's presets that will load the entry points found with ``folder`` on sys.path, and
    register_objective pointed at it."""
    from dfpo.core.loss import objectives

    registry = ObjectiveRegistry(OBJECTIVES[name] for name in OBJECTIVES.builtin)
    monkeypatch.delitem(sys.modules, PACKAGE, raising=False)  # each test's own fixture package, not an earlier one
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(objectives, "OBJECTIVES", registry)
    return registry


def test_an_entry_point_registers_before_the_first_read(tmp_path, monkeypatch):
    registry = _fresh_registry(monkeypatch, write_plugin(tmp_path))
    assert registry._state == "unloaded"
    assert OBJECTIVE in registry  # the first read calls the entry point
    spec = registry[OBJECTIVE]
    assert (spec.eps_high, spec.aggregation, spec.source("eps_high")) == (0.28, "token_mean", SOURCE)
    assert registry.origin(OBJECTIVE) == "entry point fixture = dfpo_fixture_objectives:register (dfpo-fixture-objectives 0.1)"
    assert list(registry)[-1] == OBJECTIVE and registry.builtin == OBJECTIVES.builtin


def test_an_entry_point_may_read_the_registry_itself(tmp_path, monkeypatch):
    body = """
import dfpo.core.loss.objectives as o
n = len(o.OBJECTIVES)  # reading while loading must not load again
o.register_objective("grpo_n_test", base="grpo", source=f"registered after {n} objectives", beta=0.0)
"""
    registry = _fresh_registry(monkeypatch, write_plugin(tmp_path, body))
    assert registry["grpo_n_test"].source("beta") == f"registered after {len(registry.builtin)} objectives"


@pytest.mark.parametrize(
    "body,entry,match",
    [
        ("import no_such_module_here", None, "failed: ModuleNotFoundError: No module named 'no_such_module_here'"),
        ("raise RuntimeError('boom')", None, "failed: RuntimeError: boom"),
        ("pass", "dfpo_fixture_objectives:missing", "could not be imported \\(AttributeError"),
        ("pass", "dfpo_fixture_objectives:NOT_CALLABLE", "names a int, not a callable"),
        ("import dfpo\ndfpo.register_objective('grpo', base='grpo', source='s')", None, "'grpo' is already registered"),
    ],
)
def test_a_broken_entry_point_is_one_sentence_on_every_read(tmp_path, monkeypatch, body, entry, match):
    """The error names the entry point and its distribution; nothing the failed load registered stays."""
    good = "import dfpo\ndfpo.register_objective('early_test', base='grpo', source='s', beta=0.01)\n"
    registry = _fresh_registry(monkeypatch, write_plugin(tmp_path, good + body, **({"entry": entry} if entry else {})))
    for _ in range(2):
        with pytest.raises(ObjectivePluginError, match=match) as info:
            list(registry)
        assert "entry point fixture" in str(info.value) and "\n" not in str(info.value)
    assert "early_test" not in registry._specs


# --- a separate installed package, seen by every part of dfpo (subprocesses with the fixture on PYTHONPATH) ---

_RUN_COMMANDS = """
import contextlib, io, json, sys
from dfpo.cli import main
out = {}
for key, argv in json.loads(sys.argv[1]).items():
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(argv)
    out[key] = [code, buf.getvalue(), err.getvalue()]
import torch
from dfpo.core.loss import OBJECTIVES, objective_from_label
from dfpo.integrations.verl import loss_mode_name, make_verl_policy_loss
spec = objective_from_label("grpo_fixture:eps_low=0.1")  # the label DFPOGRPOTrainer(objective=...) resolves
mask = torch.ones(4, 3)
loss, metrics = make_verl_policy_loss(OBJECTIVES["grpo_fixture"], group_size=2)(-torch.ones(4, 3), -torch.ones(4, 3), torch.ones(4, 3), mask)
out["integrations"] = [spec.eps_low, loss_mode_name("grpo_fixture"), float(loss)]
print(json.dumps(out))
"""


def _with_plugin(tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(write_plugin(tmp_path / "site")), os.environ.get("PYTHONPATH", "")]))
    env.pop("CI", None)
    return env


def test_a_separate_package_gets_dfpo_objectives_the_atlas_the_toy_the_trainer_and_the_integrations(tmp_path):
    commands = {
        "objectives": ["objectives"],
        "one": ["objectives", OBJECTIVE],
        "atlas": ["objectives", "--atlas", "--own-aggregation"],
        "toy": [
            "toy",
            "run",
            "--objectives",
            f"{OBJECTIVE},grpo",
            "--steps",
            "2",
            "--seeds",
            "2",
            "--no-plots",
            "--out",
            str(tmp_path / "toy"),
        ],
        "train": ["train", "--print-config", "--set", f"objective.name={OBJECTIVE}"],
    }
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_COMMANDS, json.dumps(commands)],
        env=_with_plugin(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for key, (code, _, err) in out.items():
        if key != "integrations":
            assert code == 0, (key, err)
    assert f"{OBJECTIVE}: grpo with eps_high=0.28, aggregation='token_mean'" in out["objectives"][1]
    assert "registered by entry point fixture = dfpo_fixture_objectives:register (dfpo-fixture-objectives 0.1)" in out["objectives"][1]
    assert SOURCE in out["one"][1]
    atlas_row = next(line for line in out["atlas"][1].splitlines() if line.startswith(OBJECTIVE))
    assert atlas_row.split()[1:4] == ["token_mean", "cancels", atlas_row.split()[3]] and atlas_row.split()[4] == "cancels"
    assert OBJECTIVE in (tmp_path / "toy" / "summary.md").read_text()
    assert {json.loads(line)["objective"] for line in (tmp_path / "toy" / "metrics.jsonl").read_text().splitlines()} == {OBJECTIVE, "grpo"}
    assert f'name = "{OBJECTIVE}"' in out["train"][1]
    eps_low, mode, loss = out["integrations"]
    assert (eps_low, mode) == (0.1, f"dfpo_{OBJECTIVE}") and loss == pytest.approx(-1.0, abs=1e-12)  # -A r at every token, A = r = 1


@pytest.mark.slow
def test_a_separate_package_gets_the_cancellation_matrix_and_a_training_run(tmp_path):
    """The matrix's 16 cells of the fixture's objective (its verdict family derived from its components) pass, and
    dfpo train runs it for two steps."""
    env = _with_plugin(tmp_path)
    matrix = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/core/test_cancellation.py"), "-k", OBJECTIVE],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert matrix.returncode == 0 and "16 passed" in matrix.stdout, matrix.stdout[-3000:]
    train = subprocess.run(
        [sys.executable, "-m", "dfpo", "train", "--quiet", "--set", f"objective.name={OBJECTIVE}", "--set", "train.steps=2",
         "--set", f'run_dir="{tmp_path / "run"}"', "--set", "eval.every=0"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2


def test_a_new_clip_rule_and_an_objective_on_it(registered):
    """A clip mode registered outside dfpo: the spec accepts it, reads exactly the fields the rule declares, and the
    loss is the rule's surrogate; the cancellation matrix states no verdict for it (its family is None)."""
    from test_cancellation import family_of

    from dfpo.core.loss import CLIP_RULES, ClipRule, register_clip_rule
    from dfpo.core.loss.clipping import _symmetric_flags

    rule = ClipRule(lambda r, a, spec, old: r.clamp(max=1.0 + spec.eps_high), _symmetric_flags, reads=("eps_high",))
    register_clip_rule("cap_only_test", rule)
    try:
        spec = register_objective("capped_test", base="grpo", source="a test's clip rule", clip="cap_only_test", eps_high=0.1)
        registered.append("capped_test")
        assert spec.is_active("eps_high") and not spec.is_active("eps_low") and not spec.is_active("dual_clip_c")
        assert family_of(spec) is None
        logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
        old = torch.full((2, 3), -0.5, dtype=torch.float64)  # r = e^0.5 > 1.1: capped, no gradient
        loss, _ = policy_loss(
            "capped_test",
            logp=logp,
            old_logp=old,
            advantages=torch.tensor([1.0, -1.0]),
            mask=torch.ones(2, 3, dtype=torch.bool),
            group_ids=torch.zeros(2, dtype=torch.long),
        )
        assert float(loss) == pytest.approx(0.0, abs=1e-12)  # -(1.1 A_1 + 1.1 A_2) / 2 over tokens
        with pytest.raises(ValueError, match="clip mode 'ppo' must be a new identifier"):
            register_clip_rule("ppo", rule)
    finally:
        CLIP_RULES.pop("cap_only_test")
