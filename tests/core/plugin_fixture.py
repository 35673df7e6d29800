"""A tiny distribution outside dfpo that registers objectives through the ``dfpo.objectives`` entry-point group.

``write_plugin(folder, body)`` lays out, in ``folder``, a package ``dfpo_fixture_objectives`` whose ``register()``
runs ``body`` and the ``.dist-info`` (METADATA, entry_points.txt) that makes it an installed distribution to
``importlib.metadata`` once ``folder`` is on ``sys.path`` / ``PYTHONPATH``, as ``pip install`` would lay it out.
"""

from __future__ import annotations

import pathlib
import textwrap

PACKAGE = "dfpo_fixture_objectives"
DIST = "dfpo-fixture-objectives"
OBJECTIVE = "grpo_fixture"
"""The objective the default body registers: GRPO with DAPO's clip-higher, built from existing components only."""
SOURCE = "dfpo's entry-point fixture: GRPO with DAPO's eps_high (arXiv 2503.14476)"
DEFAULT_BODY = f"""
import dfpo

dfpo.register_objective({OBJECTIVE!r}, base="grpo", source={SOURCE!r}, eps_high=0.28, aggregation="token_mean")
"""


def write_plugin(folder: pathlib.Path, body: str = DEFAULT_BODY, entry: str = f"{PACKAGE}:register") -> pathlib.Path:
    """The fixture distribution in ``folder`` (created); ``entry`` is the entry point's value. Returns ``folder``."""
    package = folder / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    code = "def register():\n" + textwrap.indent(textwrap.dedent(body).strip() + "\n", "    ") + "\n\nNOT_CALLABLE = 3\n"
    (package / "__init__.py").write_text(code)
    info = folder / f"{PACKAGE}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[dfpo.objectives]\nfixture = {entry}\n")
    return folder
