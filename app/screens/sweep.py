"""The sweep page (see app/views/sweep.py); app/main.py put the sweeps it found and the runs in session state."""

import streamlit as st

from app.views import sweep

sweep.render(st.session_state.get("sweeps") or [], st.session_state.get("sources") or [])
