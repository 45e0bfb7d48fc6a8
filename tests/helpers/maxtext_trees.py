"""MaxText as its users hold it: a wheel rebuilt from an installed release, a source tree unpacked from a wheel.

Why rebuild: every maxtext-* environment holds its release installed; its RECORD lists the wheel's files, so the
wheel is rebuilt in milliseconds with no download. A source tree (src layout, pyproject.toml written from the
wheel's METADATA) is what a checkout of MaxText looks like to pip, installed editable.
"""

from __future__ import annotations

import json
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement


def wheel_from_record(out: Path, dist_name: str = "maxtext") -> Path:
    """The installed distribution's files (as RECORD lists them, scripts and caches left out) zipped as a wheel."""
    dist = metadata.distribution(dist_name)
    base = Path(str(dist.locate_file("")))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist.metadata['Name']}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for f in dist.files or ():
            name = f.as_posix()
            if name.startswith("..") or "__pycache__" in name or name.endswith((".pyc", "direct_url.json")):
                continue
            if (base / name).is_file():
                zf.write(base / name, name)
    return path


def pyproject_from_metadata(text: str, packages: list[str]) -> str:
    """A hatchling pyproject.toml declaring what METADATA declares (name, version, Python, dependencies, extras)."""
    msg = Parser().parsestr(text, headersonly=True)
    deps: list[str] = []
    extras: dict[str, list[str]] = {}
    for line in msg.get_all("Requires-Dist") or ():
        req = Requirement(line)
        marker = str(req.marker or "")
        extra = next((e for e in msg.get_all("Provides-Extra") or () if f'extra == "{e}"' in marker), None)
        if extra is None:
            deps.append(line)
        else:
            rest = marker
            for form in (f' and extra == "{extra}"', f'extra == "{extra}" and ', f'extra == "{extra}"'):
                rest = rest.replace(form, "")
            req.marker = None
            extras.setdefault(extra, []).append(f"{req}; {rest.strip()}" if rest.strip() else str(req))

    def toml_list(items: list[str]) -> str:
        return json.dumps(items)  # a JSON string is a TOML basic string

    lines = [
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n',
        "[project]",
        f'name = "{msg["Name"]}"',
        f'version = "{msg["Version"]}"',
        *([f'requires-python = "{msg["Requires-Python"]}"'] if msg["Requires-Python"] else []),
        f"dependencies = {toml_list(deps)}",
        "",
        "[project.optional-dependencies]",
        *(f'"{e}" = {toml_list(v)}' for e, v in extras.items()),
        "",
        "[tool.hatch.build.targets.wheel]",
        f"packages = {toml_list([f'src/{p}' for p in packages])}",
        "",
        "[tool.hatch.metadata]\nallow-direct-references = true",
    ]
    return "\n".join(lines) + "\n"


def source_tree_from_wheel(wheel: Path, dest: Path) -> Path:
    """`dest` holding the wheel's packages under src/ and a pyproject.toml from its METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        meta = next(n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        packages = sorted({n.split("/")[0] for n in names if "/" in n and not n.split("/")[0].endswith(".dist-info")})
        for n in names:
            if n.split("/")[0] in packages:
                target = dest / "src" / n
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(n))
        text = zf.read(meta).decode("utf-8")
    (dest / "pyproject.toml").write_text(pyproject_from_metadata(text, packages), encoding="utf-8")
    return dest


def edit_attention_call(tree: Path, kind: str) -> Path:
    """A fork's local change to Attention.__call__ (only that method is edited): `keyword` adds a keyword-only
    argument with a default (`my_flag: bool = False`); `rename` renames kv_cache to kv_cache_in throughout it."""
    import ast
    import re

    path = tree / "src" / "maxtext" / "layers" / "attentions.py"
    text = path.read_text(encoding="utf-8")
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "Attention")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__call__")
    lines = text.splitlines(keepends=True)
    body = "".join(lines[fn.lineno - 1 : fn.end_lineno])
    if kind == "keyword":
        anchor = "shared_value: Array | None = None,\n"
        assert body.count(anchor) == 1, "0.2.5's signature ends with shared_value"
        body = body.replace(anchor, anchor + "      my_flag: bool = False,\n")
    elif kind == "rename":
        body = re.sub(r"\bkv_cache\b", "kv_cache_in", body)
    else:
        raise ValueError(kind)
    path.write_text("".join(lines[: fn.lineno - 1]) + body + "".join(lines[fn.end_lineno :]), encoding="utf-8")
    return tree


def git_commit(tree: Path) -> str:
    """`tree` as a git repository with one commit; its id."""
    import subprocess

    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "tree"]):
        subprocess.run(["git", *cmd], cwd=tree, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, check=True, capture_output=True, text=True)
    return out.stdout.strip()
