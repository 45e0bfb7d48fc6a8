"""The matrix's typed rows and the closed sets of values its fields take."""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_compat.errors import MatrixError
from maxtext_compat.versions import as_version, version_in

SCHEMA_VERSION = 1
MATRIX_ENV_VAR = "MAXTEXT_COMPAT_MATRIX"

# Each closed set of values is declared once, as a Literal; the tuple the parser checks against is read from it.
Convention = Literal["legacy", "kv_return", "kv_scan_carry"]
CONVENTIONS: tuple[Convention, ...] = get_args(Convention)
# What the code *calling* MaxText expects: `auto` decides per call by what the caller wrote,
# `legacy` always wants the old return, `kv_return` always the new one (see maxtext_compat.convention.declared).
CallerConvention = Literal["auto", "legacy", "kv_return"]
CALLER_CONVENTIONS: tuple[CallerConvention, ...] = get_args(CallerConvention)
Policy = Literal["ignore", "warn", "error"]
POLICIES: tuple[Policy, ...] = get_args(Policy)
DecoderKind = Literal["linen", "nnx"]
DECODER_KINDS: tuple[DecoderKind, ...] = get_args(DecoderKind)
CallForm = Literal["curried", "flat"]
CALL_FORMS: tuple[CallForm, ...] = get_args(CallForm)
# How a package's `.devN` builds relate to the release they are named for. PEP 440 orders 0.29.0.dev1
# before 0.29.0 (`before_release`); a nightly uploaded after its named release (tpu-inference's
# 0.31.0.dev20261006 came 8 h after 0.31.0) has that release's API (`after_release`).
DEV_BUILD_RELATIONS: tuple[str, ...] = ("after_release", "before_release")
DEV_BUILD_PACKAGES: tuple[str, ...] = ("maxtext", "tpu_inference")

# The return shapes each layer kind has had; the matrix may only use these spellings.
RETURN_SHAPES: dict[str, tuple[str, ...]] = {
    "attention": ("out", "(out, kv_cache)"),
    "decoder_layer": ("y", "(y, kv_cache)"),
    "decoder_layer_scanned": ("(y, None)", "((y, stacked_kv, idx), None)"),
    "decoder": ("(logits, hidden)", "(logits, hidden, kv_caches)"),
    "transformer": ("logits",),
    "transformer_vllm": ("(hidden, kv_caches)",),
}
# Optional parameters whose presence moved between releases.
OPTIONAL_PARAMS: tuple[str, ...] = (
    "page_state",
    "out_sharding",
    "rope_kwargs",
    "shared_key",
    "shared_value",
    "kv_cache",
    "attention_metadata",
)
CLASS_KEYS: tuple[str, ...] = (
    "attention",
    "attention_op",
    "mla",  # MaxText's multi-head latent attention: an Attention subclass with its own __call__
    "decoder",
    "nnx_decoder",
    "transformer",
    "transformer_linen",
)
OPTIONAL_CLASS_KEYS: frozenset[str] = frozenset({"mla"})  # a user's matrix may leave these out
FAMILIES: tuple[str, ...] = ("default", "llama2", "qwen3", "gemma3")
# An environment's name is a directory under the envs folder, built and deleted by `envs build`:
# one path component, ASCII, starting with a letter or digit (so never `.`, `..`, hidden or empty).
ENV_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ENV_NAME_RULE = "1-64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"


@dataclass(frozen=True)
class ClassRef:
    """A `module:Qualname` reference to a class inside an installed package."""

    module: str
    qualname: str

    @classmethod
    def parse(cls, text: str) -> ClassRef:
        module, sep, qualname = text.partition(":")
        if not sep or not module or not qualname or " " in text:
            raise ValueError(f"{text!r} is not of the form 'package.module:ClassName'")
        return cls(module, qualname)

    def load(self) -> Any:
        """Import the module and return the class (imports MaxText: heavy, has side effects)."""
        obj: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def __str__(self) -> str:
        return f"{self.module}:{self.qualname}"


@dataclass(frozen=True)
class Deprecation:
    """What an old-convention call gets on this row, and until when."""

    policy: Policy
    since: str | None
    ends_in: str | None
    migration: str


DEFECT_REMEDIES: tuple[str, ...] = ("fix", "refuse")  # a shim repairs it, or a typed error stops the run


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


@dataclass(frozen=True)
class KnownDefect:
    """An upstream defect with the reasoning a reviewer needs: fixed by a shim or refused with a typed error."""

    id: str
    summary: str
    affects: tuple[str, ...]
    why: str
    how: str
    undo: str | None  # how the fix is taken back (None for a refusal: nothing is changed)
    remedy: str = "fix"  # one of DEFECT_REMEDIES
    when: DefectCondition = field(default_factory=DefectCondition)
    upstream_fix: str | None = None  # the MaxText release or PR that fixed it


@dataclass(frozen=True)
class VllmPath:
    """How this MaxText release reaches tpu-inference natively (None for 0.1.0)."""

    attention_modes: tuple[str, ...]
    rpa_module: str
    rpa_call_form: str
    serve_return_order: str
    update_kv_cache_kwarg: bool
    adapter: ClassRef
    adapter_return_arity: int
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
class MaxTextRow:
    """One MaxText release on PyPI and the conventions it uses."""

    release: Version
    date: str
    source_commit: str | None
    import_root: str
    convention: Convention
    classes: Mapping[str, ClassRef | None]
    decoder_layers: Mapping[str, ClassRef]
    default_decoder: DecoderKind
    returns: Mapping[str, str | None]
    attention_params: frozenset[str]
    decoder_layer_params: frozenset[str]
    decoder_params: frozenset[str]
    scan_kv_carry: bool
    scan_kv_carry_layers: tuple[str, ...]
    vllm: VllmPath | None
    config: ConfigSpec
    tpu_inference: SpecifierSet | None
    jax_verified: tuple[str, ...]
    deprecation: Deprecation
    known_defects: tuple[KnownDefect, ...]
    notes: str = ""
    callers: CallerConvention = "auto"  # the caller convention code on this row gets unless it declares one

    @property
    def name(self) -> str:
        return str(self.release)

    @property
    def has_kv_params(self) -> bool:
        return "kv_cache" in self.attention_params


@dataclass(frozen=True)
class RpaSpec:
    """The shape of tpu-inference's `sharded_ragged_paged_attention` entry point."""

    module: str
    function: str
    call_form: CallForm
    factory_params: tuple[str, ...]
    params: tuple[str, ...]
    optional_kwargs: tuple[str, ...]
    returns: str


@dataclass(frozen=True)
class MetadataSpec:
    module: str
    cls: str
    fields: tuple[str, ...]
    meta_fields: tuple[str, ...]


@dataclass(frozen=True)
class TpiRelease:
    """One tpu-inference release on PyPI: the jax it pins and the vllm-tpu that pins it."""

    version: str
    jax: str
    vllm_tpu: str | None
    date: str


@dataclass(frozen=True)
class TpuInferenceRow:
    """A range of tpu-inference versions that share one API shape."""

    versions: SpecifierSet
    releases: Mapping[str, TpiRelease]
    rpa: RpaSpec
    metadata: MetadataSpec
    model_return_arity: int
    block_sizes: tuple[str, ...]
    notes: str = ""
    not_real: str = ""  # why no test environment installs a release of this range (one line), if none does

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
    verified_jax: tuple[str, ...]
    verified_tpu_inference: tuple[str, ...]

    def jax_verified(self, version: str | Version) -> bool:
        """Whether the CPU shim was verified on this jax (compared as versions: 0.11.2 == 0.11.2.0)."""
        return version_in(version, self.verified_jax)


@dataclass(frozen=True)
class EnvironmentSpec:
    """A real environment the project builds and runs the suite in."""

    name: str
    description: str
    python: str
    maxtext: str | None
    requirements: tuple[str, ...]
    no_deps: tuple[str, ...]
    overrides: tuple[str, ...]
    exclude_newer: str | None
    env: Mapping[str, str]
    serving: bool
    tests: tuple[str, ...] = ()  # test files this environment runs (empty: the whole suite)

    def as_dict(self) -> dict[str, Any]:
        # `tests` only when set: the spec hash of every environment that runs the whole suite stays as it was.
        return ({"tests": list(self.tests)} if self.tests else {}) | {
            "name": self.name,
            "description": self.description,
            "python": self.python,
            "maxtext": self.maxtext,
            "requirements": list(self.requirements),
            "no_deps": list(self.no_deps),
            "overrides": list(self.overrides),
            "exclude_newer": self.exclude_newer,
            "env": dict(self.env),
            "serving": self.serving,
        }


@dataclass(frozen=True)
class CompatMatrix:
    schema_version: int
    source: str
    maxtext: tuple[MaxTextRow, ...]
    tpu_inference: tuple[TpuInferenceRow, ...]
    cpu_shim: CpuShimSpec
    environments: Mapping[str, EnvironmentSpec] = field(default_factory=dict)
    dev_builds: Mapping[str, str] = field(default_factory=dict)

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
