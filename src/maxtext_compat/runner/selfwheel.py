"""Install the running maxtext-compat into another virtual environment, exactly as it is installed here.

Why: a nox session (or any runner) that tests a user's project against a pin set must test it with the
maxtext-compat that drives it, not with whatever release the registry has. An editable install is installed
editable again from its source folder; any other install is packed back into a wheel from its own installed
files (RECORD lists them), so the other environment gets the same version and the same bytes, with no build
backend and no network.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from maxtext_compat.atomic_file import replacing
from maxtext_compat.errors import EnvironmentBuildError

DISTRIBUTION = "maxtext-compat"
PACKAGE = "maxtext_compat"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the imported maxtext_compat/ (this module sits in runner/)
# Written by the installer, not shipped in the wheel: a fresh RECORD replaces RECORD, the new installer writes
# its own (uv adds uv_cache.json / uv_build.json), and a signature of the old RECORD would not match the new one.
_STANDARD = ("RECORD", "RECORD.jws", "RECORD.p7s", "INSTALLER", "REQUESTED", "direct_url.json")
INSTALL_TIME = frozenset((*_STANDARD, "uv_cache.json", "uv_build.json"))
_EPOCH = (1980, 1, 1, 0, 0, 0)  # a fixed timestamp: the same files give the same wheel bytes

__all__ = ["build_wheel", "self_install_args"]


def self_install_args(folder: Path, extras: str = "test") -> tuple[str, ...]:
    """The arguments after `uv pip install` that install this same maxtext-compat (with `extras`) elsewhere.

    folder: where a rebuilt wheel is kept (a sub-folder per content hash, so a changed install is rebuilt)."""
    dist = _distribution()
    suffix = f"[{extras}]" if extras else ""
    source = _editable_source(dist)
    if source is not None:
        return ("-e", f"{source}{suffix}")
    wheel = build_wheel(Path(folder), dist)
    return (f"{DISTRIBUTION}{suffix} @ {wheel.as_uri()}",)


def build_wheel(folder: Path, dist: metadata.Distribution | None = None) -> Path:
    """A wheel of the installed (non-editable) distribution's files, written once per content into `folder`."""
    dist = dist or _distribution()
    info, members = _members(dist)
    tag = _wheel_tag(dist)
    version = dist.version.replace("-", "_")
    payload = {name: path.read_bytes() for name, path in members}
    digest = hashlib.sha256()
    for name in sorted(payload):
        digest.update(f"{name}\0{hashlib.sha256(payload[name]).hexdigest()}\n".encode())
    target = folder.resolve() / digest.hexdigest()[:16] / f"{PACKAGE}-{version}-{tag}.whl"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    record_name = f"{info}/RECORD"
    record = [f"{name},sha256={_b64_sha256(data)},{len(data)}" for name, data in payload.items()]
    record.append(f"{record_name},,")
    with replacing(target, mode=0o644) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(payload, key=lambda n: (n.startswith(info + "/"), n)):  # dist-info last, as in wheels
            zf.writestr(_zip_info(name), payload[name])
        zf.writestr(_zip_info(record_name), "\n".join(record) + "\n")
    return target


def _distribution() -> metadata.Distribution:
    """The installed maxtext-compat's metadata; a typed error when the imported package was never installed."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise EnvironmentBuildError(
            "maxtext-compat is imported but not installed (no distribution metadata)",
            argument=DISTRIBUTION,
            expected="an installed distribution (pip or uv pip install, editable or not)",
            found=str(PACKAGE_DIR),
            fix="install it: `uv pip install -e .` in its source folder, or `uv pip install maxtext-compat`",
        ) from None
    return dist


def _editable_source(dist: metadata.Distribution) -> str | None:
    """The source folder of an editable install (PEP 610 direct_url.json), None for any other install."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        url = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not (url.get("dir_info") or {}).get("editable"):
        return None
    parsed = urlparse(url.get("url", ""))
    if parsed.scheme != "file":
        raise EnvironmentBuildError(
            "the editable maxtext-compat does not point at a local folder",
            argument="direct_url.json",
            expected="a file:// URL",
            found=url.get("url"),
            fix="reinstall it editable from a local checkout: `uv pip install -e PATH`",
        )
    return url2pathname(unquote(parsed.path))


def _members(dist: metadata.Distribution) -> tuple[str, list[tuple[str, Path]]]:
    """The dist-info folder's name and the (archive name, file) pairs to pack: the package and its metadata."""
    files = dist.files
    if not files:
        raise EnvironmentBuildError(
            "the installed maxtext-compat lists no files (its dist-info has no RECORD)",
            argument="RECORD",
            expected="an install made by pip or uv",
            found=str(getattr(dist, "_path", DISTRIBUTION)),
            fix="reinstall maxtext-compat with pip or uv",
        )
    info = next((f.parts[0] for f in files if len(f.parts) == 2 and f.parts[0].endswith(".dist-info")), None)
    members: list[tuple[str, Path]] = []
    for f in files:
        parts = f.parts
        if parts[0] == PACKAGE:
            if "__pycache__" in parts or f.name.endswith(".pyc"):
                continue
        elif parts[0] != info or f.name in INSTALL_TIME:
            continue
        members.append(("/".join(parts), Path(str(dist.locate_file(f)))))
    _check_running(members)
    missing = [name for name, path in members if not path.is_file()]
    if info is None or missing:
        raise EnvironmentBuildError(
            "the installed maxtext-compat is incomplete: files its RECORD lists are missing",
            argument="RECORD",
            expected="every listed file present",
            found=", ".join(missing[:5]) or "no dist-info folder",
            fix="reinstall maxtext-compat (`uv pip install --reinstall maxtext-compat`)",
        )
    return info, members


def _check_running(members: list[tuple[str, Path]]) -> None:
    """Refuse when the imported package is not the installed one (e.g. PYTHONPATH names a checkout)."""
    init = dict(members).get(f"{PACKAGE}/__init__.py")
    here = PACKAGE_DIR / "__init__.py"
    if init is None or init.resolve() != here:
        raise EnvironmentBuildError(
            "the running maxtext-compat is not the installed one",
            argument=PACKAGE,
            expected=str(init.resolve().parent if init else "maxtext_compat/ in the distribution's RECORD"),
            found=str(here.parent),
            fix="run from the environment where it is installed, without PYTHONPATH pointing at another copy",
        )


def _wheel_tag(dist: metadata.Distribution) -> str:
    """The wheel's compressed tag from the WHEEL file's Tag lines (py3-none-any for this pure package)."""
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]  # fmt: skip
    if not tags:
        return "py3-none-any"
    parts = [t.split("-") for t in tags]
    return "-".join(".".join(dict.fromkeys(p[i] for p in parts)) for i in range(3))


def _b64_sha256(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _zip_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info
