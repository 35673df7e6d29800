"""Page 6: parameter-space drift, direct vs cross vs measured per objective, on the toy and from a ``dfpo probe`` folder."""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dfpo.app import drift
from dfpo.app.runs import resolve_folder
from dfpo.app.text import markdown_text, plotly_text
from dfpo.app.widgets import KEEP, whole_number_input
from dfpo.toy.param_drift import default_probe_config

MAX_SEEDS = 32
COLOURS = {"direct": "#4c72b0", "cross": "#dd8452", "measured": "#55a868"}


@st.cache_data(show_spinner="One SGD step per objective from one point, in closed form ...")
def toy_table(task: str, labels: tuple[str, ...], seeds: int) -> list[dict]:
    return drift.toy_rows(task, labels, seeds)


def bars(rows: list[dict], kind: str, title: str) -> go.Figure:
    """Mean |direct|, |cross|, |measured| per objective for one event kind."""
    shown = [r for r in rows if r["events"] == kind and r.get("direct") is not None]
    fig = go.Figure()
    for part in drift.PARTS:
        fig.add_trace(
            go.Bar(x=[plotly_text(r["objective"]) for r in shown], y=[r[part] for r in shown], name=part, marker_color=COLOURS[part])
        )
    fig.update_layout(barmode="group", title=plotly_text(title), yaxis_title="mean abs change of log pi", height=360)
    return fig


st.title("Parameter-space drift")
st.caption(
    "How one optimiser step moves a token the whole group shares, and the log-odds of two equivalent correct answers: "
    "the part the event's own coefficients cause (direct), the part the rest of the batch causes through shared "
    "parameters (cross), and the change measured after the step. Every objective steps from the same point on the same batch."
)

st.header("On the toy (tabular softmax, closed form)")
st.markdown(
    "Each context has its own logit row, so the cross term is zero across contexts and the softmax coupling inside one: "
    "`tenplusten` ties no row across prompts, `family` ties its template rows."
)
c1, c2, c3 = st.columns([1, 3, 1])
task = c1.selectbox("Task", drift.TOY_TASKS, key="drift_task", persist_state=KEEP)
defaults = list(default_probe_config().objectives)
labels = c2.multiselect("Objectives", defaults + ["grpo", "dapo"], default=defaults, key="drift_objectives", persist_state=KEEP)
seeds = whole_number_input(c3, "seeds", key="drift_seeds", default=8, help=f"a whole number from 2 to {MAX_SEEDS}")
if not labels:
    st.info("Pick at least one objective.")
elif not (float(seeds).is_integer() and 2 <= seeds <= MAX_SEEDS):
    st.error(f"Nothing to show: seeds must be a whole number from 2 to {MAX_SEEDS}, got {seeds:g}.")
else:
    rows = toy_table(task, tuple(labels), int(seeds))
    left, right = st.columns(2)
    left.plotly_chart(bars(rows, "shared", "shared (context, token) events"), width="stretch")
    right.plotly_chart(bars(rows, "equivalent", "equivalent answers' log-odds"), width="stretch")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")

st.header("From a `dfpo probe` folder (tiny LLM)")
st.markdown("Run `dfpo probe --out FOLDER` and give the folder here: its tables, with 95% intervals over seeds.")
typed = st.text_input("Probe folder", "", key="drift_folder", persist_state=KEEP, placeholder="runs/probe")
if typed.strip():
    try:
        doc = drift.read_probe_folder(resolve_folder(typed.strip()))
    except ValueError as err:
        st.warning(markdown_text(err))
        st.stop()
    rows = drift.doc_rows(doc)
    st.markdown(f"**{len(doc['seeds'])} seeds, {len(doc['objectives'])} objectives.**")
    left, right = st.columns(2)
    left.plotly_chart(bars(rows, "shared", "shared (context, token) events"), width="stretch")
    right.plotly_chart(bars(rows, "equivalent", "equivalent answers' log-odds"), width="stretch")
    st.subheader("Per objective")
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.subheader("Against the matched control (paired over seeds, Bonferroni-adjusted)")
    st.dataframe(pd.DataFrame(drift.comparison_rows(doc)), hide_index=True, width="stretch")
    st.subheader("The cross term's share of the first-order drift")
    st.dataframe(pd.DataFrame(drift.share_rows(doc)), hide_index=True, width="stretch")
st.caption(
    "A training run with `log.param_drift = true` logs the same figures as `drift/*` every few steps: plot them on the "
    "*Training runs* page. docs/probe.md explains the split."
)
