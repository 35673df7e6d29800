"""Page 2: for every objective, where a token shared by the whole group cancels."""

import pandas as pd
import streamlit as st

from dfpo.app import data
from dfpo.trainer.loss import OBJECTIVES


@st.cache_data(show_spinner="Computing the atlas from policy_loss ...")
def atlas_table(groups: int, seed: int) -> tuple[list[str], list[dict]]:
    """Every objective's cells, computed once per (groups, seed) for all sessions; pages filter it."""
    return data.atlas_rows(data.atlas(groups=groups, seed=seed))


st.title("Cancellation atlas")
st.caption(
    "Each cell: the largest gradient left on a token shared by a whole group, over random groups of 4 completions "
    "(both reward signs), computed live from `policy_loss`. 'cancels' means below 1e-12. r* is the shared token's ratio: "
    "1 (inside every clip range) or e^0.5 (outside every token clip range). Every objective of `OBJECTIVES` appears here."
)
c1, c2, c3 = st.columns([3, 1, 1])
chosen = c1.multiselect("Objectives", list(OBJECTIVES), default=list(OBJECTIVES), key="atlas_objectives")
groups = c2.number_input("random groups per cell", 1, 16, 4, key="atlas_groups")
seed = c3.number_input("seed", 0, 2**16, 0, key="atlas_seed")
if not chosen:
    st.info("Pick at least one objective.")
    st.stop()
columns, rows = atlas_table(int(groups), int(seed))
frame = pd.DataFrame([r for r in rows if r["objective"] in chosen])


def colour(value: str) -> str:
    return "background-color: #c7e9c0" if value == "cancels" else "background-color: #fdd0a2"


st.dataframe(frame.style.map(colour, subset=columns), hide_index=True, width="stretch", height=min(38 * (len(frame) + 1), 900))
n_cancel = int((frame[columns] == "cancels").sum().sum())
st.markdown(
    f"**{n_cancel} of {frame[columns].size} cells cancel.** DFPO presets use the ratio stop-gradient form (GSPO's clipping kept), "
    "so at GSPO's clip range they cancel only where no sequence of the group is clipped; compare `dfpo_min:stopgrad=score` "
    "on the *Cancellation by hand* page. The loss core's tests state the same verdict for every cell (`tests/loss/test_cancellation.py`)."
)
