"""Page 6: parameter-space drift, direct vs cross vs momentum vs measured per objective, on the toy, from a
``dfpo probe`` folder or stored document, and across training (a stored log.param_drift document). Every empty or zero
cell is explained by a generated sentence (``dfpo.app.drift``); a chart with nothing to draw is replaced by the
sentence that says why."""

import os
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dfpo.app import drift
from dfpo.app.cli import RUNS_ENV
from dfpo.app.runs import resolve_folder
from dfpo.app.text import markdown_text, plotly_text
from dfpo.app.widgets import KEEP, whole_number_input
from dfpo.toy.param_drift import default_probe_config
from dfpo.trainer.probe.across import PARTS as ACROSS_PARTS
from dfpo.trainer.probe.across import summary_sentence

MAX_SEEDS = 32
COLOURS = {"direct": "#4c72b0", "cross": "#dd8452", "momentum": "#8172b3", "decay": "#937860", "measured": "#55a868"}
TITLES = {"shared": "shared (context, token) events", "equivalent": "equivalent answers' log-odds"}


@st.cache_data(show_spinner="One SGD step per objective from one point, in closed form ...")
def toy_table(task: str, labels: tuple[str, ...], seeds: int) -> drift.Table:
    return drift.toy_table(task, labels, seeds)


def bars(rows: list[dict], parts: list[str], title: str) -> go.Figure:
    """Mean |part| per objective for one event kind, on a linear axis from 0, so a bar's length is proportional to its
    value (a log axis drew a part two thirds the size of another as a sliver of it); the table gives every value."""
    fig = go.Figure()
    for part in parts:
        fig.add_trace(
            go.Bar(x=[plotly_text(r["objective"]) for r in rows], y=[r.get(part) for r in rows], name=part, marker_color=COLOURS[part])
        )
    fig.update_layout(barmode="group", title=plotly_text(title), yaxis_title="mean abs change of log pi", height=360)
    fig.update_yaxes(type="linear", rangemode="tozero")
    return fig


def charts(table: drift.Table) -> list[str]:
    """One chart per kind of event, or the sentence that says why there is nothing to draw; the sentences shown."""
    said = []
    for column, kind in zip(st.columns(2), ("shared", "equivalent")):
        rows, parts = drift.chart_rows(table.rows, kind)
        if rows:
            column.plotly_chart(bars(rows, parts, TITLES[kind]), width="stretch")
        else:
            said.append(drift.empty_chart_sentence(table, kind))
            column.info(markdown_text(said[-1]))
    return said


def table_with_notes(table: drift.Table, said: list[str]) -> None:
    """The first-order error flags, the sentences about rows left out (those not already shown in a chart's place),
    the rows (numbers to 3 significant digits), then the numbered notes."""
    for flag in table.flags:
        st.warning(markdown_text(flag))
    for sentence in table.left_out:
        if sentence not in said:
            st.markdown(markdown_text(sentence))
    if table.rows:
        frame = pd.DataFrame(table.rows)
        notes = frame.pop("note")
        if notes.any():  # beside the counts, where it is seen without scrolling the table sideways
            frame.insert(list(frame.columns).index("seeds with events") + 1, "note", notes)
        numbers = {c: st.column_config.NumberColumn(format="%.3g") for c in frame.columns if c not in ("seeds", "seeds with events")}
        st.dataframe(
            frame, hide_index=True, width="stretch", column_config={c: v for c, v in numbers.items() if frame[c].dtype.kind == "f"}
        )
    if table.notes:
        st.markdown("\n".join(f"{i}. {markdown_text(n)}" for i, n in enumerate(table.notes, 1)))


st.title("Parameter-space drift")
st.caption(
    "How one optimiser step moves a token the whole group shares, and the log-odds of two equivalent correct answers. "
    "The first-order prediction is split into the part the event's own coefficients cause (direct), the part the rest "
    "of this batch's gradient causes through shared parameters (cross), the optimiser's state from earlier steps "
    "(momentum: SGD's momentum buffer, Adam's first moment) and weight decay (decay); measured is the change after the "
    "step. Every objective steps from the same point on the same batch."
)

st.header("On the toy (tabular softmax, closed form)")
st.markdown(
    "Each context has its own logit row, so the cross term is zero across contexts and the softmax coupling inside one: "
    "`family` ties its template rows across prompts, `tenplusten` has one prompt and ties none. "
    "The `note` column numbers the sentences under the table that explain its empty and zero cells."
)
c1, c2, c3 = st.columns([1, 3, 1])
task = c1.selectbox("Task", drift.TOY_TASKS, key="drift_task", persist_state=KEEP)
defaults = list(drift.DEFAULT_OBJECTIVES)
labels = c2.multiselect("Objectives", defaults + list(drift.MORE_OBJECTIVES), default=defaults, key="drift_objectives", persist_state=KEEP)
seeds = whole_number_input(c3, "seeds", key="drift_seeds", default=8, help=f"a whole number from 2 to {MAX_SEEDS}")
if not labels:
    st.info("Pick at least one objective.")
elif not (float(seeds).is_integer() and 2 <= seeds <= MAX_SEEDS):
    st.error(f"Nothing to show: seeds must be a whole number from 2 to {MAX_SEEDS}, got {seeds:g}.")
else:
    config = default_probe_config(task=task, objectives=tuple(labels), seeds=int(seeds))
    st.markdown(
        f"**{config.seeds} seeds**, groups of {config.group_size}; the probed point is the initial policy moved by K - 1 = "
        f"{config.inner_steps - 1} {config.optimizer.upper()} steps of `{labels[0]}` (the first objective chosen: reorder to "
        f"change it), then each objective's own step of lr {config.lr:g}."
    )
    toy = toy_table(task, tuple(labels), int(seeds))
    table_with_notes(toy, charts(toy))

st.header("From a `dfpo probe` folder (the tiny model or a real one)")
st.markdown(
    "Run `dfpo probe --out FOLDER` (add `--config configs/smollm2-cpu.toml` for SmolLM2-135M-Instruct) and pick the "
    "folder or give its path: its tables, with 95% intervals over seeds."
)
roots = [resolve_folder(p) for p in os.environ.get(RUNS_ENV, "runs").split(os.pathsep) if p.strip()]
stored_probes, stored_across = drift.stored_documents(drift.STORED)
found = [str(f) for f in [*drift.probe_folders(roots), *stored_probes]]
picked = st.selectbox(
    "Probe folders found under the runs folders, and the probe documents docs/probe/ stores",
    ["(none)", *found],
    key="drift_found",
    persist_state=KEEP,
)
typed = st.text_input("Probe folder", "", key="drift_folder", persist_state=KEEP, placeholder="runs/probe")
if not typed.strip() and picked != "(none)":
    typed = picked
if typed.strip():
    try:
        doc = drift.read_probe_folder(resolve_folder(typed.strip()))
    except ValueError as err:
        st.warning(markdown_text(err))
        st.stop()
    table = drift.doc_table(doc)
    st.markdown(f"**{len(doc['seeds'])} seeds, {len(doc['objectives'])} objectives.**")
    said = charts(table)
    st.subheader("Per objective")
    table_with_notes(table, said)
    st.subheader("Against the matched control (paired over seeds, Bonferroni-adjusted)")
    st.dataframe(pd.DataFrame(drift.comparison_rows(doc)), hide_index=True, width="stretch")
    st.subheader("The cross term's share (of the first-order prediction, and of the batch's own part)")
    st.dataframe(pd.DataFrame(drift.share_rows(doc)), hide_index=True, width="stretch")


def show_across(path: Path) -> None:
    """A stored log.param_drift document: its generated sentence, the command that trained its runs, and one part of
    the shared events' change per objective across the probed steps (zeros, which a log axis cannot draw, named)."""
    try:
        doc = drift.read_across(path)
    except ValueError as err:
        st.warning(markdown_text(err))
        return
    st.markdown(markdown_text(summary_sentence(doc)))
    st.markdown(f"Trained by: {markdown_text(doc['command'])}")
    part = st.selectbox("Part of the shared events' change", list(ACROSS_PARTS), key="drift_across_part", persist_state=KEEP)
    rows = drift.across_rows(doc, part)
    figure = go.Figure()
    for label in doc["runs"]:
        drawn = [r for r in rows if r["objective"] == label and isinstance(r["value"], (int, float)) and r["value"] > 0]
        figure.add_trace(
            go.Scatter(x=[r["step"] for r in drawn], y=[r["value"] for r in drawn], mode="lines+markers", name=plotly_text(label))
        )
    figure.update_layout(
        xaxis_title="training step", yaxis_title=plotly_text(f"mean abs {part} of log pi, shared events"), yaxis_type="log", height=380
    )
    st.plotly_chart(figure, width="stretch")
    undrawn = [f"{r['objective']} step {r['step']}" for r in rows if not (isinstance(r["value"], (int, float)) and r["value"] > 0)]
    if undrawn:
        st.markdown(markdown_text(f"Not drawn (0 or not logged, which a log axis cannot show): {', '.join(undrawn)}."))


st.header("Across training (`log.param_drift`, stored)")
if stored_across:
    chosen = st.selectbox("Stored log.param_drift documents", [str(p) for p in stored_across], key="drift_across", persist_state=KEEP)
    show_across(Path(chosen))
else:
    st.markdown(f"No stored log.param_drift document in {markdown_text(drift.STORED)} (a checkout of the repository has them).")
st.caption(
    "A training run with `log.param_drift = true` logs the same figures as `drift/*` every few steps: plot them on the "
    "*Training runs* page. docs/probe.md explains the split."
)
