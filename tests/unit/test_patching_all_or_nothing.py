"""Issue-11 §4: patches are all-or-nothing for every caller, every thread and every alias.

Each test names what it found (each failed before the fix).
"""

from __future__ import annotations

import sys
import threading
import types

import pytest

from maxtext_compat import shims
from maxtext_compat.errors import ProfileError
from maxtext_compat.shims import PatchSpec


def _factory(original):
    def wrapper(wrapped, instance, args, kwargs):
        return ("patched", wrapped(*args, **kwargs))

    return wrapper


@pytest.fixture
def target(request):
    """A fresh module `aon_<test>` with a function f and a class C.m, and a profile patching both."""
    name = f"aon_{request.node.name}".replace("[", "_").replace("]", "_").replace("-", "_")
    mod = types.ModuleType(name)
    exec("def f(x):\n    return ('orig', x)\nclass C:\n    def m(self, x):\n        return ('orig', x)\n", mod.__dict__)
    sys.modules[name] = mod
    profile = f"profile-{name}"
    shims.register_profile(profile, lambda: [PatchSpec(f"{name}:f", _factory), PatchSpec(f"{name}:C.m", _factory)])
    yield mod, profile
    shims.uninstall(profile, force=True)
    shims.unregister_profile(profile)
    del sys.modules[name]


def test_a_copy_taken_while_installed_runs_the_original_after_uninstall(target):
    """Found: `from pkg.mod import f` while a profile was installed kept the wrapper after uninstall()."""
    mod, profile = target
    shims.install(profile)
    f_copy, m_copy = mod.f, mod.C.m  # what `from mod import f` / `m = C.m` take while installed
    assert f_copy(1) == ("patched", ("orig", 1)) and m_copy(mod.C(), 2) == ("patched", ("orig", 2))
    shims.uninstall(profile)
    assert f_copy(1) == ("orig", 1) and m_copy(mod.C(), 2) == ("orig", 2)
    assert mod.f(1) == ("orig", 1)
    shims.install(profile)  # and on again when re-installed
    assert f_copy(1) == ("patched", ("orig", 1))


def test_install_inside_a_patched_block_survives_the_block(target):
    """Found: install() inside `with patched()` was undone when the block exited."""
    mod, profile = target
    with shims.patched(profile):
        shims.install(profile)
    assert shims.installed(profile) and mod.f(1)[0] == "patched"


def test_nested_blocks_keep_the_profile_until_the_outermost_leaves(target):
    mod, profile = target
    with shims.patched(profile):
        with shims.patched(profile):
            pass
        assert mod.f(1)[0] == "patched"
    assert not shims.installed(profile) and mod.f(1) == ("orig", 1)


def test_a_thread_leaving_its_block_does_not_unpatch_another_threads_block(target):
    """Found: with two threads in `with patched()`, one ran the original as soon as the other left."""
    mod, profile = target
    both_in, first_out = threading.Barrier(2), threading.Event()
    seen: dict[str, object] = {}

    def first():
        with shims.patched(profile):
            both_in.wait()
        first_out.set()

    def second():
        with shims.patched(profile):
            both_in.wait()
            first_out.wait()
            seen["after the other left"] = mod.f(1)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen["after the other left"] == ("patched", ("orig", 1))
    assert not shims.installed(profile)  # the last block out removed it


def test_uninstall_while_a_block_runs_is_refused_unless_forced(target):
    mod, profile = target
    with shims.patched(profile):
        with pytest.raises(ProfileError) as e:
            shims.uninstall(profile)
        assert "1 block(s)" in str(e.value) and "force=True" in str(e.value)
        assert mod.f(1)[0] == "patched"
        shims.uninstall(profile, force=True)
        assert mod.f(1) == ("orig", 1)
    assert not shims.installed(profile)
