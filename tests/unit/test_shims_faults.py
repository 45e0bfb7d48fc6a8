"""Fault injection: whatever fails, wherever in the install (or uninstall) sequence, the result is all
or nothing — nothing patched, registry empty, aliases untouched, no marker — and the error is typed."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import wrapt

from helpers.fake_layers import LAYERS_SOURCE, tagger
from helpers.fake_modules import FakePackage, make_module
from maxtext_compat import patching, shims
from maxtext_compat.errors import PatchConflictError, PatchError, PatchTargetError
from maxtext_compat.patching import MARKER, PatchSpec, add_keyword_params, ledger, profiles

# Classes that refuse to be read or written, next to the shared fake layers.
HOSTILE_SOURCE = """

class HostileMeta(type):
    @property
    def __dict__(cls):
        raise RuntimeError("this class refuses to be read")


class Hostile(metaclass=HostileMeta):
    def m(self):
        return "m"


class ReadOnlyMeta(type):
    def __setattr__(cls, name, value):
        raise TypeError(f"{cls.__name__} is read-only")


class ReadOnly(metaclass=ReadOnlyMeta):
    def m(self):
        return "m"
"""
SOURCE = LAYERS_SOURCE + HOSTILE_SOURCE

# The profile under test: one target of every kind, in install order.
POSITIONS = ["Attention.__call__", "Attention.s", "Attention.c", "Attention.inherited", "f"]


class Fake(FakePackage):
    def __init__(self) -> None:
        super().__init__("fakeflt")
        self.layers = make_module(f"{self.pkg}.layers", SOURCE)
        self.user = make_module(f"{self.pkg}.user", f"from {self.pkg}.layers import f\nalias = f\n")
        self.snapshot = self.take_snapshot()

    def owners(self) -> list[object]:
        return [self.layers, self.user, self.layers.Attention, self.layers.Base]

    def specs(self, tag: str = "A") -> list[PatchSpec]:
        return [
            PatchSpec(self.target(p), tagger(tag), signature=add_keyword_params("kv_cache") if i == 0 else None)
            for i, p in enumerate(POSITIONS)
        ]

    def assert_nothing_patched(self) -> None:
        self.assert_pristine()
        assert MARKER not in vars(self.layers) and MARKER not in vars(self.layers.Attention)
        assert ledger.active_patches() == [] and patching.installed_layers() == ()
        assert not shims.installed()
        a = self.layers.Attention()
        assert a(1) == ("call", 1) and a.s(1) == ("s", 1) and a.inherited(1) == ("inherited", 1)
        assert self.user.f(1) == ("f", 1) and self.user.alias is self.layers.f

    def assert_fully_patched(self) -> None:
        a = self.layers.Attention()
        assert a(1) == ("call", 1, "A") and a.s(1) == ("s", 1, "A") and a.c(1) == ("c", 1, "A")
        assert a.inherited(1) == ("inherited", 1, "A") and self.user.f(1) == ("f", 1, "A")
        assert self.user.alias is self.layers.f
        assert len(ledger.active_patches()) == len(POSITIONS) and shims.verify() == {"p": []}


@pytest.fixture
def fake() -> Iterator[Fake]:
    fk = Fake()
    yield fk
    shims.uninstall(force=True)
    for name in ("p", "q"):
        if name in profiles.registered_profiles():
            shims.unregister_profile(name)
    fk.cleanup()


def install_with(fake: Fake, specs: list[PatchSpec], **kw) -> None:
    shims.register_profile("p", lambda: specs, replace=True)
    shims.install("p", **kw)


# --------------------------------------------------------------------------------------------- install faults


@pytest.mark.parametrize("position", range(len(POSITIONS)))
def test_missing_target_at_any_position(fake: Fake, position: int):
    specs = fake.specs()
    specs[position] = PatchSpec(fake.target(POSITIONS[position] + "_gone"), tagger("A"))
    with pytest.raises(PatchTargetError) as err:
        install_with(fake, specs)
    missing = POSITIONS[position].rpartition(".")[2] + "_gone"
    assert err.value.argument == specs[position].target and f"no {missing!r}" in str(err.value.found)
    fake.assert_nothing_patched()


@pytest.mark.parametrize("position", range(len(POSITIONS)))
def test_module_vanishing_between_import_and_swap(fake: Fake, position: int, mocker):
    extra = make_module(f"{fake.pkg}.extra", "def g(x):\n    return ('g', x)\n")
    specs = fake.specs()
    specs[position] = PatchSpec(f"{extra.__name__}:g", tagger("A"))
    real_import = patching.import_modules

    def import_then_vanish(s):
        real_import(s)
        del sys.modules[extra.__name__]  # another thread unloads it before we take the lock

    mocker.patch.object(patching, "import_modules", side_effect=import_then_vanish)
    with pytest.raises(PatchTargetError, match="is not imported"):
        install_with(fake, specs)
    fake.assert_nothing_patched()


@pytest.mark.parametrize("position", range(len(POSITIONS)))
def test_target_raising_on_access_at_any_position(fake: Fake, position: int):
    specs = fake.specs()
    specs[position] = PatchSpec(fake.target("Hostile.m"), tagger("A"))
    with pytest.raises(PatchTargetError, match="refuses to be read") as err:
        install_with(fake, specs)
    assert isinstance(err.value.__cause__, RuntimeError)
    fake.assert_nothing_patched()


@pytest.mark.parametrize("position", range(len(POSITIONS)))
def test_module_import_raising_at_any_position(fake: Fake, position: int, tmp_path: Path, monkeypatch):
    name = f"{fake.pkg}_broken"
    (tmp_path / f"{name}.py").write_text("raise ImportError('needs libtpu')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    specs = fake.specs()
    specs[position] = PatchSpec(f"{name}:g", tagger("A"))
    with pytest.raises(PatchTargetError, match="needs libtpu") as err:
        install_with(fake, specs)
    assert err.value.argument == name
    fake.assert_nothing_patched()


@pytest.mark.parametrize("position", range(len(POSITIONS)))
def test_target_already_wrapped_at_any_position(fake: Fake, position: int):
    owner_path, _, attr = POSITIONS[position].rpartition(".")
    owner = fake.layers if not owner_path else getattr(fake.layers, owner_path)

    def theirs(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(owner, attr, theirs)
    fake.snapshot = fake.take_snapshot()  # their wrapper is the state to preserve
    with pytest.raises(PatchConflictError) as err:
        install_with(fake, fake.specs())
    assert err.value.argument == fake.target(POSITIONS[position])
    assert "stack=True" in str(err.value)
    for before, owner_ in zip(fake.snapshot, fake.owners(), strict=True):
        assert all(vars(owner_)[k] is v for k, v in before.items())
    assert ledger.active_patches() == [] and not shims.installed()


@pytest.mark.parametrize("position", range(len(POSITIONS)))
@pytest.mark.parametrize("fault", ["factory", "signature", "returns"])
def test_broken_spec_at_any_position(fake: Fake, position: int, fault: str):
    def bad_factory(original):
        raise ValueError("factory bug")

    def bad_signature(fn):
        raise ValueError("signature bug")

    specs = fake.specs()
    target = specs[position].target
    if fault == "factory":
        specs[position] = PatchSpec(target, bad_factory)
    elif fault == "signature":
        specs[position] = PatchSpec(target, tagger("A"), signature=bad_signature)
    else:
        specs[position] = PatchSpec(target, lambda original: None)
    with pytest.raises(PatchError) as err:
        install_with(fake, specs)
    assert err.value.argument == target
    fake.assert_nothing_patched()


def count_writes(fake: Fake, mocker, action) -> int:
    real = patching.writes._write
    spy = mocker.patch.object(patching.writes, "_write", side_effect=real)
    action()
    n = spy.call_count
    mocker.stopall()
    return n


def failing_write(at: int, exc: BaseException):
    real = patching.writes._write
    calls = {"n": 0}

    def write(obj, name, value):
        calls["n"] += 1
        if calls["n"] == at + 1:
            raise exc
        real(obj, name, value)

    return write


def test_every_install_write_can_fail_and_is_rolled_back(fake: Fake, mocker):
    n = count_writes(fake, mocker, lambda: install_with(fake, fake.specs()))
    shims.uninstall()
    assert n == len(POSITIONS) + 2 + 2  # 5 targets, 2 aliases, 2 markers
    for at in range(n):
        mocker.patch.object(patching.writes, "_write", side_effect=failing_write(at, TypeError("read-only")))
        with pytest.raises(PatchTargetError) as err:
            install_with(fake, fake.specs())
        assert f"the {at} earlier change(s) were rolled back" in str(err.value)
        mocker.stopall()
        fake.assert_nothing_patched()
    install_with(fake, fake.specs())  # and a clean install still works afterwards
    fake.assert_fully_patched()


def test_every_uninstall_write_can_fail_and_leaves_it_installed(fake: Fake, mocker):
    install_with(fake, fake.specs())
    n = count_writes(fake, mocker, shims.uninstall)
    for at in range(n):
        install_with(fake, fake.specs())
        mocker.patch.object(patching.writes, "_write", side_effect=failing_write(at, TypeError("read-only")))
        with pytest.raises(PatchTargetError):
            shims.uninstall()
        mocker.stopall()
        fake.assert_fully_patched()
        assert shims.uninstall() == ["p"]
        fake.assert_nothing_patched()


def test_interrupt_during_install_is_rolled_back_and_reraised(fake: Fake, mocker):
    mocker.patch.object(patching.writes, "_write", side_effect=failing_write(3, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        install_with(fake, fake.specs())
    mocker.stopall()
    fake.assert_nothing_patched()


def test_failed_rollback_says_the_process_is_inconsistent(fake: Fake, mocker):
    real = patching.writes._write
    calls = {"n": 0}

    def write(obj, name, value):
        calls["n"] += 1
        if calls["n"] >= 3:  # the third write and every undo fail
            raise TypeError("frozen")
        real(obj, name, value)

    mocker.patch.object(patching.writes, "_write", side_effect=write)
    with pytest.raises(PatchError, match="rolling back failed too") as err:
        install_with(fake, fake.specs())
    assert "restart the process" in str(err.value)
    mocker.stopall()
    for obj_name in ("__call__", "s"):  # put the fixture back by hand: the rollback could not
        raw = fake.snapshot[2][obj_name]
        type.__setattr__(fake.layers.Attention, obj_name, raw)


@pytest.mark.parametrize("position", range(len(POSITIONS)))
def test_real_read_only_class_at_any_position(fake: Fake, position: int):
    specs = fake.specs()
    specs[position] = PatchSpec(fake.target("ReadOnly.m"), tagger("A"))
    with pytest.raises(PatchTargetError, match="refuses assignment") as err:
        install_with(fake, specs)
    assert "ReadOnly.m" in str(err.value.argument)
    fake.assert_nothing_patched()
    assert vars(fake.layers.ReadOnly)["m"].__name__ == "m"


# --------------------------------------------------------------------------------------------- uninstall faults


@pytest.mark.parametrize("position", range(len(POSITIONS)))
def test_replaced_wrapper_at_any_position_blocks_the_whole_uninstall(fake: Fake, position: int):
    install_with(fake, fake.specs())
    owner_path, _, attr = POSITIONS[position].rpartition(".")
    owner = fake.layers if not owner_path else getattr(fake.layers, owner_path)
    theirs = staticmethod(lambda *a: ("theirs",))
    setattr(owner, attr, theirs)
    with pytest.raises(PatchConflictError) as err:
        shims.uninstall()
    assert fake.target(POSITIONS[position]) in str(err.value)
    assert shims.installed("p") and vars(owner)[attr] is theirs
    others = [p for i, p in enumerate(POSITIONS) if i != position]
    assert all(p in {r.target.split(":")[1] for r in ledger.active_patches()} for p in others)
    assert shims.uninstall(force=True) == ["p"]
    fake.assert_nothing_patched()


def test_uninstall_all_checks_every_profile_first(fake: Fake):
    install_with(fake, fake.specs())
    shims.register_profile("q", lambda: [PatchSpec(fake.target("f"), tagger("B"))])
    shims.install("q")
    fake.layers.Attention.s = staticmethod(lambda x: ("theirs", x))  # breaks profile p only
    with pytest.raises(PatchConflictError):
        shims.uninstall()  # q (newest) must not be removed before p's conflict is found
    assert shims.active_profiles() == ["p", "q"] and fake.user.f(1) == ("f", 1, "A", "B")
    assert shims.uninstall(force=True) == ["q", "p"]
    fake.assert_nothing_patched()
