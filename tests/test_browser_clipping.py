"""No legend entry, axis label or title is cut at the chart's edge at 1280 px (issue 38, item 5), on
every page of shakespeare_gpt (4 layers of 6 heads: 24 heads in one legend) and on the Sweep page of
a sweep whose variants have long names. Before: Training dynamics lost a legend column under the
largest attention score (L0H3...), residual rms lost 'layer 3', dead and saturated units lost
'block 3 post'.

Text is drawn as SVG; an element whose box reaches past the SVG's own box by more than a glyph's
overhang (titles and rotated axis titles overhang by 2-3 px and are not cut) is cut there."""

from __future__ import annotations

import json
import shutil

import pytest
from browser_kit import REPO, browser, serve  # noqa: F401 - fixtures

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OVERHANG_PX = 4
CLIPPED = f"""() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg')].flatMap(svg => {{
  const box = svg.getBoundingClientRect();
  const title = (svg.querySelector('.role-title-text') || {{}}).textContent || '';
  return [...svg.querySelectorAll('text')].filter(t => t.textContent.trim())
    .map(t => [t.textContent, t.getBoundingClientRect()])
    .filter(([_, r]) => r.width > 0 && (r.left < box.left - {OVERHANG_PX} || r.right > box.right + {OVERHANG_PX}
                                        || r.top < box.top - {OVERHANG_PX} || r.bottom > box.bottom + {OVERHANG_PX}))
    .map(([text, _]) => title + ': ' + text);
}})"""
PAGES = {"": 2, "attention": 4, "dynamics": 10, "embeddings": 1, "lens": 2, "compare": 4}


@pytest.fixture(scope="module")
def long_sweep_root(tmp_path_factory):
    """The shipped sweep with its variants renamed as a two-axis sweep names them."""
    root = tmp_path_factory.mktemp("sweeps")
    shutil.copytree(REPO / "checkpoints" / "sweep_qk_norm", root / "qk", ignore=shutil.ignore_patterns("lr=*"))
    book = json.loads((root / "qk" / "sweep.json").read_text())
    renamed = {v["name"]: f"norm=rms,{v['name']},z_loss=1e-4" for v in book["variants"]}
    for entry in [*book["runs"], *book["variants"]]:
        key = "variant" if "variant" in entry else "name"
        entry[key] = renamed[entry[key]]
    (root / "qk" / "sweep.json").write_text(json.dumps(book))
    return root


@pytest.fixture(scope="module")
def app_with_sweep(long_sweep_root):
    with serve({"SCRATCHSCOPE_RUNS": str(long_sweep_root)}) as url:
        yield url


def settled(page, charts: int) -> None:
    page.wait_for_function("document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] svg, "
                           f"[data-testid=\"stVegaLiteChart\"] canvas').length >= {charts}", timeout=120_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=120_000)
    page.wait_for_timeout(1500)


@pytest.mark.parametrize("path", list(PAGES), ids=[p or "overview" for p in PAGES])
def test_no_text_is_cut_on_a_24_head_runs_pages(browser, app_with_sweep, path):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{app_with_sweep}/{path}?run=shakespeare_gpt", timeout=120_000)
    settled(page, PAGES[path])
    assert page.evaluate(CLIPPED) == []
    page.close()


def test_no_variant_name_is_cut_on_the_sweep_page(browser, app_with_sweep):  # noqa: F811
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{app_with_sweep}/sweep?sweep=qk", timeout=120_000)
    settled(page, 1)
    assert page.evaluate(CLIPPED) == []
    legend = page.evaluate("() => [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] svg text')]"
                           ".map(t => t.textContent)")
    assert "norm=rms,qk_norm=none,z_loss=1e-4" in legend  # drawn whole, not 'norm=rms,qk_norm=non…'
    page.close()
