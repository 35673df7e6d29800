"""Page 5: trainer run folders side by side: curves, evals, config differences, samples."""

import os
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dfpo.app import data
from dfpo.app.cli import RUNS_ENV

st.title("Training runs")
roots = [Path(p) for p in os.environ.get(RUNS_ENV, "runs").split(os.pathsep) if p]
extra = st.text_input("Another folder to search for run folders", "", key="runs_extra")
if extra.strip():
    if not Path(extra.strip()).is_dir():
        st.error(f"{extra.strip()} is not a folder.")
    roots.append(Path(extra.strip()))
found = data.discover_runs(roots)
st.caption(
    f"Run folders (config.toml + metrics.jsonl) under {', '.join(map(str, roots))}. Refresh the page to see a run still being written grow."
)
if not found:
    st.info(
        f"No run folder found under {', '.join(map(str, roots))}. Train one with `dfpo train --config configs/tiny-cpu.toml`, or name a folder above."
    )
    st.stop()
common = Path(os.path.commonpath([str(p) for p in found])) if len(found) > 1 else found[0].parent
names = [str(p.relative_to(common)) for p in found]
chosen = st.multiselect("Runs", names, default=names[: min(2, len(names))], key="runs_chosen")
runs = []
for name in chosen:
    try:
        runs.append(data.load_run(common / name, common))
    except ValueError as err:
        st.error(str(err))
if not runs:
    st.stop()
skipped = sum(r.skipped for r in runs)
if skipped:
    st.warning(f"{skipped} torn or corrupt log line(s) were skipped.")

keys = data.metric_keys(runs)
default = [k for k in ("reward/mean", "clip/frac_high", "weights/asym") if k in keys] or keys[:1]
metrics = st.multiselect("Metrics", keys, default=default, key="runs_metrics")
for key in metrics:
    fig = go.Figure()
    for r in runs:
        x, y = data.curve(r.metrics, key)
        fig.add_trace(go.Scatter(x=x, y=y, name=r.name, mode="lines"))
    fig.update_layout(title=key, xaxis_title="step", height=340, margin=dict(t=40, b=20))
    st.plotly_chart(fig, width="stretch")
eval_keys = sorted({k for r in runs for row in r.evals for k in row if k.startswith("eval/")})
if eval_keys:
    fig = go.Figure()
    for r in runs:
        for k in eval_keys:
            x, y = data.curve(r.evals, k)
            fig.add_trace(go.Scatter(x=x, y=y, name=f"{r.name} {k}", mode="lines+markers"))
    fig.update_layout(title="held-out evaluation", xaxis_title="step", height=340, margin=dict(t=40, b=20))
    st.plotly_chart(fig, width="stretch")

st.subheader("Resolved config")
diff = pd.DataFrame(data.config_diff(runs))
st.dataframe(
    diff.style.apply(lambda row: ["background-color: #fff3b0" if row["differs"] else "" for _ in row], axis=1),
    hide_index=True, width="stretch",
)  # fmt: skip
st.subheader("Sample completions (latest logged step)")
for r in runs:
    if not r.samples:
        continue
    last = max(s.get("step", 0) for s in r.samples)
    st.markdown(f"**{r.name}**, step {last}")
    st.dataframe(pd.DataFrame([s for s in r.samples if s.get("step", 0) == last]), hide_index=True, width="stretch")
