"""Capability probes: check a matrix row against the MaxText that is really installed.

Two depths. `probe_static` reads the installed source with `ast` (no import, so no
TensorFlow, no XLA_FLAGS, no jax patches; milliseconds). `probe_runtime` imports the
classes and reads `inspect.signature`, which is what introspecting consumers see.
Both compare against the row: module presence, optional parameters, return arity.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from maxtext_compat.matrix import OPTIONAL_PARAMS, ClassRef, MaxTextRow

IMPORT_ROOTS = ("maxtext", "MaxText")


@dataclass(frozen=True)
class Finding:
    check: str
    expected: str
    found: str

    @property
    def ok(self) -> bool:
        return self.expected == self.found

    def as_dict(self) -> dict[str, object]:
        return {"check": self.check, "expected": self.expected, "found": self.found, "ok": self.ok}


@dataclass(frozen=True)
class ProbeReport:
    mode: Literal["static", "runtime"]
    import_root: str | None
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)

    @property
    def mismatches(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if not f.ok)

    def as_dict(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "import_root": self.import_root,
            "ok": self.ok,
            "findings": [f.as_dict() for f in self.findings],
        }


def package_dir(root: str) -> Path | None:
    """Directory of a top-level package, without executing its __init__."""
    try:
        spec = importlib.util.find_spec(root)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def detect_import_root() -> str | None:
    """`maxtext` if it holds the layers (0.2.0+), else `MaxText` (0.1.0), else None.

    `import MaxText` succeeding does not mean `MaxText.layers` exists: 0.2.0/0.2.1 ship a
    thin `MaxText` shim package next to `maxtext`.
    """
    for root in IMPORT_ROOTS:
        d = package_dir(root)
        if d is not None and (d / "layers" / "attentions.py").is_file():
            return root
    return None


def module_file(module: str) -> Path | None:
    root, _, rest = module.partition(".")
    base = package_dir(root)
    if base is None:
        return None
    rel = Path(*rest.split(".")) if rest else Path()
    for candidate in (base / rel.with_suffix(".py"), base / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _find_method(path: Path, qualname: str, method: str) -> ast.FunctionDef | None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == qualname.split(".")[-1]:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return item
    return None


def _static_params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)][1:]


def _static_return_arities(fn: ast.FunctionDef) -> set[int]:
    arities: set[int] = set()
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Return) and sub.value is not None:
            arities.add(len(sub.value.elts) if isinstance(sub.value, ast.Tuple) else 1)
    return arities


def _class_exists_static(ref: ClassRef) -> tuple[Path | None, bool]:
    path = module_file(ref.module)
    if path is None:
        return None, False
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = ref.qualname.split(".")[-1]
    return path, any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(tree))


def _present(params: set[str], names: frozenset[str]) -> str:
    return ",".join(sorted(p for p in OPTIONAL_PARAMS if p in params)) or "-"


def probe_static(row: MaxTextRow) -> ProbeReport:
    """Compare the row with the installed MaxText source, without importing it."""
    root = detect_import_root()
    findings = [Finding("import root", row.import_root, root or "not installed")]
    if root is None:
        return ProbeReport("static", None, tuple(findings))
    refs: dict[str, ClassRef] = {k: v for k, v in row.classes.items() if v is not None}
    refs.update({f"decoder_layers.{k}": v for k, v in row.decoder_layers.items()})
    for key, ref in sorted(refs.items()):
        _, exists = _class_exists_static(ref)
        findings.append(Finding(f"class {key} ({ref})", "present", "present" if exists else "missing"))
    for key, absent in (
        ("decoder", row.classes["decoder"] is None),
        ("nnx_decoder", row.classes["nnx_decoder"] is None),
    ):
        if absent:
            # The row says there is no such class in this release; check it really is gone.
            guess = f"{row.import_root}.layers.{'decoders' if key == 'decoder' else 'nnx_decoders'}"
            findings.append(Finding(f"module {guess}", "absent", "absent" if module_file(guess) is None else "present"))
    attention = row.classes["attention"]
    assert attention is not None  # validated by the loader
    path = module_file(attention.module)
    fn = _find_method(path, attention.qualname, "__call__") if path else None
    if fn is None:
        findings.append(Finding("Attention.__call__", "defined", "missing"))
    else:
        params = set(_static_params(fn))
        findings.append(
            Finding(
                "Attention.__call__ optional params",
                _present(set(row.params.attention), row.params.attention),
                _present(params, row.params.attention),
            )
        )
        arity = _static_return_arities(fn)
        expected = row.return_shape("attention").arity
        findings.append(Finding("Attention.__call__ return arity", str(expected), ",".join(map(str, sorted(arity)))))
    return ProbeReport("static", root, tuple(findings))


def probe_runtime(row: MaxTextRow) -> ProbeReport:
    """Import the row's classes and compare `inspect.signature` (imports MaxText: slow)."""
    root = detect_import_root()
    findings = [Finding("import root", row.import_root, root or "not installed")]
    if root is None:
        return ProbeReport("runtime", None, tuple(findings))
    for key, ref in sorted({k: v for k, v in row.classes.items() if v is not None}.items()):
        try:
            cls = ref.load()
        except Exception as exc:
            findings.append(Finding(f"import {key} ({ref})", "ok", f"{type(exc).__name__}: {exc}"[:200]))
            continue
        findings.append(Finding(f"import {key} ({ref})", "ok", "ok"))
        if key == "attention":
            params = set(inspect.signature(cls.__call__).parameters)
            findings.append(
                Finding(
                    "Attention.__call__ optional params (signature)",
                    _present(set(row.params.attention), row.params.attention),
                    _present(params, row.params.attention),
                )
            )
    return ProbeReport("runtime", root, tuple(findings))


# ----------------------------------------------------------------------------------------------
# A MaxText installed from a folder or a URL (PEP 610): its row is found by its code, not its version
# ----------------------------------------------------------------------------------------------

# The code facts the adapters and shims are built from: a difference here cannot be bridged by a row.
BRIDGED_BY_ROW = ("import_root", "convention", "classes.", "decoder_layers.", "params.", "returns.", "scan_kv_carry")
_CALLS = {"attention": "Attention.__call__", "decoder_layer": "the decoder layer's __call__",
          "decoder": "the Decoder's __call__"}  # fmt: skip


@dataclass(frozen=True)
class CodeMatch:
    """What the installed code's facts say: the rows they equal, and how they differ from the row resolved."""

    source: str
    rows: tuple[str, ...]
    row: str | None
    differences: dict[str, tuple[object, object]]
    refusal: tuple[str, str, str] | None  # (what differs, what the row has, what the install has)

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "rows": list(self.rows),
            "row": self.row,
            "differences": {k: {"installed": a, "row": b} for k, (a, b) in self.differences.items()},
            "refusal": None
            if self.refusal is None
            else dict(zip(("what", "row", "installed"), self.refusal, strict=True)),
        }


def source_of(url: str | None, commit: str | None, editable: bool) -> str:
    """How a user names a direct install: `editable /path`, `URL at COMMIT`."""
    where = (url or "").removeprefix("file://") if editable else (url or "?")
    return f"editable {where}" if editable else (f"{where} at {commit}" if commit else where)


def match_code(rows: tuple[MaxTextRow, ...], by_version: MaxTextRow | None, source: str) -> CodeMatch:
    """The installed MaxText's code facts (read by ast) against every row: those equal, and the differences
    from the row its version names (else the nearest matching one)."""
    from maxtext_compat.matrix.facts import differences, read_facts, row_facts

    found = read_facts("installed")
    equal = tuple(r.name for r in rows if not differences(found.row, row_facts(r)))
    row = by_version if by_version is not None and by_version.name in equal else None
    if row is None and equal:
        row = max((r for r in rows if r.name in equal), key=lambda r: r.release)
    base = row or by_version
    diff = {} if base is None else differences(found.row, row_facts(base))
    return CodeMatch(source, equal, None if row is None else row.name, diff, _refusal(found.signatures, diff))


def _refusal(signatures: dict[str, list[dict[str, object]]], diff: dict[str, tuple[object, object]]) -> Any:
    """The first thing the adapters cannot bridge: a required keyword-only parameter, or a differing fact."""
    for key, call in _CALLS.items():
        for p in signatures.get(key, []):
            if p["keyword_only"] and not p["has_default"]:
                return (f"{call} parameter {p['name']}", "no such required keyword-only parameter", "required")
    for key, (found, row) in sorted(diff.items(), key=lambda kv: not kv[0].startswith("params.")):  # a name first
        if not key.startswith(BRIDGED_BY_ROW):
            continue
        if key.startswith("params.") and isinstance(found, list) and isinstance(row, list):
            missing, extra = sorted(set(row) - set(found)), sorted(set(found) - set(row))
            call = _CALLS[key.removeprefix("params.")]
            what = f"{call} parameter {', '.join(missing or extra)}"
            return (what, "present" if missing else "absent", "absent" if missing else "present")
        return (key, str(row), str(found))
    return None
