"""Fault injection into MaxText's own `Attention.forward_serve_vllm` (the native vLLM path of 0.2.x).

The method returns (kv_cache, out) in 0.2.0/0.2.1 and (out, kv_cache) from 0.2.2 on; a fault must keep the
release's order or the layer would unpack the output as the cache. The cache is the element shaped like
the cache the method was given (the output is shaped like the query)."""

from __future__ import annotations

from typing import Any


def _shaped_like(a: Any, b: Any) -> bool:
    import jax

    sa, sb = jax.tree.structure(a), jax.tree.structure(b)
    return sa == sb and all(
        getattr(x, "shape", None) == getattr(y, "shape", None)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def replace_returned_cache(attention_cls: Any, mocker: Any, replacement: Any) -> None:
    """Patch `attention_cls.forward_serve_vllm` so the cache it returns is `replacement(given_cache)`."""
    original = attention_cls.forward_serve_vllm

    def faulty(self, query, key, value, rpa_kv_cache=None, rpa_metadata=None):
        result = original(self, query, key, value, rpa_kv_cache=rpa_kv_cache, rpa_metadata=rpa_metadata)
        is_cache = [_shaped_like(r, rpa_kv_cache) for r in result]
        if is_cache.count(True) != 1:
            raise AssertionError(f"cannot tell the cache from the output in {[type(r) for r in result]}")
        return tuple(replacement(rpa_kv_cache) if c else r for r, c in zip(result, is_cache, strict=True))

    mocker.patch.object(attention_cls, "forward_serve_vllm", faulty)
