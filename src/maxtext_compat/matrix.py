"""compat_matrix.yaml: the single source of truth, loaded and validated into typed rows.

Why data and not code: which convention a MaxText release uses, which RPA call form a
tpu-inference version wants, and which environments the project tests for real change
with every upstream release. Keeping them in one validated file lets the runtime, the
CLI and the test matrix read the same facts.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from maxtext_compat._yaml_reader import Node, safe_load_text
from maxtext_compat.errors import MatrixError
from maxtext_compat.versions import as_version, version_in

SCHEMA_VERSION = 1
MATRIX_ENV_VAR = "MAXTEXT_COMPAT_MATRIX"

Convention = Literal["legacy", "kv_return", "kv_scan_carry"]
CONVENTIONS: tuple[str, ...] = ("legacy", "kv_return", "kv_scan_carry")
# What the code *calling* MaxText expects: `auto` decides per call by what the caller wrote,
# `legacy` always wants the old return, `kv_return` always the new one (see maxtext_compat.convention).
CALLER_CONVENTIONS: tuple[str, ...] = ("auto", "legacy", "kv_return")
POLICIES: tuple[str, ...] = ("ignore", "warn", "error")
DECODER_KINDS: tuple[str, ...] = ("linen", "nnx")
CALL_FORMS: tuple[str, ...] = ("curried", "flat")
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

    policy: str  # ignore | warn | error
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
    convention: str
    classes: Mapping[str, ClassRef | None]
    decoder_layers: Mapping[str, ClassRef]
    default_decoder: str
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
    callers: str = "auto"  # the caller convention code on this row gets unless it declares one

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
    call_form: str  # curried | flat
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


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def default_matrix_path() -> Path:
    """Where the matrix lives: $MAXTEXT_COMPAT_MATRIX, the wheel's copy, or the repo root."""
    override = os.environ.get(MATRIX_ENV_VAR)
    if override:
        return Path(override)
    packaged = resources.files("maxtext_compat").joinpath("compat_matrix.yaml")
    if packaged.is_file():
        return Path(str(packaged))
    repo_copy = Path(__file__).resolve().parents[2] / "compat_matrix.yaml"
    return repo_copy


MAX_MATRIX_BYTES = 1 << 20  # 1 MiB; the shipped matrix is ~30 kB (a bigger file is no matrix, and slow to parse)


def load_matrix(path: str | os.PathLike[str] | None = None) -> CompatMatrix:
    """Load and validate a matrix file (cached per path, modification time and size).

    Only a regular file of at most MAX_MATRIX_BYTES is read: a FIFO, a device (/dev/zero) or a
    directory would otherwise hang every command or exhaust memory."""
    p = Path(path) if path is not None else default_matrix_path()
    try:
        st = p.stat()
    except (OSError, ValueError):  # ValueError: a NUL byte in the path
        raise MatrixError(
            "compat matrix file not found",
            path=str(p),
            fix=f"set {MATRIX_ENV_VAR} to an existing file, or reinstall maxtext-compat",
        ) from None
    _check_regular(str(p), st)
    return _load_cached(str(p), st.st_mtime_ns, st.st_size)


def _check_regular(path: str, st: os.stat_result) -> None:
    import stat as stat_mod

    if not stat_mod.S_ISREG(st.st_mode):
        kind = (
            "a directory" if stat_mod.S_ISDIR(st.st_mode)
            else "a FIFO" if stat_mod.S_ISFIFO(st.st_mode)
            else "a device" if stat_mod.S_ISCHR(st.st_mode) or stat_mod.S_ISBLK(st.st_mode)
            else "a socket" if stat_mod.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )  # fmt: skip
        raise MatrixError(
            "the compat matrix must be a regular file",
            path=path,
            expected="a YAML file",
            found=kind,
            fix=f"point {MATRIX_ENV_VAR} at a compat_matrix.yaml file",
        )
    _check_size(path, st.st_size)


def _check_size(path: str, size: int) -> None:
    if size > MAX_MATRIX_BYTES:
        raise MatrixError(
            "the compat matrix file is too large",
            path=path,
            expected=f"at most {MAX_MATRIX_BYTES} bytes",
            found=f"{size} bytes or more",
            fix=f"point {MATRIX_ENV_VAR} at a compat_matrix.yaml file",
        )


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, _mtime: int, _size: int) -> CompatMatrix:
    try:
        # O_NONBLOCK: if the path became a FIFO since stat(), open() must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            _check_regular(path, os.fstat(f.fileno()))
            data = f.read(MAX_MATRIX_BYTES + 1)
        _check_size(path, len(data))  # it may have grown since stat()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"cannot read the file: {exc}", path=path, fix="check the file") from None
    return parse_matrix(text, path)


def parse_matrix(text: str, path: str = "<string>") -> CompatMatrix:
    """Parse matrix YAML text; raises MatrixError naming the key on any problem."""
    doc = Node(safe_load_text(text, path), "", path)
    doc.mapping()
    doc.only_keys({"schema_version", "dev_builds", "maxtext", "tpu_inference", "cpu_shim", "environments"})
    version = doc.child("schema_version").integer()
    if version != SCHEMA_VERSION:
        raise doc.child("schema_version").error(
            "unsupported schema version",
            expected=SCHEMA_VERSION,
            fix="use a matrix written for this maxtext-compat release, or upgrade maxtext-compat",
        )
    rows = tuple(_parse_row(n) for n in doc.child("maxtext").elements())
    if not rows:
        raise doc.child("maxtext").error(
            "must list at least one MaxText release",
            expected="a non-empty list",
            fix="add a row per MaxText release under `maxtext:` (copy a row of the shipped compat_matrix.yaml)",
        )
    _check_unique([r.release for r in rows], doc.child("maxtext"), "release")
    tpi = tuple(_parse_tpi(n) for n in doc.child("tpu_inference").elements())
    _check_disjoint(tpi, doc.child("tpu_inference"))
    shim = _parse_cpu_shim(doc.child("cpu_shim"))
    envs_node = doc.child("environments")
    envs: dict[str, EnvironmentSpec] = {}
    releases = {r.release: r.name for r in rows}
    folded: dict[str, str] = {}
    for name, n in envs_node.items():
        spec = _parse_env(name, n, envs)
        mt_version = None if spec.maxtext is None else Version(spec.maxtext)
        if mt_version in releases and spec.maxtext != releases[mt_version]:  # 0.2.5.0 is row 0.2.5
            spec = dataclasses.replace(spec, maxtext=releases[mt_version])
        if name.lower() in folded:  # one directory on a case-insensitive file system (macOS)
            raise n.error(
                f"differs from environment {folded[name.lower()]!r} only in letter case",
                fix="give every environment a name that differs in more than letter case",
            )
        folded[name.lower()] = name
        if mt_version is not None and mt_version not in releases:
            names = [releases[v] for v in sorted(releases)]
            raise n.child("maxtext").error(
                "names a MaxText release without a row",
                expected=f"one of {names} or null",
                fix=f"set `{n.key}.maxtext` to one of {names} (null for no MaxText), "
                f"or add a `maxtext:` row for release {spec.maxtext}",
            )
        envs[name] = spec
    return CompatMatrix(version, path, rows, tpi, shim, envs, _parse_dev_builds(doc.optional("dev_builds")))


def _parse_dev_builds(n: Node | None) -> dict[str, str]:
    if n is None:
        return {}
    n.only_keys(set(DEV_BUILD_PACKAGES))
    return {key: child.choice(DEV_BUILD_RELATIONS) for key, child in n.items()}


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_date(n: Node) -> str:
    """A calendar date written YYYY-MM-DD (the day the release reached PyPI, UTC)."""
    text = n.nonempty_string()
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        text = ""
    if not _ISO_DATE.fullmatch(text):
        raise n.error(
            "is not a calendar date",
            expected='a quoted date such as "2026-10-02"',
            fix="write the day the release was uploaded to PyPI (UTC) as YYYY-MM-DD, quoted",
        )
    return text


def _check_unique(values: list[Any], node: Node, what: str) -> None:
    """Values must differ (versions compare as versions: 0.2.5 and 0.2.5.0 are one release)."""
    seen: dict[Any, Any] = {}
    for v in values:
        if v in seen:
            same = f"{seen[v]!s} and {v!s}" if str(seen[v]) != str(v) else f"{v!s}"
            raise node.error(f"lists {what} {same} twice (equal as versions)", fix=f"keep one entry per {what}")
        seen[v] = v


# The operators a tpu_inference range may use: each range is then one interval of versions, and
# the rows can be checked for overlap exactly, by sorting them and sweeping once (n log n).
_RANGE_OPS = (">=", ">", "<=", "<", "==")


@dataclass(frozen=True)
class _Interval:
    lo: Version | None  # None: unbounded
    lo_incl: bool
    hi: Version | None
    hi_incl: bool


def _interval(versions: SpecifierSet, node: Node) -> _Interval:
    lo: Version | None = None
    hi: Version | None = None
    lo_incl = hi_incl = False
    for spec in versions:
        if spec.operator not in _RANGE_OPS or spec.version.endswith(".*"):
            raise node.error(
                f"uses {spec}, which is not a plain bound",
                expected=f"bounds with {', '.join(_RANGE_OPS)} (no wildcards, ~=, != or ===), e.g. >=0.31.0,<0.33.0",
                fix="write the range as a lower and an upper bound",
            )
        v = Version(spec.version)
        if spec.operator in (">=", ">", "=="):
            incl = spec.operator != ">"
            if lo is None or v > lo or (v == lo and not incl):
                lo, lo_incl = v, incl
        if spec.operator in ("<=", "<", "=="):
            incl = spec.operator != "<"
            if hi is None or v < hi or (v == hi and not incl):
                hi, hi_incl = v, incl
    if lo is not None and hi is not None and (lo > hi or (lo == hi and not (lo_incl and hi_incl))):
        raise node.error(
            f"the range {versions} contains no version",
            expected="a lower bound below the upper bound",
            fix="correct the bounds",
        )
    return _Interval(lo, lo_incl, hi, hi_incl)


def _check_disjoint(rows: tuple[TpuInferenceRow, ...], node: Node) -> None:
    """No version may fall in two rows: sort the intervals by lower bound, sweep keeping the highest end."""
    spans = [(_interval(r.versions, node.child_at(i, "versions")), i) for i, r in enumerate(rows)]

    def start(item: tuple[_Interval, int]) -> tuple[int, Version, int]:
        iv = item[0]
        return (0, Version("0"), 0) if iv.lo is None else (1, iv.lo, 0 if iv.lo_incl else 1)

    spans.sort(key=start)
    reach: tuple[_Interval, int] | None = None  # the interval seen so far that ends highest
    for iv, i in spans:
        if reach is not None:
            end = reach[0]
            overlap = (
                end.hi is None or iv.lo is None or iv.lo < end.hi or (iv.lo == end.hi and iv.lo_incl and end.hi_incl)
            )
            if overlap:
                j = reach[1]
                raise node.error(
                    f"version ranges overlap: tpu_inference[{j}] {rows[j].versions} and "
                    f"tpu_inference[{i}] {rows[i].versions}",
                    fix="make the tpu_inference `versions` ranges disjoint",
                )
            if iv.hi is None or (iv.hi, iv.hi_incl) > (end.hi, end.hi_incl):
                reach = (iv, i)
        else:
            reach = (iv, i)


_ROW_KEYS = {
    "release", "date", "source_commit", "import_root", "convention", "classes", "decoder_layers",
    "default_decoder", "returns", "params", "scan_kv_carry", "scan_kv_carry_layers", "vllm", "config",
    "requires", "jax_verified", "deprecation", "known_defects", "notes", "callers",
}  # fmt: skip


def _parse_row(n: Node) -> MaxTextRow:
    n.only_keys(_ROW_KEYS)
    release = n.child("release").parsed(Version, "a PEP 440 version")
    root = n.child("import_root").choice(("MaxText", "maxtext"))
    classes_node = n.child("classes")
    classes_node.only_keys(set(CLASS_KEYS))
    classes: dict[str, ClassRef | None] = {}
    for key in CLASS_KEYS:
        c = classes_node.optional(key) if key in OPTIONAL_CLASS_KEYS else classes_node.child(key)
        classes[key] = None if c is None or c.value is None else c.parsed(ClassRef.parse, "a 'module:Class' reference")
    if classes["attention"] is None or classes["transformer"] is None:
        raise classes_node.error(
            "attention and transformer must name classes",
            fix=f"set `{classes_node.key}.attention` and `{classes_node.key}.transformer` to 'module:Class' references",
        )
    if classes["decoder"] is None and classes["nnx_decoder"] is None:
        raise classes_node.error(
            "at least one of decoder / nnx_decoder must name a class",
            fix=f"set `{classes_node.key}.decoder` (Linen) or `{classes_node.key}.nnx_decoder` (NNX) "
            "to a 'module:Class' reference",
        )
    layers_node = n.child("decoder_layers")
    layers_node.only_keys(set(FAMILIES))
    layers = {fam: ln.parsed(ClassRef.parse, "a 'module:Class' reference") for fam, ln in layers_node.items()}
    for ref in [*classes.values(), *layers.values()]:
        if ref is not None and ref.module.split(".")[0] != root:
            raise n.child("classes").error(
                f"{ref} is outside the import root {root!r}", fix="fix import_root or the class path"
            )
    returns_node = n.child("returns")
    returns_node.only_keys(set(RETURN_SHAPES))
    returns: dict[str, str | None] = {}
    for kind, allowed in RETURN_SHAPES.items():
        r = returns_node.child(kind)
        returns[kind] = None if r.value is None else r.choice(allowed)
    params_node = n.child("params")
    params_node.only_keys({"attention", "decoder_layer", "decoder"})
    params = {k: frozenset(_param_list(params_node.child(k))) for k in ("attention", "decoder_layer", "decoder")}
    convention = n.child("convention").choice(CONVENTIONS)
    has_kv = "kv_cache" in params["attention"]
    if (convention == "legacy") == has_kv:
        raise n.child("convention").error(
            "disagrees with params.attention (kv_cache present means a post-#2616 convention)",
            expected="kv_return or kv_scan_carry (params.attention lists kv_cache)"
            if has_kv
            else "legacy (params.attention has no kv_cache)",
            fix="set convention: legacy when Attention.__call__ has no kv_cache parameter, kv_return or "
            "kv_scan_carry when it has; or correct params.attention to the release's signature",
        )
    vllm_node = n.optional("vllm")
    vllm = _parse_vllm(vllm_node) if vllm_node is not None else None
    requires = n.child("requires")
    requires.only_keys({"tpu_inference"})
    tpi_req = requires.optional("tpu_inference")
    return MaxTextRow(
        release=release,
        date=_iso_date(n.child("date")),
        source_commit=None if n.optional("source_commit") is None else n.child("source_commit").nonempty_string(),
        import_root=root,
        convention=convention,
        classes=classes,
        decoder_layers=layers,
        default_decoder=n.child("default_decoder").choice(DECODER_KINDS),
        returns=returns,
        attention_params=params["attention"],
        decoder_layer_params=params["decoder_layer"],
        decoder_params=params["decoder"],
        scan_kv_carry=n.child("scan_kv_carry").boolean(),
        scan_kv_carry_layers=n.child("scan_kv_carry_layers").string_list()
        if n.optional("scan_kv_carry_layers")
        else (),
        vllm=vllm,
        config=_parse_config(n.child("config")),
        tpu_inference=None if tpi_req is None else tpi_req.parsed(SpecifierSet, "a version specifier"),
        jax_verified=n.child("jax_verified").string_list(),
        deprecation=_parse_deprecation(n.child("deprecation")),
        known_defects=tuple(_parse_defect(d) for d in n.child("known_defects").elements())
        if n.optional("known_defects")
        else (),
        notes=n.child("notes").string() if n.optional("notes") else "",
        callers=n.child("callers").choice(CALLER_CONVENTIONS) if n.optional("callers") else "auto",
    )


def _param_list(n: Node) -> list[str]:
    out = list(n.string_list())
    for p in out:
        if p not in OPTIONAL_PARAMS:
            raise n.error(
                f"unknown optional parameter {p!r}",
                expected=f"names from {list(OPTIONAL_PARAMS)}",
                fix=f"remove {p!r} from `{n.key}` or correct its spelling",
            )
    return out


def _parse_vllm(n: Node) -> VllmPath:
    n.only_keys({
        "attention_modes", "rpa_module", "rpa_call_form", "serve_return_order", "update_kv_cache_kwarg",
        "adapter", "adapter_return_arity", "per_layer_metadata",
    })  # fmt: skip
    arity = n.child("adapter_return_arity").integer()
    if arity not in (3, 4):
        raise n.child("adapter_return_arity").error(
            "must be 3 or 4",
            expected="3 or 4",
            fix="set adapter_return_arity to the number of values the release's vLLM adapter returns (3 or 4)",
        )
    return VllmPath(
        attention_modes=n.child("attention_modes").string_list(),
        rpa_module=n.child("rpa_module").nonempty_string(),
        rpa_call_form=n.child("rpa_call_form").choice(CALL_FORMS),
        serve_return_order=n.child("serve_return_order").choice(("(kv, out)", "(out, kv)")),
        update_kv_cache_kwarg=n.child("update_kv_cache_kwarg").boolean(),
        adapter=n.child("adapter").parsed(ClassRef.parse, "a 'module:Class' reference"),
        adapter_return_arity=arity,
        per_layer_metadata=n.child("per_layer_metadata").boolean() if n.optional("per_layer_metadata") else False,
    )


def _parse_config(n: Node) -> ConfigSpec:
    n.only_keys({"pyconfig", "base_yml", "base_yml_in_argv", "vllm_yml"})
    vy = n.optional("vllm_yml")
    return ConfigSpec(
        pyconfig=n.child("pyconfig").nonempty_string(),
        base_yml=n.child("base_yml").nonempty_string(),
        base_yml_in_argv=n.child("base_yml_in_argv").boolean(),
        vllm_yml=None if vy is None else vy.nonempty_string(),
    )


def _parse_deprecation(n: Node) -> Deprecation:
    n.only_keys({"policy", "since", "ends_in", "migration"})
    policy = n.child("policy").choice(POLICIES)
    since = n.optional("since")
    ends = n.optional("ends_in")
    if policy != "ignore" and ends is None:
        raise n.error(
            f"policy {policy!r} needs `ends_in` (the release in which old calls stop working)",
            fix="add ends_in, or use policy: ignore",
        )
    return Deprecation(
        policy=policy,
        since=None if since is None else since.parsed(lambda s: str(Version(s)), "a version"),
        ends_in=None if ends is None else ends.parsed(lambda s: str(Version(s)), "a version"),
        migration=n.child("migration").nonempty_string(),
    )


def _parse_defect(n: Node) -> KnownDefect:
    n.only_keys({"id", "summary", "affects", "why", "how", "undo", "remedy", "when", "upstream_fix"})
    remedy = n.child("remedy").choice(DEFECT_REMEDIES) if n.optional("remedy") else "fix"
    undo = n.optional("undo")
    if remedy == "fix" and undo is None:
        raise n.error(
            "a defect fixed by a shim must say how the fix is undone",
            expected="an 'undo' entry (remedy: fix)",
            fix="add undo: <how shims.uninstall() restores the original>, or set remedy: refuse",
        )
    if remedy == "refuse" and undo is not None:
        raise undo.error(
            "a refused defect changes nothing, so there is nothing to undo",
            expected="no 'undo' entry with remedy: refuse",
            fix="remove 'undo', or set remedy: fix if a shim repairs it",
        )
    return KnownDefect(
        id=n.child("id").nonempty_string(),
        summary=n.child("summary").nonempty_string(),
        affects=n.child("affects").string_list(),
        why=n.child("why").nonempty_string(),
        how=n.child("how").nonempty_string(),
        undo=None if undo is None else undo.nonempty_string(),
        remedy=remedy,
        when=_parse_condition(n.optional("when")),
        upstream_fix=n.child("upstream_fix").nonempty_string() if n.optional("upstream_fix") else None,
    )


def _parse_condition(n: Node | None) -> DefectCondition:
    if n is None:
        return DefectCondition()
    n.only_keys({"tpu_inference", "config"})
    tpi = n.optional("tpu_inference")
    config: dict[str, tuple[str, ...]] = {}
    if n.optional("config") is not None:
        for key, values in n.child("config").items():
            config[key] = values.string_list()
            if not config[key]:
                raise values.error(
                    "an empty list matches no config",
                    expected="one value or pattern at least",
                    fix=f"list the values of {key} the defect applies to, or remove the key",
                )
    return DefectCondition(
        tpu_inference=None if tpi is None else tpi.parsed(SpecifierSet, "a version specifier"), config=config
    )


def _parse_tpi(n: Node) -> TpuInferenceRow:
    n.only_keys({"versions", "releases", "rpa", "metadata", "model_return_arity", "block_sizes", "notes", "not_real"})
    versions = n.child("versions").parsed(SpecifierSet, "a version specifier")
    _interval(versions, n.child("versions"))  # plain bounds, not empty
    rpa = n.child("rpa")
    rpa.only_keys({"module", "function", "call_form", "factory_params", "params", "optional_kwargs", "returns"})
    form = rpa.child("call_form").choice(CALL_FORMS)
    factory = rpa.child("factory_params").string_list() if rpa.optional("factory_params") else ()
    if (form == "curried") != bool(factory):
        raise rpa.child("call_form").error(
            "curried form needs factory_params; flat form must not have them",
            expected="factory_params with call_form: curried, none with call_form: flat",
            fix="list the factory's parameters under rpa.factory_params for call_form: curried, "
            "or remove rpa.factory_params for call_form: flat",
        )
    md = n.child("metadata")
    md.only_keys({"module", "class", "fields", "meta_fields"})
    arity = n.child("model_return_arity").integer()
    if arity not in (3, 4):
        raise n.child("model_return_arity").error(
            "must be 3 or 4",
            expected="3 or 4",
            fix="set model_return_arity to the number of values the release's model function returns (3 or 4)",
        )
    block_sizes = n.child("block_sizes").string_list()
    for b in block_sizes:
        if b not in ("function", "env"):
            raise n.child("block_sizes").error(
                f"unknown block-size source {b!r}",
                expected="function and/or env",
                fix=f"list only `function` and/or `env` under block_sizes (remove {b!r})",
            )
    releases = _parse_releases(n.child("releases"), versions)
    return TpuInferenceRow(
        versions=versions,
        releases=releases,
        rpa=RpaSpec(
            module=rpa.child("module").nonempty_string(),
            function=rpa.child("function").nonempty_string(),
            call_form=form,
            factory_params=factory,
            params=rpa.child("params").string_list(),
            optional_kwargs=rpa.child("optional_kwargs").string_list() if rpa.optional("optional_kwargs") else (),
            returns=rpa.child("returns").choice(("(output, kv_cache)",)),
        ),
        metadata=MetadataSpec(
            module=md.child("module").nonempty_string(),
            cls=md.child("class").nonempty_string(),
            fields=md.child("fields").string_list(),
            meta_fields=md.child("meta_fields").string_list() if md.optional("meta_fields") else (),
        ),
        model_return_arity=arity,
        block_sizes=block_sizes,
        notes=n.child("notes").string() if n.optional("notes") else "",
        not_real=n.child("not_real").nonempty_string() if n.optional("not_real") else "",
    )


def _parse_releases(n: Node, versions: SpecifierSet) -> dict[str, TpiRelease]:
    out: dict[str, TpiRelease] = {}
    seen: dict[Version, str] = {}
    for ver, rn in n.items():
        rn.only_keys({"jax", "vllm_tpu", "date"})
        try:
            parsed = Version(ver)
        except Exception:
            raise rn.error(
                "is not a PEP 440 release number",
                expected='a key such as "0.32.0"',
                fix='key each release by its quoted version number, e.g. `"0.32.0": {jax: "0.11.2"}`',
            ) from None
        if parsed in seen:
            raise rn.error(
                f"release {ver} is listed twice (as {seen[parsed]!r} and {ver!r}, equal as versions)",
                fix="keep one entry per release",
            )
        seen[parsed] = ver
        if not versions.contains(ver, prereleases=True):
            raise rn.error(f"release {ver} lies outside this entry's range {versions}", fix="move it to its range")
        vt = rn.optional("vllm_tpu")
        out[ver] = TpiRelease(
            version=ver,
            jax=rn.child("jax").parsed(lambda s: str(Version(s)), "a jax version"),
            vllm_tpu=None if vt is None else vt.parsed(lambda s: str(Version(s)), "a vllm-tpu version"),
            date=_iso_date(rn.child("date")),
        )
    if not out:
        raise n.error(
            "must list at least one release",
            expected="a mapping of releases",
            fix=f'add the releases of this range under `{n.key}`, e.g. `"0.32.0": {{jax: "0.11.2"}}`',
        )
    return out


def _parse_cpu_shim(n: Node) -> CpuShimSpec:
    n.only_keys({"verified_jax", "verified_tpu_inference"})
    return CpuShimSpec(
        verified_jax=tuple(
            x.parsed(lambda s: str(Version(s)), "a version") for x in n.child("verified_jax").elements()
        ),
        verified_tpu_inference=tuple(
            x.parsed(lambda s: str(Version(s)), "a version") for x in n.child("verified_tpu_inference").elements()
        ),
    )


def _parse_env(name: str, n: Node, earlier: Mapping[str, EnvironmentSpec]) -> EnvironmentSpec:
    n.only_keys({
        "description", "python", "maxtext", "like", "requirements", "extra_requirements", "no_deps", "overrides",
        "exclude_newer", "env", "serving", "tests",
    })  # fmt: skip
    if not valid_env_name(name):
        raise MatrixError(
            "is not a valid environment name (it is the name of a directory that `envs build` replaces)",
            path=n.path,
            key=n.key,
            expected=ENV_NAME_RULE,
            found=repr(name),
            fix="rename the environment, e.g. `maxtext-0.2.5`",
        )
    mt = n.optional("maxtext")
    maxtext = None if mt is None else mt.parsed(lambda s: str(Version(s)), "a MaxText release")
    base = _like(n, earlier, maxtext)

    def strings(key: str) -> tuple[str, ...]:
        if n.optional(key) is not None:
            return n.child(key).string_list()
        return tuple(_repin_maxtext(r, maxtext) for r in getattr(base, key)) if base else ()

    reqs, no_deps = strings("requirements"), strings("no_deps")
    if n.optional("extra_requirements") is not None:  # added to the pins (own or copied by `like:`)
        reqs += n.child("extra_requirements").string_list()
    for r in reqs + no_deps:
        _check_requirement(r, n)
    env_node = n.optional("env")
    return EnvironmentSpec(
        name=name,
        description=n.child("description").nonempty_string(),
        python=n.child("python").parsed(lambda s: str(Version(s)), "a Python version like 3.12")
        if base is None or n.optional("python")
        else base.python,
        maxtext=maxtext,
        requirements=reqs,
        no_deps=no_deps,
        overrides=strings("overrides"),
        exclude_newer=n.child("exclude_newer").string()
        if n.optional("exclude_newer")
        else (base.exclude_newer if base else None),
        env=env_node.string_map() if env_node is not None else (dict(base.env) if base else {}),
        serving=n.child("serving").boolean() if n.optional("serving") else (base.serving if base else False),
        tests=_test_files(n) if n.optional("tests") is not None else (base.tests if base else ()),
    )


def _test_files(n: Node) -> tuple[str, ...]:
    """`tests:`: test files of this repository, as paths relative to its root (tests/...py)."""
    node = n.child("tests")
    files = node.string_list()
    for f in files:
        parts = f.split("/")
        if parts[0] != "tests" or not f.endswith(".py") or ".." in parts or "" in parts:
            raise node.error(
                f"is not a test file of this repository: {f!r}",
                expected="paths like tests/compat/test_paged_rpa.py (relative, under tests/, no '..')",
                fix="list the test files the environment runs, or drop `tests:` to run the whole suite",
            )
    if not files:
        raise node.error("is empty", expected="at least one test file", fix="drop `tests:` to run the whole suite")
    return files


def valid_env_name(name: object) -> bool:
    """Whether `name` may name an environment (a single, plain directory name under the envs folder)."""
    return isinstance(name, str) and ENV_NAME_PATTERN.fullmatch(name) is not None


def _like(n: Node, earlier: Mapping[str, EnvironmentSpec], maxtext: str | None) -> EnvironmentSpec | None:
    """The environment `like:` names: this one takes its pins, with its own MaxText release pinned instead.

    Why: MaxText 0.2.2-0.2.5 install on the very same jax/flax/tpu-inference stack; one list of
    pins, written once, keeps their environments from drifting apart.
    """
    node = n.optional("like")
    if node is None:
        return None
    other = node.string()
    if other not in earlier:
        raise node.error(
            f"names an environment that is not defined above it: {other!r}",
            expected=f"one of {sorted(earlier)}",
            fix="define the environment it copies first (earlier in `environments:`), or fix the name",
        )
    base = earlier[other]
    if maxtext is None or base.maxtext is None:
        raise node.error(
            "copies another environment's pins for a different MaxText release; both must name one",
            expected="`maxtext:` set here and in the environment copied",
            fix=f"set `maxtext:` in {n.key} and in environments.{other}, or list the pins here instead of `like:`",
        )
    if not any(_pins_maxtext(r) for r in (*base.requirements, *base.no_deps)):
        raise node.error(
            f"environments.{other} does not pin maxtext==X, so there is nothing to re-pin",
            expected="an environment whose requirements or no_deps pin maxtext",
            fix="list this environment's pins explicitly instead of `like:`",
        )
    return base


def _pins_maxtext(requirement: str) -> bool:
    from packaging.requirements import Requirement

    return canonicalize_name(Requirement(requirement).name) == "maxtext"


def _repin_maxtext(requirement: str, release: str | None) -> str:
    return f"maxtext=={release}" if release and _pins_maxtext(requirement) else requirement


def _check_requirement(text: str, n: Node) -> None:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        Requirement(text)
    except InvalidRequirement as exc:
        raise n.error(f"requirement {text!r} is not valid: {exc}", fix="use PEP 508 syntax, e.g. jax==0.11.2") from None
