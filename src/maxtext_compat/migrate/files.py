"""`maxtext-compat migrate`: run the codemod over files and directories; check, diff or write.

Files are never left half-written (the new text goes to a temporary file beside it, then replaces it);
a file that is not UTF-8, is binary or does not parse is reported and skipped, and the exit code says so.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from maxtext_compat.atomic_file import replacing
from maxtext_compat.migrate.callees import Callees, from_matrix
from maxtext_compat.migrate.codemod import Result, Site, Target, migrate_source

SKIP_DIRS = {".git", ".hg", ".svn", ".venv", "venv", ".envs", "__pycache__", "node_modules", ".tox", ".nox"}


@dataclass
class FileReport:
    path: Path
    sites: list[Site] = field(default_factory=list)
    changed: bool = False
    diff: str = ""
    skipped: str | None = None  # why the file was not migrated


def python_files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
                for name in sorted(files):
                    if name.endswith(".py"):
                        yield Path(root) / name
        else:
            yield path


def _read(path: Path) -> tuple[str | None, str | None]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"unreadable: {exc.strerror or exc}"
    if b"\0" in raw:
        return None, "binary file"
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte {exc.start})"


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text`: a temporary sibling, flushed, then renamed over it (mode kept)."""
    with replacing(path, mode=path.stat().st_mode & 0o7777) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def module_name(path: Path) -> str | None:
    """The dotted name of a file inside a package (directories with __init__.py up from it), else None."""
    parts = [path.stem] if path.name != "__init__.py" else []
    parent = path.resolve().parent
    if not (parent / "__init__.py").is_file():
        return None
    while (parent / "__init__.py").is_file():
        parts.insert(0, parent.name)
        parent = parent.parent
    return ".".join(parts)


def may_name_a_layer(tree: ast.Module, module: str | None, callees: Callees) -> bool:
    """Whether any name in the module can resolve to one of the classes (the cheap test before libcst).

    A name resolves to a MaxText class only through an import of it (or of a module on its path) or by the
    class being defined here; a file with neither holds no site, whatever words its text contains. The
    same rule libcst's qualified names follow, read from Python's own parser in a fraction of the time.
    """
    if callees.defined_in(module):
        return True
    package = module.rpartition(".")[0] if module else ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            if any(callees.may_lead_to(alias.name) for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this file's package
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}".strip(".") if parent else base
            if any(callees.may_lead_to(f"{base}.{alias.name}" if alias.name != "*" else base) for alias in node.names):
                return True
    return False


def migrate_file(path: Path, callees: Callees, target: Target, *, write: bool) -> FileReport:
    import libcst

    report = FileReport(path)
    code, why = _read(path)
    if code is None:
        report.skipped = why
        return report
    module = module_name(path)
    if not any(name in code for name in callees.short_names):  # no MaxText layer named: no site (most files)
        try:
            ast.parse(code, str(path))  # still say when it does not parse (fast; libcst is not needed)
        except SyntaxError as exc:
            report.skipped = f"does not parse: line {exc.lineno}, column {exc.offset}: {exc.msg}"
        return report
    try:
        if not may_name_a_layer(ast.parse(code, str(path)), module, callees):
            return report
    except SyntaxError:
        pass  # libcst reports it below, in its own words
    try:
        result: Result = migrate_source(code, callees, target, module)
    except libcst.ParserSyntaxError as exc:
        report.skipped = f"does not parse: line {exc.raw_line}, column {exc.raw_column}: {exc.message}"
        return report
    report.sites = result.sites
    report.changed = result.code != code
    if report.changed:
        report.diff = "".join(
            difflib.unified_diff(code.splitlines(True), result.code.splitlines(True), f"a/{path}", f"b/{path}")
        )
        if write:
            write_atomically(path, result.code)
    return report


def run(paths: list[Path], target: Target, *, write: bool) -> list[FileReport]:
    callees = from_matrix()
    return [migrate_file(p, callees, target, write=write) for p in python_files(paths)]


def exit_code(reports: list[FileReport], *, check: bool) -> int:
    """2: a file was skipped (unreadable, not UTF-8, unparsable); 1 (--check): a site to rewrite or to do by
    hand; else 0."""
    if any(r.skipped for r in reports):
        return 2
    if check and any(s.change in ("rewritten", "manual") for r in reports for s in r.sites):
        return 1
    return 0


def render(reports: list[FileReport], *, diff: bool, wrote: bool) -> str:
    lines: list[str] = []
    counts = {"rewritten": 0, "manual": 0, "unchanged": 0}
    for r in reports:
        if r.skipped:
            lines.append(f"{r.path}: skipped ({r.skipped})")
            continue
        for s in r.sites:
            counts[s.change] += 1
            if s.change != "unchanged":
                verb = ("rewrote" if wrote else "would rewrite") if s.change == "rewritten" else "manual"
                lines.append(f"{r.path}:{s.line}:{s.column}: {s.callee} ({s.kind}): {verb}: {s.detail}")
        if diff and r.diff:
            lines.append(r.diff.rstrip("\n"))
    skipped = sum(1 for r in reports if r.skipped)
    lines.append(
        f"{len(reports)} file(s), {sum(counts.values())} call site(s): {counts['rewritten']} "
        f"{'rewritten' if wrote else 'to rewrite'}, {counts['manual']} manual, {counts['unchanged']} unchanged"
        + (f"; {skipped} file(s) skipped" if skipped else "")
    )
    return "\n".join(lines)


def as_json(reports: list[FileReport]) -> str:
    return json.dumps(
        [
            {"path": str(r.path), "skipped": r.skipped, "changed": r.changed, "sites": [s.as_dict() for s in r.sites]}
            for r in reports
        ],
        indent=2,
    )
