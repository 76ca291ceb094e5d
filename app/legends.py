"""Legends under a chart that are never cut: how many columns fit the width a chart is drawn at.

Vega lays a bottom legend's columns out as wide as its longest label and does not shrink them to
the chart, so a legend of four columns under a third of the page ran past the chart's edge and lost
its last column (Training dynamics at 1280 px). The widths here are the page's at a 1280 px window,
the narrowest the app is laid out for; a wider window only has more room.
"""

from __future__ import annotations

from typing import Any

import altair as alt

PAGE_PX = 820  # the page's content width in a 1280 px window, the narrowest the app is laid out for
LEGEND_INSET_PX = 60  # a bottom legend starts under the plot, right of the y axis
LABEL_CHAR_PX = 6.6  # one character of an 11 px legend label, generously
LEGEND_ENTRY_PX = 16 + 5 + 12  # symbol, its gap to the label, the padding between columns


def legend_columns(labels: Any, width: float | None) -> int:
    """How many legend columns fit under a chart `width` px wide (a share of PAGE_PX) when every
    column is as wide as the longest label (Vega aligns them): never more than fit, so that no entry
    is drawn past the chart's edge and cut (4 columns of 'block 1 post_1' under a third of the page
    lost a column); 4 where the width is unknown."""
    names = [str(v) for v in dict.fromkeys(labels)]
    if width is None or not names:
        return 4
    entry = LEGEND_ENTRY_PX + LABEL_CHAR_PX * max(len(n) for n in names)
    return max(1, min(len(names), int((width - LEGEND_INSET_PX) // entry)))


def legend(columns: int = 4) -> alt.Legend:
    """A legend under the chart whose labels are never cut short."""
    return alt.Legend(orient="bottom", title=None, columns=columns, labelLimit=0)
