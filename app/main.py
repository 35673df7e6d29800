"""Entry script of the explorer: ``dfpo app`` runs it with Streamlit."""

from pathlib import Path

import streamlit as st

HERE = Path(__file__).resolve().parent

# An emoji favicon is drawn by the browser itself; a ":material/...:" page icon would be fetched from fonts.gstatic.com.
# (The navigation's material icons are fine: Streamlit serves their font from this server.)
st.set_page_config(page_title="dfpo explorer", page_icon="🧮", layout="wide")
pages = [
    st.Page(HERE / "page_cancel.py", title="Cancellation by hand", icon=":material/calculate:", default=True),
    st.Page(HERE / "page_atlas.py", url_path="atlas", title="Cancellation atlas", icon=":material/grid_on:"),
    st.Page(HERE / "page_toy.py", url_path="toy", title="Toy lab", icon=":material/science:"),
    st.Page(HERE / "page_ledger.py", url_path="ledger", title="Claims ledger", icon=":material/fact_check:"),
    st.Page(HERE / "page_drift.py", url_path="drift", title="Parameter-space drift", icon=":material/scatter_plot:"),
    st.Page(HERE / "page_runs.py", url_path="runs", title="Training runs", icon=":material/monitoring:"),
]
st.navigation(pages).run()
