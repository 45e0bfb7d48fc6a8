"""A new-convention call on a release without the vLLM path: run it inside a KV session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from maxtext_compat.adapters.translate import Translated, check_kv_writes
from maxtext_compat.backport import hooks
from maxtext_compat.backport.attention import rpa_mesh_for
from maxtext_compat.backport.session import BackportError, kv_session
from maxtext_compat.matrix import MaxTextRow


def backport_call(
    module: Any, native_call: Callable[..., Any], kind: str, row: MaxTextRow, t: Translated, writes: bool, where: str
) -> Any:
    """Run the native old call (`native_call(module, **kwargs)`) with attention routed to RPA.

    Returns the new convention.
    writes=False (train mode) follows MaxText 0.2.x: no RPA, the caches come back as given.
    """
    if writes:
        from maxtext_compat.rpa import installed_rpa

        installed_rpa()  # typed error up front when there is no tpu-inference (and so no kernel)
        check_kv_writes(kind, t, where)
    hooks.ensure_installed(row)
    many = kind in ("decoder", "transformer")
    caches = list(t.kv) if many and t.kv is not None else [t.kv]
    mesh = getattr(module, "mesh", None)
    if writes and mesh is None:
        raise BackportError(
            f"{where} has no mesh to run ragged paged attention on",
            argument="mesh",
            fix="construct the MaxText module with mesh=<the device mesh it runs on> before a new call",
        )
    rpa_mesh = rpa_mesh_for(mesh) if writes else None
    kwargs = t.kwargs
    if writes and kind == "attention":
        # The attention op runs RPA; the layer itself runs in train mode so MaxText's own KV-cache
        # variables are neither read nor written (0.2.x skips them the same way in vLLM mode). Set
        # here, not only by the backport hook: the vllm-backport shim calls the original method.
        kwargs = {**kwargs, "model_mode": hooks.TRAIN}
    with kv_session(caches, t.metadata, rpa_mesh, where, route=writes) as session:
        result = native_call(module, **kwargs)
        if writes:
            session.check_complete()
    updated = session.updated if writes else caches
    kv_out = updated if many else updated[0]
    if t.kv is None:
        kv_out = None  # a new call without a cache gets None back, as MaxText 0.2.x returns it
    if kind == "attention":
        return result, kv_out
    if kind == "decoder_layer":
        y = result[0] if isinstance(result, tuple) else result
        return y, kv_out
    if kind == "decoder":
        return result[0], result[1], kv_out
    return session.hidden, kv_out
