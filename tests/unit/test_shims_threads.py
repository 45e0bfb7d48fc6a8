"""Thread safety of the shim patching core: callers never fail while other threads install and uninstall.

MAXTEXT_COMPAT_SHIM_CYCLES sets the number of install/uninstall cycles (default 1000; the
reliability suite runs 10000). Callers release the GIL every YIELD_EVERY calls, as real
callers do inside JAX; pure-Python spinning callers would keep the installer to ~1/9 of the
interpreter in 5 ms slices, which is slower *and* shows callers fewer mid-swap states.
MAXTEXT_COMPAT_SHIM_YIELD_EVERY=0 selects spinning callers.
"""

from __future__ import annotations

import os
import random
import sys
import textwrap
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator

import pytest

from maxtext_compat import shims
from maxtext_compat.shims import patching, profiles, registry
from maxtext_compat.shims.patching import PatchSpec, add_keyword_params

CYCLES = int(os.environ.get("MAXTEXT_COMPAT_SHIM_CYCLES", "1000"))
CALLERS = 8
YIELD_EVERY = int(os.environ.get("MAXTEXT_COMPAT_SHIM_YIELD_EVERY", "20"))

SOURCE = """
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


class Fake:
    def __init__(self) -> None:
        self.pkg = f"fakethr_{uuid.uuid4().hex[:8]}"
        self.layers = self._module(f"{self.pkg}.layers", SOURCE)
        self.user = self._module(f"{self.pkg}.user", f"from {self.pkg}.layers import f\n")
        self.owners = [self.layers, self.user, self.layers.Attention, self.layers.Base]
        self.snapshot = [dict(vars(o)) for o in self.owners]

    def _module(self, name: str, source: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        sys.modules[name] = mod
        exec(textwrap.dedent(source), mod.__dict__)
        return mod

    def target(self, path: str) -> str:
        return f"{self.pkg}.layers:{path}"

    def assert_pristine(self) -> None:
        for before, owner in zip(self.snapshot, self.owners, strict=True):
            now = dict(vars(owner))
            assert now.keys() == before.keys() and all(now[k] is before[k] for k in before), owner

    def call_sites(self) -> list[tuple[str, Callable[[int], tuple]]]:
        """Every way a caller reaches a patched target (looked up afresh on each call)."""
        layers, user = self.layers, self.user
        a = layers.Attention()
        return [
            ("call", lambda x: a(x)),
            ("s", lambda x: layers.Attention.s(x)),
            ("c", lambda x: a.c(x)),
            ("inherited", lambda x: a.inherited(x)),
            ("f", lambda x: layers.f(x)),
            ("f", lambda x: user.f(x)),  # the alias imported by name
        ]

    def cleanup(self) -> None:
        for name in [n for n in sys.modules if n.startswith(self.pkg)]:
            del sys.modules[name]


def tag_factory(tag: str):
    def factory(original):
        def wrapper(wrapped, instance, args, kwargs):
            kwargs.pop("kv_cache", None)
            return (*wrapped(*args, **kwargs), tag)

        return wrapper

    return factory


def specs(fake: Fake, tag: str) -> list[PatchSpec]:
    sig = add_keyword_params("kv_cache", "attention_metadata")
    return [
        PatchSpec(fake.target("Attention.__call__"), tag_factory(tag), signature=sig),
        PatchSpec(fake.target("Attention.s"), tag_factory(tag)),
        PatchSpec(fake.target("Attention.c"), tag_factory(tag)),
        PatchSpec(fake.target("Attention.inherited"), tag_factory(tag)),
        PatchSpec(fake.target("f"), tag_factory(tag), signature=add_keyword_params("kv_cache")),
    ]


@pytest.fixture
def fake() -> Iterator[Fake]:
    fk = Fake()
    yield fk
    shims.uninstall(force=True)
    for name in [n for n in profiles.registered_profiles() if n.startswith("thr-")]:
        shims.unregister_profile(name)
    assert registry.active_patches() == [] and patching._OURS == {}
    fk.assert_pristine()
    fk.cleanup()


class Callers:
    """CALLERS threads calling every call site in a loop; a failure is an exception or a bad result."""

    def __init__(self, fake: Fake, valid: Callable[[str, int, tuple], bool]) -> None:
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.calls = [0] * CALLERS
        self.transitions = [0] * CALLERS  # patched <-> original changes a caller saw
        self.shapes: set[int] = set()
        self.started = threading.Barrier(CALLERS + 1)
        self.threads = [threading.Thread(target=self._run, args=(i, fake, valid)) for i in range(CALLERS)]

    def _run(self, i: int, fake: Fake, valid: Callable[[str, int, tuple], bool]) -> None:
        sites = fake.call_sites()
        self.started.wait()
        n, last = 0, 2
        while not self.stop.is_set():
            name, call = sites[n % len(sites)]
            out: tuple = ()
            try:
                out = call(n)
                self.shapes.add(len(out))
                if not valid(name, n, out):
                    self.failures.append(f"{name}({n}) -> {out!r}")
            except BaseException as exc:
                self.failures.append(f"{name}({n}) raised {type(exc).__name__}: {exc}")
            n += 1
            if YIELD_EVERY and n % YIELD_EVERY == 0:
                time.sleep(0)
            if len(out) != last:
                self.transitions[i] += 1
                last = len(out)
        self.calls[i] = n

    def __enter__(self) -> Callers:
        for t in self.threads:
            t.start()
        self.started.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def test_callers_never_fail_during_install_uninstall_cycles(fake: Fake, record_property):
    shims.register_profile("thr-a", lambda: specs(fake, "T"))
    originals = {k: vars(fake.layers.Attention)[k] for k in ("__call__", "s", "c")}
    original_f = fake.layers.f

    def valid(name: str, x: int, out: tuple) -> bool:
        return out in ((name, x), (name, x, "T"))

    with Callers(fake, valid) as callers:
        t0 = time.perf_counter()
        for _ in range(CYCLES):
            shims.install("thr-a")
            shims.uninstall("thr-a")
        elapsed = time.perf_counter() - t0
    record_property("cycles", CYCLES)
    record_property("seconds", round(elapsed, 3))
    calls, seen = sum(callers.calls), sum(callers.transitions)
    print(f"\n{CYCLES} install/uninstall cycles, {CALLERS} callers: {elapsed:.2f} s, {calls} calls, {seen} swaps seen")
    assert callers.failures == []
    assert callers.shapes == {2, 3}  # both the patched and the original path were exercised
    assert all(vars(fake.layers.Attention)[k] is v for k, v in originals.items())
    assert fake.layers.f is original_f and fake.user.f is original_f
    assert "inherited" not in vars(fake.layers.Attention)


def test_callers_run_between_every_single_write(fake: Fake, mocker):
    """The installer yields after each slot write, so callers run in every intermediate state of
    install and uninstall (primary swapped but not its alias, marker not yet written, ...)."""
    shims.register_profile("thr-a", lambda: specs(fake, "T"))
    real_write = patching._write
    writes = [0]

    def write_then_yield(obj, name, value):
        real_write(obj, name, value)
        writes[0] += 1
        time.sleep(0.0001)

    mocker.patch.object(patching, "_write", side_effect=write_then_yield)

    def valid(name: str, x: int, out: tuple) -> bool:
        return out in ((name, x), (name, x, "T"))

    with Callers(fake, valid) as callers:
        for _ in range(50):
            shims.install("thr-a")
            shims.uninstall("thr-a")
    assert callers.failures == [] and writes[0] == 50 * 2 * 8  # 5 targets, 1 alias, 2 markers
    assert sum(callers.transitions) > 50


def test_concurrent_installs_of_one_profile_wrap_once(fake: Fake):
    shims.register_profile("thr-a", lambda: specs(fake, "T"))

    def valid(name: str, x: int, out: tuple) -> bool:
        return out in ((name, x), (name, x, "T"))  # never ("T", "T"): no double wrap

    results: list[object] = []
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(CYCLES // 10):
                if rng.random() < 0.6:
                    results.append(shims.install("thr-a"))
                else:
                    shims.uninstall("thr-a")
        except BaseException as exc:
            errors.append(exc)

    with Callers(fake, valid) as callers:
        workers = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert errors == [] and callers.failures == []
    installed = shims.installed("thr-a")
    assert len([p for p in registry.active_patches() if p.profile == "thr-a"]) == (5 if installed else 0)


def test_concurrent_stacking_of_many_profiles(fake: Fake):
    names = [f"thr-{i}" for i in range(6)]
    for name in names:
        shims.register_profile(name, lambda name=name: specs(fake, name))

    def valid(name: str, x: int, out: tuple) -> bool:
        tags = out[2:]
        return out[:2] == (name, x) and len(set(tags)) == len(tags) and set(tags) <= set(names)

    errors: list[BaseException] = []

    def churn(name: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(CYCLES // 50):
                shims.install(name)
                time.sleep(rng.random() / 10_000)
                shims.uninstall(name)
        except BaseException as exc:
            errors.append(exc)

    with Callers(fake, valid) as callers:
        workers = [threading.Thread(target=churn, args=(n, i)) for i, n in enumerate(names)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert errors == [] and callers.failures == []
    assert not shims.installed()
