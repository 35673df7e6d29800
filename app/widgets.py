"""Input widgets the pages share.

Every input of every page is keyed and keeps its value for the whole browser session
(``persist_state="session"``): leaving a page and coming back shows the inputs as they were left.
"""

from __future__ import annotations

import streamlit as st

KEEP = "session"
"""``persist_state`` of every input: kept across page switches."""


def whole_number_input(container, label: str, *, key: str, default: int, help: str):
    """A number box for a whole number that hands the page whatever is typed, as a float.

    A box for ints rounds 2.5 down to 2 in the browser, and a box with bounds keeps an out-of-range
    value from the page while still showing it; this box has neither, so the page checks the value
    (``data.whole_number``, ``data.toy_settings``) and says what is wrong."""
    st.session_state.setdefault(key, float(default))
    return container.number_input(label, step=1.0, format="%g", key=key, help=help, persist_state=KEEP)
