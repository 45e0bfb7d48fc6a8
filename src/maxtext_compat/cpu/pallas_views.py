"""Teach JAX's Pallas TPU interpreter to read and write refs through reshape/bitcast/transpose views.

Why: tpu-inference's RPA v3 kernel (and the hd64 variant) address the HBM KV cache through
`ref.reshape(...)` (pages merged into one axis for per-page DMAs) and `ref.bitcast(...)`. The
stock TPU interpreter (jax 0.7.2 to 0.12.0.1) turns a ref's transforms into one slice range
and only understands `NDIndexer`, so the kernel dies on CPU with
`AttributeError: 'ReshapeTransform' object has no attribute 'indices'` (RefReshaper before jax 0.9).

How: wrap the interpreter's `get` / `store` / `swap` callbacks (DMAs call their `__wrapped__`
functions, so they are covered too). A transform chain is split at its first view: the
`NDIndexer` prefix goes through the stock path as a plain range, the rest is applied in numpy
with TPU bitcast semantics (packing along the second-minor axis, as
`jax._src.state.utils.bitcast`). A store through a view is a read-modify-write of the prefix.

Limits: private JAX API (re-verify on every jax release; `cpu_rpa` refuses unverified jax);
race detection is not meaningful for view accesses; a view-prefixed DMA copies the whole HBM
buffer, so keep caches test-sized. The interpreter binds these callbacks when a kernel is
traced, which is why the patch must be applied before the first trace.
"""

from __future__ import annotations

import functools
from typing import Any

from maxtext_compat.cpu import pallas_interpreter as interpreter
from maxtext_compat.patching.settings import Setting, attribute_slot, replaced_value
from maxtext_compat.patching.state import ABSENT

PATCHED_NAMES = interpreter.CALLBACKS

MARK = "__maxtext_compat_view__"  # set on our replacement callbacks


def applied() -> bool:
    """Whether the interpreter currently runs through this patch."""
    mod = interpreter.callbacks_module()
    return all(getattr(getattr(mod, n), MARK, False) for n in PATCHED_NAMES)


def settings() -> list[Setting]:
    """The replacement callbacks as engine settings (applied by `cpu_rpa` in its one transaction)."""
    mod = interpreter.callbacks_module()
    originals = {n: getattr(mod, n) for n in PATCHED_NAMES}
    # jax 0.11/0.12: decorated callbacks whose undecorated `__wrapped__` DMAs call, threading a token;
    # jax 0.7-0.10: plain module functions (DMAs call the module's names) without a token.
    raw = {n: getattr(f, "__wrapped__", f) for n, f in originals.items()}
    tokened = _takes_token(raw["get"])
    if not tokened:
        raw = _add_token(raw)
    replacements = {
        "get": _make_get(raw["get"]),
        "store": _make_store(raw["get"], raw["store"]),
        "swap": _make_swap(raw["get"], raw["store"], raw["swap"]),
    }
    if not tokened:
        replacements = _drop_token(replacements)
    decorate = getattr(mod, "fail_on_exception", None)  # the stock callbacks' error reporting, where it exists
    out = []
    for name, inner in replacements.items():
        wrapped = (
            decorate(inner) if decorate is not None else functools.wraps(inner)(lambda *a, _f=inner, **k: _f(*a, **k))
        )
        functools.update_wrapper(wrapped, inner)
        wrapped.__wrapped__ = inner
        setattr(wrapped, MARK, True)
        out.append(Setting(attribute_slot(mod, name, target(name)), wrapped, f"{__name__}.settings"))
    return out


def original(name: str) -> Any:
    """The interpreter's own callback (for tests that check restoration by identity)."""
    before = replaced_value(target(name))
    return getattr(interpreter.callbacks_module(), name) if before is ABSENT else before


def target(name: str) -> str:
    """The ledger name of one patched callback ("<callbacks module>:get")."""
    return f"{interpreter.callbacks_module().__name__}:{name}"


def _takes_token(fn: Any) -> bool:
    import inspect

    return next(iter(inspect.signature(fn).parameters)) == "token"


def _add_token(raw: dict[str, Any]) -> dict[str, Any]:
    """Token-threading views of a tokenless interpreter's callbacks (so one set of wrappers serves both)."""
    get, store, swap = raw["get"], raw["store"], raw["swap"]
    return {
        "get": lambda token, *a, **k: (token, get(*a, **k)),
        "store": lambda token, *a, **k: (store(*a, **k), token)[1],
        "swap": lambda token, *a, **k: (token, swap(*a, **k)),
    }


def _drop_token(replacements: dict[str, Any]) -> dict[str, Any]:
    """The tokenless interpreter's signatures and returns for the wrappers."""
    get, store, swap = replacements["get"], replacements["store"], replacements["swap"]
    return {
        "get": lambda *a, **k: get(None, *a, **k)[1],
        "store": lambda *a, **k: (store(None, *a, **k), None)[1],
        "swap": lambda *a, **k: swap(None, *a, **k)[1],
    }


def _make_get(raw_get: Any) -> Any:
    def get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        prefix, views = _split(transforms)
        token, val = raw_get(token, device_id, local_core_id, memory_space, buffer_id, prefix, *args, **kwargs)
        if views:
            val = _np().array(_forward(_np().asarray(val), views)[0], copy=True)
        return token, val

    return get


def _make_store(raw_get: Any, raw_store: Any) -> Any:
    def store(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, *args, **kwargs):
        prefix, views = _split(transforms)
        if views:
            _, base = raw_get(token, device_id, local_core_id, memory_space, buffer_id, prefix)
            _, chain = _forward(_np().asarray(base), views)
            val = _backward(chain, views, val)
        return raw_store(token, device_id, local_core_id, memory_space, buffer_id, prefix, val, *args, **kwargs)

    return store


def _make_swap(raw_get: Any, raw_store: Any, raw_swap: Any) -> Any:
    def swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask, *, source_info=None):
        prefix, views = _split(transforms)
        if not views:
            return raw_swap(
                token, device_id, local_core_id, memory_space, buffer_id, prefix, val, mask, source_info=source_info
            )
        np = _np()
        _, base = raw_get(token, device_id, local_core_id, memory_space, buffer_id, prefix)
        old, chain = _forward(np.asarray(base), views)
        old = np.array(old, copy=True)
        new_view = np.asarray(val) if mask is None else np.where(np.asarray(mask), np.asarray(val), old)
        raw_store(
            token,
            device_id,
            local_core_id,
            memory_space,
            buffer_id,
            prefix,
            _backward(chain, views, new_view),
            source_info=source_info,
        )
        return token, old

    return swap


# --------------------------------------------------------------------------------------------
# Transform chains in numpy
# --------------------------------------------------------------------------------------------


def _np() -> Any:
    import numpy

    return numpy


# A ref view's class by what it does: jax 0.9 renamed them (RefReshaper -> ReshapeTransform, ...).
VIEW_CLASS_NAMES = {
    "reshape": ("ReshapeTransform", "RefReshaper"),
    "bitcast": ("BitcastTransform", "RefBitcaster"),
    "transpose": ("TransposeTransform", "RefTransposer"),
}


@functools.cache
def _views() -> dict[str, Any]:
    from jax._src.state import types as state_types

    found = {}
    for kind, names in VIEW_CLASS_NAMES.items():
        cls = next((getattr(state_types, n) for n in names if hasattr(state_types, n)), None)
        if cls is None:
            raise NotImplementedError(f"maxtext_compat interpreter view patch: this jax has none of {names}")
        found[kind] = cls
    return found


def _view_types() -> tuple[type, ...]:
    return tuple(_views().values())


def _split(transforms: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(NDIndexer prefix, the rest from the first view on); indices made concrete ints."""
    import jax

    chain = tuple(t for t in (transforms or ()) if t is not None)
    chain = tuple(jax.tree.map(int, chain))
    views = _view_types()
    for i, t in enumerate(chain):
        if isinstance(t, views):
            return chain[:i], chain[i:]
    return chain, ()


def _index_tuple(indexer: Any) -> tuple[Any, ...]:
    from jax._src.state import indexing

    out: list[Any] = []
    for i in indexer.indices:
        if isinstance(i, indexing.Slice):
            start, size, stride = int(i.start), int(i.size), int(i.stride)
            out.append(slice(start, start + size * stride, stride))
        else:
            out.append(int(i))
    return tuple(out)


def _bitcast(x: Any, dtype: Any) -> Any:
    """Bitcast with TPU semantics: narrower types pack along the second-minor axis."""
    np = _np()
    from jax._src import dtypes

    dtype = np.dtype(dtype)
    bits = getattr(dtypes, "itemsize_bits", None) or dtypes.bit_width  # renamed in jax 0.8
    xb, yb = bits(x.dtype), bits(dtype)
    if xb == yb:
        return np.ascontiguousarray(x).view(dtype)
    shape = list(x.shape)
    shape[-2] = shape[-2] * xb // yb
    if xb < yb:  # pack `ratio` consecutive rows into one
        ratio = yb // xb
        x = x.reshape(*x.shape[:-2], x.shape[-2] // ratio, ratio, x.shape[-1]).swapaxes(-1, -2)
        return np.ascontiguousarray(x).view(dtype).reshape(shape)
    ratio = xb // yb  # unpack
    y = np.ascontiguousarray(x).view(dtype).reshape(*x.shape, ratio)
    return np.ascontiguousarray(y.swapaxes(-1, -2)).reshape(shape)


def _forward(x: Any, chain: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    """Apply the chain; also return every intermediate (the write path walks them back)."""
    np = _np()
    from jax._src.state import indexing

    view = _views()
    steps = [x]
    for t in chain:
        if isinstance(t, indexing.NDIndexer):
            x = x[_index_tuple(t)]
        elif isinstance(t, view["reshape"]):
            x = np.reshape(x, t.shape)
        elif isinstance(t, view["bitcast"]):
            x = _bitcast(x, t.dtype)
        elif isinstance(t, view["transpose"]):
            x = np.transpose(x, t.permutation)
        else:
            raise NotImplementedError(f"maxtext_compat interpreter view patch: unsupported ref transform {t!r}")
        steps.append(x)
    return x, steps


def _backward(steps: list[Any], chain: tuple[Any, ...], val: Any) -> Any:
    """Write `val` through the chain's view; returns the new value of the chain's base."""
    np = _np()
    from jax._src.state import indexing

    view = _views()
    new = np.asarray(val)
    for base, t in reversed(list(zip(steps[:-1], chain, strict=True))):
        if isinstance(t, indexing.NDIndexer):
            full = np.array(base, copy=True)
            full[_index_tuple(t)] = new
            new = full
        elif isinstance(t, view["reshape"]):
            new = np.reshape(new, base.shape)
        elif isinstance(t, view["bitcast"]):
            new = _bitcast(new, base.dtype)
        elif isinstance(t, view["transpose"]):
            new = np.transpose(new, np.argsort(t.permutation))
    return new
