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
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from helpers.callers import CallerThreads
from helpers.fake_layers import LAYERS_SOURCE, tagger
from helpers.fake_modules import FakePackage, make_module
from maxtext_compat import patching, shims
from maxtext_compat.patching import PatchSpec, add_keyword_params, ledger, profiles

CYCLES = int(os.environ.get("MAXTEXT_COMPAT_SHIM_CYCLES", "1000"))
CALLERS = 8
YIELD_EVERY = int(os.environ.get("MAXTEXT_COMPAT_SHIM_YIELD_EVERY", "20"))


class Fake(FakePackage):
    def __init__(self) -> None:
        super().__init__("fakethr")
        self.layers = make_module(f"{self.pkg}.layers", LAYERS_SOURCE)
        self.user = make_module(f"{self.pkg}.user", f"from {self.pkg}.layers import f\n")
        self.snapshot = self.take_snapshot()

    def owners(self) -> list[object]:
        return [self.layers, self.user, self.layers.Attention, self.layers.Base]

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


def specs(fake: Fake, tag: str) -> list[PatchSpec]:
    sig = add_keyword_params("kv_cache", "attention_metadata")
    return [
        PatchSpec(fake.target("Attention.__call__"), tagger(tag), signature=sig),
        PatchSpec(fake.target("Attention.s"), tagger(tag)),
        PatchSpec(fake.target("Attention.c"), tagger(tag)),
        PatchSpec(fake.target("Attention.inherited"), tagger(tag)),
        PatchSpec(fake.target("f"), tagger(tag), signature=add_keyword_params("kv_cache")),
    ]


@pytest.fixture
def fake() -> Iterator[Fake]:
    fk = Fake()
    yield fk
    shims.uninstall(force=True)
    for name in [n for n in profiles.registered_profiles() if n.startswith("thr-")]:
        shims.unregister_profile(name)
    assert ledger.active_patches() == [] and patching.installed_layers() == ()
    fk.assert_pristine()
    fk.cleanup()


class Callers(CallerThreads):
    """CALLERS threads calling every call site in a loop; a failure is an exception or a bad result."""

    def __init__(self, fake: Fake, valid: Callable[[str, int, tuple], bool]) -> None:
        super().__init__(CALLERS, YIELD_EVERY)
        self.fake, self.valid = fake, valid
        self.transitions = [0] * CALLERS  # patched <-> original changes a caller saw
        self.last = [2] * CALLERS  # the result length thread i saw last
        self.shapes: set[int] = set()

    def prepare(self, i: int) -> list[tuple[str, Callable[[int], tuple]]]:
        return self.fake.call_sites()

    def step(self, i: int, n: int, sites: list[tuple[str, Callable[[int], tuple]]]) -> None:
        name, call = sites[n % len(sites)]
        out: tuple = ()
        try:
            out = call(n)
            self.shapes.add(len(out))
            if not self.valid(name, n, out):
                self.failures.append(f"{name}({n}) -> {out!r}")
        except BaseException as exc:
            self.failures.append(f"{name}({n}) raised {type(exc).__name__}: {exc}")
        if len(out) != self.last[i]:
            self.transitions[i] += 1
            self.last[i] = len(out)


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
    real_write = patching.writes._write
    writes = [0]

    def write_then_yield(obj, name, value):
        real_write(obj, name, value)
        writes[0] += 1
        time.sleep(0.0001)

    mocker.patch.object(patching.writes, "_write", side_effect=write_then_yield)

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
    assert len([p for p in ledger.active_patches() if p.profile == "thr-a"]) == (5 if installed else 0)


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
