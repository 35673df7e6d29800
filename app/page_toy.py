"""Page 3: the toy lab; curves with bands over seeds, the summary and the paper's predictions.

Training runs in a background thread (``dfpo.app.jobs``) while this script polls it, with a progress
bar per training step and a Stop button. Either Stop (the page's, or Streamlit's own at the top
right) cancels the run within one training step, and the page then shows what finished: the curves
and each objective's summary over the steps it ran. A rerun that interrupts the polling (another
input, the page left) lets go of the run with a short delay, so a rerun of the same settings goes on
watching it; a closed tab cancels it once nobody has polled it for a few seconds.
"""

import threading
import time
import uuid

import plotly.graph_objects as go
import streamlit as st
from plotly.colors import qualitative
from streamlit.runtime.scriptrunner import RerunException, StopException, add_script_run_ctx, get_script_run_ctx

from dfpo.app import data, jobs
from dfpo.app.text import plotly_text
from dfpo.app.widgets import KEEP, whole_number_input

PLOTS = [
    ("reward", "expected reward E[R]"),
    ("tax/kl_cum", "learning tax: cumulative KL at template rows"),
    ("equiv/entropy", "entropy over the equivalent correct answers"),
    ("asym", "Asym (eq 23)"),
    ("energy/frequent", "Energy on frequent tokens (eq 24)"),
    ("ratio/spread", "within-group std of log s_i"),
]
# (comments, not docstrings: Streamlit's magic would write a bare string onto the page)
POLL_S = 0.2
TAKEOVER_S = 1.0  # after a script run is interrupted: how long its run waits for a newer script run to poll it
STOP_WAIT_S = 10.0  # how long the page waits for a stopped run to end its training step and hand over what finished
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


def stopped_run(settings: data.ToySettings) -> jobs.Progress | None:
    """How the run of ``settings`` that this session stopped ended (kept for the session): its step count
    and what finished; None when the server no longer knows it."""
    kept = st.session_state.get("toy_partial")
    if kept is not None and kept[0] == settings:
        return kept[1]
    job = job_board().get(settings)
    if job is None:
        return None
    p = job.wait(STOP_WAIT_S)  # a cancelled run ends within one training step
    if p.state == jobs.DONE:  # it finished before the Stop reached it
        keep(settings, p.result)
        job_board().forget(settings)
    if p.state != jobs.RUNNING:
        st.session_state.toy_partial = (settings, p)
    return p


def show_stopped(settings: data.ToySettings) -> None:
    """The page of a stopped run: how far it got, then the curves and summaries of the steps that finished."""
    p = stopped_run(settings)
    if p is None:
        st.info("Stopped. Press Run to start it again.")
    elif p.state == jobs.DONE:
        st.info(f"The run had finished all {p.total} steps before the Stop reached it.")
        show(p.result)
    elif p.state == jobs.RUNNING:
        st.info(f"You stopped watching this run after {p.done} of {p.total} steps; another browser session still runs it. Press Run to watch it again.")  # fmt: skip
    elif p.result is None:
        st.info(f"Stopped after {p.done} of {p.total} steps, before any objective finished a step. Press Run to start it again.")
    else:
        st.info(f"Stopped after {p.done} of {p.total} steps: below, what those steps show. Press Run to start it again.")
        show(p.result)


def stopped_by_streamlit(job: jobs.Job, this_run: int) -> bool:
    """After this script run was stopped: True for Streamlit's own Stop, False when a newer script run of
    the session replaced this one (Streamlit stops a run it reruns the same way). Waits until the run
    has ended (nobody polled it within TAKEOVER_S) or the session's newer script run has started."""
    deadline = time.monotonic() + TAKEOVER_S + STOP_WAIT_S
    while time.monotonic() < deadline and job.running:
        if st.session_state.get("toy_run") != this_run:
            return False
        time.sleep(0.05)
    return st.session_state.get("toy_run") == this_run


def after_stop(settings: data.ToySettings, job: jobs.Job, this_run: int, *progress_elements) -> None:
    """What a stopped script run leaves: after Streamlit's own Stop, the stopped page in place of the
    progress bar and the page's Stop; after a rerun that took over, nothing (that run draws the page)."""
    if stopped_by_streamlit(job, this_run):
        st.session_state.toy_stopped = settings
        for element in progress_elements:
            element.empty()
        show_stopped(settings)


def in_helper_thread(work) -> None:
    """Call ``work`` (Streamlit calls, session state) after this script run was stopped: Streamlit stops
    every element and every session-state write of a stopped run's own thread at once, so a helper thread
    with the run's context does it (as Streamlit's own st.spinner draws from a timer thread), and the run
    ends once it is done."""
    helper = threading.Thread(target=work, name="dfpo-app-after-stop", daemon=True)
    add_script_run_ctx(helper, get_script_run_ctx())
    helper.start()
    helper.join()


def train(settings: data.ToySettings, this_run: int) -> data.ToyResult:
    """Run ``settings`` in the background, with a progress bar per training step and a Stop button."""
    board = job_board()
    session = st.session_state.toy_session
    job = board.watch(settings, session, lambda tick: data.run_toy(settings, tick), settings.total_steps)
    stop_slot, bar = st.empty(), st.progress(0.0, text="starting ...")
    stop_slot.button("Stop", key="toy_stop", on_click=stop, args=(settings,), help="cancel this run (it stops within one training step)")
    try:
        while (p := job.poll(session)).state == jobs.RUNNING:
            bar.progress(p.fraction, text=f"training {p.label}: {p.done} of {p.total} steps ({settings.seeds} seeds each)")
            time.sleep(POLL_S)
    except RerunException:  # this thread reruns the page at once, and that run polls the job again
        job.let_go(session, TAKEOVER_S)
        raise
    except StopException:  # Streamlit's own Stop, or a newer script run of the session took over
        job.let_go(session, TAKEOVER_S)
        in_helper_thread(lambda: after_stop(settings, job, this_run, stop_slot, bar))
        raise
    stop_slot.empty()
    bar.empty()
    if p.state == jobs.FAILED:
        board.forget(settings)
        if isinstance(p.error, (ValueError, FloatingPointError, RuntimeError)):
            st.error(data.toy_failure(p.error, settings, p.label, p.done))
            st.stop()
        raise p.error
    if p.state == jobs.CANCELLED:  # nobody polled it for a while (this server was too busy to run the page)
        st.session_state.toy_stopped = settings
        show_stopped(settings)
        st.stop()
    keep(settings, p.result)
    board.forget(settings)
    return p.result


def show(result: data.ToyResult) -> None:
    """Curves with bands over seeds (a tab per metric), then the summary and the paper's predictions."""
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
                dash = ["solid", "dash", "dot", "dashdot"][i % 4]
                fig.add_trace(go.Scatter(x=x, y=mean, name=plotly_text(label), line=dict(color=colour, dash=dash)))
            n_seeds = next(iter(results.values()))[key].shape[1]
            fig.update_layout(
                title=f"{title} (band: mean +- 1.96 s.e. over {n_seeds} seeds)", xaxis_title="step (rollout batch)", height=420
            )
            st.plotly_chart(fig, width="stretch")

    st.subheader("Summary and the paper's predictions")
    for block in data.markdown_blocks(result.summary):
        if isinstance(block, str):
            st.markdown(block)
        elif block and "objective" in block[0]:  # the summary: one column per objective, one row per metric, to fit the page
            st.markdown(data.markdown_table(data.transpose_rows(block, "objective")))
        elif block:  # a markdown table wraps its cells to the page's width
            st.markdown(data.markdown_table(block))


st.title("Toy lab")
st.caption(
    "Tabular softmax policies trained through the same `policy_loss` as the LLM trainer. The default compares DFPO in both "
    "stop-gradient forms, each beside its matched GSPO control (same clip range and stop-gradient form, lr, seeds)."
)
st.session_state.setdefault("toy_session", uuid.uuid4().hex)
st.session_state.toy_run = this_run = st.session_state.get("toy_run", 0) + 1  # tells a rerun from Streamlit's Stop
d = data.TOY_DEFAULT
limits = data.TOY_LIMITS
for key, value in (("toy_task", d.task), ("toy_mode", d.mode), ("toy_optimizer", d.optimizer), ("toy_lr", d.lr)):
    st.session_state.setdefault(key, value)
with st.form("toy"):
    c1, c2, c3, c4 = st.columns(4)
    task = c1.selectbox("task", ["family", "tenplusten"], key="toy_task", persist_state=KEEP)
    mode = c2.selectbox("mode", ["sampled", "exact"], key="toy_mode", persist_state=KEEP)
    optimizer = c3.selectbox("optimizer", ["sgd", "adam"], key="toy_optimizer", persist_state=KEEP)
    lr = c4.number_input("lr", format="%.4g", key="toy_lr", help="learning rate, {1:g} to {2:g}".format(*limits["lr"]), persist_state=KEEP)
    labels_text = st.text_input("objectives (labels: preset[:key=value...])", ",".join(d.labels), key="toy_labels", persist_state=KEEP)
    c1, c2, c3, c4 = st.columns(4)
    group_size = whole_number_input(c1, "G", key="toy_G", default=d.group_size, help="completions per group, a whole number from {1:g} to {2:g}".format(*limits["group_size"]))  # fmt: skip
    inner_steps = whole_number_input(c2, "K", key="toy_K", default=d.inner_steps, help="optimiser steps per rollout batch, a whole number from {1:g} to {2:g}".format(*limits["inner_steps"]))  # fmt: skip
    steps = whole_number_input(c3, "steps", key="toy_steps", default=d.steps, help="rollout batches, a whole number from {1:g} to {2:g}".format(*limits["steps"]))  # fmt: skip
    seeds = whole_number_input(c4, "seeds", key="toy_seeds", default=d.seeds, help="independent runs, a whole number from {1:g} to {2:g}".format(*limits["seeds"]))  # fmt: skip
    submitted = st.form_submit_button("Run")
st.caption("G: completions per group. K: optimiser steps per rollout batch. steps: rollout batches. seeds: independent runs.")

try:
    settings = data.toy_settings(task, labels_text, group_size, inner_steps, steps, seeds, mode, optimizer, lr)
except ValueError as err:
    st.error(f"Cannot run this configuration: {err}")
    st.stop()
if submitted:  # Run starts the settings again, even those stopped last
    st.session_state.toy_stopped = st.session_state.toy_partial = None
result = result_of(settings)
if result is None:
    if st.session_state.get("toy_stopped") == settings:
        show_stopped(settings)
        st.stop()
    result = train(settings, this_run)
show(result)
