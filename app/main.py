"""Entry script of the explorer: ``dfpo app`` runs it with Streamlit; its pages are ``dfpo.app.pages.PAGES``."""

from pathlib import Path

import streamlit as st

from dfpo.app.pages import PAGES

HERE = Path(__file__).resolve().parent

# An emoji favicon is drawn by the browser itself; a ":material/...:" page icon would be fetched from fonts.gstatic.com.
# (The navigation's material icons are fine: Streamlit serves their font from this server.)
st.set_page_config(page_title="dfpo explorer", page_icon="🧮", layout="wide")
pages = [
    st.Page(HERE / page.file, title=page.title, icon=page.icon, **({"url_path": page.url_path} if page.url_path else {"default": True}))
    for page in PAGES
]
st.navigation(pages).run()
