"""Page 2: for every objective, where a token shared by the whole group cancels."""

import time

import pandas as pd
import streamlit as st

from dfpo.app import data
from dfpo.app.widgets import KEEP, whole_number_input
from dfpo.core.loss import OBJECTIVES

MAX_GROUPS = 16  # most random groups per cell (each cell of every objective is computed live)


@st.cache_data(show_spinner=False, max_entries=20_000)  # an entry: 16 floats, one objective on one group of one seed
def group_residuals(objective: str, seed: int, index: int) -> tuple[float, ...]:
    """One objective on one random group of the atlas, computed once for all sessions: a new seed computes only
    the objectives shown, more groups only the groups added, and fewer groups or a filter nothing at all."""
    return data.atlas_group_residuals(objective, seed, index)


def atlas_table(objectives: list[str], groups: int, seed: int) -> tuple[list[str], list[dict]]:
    """The chosen objectives' rows of ``cancellation.atlas(groups=groups, seed=seed)`` (the same floats, a test
    compares them), with a progress bar once computing groups not seen before takes longer than a blink."""
    bar, start = st.empty(), time.perf_counter()
    cells = []
    for done, name in enumerate(objectives):
        if time.perf_counter() - start > 0.3:  # a table read from the cache shows no bar at all
            bar.progress(done / len(objectives), text=f"Computing the atlas from policy_loss: {done} of {len(objectives)} objectives")
        cells += data.atlas_objective_cells(name, [group_residuals(name, seed, i) for i in range(groups)])
    bar.empty()
    return data.atlas_rows(cells)


st.title("Cancellation atlas")
st.caption(
    "Each cell: the largest gradient left on a token shared by a whole group, over random groups of 4 completions "
    "(both reward signs), computed live from `policy_loss`. 'cancels' means below 1e-12. r* is the shared token's ratio: "
    "1 (inside every clip range) or e^0.5 (outside every token clip range). Every objective of `OBJECTIVES` appears here."
)
c1, c2, c3 = st.columns([3, 1, 1])
chosen = c1.multiselect("Objectives", list(OBJECTIVES), default=list(OBJECTIVES), key="atlas_objectives", persist_state=KEEP)
groups = whole_number_input(c2, "random groups per cell", key="atlas_groups", default=4, help=f"a whole number from 1 to {MAX_GROUPS}")
low, high = data.SEED_RANGE
seed = whole_number_input(c3, "seed", key="atlas_seed", default=0, help=f"a whole number from {low} to {high}")
try:
    groups = data.whole_number(groups, "groups", 1, MAX_GROUPS)
    seed = data.whole_number(seed, "seed", low, high)
except ValueError as err:
    st.error(f"Nothing to show: {err}")
    st.stop()
if not chosen:
    st.info("Pick at least one objective.")
    st.stop()
columns, rows = atlas_table([name for name in OBJECTIVES if name in chosen], groups, seed)
frame = pd.DataFrame(rows)


def colour(value: str) -> str:
    return "background-color: #c7e9c0" if value == "cancels" else "background-color: #fdd0a2"


st.dataframe(frame.style.map(colour, subset=columns), hide_index=True, width="stretch", height=min(38 * (len(frame) + 1), 900))
n_cancel = int((frame[columns] == "cancels").sum().sum())
st.markdown(
    f"**{n_cancel} of {frame[columns].size} cells cancel.** DFPO presets use the ratio stop-gradient form (GSPO's clipping kept), "
    "so at GSPO's clip range they cancel only where no sequence of the group is clipped; compare `dfpo_min:stopgrad=score` "
    "on the *Cancellation by hand* page. The loss core's tests state the same verdict for every cell (`tests/core/test_cancellation.py`)."
)
