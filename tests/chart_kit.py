"""Reading an AppTest's charts back: every title in a (layered) Vega-Lite spec, and a chart's
datasets as pandas frames (Streamlit sends them as Arrow beside the spec)."""

from __future__ import annotations

import pyarrow as pa


def titles(spec: dict) -> list[str]:
    """The titles of a spec and of its layers, nested ones included."""
    found, stack = [], [spec]
    while stack:
        node = stack.pop()
        title = node.get("title")
        found += [title] if isinstance(title, str) else [title["text"]] if isinstance(title, dict) else []
        stack += node.get("layer", [])
    return found


def frames(chart) -> list:
    """An AppTest chart element's datasets, one pandas frame each."""
    return [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]


def specs(at, title: str) -> list[tuple[dict, list]]:
    """(spec, datasets) of every chart of an AppTest titled `title`."""
    import json

    out = []
    for c in at.get("vega_lite_chart"):
        spec = json.loads(c.proto.spec)
        if title in titles(spec):
            out.append((spec, frames(c)))
    return out
