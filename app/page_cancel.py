"""Page 1: one group sharing a prefix; what each completion adds to the shared token's gradient."""

import random

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dfpo.app import data
from dfpo.app.widgets import KEEP, whole_number_input
from dfpo.core.loss import AGGREGATIONS, OBJECTIVES

COEFFICIENT = "d loss / d log pi"  # what each bar of the first chart is: the loss's derivative in one completion's copy of the shared token
SUM_LABEL_MARGIN = 110  # pixels right of the coefficient chart for the 'sum = ...' label ('sum = -1.23e-02' fits)

st.title("Cancellation by hand")
st.caption(
    "A group of G completions whose first 3 tokens are the same context-token event ('The answer is' in the paper's 10+10 "
    "example). A group-relative objective should leave that shared token no net gradient: the coefficients below must sum "
    "to 0 (paper eq 2). Every number comes from `dfpo.policy_loss`."
)
st.caption(
    f"Each coefficient is {COEFFICIENT}: the loss's derivative in the shared token's log-probability as one completion reads "
    "it. Training minimises the loss, so a bar below 0 pushes the token up: with a positive weight, a completion with A > 0 "
    "(green) draws a bar below 0 and one with A < 0 (red) a bar above 0."
)


def use_preset_components() -> None:
    """On a new objective: show (and use) its own components, not the previous objective's."""
    st.session_state.update(data.components_of(st.session_state.objective))


def draw_random_seed() -> None:
    st.session_state.seed = float(random.randrange(data.SEED_RANGE[1]))


# The widgets below take their values from the session state: GSPO and its own components at first.
st.session_state.setdefault("objective", "gspo")
for name, value in data.components_of(st.session_state.objective).items():
    st.session_state.setdefault(name, value)

left, right = st.columns([1, 2], gap="large")
with left:
    objective = st.selectbox("Objective", list(OBJECTIVES), key="objective", on_change=use_preset_components, persist_state=KEEP)
    rewards_text = st.text_input(
        "Rewards, one per completion",
        ", ".join(f"{r:g}" for r in data.DEFAULT_REWARDS),
        key="rewards",
        help=f"2 to {data.MAX_COMPLETIONS} numbers, not all equal",
        persist_state=KEEP,
    )
    lengths_text = st.text_input(
        f"Lengths (tokens, {data.PREFIX_LEN + 1} to {data.MAX_LENGTH} each)",
        ", ".join(map(str, data.DEFAULT_LENGTHS)),
        key="lengths",
        help=f"one whole number per completion, each more than the {data.PREFIX_LEN} shared tokens and at most {data.MAX_LENGTH}",
        persist_state=KEEP,
    )
    shared = st.slider("log-ratio of the shared token, log r*", -1.0, 1.0, 0.0, 0.05, key="shared", persist_state=KEEP)
    scale = st.slider("scale of the other tokens' log-ratios", 0.0, 1.0, 0.3, 0.05, key="scale", persist_state=KEEP)
    c1, c2 = st.columns([2, 1], vertical_alignment="bottom")
    low, high = data.SEED_RANGE
    seed = whole_number_input(c1, "seed of the other tokens' ratios", key="seed", default=0, help=f"a whole number from {low} to {high}")
    c2.button("random", key="random", on_click=draw_random_seed, help="draw a new seed for the other tokens' log-ratios")
    with st.expander(f"Components (the {objective} preset's own until you change one)", expanded=True):
        chosen = {
            "stopgrad": st.selectbox("stopgrad (DFPO transforms only)", ["ratio", "score", "none"], key="stopgrad", persist_state=KEEP),
            "aggregation": st.selectbox("aggregation", AGGREGATIONS, key="aggregation", persist_state=KEEP),
            "length_aware": st.checkbox("length_aware (a_i = A_i / L_i in the transforms)", key="length_aware", persist_state=KEEP),
        }
        e1, e2 = st.columns(2)
        chosen["eps_low"] = e1.number_input("eps_low", format="%.4g", key="eps_low", persist_state=KEEP)
        chosen["eps_high"] = e2.number_input("eps_high", format="%.4g", key="eps_high", persist_state=KEEP)
        overrides = data.component_overrides(objective, chosen)
        st.caption("Overrides sent to `policy_loss`: " + (", ".join(f"`{k}={v}`" for k, v in overrides.items()) if overrides else "none"))

with right:
    try:
        rewards = data.parse_numbers(rewards_text, "rewards")
        lengths = data.parse_numbers(lengths_text, "lengths", int)
        seed = data.whole_number(seed, "seed", *data.SEED_RANGE)
        b = data.cancellation_case(objective, rewards, lengths, shared_log_ratio=shared, scale=scale, seed=seed, **overrides)
    except ValueError as err:
        st.error(f"Nothing to show: {err}")
        st.stop()
    residual = b.residual
    verdict = data.verdict(b)
    m1, m2, m3 = st.columns([1, 1.4, 1])
    m1.metric("residual", f"{residual:.3e}", help="the sum over completions of their coefficients on the shared token (0 = cancels)")
    m2.metric("verdict", verdict, help=f"'cancels' when |residual| < {data.CANCEL_TOL:g}")
    m3.metric("Asym (eq 23)", f"{float(b.metrics['weights/asym']):.3e}", help="within-group variance of w_i A_i (paper eq 23)")
    st.caption("**residual**: sum of the completions' coefficients on the shared token. **Asym**: within-group variance of w_i A_i, eq 23.")
    if verdict == "no gradient at all":
        st.info("Every completion's coefficient is 0 (clipping, or a mask, silences the whole group): nothing is cancelled, nothing moves.")
    elif verdict == "cancels":
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
    fig.add_hline(y=residual, line_dash="dot")
    # The sum's label sits in the right margin, level with its line: outside the plotting area, so never over a bar.
    fig.add_annotation(text=f"sum = {residual:.2e}", xref="paper", x=1, xanchor="left", xshift=6, y=residual, yref="y", showarrow=False)
    fig.update_layout(
        title=f"coefficient {COEFFICIENT} of each completion on the shared token (green: A > 0, red: A < 0)",
        yaxis_title=f"{COEFFICIENT} (below 0: pushed up)",
        height=320,
        margin=dict(t=50, b=20, r=SUM_LABEL_MARGIN),
        yaxis_range=data.padded_range([*rows["coefficient on the shared token"], residual, 0.0]),
    )
    st.plotly_chart(fig, width="stretch")
    fig = go.Figure([
        go.Bar(name="s_i (sequence ratio, eq 44)", x=names, y=rows["sequence ratio s_i"]),
        go.Bar(name="sbar_i (post-clip, eq 47)", x=names, y=rows["post-clip sbar_i"]),
        go.Bar(name="weight after the transform (eq 18 / 50-55)", x=names, y=rows["weight after transform"]),
    ])  # fmt: skip
    fig.update_layout(barmode="group", title="sequence weights before and after the DFPO transform", height=320, margin=dict(t=50, b=20))
    st.plotly_chart(fig, width="stretch")
    number = st.column_config.NumberColumn
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_config={  # short headings so that the table fits its column; the full names are the tooltips
            "completion": number("i", help="completion"),
            "advantage A_i": number("A_i", help="advantage A_i (eq 43)", format="%.4f"),
            "length": number("L_i", help="length L_i in tokens"),
            "sequence ratio s_i": number("s_i", help="sequence ratio s_i (eq 44)", format="%.4f"),
            "post-clip sbar_i": number("sbar_i", help="post-clip sequence ratio sbar_i (eq 47)", format="%.4f"),
            "weight after transform": number("w_i", help="weight after the DFPO transform (eq 18 / 50-55)", format="%.4f"),
            "clipped": st.column_config.CheckboxColumn("clipped", help="every real token of the completion clipped"),
            "coefficient on the shared token": number(
                "coef_i", help=f"coefficient on the shared token: {COEFFICIENT} in completion i (below 0: a step raises it)", format="%.3e"
            ),
        },
    )
    st.caption("i: completion; A_i: advantage; L_i: length; s_i, sbar_i: sequence ratio before and after clipping; w_i: weight "
               "after the transform; coef_i: coefficient on the shared token, d loss / d log pi (their sum is the residual).")  # fmt: skip
