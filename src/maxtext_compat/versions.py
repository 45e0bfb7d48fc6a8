"""Which versions of the stack are installed, read from package metadata only.

Why metadata and not imports: importing MaxText or tpu-inference takes seconds and has
side effects (XLA_FLAGS, jax patches, torch). `importlib.metadata` answers in
milliseconds and also tells commit-pinned installs apart (PEP 610 `direct_url.json`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata

from packaging.direct_url import DirectUrl, DirectUrlValidationError
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from maxtext_compat.errors import InvalidArgumentError

# Distribution names we care about, keyed by the short name used throughout the project.
TRACKED: dict[str, tuple[str, ...]] = {
    "maxtext": ("maxtext", "MaxText"),
    "tpu_inference": ("tpu-inference", "tpu_inference"),
    "vllm": ("vllm-tpu", "vllm"),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "flax": ("flax",),
}
ALIASES = {"tpu-inference": "tpu_inference", "vllm-tpu": "vllm", "vllm_tpu": "vllm"}


@dataclass(frozen=True)
class DistInfo:
    """One installed (or hypothetical) distribution."""

    name: str
    version: str
    commit: str | None = None
    url: str | None = None
    editable: bool = False

    @property
    def parsed(self) -> Version | None:
        try:
            return Version(self.version)
        except InvalidVersion:
            return None

    def describe(self) -> str:
        extra = []
        if self.commit:
            extra.append(f"commit {self.commit[:12]}")
        if self.editable:
            extra.append("editable")
        return self.version + (f" ({', '.join(extra)})" if extra else "")


def as_version(text: object) -> Version | None:
    """`text` as a PEP 440 version, None when it is not one (never raises)."""
    if isinstance(text, Version):
        return text
    try:
        return Version(str(text))
    except InvalidVersion:
        return None


def version_in(text: object, candidates: Iterable[object]) -> bool:
    """Whether `text` equals one of `candidates` as versions (0.32 == 0.32.0), not as strings."""
    v = as_version(text)
    return v is not None and any(v == as_version(c) for c in candidates)


def normalize_key(name: str) -> str:
    """Map user spellings (`tpu-inference`, `vllm-tpu`) to the project's short keys."""
    key = canonicalize_name(name).replace("-", "_")
    key = ALIASES.get(canonicalize_name(name), key)
    if key not in TRACKED:
        raise InvalidArgumentError(
            "unknown package name",
            argument="versions",
            expected=f"one of {sorted(TRACKED)} (or tpu-inference / vllm-tpu)",
            found=repr(name),
            fix="name the package as it is published, e.g. {'maxtext': '0.2.5', 'tpu-inference': '0.32.0'}",
        )
    return key


_READ: dict[tuple[object, ...], dict[str, DistInfo]] = {}  # the last reading, under the state it was read in


def _install_state() -> tuple[object, ...]:
    """What the installed metadata depends on: the search path, each entry's modification time (installing or
    removing a distribution adds or removes a folder there), and the reader (a test that patches it reads anew)."""
    entries: list[tuple[str, int | None]] = []
    for entry in sys.path:
        try:
            entries.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            entries.append((entry, None))
    return id(metadata.distribution), tuple(entries)


def installed_versions() -> dict[str, DistInfo]:
    """Installed versions of the tracked packages (missing ones are absent from the dict).

    Read once per install state (`_install_state`): a reading searches every path entry's metadata, ~60 ms, and
    installing a shim by name asks for it (its facts and verified range) each time."""
    state = _install_state()
    cached = _READ.get(state)
    if cached is not None:
        return dict(cached)
    found: dict[str, DistInfo] = {}
    for key, dists in TRACKED.items():
        for dist_name in dists:
            info = _read_dist(dist_name)
            if info is not None:
                found[key] = info
                break
    _READ.clear()
    _READ[state] = found
    return dict(found)


def _read_dist(dist_name: str) -> DistInfo | None:
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    commit = url = None
    editable = False
    direct = _direct_url(dist.read_text("direct_url.json"))
    if direct is not None:
        url = direct.url
        if direct.vcs_info is not None:
            commit = direct.vcs_info.commit_id
            url = f"{direct.vcs_info.vcs}+{direct.url}"  # as the user wrote it: git+file:///...
        editable = bool(direct.dir_info is not None and direct.dir_info.editable)
        if commit is None and url:
            commit = _commit_from_archive_url(url)
    return DistInfo(dist.metadata["Name"] or dist_name, dist.version, commit, url, editable)


def _direct_url(raw: str | None) -> DirectUrl | None:
    """PEP 610 `direct_url.json`, read by packaging; unreadable or invalid means "not a direct install"."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
        return DirectUrl.from_dict(data) if isinstance(data, dict) else None
    except (ValueError, DirectUrlValidationError):
        return None


def _commit_from_archive_url(url: str) -> str | None:
    """`.../archive/<sha>.zip` (how MaxText pins tpu-inference) carries the commit in the URL."""
    tail = url.rstrip("/").rsplit("/", 1)[-1]
    for suffix in (".zip", ".tar.gz", ".tgz"):
        if tail.endswith(suffix):
            sha = tail[: -len(suffix)]
            if 7 <= len(sha) <= 40 and all(c in "0123456789abcdef" for c in sha.lower()):
                return sha.lower()
    return None


def hypothetical_versions(versions: dict[str, str]) -> dict[str, DistInfo]:
    """Turn `{"maxtext": "0.2.2", "tpu-inference": "0.20.0"}` into DistInfo records."""
    out: dict[str, DistInfo] = {}
    given: dict[str, str] = {}
    for name, ver in versions.items():
        if ver is None:
            continue
        key = normalize_key(str(name))
        if key in out:  # {"vllm": ..., "vllm-tpu": ...}: one package named twice, one value would be lost
            raise InvalidArgumentError(
                "names one package twice",
                argument=f"versions[{name!r}]",
                expected="each package once",
                found=f"{given[key]!r} and {name!r}",
                fix="pass one version per package",
            )
        given[key] = name
        text = str(ver).strip()
        try:
            Version(text)
        except InvalidVersion:
            raise InvalidArgumentError(
                "not a PEP 440 version",
                argument=f"versions[{name!r}]",
                expected="a version such as 0.2.5",
                found=repr(ver),
                fix="pass the release number as published on PyPI",
            ) from None
        out[key] = DistInfo(TRACKED[key][0], text)
    return out


def installed_version(name: str) -> str | None:
    """The installed version of distribution `name` under any of its spellings (vllm-tpu for vllm), or None."""
    key = ALIASES.get(canonicalize_name(name), canonicalize_name(name).replace("-", "_"))
    info = installed_versions().get(key) if key in TRACKED else _read_dist(name)
    return None if info is None else info.version


def unmet(requirements: Iterable[str]) -> list[tuple[str, str, str]]:
    """The requirement strings (`maxtext>=0.2,<0.3`) an installed distribution does not meet: (the string as given,
    the distribution, the version installed). A distribution that is not installed is not checked; a pre-release or
    dev build counts as its release line (0.2.6.dev0 is in `>=0.2,<0.3`); a version that is not PEP 440 meets
    nothing."""
    out = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement as err:
            raise InvalidArgumentError(
                f"not a requirement string: {err}",
                argument="verified_for",
                expected="requirement strings such as 'maxtext>=0.2,<0.3'",
                found=repr(text),
                fix="write each verified range as a PEP 508 requirement",
            ) from None
        found = installed_version(req.name)
        if found is None:
            continue
        v = as_version(found)
        if v is None or not req.specifier.contains(v, prereleases=True):
            out.append((text, req.name, found))
    return out
