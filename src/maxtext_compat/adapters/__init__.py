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

from typing import TYPE_CHECKING

from maxtext_compat._lazy import lazy_face

if TYPE_CHECKING:
    from maxtext_compat.adapters.wrapper import adapted_class, wrap
    from maxtext_compat.convention.callers import caller_convention, set_caller_convention
    from maxtext_compat.convention.policy import set_deprecation_policy, set_strict, strict_mode
    from maxtext_compat.errors import ConventionMismatchError, KVCacheNotUpdatedError, OldConventionError

# name -> where it lives, relative to maxtext_compat (the face reaches the convention core and errors too)
_EXPORTS = {
    "wrap": "adapters.wrapper",
    "adapted_class": "adapters.wrapper",
    "caller_convention": "convention.callers",
    "set_caller_convention": "convention.callers",
    "set_deprecation_policy": "convention.policy",
    "set_strict": "convention.policy",
    "strict_mode": "convention.policy",
    "ConventionMismatchError": "errors",
    "KVCacheNotUpdatedError": "errors",
    "OldConventionError": "errors",
}

__all__ = [
    "ConventionMismatchError",
    "KVCacheNotUpdatedError",
    "OldConventionError",
    "adapted_class",
    "caller_convention",
    "set_caller_convention",
    "set_deprecation_policy",
    "set_strict",
    "strict_mode",
    "wrap",
]
__getattr__, __dir__ = lazy_face("maxtext_compat", _EXPORTS, face=__name__)
