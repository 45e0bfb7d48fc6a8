"""Every public callable checks its arguments at the boundary (maxtext_compat.contract), and it is enforced.

The walk covers every name in the `__all__` of maxtext_compat and its faces adapters, shims, paged, rpa,
convert and decode: a function, a class's constructor and each public method that takes an argument must be
`@checked`, its hints must resolve and compile, and — the behaviour, not the decoration — for each typed
parameter, a call with valid values everywhere else and a value its hint refuses there raises our typed error
naming exactly that parameter (the body never runs: the refusal is at the boundary). A parameter typed `Any`
accepts everything at the boundary, so each one is listed below with what checks it instead.

Runs where numpy and jax are installed (convert and decode import numpy; a mesh sample needs jax).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from maxtext_compat.contract import contract_of, takes_arguments
from maxtext_compat.contract.check import Contract
from maxtext_compat.contract.hints import bearable
from maxtext_compat.errors import CompatError, InvalidArgumentError, InvalidArgumentTypeError

pytestmark = pytest.mark.envs("maxtext-0.2.3")

FACES = (
    "maxtext_compat",
    "maxtext_compat.adapters",
    "maxtext_compat.shims",
    "maxtext_compat.paged",
    "maxtext_compat.kernel.rpa",
    "maxtext_compat.convert",
    "maxtext_compat.decode",
)
# Exception and warning classes are raised by maxtext-compat and caught by users, never called with a user's
# arguments: their constructors are the library's own.
EXEMPT_KINDS = (BaseException,)
# Parameters that take any value at the boundary, and what refuses a wrong one instead (a typed error too).
ANY_ACCEPTED = {
    "wrap.module": "a MaxText module or class: kind_of refuses anything else with InvalidArgumentTypeError",
    "add_keyword_params.default": "the default of the added parameters: any value is one",
    "Original.__new__.owner": "the module or class a patch is written to (built by the shims core)",
    "Original.__new__.raw": "the class-dict entry being patched: any object (built by the shims core)",
    "Original.__new__.defined_in": "the module or class holding raw (built by the shims core)",
    "check_kernel_inputs.host_values": "the caller's own host copies of the metadata (checked with it)",
    "RaggedMetadata.__init__.request_ids": "hashable request ids of any kind, as the caller named them",
    "ConversionResult.__init__.maxtext_config": "MaxText config keys and values of any kind",
    "LlamaCheckpoint.__init__.tensors": "numpy arrays by Hugging Face name (check_tensors checks them)",
    "tokenizer_from_gguf.reader": "a gguf.GGUFReader (gguf is imported on use)",
    "StepRecord.__init__.logits": "logits rows of any array type",
    "Generation.__init__.caches": "KV caches of any array type",
    "Generation.__init__.layout": "the paged run's KVCacheLayout, or None for the dense path",
    "check_dense_model.model": "a MaxText Transformer: its config and model_mode are checked (typed)",
    "dense_greedy.model": "a MaxText Transformer: check_dense_model refuses others (typed)",
    "cache_mesh_for.model": "a MaxText Transformer: its mesh is read",
    "layout_for_model.model": "a MaxText Transformer: its config is read",
    "PagedEngine.__init__.model": "a MaxText Transformer: the engine refuses other kinds (typed)",
    "make_mesh.devices": "jax devices (a list or an array of them)",
}


NOT_CALLABLE = {"__version__"}  # the only exported names that are values


def _walk() -> Iterator[tuple[str, Callable[..., Any], bool]]:
    """(label, callable, is_method) of every public callable that takes an argument."""
    seen: set[int] = set()
    for face in FACES:
        module = importlib.import_module(face)
        for name in module.__all__:
            obj = getattr(module, name)
            if not callable(obj):  # e.g. a face handing out a submodule instead of the function it exports
                assert name in NOT_CALLABLE, f"{face}.{name} is {obj!r}, not a callable"
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, type):
                if issubclass(obj, EXEMPT_KINDS):
                    continue
                ctor = "__new__" if "__init__" not in vars(obj) and "__new__" in vars(obj) else "__init__"
                if getattr(obj, ctor) is not getattr(object, ctor):  # a class built with no arguments (Shim)
                    yield f"{name}.{ctor}", getattr(obj, ctor), True
                for attr, member in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        fn, method = member.__func__, isinstance(member, classmethod)
                    elif inspect.isfunction(member):
                        fn, method = member, True
                    else:
                        continue
                    if takes_arguments(getattr(fn, "__wrapped__", fn), method=method):
                        yield f"{name}.{attr}", getattr(obj, attr), method
            elif takes_arguments(getattr(obj, "__wrapped__", obj), method=False):
                yield name, obj, False


ALL = list(_walk())
IDS = [label for label, _, _ in ALL]


def test_the_walk_sees_every_face():
    assert len(ALL) >= 60, IDS
    assert {"wrap", "PageAllocator.append", "ragged_paged_attention", "convert", "PagedEngine.generate"} <= set(IDS)
    assert len(IDS) == len(set(IDS))


@pytest.mark.parametrize(("label", "fn", "method"), ALL, ids=IDS)
def test_every_public_callable_is_checked_and_its_hints_compile(label, fn, method):
    contract = contract_of(fn)
    assert contract is not None, f"{label} is not @checked (maxtext_compat.contract.checked)"
    assert contract.compile() is not None
    hints = contract.hints()
    params = list(contract.signature.parameters.values())[1 if method else 0 :]
    untyped = [p.name for p in params if p.name not in hints]
    assert not untyped, f"{label}: parameters without a type hint: {untyped}"


# ----------------------------------------------------------------------------------------------
# Samples: a valid value for any hint the API uses, to put beside the one wrong value
# ----------------------------------------------------------------------------------------------


@cache
def _pool() -> tuple[Any, ...]:
    """Valid values of the API's own types (a hint whose structural sample does not fit finds one here)."""
    import numpy as np

    import maxtext_compat
    from maxtext_compat import paged
    from maxtext_compat.decode import Buckets, Generation
    from maxtext_compat.matrix import load_matrix

    matrix = load_matrix()
    layout = paged.KVCacheLayout(4, 16, 2, 128)
    md = paged.build_metadata([paged.SequenceSlice(1, 1, (0,))], layout)
    return (
        None, 1, 1.0, True, "float32", "x", (), [], {}, (1,), [1],
        np.zeros((1,), np.int32), layout, md, paged.SequenceSlice(1, 1, (0,)), paged.PageAllocator(4, 16),
        paged.make_mesh(1), maxtext_compat.resolve({"maxtext": "0.2.5"}), matrix, matrix.row("0.2.5"),
        matrix.tpu_inference[-1], Buckets(8, 2, 2), Generation("paged", ((1,),)), Path("."),
    )  # fmt: skip


def _bearable(value: Any, hint: Any) -> bool:
    return bearable(value, hint)


def _structural(hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return _structural(args[0])
    if origin in (typing.Union, __import__("types").UnionType):
        return None if type(None) in args else _structural(args[0])
    if origin is typing.Literal:
        return args[0]
    if origin is tuple and args and args[-1] is not Ellipsis:
        return tuple(_sample(a) for a in args)
    # Containers hold one sampled item, so the contract's check of every item runs on the valid side too
    # (empty when no item can be made here: an internal type such as a patch layer).
    if origin in (tuple, list, set, frozenset):
        return origin(_items(args[:1]))
    if origin in (dict,) or (origin is not None and issubclass(origin, typing.Mapping)):
        return dict([tuple(_items(args))]) if len(args) == 2 and len(_items(args)) == 2 else {}
    if origin is not None and isinstance(origin, type) and issubclass(origin, typing.Iterable):
        return tuple(_items(args[:1]))
    if (origin is not None and origin.__name__ == "Callable") or hint is typing.Callable:
        return lambda *a, **k: None
    if origin is type:
        return object
    return {int: 1, float: 1.0, bool: True, str: "x", type: object, bytes: b""}.get(hint, hint)


def _items(hints: tuple[Any, ...]) -> list[Any]:
    """A sample of each hint, or none at all when one of them has no sample."""
    try:
        return [_sample(h) for h in hints]
    except AssertionError:
        return []


def _sample(hint: Any) -> Any:
    """A value `hint` accepts."""
    if hint is Any:
        return None
    first = _structural(hint)
    if first is not hint and _bearable(first, hint):
        return first
    if isinstance(hint, type):
        contract = contract_of(hint.__init__)
        if contract is not None:  # one of ours: built from samples of its own hints
            kwargs = {n: _sample(h) for n, h in contract.hints().items()}
            try:
                built = hint(**kwargs)
            except CompatError:
                built = None
            if built is not None and _bearable(built, hint):
                return built
    for value in _pool():
        if _bearable(value, hint):
            return value
    raise AssertionError(f"no sample value for the hint {hint!r}: add one to _pool()")


class _Wrong:
    """A value no hint of the API accepts, unless it accepts anything."""

    __hash__ = None  # type: ignore[assignment]  # not even a Hashable


def _refused(hint: Any) -> Any:
    for value in (_Wrong(), None, 1.5, "x", [1.5]):
        if not _bearable(value, hint):
            return value
    return _ANY


_ANY = object()


def _cases() -> Iterator[Any]:
    for label, fn, method in ALL:
        contract = contract_of(fn)
        if contract is None:
            continue
        for name in list(contract.signature.parameters)[1 if method else 0 :]:
            yield pytest.param(label, fn, method, name, id=f"{label}:{name}")


@pytest.mark.parametrize(("label", "fn", "method", "name"), list(_cases()))
def test_a_value_the_hint_refuses_is_our_typed_error_naming_the_parameter(label, fn, method, name):
    contract: Contract = contract_of(fn)  # type: ignore[assignment]
    hints = contract.hints()
    hint = hints.get(name, Any)
    wrong = _refused(hint)
    if wrong is _ANY:
        key = f"{label}.{name}" if f"{label}.{name}" in ANY_ACCEPTED else f"{label.split('.')[0]}.{name}"
        assert ANY_ACCEPTED.get(key), f"{label}: {name} accepts any value; check it or list it in ANY_ACCEPTED"
        return
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for i, (n, p) in enumerate(contract.signature.parameters.items()):
        if method and i == 0:  # the receiver: a bare instance (the body never runs), or the class for __new__
            owner = _owner_of(label)
            args.append(owner if label.endswith("__new__") else object.__new__(owner))
            continue
        value = wrong if n == name else _sample(hints.get(n, Any))
        if p.kind is p.VAR_POSITIONAL:
            args.extend([value] if n == name else [])
        elif p.kind is p.VAR_KEYWORD:
            kwargs.update({"extra": value} if n == name else {})
        elif p.kind is p.KEYWORD_ONLY:
            kwargs[n] = value
        else:
            args.append(value)
    with pytest.raises((InvalidArgumentTypeError, InvalidArgumentError)) as info:
        fn(*args, **kwargs)
    expected = {"VAR_POSITIONAL": f"{name}[0]", "VAR_KEYWORD": "extra"}.get(
        contract.signature.parameters[name].kind.name, name
    )
    assert info.value.argument == expected, str(info.value)
    assert "Fix:" in str(info.value) and info.value.expected


def _owner_of(label: str) -> type:
    face_name = label.split(".")[0]
    for face in FACES:
        module = importlib.import_module(face)
        if face_name in module.__all__:
            return getattr(module, face_name)
    raise AssertionError(label)


def test_numpy_scalars_are_numbers_and_stored_as_python_ones():
    """np.int64 page ids and counts (what a block table or a shape gives) are ints; a numpy bool is not."""
    import numpy as np

    from maxtext_compat import paged

    alloc = paged.PageAllocator(np.int64(8), np.int32(16))
    step = alloc.append(np.int64(1), np.int64(20))
    layout = paged.KVCacheLayout(np.int64(8), np.int64(16), np.int16(2), np.int64(128))
    assert type(alloc.num_pages) is int and type(layout.num_pages) is int and type(step.q_len) is int
    md = paged.build_metadata([step], layout, max_num_tokens=np.int64(32))
    assert all(type(p) is int for p in md.page_indices)
    with pytest.raises(InvalidArgumentTypeError) as e:
        paged.PageAllocator(np.bool_(True), 16)
    assert e.value.argument == "num_pages"
    mesh = paged.make_mesh(np.int64(1))
    assert mesh.shape["model"] == 1


def test_every_listed_any_parameter_exists():
    """ANY_ACCEPTED names parameters the walk meets; a stale entry would excuse nothing but read as if it did."""
    seen = {f"{label}.{name}" for label, fn, _ in ALL for name in contract_of(fn).signature.parameters}
    short = {f"{label.split('.')[0]}.{name}" for label, fn, _ in ALL for name in contract_of(fn).signature.parameters}
    assert not [k for k in ANY_ACCEPTED if k not in seen | short]
