"""The shim patching core on throwaway modules: install/uninstall, exact restore, signatures, aliases,
stacking, conflicts, profiles, the registry and the marker, fork. No MaxText needed."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
import types
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import wrapt
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import maxtext_compat
from helpers.fake_layers import LAYERS_SOURCE
from helpers.fake_modules import FakePackage, make_module
from maxtext_compat import patching, shims
from maxtext_compat.errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    PatchConflictError,
    PatchError,
    PatchTargetError,
    ProfileError,
)
from maxtext_compat.patching import MARKER, PatchSpec, add_keyword_params, ledger, profiles


class Fake(FakePackage):
    """A fake MaxText-like package: pkg.layers (targets), pkg.user (`from pkg.layers import f`),
    and other_pkg.user (an alias outside the default sweep scope)."""

    def __init__(self) -> None:
        super().__init__("fakemt")
        self.other_pkg = f"{self.pkg}_other"
        make_module(self.pkg)
        self.layers = make_module(f"{self.pkg}.layers", LAYERS_SOURCE)
        self.user = make_module(f"{self.pkg}.user", f"from {self.pkg}.layers import f, Attention\nfn_alias = f\n")
        make_module(self.other_pkg)
        self.other = make_module(f"{self.other_pkg}.user", f"from {self.pkg}.layers import f\n")
        self.snapshot = self.take_snapshot()

    def owners(self) -> list[object]:
        return [self.layers, self.user, self.other, self.layers.Attention, self.layers.Base]


def tagger(tag: str):
    """A factory whose wrapper appends `tag` to the result and accepts kv_cache."""

    def factory(original: shims.Original):
        def wrapper(wrapped, instance, args, kwargs):
            kv = kwargs.pop("kv_cache", None)
            kwargs.pop("attention_metadata", None)
            out = (*wrapped(*args, **kwargs), tag)
            return out if kv is None else (out, kv)

        return wrapper

    factory.__qualname__ = f"tagger.{tag}"
    return factory


@pytest.fixture
def fake() -> Iterator[Fake]:
    fk = Fake()
    yield fk
    fk.cleanup()


@pytest.fixture(autouse=True)
def clean_state() -> Iterator[None]:
    before = set(profiles.registered_profiles())
    yield
    shims.uninstall(force=True)
    for name in set(profiles.registered_profiles()) - before:
        shims.unregister_profile(name)
    profiles.set_default_profile_chooser(None)
    assert ledger.active_patches() == []
    assert patching.installed_layers() == ()


def register(name: str, *specs: PatchSpec) -> str:
    shims.register_profile(name, lambda: specs, description=f"test profile {name}")
    return name


def all_specs(fake: Fake, tag: str = "A", **kw) -> list[PatchSpec]:
    sig = add_keyword_params("kv_cache", "attention_metadata")
    return [
        PatchSpec(fake.target("Attention.__call__"), tagger(tag), signature=sig, **kw),
        PatchSpec(fake.target("Attention.s"), tagger(tag), **kw),
        PatchSpec(fake.target("Attention.c"), tagger(tag), **kw),
        PatchSpec(fake.target("Attention.inherited"), tagger(tag), **kw),
        PatchSpec(fake.target("f"), tagger(tag), signature=add_keyword_params("kv_cache"), **kw),
    ]


# --------------------------------------------------------------------------------------------- install / restore


def test_install_patches_every_kind_and_uninstall_restores_by_identity(fake: Fake):
    register("p", *all_specs(fake))
    raw = {k: vars(fake.layers.Attention)[k] for k in ("__call__", "s", "c")}
    patch_set = shims.install("p")
    assert patch_set is not None and shims.installed("p") and shims.installed()
    a = fake.layers.Attention()
    assert a(1) == ("call", 1, "A")
    assert a(1, kv_cache="kv") == (("call", 1, "A"), "kv")
    assert fake.layers.Attention.s(2) == ("s", 2, "A") and a.s(2) == ("s", 2, "A")
    assert fake.layers.Attention.c(3) == ("c", 3, "A") and a.c(3) == ("c", 3, "A")
    assert a.inherited(4) == ("inherited", 4, "A")
    assert fake.layers.Base().inherited(4) == ("inherited", 4)  # only the named class is patched
    assert fake.layers.f(5) == ("f", 5, "A")
    assert isinstance(vars(fake.layers.Attention)["s"], wrapt.BaseObjectProxy)
    assert shims.uninstall() == ["p"]
    assert not shims.installed("p") and not shims.installed()
    assert all(vars(fake.layers.Attention)[k] is v for k, v in raw.items())
    assert type(vars(fake.layers.Attention)["s"]) is staticmethod
    assert type(vars(fake.layers.Attention)["c"]) is classmethod
    assert "inherited" not in vars(fake.layers.Attention)  # the slot we created is gone again
    fake.assert_pristine()


def test_signature_advertises_added_keywords(fake: Fake):
    register("p", *all_specs(fake))
    before = inspect.signature(fake.layers.Attention.s)
    shims.install("p")
    call = inspect.signature(fake.layers.Attention.__call__)
    assert list(call.parameters) == ["self", "x", "decoder_segment_ids", "kv_cache", "attention_metadata"]
    assert call.parameters["kv_cache"].kind is inspect.Parameter.KEYWORD_ONLY
    bound = inspect.signature(fake.layers.Attention())
    assert list(bound.parameters) == ["x", "decoder_segment_ids", "kv_cache", "attention_metadata"]
    bound.bind(1, kv_cache=None, attention_metadata=None)
    assert list(inspect.signature(fake.layers.f).parameters) == ["x", "kv_cache"]
    assert inspect.signature(fake.layers.Attention.s) == before  # no signature given: the original's
    assert supports_kw(fake.layers.Attention.__call__, "kv_cache")
    assert supports_kw(fake.layers.Attention.__call__, "attention_metadata")
    shims.uninstall()
    assert not supports_kw(fake.layers.Attention.__call__, "kv_cache")


def test_a_signature_override_keeps_the_patch_on_the_unbind_path(fake: Fake):
    """wrapt's public `with_signature` over our wrapper: the added keywords are advertised, and Flax Linen's way of
    calling a method (unbinding `module.__call__` through `__func__`, then calling it with the module) still runs
    the patch; uninstall restores the original by identity."""
    raw = vars(fake.layers.Attention)["__call__"]
    register("p", *all_specs(fake))
    shims.install("p")
    a = fake.layers.Attention()
    assert list(inspect.signature(a).parameters) == ["x", "decoder_segment_ids", "kv_cache", "attention_metadata"]
    assert supports_kw(fake.layers.Attention.__call__, "kv_cache")
    assert a(1) == ("call", 1, "A") and a(1, kv_cache="kv") == (("call", 1, "A"), "kv")
    unbound = a.__call__.__func__  # Linen's Module.apply / init
    assert unbound(a, 1) == ("call", 1, "A") and unbound(a, 1, kv_cache="kv") == (("call", 1, "A"), "kv")
    assert "kv_cache" in inspect.signature(unbound).parameters
    assert list(inspect.signature(fake.layers.f).parameters) == ["x", "kv_cache"] and fake.layers.f(5) == ("f", 5, "A")
    shims.uninstall()
    assert vars(fake.layers.Attention)["__call__"] is raw
    fake.assert_pristine()


def supports_kw(fn, name: str) -> bool:
    """vLLM's vllm/utils/func_utils.py::supports_kw, as tpu-inference uses it to validate models."""
    params = inspect.signature(fn).parameters
    if name in params:
        return params[name].kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_signature_on_static_and_class_methods_and_stacked_layers(fake: Fake):
    def kv_specs(tag: str, *names: str) -> list[PatchSpec]:
        sig = add_keyword_params(*names)
        return [PatchSpec(fake.target(p), tagger(tag), signature=sig) for p in ("Attention.s", "Attention.c")]

    register("p", *kv_specs("A", "kv_cache"))
    register("q", *kv_specs("B", "attention_metadata"))
    shims.install("p")
    a = fake.layers.Attention()
    for fn in (fake.layers.Attention.s, a.s, fake.layers.Attention.c, a.c):
        assert list(inspect.signature(fn).parameters) == ["x", "kv_cache"]
    shims.install("q")  # the outer layer advertises its own keywords and the inner layer's
    for fn in (fake.layers.Attention.s, a.s, fake.layers.Attention.c, a.c):
        assert list(inspect.signature(fn).parameters) == ["x", "kv_cache", "attention_metadata"]
    assert a.c(1, kv_cache=None, attention_metadata=None) == ("c", 1, "A", "B")
    shims.uninstall()
    fake.assert_pristine()


def test_reinstall_reuses_wrappers_while_the_original_is_unchanged(fake: Fake):
    built = []

    def factory(original):
        built.append(original.attribute)
        return tagger("A")(original)

    calls = []

    def builder():
        calls.append(1)
        return [PatchSpec(fake.target("f"), factory), PatchSpec(fake.target("Attention.s"), factory)]

    shims.register_profile("p", builder)
    shims.install("p")
    first = fake.layers.f
    for _ in range(3):
        shims.uninstall("p")
        shims.install("p")
    assert fake.layers.f is first and built == ["f", "s"] and calls == [1]  # built once, reused
    shims.uninstall("p")
    fake.layers.f = make_module(f"{fake.pkg}.layers2", "def f(x):\n    return ('f2', x)\n").f
    fake.layers.f.__module__ = fake.layers.__name__  # a new original (e.g. the module was reloaded)
    shims.install("p")
    assert fake.layers.f is not first and built == ["f", "s", "f"] and fake.layers.f(1) == ("f2", 1, "A")
    shims.uninstall("p")
    shims.register_profile("p", builder, replace=True)  # registering again rebuilds the specs
    shims.install("p")
    assert calls == [1, 1] and built == ["f", "s", "f", "f", "s"]


def test_add_keyword_params_goes_before_var_kwargs_and_skips_present_names():
    def g(a, *, kv_cache=1, **kw):
        return a

    sig = add_keyword_params("kv_cache", "attention_metadata")(g)
    assert str(sig) == "(a, *, kv_cache=1, attention_metadata=None, **kw)"
    with pytest.raises(InvalidArgumentError):
        add_keyword_params("not an identifier")


def test_install_twice_is_a_no_op(fake: Fake):
    register("p", *all_specs(fake))
    first = shims.install("p")
    assert shims.install("p") is first
    assert fake.layers.f(1) == ("f", 1, "A")  # wrapped once, not twice
    assert len([p for p in ledger.active_patches() if p.profile == "p"]) == 5
    assert shims.uninstall("p") == ["p"]
    assert shims.uninstall("p") == []  # idempotent too
    fake.assert_pristine()


def test_registry_records_target_origin_profile_and_aliases(fake: Fake):
    register("p", *all_specs(fake))
    shims.install("p")
    rows = {p.target: p for p in ledger.active_patches()}
    row = rows[fake.target("f")]
    assert row.as_dict() == {"target": fake.target("f"), "origin": f"{__name__}.tagger.A", "profile": "p"}
    assert set(row.aliases) == {f"{fake.pkg}.user:f", f"{fake.pkg}.user:fn_alias"}
    assert row.pid == os.getpid() and row.stacked_on == ""
    assert set(rows) == {s.target for s in all_specs(fake)}
    from maxtext_compat.doctor import _active_patches

    assert {d["target"] for d in _active_patches()} == set(rows)
    shims.uninstall()
    assert ledger.active_patches() == []


def test_marker_on_each_patched_owner(fake: Fake):
    register("p", *all_specs(fake))
    shims.install("p")
    assert vars(fake.layers.Attention)[MARKER] == {
        "__call__": ("p",),
        "s": ("p",),
        "c": ("p",),
        "inherited": ("p",),
    }
    assert vars(fake.layers)[MARKER] == {"f": ("p",)}
    assert MARKER not in vars(fake.layers.Base)
    shims.uninstall()
    assert MARKER not in vars(fake.layers.Attention) and MARKER not in vars(fake.layers)


# --------------------------------------------------------------------------------------------- aliases


def test_aliases_in_the_package_are_swapped_and_restored(fake: Fake):
    original = fake.layers.f
    register("p", PatchSpec(fake.target("f"), tagger("A")))
    shims.install("p")
    assert fake.user.f is fake.layers.f and fake.user.fn_alias is fake.layers.f
    assert fake.user.f(1) == ("f", 1, "A")
    assert fake.other.f is original  # other top-level package: outside the default scope
    shims.uninstall()
    assert fake.user.f is original and fake.user.fn_alias is original
    fake.assert_pristine()


def test_alias_scope_star_reaches_every_module_but_ours(fake: Fake):
    original = fake.layers.f
    patching.__dict__["_test_saved_original"] = original  # our own modules are never swept
    try:
        register("p", PatchSpec(fake.target("f"), tagger("A"), aliases=("*",)))
        shims.install("p")
        assert fake.other.f is fake.layers.f
        assert patching.__dict__["_test_saved_original"] is original
        shims.uninstall()
        assert fake.other.f is original
    finally:
        del patching.__dict__["_test_saved_original"]
    fake.assert_pristine()


def test_alias_scope_can_be_disabled_or_named(fake: Fake):
    original = fake.layers.f
    register("none", PatchSpec(fake.target("f"), tagger("A"), aliases=()))
    shims.install("none")
    assert fake.user.f is original
    shims.uninstall()
    register("named", PatchSpec(fake.target("f"), tagger("A"), aliases=(fake.other_pkg,)))
    shims.install("named")
    assert fake.other.f is fake.layers.f and fake.user.f is original
    shims.uninstall()
    fake.assert_pristine()


def test_a_class_alias_sees_the_class_dict_patch(fake: Fake):
    register("p", PatchSpec(fake.target("Attention.__call__"), tagger("A")))
    shims.install("p")
    assert fake.user.Attention()(1) == ("call", 1, "A")
    assert vars(fake.user)["Attention"] is fake.layers.Attention


# --------------------------------------------------------------------------------------------- stacking


@pytest.mark.parametrize("order", [["A", "B"], ["B", "A"]])
def test_two_profiles_stack_and_uninstall_in_any_order(fake: Fake, order: list[str]):
    register("A", *all_specs(fake, "A"))
    register("B", *all_specs(fake, "B"))
    shims.install("A")
    shims.install("B")
    a = fake.layers.Attention()
    assert a(1) == ("call", 1, "A", "B") and fake.user.f(1) == ("f", 1, "A", "B")
    assert a.inherited(1) == ("inherited", 1, "A", "B")
    assert vars(fake.layers)[MARKER] == {"f": ("A", "B")}
    assert {p.stacked_on for p in ledger.active_patches() if p.profile == "B"} == {"profile A"}
    sig = inspect.signature(fake.layers.Attention.__call__)
    assert "kv_cache" in sig.parameters
    first, second = order
    shims.uninstall(first)
    assert a(1) == ("call", 1, second) and fake.user.f(1) == ("f", 1, second)
    assert a.c(2) == ("c", 2, second) and a.inherited(3) == ("inherited", 3, second)
    assert vars(fake.layers)[MARKER] == {"f": (second,)}
    assert {p.stacked_on for p in ledger.active_patches()} == {""}
    shims.uninstall(second)
    fake.assert_pristine()


def test_uninstall_all_removes_newest_first(fake: Fake):
    register("A", *all_specs(fake, "A"))
    register("B", *all_specs(fake, "B"))
    shims.install("A")
    shims.install("B")
    assert shims.active_profiles() == ["A", "B"]
    assert shims.uninstall() == ["B", "A"]
    fake.assert_pristine()


def test_stacked_on_an_inherited_layer_of_another_class(fake: Fake):
    """A patches Base.inherited; B patches Attention.inherited (whose raw is A's wrapper, via the MRO)."""
    register("A", PatchSpec(f"{fake.pkg}.layers:Base.inherited", tagger("A")))
    register("B", PatchSpec(fake.target("Attention.inherited"), tagger("B")))
    shims.install("A")
    shims.install("B")
    assert fake.layers.Attention().inherited(1) == ("inherited", 1, "A", "B")
    shims.uninstall("A")  # B must not keep calling A's wrapper
    assert fake.layers.Attention().inherited(1) == ("inherited", 1, "B")
    assert fake.layers.Base().inherited(1) == ("inherited", 1)
    shims.uninstall("B")
    fake.assert_pristine()


class StackingMachine(RuleBasedStateMachine):
    """Random install/uninstall of three profiles on the same targets: results compose in install
    order, aliases follow, and uninstalling everything restores every original by identity."""

    def __init__(self) -> None:
        super().__init__()
        self.fake = Fake()
        self.active: list[str] = []
        self.names = [f"m{i}" for i in range(3)]
        for name in self.names:
            if name in profiles.registered_profiles():
                shims.unregister_profile(name)
            register(name, *all_specs(self.fake, name))

    @rule(i=st.integers(0, 2))
    def install(self, i: int) -> None:
        name = self.names[i]
        shims.install(name)
        if name not in self.active:
            self.active.append(name)

    @rule(i=st.integers(0, 2))
    def uninstall(self, i: int) -> None:
        name = self.names[i]
        shims.uninstall(name)
        if name in self.active:
            self.active.remove(name)

    @rule()
    def uninstall_all(self) -> None:
        assert shims.uninstall() == list(reversed(self.active))
        self.active = []

    @invariant()
    def composes_in_install_order(self) -> None:
        tags = tuple(self.active)
        a = self.fake.layers.Attention()
        assert a(1) == ("call", 1, *tags)
        assert a.s(1) == ("s", 1, *tags) and a.c(1) == ("c", 1, *tags)
        assert a.inherited(1) == ("inherited", 1, *tags)
        assert self.fake.user.f(1) == ("f", 1, *tags) and self.fake.user.fn_alias is self.fake.layers.f
        assert vars(self.fake.layers).get(MARKER, {}).get("f", ()) == tags
        assert shims.active_profiles() == self.active
        assert not any(shims.verify().values())

    def teardown(self) -> None:
        shims.uninstall()
        self.fake.assert_pristine()
        for name in self.names:
            shims.unregister_profile(name)
        self.fake.cleanup()


StackingMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=12, deadline=None)
test_stacking_state_machine = StackingMachine.TestCase


# --------------------------------------------------------------------------------------------- conflicts


def test_target_wrapped_by_someone_else_is_a_conflict_unless_stacking(fake: Fake):
    def theirs(wrapped, instance, args, kwargs):
        return (*wrapped(*args, **kwargs), "theirs")

    wrapt.wrap_function_wrapper(fake.layers, "Attention.__call__", theirs)
    foreign = vars(fake.layers.Attention)["__call__"]
    register("p", *all_specs(fake))
    with pytest.raises(PatchConflictError) as err:
        shims.install("p")
    msg = str(err.value)
    assert fake.target("Attention.__call__") in msg and "stack=True" in msg and "FunctionWrapper" in msg
    assert vars(fake.layers.Attention)["__call__"] is foreign and not shims.installed()
    shims.install("p", stack=True)
    assert fake.layers.Attention()(1) == ("call", 1, "theirs", "A")
    assert any(p.stacked_on.startswith("foreign") for p in ledger.active_patches())
    shims.uninstall()
    assert vars(fake.layers.Attention)["__call__"] is foreign  # theirs is restored, not the original


def test_function_assigned_from_another_module_is_a_conflict(fake: Fake):
    def replacement(x):  # defined in this test module, like a raw setattr monkeypatch
        return ("replaced", x)

    fake.layers.f = replacement
    register("p", PatchSpec(fake.target("f"), tagger("A")))
    with pytest.raises(PatchConflictError, match=r"defined in 'tests\.unit\.test_shims_patching'|rather than"):
        shims.install("p")
    assert fake.layers.f is replacement and ledger.active_patches() == []


def test_functools_wraps_wrapper_from_the_same_module_is_not_a_conflict(fake: Fake):
    """Flax-style wrappers copy __module__: they are indistinguishable from the original (documented)."""
    make_module(
        f"{fake.pkg}.deco",
        "import functools\n"
        "def deco(fn):\n"
        "    @functools.wraps(fn)\n"
        "    def inner(*a, **k):\n"
        "        return fn(*a, **k)\n"
        "    return inner\n"
        "@deco\n"
        "def g(x):\n"
        "    return ('g', x)\n",
    )
    register("p", PatchSpec(f"{fake.pkg}.deco:g", tagger("A")))
    shims.install("p")
    assert sys.modules[f"{fake.pkg}.deco"].g(1) == ("g", 1, "A")


def test_foreign_wrapt_wrapper_on_top_of_ours_is_spliced_on_uninstall(fake: Fake):
    original = vars(fake.layers.Attention)["__call__"]
    register("p", PatchSpec(fake.target("Attention.__call__"), tagger("A")))
    shims.install("p")

    def theirs(wrapped, instance, args, kwargs):
        return (*wrapped(*args, **kwargs), "theirs")

    wrapt.wrap_function_wrapper(fake.layers, "Attention.__call__", theirs)
    foreign = vars(fake.layers.Attention)["__call__"]
    assert fake.layers.Attention()(1) == ("call", 1, "A", "theirs")
    shims.uninstall()
    assert vars(fake.layers.Attention)["__call__"] is foreign  # theirs stays, ours is gone beneath it
    assert foreign.__wrapped__ is original
    assert fake.layers.Attention()(1) == ("call", 1, "theirs")


def test_replaced_patch_blocks_uninstall_until_forced(fake: Fake):
    register("p", *all_specs(fake))
    shims.install("p")
    ours = vars(fake.layers.Attention)["__call__"]

    def replacement(self, x):
        return ("replaced", x)

    fake.layers.Attention.__call__ = replacement
    assert shims.verify() == {"p": [f"{fake.target('Attention.__call__')} holds {__name__}.{replacement.__qualname__} "
                                    "instead of the 'p' wrapper"]}  # fmt: skip
    with pytest.raises(PatchConflictError) as err:
        shims.uninstall()
    assert "force=True" in str(err.value) and fake.target("Attention.__call__") in str(err.value)
    assert shims.installed("p") and fake.layers.f(1) == ("f", 1, "A")  # nothing was restored
    assert vars(fake.layers.Attention)["__call__"] is replacement and ours is not replacement
    assert shims.uninstall(force=True) == ["p"]
    fake.assert_pristine()


def test_marker_without_our_wrapper_is_reported(fake: Fake):
    fake.layers.Attention.__maxtext_compat_patches__ = {"__call__": ("ghost",)}
    register("p", PatchSpec(fake.target("Attention.__call__"), tagger("A")))
    with pytest.raises(PatchConflictError, match="ghost"):
        shims.install("p")
    del fake.layers.Attention.__maxtext_compat_patches__


# --------------------------------------------------------------------------------------------- profiles API


def test_patched_context_restores_even_on_error(fake: Fake):
    register("p", *all_specs(fake))
    with pytest.raises(RuntimeError), shims.patched("p") as ps:
        assert ps is not None and fake.layers.f(1) == ("f", 1, "A")
        raise RuntimeError("boom")
    assert not shims.installed()
    fake.assert_pristine()


def test_patched_leaves_a_profile_installed_before_it(fake: Fake):
    register("p", *all_specs(fake))
    outer = shims.install("p")
    with shims.patched("p") as inner:
        assert inner is outer
    assert shims.installed("p")
    shims.uninstall()


def test_default_profile_chooser_gets_the_resolution(fake: Fake):
    register("p", *all_specs(fake))
    with pytest.raises(ProfileError, match="no default-profile chooser"):
        shims.install()
    seen = []
    row = maxtext_compat.resolve({"maxtext": "0.1.0"})  # a Resolution: install(resolution=) is typed
    assert row.convention == "legacy"

    def chooser(resolution):
        seen.append(resolution)
        return "p" if resolution.convention == "legacy" else None

    assert not shims.has_default_profile_chooser()
    assert shims.set_default_profile_chooser(chooser) is None
    assert shims.has_default_profile_chooser()
    assert shims.default_profile(row) == "p"
    ps = shims.install(resolution=row)
    assert ps is not None and ps.profile == "p" and seen == [row, row]
    shims.uninstall()
    newer = maxtext_compat.resolve({"maxtext": "0.2.5"})
    assert shims.install(resolution=newer) is None
    with shims.patched(resolution=newer) as nothing:
        assert nothing is None
    shims.set_default_profile_chooser(lambda r: "nope")
    with pytest.raises(ProfileError, match="unknown profile 'nope'"):
        shims.install(resolution=row)
    with pytest.raises(InvalidArgumentTypeError):  # a wrong type is a TypeError (maxtext_compat.contract)
        shims.set_default_profile_chooser("p")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match=r"\[resolution\]"):
        shims.install(resolution=types.SimpleNamespace(convention="legacy"))  # type: ignore[arg-type]


def test_default_profile_resolves_the_install_when_not_given(mocker):
    from maxtext_compat.resolution import installed

    res = types.SimpleNamespace(convention="legacy")
    found = installed.InstalledResolution(res, ())  # type: ignore[arg-type]
    lookup = mocker.patch.object(installed, "installed_resolution", return_value=found)
    seen: list[object] = []
    shims.set_default_profile_chooser(lambda r: seen.append(r))
    assert shims.default_profile() is None
    lookup.assert_called_once_with(probe=True)  # the install, probed against its source
    assert seen == [res]


def test_profile_registration_errors(fake: Fake):
    register("p", *all_specs(fake))
    assert shims.registered_profiles()["p"] == "test profile p"
    with pytest.raises(ProfileError, match="already registered"):
        register("p")
    shims.install("p")
    with pytest.raises(ProfileError, match="uninstall"):
        shims.register_profile("p", lambda: [], replace=True)
    with pytest.raises(ProfileError, match="uninstall"):
        shims.unregister_profile("p")
    shims.uninstall()
    shims.register_profile("p", lambda: [], replace=True)
    with pytest.raises(ProfileError, match="unknown shim profile 'q'"):
        shims.install("q")
    with pytest.raises(ProfileError):
        shims.uninstall("q")
    with pytest.raises(InvalidArgumentError):
        shims.register_profile("", lambda: [])
    with pytest.raises(InvalidArgumentTypeError):  # a wrong type is a TypeError (maxtext_compat.contract)
        shims.register_profile("x", "not callable")  # type: ignore[arg-type]


def test_builder_failures_are_profile_errors(fake: Fake):
    def broken():
        raise KeyError("no such row")

    shims.register_profile("broken", broken)
    with pytest.raises(ProfileError, match="building profile 'broken' failed") as err:
        shims.install("broken")
    assert isinstance(err.value.__cause__, KeyError)
    shims.register_profile("wrong", lambda: ["pkg:f"])
    with pytest.raises(ProfileError, match="other than PatchSpecs"):
        shims.install("wrong")
    assert not shims.installed()


def test_empty_profile_installs_nothing_but_is_installed():
    shims.register_profile("empty", lambda: [])
    ps = shims.install("empty")
    assert ps is not None and ps.targets == () and shims.installed("empty")
    assert shims.uninstall() == ["empty"]


@pytest.mark.parametrize(
    "target", ["pkg.mod", "pkg.mod:", ":f", "pkg..mod:f", "pkg.mod:Cls.", "pkg.mod:f:g", "pkg-mod:f", 3]
)
def test_bad_target_strings(target):
    with pytest.raises((InvalidArgumentError, InvalidArgumentTypeError)) as err:  # 3: a wrong type (TypeError)
        PatchSpec(target, tagger("A"))  # type: ignore[arg-type]
    assert "module.path:Class.attribute" in str(err.value) or (target == 3 and err.value.argument == "target")


def test_bad_spec_fields():
    with pytest.raises(InvalidArgumentTypeError, match="factory"):  # wrong types: TypeErrors (the contract)
        PatchSpec("m:f", "nope")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="signature"):
        PatchSpec("m:f", tagger("A"), signature="(x)")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentTypeError, match="aliases"):
        PatchSpec("m:f", tagger("A"), aliases="maxtext")  # type: ignore[arg-type]


def test_missing_target_error_names_target_expected_found_and_fix(fake: Fake):
    register("p", PatchSpec(fake.target("Attention.__cal__"), tagger("A")))
    with pytest.raises(PatchTargetError) as err:
        shims.install("p")
    e = err.value
    assert e.argument == fake.target("Attention.__cal__")
    assert "'__cal__'" in str(e.expected) and "__call__" in str(e.found) and "profile" in str(e.fix)


def test_non_callable_and_instance_paths_are_rejected(fake: Fake):
    fake.layers.Attention.size = 3
    fake.layers.instance = fake.layers.Attention()
    register("data", PatchSpec(fake.target("Attention.size"), tagger("A")))
    with pytest.raises(PatchTargetError, match="not a function"):
        shims.install("data")
    register("inst", PatchSpec(fake.target("instance.s"), tagger("A")))
    with pytest.raises(PatchTargetError, match="not a class or module"):
        shims.install("inst")
    del fake.layers.Attention.size, fake.layers.instance


def test_factory_sees_the_original(fake: Fake):
    seen: list[shims.Original] = []

    def factory(original):
        seen.append(original)
        return tagger("A")(original)

    register(
        "p",
        PatchSpec(fake.target("Attention.s"), factory),
        PatchSpec(fake.target("Attention.c"), factory),
        PatchSpec(fake.target("Attention.inherited"), factory),
        PatchSpec(fake.target("f"), factory),
    )
    shims.install("p")
    kinds = {o.attribute: (o.kind, o.owner, o.defined_in) for o in seen}
    assert kinds["s"] == ("staticmethod", fake.layers.Attention, fake.layers.Attention)
    assert kinds["c"][0] == "classmethod"
    assert kinds["inherited"] == ("method", fake.layers.Attention, fake.layers.Base)
    assert kinds["f"] == ("function", fake.layers, fake.layers)
    assert seen[0].function is vars(fake.layers.Attention)["s"].__wrapped__.__func__
    assert all(o.profile == "p" for o in seen)


def test_install_imports_target_modules_from_disk(tmp_path: Path, monkeypatch):
    name = f"ondisk_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def f(x):\n    return ('f', x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    register("p", PatchSpec(f"{name}:f", tagger("A")))
    try:
        shims.install("p")
        assert sys.modules[name].f(1) == ("f", 1, "A")
        shims.uninstall()
    finally:
        sys.modules.pop(name, None)


def test_two_specs_on_one_slot_are_rejected(fake: Fake):
    register("dup", PatchSpec(fake.target("f"), tagger("A")), PatchSpec(fake.target("f"), tagger("B")))
    with pytest.raises(PatchError, match="twice"):
        shims.install("dup")
    user_target = f"{fake.pkg}.user:f"
    register("overlap", PatchSpec(fake.target("f"), tagger("A")), PatchSpec(user_target, tagger("B")))
    with pytest.raises(PatchError, match="same slot"):
        shims.install("overlap")
    fake.assert_pristine()


# --------------------------------------------------------------------------------------------- processes


def _in_child(check) -> int:
    """Run `check` in a forked child; return its exit code (0 = passed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads alive
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            check()
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_inherits_patches_marker_and_state(fake: Fake):
    register("p", *all_specs(fake))
    shims.install("p")

    def check():
        assert shims.installed("p") and fake.layers.f(1) == ("f", 1, "A")
        assert vars(fake.layers)[MARKER] == {"f": ("p",)}
        assert shims.install("p") is not None  # plugin loaded again in the child: no-op
        assert all(p.pid != os.getpid() for p in ledger.active_patches())  # installed by the parent
        shims.uninstall()
        fake.assert_pristine()

    assert _in_child(check) == 0
    assert shims.installed("p") and fake.layers.f(1) == ("f", 1, "A")  # the parent is unaffected


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_another_thread_holds_the_lock(fake: Fake):
    register("p", *all_specs(fake))
    holding, release = threading.Event(), threading.Event()

    def hold():
        with patching.LOCK:
            holding.set()
            release.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    holding.wait(5)
    threading.Timer(0.2, release.set).start()  # fork waits for the lock instead of copying it held

    def check():
        shims.install("p")
        shims.uninstall("p")

    assert _in_child(check) == 0
    t.join()


def test_a_spawned_process_starts_unpatched(fake: Fake):
    register("p", *all_specs(fake))
    shims.install("p")
    code = "from maxtext_compat import shims; assert not shims.installed() and shims.active_profiles() == []"
    subprocess.run([sys.executable, "-c", code], check=True)  # the vLLM plugin must install it there itself
    assert shims.installed("p")


def test_import_shims_is_lazy():
    code = (
        "import sys, maxtext_compat.shims as s\n"
        "assert 'maxtext_compat.patching' not in sys.modules and 'wrapt' not in sys.modules\n"
        "assert callable(s.install) and 'maxtext_compat.patching' in sys.modules\n"
        "assert 'install' in dir(s)\n"
        "try:\n    s.nope\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------- callables and values


def test_a_profile_of_callables_and_values_installs_and_goes_as_one(fake: Fake, monkeypatch):
    """A builder may return Settings beside PatchSpecs: one PatchSet, one ledger, one removal."""
    from maxtext_compat.patching.settings import Setting, attribute_slot, env_slot

    monkeypatch.delenv("MAXTEXT_COMPAT_TEST_PROFILE_VALUE", raising=False)
    stock = fake.layers.Attention.s
    values = [
        Setting(attribute_slot(fake.layers, "LIMIT", f"{fake.pkg}.layers:LIMIT"), 64, "test.limit"),
        Setting(env_slot("MAXTEXT_COMPAT_TEST_PROFILE_VALUE"), "on", "test.env"),
    ]
    shims.register_profile("mixed", lambda: [*all_specs(fake), *values])
    patch_set = shims.install("mixed")
    assert patch_set is not None
    assert fake.layers.LIMIT == 64 and os.environ["MAXTEXT_COMPAT_TEST_PROFILE_VALUE"] == "on"
    assert fake.layers.f(5) == ("f", 5, "A")
    listed = {p.target for p in ledger.active_patches() if p.profile == "mixed"}
    assert (
        listed == set(patch_set.targets) >= {f"{fake.pkg}.layers:LIMIT", "os.environ:MAXTEXT_COMPAT_TEST_PROFILE_VALUE"}
    )
    assert {p.target for p in patch_set.patches} == listed
    shims.uninstall("mixed")
    assert not hasattr(fake.layers, "LIMIT") and "MAXTEXT_COMPAT_TEST_PROFILE_VALUE" not in os.environ
    assert fake.layers.Attention.s is stock
    fake.assert_pristine()


def test_a_value_that_cannot_be_set_leaves_every_callable_unwrapped(fake: Fake):
    from maxtext_compat.patching.settings import Setting, global_slot

    def refuse(value):
        raise OSError("read-only")

    bad = Setting(global_slot(lambda: "stock", refuse, "read-only global"), "ours", "test.global")
    shims.register_profile("mixed", lambda: [*all_specs(fake), bad])
    with pytest.raises(OSError, match="read-only"):
        shims.install("mixed")
    assert not shims.installed("mixed") and ledger.active_patches() == []
    fake.assert_pristine()


def test_a_wrapper_that_cannot_be_written_takes_the_values_back(fake: Fake, mocker, monkeypatch):
    from maxtext_compat.patching import transaction
    from maxtext_compat.patching.settings import Setting, env_slot

    monkeypatch.setenv("MAXTEXT_COMPAT_TEST_PROFILE_VALUE", "theirs")
    value = Setting(env_slot("MAXTEXT_COMPAT_TEST_PROFILE_VALUE"), "ours", "test.env")
    shims.register_profile("mixed", lambda: [*all_specs(fake), value])
    mocker.patch.object(transaction, "commit_writes", side_effect=PatchError("injected", argument="x"))
    with pytest.raises(PatchError, match="injected"):
        shims.install("mixed")
    assert os.environ["MAXTEXT_COMPAT_TEST_PROFILE_VALUE"] == "theirs"
    assert not shims.installed("mixed") and ledger.active_patches() == []
    fake.assert_pristine()


def test_a_builders_own_typed_error_reaches_the_caller_unchanged():
    def builder():
        raise InvalidArgumentError("the sampler is not a jax.jit function", argument="sampling.sample")

    shims.register_profile("typed", builder)
    with pytest.raises(InvalidArgumentError, match=r"not a jax\.jit") as e:
        shims.install("typed")
    assert e.value.argument == "sampling.sample"
    shims.register_profile("untyped", lambda: [object()])
    with pytest.raises(ProfileError, match="PatchSpec or Setting"):
        shims.install("untyped")


# --------------------------------------------------------------------------------------------- the wrapper marker


def test_every_wrapper_names_its_profile_unbound_and_bound(fake: Fake):
    """Each wrapper's type carries the marker (a property naming the profile), the signature-advertising kind and
    the bound forms included; what is not ours, and someone else's proxy around ours, do not answer for it."""
    original = vars(fake.layers.Attention)["__call__"]
    register("p", *all_specs(fake))
    shims.install("p")
    installed = [vars(fake.layers.Attention)[k] for k in ("__call__", "s", "c")] + [fake.layers.f]
    assert [patching.wrapper_profile(w) for w in installed] == ["p"] * 4
    bound = fake.layers.Attention().__call__
    assert isinstance(bound, wrapt.BoundFunctionWrapper) and patching.wrapper_profile(bound) == "p"
    assert getattr(vars(fake.layers.Attention)["__call__"], patching.WRAPPER_MARKER) == "p"
    assert patching.wrapper_profile(original) is None and patching.wrapper_profile(42) is None
    around_ours = wrapt.FunctionWrapper(vars(fake.layers.Attention)["__call__"], lambda w, i, a, k: w(*a, **k))
    assert getattr(around_ours, patching.WRAPPER_MARKER) == "p"  # a proxy forwards the read to ours ...
    assert patching.wrapper_profile(around_ours) is None  # ... but the type says whose it is
    assert patching.original_beneath(vars(fake.layers.Attention)["__call__"]) is original


def test_a_wrapper_of_ours_this_copy_did_not_install_is_named_as_such(fake: Fake):
    """A wrapper taken while installed and written back after its uninstall reads as another copy's would: the
    install refuses it naming maxtext-compat and the profile, and what runs beneath it is still the release's."""
    original = vars(fake.layers.Attention)["__call__"]
    register("p", PatchSpec(fake.target("Attention.__call__"), tagger("A")))
    shims.install("p")
    kept = vars(fake.layers.Attention)["__call__"]
    shims.uninstall()
    fake.layers.Attention.__call__ = kept  # a user's copy, written back
    assert patching.layer_of(kept) is None and patching.original_beneath(kept) is original
    register("q", PatchSpec(fake.target("Attention.__call__"), tagger("B")))
    with pytest.raises(PatchConflictError) as err:
        shims.install("q")
    msg = str(err.value)
    assert "a maxtext-compat wrapper of profile 'p' that this copy of maxtext-compat did not install" in msg, msg
    assert vars(fake.layers.Attention)["__call__"] is kept and not shims.installed("q")
    fake.layers.Attention.__call__ = original
