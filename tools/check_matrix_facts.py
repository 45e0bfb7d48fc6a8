"""Check compat_matrix.yaml's facts against PyPI.

Why: the dates and pins in the matrix are copied by hand from PyPI, and two of them were wrong for months
(MaxText 0.2.3 and 0.2.5 upload days). This reads them back: every listed MaxText and tpu-inference release
must exist, be uploaded on the day the matrix says (UTC, earliest file), and with `--pins` each tpu-inference
wheel must pin the jax the matrix lists.

Usage: python tools/check_matrix_facts.py [--matrix compat_matrix.yaml] [--pins]   (exit 1 on a mismatch)
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from email.parser import Parser
from pathlib import Path
from urllib.parse import urljoin

from packaging.requirements import Requirement
from packaging.version import Version

from maxtext_compat.matrix import CompatMatrix, load_matrix

PYPI = "https://pypi.org/pypi/{project}/json"
ProjectJson = Mapping[str, object]


def fetch_project(project: str, timeout: float = 30.0) -> ProjectJson:
    """PyPI's JSON for a project (all releases and their files)."""
    with urllib.request.urlopen(PYPI.format(project=project), timeout=timeout) as r:
        return json.load(r)


def upload_days(project_json: ProjectJson) -> dict[Version, str]:
    """Each release's upload day (UTC): the day its first file reached PyPI."""
    days: dict[Version, str] = {}
    for version, files in project_json["releases"].items():  # type: ignore[union-attr]
        times = sorted(f["upload_time_iso_8601"] for f in files)
        if times:
            days[Version(version)] = times[0][:10]
    return days


def date_mismatches(m: CompatMatrix, maxtext: Mapping[Version, str], tpi: Mapping[Version, str]) -> list[str]:
    """Every matrix date that PyPI does not confirm, as one line each."""
    listed = [("maxtext", row.release, row.date, maxtext) for row in m.maxtext]
    releases = [rel for row in m.tpu_inference for rel in row.releases.values()]
    listed += [("tpu-inference", Version(rel.version), rel.date, tpi) for rel in releases]
    out = []
    for project, version, date, days in listed:
        if version not in days:
            out.append(f"{project} {version}: listed in the matrix, not on PyPI")
        elif days[version] != date:
            out.append(f"{project} {version}: matrix says {date}, PyPI says {days[version]}")
    return out


def wheel_metadata(project: str, project_json: ProjectJson, version: str, timeout: float = 60.0) -> str:
    """The METADATA file of a release's first wheel (file URLs may be relative to the JSON's)."""
    files = project_json["releases"][version]  # type: ignore[index]
    wheel = next(f for f in files if f["filename"].endswith(".whl"))
    with urllib.request.urlopen(urljoin(PYPI.format(project=project), wheel["url"]), timeout=timeout) as r:
        data = r.read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode()


def pinned(metadata: str, dependency: str) -> str | None:
    """The version `dependency==X` is pinned to in a METADATA text, or None."""
    for line in Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.name.lower() == dependency and len(req.specifier) == 1:
            spec = next(iter(req.specifier))
            if spec.operator == "==":
                return spec.version
    return None


def pin_mismatches(m: CompatMatrix, metadata_of: Callable[[str], str]) -> list[str]:
    """Every tpu-inference release whose wheel pins another jax than the matrix lists."""
    out = []
    for row in m.tpu_inference:
        for rel in row.releases.values():
            jax = pinned(metadata_of(rel.version), "jax")
            if jax is None or Version(jax) != Version(rel.jax):
                out.append(f"tpu-inference {rel.version}: matrix says jax {rel.jax}, the wheel pins {jax}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", type=Path, default=Path(__file__).resolve().parent.parent / "compat_matrix.yaml")
    ap.add_argument("--pins", action="store_true", help="also download each tpu-inference wheel and check its jax pin")
    args = ap.parse_args(argv)
    m = load_matrix(args.matrix)
    tpi_json = fetch_project("tpu-inference")
    problems = date_mismatches(m, upload_days(fetch_project("maxtext")), upload_days(tpi_json))
    if args.pins:
        problems += pin_mismatches(m, lambda v: wheel_metadata("tpu-inference", tpi_json, v))
    for line in problems:
        print(line)
    print(f"{len(problems)} mismatch(es) between {args.matrix} and PyPI")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
