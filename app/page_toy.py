"""Page 3: the toy lab; curves with bands over seeds, the summary and the paper's predictions."""

import plotly.graph_objects as go
import streamlit as st

from dfpo.app import data

DEFAULT = dict(
    task="family", labels=("gspo", "dfpo_min", "gspo_noclip", "dfpo_min:stopgrad=score"), group_size=8, inner_steps=4,
    steps=150, seeds=8, mode="sampled", optimizer="sgd", lr=0.5,
)  # fmt: skip
PLOTS = [
    ("reward", "expected reward E[R]"),
    ("tax/kl_cum", "learning tax: cumulative KL at template rows"),
    ("equiv/entropy", "entropy over the equivalent correct answers"),
    ("asym", "Asym (eq 23)"),
    ("energy/frequent", "Energy on frequent tokens (eq 24)"),
    ("ratio/spread", "within-group std of log s_i"),
]


@st.cache_resource
def finished_runs() -> dict:
    """Results shared by every browser session of this process, keyed by the run's settings."""
    return {}


def train(task, labels, group_size, inner_steps, steps, seeds, mode, optimizer, lr):
    """The cached result, or a new run with a progress bar (one tick per objective)."""
    key = (task, labels, group_size, inner_steps, steps, seeds, mode, optimizer, lr)
    store = finished_runs()
    if key not in store:
        bar = st.progress(0.0, text="training ...")
        done = []

        def tick(label: str) -> None:
            bar.progress(len(done) / len(labels), text=f"training {label} ({seeds} seeds x {steps} steps)")
            done.append(label)

        store[key] = data.run_toy(
            task,
            labels,
            group_size=group_size,
            inner_steps=inner_steps,
            steps=steps,
            seeds=seeds,
            mode=mode,
            optimizer=optimizer,
            lr=lr,
            progress=tick,
        )
        bar.empty()
        while len(store) > 8:  # keep the eight latest
            store.pop(next(iter(store)))
    return store[key]


st.title("Toy lab")
st.caption(
    "Tabular softmax policies trained through the same `policy_loss` as the LLM trainer. The default compares DFPO in both "
    "stop-gradient forms, each beside its matched GSPO control (same clip range and stop-gradient form, lr, seeds)."
)
with st.form("toy"):
    c1, c2, c3, c4 = st.columns(4)
    task = c1.selectbox("task", ["family", "tenplusten"], index=["family", "tenplusten"].index(DEFAULT["task"]))
    mode = c2.selectbox("mode", ["sampled", "exact"], index=0)
    optimizer = c3.selectbox("optimizer", ["sgd", "adam"], index=0)
    lr = c4.number_input("lr", value=DEFAULT["lr"], format="%.4g")
    labels_text = st.text_input("objectives (labels: preset[:key=value...])", ",".join(DEFAULT["labels"]))
    c1, c2, c3, c4 = st.columns(4)
    group_size = c1.number_input("G", 2, 64, DEFAULT["group_size"])
    inner_steps = c2.number_input("K (optimiser steps per batch)", 1, 64, DEFAULT["inner_steps"])
    steps = c3.number_input("steps", 1, 2000, DEFAULT["steps"])
    seeds = c4.number_input("seeds", 1, 64, DEFAULT["seeds"])
    st.form_submit_button("Run")

labels = tuple(x.strip() for x in labels_text.split(",") if x.strip())
args = (task, labels, int(group_size), int(inner_steps), int(steps), int(seeds), mode, optimizer, float(lr))
try:
    results, summary = train(*args)
except ValueError as err:
    st.error(f"Cannot run this configuration: {err}")
    st.stop()

tabs = st.tabs([title for key, title in PLOTS if all(key in h for h in results.values())])
for tab, (key, title) in zip(tabs, [p for p in PLOTS if all(p[0] in h for h in results.values())]):
    with tab:
        fig = go.Figure()
        for i, (label, h) in enumerate(results.items()):
            mean, lo, hi = data.band(h[key])
            x = list(range(1, len(mean) + 1))
            colour = f"hsl({(i * 67) % 360}, 65%, 45%)"
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
            fig.add_trace(go.Scatter(x=x, y=mean, name=label, line=dict(color=colour, dash=["solid", "dash", "dot", "dashdot"][i % 4])))
        fig.update_layout(title=f"{title} (band: mean +- 1.96 s.e. over {seeds} seeds)", xaxis_title="step (rollout batch)", height=420)
        st.plotly_chart(fig, width="stretch")
st.subheader("Summary and the paper's predictions")
st.markdown(summary)
