"""Streamlit explorer of the loss core, the toy lab, the claims ledger, training runs and parameter-space drift.

``dfpo app`` starts it. ``data`` holds the computations the pages show (plain functions over
``dfpo.core.loss``, ``dfpo.toy``, ``dfpo.theory`` and run folders, testable without Streamlit);
``page_*.py`` are the pages, listed in the navigation's order by ``pages.PAGES``; ``main.py`` is the entry script.
"""
