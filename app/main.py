"""scratchscope: look at a run. `streamlit run app/main.py` (add `-- --runs DIR ...` for your own).

Streamlit reads this file twice. `streamlit run` first imports it, finds `streamlit_app` (an
`st.App`) and serves it: its start-up hook imports the charting stack while the browser is still
loading Streamlit's page (app/warm.py), and a stop signal ends the server within two seconds
(app/stop.py). Each page load then runs it as the script (`__main__`, as
AppTest does too), which draws the sidebar, the navigation and the page (app/shell.py). A
Streamlit without `st.App` runs it as the script only, and the app works the same, a little slower.
"""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # streamlit runs this file as a script: make the packages importable
    sys.path.insert(0, str(ROOT))

if __name__ == "__main__":
    from app.shell import main

    main()
else:
    from app.stop import quiet_exits
    from app.warm import at_server_start

    quiet_exits()  # before the server takes the signals: a stop ends quietly (app/stop.py)
    streamlit_app = st.App(__file__, lifespan=at_server_start)
