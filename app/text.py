"""Strings the explorer did not write itself (run folder names, metric keys and labels read from logs and
configs, paths typed in a page) shown as text, never as markup.

Streamlit renders markdown in ``st.markdown``, captions, alerts, tooltips and labels: an image there is
fetched, a link is live, ``:red[...]`` or ``$...$`` change what is shown. Plotly renders a subset of HTML
in trace names, titles and hover text (``<a href>`` makes a live link, ``<br>`` a new line). Every page
passes such a string through ``markdown_text`` or ``plotly_text`` before it reaches either; widget
options and data frames are plain text already.
"""

from __future__ import annotations

import html
import re

_ASCII_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
"""CommonMark lets a backslash escape any ASCII punctuation character; Streamlit's own markdown
extensions (emoji and icon shortcodes, colours, maths) start with punctuation too."""


def visible(text: object) -> str:
    """``text`` with each character that does not print (a newline, a NUL, a zero-width space) written as
    its Python escape (``\\n``, ``\\x00``, ``\\u200b``), so a name cannot hide a line break or look like another."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def markdown_text(text: object) -> str:
    """``text`` for a markdown element: every punctuation character escaped, so it shows literally."""
    return _ASCII_PUNCTUATION.sub(r"\\\1", visible(text))


def plotly_text(text: object) -> str:
    """``text`` for a Plotly trace name, title or hover text: ``&``, ``<`` and ``>`` as entities, so no tag can
    form (Plotly shows these entities as their characters, but not ``&quot;``: quotes stay as they are)."""
    return html.escape(visible(text), quote=False)
