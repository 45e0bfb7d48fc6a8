"""The generated binders and fast calls are compiled once per signature shape (names, kinds, which have a default),
and a shape's function binds every signature of that shape as `inspect.Signature.bind` does."""

from __future__ import annotations

import inspect

from hypothesis import given
from hypothesis import strategies as st

from maxtext_compat.convention.binding import NEW, OLD, make_binder, make_fast_call

P = inspect.Parameter


def _sig(defaults: tuple[object, object]) -> inspect.Signature:
    return inspect.Signature([P("x", P.POSITIONAL_OR_KEYWORD), P("mode", P.POSITIONAL_OR_KEYWORD, default=defaults[0]),
                              P("kv_cache", P.KEYWORD_ONLY, default=defaults[1]),
                              P("attention_metadata", P.KEYWORD_ONLY, default=None)])  # fmt: skip


def test_one_function_per_shape_whatever_the_defaults() -> None:
    a, b = _sig(("train", None)), _sig(("decode", 0))
    assert make_binder(a) is make_binder(b)
    names = frozenset({"x", "mode", "kv_cache", "attention_metadata"})
    pair = ("kv_cache", "attention_metadata")
    assert make_fast_call(a, names, pair) is make_fast_call(b, names, pair)
    assert make_fast_call(a, names - {"kv_cache", "attention_metadata"}, pair) is not make_fast_call(a, names, pair)


@given(x=st.integers(), mode=st.none() | st.text(max_size=3), pass_mode=st.booleans(), kv=st.none() | st.integers(),
       pass_kv=st.booleans())  # fmt: skip
def test_a_shared_binder_binds_as_inspect_does(x, mode, pass_mode, kv, pass_kv) -> None:
    kwargs = {**({"mode": mode} if pass_mode else {}), **({"kv_cache": kv} if pass_kv else {})}
    for sig in (_sig(("train", None)), _sig(("decode", 7))):
        assert make_binder(sig)(x, **kwargs) == dict(sig.bind(x, **kwargs).arguments)  # type: ignore[misc]
        fast = make_fast_call(sig, frozenset({"x", "mode"}), ("kv_cache", "attention_metadata"))
        out = fast(x, **kwargs)  # type: ignore[misc]
        assert out[0] == (NEW if pass_kv else OLD) and out[1] == {"x": x, **({"mode": mode} if pass_mode else {})}
