"""Page 3: the toy lab; curves with bands over seeds, the summary and the paper's predictions.

Training runs in a background thread (``dfpo.app.jobs``) that the Stop button, Streamlit's own
Stop and a closed tab all cancel within one training step; the progress bar moves per step.
"""

import time
import uuid

import plotly.graph_objects as go
import streamlit as st
from plotly.colors import qualitative

from dfpo.app import data, jobs
from dfpo.app.text import plotly_text

PLOTS = [
    ("reward", "expected reward E[R]"),
    ("tax/kl_cum", "learning tax: cumulative KL at template rows"),
    ("equiv/entropy", "entropy over the equivalent correct answers"),
    ("asym", "Asym (eq 23)"),
    ("energy/frequent", "Energy on frequent tokens (eq 24)"),
    ("ratio/spread", "within-group std of log s_i"),
]
POLL_S = 0.2
COLOURS = qualitative.D3


@st.cache_resource
def finished_runs() -> dict:
    """Results shared by every browser session of this process, keyed by the run's settings."""
    return {}


@st.cache_resource
def job_board() -> jobs.JobBoard:
    return jobs.JobBoard(grace=5.0)


def result_of(settings: data.ToySettings) -> data.ToyResult | None:
    """The finished result of ``settings`` in this process, else the default comparison stored on disk."""
    store = finished_runs()
    if settings not in store and settings == data.TOY_DEFAULT and (stored := data.cached_toy(settings)) is not None:
        store[settings] = stored
    return store.get(settings)


def keep(settings: data.ToySettings, result: data.ToyResult) -> None:
    store = finished_runs()
    store[settings] = result
    while len(store) > 8:  # keep the eight latest
        store.pop(next(iter(store)))
    if settings == data.TOY_DEFAULT:
        data.store_toy(settings, result)


def stop(settings: data.ToySettings) -> None:
    """The Stop button: this session lets go of the run (cancelled unless another session watches it)."""
    job_board().release(settings, st.session_state.toy_session)
    st.session_state.toy_stopped = settings


def train(settings: data.ToySettings) -> data.ToyResult:
    """Run ``settings`` in the background, with a progress bar per training step and a Stop button."""
    board = job_board()
    job = board.watch(settings, st.session_state.toy_session, lambda tick: data.run_toy(settings, tick), settings.total_steps)
    stop_slot, bar = st.empty(), st.progress(0.0, text="starting ...")
    stop_slot.button("Stop", key="toy_stop", on_click=stop, args=(settings,), help="cancel this run (it stops within one training step)")
    try:
        while (p := job.poll(st.session_state.toy_session)).state == jobs.RUNNING:
            bar.progress(p.fraction, text=f"training {p.label}: {p.done} of {p.total} steps ({settings.seeds} seeds each)")
            time.sleep(POLL_S)
    finally:
        stop_slot.empty()
        bar.empty()
    if p.state == jobs.FAILED:
        board.forget(settings)
        if isinstance(p.error, (ValueError, FloatingPointError, RuntimeError)):
            st.error(data.toy_failure(p.error, settings, p.label, p.done))
            st.stop()
        raise p.error
    if p.state == jobs.CANCELLED:
        st.info(f"Stopped after {p.done} of {p.total} steps. Press Run to start it again.")
        st.stop()
    keep(settings, p.result)
    board.forget(settings)
    return p.result


st.title("Toy lab")
st.caption(
    "Tabular softmax policies trained through the same `policy_loss` as the LLM trainer. The default compares DFPO in both "
    "stop-gradient forms, each beside its matched GSPO control (same clip range and stop-gradient form, lr, seeds)."
)
st.session_state.setdefault("toy_session", uuid.uuid4().hex)
d = data.TOY_DEFAULT
limits = data.TOY_LIMITS
with st.form("toy"):
    c1, c2, c3, c4 = st.columns(4)
    task = c1.selectbox("task", ["family", "tenplusten"], index=["family", "tenplusten"].index(d.task), key="toy_task")
    mode = c2.selectbox("mode", ["sampled", "exact"], index=["sampled", "exact"].index(d.mode), key="toy_mode")
    optimizer = c3.selectbox("optimizer", ["sgd", "adam"], index=["sgd", "adam"].index(d.optimizer), key="toy_optimizer")
    lr = c4.number_input("lr", value=d.lr, format="%.4g", key="toy_lr", help="learning rate, {1:g} to {2:g}".format(*limits["lr"]))
    labels_text = st.text_input("objectives (labels: preset[:key=value...])", ",".join(d.labels), key="toy_labels")
    c1, c2, c3, c4 = st.columns(4)
    group_size = c1.number_input(
        "G", value=d.group_size, key="toy_G", help="completions per group, {1:g} to {2:g}".format(*limits["group_size"])
    )
    inner_steps = c2.number_input(
        "K", value=d.inner_steps, key="toy_K", help="optimiser steps per rollout batch, {1:g} to {2:g}".format(*limits["inner_steps"])
    )
    steps = c3.number_input("steps", value=d.steps, key="toy_steps", help="rollout batches, {1:g} to {2:g}".format(*limits["steps"]))
    seeds = c4.number_input("seeds", value=d.seeds, key="toy_seeds", help="independent runs, {1:g} to {2:g}".format(*limits["seeds"]))
    submitted = st.form_submit_button("Run")
st.caption("G: completions per group. K: optimiser steps per rollout batch. steps: rollout batches. seeds: independent runs.")

try:
    settings = data.toy_settings(task, labels_text, group_size, inner_steps, steps, seeds, mode, optimizer, lr)
except ValueError as err:
    st.error(f"Cannot run this configuration: {err}")
    st.stop()
if submitted:
    st.session_state.toy_stopped = None
result = result_of(settings)
if result is None:
    if st.session_state.get("toy_stopped") == settings:
        job = job_board().get(settings)
        done = f" after {job.progress.done} of {job.progress.total} steps" if job is not None else ""
        st.info(f"Stopped{done}. Press Run to start it again.")
        st.stop()
    result = train(settings)

results = result.curves
shown = [(key, title) for key, title in PLOTS if all(key in h for h in results.values())]
for tab, (key, title) in zip(st.tabs([title for _, title in shown]), shown):
    with tab:
        fig = go.Figure()
        for i, (label, h) in enumerate(results.items()):
            mean, lo, hi = data.band(h[key])
            x = list(range(1, len(mean) + 1))
            colour = COLOURS[i % len(COLOURS)]
            fig.add_trace(
                go.Scatter(
                    x=x + x[::-1],
                    y=list(hi) + list(lo[::-1]),
                    fill="toself",
                    line=dict(width=0),
                    fillcolor=colour,
                    opacity=0.2,
                    showlegend=False,
                    hoverinfo="skip",
                )
            )
            fig.add_trace(
                go.Scatter(x=x, y=mean, name=plotly_text(label), line=dict(color=colour, dash=["solid", "dash", "dot", "dashdot"][i % 4]))
            )
        n_seeds = next(iter(results.values()))[key].shape[1]
        fig.update_layout(title=f"{title} (band: mean +- 1.96 s.e. over {n_seeds} seeds)", xaxis_title="step (rollout batch)", height=420)
        st.plotly_chart(fig, width="stretch")

st.subheader("Summary and the paper's predictions")
for block in data.markdown_blocks(result.summary):
    if isinstance(block, str):
        st.markdown(block)
    elif block and "objective" in block[0]:  # the summary: one column per objective, one row per metric, to fit the page
        st.markdown(data.markdown_table(data.transpose_rows(block, "objective")))
    elif block:  # a markdown table wraps its cells to the page's width
        st.markdown(data.markdown_table(block))
