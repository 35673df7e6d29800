"""Page 5: run folders side by side (trainer runs, and each objective of a toy run): curves, evals,
config differences, samples. Logs are read incrementally (``dfpo.app.runs``)."""

import os

import pandas as pd
import plotly.graph_objects as go
import streamlit as st
from plotly.colors import qualitative

from dfpo.app import runs as R
from dfpo.app.cli import RUNS_ENV
from dfpo.app.text import markdown_text, plotly_text
from dfpo.app.widgets import KEEP

COLOURS = qualitative.D3
DASHES = ("solid", "dash", "dot", "dashdot")
DEFAULT_METRICS = ("reward/mean", "clip/frac_high", "weights/asym")  # drawn first: registry keys trainer and toy runs both log


@st.cache_resource
def registry() -> dict:
    """Every run folder seen by this process, with the logs read so far (shared by all sessions)."""
    return {}


def keep_choices(key: str, options: list, default: list) -> None:
    """The choices of multiselect ``key``: ``default`` at first, then what the user chose (kept across pages),
    less any option that is gone (a run folder deleted, a metric no chosen run logs)."""
    chosen = st.session_state.setdefault(key, default)
    if any(c not in options for c in chosen):
        st.session_state[key] = [c for c in chosen if c in options]


def style(i: int) -> dict:
    """The i-th chosen run's line: its own colour (and a dash pattern once the colours run out)."""
    return dict(color=COLOURS[i % len(COLOURS)], dash=DASHES[(i // len(COLOURS)) % len(DASHES)])


st.title("Training runs")
roots = [R.resolve_folder(p) for p in os.environ.get(RUNS_ENV, "runs").split(os.pathsep) if p.strip()]
extra_text = st.text_input(
    "Another folder to search for run folders",
    "",
    key="runs_extra",
    persist_state=KEEP,
    help=f"an absolute path, ~/..., or a path relative to {markdown_text(os.getcwd())}",
)
extra = None
if extra_text.strip():
    extra = R.resolve_folder(extra_text)
    if not extra.is_dir():
        st.error(f"{markdown_text(extra_text.strip())} is not a folder ({markdown_text(extra)}).")
        extra = None
    elif extra not in roots:
        roots.append(extra)
found, counts = R.runs_under(roots, registry())
if extra is not None and counts.get(extra, 0) == 0:
    st.warning(
        f"No run folder in {markdown_text(extra)}: a run folder holds metrics.jsonl beside config.toml (`dfpo train`) or config.json "
        "(`dfpo toy run`, `dfpo toy ablate`), at most 3 levels down."
    )
st.caption(
    "Run folders under "
    + ", ".join(f"{markdown_text(r)} ({counts.get(r, 0)})" for r in roots)
    + ". A toy run shows each objective as a run (mean over its seeds). Refresh the page to see a run still being written grow."
)
if not found:
    st.info(
        f"No run folder found under {', '.join(map(markdown_text, roots))}. Train one with `dfpo train --config configs/tiny-cpu.toml` "
        "or `dfpo toy run --out runs/toy-demo`, or name a folder above."
    )
    st.stop()
by_id = {r.id: r for r in found}
keep_choices("runs_chosen", list(by_id), default=list(by_id)[:2])
chosen_ids = st.multiselect("Runs", list(by_id), format_func=lambda i: by_id[i].name, key="runs_chosen", persist_state=KEEP)
chosen, configs = [], []
with st.spinner("Reading the logs (a large log is read once; later only what was appended) ..."):
    for run_id in chosen_ids:
        run = by_id.get(run_id)
        if run is None:
            continue
        try:
            run.folder.refresh()
            configs.append(run.config())
            chosen.append(run)
        except (OSError, ValueError) as err:
            st.error(f"{markdown_text(run.name)}: {markdown_text(err)}")
if not chosen:
    st.stop()
folders = {id(r.folder): r.folder for r in chosen}.values()
bad = sum(f.bad_lines for f in folders)
dropped = sum(f.metrics.nonfinite + f.evals.nonfinite for f in folders)
if bad:
    st.warning(f"{bad} log line(s) skipped: torn, not a JSON object, or a step that is not a finite number.")
if dropped:
    st.warning(f"{dropped} non-finite metric value(s) (NaN or infinite) left out of the curves.")

keys = R.metric_keys(chosen)
keep_choices("runs_metrics", keys, default=[k for k in DEFAULT_METRICS if k in keys] or keys[:1])
c1, c2 = st.columns([3, 1])
metrics = c1.multiselect("Metrics", keys, key="runs_metrics", persist_state=KEEP)
window = c2.slider(
    "Smoothing (steps)",
    1,
    100,
    1,
    key="runs_smooth",
    help="trailing mean over this many logged steps; 1 draws the raw values",
    persist_state=KEEP,
)
for note in R.drift_notes({r.name: set(r.keys()) for r in chosen}, metrics):  # what a run's drift/*_cross holds
    st.caption(markdown_text(note))
for key in metrics:
    fig, thinned = go.Figure(), False
    for i, r in enumerate(chosen):
        x, y = r.curve(key)
        if not len(x):
            continue
        if window > 1:
            raw_x, raw_y = R.decimate(x, y)
            faint = dict(mode="lines", line=dict(width=1, **style(i)), opacity=0.25, showlegend=False, hoverinfo="skip")
            fig.add_trace(go.Scatter(x=raw_x, y=raw_y, **faint))
        xs, ys = R.decimate(x, R.trailing_mean(y, window))
        thinned |= len(xs) < len(x)
        fig.add_trace(go.Scatter(x=xs, y=ys, name=plotly_text(r.name), mode="lines", line=style(i)))
    notes = [f"trailing mean over {window} steps"] * (window > 1) + ["long curves drawn as each stretch's low and high"] * thinned
    fig.update_layout(
        title=plotly_text(key) + (f" ({'; '.join(notes)})" if notes else ""), xaxis_title="step", height=340, margin=dict(t=40, b=20)
    )
    st.plotly_chart(fig, width="stretch")

eval_keys = sorted({k for r in chosen if r.folder.kind == R.TRAINER for k in r.folder.evals.keys() if k.startswith("eval/")})
if eval_keys:
    fig = go.Figure()
    for i, r in enumerate(chosen):
        for j, k in enumerate(eval_keys):
            x, y = r.folder.evals.curve(k)
            if len(x):
                line = dict(color=style(i)["color"], dash=DASHES[j % len(DASHES)])
                fig.add_trace(go.Scatter(x=x, y=y, name=plotly_text(f"{r.name} {k}"), mode="lines+markers", line=line))
    fig.update_layout(title="held-out evaluation", xaxis_title="step", height=340, margin=dict(t=40, b=20))
    st.plotly_chart(fig, width="stretch")

st.subheader("Resolved config")
diff = pd.DataFrame(R.config_diff(chosen, configs))
st.dataframe(
    diff.style.apply(lambda row: ["background-color: #fff3b0" if row["differs"] else "" for _ in row], axis=1),
    hide_index=True, width="stretch",
)  # fmt: skip
samples = [r for r in chosen if r.folder.samples.rows]
if samples:
    st.subheader("Sample completions (latest logged step)")
for r in samples:
    st.markdown(f"**{markdown_text(r.name)}**, step {r.folder.samples.step:g}")
    st.dataframe(pd.DataFrame(r.folder.samples.rows), hide_index=True, width="stretch", row_height=72)
