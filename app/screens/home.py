"""The landing view (see app/views/home.py): the runs the app knows, from app/main.py's session state."""

import streamlit as st

from app.views import home

home.render(st.session_state.get("sources") or [])
