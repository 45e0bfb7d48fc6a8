"""Where a MaxText release's files are read from: a wheel, a source tree, or the installed distribution.

Why one interface: `facts` reads the same package-relative paths (`maxtext/layers/attentions.py`) and the same
metadata (version, requirements, PEP 610 origin) from a zip, a folder or site-packages, and never imports the
release (no TensorFlow, no XLA_FLAGS, no jax patches).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

from maxtext_compat.errors import InvalidArgumentError

ROOTS = ("maxtext", "MaxText")
_DIST_NAMES = ("maxtext", "MaxText")
# Folders of the wheel beside the packages that hold MaxText's own pins (tpu-inference by commit).
PIN_FOLDERS = ("dependencies", "install_maxtext_extra_deps")


@dataclass(frozen=True)
class ReleaseFiles:
    """A release's files by package-relative path, its version and requirements, and where it came from."""

    kind: str  # "wheel", "tree" or "installed"
    location: str
    names: frozenset[str]
    reader: Callable[[str], str] = field(repr=False, compare=False)
    version: str | None = None
    requirements: tuple[str, ...] = ()
    origin: dict[str, object] = field(default_factory=dict)  # PEP 610: url, commit, editable (installed only)

    def text(self, name: str) -> str | None:
        return self.reader(name) if name in self.names else None


def open_source(source: str | Path | None) -> ReleaseFiles:
    """`source`: a wheel file, a folder (a source tree, its `src/`, or site-packages), or "installed" / None."""
    if source is None or str(source) == "installed":
        return installed()
    path = Path(source)
    if path.is_file() and path.suffix == ".whl":
        return wheel(path)
    if path.is_dir():
        return tree(path)
    raise InvalidArgumentError(
        "is not a MaxText release to read",
        argument="SOURCE",
        expected="a MaxText wheel (.whl), a folder holding its source tree, or `installed`",
        found=str(source) if path.exists() else f"{source} (no such file or folder)",
        fix="pass the wheel `pip download maxtext==X --no-deps` fetched, your MaxText checkout, or `installed`",
    )


def wheel(path: Path) -> ReleaseFiles:
    """A wheel, read in place (a zip: nothing is extracted)."""
    zf = zipfile.ZipFile(path)
    names = frozenset(n for n in zf.namelist() if not n.endswith("/"))
    meta = next((n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)

    def read(name: str) -> str:
        return zf.read(name).decode("utf-8", errors="replace")

    version, reqs = _metadata(read(meta)) if meta else (None, ())
    return ReleaseFiles("wheel", str(path), names, read, version, reqs)


def tree(path: Path) -> ReleaseFiles:
    """A folder: a project (pyproject.toml, `src/` or flat layout), site-packages, or the package folder itself."""
    path = path.resolve()
    root = _package_root(path)
    names = frozenset(_walk(root))
    dist_info = sorted(root.glob("maxtext-*.dist-info/METADATA")) + sorted(root.glob("MaxText-*.dist-info/METADATA"))
    version: str | None = None
    reqs: tuple[str, ...] = ()
    if dist_info:
        version, reqs = _metadata(dist_info[0].read_text(encoding="utf-8"))
    else:
        project = next((p for p in (path, *path.parents) if (p / "pyproject.toml").is_file()), None)
        if project is not None and (project == root or project in root.parents):
            version, reqs = _pyproject(project / "pyproject.toml")
        if version is None:
            version = _version_in_code(root, names)
    return ReleaseFiles("tree", str(path), names, lambda n: (root / n).read_text(encoding="utf-8"), version, reqs)


def installed() -> ReleaseFiles:
    """The installed distribution: its files found as Python would import them (find_spec runs no package code)."""
    dist = None
    for name in _DIST_NAMES:
        try:
            dist = metadata.distribution(name)
            break
        except metadata.PackageNotFoundError:
            continue
    bases: list[Path] = []
    for root in ROOTS:
        try:
            spec = importlib.util.find_spec(root)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.submodule_search_locations:
            bases.extend(Path(p).parent for p in spec.submodule_search_locations)
    if dist is None or not bases:
        raise InvalidArgumentError(
            "MaxText is not installed in this Python",
            argument="SOURCE",
            expected="an installed maxtext distribution",
            found="no maxtext distribution" if dist is None else "no importable maxtext package",
            fix="install MaxText here, or pass a wheel or a source folder",
        )
    base = bases[0]
    names = frozenset(_walk(base))
    reqs = tuple(dist.requires or ())
    origin = _origin(dist.read_text("direct_url.json"))
    return ReleaseFiles("installed", str(base), names, lambda n: (base / n).read_text(encoding="utf-8"),
                        dist.version, reqs, origin)  # fmt: skip


def _package_root(path: Path) -> Path:
    """The folder whose children are the `maxtext` / `MaxText` packages."""
    for candidate in (path / "src", path):
        if any((candidate / r).is_dir() for r in ROOTS):
            return candidate
    if path.name in ROOTS:
        return path.parent
    raise InvalidArgumentError(
        "holds no MaxText package",
        argument="SOURCE",
        expected="a folder with maxtext/ (or MaxText/), directly or under src/",
        found=str(path),
        fix="pass the root of your MaxText checkout (the folder with pyproject.toml) or its src/ folder",
    )


def _walk(base: Path) -> list[str]:
    """Package-relative names of the MaxText packages' files, and the pin folders' (nothing else is read)."""
    out: list[str] = []
    for top in (*ROOTS, *PIN_FOLDERS):
        folder = base / top
        if not folder.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            rel = Path(dirpath).relative_to(base).as_posix()
            out.extend(f"{rel}/{f}" for f in filenames if f.endswith((".py", ".yml", ".yaml", ".txt")))
    return out


def _metadata(text: str) -> tuple[str | None, tuple[str, ...]]:
    msg = Parser().parsestr(text, headersonly=True)
    return msg.get("Version"), tuple(msg.get_all("Requires-Dist") or ())


def _pyproject(path: Path) -> tuple[str | None, tuple[str, ...]]:
    """[project]'s version and dependencies, each optional dependency written as METADATA writes it."""
    proj = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
    reqs = list(proj.get("dependencies", []))
    for extra, lines in proj.get("optional-dependencies", {}).items():
        reqs += [f"{line}; extra == '{canonicalize_name(extra)}'" for line in lines if ";" not in line]
    version = proj.get("version")
    return (str(version) if version else None), tuple(reqs)


_VERSION = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


def _version_in_code(root: Path, names: frozenset[str]) -> str | None:
    """`__version__` where MaxText keeps it (`maxtext/version.py` from 0.2.4, the package's __init__ before)."""
    for name in ("maxtext/version.py", "maxtext/__init__.py", "MaxText/__init__.py"):
        if name in names:
            found = _VERSION.search((root / name).read_text(encoding="utf-8"))
            if found:
                return found.group(1)
    return None


def _origin(raw: str | None) -> dict[str, object]:
    """PEP 610 direct_url.json as {url, commit, editable, vcs} (empty for an install from an index)."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    vcs = data.get("vcs_info") or {}
    dir_info = data.get("dir_info") or {}
    return {
        "url": data.get("url"),
        "commit": vcs.get("commit_id"),
        "requested_revision": vcs.get("requested_revision"),
        "vcs": vcs.get("vcs"),
        "editable": bool(dir_info.get("editable")),
    }
