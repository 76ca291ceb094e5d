"""Controls the over-steps charts share: a log-y toggle and an EMA smoothing slider."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import series


def curve_controls(key: str) -> tuple[bool, float]:
    """A log-y toggle and an EMA smoothing slider (TensorBoard's debiased EMA, raw kept faint)."""
    c1, c2 = st.columns([1, 2])
    log = c1.toggle("log y-axis", key=f"{key}_log")
    weight = c2.slider("smoothing (EMA weight; 0 = raw)", 0.0, 0.99, 0.0, 0.01, key=f"{key}_smoothing",
                       help="TensorBoard's debiased exponential moving average: s = w·s + (1 − w)·x from "
                            "s = 0, shown as s / (1 − wⁿ) after n points; each curve on its own, the raw "
                            "values drawn faint behind it.")
    return log, weight


def smoothed_frame(rows: list[dict], y: str, color: str, weight: float) -> pd.DataFrame:
    """The chart's rows, with the EMA column when smoothing is on."""
    return pd.DataFrame(series.smoothed(rows, y, color, weight) if weight > 0 else rows)
