"""`maxtext-compat doctor`: what is installed, what the matrix decides, and what would not work.

Why a separate module: the CLI prints it, the demo shows a summary, and tests assert on
the data, so the report is built as plain data first and rendered second.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from maxtext_compat.errors import CompatError
from maxtext_compat.matrix import CompatMatrix, load_matrix
from maxtext_compat.resolution.resolver import Resolution, resolve


def collect(*, matrix: CompatMatrix | None = None, strict: bool = False) -> dict[str, Any]:
    """Gather the doctor report as JSON-ready data (never imports jax or MaxText)."""
    m = matrix if matrix is not None else load_matrix()
    report: dict[str, Any] = {
        "matrix": {
            "path": m.source,
            "schema_version": m.schema_version,
            "maxtext_rows": [r.name for r in m.maxtext],
            "tpu_inference_rows": [str(r.versions) for r in m.tpu_inference],
        }
    }
    caught: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            res = resolve(matrix=m, strict=strict)
        except CompatError as exc:
            report["error"] = {"type": type(exc).__name__, "message": str(exc)}
            res = None
    caught = [str(w.message) for w in seen]
    report["warnings"] = caught
    if res is not None:
        report["resolution"] = res.as_dict()
        report["skipped"] = _would_skip(res, m)
        report["known_defects"] = _known_defects(res, m)
        report["stack_defects"] = _stack_defects(res, m)
    report["callers"] = _caller_convention(res)
    report["rpa_kernel"] = _rpa_kernel()
    report["shims"] = _shims()
    report["active_patches"] = _active_patches()
    report["traced_before_install"] = _traced_before_install()
    report["side_effects"] = side_effects()
    report["fingerprint"] = _fingerprint(res)
    return report


def own_maxtext() -> dict[str, Any]:
    """The installed MaxText as `matrix --maxtext` reports it: its version and commit, the row its code resolved
    as (or what the probes found where none matched) and which of our layers refused it, with the typed error."""
    from maxtext_compat.resolution.installed import refuse_unbridged

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            res = resolve()
        except CompatError as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
    info = res.versions.get("maxtext")
    code = res.code
    out: dict[str, Any] = {
        "version": None if info is None else info.version,
        "commit": None if info is None else info.commit,
        "row": None if res.maxtext is None else res.maxtext.name,
        "by_probes": code is not None and code.row is not None,
        "differences": {} if code is None else {k: a for k, (a, _) in code.differences.items()},
        "refused": [],
    }
    try:
        refuse_unbridged(res)
    except CompatError as exc:
        out["refused"].append({"layer": "shims.install()", "error": f"{type(exc).__name__}: {exc}"})
    return out


def own_maxtext_in(python: Path, source: str) -> str:
    """The report's column for the user's own MaxText, read by `own_maxtext()` in the environment of `python`."""
    import json
    import subprocess

    code = "import json\nfrom maxtext_compat.doctor import own_maxtext\nprint(json.dumps(own_maxtext()))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300, check=False)
    try:
        return own_maxtext_column(json.loads(out.stdout.strip().splitlines()[-1]), source)
    except (ValueError, IndexError):
        return f"MaxText from {source}: not resolved ({(out.stderr or 'no output').strip()[-300:]})"


def own_maxtext_column(data: dict[str, Any], source: str) -> str:
    """The report's column for `matrix --maxtext SOURCE`: what was installed and what our layers made of it."""
    if "error" in data:
        return f"MaxText from {source}: not resolved ({data['error']})"
    at = data["commit"] or data["version"]
    if data["by_probes"]:
        return f"MaxText from {source} at {at}, resolved as {data['row']} by probes"
    found = "; ".join(f"{k} {v}" for k, v in data["differences"].items())
    refused = "; ".join(f"{r['layer']} refused it: {r['error']}" for r in data["refused"]) or "no layer refused it"
    return f"MaxText from {source} at {at}: probes match no row (against {data['row']} they found {found}); {refused}"


def _fingerprint(res: Resolution | None) -> dict[str, Any]:
    """This process's plugin fingerprint (what a vLLM worker compares with the engine's): digest and fields."""
    from maxtext_compat.serving import fingerprint, settings

    try:
        return fingerprint.current(resolution=res, model=settings.model_choice()).as_dict()
    except CompatError as exc:  # a bad MAXTEXT_COMPAT_* setting: shown, not raised
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}


def _known_defects(res: Resolution, m: CompatMatrix) -> list[dict[str, str]]:
    """The installed row's known defects and whether the installed tpu-inference meets their condition."""
    from maxtext_compat.resolution import defects

    if res.maxtext is None:
        return []
    tpi = res.versions.get("tpu_inference")
    version = None if tpi is None else m.comparable("tpu_inference", tpi.version)
    statuses = defects.statuses(res.maxtext, version)
    return [
        {"id": s.defect.id, "applies": s.applies, "remedy": s.defect.remedy, "line": line}
        for s, line in zip(statuses, defects.describe(statuses), strict=True)
    ]


def _stack_defects(res: Resolution, m: CompatMatrix) -> list[dict[str, str]]:
    """The installed tpu-inference's request defects (any served model): fixed or refused at request time."""
    from maxtext_compat.resolution import defects

    tpi = res.versions.get("tpu_inference")
    version = None if tpi is None else m.comparable("tpu_inference", tpi.version)
    statuses = defects.stack_statuses(res.tpu_inference, version)
    lines = defects.describe(statuses, fixed_by="the serving-requests shim", refused="refused at request time: 400")
    return [
        {"id": s.defect.id, "applies": s.applies, "remedy": s.defect.remedy, "upstream": s.defect.upstream or "",
         "line": line}
        for s, line in zip(statuses, lines, strict=True)
    ]  # fmt: skip


def _traced_before_install() -> dict[str, list[str]]:
    """Per installed profile, the jitted functions compiled before it (they may run unpatched code)."""
    from maxtext_compat.patching import traced
    from maxtext_compat.patching.ledger import active_patches

    profiles = dict.fromkeys(p.profile for p in active_patches())
    return {name: list(funcs) for name in profiles if (funcs := traced.compiled_before(name))}


def _caller_convention(res: Resolution | None) -> dict[str, Any]:
    """The caller convention in force outside any wrap(), where it came from, and what it overrides."""
    from maxtext_compat.convention import callers

    try:
        found = callers.layers(None if res is None else res.maxtext)
    except CompatError as exc:  # a bad $MAXTEXT_COMPAT_CONVENTION: shown, not raised
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    return {
        "value": found[0].value,
        "source": found[0].source,
        "overridden": [{"value": d.value, "source": d.source} for d in found[1:]],
    }


def _rpa_kernel() -> dict[str, Any]:
    """Which RPA kernel a CPU server runs: in this process if the CPU serving shim is on, else the setting."""
    from maxtext_compat import platforms
    from maxtext_compat.cpu import serving as cpu_serving

    st = cpu_serving.status()
    try:
        choice = platforms.kernel_choice()
    except CompatError as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    return {
        "setting": choice or "unset",
        "variable": platforms.KERNEL_ENV,
        "in_this_process": st.kernel if st is not None and st.active else None,
    }


def _shims() -> list[dict[str, Any]]:
    """Every shim the same way: those of this process (registered, installed, or asked for and why it did nothing)
    and every one an installed distribution declares (the `maxtext_compat.shims` entry points), with its range."""
    from maxtext_compat.patching import shim
    from maxtext_compat.shims import maxtext_profiles

    maxtext_profiles.register()  # MaxText's own shims are listed before anything asked for one (idempotent)
    return [s.as_dict() for s in shim.listed()]


def _active_patches() -> list[dict[str, Any]]:
    from maxtext_compat.patching.ledger import active_patches

    return [p.as_dict() for p in active_patches()]


def _would_skip(res: Resolution, m: CompatMatrix) -> list[dict[str, str]]:
    """Features that will not work with this install, each with the reason and the fix."""
    out: list[dict[str, str]] = []
    v = res.versions
    if "maxtext" not in v:
        out.append({
            "feature": "adapters and shims",
            "reason": "MaxText is not installed",
            "fix": "pip install maxtext (see compat_matrix.yaml environments for working pins)",
        })  # fmt: skip
    if "tpu_inference" not in v:
        out.append({
            "feature": "new-call path (kv_cache / attention_metadata) through ragged paged attention",
            "reason": "tpu-inference is not installed",
            "fix": "install tpu-inference and vllm-tpu (e.g. the maxtext-0.1.0-jax011 or maxtext-0.2.5 environment)",
        })  # fmt: skip
    if "vllm" not in v:
        out.append({
            "feature": "vLLM plugin and `maxtext-compat serve`",
            "reason": "vllm-tpu is not installed",
            "fix": "install vllm-tpu matching tpu-inference",
        })  # fmt: skip
    jax = v.get("jax")
    if jax is not None and "tpu_inference" in v and not m.cpu_shim.jax_verified(jax.version):
        out.append({
            "feature": "CPU shim for the RPA kernel (interpret mode)",
            "reason": f"jax {jax.version} is not in the verified list {list(m.cpu_shim.verified_jax)}",
            "fix": "use a verified jax, or install the shim with force=True at your own risk",
        })  # fmt: skip
    if jax is None:
        out.append(
            {
                "feature": "everything that runs MaxText",
                "reason": "jax is not installed",
                "fix": "pip install jax",
            }
        )
    return out


def side_effects() -> dict[str, Any]:
    """MaxText import side effects visible in this process (XLA_FLAGS, jax patches, files), without importing it."""
    flags = os.environ.get("XLA_FLAGS", "")
    termination_log = Path("/dev/termination-log")
    lax_patched = None
    lax = sys.modules.get("jax.lax")
    if lax is not None:
        wsc = getattr(lax, "with_sharding_constraint", None)
        lax_patched = bool(wsc is not None and "tunix" in (getattr(wsc, "__module__", "") or ""))
    return {
        "xla_dump_flags": "--xla_dump_to" in flags,
        "xla_flags": flags,
        "m_env_vars": sorted(k for k in os.environ if k.startswith("M_")),
        "termination_log_file": termination_log.is_file(),
        "jax_lax_patched_by_maxtext": lax_patched,
        "maxtext_imported": any(name in sys.modules for name in ("maxtext", "MaxText")),
    }


def _render_rpa_kernel(k: dict[str, Any]) -> list[str]:
    if "error" in k:
        return [f"RPA kernel on CPU: ERROR {k['error']['type']}: {k['error']['message']}"]
    if k["in_this_process"]:
        return [f"RPA kernel on CPU: {k['in_this_process']} (running in this process; {k['variable']}={k['setting']})"]
    checked = "xla where tpu-inference (a checked release) binds the v3 kernels"
    default = k["setting"] if k["setting"] != "unset" else checked
    return [f"RPA kernel on CPU servers: {default} ({k['variable']}: xla | pallas = the real kernel, interpreted)"]


def _render_callers(c: dict[str, Any]) -> list[str]:
    if "error" in c:
        return [f"caller convention: ERROR {c['error']['type']}: {c['error']['message']}"]
    line = f"caller convention: {c['value']} (from {c['source']})"
    if c["overridden"]:
        line += "; overrides " + ", ".join(f"{d['value']} ({d['source']})" for d in c["overridden"])
    return [line]


def _render_code(code: dict[str, Any] | None) -> list[str]:
    """A MaxText installed from a folder or URL: where from, the rows its code matches, what differs, a refusal."""
    if not code:
        return []
    rows = ", ".join(code["rows"]) or "none"
    lines = [f"MaxText source: {code['source']}; probes: its code matches row(s) {rows}"]
    lines += [f"  DIFFERS {k}: installed {d['installed']}, row {d['row']}" for k, d in code["differences"].items()]
    refusal = code["refusal"]
    if refusal:
        lines.append(f"  shims.install() refuses it: {refusal['what']} (row: {refusal['row']}, "
                     f"installed: {refusal['installed']})")  # fmt: skip
    return lines


def render(report: dict[str, Any]) -> str:
    lines: list[str] = []
    mtx = report["matrix"]
    lines.append(
        f"matrix: {mtx['path']} (schema {mtx['schema_version']}, {len(mtx['maxtext_rows'])} MaxText rows, "
        f"{len(mtx['tpu_inference_rows'])} tpu-inference ranges)"
    )
    if "error" in report:
        lines.append(f"ERROR {report['error']['type']}: {report['error']['message']}")
    res = report.get("resolution")
    if res:
        lines.append("installed:")
        for k, ver in res["versions"].items():
            lines.append(f"  {k:<14} {ver}")
        if not res["versions"]:
            lines.append("  (none of maxtext, tpu-inference, vllm, jax, flax)")
        if res["maxtext"]:
            lines.append(
                f"MaxText row {res['maxtext']} ({res['maxtext_match']}): convention {res['convention']}, "
                f"import root {res['import_root']}, default decoder {res['default_decoder']}, "
                f"deprecation policy {res['deprecation_policy']}"
            )
        lines.extend(_render_code(res.get("code")))
        form = res.get("rpa_call_form")
        if form:
            kw = ", ".join(form["kwargs"]) or "no optional kwargs"
            lines.append(
                f"tpu-inference row {res['tpu_inference']} ({res['tpu_inference_match']}): RPA {form['form']} "
                f"{form['module']}.{form['function']} ({kw}); model returns a {res['model_return_arity']}-tuple"
            )
        probe = res.get("probe")
        if probe:
            good = sum(1 for f in probe["findings"] if f["ok"])
            lines.append(f"probes ({probe['mode']}): {good}/{len(probe['findings'])} agree with the row")
            for f in probe["findings"]:
                if not f["ok"]:
                    lines.append(f"  MISMATCH {f['check']}: matrix {f['expected']}, installed {f['found']}")
        for note in res["notes"]:
            lines.append(f"note: {note}")
    known = report.get("known_defects") or []
    if known:
        lines.append(f"known defects of this MaxText row: {len(known)}")
        lines.extend(f"  {d['line']}" for d in known)
    stack = report.get("stack_defects") or []
    if stack:
        lines.append(f"known defects of the serving stack (tpu-inference, any model served): {len(stack)}")
        lines.extend(f"  {d['line']}" for d in stack)
    lines.extend(_render_callers(report["callers"]))
    lines.extend(_render_rpa_kernel(report["rpa_kernel"]))
    for s in report["shims"]:
        state = f"installed, {len(s['targets'])} target(s)" if s["active"] else s["reason"]
        verified = f" (verified for {', '.join(s['verified_for'])})" if s["verified_for"] else ""
        lines.append(f"shim {s['name']}: {state}{verified}")
    patches = report["active_patches"]
    lines.append(f"active patches: {len(patches) or 'none'}")
    for p in patches:
        lines.append(f"  {p['target']} <- {p['origin']} ({p['profile']})")
    for name, funcs in report.get("traced_before_install", {}).items():
        lines.append(
            f"  WARNING profile {name} was installed after {len(funcs)} jitted function(s) were compiled "
            f"({', '.join(funcs[:5])}): any that traced its targets runs unpatched code until jax.clear_caches()"
        )
    fx = report["side_effects"]
    effects = []
    if fx["xla_dump_flags"]:
        effects.append("XLA_FLAGS holds an HLO dump (MaxText 0.2.5 pyconfig sets it when XLA_FLAGS is empty)")
    if fx["m_env_vars"]:
        effects.append(f"M_* variables {fx['m_env_vars']} (MaxText pyconfig reads or rejects them)")
    if fx["termination_log_file"]:
        effects.append("/dev/termination-log is a file (MaxText 0.2.x writes config errors there)")
    if fx["jax_lax_patched_by_maxtext"]:
        effects.append("jax.lax.with_sharding_constraint is MaxText's fallback wrapper (masks sharding errors)")
    lines.append("side effects: " + ("; ".join(effects) if effects else "none detected"))
    fp = report.get("fingerprint") or {}
    if "error" in fp:
        lines.append(f"plugin fingerprint: ERROR {fp['error']['type']}: {fp['error']['message']}")
    elif fp:
        set_ = ", ".join(f"{k}={v}" for k, v in fp["settings"].items() if v is not None) or "all defaults"
        lines.append(f"plugin fingerprint: {fp['digest']} (settings: {set_}; `doctor --json` has every field)")
    skipped = report.get("skipped") or []
    if skipped:
        lines.append("would be skipped:")
        for s in skipped:
            lines.append(f"  - {s['feature']}: {s['reason']} -> {s['fix']}")
    for w in report["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)
