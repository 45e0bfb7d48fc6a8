"""Check the TPU tier's pin lists against a wheel folder: `check-local LIST DIR...` fails when a pin of LIST has no
wheel in the folders (the TPU machine's own index: /opt/pypi/files, /opt/wheels), naming the pins."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
except ImportError:  # an interpreter with pip only: pip's own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename  # type: ignore[no-redef]


def pins(path: Path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def missing(reqs: list[Requirement], folders: list[Path]) -> list[str]:
    have = set()
    for d in folders:
        for f in d.glob("*.whl") if d.is_dir() else ():
            name, version, _, _ = parse_wheel_filename(f.name)
            have.add((name, str(version)))
    out = []
    for r in reqs:
        versions = [s.version for s in r.specifier if s.operator == "=="]
        if not versions or (canonicalize_name(r.name), versions[0]) not in have:
            out.append(str(r))
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "check-local":
        print(__doc__, file=sys.stderr)
        return 2
    gone = missing(pins(Path(argv[1])), [Path(d) for d in argv[2:]])
    if gone:
        print(f"pins.py: not in {', '.join(argv[2:])}: {', '.join(gone)} (move them to bring.txt)", file=sys.stderr)
        return 1
    print(f"pins.py: every pin of {argv[1]} is in {', '.join(argv[2:])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
