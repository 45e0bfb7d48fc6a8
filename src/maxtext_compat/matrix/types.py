"""The matrix's typed rows: each field's annotation is also how its YAML key is read (see schema.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_compat.errors import InvalidArgumentError, MatrixError
from maxtext_compat.matrix import ranges
from maxtext_compat.matrix.environments import EnvironmentSpec
from maxtext_compat.matrix.returns import RETURN_SHAPES, ReturnShape, convention_problem, shape_of
from maxtext_compat.matrix.schema import Yaml, normalized_version, parsed, read_struct
from maxtext_compat.matrix.values import (
    DEV_BUILD_PACKAGES,
    FAMILIES,
    SCHEMA_VERSION,
    CallerConvention,
    CallForm,
    ClassRef,
    ClassRefText,
    Convention,
    DecoderKind,
    DefectRemedy,
    DevBuildRelation,
    FreeText,
    ImportRoot,
    IsoDate,
    ParamNames,
    Policy,
    VersionText,
    arity,
    read_block_sizes,
    read_class_refs,
    read_return_shapes,
)
from maxtext_compat.matrix.yaml_node import Node
from maxtext_compat.versions import as_version, version_in


@dataclass(frozen=True)
class Deprecation:
    """What an old-convention call gets on this row, and until when."""

    policy: Policy
    since: VersionText | None
    ends_in: VersionText | None
    migration: str

    def after_read(self, node: Node) -> None:
        if self.policy != "ignore" and self.ends_in is None:
            raise node.error(
                f"policy {self.policy!r} needs `ends_in` (the release in which old calls stop working)",
                fix="add ends_in, or use policy: ignore",
            )


@dataclass(frozen=True)
class DefectCondition:
    """When a defect applies besides the MaxText release: the installed tpu-inference and config values.

    config maps a MaxText config key to the values (fnmatch patterns) it applies to; every key must match.
    """

    tpu_inference: SpecifierSet | None = None
    config: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def describe(self, *, versions: bool = True) -> str:
        parts = [f"tpu-inference {self.tpu_inference}"] if versions and self.tpu_inference is not None else []
        parts += [f"{key} in {list(values)}" for key, values in self.config.items()]
        return ", ".join(parts) or "always"

    def after_read(self, node: Node) -> None:
        for key, values in self.config.items():
            if not values:
                raise (
                    node.child("config")
                    .child(key)
                    .error(
                        "an empty list matches no config",
                        expected="one value or pattern at least",
                        fix=f"list the values of {key} the defect applies to, or remove the key",
                    )
                )


@dataclass(frozen=True)
class KnownDefect:
    """An upstream defect with the reasoning a reviewer needs: fixed by a shim or refused with a typed error."""

    id: str
    summary: str
    affects: tuple[str, ...]
    why: str
    how: str
    undo: str | None  # how the fix is taken back (None for a refusal: nothing is changed)
    remedy: DefectRemedy = "fix"
    when: DefectCondition = field(default_factory=DefectCondition)
    upstream_fix: str | None = None  # the MaxText release or PR that fixed it
    upstream: str | None = None  # where it happens upstream: file:line of the installed release

    def after_read(self, node: Node) -> None:
        if self.remedy == "fix" and self.undo is None:
            raise node.error(
                "a defect fixed by a shim must say how the fix is undone",
                expected="an 'undo' entry (remedy: fix)",
                fix="add undo: <how shims.uninstall() restores the original>, or set remedy: refuse",
            )
        if self.remedy == "refuse" and self.undo is not None:
            raise node.child("undo").error(
                "a refused defect changes nothing, so there is nothing to undo",
                expected="no 'undo' entry with remedy: refuse",
                fix="remove 'undo', or set remedy: fix if a shim repairs it",
            )


@dataclass(frozen=True)
class VllmPath:
    """How this MaxText release reaches tpu-inference natively (None for 0.1.0)."""

    attention_modes: tuple[str, ...]
    rpa_module: str
    rpa_call_form: CallForm
    serve_return_order: Literal["(kv, out)", "(out, kv)"]
    update_kv_cache_kwarg: bool
    adapter: ClassRefText
    adapter_return_arity: Annotated[int, arity("vLLM adapter")]
    # The decoder takes tpu-inference's per-layer attention_metadata dict (several KV-cache groups) itself.
    per_layer_metadata: bool = False


@dataclass(frozen=True)
class ConfigSpec:
    """Where a release keeps pyconfig and its YAML configs (tiny test models need them)."""

    pyconfig: str
    base_yml: str
    base_yml_in_argv: bool
    vllm_yml: str | None


@dataclass(frozen=True)
class OptionalParams:
    """Which of OPTIONAL_PARAMS each layer's __call__ takes in this release."""

    attention: ParamNames
    decoder_layer: ParamNames
    decoder: ParamNames


@dataclass(frozen=True)
class Requirements:
    tpu_inference: SpecifierSet | None  # the tpu-inference releases this MaxText release's vLLM path needs


@dataclass(frozen=True)
class MaxTextRow:
    """One MaxText release on PyPI and the conventions it uses."""

    release: Version
    import_root: ImportRoot
    classes: Annotated[Mapping[str, ClassRef | None], Yaml(read=read_class_refs)]
    decoder_layers: Annotated[Mapping[str, ClassRefText], Yaml(keys=FAMILIES)]
    returns: Annotated[Mapping[str, str | None], Yaml(read=read_return_shapes)]
    params: OptionalParams
    convention: Convention
    vllm: VllmPath | None
    requires: Requirements
    date: IsoDate
    source_commit: str | None
    default_decoder: DecoderKind
    scan_kv_carry: bool
    config: ConfigSpec
    jax_verified: tuple[str, ...]
    deprecation: Deprecation
    scan_kv_carry_layers: tuple[str, ...] = ()
    known_defects: tuple[KnownDefect, ...] = ()
    notes: FreeText = ""
    callers: CallerConvention = "auto"  # the caller convention code on this row gets unless it declares one

    @property
    def name(self) -> str:
        return str(self.release)

    @property
    def has_kv_params(self) -> bool:
        return "kv_cache" in self.params.attention

    def return_shape(self, kind: str) -> ReturnShape:
        """What a `kind` call returns on this release (`returns:`), parsed into named values."""
        spelling = self.returns.get(kind)
        if spelling is None:
            raise InvalidArgumentError(
                f"compat_matrix.yaml gives MaxText {self.name} no {kind} return",
                argument="kind",
                expected=f"one of {sorted(k for k, v in self.returns.items() if v is not None)}",
                found=repr(kind),
                fix=f"add `returns.{kind}` to row {self.name}, or call a layer kind the release has",
            )
        return shape_of(spelling)

    def after_read(self, node: Node) -> None:
        for ref in [*self.classes.values(), *self.decoder_layers.values()]:
            if ref is not None and ref.module.split(".")[0] != self.import_root:
                raise node.child("classes").error(
                    f"{ref} is outside the import root {self.import_root!r}", fix="fix import_root or the class path"
                )
        if (self.convention == "legacy") == self.has_kv_params:
            raise node.child("convention").error(
                "disagrees with params.attention (kv_cache present means a post-#2616 convention)",
                expected="kv_return or kv_scan_carry (params.attention lists kv_cache)"
                if self.has_kv_params
                else "legacy (params.attention has no kv_cache)",
                fix="set convention: legacy when Attention.__call__ has no kv_cache parameter, kv_return or "
                "kv_scan_carry when it has; or correct params.attention to the release's signature",
            )
        for kind, spelling in self.returns.items():
            problem = None if spelling is None else convention_problem(kind, spelling, takes_kv=self.has_kv_params)
            if problem is not None:
                raise (
                    node.child("returns")
                    .child(kind)
                    .error(
                        f"cannot be MaxText {self.name}'s {kind} return: {problem}",
                        fix=f"spell what the release's {kind} returns, by the names of {RETURN_SHAPES[kind]} "
                        "(`maxtext-compat facts` reads them from its code)",
                    )
                )


@dataclass(frozen=True)
class RpaSpec:
    """The shape of tpu-inference's `sharded_ragged_paged_attention` entry point."""

    module: str
    function: str
    call_form: CallForm
    params: tuple[str, ...]
    returns: Literal["(output, kv_cache)"]
    factory_params: tuple[str, ...] = ()
    optional_kwargs: tuple[str, ...] = ()

    def after_read(self, node: Node) -> None:
        if (self.call_form == "curried") != bool(self.factory_params):
            raise node.child("call_form").error(
                "curried form needs factory_params; flat form must not have them",
                expected="factory_params with call_form: curried, none with call_form: flat",
                fix="list the factory's parameters under rpa.factory_params for call_form: curried, "
                "or remove rpa.factory_params for call_form: flat",
            )


@dataclass(frozen=True)
class MetadataSpec:
    module: str
    cls: Annotated[str, Yaml(key="class")]
    fields: tuple[str, ...]
    meta_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class TpiRelease:
    """One tpu-inference release on PyPI: the jax it pins and the vllm-tpu that pins it."""

    version: Annotated[str, Yaml(given=True)]  # its key in `releases:`
    jax: Annotated[str, parsed(normalized_version, "a jax version")]
    date: IsoDate
    vllm_tpu: Annotated[str, parsed(normalized_version, "a vllm-tpu version")] | None = None


def read_releases(n: Node) -> dict[str, TpiRelease]:
    """`releases:` keyed by version number, each listed once (0.32 and 0.32.0 are one release)."""
    out: dict[str, TpiRelease] = {}
    seen: dict[Version, str] = {}
    for ver, rn in n.items():
        try:
            version = Version(ver)
        except Exception:
            raise rn.error(
                "is not a PEP 440 release number",
                expected='a key such as "0.32.0"',
                fix='key each release by its quoted version number, e.g. `"0.32.0": {jax: "0.11.2"}`',
            ) from None
        if version in seen:
            raise rn.error(
                f"release {ver} is listed twice (as {seen[version]!r} and {ver!r}, equal as versions)",
                fix="keep one entry per release",
            )
        seen[version] = ver
        out[ver] = read_struct(TpiRelease, rn, version=ver)
    if not out:
        raise n.error(
            "must list at least one release",
            expected="a mapping of releases",
            fix=f'add the releases of this range under `{n.key}`, e.g. `"0.32.0": {{jax: "0.11.2"}}`',
        )
    return out


def read_version_range(n: Node) -> SpecifierSet:
    versions = n.parsed(SpecifierSet, "a version specifier")
    ranges.interval(versions, n)  # plain bounds, not empty
    return versions


@dataclass(frozen=True)
class TpuInferenceRow:
    """A range of tpu-inference versions that share one API shape."""

    versions: Annotated[SpecifierSet, Yaml(read=read_version_range)]
    rpa: RpaSpec
    metadata: MetadataSpec
    model_return_arity: Annotated[int, arity("model function")]
    block_sizes: Annotated[tuple[str, ...], Yaml(read=read_block_sizes)]
    releases: Annotated[Mapping[str, TpiRelease], Yaml(read=read_releases)]
    notes: FreeText = ""
    not_real: str = ""  # why no test environment installs a release of this range (one line), if none does
    # The serving stack's own defects (whatever the model): worked around by the serving-requests shim or
    # refused at request time (serving_fixes/request_defects.py); `when.tpu_inference` narrows the range.
    known_defects: tuple[KnownDefect, ...] = ()

    def after_read(self, node: Node) -> None:
        for version in self.releases:
            if not self.versions.contains(version, prereleases=True):
                raise (
                    node.child("releases")
                    .child(version)
                    .error(
                        f"release {version} lies outside this entry's range {self.versions}", fix="move it to its range"
                    )
                )

    def contains(self, version: str | Version) -> bool:
        return self.versions.contains(str(version), prereleases=True)

    def release(self, version: str | Version) -> TpiRelease | None:
        """The listed release equal to `version` as a version (0.32 is 0.32.0), else None."""
        v = as_version(version)
        if v is None:
            return None
        for key, rel in self.releases.items():
            if Version(key) == v:
                return rel
        return None

    @property
    def label(self) -> str:
        """The range as people write it, lower bound first (`>=0.11.1,<0.12.0`)."""
        return ",".join(sorted((str(s) for s in self.versions), key=lambda s: (not s.startswith(">"), s)))


@dataclass(frozen=True)
class CpuShimSpec:
    verified_jax: tuple[VersionText, ...]
    verified_tpu_inference: tuple[VersionText, ...]

    def jax_verified(self, version: str | Version) -> bool:
        """Whether the CPU shim was verified on this jax (compared as versions: 0.11.2 == 0.11.2.0)."""
        return version_in(version, self.verified_jax)


def read_schema_version(n: Node) -> int:
    version = n.integer()
    if version != SCHEMA_VERSION:
        raise n.error(
            "unsupported schema version",
            expected=SCHEMA_VERSION,
            fix="use a matrix written for this maxtext-compat release, or upgrade maxtext-compat",
        )
    return version


def read_maxtext_rows(n: Node) -> tuple[MaxTextRow, ...]:
    """At least one row, one per release (0.2.5 and 0.2.5.0 are one release)."""
    rows = tuple(read_struct(MaxTextRow, e) for e in n.elements())
    if not rows:
        raise n.error(
            "must list at least one MaxText release",
            expected="a non-empty list",
            fix="add a row per MaxText release under `maxtext:` (copy a row of the shipped compat_matrix.yaml)",
        )
    seen: dict[Version, Version] = {}
    for r in rows:
        if r.release in seen:
            first = seen[r.release]
            same = f"{first} and {r.release}" if str(first) != str(r.release) else f"{r.release}"
            raise n.error(f"lists release {same} twice (equal as versions)", fix="keep one entry per release")
        seen[r.release] = r.release
    return rows


def read_tpu_inference_rows(n: Node) -> tuple[TpuInferenceRow, ...]:
    rows = tuple(read_struct(TpuInferenceRow, e) for e in n.elements())
    ranges.check_disjoint([r.versions for r in rows], n)
    return rows


@dataclass(frozen=True)
class CompatMatrix:
    """The whole file: MaxText rows, tpu-inference ranges, the CPU shim's verified versions, pin sets."""

    schema_version: Annotated[int, Yaml(read=read_schema_version)]
    source: Annotated[str, Yaml(given=True)]  # the file's path
    maxtext: Annotated[tuple[MaxTextRow, ...], Yaml(read=read_maxtext_rows)]
    tpu_inference: Annotated[tuple[TpuInferenceRow, ...], Yaml(read=read_tpu_inference_rows)]
    cpu_shim: CpuShimSpec
    # Read by parse_matrix once the rows are known (a pin set names a row's release): the tested install of each
    # release, shipped. The environments are this repository's CI layout (tests/environments.yaml, read by
    # load.with_environments; empty in the shipped matrix) or, in a user's project, the pin sets themselves.
    pin_sets: Annotated[Mapping[str, EnvironmentSpec], Yaml(later=True)] = field(default_factory=dict)
    environments: Annotated[Mapping[str, EnvironmentSpec], Yaml(later=True)] = field(default_factory=dict)
    dev_builds: Annotated[Mapping[str, DevBuildRelation], Yaml(keys=DEV_BUILD_PACKAGES)] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """What identifies the facts a run used: the matrix file's bytes (shards of one run must share it)."""
        return hashlib.sha256(Path(self.source).read_bytes()).hexdigest()[:16]

    def comparable(self, package: str, version: str | Version) -> Version | None:
        """The version to match rows with: a dev build of an `after_release` package is its named release."""
        v = as_version(version)
        if v is not None and v.is_devrelease and self.dev_builds.get(package) == "after_release":
            return Version(v.base_version)
        return v

    def row(self, release: str | Version) -> MaxTextRow:
        v = Version(str(release))
        for r in self.maxtext:
            if r.release == v:
                return r
        from maxtext_compat.errors import ResolutionError

        raise ResolutionError(
            f"MaxText {release} has no row in {self.source}",
            argument="release",
            expected=f"one of {[r.name for r in self.maxtext]}",
            found=str(release),
            fix="use a listed release, or maxtext_compat.resolve() for the nearest row of an unknown release",
        )

    def tpu_inference_row(self, version: str | Version) -> TpuInferenceRow | None:
        v = self.comparable("tpu_inference", version)
        if v is None:
            return None
        for r in self.tpu_inference:
            if r.contains(v):
                return r
        return None

    def environment(self, name: str) -> EnvironmentSpec:
        try:
            return self.environments[name]
        except KeyError:
            raise MatrixError(
                f"no environment named {name!r}",
                path=self.source,
                key="environments",
                expected=f"one of {sorted(self.environments)}",
                fix="pick a name from `maxtext-compat envs`",
            ) from None

    def pin_set(self, name: str) -> EnvironmentSpec:
        """The pin set `name`, or that of a MaxText release (`0.2.5` is `maxtext-0.2.5`)."""
        key = name if name in self.pin_sets else f"maxtext-{name}"
        try:
            return self.pin_sets[key]
        except KeyError:
            releases = sorted({p.maxtext for p in self.pin_sets.values() if p.maxtext})
            raise MatrixError(
                f"no pin set named {name!r}",
                path=self.source,
                key="pin_sets",
                expected=f"a MaxText release with a tested set ({', '.join(releases)}) or a set's name "
                f"({', '.join(self.pin_sets)})",
                fix="pick one from `maxtext-compat pins --list`",
            ) from None
