"""compat_matrix.yaml text → CompatMatrix: every field checked, every error naming its key."""

from __future__ import annotations

import dataclasses
import datetime
import re
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from maxtext_compat._yaml_reader import Node, safe_load_text
from maxtext_compat.matrix.environments import parse_environment
from maxtext_compat.matrix.types import (
    CALL_FORMS,
    CALLER_CONVENTIONS,
    CLASS_KEYS,
    CONVENTIONS,
    DECODER_KINDS,
    DEFECT_REMEDIES,
    DEV_BUILD_PACKAGES,
    DEV_BUILD_RELATIONS,
    FAMILIES,
    OPTIONAL_CLASS_KEYS,
    OPTIONAL_PARAMS,
    POLICIES,
    RETURN_SHAPES,
    SCHEMA_VERSION,
    ClassRef,
    CompatMatrix,
    ConfigSpec,
    CpuShimSpec,
    DefectCondition,
    Deprecation,
    EnvironmentSpec,
    KnownDefect,
    MaxTextRow,
    MetadataSpec,
    RpaSpec,
    TpiRelease,
    TpuInferenceRow,
    VllmPath,
)


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
        spec = parse_environment(name, n, envs)
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
