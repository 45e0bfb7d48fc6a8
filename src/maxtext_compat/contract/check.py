"""`@checked`: a public callable's arguments validated against its type hints by beartype, errors made ours.

Why beartype (the numbers are in docs/api-contract.md): it checks without converting or copying (the callee
receives the caller's own arrays, modules and lists, where pydantic's validate_call builds new containers),
takes value rules in `Annotated` (contract.rules turns ours into its validators), is pure Python, and costs
about a microsecond per call. Its import costs ~250 ms, so nothing imports it until a checked callable is
first called (`import maxtext_compat` and the package faces stay light).

What a caller sees is never beartype's exception: a wrong type is an InvalidArgumentTypeError, a broken value
rule an InvalidArgumentError, a call that does not fit the signature an InvalidArgumentTypeError naming the
signature; each names the argument, the expected and the found value, and the fix. The culprit is found
again on the error path only, by checking each argument alone (no message parsing).
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from maxtext_compat._lazy import ON_FIRST_CALL
from maxtext_compat.contract import words
from maxtext_compat.contract.hints import Culprit, conf, explain, to_beartype
from maxtext_compat.contract.rules import LAZY_TYPES
from maxtext_compat.errors import CompatError, InvalidArgumentError, InvalidArgumentTypeError, ParamViolation
from maxtext_compat.locks import fork_safe_lock

F = TypeVar("F")
CONTRACT_ATTR = "__mc_contract__"


class _Names(dict):  # type: ignore[type-arg]
    """Local names for evaluating a string annotation: the TYPE_CHECKING-only ones resolve lazily."""

    def __missing__(self, key: str) -> Any:
        if key in LAZY_TYPES:
            return LAZY_TYPES[key].hint()
        raise KeyError(key)


class Contract:
    """One checked callable: its resolved hints, its beartype checker (built on first call), its errors."""

    def __init__(self, fn: Callable[..., Any], fixes: Mapping[str, str], module: str | None = None) -> None:
        self.fn = fn
        self.fixes = dict(fixes)
        self.module = module or fn.__module__  # a class's members: the class's (a NamedTuple's __new__ has none)
        self.signature = inspect.signature(fn)
        self._hints: dict[str, Any] | None = None
        self._lock = fork_safe_lock()

    @property
    def where(self) -> str:
        name = self.fn.__qualname__
        return name.removesuffix(".__init__") if name.endswith(".__init__") else name

    def hints(self) -> dict[str, Any]:
        """Parameter name -> its hint (string annotations evaluated; TYPE_CHECKING-only names made lazy)."""
        if self._hints is None:
            module = sys.modules.get(self.module)
            namespace = vars(module) if module is not None else getattr(self.fn, "__globals__", {})
            hints = {}
            for name, p in self.signature.parameters.items():
                if p.annotation is inspect.Parameter.empty:
                    continue
                hint = p.annotation
                if isinstance(hint, typing.ForwardRef):  # typing.NamedTuple keeps its fields' strings so
                    hint = hint.__forward_arg__
                if isinstance(hint, str):
                    hint = eval(hint, dict(namespace), _Names())  # our own annotations, in our own module
                hints[name] = hint
            self._hints = hints
        return self._hints

    def compile(self) -> Callable[..., Any]:
        """The callable that checks every argument, then runs the function (beartype over a copy of it)."""
        import beartype

        checked = {n: to_beartype(h) for n, h in self.hints().items() if h is not Any}
        if not checked:
            return self.fn
        fn = self.fn
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
            return self._eager(checked)  # beartype would check at the first next(): too late
        copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__qualname__, copy.__module__ = fn.__qualname__, fn.__module__
        copy.__annotations__ = checked  # no return hint: the contract is about what callers pass
        return beartype.beartype(conf=conf())(copy)  # type: ignore[no-any-return]

    def _eager(self, checked: dict[str, Any]) -> Callable[..., Any]:
        """A checker that runs before a generator (a contextmanager's body) is even created."""
        from beartype.door import is_bearable

        fn, signature, c = self.fn, self.signature, conf()
        kinds = {n: p.kind for n, p in signature.parameters.items()}

        def check_then_call(*args: Any, **kwargs: Any) -> Any:
            for name, value in signature.bind(*args, **kwargs).arguments.items():
                hint = checked.get(name)
                if hint is None:
                    continue
                items = (
                    value.values()
                    if kinds[name] is inspect.Parameter.VAR_KEYWORD
                    else value
                    if kinds[name] is inspect.Parameter.VAR_POSITIONAL
                    else (value,)
                )
                if not all(is_bearable(v, hint, conf=c) for v in items):
                    raise ParamViolation(f"{self.where}: {name}")
            return fn(*args, **kwargs)

        return check_then_call

    # -- errors (the error path only) -------------------------------------------------------------

    def error(self, args: tuple[Any, ...], kwargs: dict[str, Any], violation: BaseException) -> CompatError:
        """The typed error for the first argument, in signature order, that its hint refuses."""
        bound = self.signature.bind_partial(*args, **kwargs)
        hints = self.hints()
        for name, value in bound.arguments.items():
            hint = hints.get(name, Any)
            if hint is Any:
                continue
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                items = list(value.items())
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                items = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
            else:
                items = [(name, value)]
            for label, item in items:
                culprit = explain(item, hint, label)
                if culprit is not None:
                    return self._typed(name, culprit)
        return InvalidArgumentTypeError(  # not expected: beartype refused what each hint alone accepts
            f"{self.where}: an argument does not fit the signature",
            argument="arguments",
            expected=self.shown_signature(),
            found=str(violation).splitlines()[0],
            fix="pass the arguments as the signature above types them",
        )

    def _typed(self, name: str, culprit: Culprit) -> CompatError:
        label, hint, value, rule = culprit
        want = words.expected(hint) if rule is None else rule.expected
        fix = self.fixes.get(name) or (words.type_fix(label, hint, value) if rule is None else rule.fix_for(label))
        if rule is None or rule.is_type:
            return InvalidArgumentTypeError(
                f"{self.where}: {label} has the wrong type",
                argument=label,
                expected=want,
                found=words.found(value),
                fix=fix,
            )
        return InvalidArgumentError(
            f"{self.where}: {label} has a value it cannot take",
            argument=label,
            expected=want,
            found=words.found(value),
            fix=fix,
        )

    def shown_signature(self) -> str:
        """`where(a, b=1, *, c=None)`: the parameters a caller passes, without annotations or self."""
        params = [
            p.replace(annotation=inspect.Parameter.empty)
            for p in self.signature.parameters.values()
            if not (p.name == "self" and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
        return f"{self.where}{self.signature.replace(parameters=params, return_annotation=inspect.Signature.empty)}"

    def arity_error(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CompatError | None:
        """The typed error for a call that does not fit the signature (None: it fits, the TypeError is the body's)."""
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            shown = [a for a in args if not _is_self(a, self.fn)]
            return InvalidArgumentTypeError(
                f"the call does not fit {self.where}: {exc}",
                argument="arguments",
                expected=self.shown_signature(),
                found=f"{len(shown)} positional argument(s) and keywords {sorted(kwargs)}",
                fix="pass the arguments as the signature above names them (by keyword where it says so)",
            )
        return None


def _is_self(value: Any, fn: Callable[..., Any]) -> bool:
    owner = fn.__qualname__.rpartition(".")[0]
    return bool(owner) and type(value).__qualname__ == owner


def _wrap(fn: Callable[..., Any], fixes: Mapping[str, str], module: str | None = None) -> Callable[..., Any]:
    contract = Contract(fn, fixes, module)
    checker: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal checker
        if checker is None:
            with contract._lock:
                checker = contract.compile()
        try:
            return checker(*args, **kwargs)
        except ParamViolation as exc:
            raise contract.error(args, kwargs, exc) from None
        except CompatError:
            raise
        except TypeError:
            err = contract.arity_error(args, kwargs)
            if err is None:
                raise
            raise err from None

    setattr(wrapper, CONTRACT_ATTR, contract)
    return wrapper


def takes_arguments(fn: Callable[..., Any], *, method: bool) -> bool:
    """Whether a user passes `fn` anything (a method's self does not count)."""
    params = list(inspect.signature(fn).parameters.values())
    return len(params) > (1 if method else 0)


def checked(obj: F | None = None, /, *, fixes: Mapping[str, str] | None = None) -> Any:
    """Validate every argument of a function, or of a class's constructor and public methods, at each call.

    fixes: argument name -> the fix to print for it (else the rule's, else one generated from the hint).
    """
    if obj is None:
        return lambda o: checked(o, fixes=fixes)
    fixes = fixes or {}
    if isinstance(obj, type):
        for name, member in list(vars(obj).items()):
            if name.startswith("_") and name not in ("__init__", "__new__"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                fn = member.__func__
                if takes_arguments(fn, method=isinstance(member, classmethod)):
                    setattr(obj, name, type(member)(_wrap(fn, fixes, obj.__module__)))
            elif isinstance(member, types.FunctionType) and takes_arguments(member, method=True):
                setattr(obj, name, _wrap(member, fixes, obj.__module__))
        return obj
    return _wrap(obj, fixes)  # type: ignore[arg-type]


def contract_of(obj: Any) -> Contract | None:
    """The contract of a checked callable (following functools.wraps chains, e.g. a contextmanager's; one checked
    on its first call, `_lazy.on_first_call`, is checked now)."""
    seen = 0
    while obj is not None and seen < 8:
        make = getattr(obj, ON_FIRST_CALL, None)
        if make is not None:
            obj = make()
        found = getattr(obj, CONTRACT_ATTR, None)
        if isinstance(found, Contract):
            return found
        obj = getattr(obj, "__wrapped__", None)
        seen += 1
    return None
