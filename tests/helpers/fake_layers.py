"""A fake MaxText-like `layers` module (one target of every kind) and a wrapper factory that tags results.

Why shared: the thread-safety and fault-injection tests of the patching core patch the same kinds
of targets (a `__call__`, a staticmethod, a classmethod, an inherited method, a module function)
and tell the patched path from the original one by the tag at the end of the result tuple.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LAYERS_SOURCE = """
class Base:
    def inherited(self, x):
        return ("inherited", x)


class Attention(Base):
    def __call__(self, x, *, decoder_segment_ids=None):
        return ("call", x)

    @staticmethod
    def s(x):
        return ("s", x)

    @classmethod
    def c(cls, x):
        return ("c", x)


def f(x):
    return ("f", x)
"""


def tagger(tag: str) -> Callable[[Any], Callable[..., tuple]]:
    """A PatchSpec factory whose wrapper drops `kv_cache` and appends `tag` to the original's result."""

    def factory(original):
        def wrapper(wrapped, instance, args, kwargs):
            kwargs.pop("kv_cache", None)
            return (*wrapped(*args, **kwargs), tag)

        return wrapper

    return factory
