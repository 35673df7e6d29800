"""Page 4: the claims ledger, filterable, every claim with its evidence."""

import pandas as pd
import streamlit as st

from dfpo.app import data
from dfpo.app.text import markdown_text
from dfpo.app.widgets import KEEP


@st.cache_data(show_spinner="Running the claims ledger (sympy and the loss core), about 10 s ...")
def records(fresh: bool = False) -> list[dict]:
    """The ledger of this code version: from memory, else from the disk cache, else computed (``fresh``: computed)."""
    return data.ledger_records(fresh=fresh)


st.title("Claims ledger")
st.caption(
    "Every proposition, corollary and key equation of the paper, tried hard to break: holds, holds under a condition the paper does not state, or fails with a counterexample."
)
if st.button("Re-run the ledger", key="rerun_ledger", help="compute every verdict again (about 10 s) instead of reading the stored ones"):
    records.clear()
    claims = records(fresh=True)
else:
    claims = records()
verdict_names = sorted({c["verdict"] for c in claims})
method_names = sorted({c["method"] for c in claims})
c1, c2, c3 = st.columns([2, 2, 3])
verdicts = c1.multiselect("Verdict", verdict_names, default=verdict_names, key="ledger_verdicts", persist_state=KEEP)
methods = c2.multiselect("Method", method_names, default=method_names, key="ledger_methods", persist_state=KEEP)
text = c3.text_input("Search (id, section, statement)", "", key="ledger_search", persist_state=KEEP)
shown = pd.DataFrame(data.filter_claims(claims, verdicts, methods, text), columns=list(claims[0]))
if shown.empty:
    st.warning(markdown_text(data.no_claim_hint(claims, verdicts, methods, text)))
    st.stop()
counts = shown["verdict"].value_counts().to_dict()
st.markdown(f"**{len(shown)} of {len(claims)} claims shown**: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
st.dataframe(
    shown[["id", "verdict", "method", "source", "statement"]],
    hide_index=True,
    width="stretch",
    row_height=84,  # over 4 rem: long statements wrap onto up to four lines instead of being cut
    column_config={
        "id": st.column_config.TextColumn("id", width="small", pinned=True),
        "verdict": st.column_config.TextColumn("verdict", width="small"),
        "method": st.column_config.TextColumn("method", width=130),
        "source": st.column_config.TextColumn("source", width="medium"),
        "statement": st.column_config.TextColumn("statement", width="large"),
    },
)
for claim in shown.to_dict("records"):
    with st.expander(f"{claim['id']}: {claim['verdict']}"):
        st.markdown(f"**Source.** {claim['source']}\n\n**Claim.** {claim['statement']}\n\n**Conditions.** {claim['conditions']}")
        st.markdown(f"**Evidence ({claim['method']}).** {claim['evidence']}")
        if claim.get("notes"):
            st.markdown(f"**Notes.** {claim['notes']}")
