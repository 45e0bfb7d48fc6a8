"""MkDocs hooks (mkdocs.yml `hooks:`): the generated pages, and every page of docs/ in the navigation.

Why hooks and not a plugin: a few plain functions, read by `make docs` from the checkout, with nothing to install.
Generated pages exist only in the site (they are added as files at build time, never written into docs/); the
committed bad-input catalog is rendered again from the suite's case tables, so the site never shows a stale one.
A page in docs/ that the navigation does not list is appended under "More" (with `omitted_files: warn` a page
nobody listed would otherwise fail the strict build): a page another change adds is in the site at once.
"""

from __future__ import annotations

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
    from maxtext_compat import env_runner
    from maxtext_compat.report import page

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
    """Regenerated pages, and the recorded-times table of testing.md."""
    path = page.file.src_uri
    if path in REGENERATED:
        return REGENERATED[path]()
    if RECORDED_TIMES in markdown:
        markdown = markdown.replace(RECORDED_TIMES, recorded_times())
    return markdown


def recorded_times() -> str:
    """tests/env_durations.json (cold and warm), tests/env_memory.json and env_memory_light.json as one table, with
    the sums of the times."""
    from maxtext_compat import envdurations, envmemory

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
