"""A release's code facts, in the shape of its compat_matrix.yaml row, read from its source by ast.

Why the row's shape: the facts of a new release are pasted into the matrix as they are printed, and the facts of a
shipped release compare with its row key by key (tests/compat/test_facts_of_releases.py reads every shipped
release this way). Each rule says which code it reads; none imports MaxText.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from maxtext_compat.errors import InvalidArgumentError
from maxtext_compat.matrix.facts import code
from maxtext_compat.matrix.facts.code import Method, first_class, method, name_of, tuples
from maxtext_compat.matrix.facts.sources import PIN_FOLDERS, ReleaseFiles, open_source
from maxtext_compat.matrix.values import FAMILIES, OPTIONAL_PARAMS

FAMILY_CLASSES = {"llama2": "LlamaDecoderLayer", "qwen3": "Qwen3DecoderLayer", "gemma3": "Gemma3DecoderLayer"}
PINNED = ("jax", "jaxlib", "flax", "tpu-inference", "vllm-tpu", "vllm")
_MODE = re.compile(r"vllm_\w*rpa")
_GITHUB_PIN = re.compile(r"^\s*(?P<name>[A-Za-z0-9_.-]+)\s*@\s*(?P<url>\S+)", re.M)
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class ReleaseFacts:
    """What `maxtext-compat facts` prints: the code facts as a row, the signatures, the pins, the origin."""

    kind: str
    location: str
    version: str | None
    row: dict[str, Any]
    signatures: dict[str, list[dict[str, object]]]
    requirements: list[str]
    github_pins: list[dict[str, str]]
    origin: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": {"kind": self.kind, "location": self.location, "version": self.version, **self.origin},
            "row": self.row,
            "signatures": self.signatures,
            "pins": {"requirements": self.requirements, "github": self.github_pins},
        }


def read_facts(source: str | Path | None) -> ReleaseFacts:
    """The facts of the release at `source` (a wheel, a source folder, or None / "installed")."""
    return facts_of(open_source(source))


def facts_of(files: ReleaseFiles) -> ReleaseFacts:
    row, methods = code_facts(files)
    sigs = {key: [p.as_dict() for p in m.params] for key, m in methods.items() if m is not None}
    return ReleaseFacts(files.kind, files.location, files.version, row, sigs, _requirements(files),
                        _github_pins(files), dict(files.origin))  # fmt: skip


def import_root(files: ReleaseFiles) -> str | None:
    """`maxtext` where it holds the layers (0.2.0 on), else `MaxText` (0.1.0): 0.2.0/0.2.1 ship a `MaxText` shim."""
    for root in ("maxtext", "MaxText"):
        if f"{root}/layers/attentions.py" in files.names:
            return root
    return None


def code_facts(files: ReleaseFiles) -> tuple[dict[str, Any], dict[str, Method | None]]:
    """(the row's code facts, the methods they were read from)."""
    root = import_root(files)
    if root is None:
        raise InvalidArgumentError(
            "holds no MaxText layers",
            argument="SOURCE",
            expected="maxtext/layers/attentions.py (or MaxText/layers/attentions.py)",
            found=f"{files.kind} {files.location}",
            fix="pass a MaxText wheel or source tree",
        )
    classes = _classes(files, root)
    layers = _layers(files, root)
    decoder_ref = classes["decoder"] or classes["nnx_decoder"]
    m = {
        "attention": method(files, classes["attention"]),
        "decoder_layer": method(files, layers["default"]),
        "decoder": method(files, decoder_ref),
        "transformer": method(files, classes["transformer"]),
        **{f"decoder_layers.{k}": method(files, layers[k]) for k in FAMILY_CLASSES},
    }
    carry = [f for f in FAMILIES if _carries(m.get(f"decoder_layers.{f}") if f != "default" else m["decoder_layer"])]
    params = {k: _optional(m[k]) for k in ("attention", "decoder_layer", "decoder")}
    convention = "legacy" if "kv_cache" not in params["attention"] else ("kv_scan_carry" if carry else "kv_return")
    row: dict[str, Any] = {
        "import_root": root,
        "convention": convention,
        "classes": classes,
        "decoder_layers": layers,
        "default_decoder": _default_decoder(files, root, classes),
        "returns": _returns(m),
        "params": params,
        "scan_kv_carry": bool(carry),
        "scan_kv_carry_layers": carry,
        "vllm": _vllm(files, root, classes, m["attention"]),
        "config": _config(files, root),
    }
    return row, m


def _classes(files: ReleaseFiles, root: str) -> dict[str, str | None]:
    lay, models = f"{root}.layers", (f"{root}.models.models", f"{root}.layers.models")
    return {
        "attention": first_class(files, (f"{lay}.attentions",), "Attention"),
        "attention_op": first_class(files, (f"{lay}.attention_op",), "AttentionOp"),
        "mla": first_class(files, (f"{lay}.attention_mla",), "MLA"),
        "decoder": first_class(files, (f"{lay}.decoders",), "Decoder"),
        "nnx_decoder": first_class(files, (f"{lay}.nnx_decoders",), "NNXDecoder"),
        "transformer": first_class(files, models, "Transformer"),
        "transformer_linen": first_class(files, models, "TransformerLinenPure"),
    }


def _layers(files: ReleaseFiles, root: str) -> dict[str, str | None]:
    """The generic layer (Linen's DecoderLayer, else NNXDecoderLayer) and each family's."""
    lay = f"{root}.layers"
    out = {
        "default": first_class(files, (f"{lay}.decoders",), "DecoderLayer")
        or first_class(files, (f"{lay}.nnx_decoders",), "NNXDecoderLayer")
    }
    for family, cls in FAMILY_CLASSES.items():
        out[family] = first_class(files, (f"{root}.models.{family}", f"{lay}.{family}"), cls)
    return out


def _carries(m: Method | None) -> bool:
    """#3372's scanned carry: the layer returns ((y, stacked_kv, idx + 1), None)."""
    return any(t and isinstance(t[0], ast.Tuple) and len(t[0].elts) == 3 for t in tuples(m))


def _optional(m: Method | None) -> list[str]:
    """The OPTIONAL_PARAMS a signature takes, in its order (the Decoder's `kv_caches` is the row's kv_cache)."""
    names = [] if m is None else [{"kv_caches": "kv_cache"}.get(n, n) for n in m.names]
    return [n for n in names if n in OPTIONAL_PARAMS]


def _returns(m: dict[str, Method | None]) -> dict[str, str | None]:
    attention = tuples(m["attention"])
    layer = tuples(m["decoder_layers.llama2"])
    decoder = tuples(m["decoder"])
    transformer = tuples(m["transformer"])
    return {
        "attention": "(out, kv_cache)" if any(len(t) == 2 for t in attention) else "out",
        "decoder_layer": "(y, kv_cache)" if any(len(t) == 2 and name_of(t[1]) == "kv_cache" for t in layer) else "y",
        "decoder_layer_scanned": "((y, stacked_kv, idx), None)"
        if _carries(m["decoder_layers.llama2"])
        else "(y, None)",
        "decoder": "(logits, hidden, kv_caches)"
        if any(len(t) >= 3 and name_of(t[2]) == "kv_caches" for t in decoder)
        else "(logits, hidden)",
        "transformer": "logits",
        "transformer_vllm": "(hidden, kv_caches)"
        if any(len(t) >= 2 and name_of(t[1]) == "kv_caches" for t in transformer)
        else None,
    }


def _default_decoder(files: ReleaseFiles, root: str, classes: dict[str, str | None]) -> str:
    """nnx where the Linen Decoder is gone or base.yml turns pure_nnx_decoder on (0.2.4), else linen."""
    if classes["decoder"] is None:
        return "nnx"
    base = files.text(f"{root}/configs/base.yml") or ""
    found = re.search(r"^pure_nnx_decoder:\s*(\S+)", base, re.M)
    return "nnx" if found and found.group(1).lower() == "true" else "linen"


def _vllm(files: ReleaseFiles, root: str, classes: dict[str, str | None], attention: Method | None) -> Any:
    """How the release reaches tpu-inference: Attention.forward_serve_vllm's import, call and return; the adapter."""
    serve = method(files, classes["attention"], "forward_serve_vllm")
    if serve is None:
        return None
    path = code.module_file(files, classes["attention"].partition(":")[0])  # type: ignore[union-attr]
    modes = list(dict.fromkeys(s for s in code.strings(files, path) if _MODE.fullmatch(s)))
    rpa_module, alias = None, None
    for node in code.own_nodes(serve.node, ast.ImportFrom):
        assert isinstance(node, ast.ImportFrom)
        for a in node.names:
            if a.name == "sharded_ragged_paged_attention":
                rpa_module, alias = node.module, a.asname or a.name
    form, kwargs = None, []
    for node in code.own_nodes(serve.node, ast.Call):
        assert isinstance(node, ast.Call)
        if name_of(node.func) == alias:
            form, kwargs = form or "flat", [k.arg for k in node.keywords]
        elif isinstance(node.func, ast.Call) and name_of(node.func.func) == alias:
            form, kwargs = "curried", [k.arg for k in node.keywords]
    pairs = [t for t in tuples(serve) if len(t) == 2 and all(name_of(e) for e in t) and name_of(t[0]) != "query"]
    order = None if not pairs else ("(kv, out)" if "kv" in name_of(pairs[0][0]) else "(out, kv)")
    adapter = first_class(files, (f"{root}.integration.vllm.maxtext_vllm_adapter.adapter",), "MaxTextForCausalLM")
    arity = max((len(t) for t in tuples(method(files, adapter))), default=None)
    return {
        "attention_modes": modes,
        "rpa_module": rpa_module,
        "rpa_call_form": form,
        "serve_return_order": order,
        "update_kv_cache_kwarg": "update_kv_cache" in kwargs,
        "adapter": adapter,
        "adapter_return_arity": arity,
        "per_layer_metadata": _per_layer_metadata(files, classes),
    }


def _per_layer_metadata(files: ReleaseFiles, classes: dict[str, str | None]) -> bool:
    """The decoder picks each layer's entry of tpu-inference's per-layer dict: `attention_metadata.get(...)`."""
    for ref in (classes["decoder"], classes["nnx_decoder"]):
        path = None if ref is None else code.module_file(files, ref.partition(":")[0])
        tree = code.parse(files, path) if path else None
        for node in ast.walk(tree) if tree else ():
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr == "get" and name_of(func.value) == "attention_metadata":
                return True
    return False


def _config(files: ReleaseFiles, root: str) -> dict[str, Any]:
    """Where pyconfig and the YAML configs are; the pre-0.2 layout (pyconfig at the package root) takes base.yml
    as argv[1]."""
    pyconfig = next((m for m in (f"{root}.configs.pyconfig", f"{root}.pyconfig") if code.module_file(files, m)), None)
    vllm = next((y for y in ("configs/inference/vllm.yml", "configs/vllm.yml") if f"{root}/{y}" in files.names), None)
    return {
        "pyconfig": pyconfig,
        "base_yml": "configs/base.yml" if f"{root}/configs/base.yml" in files.names else None,
        "base_yml_in_argv": pyconfig == f"{root}.pyconfig",
        "vllm_yml": vllm,
    }


def _requirements(files: ReleaseFiles) -> list[str]:
    """The release's requirements on the stack the pin sets hold (jax, flax, tpu-inference, vLLM), as declared."""
    out = []
    for line in files.requirements:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) in PINNED:
            out.append(str(req))
    return out


def _github_pins(files: ReleaseFiles) -> list[dict[str, str]]:
    """tpu-inference and vLLM pinned by commit in the release's own dependency files (its post-training extras)."""
    out = []
    for name in sorted(n for n in files.names if n.split("/")[0] in PIN_FOLDERS and n.endswith(".txt")):
        for found in _GITHUB_PIN.finditer(files.text(name) or ""):
            package = canonicalize_name(found["name"])
            sha = _SHA.search(found["url"])
            if package in PINNED and sha:
                out.append({"package": package, "commit": sha.group(0), "url": found["url"], "file": name})
    return out
