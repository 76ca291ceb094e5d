"""Controls the over-steps charts share: the y-axis choice (auto, linear, log) and an EMA smoothing slider."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import axes, series

Y_HELP = (f"auto: a log axis where a chart's values span more than {axes.LOG_SPAN:.0f} orders of magnitude "
          "(a diverged run's loss would flatten every other line), linear elsewhere; the chart says when it "
          "chose log.")


def curve_controls(key: str, where: tuple | None = None) -> tuple[str, float]:
    """The y-axis choice (`app.axes.Y_MODES`, "auto" first) and an EMA smoothing slider
    (TensorBoard's debiased EMA, raw kept faint), in two columns of their own or in `where`'s two."""
    c1, c2 = where or st.columns([3, 4])
    mode = c1.radio("y-axis", axes.Y_MODES, horizontal=True, key=f"{key}_y", help=Y_HELP)
    weight = c2.slider("smoothing (EMA weight; 0 = raw)", 0.0, 0.99, 0.0, 0.01, key=f"{key}_smoothing",
                       help="TensorBoard's debiased exponential moving average: s = w·s + (1 − w)·x from "
                            "s = 0, shown as s / (1 − wⁿ) after n points; each curve on its own, the raw "
                            "values drawn faint behind it.")
    return mode, weight


def smoothed_frame(rows: list[dict], y: str, color: str, weight: float) -> pd.DataFrame:
    """The chart's rows, with the EMA column when smoothing is on."""
    return pd.DataFrame(series.smoothed(rows, y, color, weight) if weight > 0 else rows)
