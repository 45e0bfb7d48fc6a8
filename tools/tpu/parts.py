"""Pack a wheel folder into parts that each fit one transfer to the TPU machine, and unpack them there, checked by
sha256.

Why: a command reaches the TPU machine with the working tree and at most 64 MiB of carried files per call, and the
tier's wheels are 125 MiB (SmolLM2's GGUF wheel alone is 89 MiB). Wheels are zip files compressed entry by entry;
recompressed as one xz stream the small ones take a third less (36 -> 24 MiB), which is what lets two calls carry
everything. `split` writes build/tpu-parts/part-N folders, each under the limit, filled in order:
  bundle-1.tar.xz   the wheels the `--first` lists pin (what the first call installs and tests with), whole in part-1
  bundle-2.tar.xz   every other wheel below --big-mib
  the wheels above --big-mib as they are (deflate: an xz stream saves ~2 % of a quantized GGUF file)
  the wheels the `--last` lists pin, as they are, from a part of their own on (a stage the first parts never carry:
  adding one leaves the earlier parts as they were)
a file cut where a part is full. In a bundle each wheel is stored uncompressed (the same members, byte for byte:
pip installs it as it is). Every part carries the whole manifest, so `join` on the machine rebuilds what the parts
present allow, checks every wheel's sha256 and names the parts still missing, for the wheels a stage `--need`s or
for all.

usage: parts.py split WHEELS PARTS [--limit-mib N] [--big-mib N] [--first LIST ...] [--last LIST ...]
       parts.py join WHEELS [--parts PARTS] [--need LIST ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MANIFEST = "manifest.json"
MIB = 1 << 20


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(lists: list[Path]) -> set[tuple[str, str]]:
    """(name, version) of every `name==version` line of the pin lists (comments and blank lines skipped)."""
    out = set()
    for path in lists:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split("#", 1)[0].strip()
            if "==" in line:
                name, version = line.split("==", 1)
                out.add((_canon(name), version.strip()))
    return out


def wheel_pin(filename: str) -> tuple[str, str]:
    """(name, version) of a wheel file name: `name-version-...whl`."""
    name, version = filename.split("-")[:2]
    return _canon(name), version


def _stored(wheel: Path, out: Path) -> None:
    """`wheel` rewritten with every member stored uncompressed (same names, order and bytes)."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            info.compress_type = zipfile.ZIP_STORED
            dst.writestr(info, data)


def _bundle(wheels: list[Path], out: Path) -> dict[str, str]:
    """An xz tar of `wheels` stored uncompressed; returns {wheel name: sha256 of the stored wheel}."""
    shas = {}
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(out, "w:xz", preset=6) as tar:
        for w in wheels:
            stored = Path(tmp) / w.name
            _stored(w, stored)
            shas[w.name] = _sha256(stored)
            tar.add(stored, arcname=w.name)
            stored.unlink()
    return shas


def split(
    wheels: Path,
    parts: Path,
    limit_mib: float,
    first: list[Path] | None = None,
    big_mib: float = 20.0,
    last: list[Path] | None = None,
) -> list[tuple[str, int]]:
    """Pack every wheel of `wheels` into parts of at most `limit_mib` (see the module's docstring); returns
    (part, bytes) per part."""
    limit = int(limit_mib * MIB)
    want_first, want_last = pinned(first or []), pinned(last or [])
    all_wheels = sorted(p for p in wheels.iterdir() if p.is_file())
    head = [p for p in all_wheels if wheel_pin(p.name) in want_first]
    tail = [p for p in all_wheels if wheel_pin(p.name) in want_last and p not in head]
    for flag, want, got in (("--first", want_first, head), ("--last", want_last - want_first, tail)):
        missing = want - {wheel_pin(p.name) for p in got}
        if missing:
            raise SystemExit(f"parts.py: {flag} pins with no wheel in {wheels}: {sorted(missing)}")
    big = [p for p in all_wheels if p not in head and p not in tail and p.stat().st_size > big_mib * MIB]
    rest = [p for p in all_wheels if p not in head and p not in tail and p not in big]
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        bundles: dict[str, dict[str, str]] = {}
        packed: list[Path] = []
        for name, group in (("bundle-1.tar.xz", head), ("bundle-2.tar.xz", rest)):
            if group:
                bundles[name] = _bundle(group, staging / name)
                packed.append(staging / name)
        if head and packed[0].stat().st_size > limit:
            raise SystemExit(f"parts.py: the --first wheels ({packed[0].stat().st_size / MIB:.1f} MiB packed) do "
                             f"not fit one part of {limit_mib} MiB")  # fmt: skip
        plain = {p.name: _sha256(p) for p in [*big, *tail]}
        return _write_parts([*packed, *big, *tail], parts, limit, bundles, plain, fresh=tuple(tail[:1]))


def _write_parts(
    files: list[Path],
    parts: Path,
    limit: int,
    bundles: dict[str, dict[str, str]],
    plain: dict[str, str],
    fresh: tuple[Path, ...] = (),
) -> list[tuple[str, int]]:
    """Fill part after part with `files` in order, a file cut where a part is full (a part with under a quarter
    left starts the next file afresh when it fits one part whole; a file in `fresh` always starts a part)."""
    pieces: list[list[tuple[Path, str, int, int]]] = [[]]  # per part: (file, chunk name, offset, size)
    packed: dict[str, dict] = {}
    room = limit
    for f in files:
        if f in fresh and pieces[-1]:
            pieces.append([])
            room = limit
        size = f.stat().st_size
        packed[f.name] = {"sha256": _sha256(f), "size": size, "chunks": []}
        whole = size <= room
        if not whole and size <= limit and room < limit // 4:
            pieces.append([])
            room, whole = limit, True
        offset, i = 0, 0
        while offset < size:
            if room == 0:
                pieces.append([])
                room = limit
            take = size - offset if whole else min(size - offset, room)
            cname = f.name if offset == 0 and take == size else f"{f.name}.chunk-{i:02d}"
            pieces[-1].append((f, cname, offset, take))
            packed[f.name]["chunks"].append([f"part-{len(pieces)}", cname])
            offset, room, i = offset + take, room - take, i + 1
    manifest = {"parts": len(pieces), "packed": packed, "bundles": bundles, "plain": plain}
    if parts.exists():
        shutil.rmtree(parts)
    out = []
    for n, chunk_list in enumerate(pieces, 1):
        d = parts / f"part-{n}"
        d.mkdir(parents=True)
        for f, cname, offset, size in chunk_list:
            with f.open("rb") as src, (d / cname).open("wb") as dst:
                src.seek(offset)
                dst.write(src.read(size))
        (d / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        out.append((d.name, sum(p.stat().st_size for p in d.iterdir())))
    return out


def _assemble(name: str, info: dict, parts: Path, staging: Path) -> Path | None:
    """The packed file rebuilt from its chunks into `staging` (sha256-checked), or None while a chunk is absent."""
    target = staging / name
    if target.is_file() and target.stat().st_size == info["size"] and _sha256(target) == info["sha256"]:
        return target
    chunks = [parts / part / cname for part, cname in info["chunks"]]
    if not all(c.is_file() for c in chunks):
        return None
    tmp = target.with_name(target.name + ".partial")
    with tmp.open("wb") as dst:
        for c in chunks:
            dst.write(c.read_bytes())
    if _sha256(tmp) != info["sha256"]:
        tmp.unlink()
        raise SystemExit(f"parts.py: {name} rebuilt from {len(chunks)} chunk(s) has the wrong sha256")
    tmp.replace(target)
    return target


def _good(path: Path, sha: str) -> bool:
    return path.is_file() and _sha256(path) == sha


def join(wheels: Path, parts: Path, need: list[Path] | None = None) -> list[str]:
    """Rebuild in `wheels` every wheel whose parts are present; returns the parts still missing for the wheels the
    `need` lists pin (for every wheel without `need`)."""
    manifests = sorted(parts.glob(f"part-*/{MANIFEST}"))
    if not manifests:
        return []  # nothing was split: the folder is used as it is
    manifest = json.loads(manifests[0].read_text())
    wheels.mkdir(parents=True, exist_ok=True)
    staging = wheels / ".packed"
    staging.mkdir(exist_ok=True)
    needed = pinned(need) if need else None
    missing: set[str] = set()
    for name, info in manifest["packed"].items():
        members = manifest["bundles"].get(name) or {name: manifest["plain"][name]}
        if all(_good(wheels / w, sha) for w, sha in members.items()):
            continue
        built = _assemble(name, info, parts, staging)
        if built is None:
            if needed is None or any(wheel_pin(w) in needed for w in members):
                missing |= {part for part, cname in info["chunks"] if not (parts / part / cname).is_file()}
            continue
        if name in manifest["bundles"]:
            with tarfile.open(built, "r:xz") as tar:
                tar.extractall(wheels, filter="data")
            built.unlink()
        else:
            built.replace(wheels / name)
        bad = [w for w, sha in members.items() if not _good(wheels / w, sha)]
        if bad:
            raise SystemExit(f"parts.py: {', '.join(bad)} from {name}: wrong sha256")
    return sorted(missing)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("wheels", type=Path)
    s.add_argument("parts", type=Path)
    s.add_argument("--limit-mib", type=float, default=58.0)
    s.add_argument("--big-mib", type=float, default=20.0, help="wheels above this travel as they are")
    s.add_argument("--first", type=Path, action="append", default=[], help="a pin list whose wheels go in part-1")
    s.add_argument("--last", type=Path, action="append", default=[], help="a pin list whose wheels start a part")
    j = sub.add_parser("join")
    j.add_argument("wheels", type=Path)
    j.add_argument("--parts", type=Path, default=Path("build/tpu-parts"))
    j.add_argument("--need", type=Path, action="append", default=[], help="a pin list whose wheels must be there")
    a = ap.parse_args(argv)
    if a.cmd == "split":
        for name, size in split(a.wheels, a.parts, a.limit_mib, a.first, a.big_mib, a.last):
            print(f"{a.parts / name}: {size / MIB:.1f} MiB")
        return 0
    missing = join(a.wheels, a.parts, a.need)
    if missing:
        print(
            f"parts.py: carry {', '.join(str(a.parts / m) for m in missing)} too (one transfer each)", file=sys.stderr
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
