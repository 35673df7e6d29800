"""`dfpo objectives`: a compact table by default (it printed 285 lines up to 529 characters wide), the long form
with --long, one preset's detail with NAME."""

import re
from pathlib import Path

import pytest

from dfpo import OBJECTIVES
from dfpo.cli import main
from dfpo.commands import objectives_summary, objectives_table


def _printed(capsys, *args: str) -> str:
    assert main(["objectives", *args]) == 0
    return capsys.readouterr().out


def test_the_default_is_compact_and_names_every_preset_with_what_it_is(capsys):
    """At most two lines per preset besides the table's, no line wider than the table of presets."""
    out = _printed(capsys)
    table = objectives_table().split("\n\n")[0]
    width = max(len(line) for line in table.splitlines())
    assert out.startswith(table + "\n")
    assert max(len(line) for line in out.splitlines()) <= width
    assert len(out.splitlines()) <= len(table.splitlines()) + 2 * len(OBJECTIVES) + 6
    flat = " ".join(out.split())
    for name, spec in OBJECTIVES.items():
        assert f"{name}: {' '.join(spec.description.split())}" in flat
    assert f"{len(OBJECTIVES)} objectives" in flat and "dfpo objectives --long" in flat and "dfpo objectives NAME" in flat


def test_the_long_form_and_one_preset_are_what_they_were(capsys):
    """--long prints every preset's sources and every component's declaration (scripts read objectives_table); NAME
    prints one preset's every component."""
    assert _printed(capsys, "--long") == objectives_table() + "\n"
    assert _printed(capsys, "--long", "--markdown") == objectives_table(markdown=True) + "\n"
    assert _printed(capsys, "gspo") == objectives_table(objective="gspo") + "\n"
    for source in OBJECTIVES["gspo"].sources.values():
        assert source in _printed(capsys, "gspo")


def test_the_markdown_summary_opens_with_the_readmes_table():
    """scripts/update_readme.py takes the first block of objectives_table(markdown=True): the summary opens with it."""
    assert objectives_summary(markdown=True).split("\n\n")[0] == objectives_table(markdown=True).split("\n\n")[0]
    assert "- gspo: " in objectives_summary(markdown=True)


def test_long_with_the_atlas_is_refused_in_one_sentence():
    with pytest.raises(SystemExit, match="--long is the long form of the presets' table, not of --atlas"):
        main(["objectives", "--atlas", "--long"])


# --- `dfpo objectives NAME --trace` (dfpo.core.loss.trace)

TRACED = {
    # the stages each preset must show, in the order policy_loss applies them (core.py's pipeline, the paper's order)
    "dfpo_min": ["LossBatch.of", "sequence_shape", "sequence_log_ratio", "sign_aware_clip", "min_replace", "_ratio_form", "aggregate"],
    "stapo": ["LossBatch.of", "token_shape", "token_log_ratio", "sign_aware_clip", "token_mask_filter", "stapo_spurious_mask", "aggregate"],
    "vapo_nll": ["LossBatch.of", "token_shape", "sign_aware_clip", "aggregate", "nll_term"],
}


def _is_subsequence(wanted: list[str], seen: list[str]) -> bool:
    it = iter(seen)
    return all(name in it for name in wanted)


@pytest.mark.parametrize("name", sorted(TRACED))
def test_the_trace_lists_the_stages_in_the_order_policy_loss_applies_them(name):
    """The preset's key stages appear in pipeline order, and no stage of a component the preset leaves at its defaults."""
    from dfpo.core.loss.trace import trace_objective

    trace = trace_objective(name)
    functions = [stage.function for stage in trace.stages]
    assert _is_subsequence(TRACED[name], functions), functions
    assert not {"kl_term", "entropy_term", "correction_step"} & set(functions)  # every preset here leaves them off
    assert "token_mask_filter" not in functions or name == "stapo"


@pytest.mark.parametrize("name", sorted(TRACED))
def test_every_file_line_of_the_trace_is_the_def_of_its_function(name):
    """core/loss/FILE.py:LINE, relative to the package, is the line of `def NAME` (not a decorator, not a call)."""
    from dfpo.core.loss.trace import PACKAGE_ROOT, trace_objective

    for stage in trace_objective(name).stages:
        path, line = stage.where.rsplit(":", 1)
        assert path.startswith("core/loss/")
        text = (Path(PACKAGE_ROOT) / path).read_text().splitlines()[int(line) - 1]
        assert re.match(rf"\s*def {re.escape(stage.function.rsplit('.', 1)[-1])}\(", text), (stage, text)


@pytest.mark.parametrize("name", sorted(TRACED))
def test_the_printed_loss_is_policy_losss_on_the_same_batch(capsys, name):
    """The `loss = ...` line of `dfpo objectives NAME --trace` equals policy_loss on the example batch, every digit."""
    from dfpo.core.loss import policy_loss
    from dfpo.core.loss.trace import example_batch

    out = _printed(capsys, name, "--trace")
    printed = float(re.search(r"^loss = (\S+) ", out, re.M).group(1))
    spec = OBJECTIVES[name]
    loss, _ = policy_loss(spec, **example_batch(spec).loss_inputs())
    assert printed == float(loss.detach())
    for stage in TRACED[name]:
        assert stage in out


def test_the_trace_prints_an_equation_for_each_paper_stage_of_dfpo_min(capsys):
    """dfpo_min's ratio (eq 44), clip (eq 47), Min-Replace (eq 50) and stop-gradient form (eqs 59-62) each cite theirs."""
    out = _printed(capsys, "dfpo_min", "--trace")
    lines = {line.split()[1]: line for line in out.splitlines() if re.match(r"\s*\d+\. ", line)}
    assert "eq 44" in lines["sequence_log_ratio"] and "eq 47" in lines["sign_aware_clip"]
    assert "eq 50" in lines["min_replace"] and "eq 59-62" in lines["_ratio_form"]


def test_trace_without_a_name_is_one_sentence():
    for args in (["--trace"], ["--trace", "--atlas"], ["dfpo_min", "--trace", "--long"]):
        with pytest.raises(SystemExit, match=r"^dfpo objectives: --trace follows one objective alone; name it") as err:
            main(["objectives", *args])
        assert "\n" not in str(err.value)


def test_trace_of_an_unknown_objective_is_one_sentence(capsys):
    assert main(["objectives", "no_such_objective", "--trace"]) != 0
    err = capsys.readouterr().err
    assert "unknown objective='no_such_objective'" in err and "Traceback" not in err


def test_the_trace_gives_a_running_profiler_its_hook_back():
    """A profile hook set before the trace (a debugger's, a coverage tool's) is the hook set after it."""
    import sys

    from dfpo.core.loss.trace import trace_objective

    def hook(frame, event, arg):
        return None

    sys.setprofile(hook)
    try:
        trace_objective("gspo")
        assert sys.getprofile() is hook
    finally:
        sys.setprofile(None)
