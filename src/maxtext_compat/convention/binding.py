"""A call's arguments bound to the advertised signature at the speed of a Python call.

Why generated: binding with `inspect.Signature.bind` cost ~8 µs of the adapter's ~25 µs per eager call
(profiled: benchmarks/bench_eager.py), and the signature is the same for every call of a class. A function
with exactly the advertised parameters lets the interpreter bind them; every parameter defaults to a
sentinel, so what comes back is what the caller passed (as `bound.arguments` is: `kv_cache=None` is named,
a missing kv_cache is not). A call the function cannot bind is bound again by `inspect`, whose message the
typed error carries (translate.bind), so the refusals read as before.
"""

from __future__ import annotations

import functools
import inspect
import keyword
from collections.abc import Callable
from typing import Any

_UNSET = object()  # a parameter the caller did not pass
_RESERVED = ("_mc_u", "_mc_d", "_mc_kv", "_mc_md", "_mc_old", "_mc_new")  # the generated function's own names
# What a generated function depends on: each parameter's name, kind and whether it has a default (never the
# default's value: every default is the sentinel). Shims build a rule per patched class on every install, so the
# functions are compiled once per shape, not once per install (compile was a third of an install's time).
_Shape = tuple[tuple[str, inspect._ParameterKind, bool], ...]


def _shape(advertised: inspect.Signature) -> _Shape:
    return tuple((p.name, p.kind, p.default is inspect.Parameter.empty) for p in advertised.parameters.values())


def make_binder(advertised: inspect.Signature) -> Callable[..., dict[str, Any]] | None:
    """`binder(*args, **kwargs)` -> {name: value} of the parameters passed (a `**` parameter's contents merged);
    None for a signature it does not handle (positional-only or `*args` parameters: inspect binds those)."""
    return _binder(_shape(advertised))


@functools.cache
def _binder(shape: _Shape) -> Callable[..., dict[str, Any]] | None:
    params = [_Param(name, kind, required) for name, kind, required in shape]
    P = inspect.Parameter
    if any(p.kind in (P.POSITIONAL_ONLY, P.VAR_POSITIONAL) for p in params):
        return None
    if any(not p.name.isidentifier() or keyword.iskeyword(p.name) or p.name in _RESERVED for p in params):
        return None
    head: list[str] = []
    body: list[str] = []
    star = False
    for p in params:
        if p.kind is P.VAR_KEYWORD:
            head.append(f"**{p.name}")
            body.append(f"    _mc_d.update({p.name})")
            continue
        if p.kind is P.KEYWORD_ONLY and not star:
            head.append("*")
            star = True
        if p.required:
            head.append(p.name)
            body.append(f"    _mc_d[{p.name!r}] = {p.name}")
        else:
            head.append(f"{p.name}=_mc_u")
            body.append(f"    if {p.name} is not _mc_u:\n        _mc_d[{p.name!r}] = {p.name}")
    source = f"def bind({', '.join(head)}):\n    _mc_d = {{}}\n" + "\n".join(body) + "\n    return _mc_d\n"
    namespace: dict[str, Any] = {"_mc_u": _UNSET}
    exec(compile(source, f"<maxtext_compat binder ({', '.join(head)})>", "exec"), namespace)
    return namespace["bind"]  # type: ignore[no-any-return]


class _Param:
    """The parts of an inspect.Parameter a generated function depends on."""

    __slots__ = ("kind", "name", "required")

    def __init__(self, name: str, kind: inspect._ParameterKind, required: bool) -> None:
        self.name, self.kind, self.required = name, kind, required


OLD, NEW = "old", "new"


def make_fast_call(
    advertised: inspect.Signature, native_names: frozenset[str], new_params: tuple[str, str]
) -> Callable[..., tuple[Any, ...] | None] | None:
    """The common calls, bound and translated in one step: `fast(*args, **kwargs)` ->

    - (OLD, native kwargs) for a call naming no KV argument,
    - (NEW, native kwargs, kv, metadata) for one naming either (the kwargs hold them when the release takes them),

    when every argument is the release's own (one it lacks may be passed as None: dropped); else None, and the
    Translator takes the call (a value to translate or refuse). None when a `**` parameter makes the answer
    depend on more than the names (the Translator then takes every call)."""
    return _fast_call(_shape(advertised), frozenset(native_names), tuple(new_params))  # type: ignore[arg-type]


@functools.cache
def _fast_call(
    shape: _Shape, native_names: frozenset[str], new_params: tuple[str, str]
) -> Callable[..., tuple[Any, ...] | None] | None:
    params = [_Param(name, kind, required) for name, kind, required in shape]
    P = inspect.Parameter
    if _binder(shape) is None or any(p.kind is P.VAR_KEYWORD for p in params):
        return None
    kv_name, md_name = new_params
    takes_kv = kv_name in native_names
    head: list[str] = []
    body = ["    _mc_d = {}"]
    star = False
    for p in params:
        if p.kind is P.KEYWORD_ONLY and not star:
            head.append("*")
            star = True
        head.append(p.name if p.required else f"{p.name}=_mc_u")
        if p.name in new_params:
            continue
        if p.name not in native_names:  # the release lacks it: None is dropped, a value needs the translator
            body.append(f"    if {p.name} is not _mc_u and {p.name} is not None:\n        return None")
        elif p.required:
            body.append(f"    _mc_d[{p.name!r}] = {p.name}")
        else:
            body.append(f"    if {p.name} is not _mc_u:\n        _mc_d[{p.name!r}] = {p.name}")
    names = {p.name for p in params}
    if kv_name in names and md_name in names:
        new = ["    _mc_kv = None if {kv} is _mc_u else {kv}", "    _mc_md = None if {md} is _mc_u else {md}"]
        if takes_kv:
            new += ["    _mc_d[{kv!r}] = _mc_kv", "    _mc_d[{md!r}] = _mc_md"]
        lines = [
            "    if {kv} is not _mc_u or {md} is not _mc_u:",
            *("    " + line for line in new),
            "        return (_mc_new, _mc_d, _mc_kv, _mc_md)",
        ]
        body += [line.format(kv=kv_name, md=md_name) for line in lines]
    body.append("    return (_mc_old, _mc_d)")
    source = f"def fast_call({', '.join(head)}):\n" + "\n".join(body) + "\n"
    namespace: dict[str, Any] = {"_mc_u": _UNSET, "_mc_old": OLD, "_mc_new": NEW}
    exec(compile(source, f"<maxtext_compat call ({', '.join(head)})>", "exec"), namespace)
    return namespace["fast_call"]  # type: ignore[no-any-return]
