"""A new-convention call on a release without the vLLM path: run it inside a KV session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from maxtext_compat import names
from maxtext_compat.backport.attention import rpa_mesh_for
from maxtext_compat.backport.session import kv_session
from maxtext_compat.convention.kinds import KINDS
from maxtext_compat.convention.translate import Translated, describe
from maxtext_compat.errors import BackportError
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.resolution.installed_kernel import installed_rpa


def backport_call(
    module: Any,
    native_call: Callable[..., Any],
    kind: str,
    row: MaxTextRow,
    t: Translated,
    writes: bool,
    where: str,
    ensure_hooks: Callable[[MaxTextRow], None],
) -> Any:
    """Run the native old call (`native_call(module, kwargs)`) with attention routed to RPA; `ensure_hooks(row)`
    installs the hooks the session routes through (`shims.backport_hooks`), a dict read once they are.

    Returns the new convention.
    writes=False (train mode) follows MaxText 0.2.x: no RPA, the caches come back as given.
    """
    if writes:  # the call rule checked the caches and the metadata (write_path, paged.guard)
        installed_rpa()  # typed error up front when there is no tpu-inference (and so no kernel)
    ensure_hooks(row)
    k = KINDS[kind]
    caches = k.caches(t.kv)
    if not writes and not k.is_model:
        # Nothing to route and nothing to record (only the Transformer's return needs the session's hidden
        # state): no session, so such calls also nest, e.g. inside a moved Transformer's Decoder call.
        kv_back = None if t.kv is None else caches if k.per_layer else t.kv
        return k.new_shape(row, native_call(module, t.kwargs), kv_back, where)
    mesh = getattr(module, "mesh", None)
    if writes and mesh is None:
        raise BackportError(
            f"{where} has no mesh to run ragged paged attention on",
            argument="mesh",
            fix="construct the MaxText module with mesh=<the device mesh it runs on> before a new call",
        )
    rpa_mesh = rpa_mesh_for(mesh) if writes else None
    kwargs = t.kwargs
    if writes and k.runs_kernel:
        # The attention op runs RPA; the layer itself runs in train mode so MaxText's own KV-cache
        # variables are neither read nor written (0.2.x skips them the same way in vLLM mode). Set
        # here, not only by the backport hook: the vllm-backport shim calls the original method.
        kwargs = {**kwargs, "model_mode": names.TRAIN}
    with kv_session(caches, t.metadata, rpa_mesh, where, route=writes) as session:
        result = native_call(module, kwargs)
        if writes:
            session.check_complete()
    updated = session.updated if writes else caches
    kv_out = updated if k.per_layer else updated[0]
    if t.kv is None:
        kv_out = None  # a new call without a cache gets None back, as MaxText 0.2.x returns it
    if k.is_model:
        return session.hidden, kv_out
    return k.new_shape(row, result, kv_out, where)


def inner_call(
    kind: str, row: MaxTextRow, call: Callable[..., Any], args: tuple, kwargs: dict[str, Any], where: str
) -> Any:
    """A call MaxText makes inside a backported step: its own convention, attention in train mode.

    Train mode: MaxText's own KV-cache variables are skipped (0.2.x skips them the same way); the step's
    session routes the attention op. A call that names the KV arguments (code moved by `maxtext-compat
    migrate` passes `kv_cache=None, attention_metadata=None`) gets the new return with no cache: the session
    holds every layer's cache, so a cache passed here would be a second, conflicting one.
    """
    k = KINDS[kind]
    kv_name = k.kv_name
    named = {n: kwargs[n] for n in (kv_name, "attention_metadata") if n in kwargs}
    held = [n for n, v in named.items() if v is not None]
    if held or (named and k.is_model):
        raise BackportError(
            f"{where} was called with {held[0] if held else kv_name}= inside a backported vLLM step",
            argument=held[0] if held else kv_name,
            expected="None: the step's KV session hands each layer its cache",
            found=describe(named[held[0]]) if held else "a Transformer called inside a Transformer's step",
            fix="pass the caches once, to the outermost call (the Transformer's kv_caches=); inner calls take none",
        )
    rest = {k: v for k, v in kwargs.items() if k not in named}
    if k.runs_kernel:
        rest["model_mode"] = names.TRAIN
    result = call(*args, **rest)
    return k.new_shape(row, result, None, where) if named else result
