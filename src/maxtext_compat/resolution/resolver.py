"""Resolve installed (or hypothetical) versions to matrix rows and a decision.

The order of evidence: an exact release row, a commit-pinned install (PEP 610) matched
by source commit, a dev build matched by its base release, and only then the nearest
row, with a warning that says so. Incompatible combinations are typed errors that name
both versions and the nearest pairs that do work.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from packaging.version import Version

from maxtext_compat.errors import (
    IncompatibleVersionsError,
    ProbeMismatchError,
    ProbeMismatchWarning,
    ResolutionError,
    UnknownReleaseWarning,
    warn_at_call_site,
)
from maxtext_compat.matrix import CompatMatrix, MaxTextRow, TpiRelease, TpuInferenceRow, load_matrix
from maxtext_compat.resolution.probes import CodeMatch, ProbeReport, match_code, probe_static, source_of
from maxtext_compat.versions import DistInfo, hypothetical_versions, installed_versions

MaxTextMatch = Literal["exact", "commit", "dev", "probes", "nearest", "absent"]
TpuInferenceMatch = Literal["exact", "nearest", "absent"]


@dataclass(frozen=True)
class Resolution:
    """The matrix's decision for one combination of versions."""

    versions: Mapping[str, DistInfo]
    maxtext: MaxTextRow | None
    maxtext_match: MaxTextMatch
    tpu_inference: TpuInferenceRow | None
    tpu_inference_match: TpuInferenceMatch
    notes: tuple[str, ...] = ()
    probe: ProbeReport | None = None
    matrix: CompatMatrix | None = field(default=None, repr=False, compare=False)
    code: CodeMatch | None = None  # a MaxText installed from a folder or URL: its row found by its code

    @property
    def convention(self) -> str | None:
        return None if self.maxtext is None else self.maxtext.convention

    @property
    def cpu_shim_verified(self) -> bool | None:
        jax = self.versions.get("jax")
        if jax is None or self.matrix is None:
            return None
        return self.matrix.cpu_shim.jax_verified(jax.version)

    def rpa_call_form(self) -> dict[str, Any] | None:
        if self.tpu_inference is None:
            return None
        rpa = self.tpu_inference.rpa
        return {
            "form": rpa.call_form,
            "module": rpa.module,
            "function": rpa.function,
            "factory_params": list(rpa.factory_params),
            "params": list(rpa.params),
            "kwargs": list(rpa.optional_kwargs),
            "returns": rpa.returns,
        }

    def as_dict(self) -> dict[str, Any]:
        row = self.maxtext
        return {
            "versions": {k: v.describe() for k, v in sorted(self.versions.items())},
            "maxtext": None if row is None else row.name,
            "maxtext_match": self.maxtext_match,
            "import_root": None if row is None else row.import_root,
            "convention": self.convention,
            "default_decoder": None if row is None else row.default_decoder,
            "scan_kv_carry": None if row is None else row.scan_kv_carry,
            "returns": None if row is None else dict(row.returns),
            "deprecation_policy": None if row is None else row.deprecation.policy,
            "tpu_inference": None if self.tpu_inference is None else str(self.tpu_inference.versions),
            "tpu_inference_match": self.tpu_inference_match,
            "rpa_call_form": self.rpa_call_form(),
            "model_return_arity": None if self.tpu_inference is None else self.tpu_inference.model_return_arity,
            "cpu_shim_verified": self.cpu_shim_verified,
            "notes": list(self.notes),
            "probe": None if self.probe is None else self.probe.as_dict(),
            "code": None if self.code is None else self.code.as_dict(),
        }


def resolve(
    versions: Mapping[str, str] | None = None,
    *,
    matrix: CompatMatrix | None = None,
    strict: bool = False,
    probe: bool | None = None,
) -> Resolution:
    """Match versions to matrix rows.

    versions: None reads the installed packages; a dict (`{"maxtext": "0.2.2",
    "tpu-inference": "0.20.0"}`) asks about a hypothetical combination.
    probe: compare the row with the installed MaxText source (default: only when
    reading installed versions). strict: a probe mismatch raises instead of warning.
    """
    m = matrix if matrix is not None else load_matrix()
    infos = installed_versions() if versions is None else hypothetical_versions(dict(versions))
    return resolve_versions(infos, matrix=m, strict=strict, probe=probe if probe is not None else versions is None)


def resolve_versions(
    infos: Mapping[str, DistInfo], *, matrix: CompatMatrix, strict: bool = False, probe: bool = False
) -> Resolution:
    """`resolve()` for versions already read (installed_versions() or hypothetical_versions())."""
    m = matrix
    notes: list[str] = []
    row, how = _match_maxtext(m, infos.get("maxtext"), notes)
    code = None
    info = infos.get("maxtext")
    if info is not None and (info.editable or info.url):  # PEP 610: a folder, a VCS URL or an archive
        row, how, code = _by_code(m, info, row, how, notes)
    tpi, tpi_how = _match_tpu_inference(m, infos.get("tpu_inference"), notes)
    _check_pairs(m, infos, row, tpi)
    report = None
    if row is not None and probe:
        report = probe_static(row)
        if not report.ok:
            text = "; ".join(f"{f.check}: matrix says {f.expected}, installed has {f.found}" for f in report.mismatches)
            if strict:
                raise ProbeMismatchError(
                    f"the installed MaxText disagrees with matrix row {row.name}: {text}",
                    fix="fix the row in compat_matrix.yaml (or point MAXTEXT_COMPAT_MATRIX at a corrected copy)",
                )
            disagrees = f"matrix row {row.name} disagrees with the installed MaxText: {text}"
            warn_at_call_site(disagrees, ProbeMismatchWarning)
            notes.append(f"probe mismatch: {text}")
    return Resolution(infos, row, how, tpi, tpi_how, tuple(notes), report, m, code)


def _by_code(
    m: CompatMatrix, info: DistInfo, row: MaxTextRow | None, how: MaxTextMatch, notes: list[str]
) -> tuple[MaxTextRow | None, MaxTextMatch, CodeMatch | None]:
    """A checkout, a fork or a commit of MaxText: the row whose code facts its code has (the version's first)."""
    from maxtext_compat.errors import CompatError

    source = source_of(info.url, info.commit, info.editable)
    by_version = row if how in ("exact", "commit", "dev") else None
    try:
        code = match_code(m.maxtext, by_version, source)
    except CompatError as exc:  # the folder an editable install names is gone: said, resolved by version
        notes.append(f"MaxText from {source}: its code could not be read ({exc}); resolved by version")
        return row, how, None
    if code.row is not None:
        notes.append(f"MaxText from {source} ({info.version}): resolved as row {code.row} by probes")
        chosen = m.row(code.row)
        return chosen, how if chosen is by_version else "probes", code
    text = "; ".join(f"{k}: installed {a}, row {b}" for k, (a, b) in code.differences.items())
    notes.append(f"MaxText from {source} ({info.version}): probes match no row; against row "
                 f"{'-' if row is None else row.name}: {text}")  # fmt: skip
    return row, how, code


def _match_maxtext(m: CompatMatrix, info: DistInfo | None, notes: list[str]) -> tuple[MaxTextRow | None, MaxTextMatch]:
    if info is None:
        return None, "absent"
    commit = (info.commit or "").lower()
    short = commit[:12]
    if commit and not _COMMIT.fullmatch(commit):
        notes.append(f"maxtext direct_url.json names commit {info.commit!r}, which is no git commit id: ignored")
    elif commit:
        for row in m.maxtext:
            if row.source_commit is None:  # rows without a known commit cannot match one
                continue
            c = row.source_commit.lower()
            if commit.startswith(c) or c.startswith(commit):
                notes.append(f"maxtext installed from commit {short}: matched row {row.name} by commit")
                return row, "commit"
        notes.append(f"maxtext installed from commit {short}, which no row lists: matching its version")
    v = info.parsed
    if v is None:
        raise ResolutionError(
            "the installed maxtext version is not a PEP 440 version",
            argument="maxtext",
            expected="a version such as 0.2.5",
            found=repr(info.version),
            fix="reinstall maxtext from PyPI or set its version metadata",
        )
    for row in m.maxtext:
        if row.release == v:
            return row, "exact"
    dev_after = m.comparable("maxtext", v) != v  # a dev build named for the release it follows
    if dev_after or v.local or v.is_postrelease or (v.is_prerelease and not v.is_devrelease):
        base = Version(v.base_version)
        for row in m.maxtext:
            if row.release == base:
                notes.append(f"maxtext {info.version} is a development build of {base}: using row {row.name}")
                return row, "dev"
    rows = sorted(m.maxtext, key=lambda r: r.release)
    below = [r for r in rows if r.release <= v]
    nearest = below[-1] if below else rows[0]
    msg = (
        f"maxtext {info.version} is not in {m.source}; using the nearest row {nearest.name}. "
        "Run `maxtext-compat doctor` to compare that row with the installed code."
    )
    warn_at_call_site(msg, UnknownReleaseWarning)
    notes.append(msg)
    return nearest, "nearest"


_COMMIT = re.compile(r"[0-9a-f]{7,40}")  # abbreviated (>= 7, as git prints them) or full SHA-1


def _match_tpu_inference(
    m: CompatMatrix, info: DistInfo | None, notes: list[str]
) -> tuple[TpuInferenceRow | None, TpuInferenceMatch]:
    if info is None or not m.tpu_inference:
        return None, "absent"
    v = info.parsed
    if v is None or v == Version("0.0.0"):
        # Source installs of tpu-inference report 0.0.0 (VLLM_VERSION_OVERRIDE unset): use the newest row.
        row = max(m.tpu_inference, key=_row_floor)
        msg = (
            f"tpu-inference reports version {info.version!r} (a source install); "
            f"assuming the newest API row {row.versions}"
        )
        warn_at_call_site(msg, UnknownReleaseWarning)
        notes.append(msg)
        return row, "nearest"
    found = m.tpu_inference_row(v)
    if found is not None:
        if _release_of(found, v) is None:
            msg = (
                f"tpu-inference {info.version} is in the range {found.label} of {m.source} but is no release it "
                f"lists ({', '.join(found.releases)}): the jax and vllm-tpu it pins are not checked"
            )
            warn_at_call_site(msg, UnknownReleaseWarning)
            notes.append(msg)
        return found, "exact"
    rows = sorted(m.tpu_inference, key=_row_floor)
    at = m.comparable("tpu_inference", v) or v
    below = [r for r in rows if _row_floor(r) <= at]
    nearest = below[-1] if below else rows[0]
    msg = f"tpu-inference {info.version} is not covered by {m.source}; using the nearest row {nearest.versions}"
    warn_at_call_site(msg, UnknownReleaseWarning)
    notes.append(msg)
    return nearest, "nearest"


def _release_of(row: TpuInferenceRow, v: Version) -> TpiRelease | None:
    """The row's release for `v`; a local build (0.32.0+abc) has the pins of its public release."""
    return row.release(v) or (row.release(v.public) if v.local else None)


def _row_floor(row: TpuInferenceRow) -> Version:
    floors = [Version(s.version) for s in row.versions if s.operator in (">=", "==", "~=", ">")]
    return min(floors) if floors else Version("0")


def known_tpu_inference_releases(m: CompatMatrix) -> list[Version]:
    """Every tpu-inference release the matrix lists."""
    return sorted({Version(v) for r in m.tpu_inference for v in r.releases})


def _check_pairs(
    m: CompatMatrix, infos: Mapping[str, DistInfo], row: MaxTextRow | None, tpi: TpuInferenceRow | None
) -> None:
    tpi_info = infos.get("tpu_inference")
    wanted = None if row is None else row.requires.tpu_inference
    if row is not None and wanted is not None and tpi_info is not None and tpi_info.parsed is not None:
        found = m.comparable("tpu_inference", tpi_info.version)
        if tpi_info.parsed != Version("0.0.0") and found is not None and not wanted.contains(found, prereleases=True):
            raise IncompatibleVersionsError(
                f"maxtext {row.name} and tpu-inference {tpi_info.version} are incompatible "
                f"(maxtext {row.name} needs tpu-inference {row.requires.tpu_inference})",
                argument="versions",
                expected=f"tpu-inference {row.requires.tpu_inference}",
                found=f"maxtext {row.name} + tpu-inference {tpi_info.version}",
                fix="use one of the nearest compatible pairs: " + _nearest_pairs(m, row, tpi_info.parsed),
            )
    tpi_v = None if tpi_info is None else tpi_info.parsed
    rel = None if tpi is None or tpi_v is None else _release_of(tpi, tpi_v)
    jax = infos.get("jax")
    if rel is not None and jax is not None and jax.parsed is not None and jax.parsed != Version(rel.jax):
        same_jax = sorted(
            (r.version for row in m.tpu_inference for r in row.releases.values() if Version(r.jax) == jax.parsed),
            key=Version,
        )
        alt = f" or tpu-inference {same_jax[-1]}, which pins jax {jax.version}" if same_jax else ""
        raise IncompatibleVersionsError(
            f"tpu-inference {rel.version} and jax {jax.version} are incompatible (tpu-inference {rel.version} "
            f"pins jax=={rel.jax})",
            argument="versions",
            expected=f"jax {rel.jax}",
            found=f"tpu-inference {rel.version} + jax {jax.version}",
            fix=f"install jax=={rel.jax} jaxlib=={rel.jax}{alt}",
        )
    vllm = infos.get("vllm")
    if (
        rel is not None
        and vllm is not None
        and vllm.parsed is not None
        and vllm.name.lower() in ("vllm-tpu", "vllm_tpu")
    ):
        pairs = {Version(r.vllm_tpu): r.version for row in m.tpu_inference for r in row.releases.values() if r.vllm_tpu}
        if rel.vllm_tpu is None or Version(rel.vllm_tpu) != vllm.parsed:
            want = rel.vllm_tpu or "none (no vllm-tpu release pins it)"
            other = pairs.get(vllm.parsed)
            raise IncompatibleVersionsError(
                f"tpu-inference {rel.version} and vllm-tpu {vllm.version} are incompatible "
                f"(vllm-tpu pins its tpu-inference exactly)",
                argument="versions",
                expected=f"vllm-tpu {want}",
                found=f"tpu-inference {rel.version} + vllm-tpu {vllm.version}",
                fix=f"install vllm-tpu=={rel.vllm_tpu}"
                if rel.vllm_tpu
                else ("install tpu-inference==" + other if other else "pick a pair listed in compat_matrix.yaml"),
            )


def _nearest_pairs(m: CompatMatrix, row: MaxTextRow, tpi_version: Version) -> str:
    needed = row.requires.tpu_inference
    assert needed is not None
    options: list[str] = []
    fitting = [v for v in known_tpu_inference_releases(m) if needed.contains(str(v), prereleases=True)]
    if fitting:
        best = min(fitting, key=lambda v: _distance(v, tpi_version))
        options.append(f"maxtext {row.name} + tpu-inference {best}")
    tpi_cmp = m.comparable("tpu_inference", tpi_version) or tpi_version
    rows = [r for r in m.maxtext if r.requires.tpu_inference is not None and r.requires.tpu_inference.contains(tpi_cmp)]
    rows = [r for r in rows if r.has_kv_params]  # a native vLLM path, like the row asked for
    if rows:
        best_row = min(rows, key=lambda r: _distance(r.release, row.release))
        options.append(f"maxtext {best_row.name} + tpu-inference {tpi_version}")
    return " or ".join(options) if options else "none in the matrix; see compat_matrix.yaml"


def _distance(a: Version, b: Version) -> tuple[int, ...]:
    ra = a.release + (0,) * (3 - len(a.release))
    rb = b.release + (0,) * (3 - len(b.release))
    return tuple(abs(x - y) for x, y in zip(ra[:3], rb[:3], strict=True))
