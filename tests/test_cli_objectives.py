"""`dfpo objectives`: a compact table by default (it printed 285 lines up to 529 characters wide), the long form
with --long, one preset's detail with NAME."""

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
