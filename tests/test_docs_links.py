"""Every `docs/FILE.md#anchor` the code names, and every link between the docs, resolves.

Docstrings and comments point to docs/ for the why; a renamed heading must
not leave a dead pointer behind. Anchors are GitHub's: the heading text,
lower-cased, punctuation dropped, spaces turned into hyphens.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
_CODE_DIRS = ("service", "client", "tests", "bench", "examples")
_THIS_FILE = Path(__file__).resolve()
# docs/FILE.md or docs/FILE.md#anchor, as code names them.
_CODE_REFERENCE = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)(?:#([A-Za-z0-9_-]+))?")
# A markdown link target of a doc: (FILE.md#anchor), (#anchor) or (FILE.md).
_DOC_LINK = re.compile(r"\]\((?!https?:)([A-Za-z0-9_./-]*\.md)?(?:#([A-Za-z0-9_-]+))?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _slug(heading: str) -> str:
    text = re.sub(r"`|\*\*?|_{2}", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text("utf-8"))
    slugs: set[str] = set()
    for heading in _HEADING.findall(text):
        slug = _slug(heading)
        candidate, n = slug, 1
        while candidate in slugs:  # GitHub numbers repeated headings
            candidate, n = f"{slug}-{n}", n + 1
        slugs.add(candidate)
    return slugs


def _code_references() -> list[tuple[str, str, str | None]]:
    found = []
    for directory in _CODE_DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            if path == _THIS_FILE:
                continue
            text = path.read_text("utf-8")
            for name, anchor in _CODE_REFERENCE.findall(text):
                found.append((str(path.relative_to(ROOT)), name, anchor or None))
    return found


def _link_target(page: Path, target: str) -> Path | None:
    """The file a relative link of `page` names, or None when it leaves the docs' reach."""
    if not target:
        return page
    if target.startswith("docs/"):
        return ROOT / target
    if "/" in target:
        return None  # another folder's file (client/README.md): not checked here
    return page.parent / target


def _doc_links() -> list[tuple[str, str, str | None]]:
    found = []
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        text = _FENCE.sub("", page.read_text("utf-8"))
        for target, anchor in _DOC_LINK.findall(text):
            path = _link_target(page, target)
            if path is not None:
                found.append((str(page.relative_to(ROOT)), str(path), anchor or None))
    return found


@pytest.mark.parametrize(("where", "name", "anchor"), _code_references())
def test_code_points_to_an_existing_doc_section(where: str, name: str, anchor: str | None) -> None:
    """A `docs/FILE.md#anchor` in the code names a file of docs/ and one of its headings."""
    path = DOCS / name
    assert path.is_file(), f"{where}: docs/{name} does not exist"
    if anchor is not None:
        assert anchor in _anchors(path), f"{where}: docs/{name} has no section #{anchor}"


@pytest.mark.parametrize(("where", "target", "anchor"), _doc_links())
def test_docs_link_to_existing_sections(where: str, target: str, anchor: str | None) -> None:
    """A link of one doc to another (or to itself) names an existing file and heading."""
    path = Path(target)
    assert path.is_file(), f"{where}: {path.relative_to(ROOT)} does not exist"
    if anchor is not None:
        assert anchor in _anchors(path), f"{where}: {path.name} has no section #{anchor}"
