"""Every relative link in README.md and docs/*.md reaches a file, and its #anchor a heading there.

Anchors follow GitHub's rule: the heading's text, lowercased, without punctuation other than
hyphens and underscores, spaces turned into hyphens, a repeated heading suffixed -1, -2, ...
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.M | re.S)


def prose(markdown: str) -> str:
    """The page without fenced code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", markdown))


def slug(heading: str) -> str:
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", markdown))
    for line in FENCE.sub("", markdown).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    text = page.read_text()
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        rel = page.relative_to(root)
        if not dest.exists():
            problems.append(f"{rel}: {target} -> no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text()):
            problems.append(f"{rel}: {target} -> no heading #{fragment} in {dest.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_slug_matches_githubs():
    assert slug("Does the router spend its budget where tools pay? (60 steps, B = 0.3)") == (
        "does-the-router-spend-its-budget-where-tools-pay-60-steps-b--03"
    )
    assert slug("`retry`, `relabel` and `fission`") == "retry-relabel-and-fission"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_a_missing_file_or_heading_is_reported(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Here\n")
    page.write_text("[a](other.md#here) [b](other.md#gone) [c](nope.md) `[d](nope.md)`\n")
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 2 and "#gone" in problems[0] and "nope.md" in problems[1]
