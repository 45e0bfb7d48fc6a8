"""Reliability on a real MaxText: its own classes' `__call__` never fails while the real profile churns.

The installed release's profile (`vllm-backport` on 0.1.0, `known-defects` on 0.2.5, as
`maxtext_profiles.choose` picks it) is installed and uninstalled 10,000 times while 8 threads
call MaxText's patched attributes. An eager call of a real layer on tiny inputs costs
milliseconds to seconds (tracing), which would leave the installer a handful of swaps; so the
callers take a lightweight path through the very same attributes: `Class.__call__(fake_self,
*sentinels)` runs the shim's wrapper (when installed) and then MaxText's own body, which stops
at its first read of `self`/the config/an input with `ReachedOriginal`. A call passes when it
reaches MaxText's body (through the wrapper or not), the pyconfig validator answers with either
the patched or the original result, and `inspect.signature` shows one of the two signatures;
anything else (an exception from a half-swapped wrapper, a wrong signature) is a failure.
Adapters take the same path (old calls; new calls on 0.2.5 only: on 0.1.0 a new call can race the
shim's removal, see test_reliability_concurrency.py). At the end every class and the pyconfig module
hold their originals by identity.
"""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.needs_shim_profile]

from helpers.callers import CallerThreads  # noqa: E402
from maxtext_compat import (  # noqa: E402
    patching,
    resolve,
    shims,
)
from maxtext_compat.adapters.wrapper import adapted_class  # noqa: E402
from maxtext_compat.convention.signature import native_signature  # noqa: E402
from maxtext_compat.patching import ledger  # noqa: E402
from maxtext_compat.shims import maxtext_profiles  # noqa: E402
from maxtext_compat.switches import env_count  # noqa: E402
from maxtext_compat.testing.checkless import checkless_calls  # noqa: E402

# The 10,000 install/uninstall cycles on every release (make test-extended). known-defects (0.2.5) has 2
# targets; vllm-backport (0.1.0) has 13, builds a call rule per class and sweeps every imported MaxText module for
# `from x import f` aliases at each install (~25 ms per cycle beside 8 callers on a busy 2-core machine, the rules'
# generated binders compiled once per signature). MAXTEXT_COMPAT_RELIABILITY_CYCLES overrides it.
DEFAULT_CYCLES = 600  # make test; the loop runs on until every site is seen in both states
MAX_SECONDS = 120.0  # cycling past DEFAULT_CYCLES only to see every site in both states
CYCLES_ENV = "MAXTEXT_COMPAT_RELIABILITY_CYCLES"
CALLERS = 8
YIELD_EVERY = 8
WRAPPER_FILES = ("rule_patches.py", "defect_patches.py", "maxtext_profiles.py", "hooks.py")  # where wrappers live


class ReachedOriginal(Exception):
    """MaxText's own body ran up to its first real read (the call got through the dispatch)."""


class FakeConfig:
    attention = "vllm_rpa"

    def __init__(self, scan_layers: bool) -> None:
        self.scan_layers = scan_layers

    def __getattr__(self, name: str) -> Any:
        raise ReachedOriginal(f"config.{name}")


class FakeSelf:
    """Stands in for a module instance: only `config` exists, any other read stops MaxText's body."""

    def __init__(self, scan_layers: bool = False) -> None:
        self.config = FakeConfig(scan_layers)

    def __getattr__(self, name: str) -> Any:
        raise ReachedOriginal(f"self.{name}")


class Sentinel:
    def __getattr__(self, name: str) -> Any:
        raise ReachedOriginal(f"argument.{name}")


# A new call's KV cache and metadata: stand-ins never read by MaxText's body before it stops at `self`. The adapters
# are built with a write path that records instead of checking them (maxtext_compat.testing.checkless): what churns
# here is the routing, and a real cache's checks are tests/compat/test_adapters_new_call.py's.
KV_STANDIN, METADATA_STANDIN = "kv-cache stand-in", "metadata stand-in"


def _resolve_target(target: str) -> tuple[Any, str]:
    module, _, path = target.partition(":")
    owner: Any = importlib.import_module(module)
    *classes, attr = path.split(".")
    for part in classes:
        owner = getattr(owner, part)
    return owner, attr


def _positional(fn: Any) -> list[Any]:
    """Sentinels for the required positional parameters (model_mode/deterministic get real values)."""
    special = {"model_mode": "train", "deterministic": True}
    required = [p for p in native_signature(fn).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
    return [special.get(p.name, Sentinel()) for p in required if p.default is p.empty]


def _traceback_files(exc: BaseException) -> list[str]:
    """The file of each frame on the traceback, outermost first (walked by hand: extract_tb reads source lines)."""
    tb, files = exc.__traceback__, []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return files


def _through_wrapper(exc: BaseException) -> bool:
    """Whether a shim wrapper is on the traceback."""
    return any(f.endswith(WRAPPER_FILES) for f in _traceback_files(exc))


# A site: (name, call, the states it must show) where call returns "patched" / "original" or raises.
Site = tuple[str, Callable[[], str], frozenset[str]]
BOTH, ORIGINAL = frozenset({"patched", "original"}), frozenset({"original"})


class Failure(Exception):
    pass


def _reader(exc: BaseException) -> str:
    """The file of the frame whose attribute read raised (the one below FakeSelf's/Sentinel's __getattr__)."""
    files = _traceback_files(exc)
    return files[-2] if len(files) > 1 else ""


def _in_maxtext(path: str) -> bool:
    parts = Path(path).parts
    return ("maxtext" in parts or "MaxText" in parts) and "maxtext_compat" not in parts


def _reaches(name: str, call: Callable[[], Any]) -> Callable[[], str]:
    def run() -> str:
        try:
            out = call()
        except ReachedOriginal as exc:
            if not _in_maxtext(reader := _reader(exc)):  # our own checks read a stand-in: MaxText never ran
                raise Failure(f"{name} stopped in {reader} ({exc}) before MaxText's body") from exc
            return "patched" if _through_wrapper(exc) else "original"
        raise Failure(f"{name} returned {out!r} instead of reaching MaxText's body")

    return run


def call_sites(name: str, targets: list[str]) -> list[Site]:
    """Per-thread call sites over every `__call__` target of the profile, pyconfig, signatures, adapters."""
    row = maxtext_profiles._row()
    scanned = name == maxtext_profiles.DEFECTS  # known-defects acts on scanned layers given a kv_cache
    kw = {"kv_cache": KV_STANDIN, "attention_metadata": METADATA_STANDIN} if scanned else {}
    sites: list[Site] = []
    for target in targets:
        owner, attr = _resolve_target(target)
        if attr != "__call__":
            continue
        args = _positional(getattr(owner, attr))
        sites.append((target, _reaches(target, lambda o=owner, a=args: o.__call__(FakeSelf(scanned), *a, **kw)), BOTH))
    attention = row.classes["attention"].load()
    with checkless_calls():
        adapter = adapted_class(attention, row=row, kind="attention")
    patched = BOTH if f"{row.classes['attention']}.__call__" in targets else ORIGINAL

    def attention_call(**new: Any) -> Any:
        return adapter.__call__(FakeSelf(), Sentinel(), Sentinel(), **new)

    sites.append(("adapter attention old", _reaches("adapter", attention_call), patched))
    if row.has_kv_params:
        new = {"model_mode": "autoregressive", "kv_cache": KV_STANDIN, "attention_metadata": METADATA_STANDIN}
        with checkless_calls():
            llama = adapted_class(row.decoder_layers["llama2"].load(), row=row, kind="decoder_layer")
        # The profile patches the Llama layer only where the release lacks its scan carry (0.2.5, not 0.2.4).
        llama_patched = BOTH if f"{row.decoder_layers['llama2']}.__call__" in targets else ORIGINAL

        def layer_call() -> Any:
            return llama.__call__(FakeSelf(True), Sentinel(), None, Sentinel(), True, **new)

        sites.append(("adapter layer new", _reaches("adapter", layer_call), llama_patched))
        sites.append(("adapter attention new", _reaches("adapter", lambda: attention_call(**new)), patched))
    else:
        pyconfig = importlib.import_module(row.config.pyconfig)

        def validate() -> str:
            try:
                return "patched" if pyconfig.validate_attention_kernel("vllm_rpa") is None else "?"
            except ValueError:
                return "original"

        def signature() -> str:
            return "patched" if "kv_cache" in inspect.signature(attention.__call__).parameters else "original"

        sites += [("pyconfig", validate, BOTH), ("signature", signature, BOTH)]
    return sites  # fmt: skip


class Callers(CallerThreads):
    def __init__(self, name: str, targets: list[str]) -> None:
        super().__init__(CALLERS, YIELD_EVERY)
        self.name, self.targets = name, targets
        self.seen: set[tuple[str, str]] = set()

    def prepare(self, i: int) -> list[Site]:
        sites = call_sites(self.name, self.targets)
        self.expected = {site: states for site, _, states in sites}
        return sites

    def step(self, i: int, n: int, sites: list[Site]) -> None:
        site, call, _ = sites[n % len(sites)]
        try:
            self.seen.add((site, call()))
        except BaseException as exc:
            self.failures.append(f"{site}: {type(exc).__name__}: {exc}")


@pytest.fixture
def profile() -> Iterator[str]:
    name = maxtext_profiles.choose(resolve(probe=False))
    assert name is not None, "the installed release needs no shim: nothing to churn"
    shims.uninstall()
    yield name
    shims.uninstall()


def _originals(name: str) -> tuple[list[str], list[tuple[Any, dict[str, Any]]]]:
    patch_set = shims.install(name)  # imports the targets once; a cold MaxText import takes seconds
    targets = list(patch_set.targets)
    shims.uninstall(name)
    owners = {id(o): o for o in (_resolve_target(t)[0] for t in targets)}
    return targets, [(o, dict(vars(o))) for o in owners.values()]


def test_maxtext_classes_never_fail_while_the_real_profile_churns(profile: str, record_property):
    cycles = env_count(CYCLES_ENV, default=DEFAULT_CYCLES, maximum=1_000_000)
    targets, before = _originals(profile)
    with Callers(profile, targets) as callers:
        want = {(site, state) for site, states in callers.expected.items() for state in states}
        t0 = time.perf_counter()
        done = 0
        # At least `cycles`; then on until every site has been seen in both states (a fast churn can
        # finish before the 8 callers, which share 2 cores, reach each site while the shim is in).
        while done < cycles or (callers.seen != want and time.perf_counter() - t0 < MAX_SECONDS):
            shims.install(profile)
            shims.uninstall(profile)
            done += 1
        elapsed = time.perf_counter() - t0
    record_property("cycles", done)
    record_property("seconds", round(elapsed, 3))
    print(f"\n{profile}: {done} cycles, {len(targets)} targets, {CALLERS} callers: {elapsed:.2f} s, "
          f"{sum(callers.calls)} calls")  # fmt: skip
    assert callers.failures == [], callers.failures[:5]
    assert callers.seen == want  # every site reached MaxText's body both through the shim and without it
    for owner, attrs in before:  # every original back by identity, nothing added
        assert set(vars(owner)) == set(attrs), owner
        assert all(vars(owner)[k] is v for k, v in attrs.items()), owner
    assert not shims.installed(profile)
    assert [p for p in ledger.active_patches() if p.profile == profile] == []
    assert [layer for layer in patching.installed_layers() if layer.profile == profile] == []
