"""Objective labels (``dfpo_min:stopgrad=score``) wherever a name is read, resolved by the one parser
(``dfpo.core.loss.objectives.parse_objective_label``), and the small user-facing faults of issue 57: a typo gets a
"did you mean", ``model.name = "smollm2"`` is pointed to the packaged model, ``dfpo compare`` has a description
(the ledger's wording: tests/theory/test_ledger_round_off.py)."""

from __future__ import annotations

import pytest
import torch

from dfpo.cli import build_parser, main
from dfpo.core.loss import objective_from_label, resolve_objective
from dfpo.core.loss.cancellation import make_shared_prefix_group, shared_token_gradient
from dfpo.core.loss.objectives import objective_parts
from dfpo.trainer.config import config_from_dict, config_to_dict, load_config
from dfpo.trainer.run.folder import run_identity

LABEL = "dfpo_min:stopgrad=score"


# --- one resolution, every entry point


def test_resolve_objective_reads_a_label_as_the_label_parser_does():
    assert resolve_objective(LABEL) == objective_from_label(LABEL) == resolve_objective("dfpo_min", stopgrad="score")
    assert resolve_objective(LABEL).stopgrad == "score"


def test_policy_loss_takes_a_label_where_it_takes_a_name():
    """The label's gradient on a shared token is the name-plus-override's, and not the preset's own (the score form
    cancels with clipping active, the ratio form does not: ``dfpo demo``)."""
    group = make_shared_prefix_group(torch.tensor([1.0, 0.0, 1.0, 0.0]), [8, 8, 8, 8], shared_log_ratio=0.5, seed=0)
    by_label = shared_token_gradient(LABEL, group)
    torch.testing.assert_close(by_label, shared_token_gradient("dfpo_min", group, stopgrad="score"))
    assert not torch.allclose(by_label, shared_token_gradient("dfpo_min", group))


@pytest.mark.parametrize(
    "overrides, merged",
    [
        ({}, {"stopgrad": "score"}),
        ({"eps_low": 0.1}, {"eps_low": 0.1, "stopgrad": "score"}),
        ({"stopgrad": "score"}, {"stopgrad": "score"}),  # the same value in both places: one setting
    ],
)
def test_a_label_and_overrides_beside_it_merge(overrides, merged):
    assert objective_parts(LABEL, overrides) == ("dfpo_min", merged)
    assert resolve_objective(LABEL, **overrides) == resolve_objective("dfpo_min", **merged)


def test_a_component_the_label_and_the_overrides_set_differently_is_refused_in_one_sentence():
    with pytest.raises(ValueError) as err:
        resolve_objective(LABEL, stopgrad="ratio")
    assert str(err.value) == (
        "the label 'dfpo_min:stopgrad=score' sets stopgrad='score' and the overrides given with it set stopgrad='ratio': "
        "set stopgrad in one place"
    )


# --- the trainer's config: objective.name takes a label, in a file and via --set


def test_objective_name_takes_a_label_via_set_and_is_kept_spelled_out():
    cfg = load_config(None, [f"objective.name={LABEL}"])
    assert (cfg.objective.name, cfg.objective.overrides) == ("dfpo_min", {"stopgrad": "score"})
    spelled = load_config(None, ["objective.name=dfpo_min", "objective.overrides.stopgrad=score"])
    assert config_to_dict(cfg) == config_to_dict(spelled)
    assert run_identity(config_to_dict(cfg)) == run_identity(config_to_dict(spelled))  # one run, as dfpo compare names it
    assert run_identity(config_to_dict(cfg))["objective"] == LABEL


def test_summary_json_names_the_runs_objective_by_its_label():
    from dfpo.trainer.cli import run_objective

    assert run_objective(load_config(None, [f"objective.name={LABEL}", "objective.overrides.eps_low=0.1"])) == (
        "dfpo_min:eps_low=0.1:stopgrad=score"
    )
    assert run_objective(load_config(None, ["objective.name=gspo"])) == "gspo"


def test_objective_name_takes_a_label_in_a_config_file_beside_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(f'[objective]\nname = "{LABEL}"\n\n[objective.overrides]\neps_low = 0.1\n')
    cfg = load_config(path)
    assert (cfg.objective.name, cfg.objective.overrides) == ("dfpo_min", {"eps_low": 0.1, "stopgrad": "score"})
    assert run_identity(config_to_dict(cfg))["objective"] == "dfpo_min:eps_low=0.1:stopgrad=score"


def test_objective_name_and_overrides_that_disagree_are_refused_naming_both():
    with pytest.raises(ValueError) as err:
        load_config(None, [f"objective.name={LABEL}", "objective.overrides.stopgrad=ratio"])
    assert str(err.value) == (
        "objective.name: the label 'dfpo_min:stopgrad=score' sets stopgrad='score' and objective.overrides set "
        "stopgrad='ratio': set stopgrad in one place"
    )


# --- did you mean


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: resolve_objective("gspp"), "unknown objective='gspp': did you mean 'gspo'? (`dfpo objectives` lists all"),
        (
            lambda: objective_from_label("dfpo_mn:stopgrad=score"),
            "unknown objective='dfpo_mn' in 'dfpo_mn:stopgrad=score': did you mean 'dfpo_min'?",
        ),
        (
            lambda: objective_from_label("dfpo_min:stopgrd=score"),
            "objective 'dfpo_min:stopgrd=score': unknown component 'stopgrd'; did you mean 'stopgrad'?",
        ),
        (lambda: resolve_objective("gspo", eps_hgh=0.3), "unknown override(s) ['eps_hgh'] for objective 'gspo': did you mean 'eps_high'?"),
        (lambda: load_config(None, ["objective.name=gspp"]), "objective.name: unknown objective='gspp': did you mean 'gspo'?"),
    ],
)
def test_a_one_letter_typo_gets_did_you_mean_and_not_the_whole_list(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(message) and "dr_grpo, dapo" not in str(err.value)


def test_a_name_close_to_none_still_lists_every_objective():
    with pytest.raises(ValueError, match=r"unknown objective='nope'; known: grpo, dr_grpo, dapo"):
        resolve_objective("nope")


# --- model.name


@pytest.mark.parametrize("name", ["smollm2", "SmolLM2", "smollm2-135m", "smollm2-135m-instrct"])
def test_a_short_form_of_the_packaged_model_is_pointed_to_its_name_and_a_gguf_path(name):
    with pytest.raises(ValueError) as err:
        load_config(None, [f"model.name={name}"])
    assert str(err.value).startswith(f"model.name {name!r} names no model: did you mean 'smollm2-135m-instruct'")
    assert ".gguf" in str(err.value)


def test_a_typo_of_tiny_is_pointed_to_tiny():
    with pytest.raises(ValueError, match=r"model.name 'tinny' names no model: did you mean 'tiny' \(the built-in offline preset\)"):
        load_config(None, ["model.name=tinny"])


@pytest.mark.parametrize("name", ["tiny", "smollm2-135m-instruct", "SmolLM2-135M-Instruct", "gpt2", "HuggingFaceTB/SmolLM2-135M", "x.gguf"])
def test_model_names_dfpo_reads_are_not_refused_by_the_hint(name):
    assert config_from_dict({"model": {"name": name}}).model.name == name


def test_a_folder_named_like_a_short_form_is_left_to_the_model_checks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2").mkdir()
    assert load_config(None, ["model.name=smollm2"]).model.name == "smollm2"


# --- dfpo objectives LABEL [--trace]


def test_dfpo_objectives_label_trace_follows_the_label(capsys):
    from dfpo.core.loss.trace import trace_lines, trace_objective

    assert main(["objectives", LABEL, "--trace"]) == 0
    out = capsys.readouterr().out.rstrip("\n").split("\n")
    expected = trace_lines(trace_objective(resolve_objective("dfpo_min", stopgrad="score")))
    assert out == [expected[0], "label dfpo_min:stopgrad=score: the dfpo_min preset with stopgrad='score'", *expected[1:]]
    assert out[3:] != trace_lines(trace_objective("dfpo_min"))[1:]  # not the preset's own trace


def test_dfpo_objectives_label_shows_the_labels_components_and_says_which_it_set(capsys):
    assert main(["objectives", LABEL]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith("stopgrad ")]
    assert row.split()[1:4] == ["score", "yes", "set"] and row.endswith("set by the label")
    (eps,) = [line for line in out.splitlines() if line.startswith("eps_low ")]
    assert "set by the label" not in eps


@pytest.mark.parametrize("args", [["gspp"], ["gspp", "--trace"], ["dfpo_min:stopgrd=score", "--trace"]])
def test_dfpo_objectives_a_bad_name_or_label_is_one_line_with_a_hint(args, capsys):
    assert main(["objectives", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean" in err and "Traceback" not in err


# --- --help texts


@pytest.mark.parametrize("command", ["compare", "demo", "objectives", "train"])
def test_the_command_has_a_description_in_its_help(command):
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    assert parser.description and len(parser.description) > 80


def test_compare_help_says_what_a_label_is():
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["compare"].format_help().split())
    assert "dfpo_min:stopgrad=score" in text and "paired differences" in text
