"""What a shim declares: `PatchSpec` (a target and how to wrap it), `Original`, signature sources."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from maxtext_compat.contract import checked
from maxtext_compat.errors import InvalidArgumentError

WrapperFunction = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
WrapperFactory = Callable[["Original"], WrapperFunction]
SignatureSource = inspect.Signature | Callable[[Callable[..., Any]], inspect.Signature]


@checked
@dataclass(frozen=True)
class PatchSpec:
    """One target of a profile and how to wrap it.

    factory: called at install with the resolved `Original`; returns a wrapt-style wrapper
        `wrapper(wrapped, instance, args, kwargs)`. A factory (not a bare wrapper) lets a shim
        look at the installed original, e.g. whether it already accepts `kv_cache`.
    signature: what `inspect.signature` shows for the patched callable: an `inspect.Signature`
        or a function of the original callable returning one (see `add_keyword_params`).
        None keeps the original's signature.
    aliases: module names whose globals are swept for other references to the original
        (`from x import f`); "pkg" covers pkg and pkg.*, "*" covers every module. None means
        the target's top-level package for module functions and nothing for class attributes
        (a class-dict patch is already seen through every alias of the class).
    origin: what `doctor` shows as the replacement; defaults to the factory's dotted name.

    >>> import sys, types
    >>> from maxtext_compat import shims
    >>> greetings = sys.modules.setdefault("greetings", types.ModuleType("greetings"))  # a module to patch
    >>> exec("def greet(name):\\n    return 'hello ' + name", greetings.__dict__)
    >>> def louder(original):  # a factory: gets the Original, returns a wrapt-style wrapper
    ...     return lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs).upper()
    >>> shims.register_profile("louder", lambda: [shims.PatchSpec("greetings:greet", louder)], replace=True)
    >>> spec = shims.PatchSpec("greetings:greet", louder, signature=shims.add_keyword_params("loud"))
    >>> spec.module, spec.describe_origin().endswith("louder")
    ('greetings', True)
    >>> shims.unregister_profile("louder")
    """

    target: str
    factory: WrapperFactory
    signature: SignatureSource | None = None
    aliases: tuple[str, ...] | list[str] | None = None  # kept as a tuple
    origin: str | None = None

    def __post_init__(self) -> None:
        parse_target(self.target)
        if not callable(self.factory):
            raise InvalidArgumentError(
                "PatchSpec.factory must be callable",
                argument=f"PatchSpec({self.target!r}).factory",
                expected="a function taking an Original and returning wrapper(wrapped, instance, args, kwargs)",
                found=type(self.factory).__name__,
                fix="pass the wrapper factory function",
            )
        if self.signature is not None and not (
            isinstance(self.signature, inspect.Signature) or callable(self.signature)
        ):
            raise InvalidArgumentError(
                "PatchSpec.signature must be an inspect.Signature or a callable returning one",
                argument=f"PatchSpec({self.target!r}).signature",
                expected="inspect.Signature | Callable[[original], inspect.Signature] | None",
                found=type(self.signature).__name__,
                fix="use add_keyword_params(...) or inspect.signature(prototype)",
            )
        if self.aliases is not None and not isinstance(self.aliases, str):
            object.__setattr__(self, "aliases", tuple(self.aliases))  # lists welcome; kept hashable
        if self.aliases is not None and (
            isinstance(self.aliases, str) or not all(isinstance(a, str) and a for a in self.aliases)
        ):
            raise InvalidArgumentError(
                "PatchSpec.aliases must be a tuple of module names",
                argument=f"PatchSpec({self.target!r}).aliases",
                expected='a tuple such as ("maxtext", "tpu_inference.models") or ("*",)',
                found=repr(self.aliases),
                fix="wrap a single module name in a tuple",
            )

    @property
    def module(self) -> str:
        return parse_target(self.target)[0]

    def describe_origin(self) -> str:
        if self.origin:
            return self.origin
        mod = getattr(self.factory, "__module__", None) or "?"
        name = getattr(self.factory, "__qualname__", None) or type(self.factory).__qualname__
        return f"{mod}.{name}"


TargetKind = Literal["function", "method", "staticmethod", "classmethod", "callable"]


@checked
class Original(NamedTuple):
    """What a factory gets: the resolved target before patching (immutable).

    >>> import sys, types
    >>> from maxtext_compat import shims
    >>> greetings = sys.modules.setdefault("greetings", types.ModuleType("greetings"))
    >>> exec("def greet(name):\\n    return 'hello ' + name", greetings.__dict__)
    >>> def show(original):
    ...     print(original.target, original.kind, original.attribute)
    ...     return lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs)
    >>> shims.register_profile("show", lambda: [shims.PatchSpec("greetings:greet", show)], replace=True)
    >>> with shims.patched("show"):
    ...     pass
    greetings:greet function greet
    >>> shims.unregister_profile("show")
    """

    target: str
    profile: str
    owner: Any  # the module or class the patch is written to
    attribute: str
    raw: Any  # the raw dict entry: function, staticmethod, classmethod, or a wrapper beneath us
    function: Callable[..., Any]  # raw without its staticmethod/classmethod descriptor
    kind: TargetKind
    defined_in: Any  # the module or class whose __dict__ holds raw (differs from owner when inherited)


@checked
def add_keyword_params(*names: str, default: Any = None) -> Callable[[Callable[..., Any]], inspect.Signature]:
    """A signature source that adds keyword-only parameters the original lacks.

    Why: vLLM's `supports_kw` and tpu-inference's `_validate_model_interface` read
    `inspect.signature`; a wrapper that accepts `kv_cache` must also show it. Parameters
    go before `**kwargs` when there is one; names already present are left as they are.

    >>> from maxtext_compat.shims import add_keyword_params
    >>> def attention(x, *, model_mode="train", **kwargs):
    ...     return x
    >>> print(add_keyword_params("kv_cache", "attention_metadata")(attention))
    (x, *, model_mode='train', kv_cache=None, attention_metadata=None, **kwargs)
    """
    for n in names:
        if not n.isidentifier():
            raise InvalidArgumentError(
                "add_keyword_params needs parameter names",
                argument="add_keyword_params",
                expected="identifiers such as 'kv_cache'",
                found=repr(n),
                fix="pass valid Python identifiers",
            )

    def source(fn: Callable[..., Any]) -> inspect.Signature:
        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        rest = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        added = [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=default)
            for n in names
            if n not in sig.parameters
        ]
        return sig.replace(parameters=rest + added + var_kw)

    source.__qualname__ = f"add_keyword_params{names}"
    return source


@functools.lru_cache(maxsize=1024)
def parse_target(target: str) -> tuple[str, tuple[str, ...]]:
    module, sep, path = target.partition(":") if isinstance(target, str) else ("", "", "")
    parts = tuple(path.split(".")) if path else ()
    if not sep or not module or not parts or not all(p.isidentifier() for p in (*module.split("."), *parts)):
        raise InvalidArgumentError(
            "a patch target must name a module and an attribute",
            argument="PatchSpec.target",
            expected='"module.path:function" or "module.path:Class.attribute"',
            found=repr(target),
            fix="separate the module from the attribute path with one ':'",
        )
    return module, parts
