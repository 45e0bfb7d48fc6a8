"""Every relative link of the repository's Markdown resolves as GitHub renders it, and no page narrates our own work.

Why: the site (`make docs`) has pages GitHub does not (the recipes, the compat report, the reference pages are
generated at build time), and a page that links to one of them reads fine in the site and breaks on GitHub. So the
pages link to files of the repository, relative to the page as GitHub resolves them, and `tools/mkdocs_hooks.py`
turns the links that leave docs/ into the site's pages; the strict site build checks the site's side
(test_docs_site.py), this test the repository's. An anchor is checked against the target's headings, slugged as
GitHub slugs them.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.envs("unit")

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    {
        *(REPO / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")),
        *(REPO / "docs").rglob("*.md"),
        REPO / "benchmarks" / "README.md",
        *(REPO / "benchmarks" / "results").glob("*.md"),
    }
)
FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", flags=re.S | re.M)
LINK = re.compile(r"\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
NARRATION = re.compile(
    r"this session|this stop|the (second|third|fourth|fifth|sixth|seventh) run|issue [0-9]|device time", re.I
)


def _prose(text: str) -> str:
    """The Markdown without fenced code blocks, code spans and HTML comments (GitHub renders no link there)."""
    text = FENCE.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", text, flags=re.S)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but `-` `_` removed, spaces `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"[`*]|<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives `page`'s headings (a repeated heading gets -1, -2, ...), and explicit HTML ids."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M):
        slug = github_slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    found |= set(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", text))
    return found


def broken_links(page: Path) -> list[str]:
    """`page`'s relative links whose file is not in the repository, or whose anchor is no heading of it."""
    rel = page.relative_to(REPO).as_posix()
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(rel), path)) if path else rel
        file = REPO / resolved
        if resolved.startswith("..") or not file.exists():
            broken.append(f"{rel}: {target} -> {resolved} does not exist in the repository")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{rel}: {target} -> no heading of {resolved} has the anchor #{anchor}")
    return broken


def test_the_pages_walked_include_the_adopters_ones():
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    assert {"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/accelerators.md", "docs/troubleshooting.md"} <= names
    assert {"benchmarks/README.md", "benchmarks/results/README.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves_as_github_renders_it(page):
    assert not broken_links(page)


def test_the_checker_finds_a_link_only_the_site_resolves(tmp_path, monkeypatch):
    """The links the site alone resolves (a generated page, a heading that is not there) are found."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "adapters.md").write_text("# Adapters\n\n## The call rule\n\n## The call rule\n", encoding="utf-8")
    page = docs / "page.md"
    page.write_text(
        "[ok](adapters.md#the-call-rule) [twice](adapters.md#the-call-rule-1) [site](recipes.md)\n"
        "[gone](adapters.md#no-such-anchor) [ref](reference/cli.md) `[code](nowhere.md)`\n"
        "```\n[block](nowhere.md)\n```\n[out](https://example.com/x.md) [self](#page)\n# Page\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = broken_links(page)
    assert [f.split(": ", 1)[1].split(" ->")[0] for f in found] == [
        "recipes.md",
        "adapters.md#no-such-anchor",
        "reference/cli.md",
    ]


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Serve a checkpoint MaxText's trainer wrote", "serve-a-checkpoint-maxtexts-trainer-wrote"),
        ("The accelerator tier: `make test-accel`", "the-accelerator-tier-make-test-accel"),
        ("3. Run the compat matrix over your own project", "3-run-the-compat-matrix-over-your-own-project"),
        ("Serve with plain `vllm serve`", "serve-with-plain-vllm-serve"),
    ],
)
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def test_no_page_narrates_our_own_work():
    """What the pages say is what the library does and what was measured, not the story of how (no session, run
    number, issue or device time): the history of runs is benchmarks/results/README.md's table."""
    pages = [
        *(p for p in (REPO / "docs").rglob("*") if p.is_file()),
        REPO / "README.md",
        REPO / "benchmarks" / "README.md",
    ]
    hits = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in pages
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if NARRATION.search(line)
    ]
    assert not hits, "\n".join(hits)
