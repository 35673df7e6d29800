"""Streamlit explorer of the loss core, the toy lab, the claims ledger and training runs.

``dfpo app`` starts it. ``data`` holds the computations the pages show (plain functions over
``dfpo.core.loss``, ``dfpo.toy``, ``dfpo.theory`` and run folders, testable without Streamlit);
``page_*.py`` are the pages, ``main.py`` the entry script.
"""
