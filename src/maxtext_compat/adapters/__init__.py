"""Wrapper classes that keep MaxText's old signatures and add the kv_cache/attention_metadata path.

    from maxtext_compat.adapters import wrap
    attn = wrap(attention)                      # an instance or a class, any release
    out = attn(x, x, pos, seg, model_mode="train")                                  # old call
    out, kv_cache = attn(x, x, pos, None, model_mode="autoregressive",
                         kv_cache=kv_cache, attention_metadata=md)                 # new call
    attn = wrap(attention, convention="kv_return")   # code that unpacks (out, kv) on every call

Importing this package imports neither jax nor MaxText.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConventionMismatchError",
    "adapted_class",
    "caller_convention",
    "set_caller_convention",
    "set_deprecation_policy",
    "set_strict",
    "strict_mode",
    "wrap",
]


def __getattr__(name: str) -> Any:
    if name in ("wrap", "adapted_class"):
        from maxtext_compat.adapters import wrapper

        return getattr(wrapper, name)
    if name in ("set_deprecation_policy", "set_strict", "strict_mode", "KVCacheNotUpdatedError", "OldConventionError"):
        from maxtext_compat.convention import policy

        return getattr(policy, name)
    if name in ("caller_convention", "set_caller_convention", "ConventionMismatchError"):
        from maxtext_compat.convention import declared as convention

        return getattr(convention, name)
    raise AttributeError(name)
