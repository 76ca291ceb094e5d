"""The README is a front page and each topic has its page in docs/ (issue 38, item 9): every relative
link of the README and of those pages reaches a file that exists and, with an anchor, a heading of
that file (GitHub's anchors); each topic page is linked from the README and links back; and the
front page stays a front page, with the set-up, the main job and the tests first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TOPICS = ("app", "doctor", "monitor", "models", "probes", "training")
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FRONT_PAGE_BYTES = 16_000  # the 74 KB README it was, as a front page of about 12 KB


def prose(text: str) -> str:
    """The text outside fenced code blocks (a `# comment` in a shell block is no heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(page: Path) -> set[str]:
    """GitHub's anchor of each heading: lower case, punctuation but hyphens dropped, spaces to '-'."""
    heads = re.findall(r"^#{1,6} (.*)$", prose(page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not t.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_reaches_a_file_and_its_heading(page):
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.relative_to(ROOT)} links {target}: no such file"
        assert file.is_relative_to(ROOT), f"{page.relative_to(ROOT)} links {target}, outside the project"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{page.relative_to(ROOT)} links {target}: no such heading"


def test_each_topic_has_a_page_linked_from_the_readme_and_back():
    front = links(README)
    for topic in TOPICS:
        page = ROOT / "docs" / f"{topic}.md"
        assert page.is_file(), page
        assert f"docs/{topic}.md" in front, topic
        assert "../README.md" in links(page), topic


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.encode()) < FRONT_PAGE_BYTES, len(text.encode())
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    assert blocks[0].startswith("python3 -m venv") and blocks[1].strip() == "streamlit run app/main.py"
    assert blocks[2].strip() == "python -m pytest" and "python -m probes.diagnose" in blocks[3]
    assert any("Monitor(model, optimizer" in b for b in blocks)  # the Monitor in three lines
