"""Following a run while it trains: the "follow the run live" toggle, step sliders that stay on the
newest step until the user moves them, and the full rerun a new snapshot needs.

Live parts of a page are `st.fragment(run_every=...)`: only they re-run, so the page does not grey.
The sidebar's snapshot slider is outside every fragment (a fragment cannot redraw the sidebar), so a
fragment that sees a new snapshot asks for one full rerun; new metrics records need none.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Sequence

import streamlit as st

from app import data, run_files

EVERY = timedelta(seconds=3)
FOLLOWS_NEWEST = ("It stays on the newest step while training adds steps; move it and it stays where "
                  "you put it, move it back to the end and it follows again.")


def follow_toggle(run: data.Source, key: str) -> bool:
    """The "follow the run live" toggle: on by default while the run is training (run_files.is_training)."""
    return st.toggle(f"follow the run live (re-read every {EVERY.seconds} s)", value=run_files.is_training(run.path),
                     key=key, help="Re-reads metrics.jsonl and the snapshots; only the charts below re-run.")


def live(body: Callable[..., None], follow: bool) -> Callable[..., None]:
    """`body` as a fragment: re-run every EVERY while following, else only when its own widgets change."""
    return st.fragment(body, run_every=EVERY if follow else None)


def newest_unless_moved(key: str, options: Sequence[Any]) -> None:
    """Call before drawing the select_slider keyed `key` (drawn without `value=`): it goes to the last
    of `options` when it was never drawn, holds a value no longer offered, or sat on the last of the
    options it had the previous time; a value the user moved elsewhere is kept."""
    seen = f"{key}:options"
    before, value = st.session_state.get(seen), st.session_state.get(key)
    at_end = bool(before) and value == before[-1]
    if value not in options or at_end:
        st.session_state[key] = options[-1]
    st.session_state[seen] = list(options)


def snapshot_slider_key(run: data.Source) -> str:
    return f"snap:{run.path}"


def rerun_if_snapshots_changed(run: data.Source) -> None:
    """A full rerun when the run's snapshots differ from those the sidebar's slider offered (a
    snapshot was saved since): the slider then offers it, and moves to it unless the user moved it."""
    shown = st.session_state.get(f"{snapshot_slider_key(run)}:options")
    if shown is not None and [p.name for p in run.snapshots()] != shown:
        st.rerun()
