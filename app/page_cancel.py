"""Page 1: one group sharing a prefix; what each completion adds to the shared token's gradient."""

import random

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dfpo.app import data
from dfpo.trainer.loss import AGGREGATIONS, OBJECTIVES

st.title("Cancellation by hand")
st.caption(
    "A group of G completions whose first 3 tokens are the same context-token event ('The answer is' in the paper's 10+10 "
    "example). A group-relative objective should leave that shared token no net gradient: the coefficients below must sum "
    "to 0 (paper eq 2). Every number comes from `dfpo.policy_loss`."
)

left, right = st.columns([1, 2], gap="large")
with left:
    objective = st.selectbox("Objective", list(OBJECTIVES), index=list(OBJECTIVES).index("gspo"), key="objective")
    spec = OBJECTIVES[objective]
    rewards_text = st.text_input("Rewards, one per completion", ", ".join(f"{r:g}" for r in data.DEFAULT_REWARDS), key="rewards")
    lengths_text = st.text_input("Lengths (tokens, > 3 each)", ", ".join(map(str, data.DEFAULT_LENGTHS)), key="lengths")
    shared = st.slider("log-ratio of the shared token, log r*", -1.0, 1.0, 0.0, 0.05, key="shared")
    scale = st.slider("scale of the other tokens' log-ratios", 0.0, 1.0, 0.3, 0.05, key="scale")
    if "seed" not in st.session_state:
        st.session_state.seed = 0
    c1, c2 = st.columns([2, 1])
    c1.number_input("seed of the other tokens' ratios", 0, 2**16, key="seed")
    if c2.button("random", key="random"):
        st.session_state.seed = random.randrange(2**16)
        st.rerun()
    with st.expander("Components", expanded=True):
        stopgrad = st.selectbox(
            "stopgrad (DFPO transforms only)",
            ["ratio", "score", "none"],
            index=["ratio", "score", "none"].index(spec.stopgrad),
            key="stopgrad",
        )
        aggregation = st.selectbox("aggregation", AGGREGATIONS, index=AGGREGATIONS.index(spec.aggregation), key="aggregation")
        length_aware = st.checkbox("length_aware (a_i = A_i / L_i in the transforms)", spec.length_aware, key="length_aware")
        e1, e2 = st.columns(2)
        eps_low = e1.number_input("eps_low", value=float(spec.eps_low), format="%.4g", key="eps_low")
        eps_high = e2.number_input("eps_high", value=float(spec.eps_high), format="%.4g", key="eps_high")

with right:
    try:
        rewards = data.parse_numbers(rewards_text, "rewards")
        lengths = data.parse_numbers(lengths_text, "lengths", int)
        b = data.cancellation_case(
            objective, rewards, lengths, shared_log_ratio=shared, scale=scale, seed=int(st.session_state.seed),
            stopgrad=stopgrad, aggregation=aggregation, length_aware=length_aware, eps_low=eps_low, eps_high=eps_high,
        )  # fmt: skip
    except ValueError as err:
        st.error(f"Nothing to show: {err}")
        st.stop()
    residual = b.residual
    cancels = abs(residual) < data.CANCEL_TOL
    silent = bool((b.coefficient.abs() < data.CANCEL_TOL).all())
    m1, m2, m3 = st.columns([1, 1.4, 1])
    m1.metric("residual (sum of coefficients)", f"{residual:.3e}")
    m2.metric("verdict", "no gradient at all" if silent else "cancels" if cancels else "does not cancel")
    m3.metric("Asym (eq 23)", f"{float(b.metrics['weights/asym']):.3e}")
    if silent:
        st.info("Every completion's coefficient is 0 (clipping, or a mask, silences the whole group): nothing is cancelled, nothing moves.")
    elif cancels:
        st.success("The completions' pushes on the shared token balance exactly.")
    else:
        st.warning("The shared token keeps a net gradient: the group moves it, though no completion is rewarded for it.")
    rows = pd.DataFrame(data.breakdown_table(b))
    names = [f"y{i}" + (" (clipped)" if c else "") for i, c in zip(rows["completion"], rows["clipped"])]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=rows["coefficient on the shared token"],
            marker_color=["#d62728" if a < 0 else "#2ca02c" for a in rows["advantage A_i"]],
        )
    )
    fig.add_hline(y=residual, line_dash="dot", annotation_text=f"sum = {residual:.2e}")
    fig.update_layout(
        title="coefficient of each completion on the shared token (green: A > 0, red: A < 0)", height=320, margin=dict(t=50, b=20)
    )
    st.plotly_chart(fig, width="stretch")
    fig = go.Figure([
        go.Bar(name="s_i (sequence ratio, eq 44)", x=names, y=rows["sequence ratio s_i"]),
        go.Bar(name="sbar_i (post-clip, eq 47)", x=names, y=rows["post-clip sbar_i"]),
        go.Bar(name="weight after the transform (eq 18 / 50-55)", x=names, y=rows["weight after transform"]),
    ])  # fmt: skip
    fig.update_layout(barmode="group", title="sequence weights before and after the DFPO transform", height=320, margin=dict(t=50, b=20))
    st.plotly_chart(fig, width="stretch")
    st.dataframe(rows, hide_index=True, width="stretch")
