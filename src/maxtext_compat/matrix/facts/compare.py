"""A matrix row's code facts in the shape `facts` reads them, and the keys on which two sets of facts differ.

Why here: the suite checks `facts` against every shipped row, and the resolver matches an editable or forked
MaxText to the rows by the same comparison; both must agree on what "the same code facts" means.
"""

from __future__ import annotations

from typing import Any

from maxtext_compat.matrix.types import MaxTextRow

# Keys whose lists are sets (a signature's order of optional parameters is not a fact the rows keep).
UNORDERED = ("params.attention", "params.decoder_layer", "params.decoder")


def row_facts(row: MaxTextRow) -> dict[str, Any]:
    """The code facts of a shipped row (dates, pins, defects and prose left out)."""
    v = row.vllm
    return {
        "import_root": row.import_root,
        "convention": row.convention,
        "classes": {k: None if c is None else str(c) for k, c in row.classes.items()},
        "decoder_layers": {k: str(c) for k, c in row.decoder_layers.items()},
        "default_decoder": row.default_decoder,
        "returns": dict(row.returns),
        "params": {
            "attention": sorted(row.params.attention),
            "decoder_layer": sorted(row.params.decoder_layer),
            "decoder": sorted(row.params.decoder),
        },
        "scan_kv_carry": row.scan_kv_carry,
        "scan_kv_carry_layers": list(row.scan_kv_carry_layers),
        "vllm": None
        if v is None
        else {
            "attention_modes": list(v.attention_modes),
            "rpa_module": v.rpa_module,
            "rpa_call_form": v.rpa_call_form,
            "serve_return_order": v.serve_return_order,
            "update_kv_cache_kwarg": v.update_kv_cache_kwarg,
            "adapter": str(v.adapter),
            "adapter_return_arity": v.adapter_return_arity,
            "per_layer_metadata": v.per_layer_metadata,
        },
        "config": {
            "pyconfig": row.config.pyconfig,
            "base_yml": row.config.base_yml,
            "base_yml_in_argv": row.config.base_yml_in_argv,
            "vllm_yml": row.config.vllm_yml,
        },
    }


def flat(facts: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"params": {"attention": [...]}}` -> `{"params.attention": [...]}` (a null section stays one key)."""
    out: dict[str, Any] = {}
    for key, value in facts.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, name + "."))
        else:
            out[name] = sorted(value) if name in UNORDERED and isinstance(value, list) else value
    return out


def differences(found: dict[str, Any], row: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (found, row's)} for every code fact that differs; {} when they agree."""
    a, b = flat(found), flat(row)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
