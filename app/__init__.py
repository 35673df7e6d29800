"""Streamlit explorer of the loss core, the claims ledger and the toy lab (a later issue)."""
