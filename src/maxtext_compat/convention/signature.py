"""The signatures adapters advertise: the installed release's own, plus every release's extras.

Why a union: old callers pass parameters later releases dropped (`page_state`), new callers
pass parameters old releases never had (`kv_cache`, `out_sharding`). The adapter accepts
both, translates what it can and rejects the rest with a typed error. Introspecting
consumers (tpu-inference's `supports_kw`) must see `kv_cache` / `attention_metadata`, so
the union is also what `inspect.signature` reports.
"""

from __future__ import annotations

import inspect
from typing import Any

from maxtext_compat.convention.kinds import KINDS


def native_signature(fn: Any) -> inspect.Signature:
    """Signature of an unbound `__call__` without `self`."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


def kind_from_signature(sig: inspect.Signature) -> str | None:
    """The kind whose leading positional parameters `sig` starts with (None: not a MaxText layer)."""
    names = list(sig.parameters)
    for k in KINDS.values():
        if names[: len(k.markers)] == list(k.markers):
            return k.name
    return None


def advertised_signature(native: inspect.Signature, kind: str) -> inspect.Signature:
    """The native parameters as they are, then the union's missing ones as keyword-only `= None`."""
    params = list(native.parameters.values())
    var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    positional = [p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    slots = KINDS[kind].positional_slots
    for i, name in enumerate(slots):
        if name not in positional and positional[:i] == list(slots[:i]):
            # e.g. out_sharding, Attention's 5th positional parameter from 0.2.0 on: keep the slot on 0.1.0
            params.insert(i, inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))
            positional.insert(i, name)
    have = {p.name for p in params}
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None)
        for name in KINDS[kind].union_params
        if name not in have
    ]
    return native.replace(parameters=[*params, *extra, *var_kw])
