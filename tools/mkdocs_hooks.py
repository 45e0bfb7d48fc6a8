"""MkDocs hooks (mkdocs.yml `hooks:`): the generated pages, and every page of docs/ in the navigation.

Why hooks and not a plugin: a few plain functions, read by `make docs` from the checkout, with nothing to install.
Generated pages exist only in the site (they are added as files at build time, never written into docs/); the
committed bad-input catalog is rendered again from the suite's case tables, so the site never shows a stale one.
A page in docs/ that the navigation does not list is appended under "More" (with `omitted_files: warn` a page
nobody listed would otherwise fail the strict build): a page another change adds is in the site at once.
"""

from __future__ import annotations

import posixpath
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
BUILD = REPO / "build"
if str(TOOLS) not in sys.path:  # mkdocs puts it there only while it loads this file
    sys.path.insert(0, str(TOOLS))

import docs_pages  # noqa: E402  (tools/ is not a package: its scripts import each other from the path)
import docs_reference  # noqa: E402
import gen_catalog_table  # noqa: E402

RECORDED_TIMES = "<!-- recorded-times -->"


def _report_page() -> str:
    from maxtext_compat.report import page
    from maxtext_compat.runner import running as env_runner

    durations = env_runner.expected_durations(REPO / env_runner.DURATIONS_FILE, cold=True)  # a fresh machine's plan
    return page.site_page(BUILD, durations, docs_pages.ci_matrix())  # the environments `make test` runs


GENERATED: dict[str, Callable[[], str]] = {
    "recipes.md": lambda: docs_pages.recipes_page((REPO / "README.md").read_text(encoding="utf-8")),
    "reference/cli.md": docs_pages.cli_page,
    "reference/conventions.md": docs_reference.conventions_page,
    "reference/matrix-format.md": docs_reference.matrix_format_page,
    "reference/api.md": docs_reference.api_page,
    "benchmarks.md": lambda: docs_pages.benchmarks_page(BUILD),
    "compat-report.md": _report_page,
}


def _catalog() -> str:
    if str(REPO / "tests") not in sys.path:  # the catalog's case tables import the suite's helpers
        sys.path.insert(0, str(REPO / "tests"))
    return gen_catalog_table.render()


REGENERATED: dict[str, Callable[[], str]] = {"bad-input-catalog.md": _catalog}


def _nav_files(nav: Any) -> set[str]:
    """Every page path the navigation names."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_nav_files(v) for v in nav.values()))
    if isinstance(nav, list):
        return set().union(*(_nav_files(v) for v in nav)) if nav else set()
    return set()


def _title(path: Path) -> str:
    match = re.search(r"^# (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
    return match.group(1).strip("` ") if match else path.stem.replace("-", " ").capitalize()


def on_config(config: Any) -> Any:
    """Append the pages of docs/ that the navigation leaves out under "More"."""
    docs = Path(config["docs_dir"])
    listed = _nav_files(config["nav"])
    missing = sorted(
        p.relative_to(docs).as_posix() for p in docs.rglob("*.md") if p.relative_to(docs).as_posix() not in listed
    )
    if missing:
        config["nav"].append({"More": [{_title(docs / m): m} for m in missing]})
    return config


def on_files(files: Files, config: Any) -> Files:
    """The generated pages, as files of this build only."""
    for path, make in GENERATED.items():
        if files.get_file_from_path(path) is not None:
            raise SystemExit(f"docs/{path} is generated at build time (tools/mkdocs_hooks.py): remove the file")
        files.append(File.generated(config, path, content=make()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Regenerated pages, the recorded-times table of testing.md, and links out of docs/ made the site's."""
    path = page.file.src_uri
    if path in REGENERATED:
        return REGENERATED[path]()
    if RECORDED_TIMES in markdown:
        markdown = markdown.replace(RECORDED_TIMES, recorded_times())
    return site_links(markdown, path, SOURCE_DIRS.get(path, posixpath.join("docs", posixpath.dirname(path))))


# Where a generated page's Markdown lives in the repository (its links are written relative to that folder).
SOURCE_DIRS = {"benchmarks.md": "benchmarks"}
# Files outside docs/ that the site has as a page of its own: (repository path, anchor or None) -> site page.
# The reference pages are generated from a source file: on GitHub a link leads to that file, in the site to its page.
SITE_PAGES = {
    ("benchmarks/README.md", None): "benchmarks.md",
    ("README.md", "three-recipes"): "recipes.md",
    ("compat_matrix.yaml", None): "reference/conventions.md",
    ("src/maxtext_compat/matrix/types.py", None): "reference/matrix-format.md",
    ("src/maxtext_compat/cli.py", None): "reference/cli.md",
    ("src/maxtext_compat/__init__.py", None): "reference/api.md",
}
LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)")


def _recipe_anchors() -> set[str]:
    """The README's recipe headings as GitHub (and the site's recipes page) slug them."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index(docs_pages.RECIPES_START) : readme.index(docs_pages.RECIPES_END)]
    return {_slug(h) for h in re.findall(r"^### (.+)$", section, flags=re.M)}


def _slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def site_links(markdown: str, page: str, source_dir: str) -> str:
    """Links written for GitHub (relative to the Markdown file in the repository) as the site resolves them.

    Pages link to files outside docs/ as GitHub renders them (`../README.md#three-recipes`,
    `../benchmarks/results/README.md`): the site has no such files, so a link to one the site has as a page of its
    own becomes a link to that page, and any other becomes its text with the repository path beside it."""
    page_dir = posixpath.dirname(page) or "."
    recipes = None

    def one(match: re.Match[str]) -> str:
        nonlocal recipes
        text, target = match.groups()
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(source_dir, path))
        if repo_path.startswith("docs/"):
            site = posixpath.relpath(repo_path.removeprefix("docs/"), page_dir)
            return f"[{text}]({site}{'#' + anchor if anchor else ''})"
        if repo_path == "README.md" and anchor:
            recipes = _recipe_anchors() if recipes is None else recipes
            if anchor in recipes:
                return f"[{text}]({posixpath.relpath('recipes.md', page_dir)}#{anchor})"
        site = SITE_PAGES.get((repo_path, anchor or None))
        if site:
            return f"[{text}]({posixpath.relpath(site, page_dir)})"
        return f"{text} (`{repo_path}`)"

    return LINK.sub(one, markdown)


def recorded_times() -> str:
    """tests/env_durations.json (cold and warm), tests/env_memory.json and env_memory_light.json as one table, with
    the sums of the times."""
    from maxtext_compat.runner import durations as envdurations
    from maxtext_compat.runner import memory as envmemory

    recorded = envdurations.read(REPO / "tests" / "env_durations.json")
    memory = envmemory.recorded_peaks(REPO / "tests" / "env_memory.json")
    light = envmemory.recorded_peaks(REPO / "tests" / envmemory.LIGHT_MEMORY_NAME)
    gated = envmemory.gated(memory, light)
    lines = [
        "| environment | cold cache (s) | warm cache (s) | peak memory (GB) | light peak (GB) |",
        "|---|---:|---:|---:|---:|",
    ]
    shown = lambda s: "-" if s is None else f"{s:.0f}"  # noqa: E731
    for name in sorted(recorded, key=lambda n: -recorded[n].longest()):
        r = recorded[name]
        lo = f"{light[name]:.1f}" + (" (gated)" if name in gated else "") if name in light else "-"
        lines.append(f"| `{name}` | {shown(r.cold)} | {shown(r.warm)} | {memory.get(name, float('nan')):.1f} | {lo} |")
    for case in (envdurations.COLD, envdurations.WARM):
        total = sum(r.planned(case == envdurations.COLD) for r in recorded.values())
        lines.append(f"\nIn all, {case}: {total:.0f} s ({total / 60:.1f} min) in {len(recorded)} environments.")
    return "\n".join(lines)
