"""Reliability: patched MaxText-like classes and adapters over them never fail while a shim churns.

8 caller threads call, in a loop, both the patched targets (directly) and adapters built over
the same classes (`adapted_class(..., row=0.2.5)`), while the main thread installs and
uninstalls a profile 10,000 times (MAXTEXT_COMPAT_RELIABILITY_CYCLES overrides). The profile
is built from the real MaxText shim factories (`defect_specs` of the 0.2.5 row, the
AttentionOp/pyconfig wrappers of `vllm-backport`) over fake modules that mirror the row's
classes with each release's exact signatures, under a unique package name (a real MaxText in
the same process is never touched). Every result is checked: a call may see the shim or not,
but an adapter always returns its caller's convention. At the end every original is back by
identity. Callers yield the GIL every few calls, as real callers do inside JAX.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import sys
import textwrap
import time
import types
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from helpers.callers import CallerThreads
from helpers.fake_modules import FakePackage, make_module
from helpers.fake_write_path import checkless_write_path  # noqa: F401  (a fixture)
from helpers.shipped import shipped_matrix
from maxtext_compat import patching, shims
from maxtext_compat.adapters.wrapper import adapted_class
from maxtext_compat.convention import callers as caller_convention
from maxtext_compat.matrix import ClassRef, MaxTextRow
from maxtext_compat.patching import PatchSpec, ledger, profiles
from maxtext_compat.shims import maxtext_profiles, rule_patches
from maxtext_compat.switches import env_count

# Pure-Python logic, independent of the environment: run once per matrix run (the unit env).
pytestmark = pytest.mark.envs("unit")

CYCLES = env_count("MAXTEXT_COMPAT_RELIABILITY_CYCLES", default=10_000, maximum=1_000_000)
CALLERS = 8
YIELD_EVERY = 8
PROFILE = "rel-concurrency"
ROW = shipped_matrix().row("0.2.5")

# MaxText 0.2.5's exact parameter lists (see test_adapters_mocked_rows.py for every release).
ATTENTION_PARAMS = (
    "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, bidirectional_mask=None, "
    "rope_kwargs=None, kv_cache=None, attention_metadata=None, shared_key=None, shared_value=None"
)
LAYER_PARAMS = (
    "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, previous_chunk=None, "
    "slot=None, kv_cache=None, attention_metadata=None"
)
CONFIG_SOURCE = """
class Config:
    def __init__(self, scan_layers=False):
        self.attention = "vllm_rpa"
        self.scan_layers = scan_layers
"""
ATTENTION_SOURCE = f"""
class Attention:
    def __init__(self):
        self.model_mode = "train"
        self.config = Config()

    def __call__(self, {ATTENTION_PARAMS}):
        return "OUT", None if kv_cache is None else kv_cache + "+written"
"""
OP_SOURCE = """
class AttentionOp:
    def __init__(self, config=None, *, attention_kernel="dot_product"):
        self.kernel = attention_kernel
"""
# `drops`: like 0.2.5's LlamaDecoderLayer / NNXDecoderLayer under scan_layers=True (scan-unroll-drops-kv).
LAYER_SOURCE = """
class {name}:
    def __init__(self, scan_layers=False):
        self.config = Config(scan_layers)

    def __call__(self, {params}):
        if {drops} and self.config.scan_layers:
            return "Y", None
        return "Y", None if kv_cache is None else kv_cache + "+written"
"""
PYCONFIG_SOURCE = """
def validate_attention_kernel(s):
    return None if s in ("dot_product", "flash") else "unsupported " + s
"""


class FakeRelease(FakePackage):
    """Fake modules for every class the 0.2.5 row's shims touch, and the row pointed at them."""

    def __init__(self) -> None:
        super().__init__("fakerel")
        refs = {
            "attention": ROW.classes["attention"],
            "attention_op": ROW.classes["attention_op"],
            **{f"layer.{fam}": ref for fam, ref in ROW.decoder_layers.items()},
        }
        sources: dict[str, list[str]] = {}
        for key, ref in refs.items():
            assert ref is not None
            if key == "attention":
                src = ATTENTION_SOURCE
            elif key == "attention_op":
                src = OP_SOURCE
            else:
                drops = key in ("layer.llama2", "layer.default")
                src = LAYER_SOURCE.format(name=ref.qualname, params=LAYER_PARAMS, drops=drops)
            sources.setdefault(self._name(ref.module), [CONFIG_SOURCE]).append(src)
        sources[self._name(ROW.config.pyconfig)] = [PYCONFIG_SOURCE]
        self.modules = {name: make_module(name, "".join(src)) for name, src in sources.items()}
        pyconfig = self.modules[self._name(ROW.config.pyconfig)]
        self.user = make_module(f"{self.pkg}.user", f"from {pyconfig.__name__} import validate_attention_kernel\n")
        self.row = dataclasses.replace(
            ROW,
            classes={k: None if r is None else self._ref(r) for k, r in ROW.classes.items()},
            decoder_layers={fam: self._ref(r) for fam, r in ROW.decoder_layers.items()},
            config=dataclasses.replace(ROW.config, pyconfig=self._name(ROW.config.pyconfig)),
        )
        self._owners: list[Any] = [*self.modules.values(), self.user]
        self._owners += [v for m in self.modules.values() for v in vars(m).values() if isinstance(v, type)]
        self.snapshot = self.take_snapshot()

    def owners(self) -> list[Any]:
        return self._owners

    def _name(self, module: str) -> str:
        return f"{self.pkg}.{module}"

    def _ref(self, ref: ClassRef) -> ClassRef:
        return ClassRef(self._name(ref.module), ref.qualname)

    def cls(self, key: str) -> type:
        ref = self.row.decoder_layers[key.split(".", 1)[1]] if key.startswith("layer.") else self.row.classes[key]
        assert ref is not None
        return getattr(self.modules[ref.module], ref.qualname)


def specs(fake: FakeRelease, seen: Iterator[int]) -> list[PatchSpec]:
    """known-defects' real specs, vllm-backport's real AttentionOp/pyconfig wrappers, and a pass-through
    wrapper on Attention that advertises the adapters' signature (what the backport shows)."""

    def counting(original: Any) -> Any:
        def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
            next(seen)
            return wrapped(*args, **kwargs)

        return wrapper

    row = fake.row
    return [
        *maxtext_profiles.defect_specs(row),
        PatchSpec(f"{row.classes['attention']}.__call__", counting, signature=rule_patches._advertise("attention")),
        PatchSpec(f"{row.classes['attention_op']}.__init__", rule_patches._vllm_rpa_op_is_dot_product),
        PatchSpec(f"{row.config.pyconfig}:validate_attention_kernel", rule_patches._accept_vllm_rpa(row)),
    ]


# A call site: (name, call, outcomes) where outcomes maps each valid result to "patched", "original"
# or "both" (the result does not depend on the shim).
Site = tuple[str, Callable[[], Any], dict[Any, str]]
NEW = {"model_mode": "autoregressive", "kv_cache": "KV", "attention_metadata": "MD"}
WRITTEN = ("Y", "KV+written")
ACCEPTED = {None: "patched", "unsupported vllm_rpa": "original"}  # validate_attention_kernel("vllm_rpa")
OP_KERNEL = {"dot_product": "patched", "vllm_rpa": "original"}  # AttentionOp(attention_kernel="vllm_rpa").kernel


def call_sites(fake: FakeRelease) -> list[Site]:
    """Every way a caller reaches the classes; instances are per thread (modules are not shared state)."""
    row = fake.row
    attention = adapted_class(fake.cls("attention"), row=row, kind="attention")()
    layer = {k: adapted_class(fake.cls(f"layer.{k}"), row=row, kind="decoder_layer") for k in row.decoder_layers}
    llama, llama_scanned = layer["llama2"](), layer["llama2"](scan_layers=True)
    default_scanned, qwen3_scanned = layer["default"](scan_layers=True), layer["qwen3"](scan_layers=True)
    native_scanned = fake.cls("layer.llama2")(scan_layers=True)
    native_attention = fake.cls("attention")()
    op, pyconfig = fake.cls("attention_op"), fake.modules[row.config.pyconfig]
    user = fake.user
    args = ("x", "seg", "pos", True)
    return [
        ("adapter attention old", lambda: attention("x", "x", "pos", "seg", deterministic=True), {"OUT": "both"}),
        ("adapter attention new", lambda: attention("x", "x", "pos", None, **NEW), {("OUT", "KV+written"): "both"}),
        ("adapter layer old", lambda: llama(*args, "train"), {"Y": "both"}),
        ("adapter layer new", lambda: llama(*args, **NEW), {WRITTEN: "both"}),
        ("adapter scanned old", lambda: llama_scanned(*args, "train"), {("Y", None): "both"}),
        ("adapter scanned new", lambda: llama_scanned(*args, **NEW), {WRITTEN: "patched", ("Y", None): "original"}),
        ("adapter default new", lambda: default_scanned(*args, **NEW), {WRITTEN: "patched", ("Y", None): "original"}),
        ("adapter qwen3 new", lambda: qwen3_scanned(*args, **NEW), {WRITTEN: "both"}),
        ("native scanned new", lambda: native_scanned(*args, **NEW), {WRITTEN: "patched", ("Y", None): "original"}),
        ("native attention", lambda: native_attention("x", "x", **NEW), {("OUT", "KV+written"): "both"}),
        ("op kernel", lambda: op(attention_kernel="vllm_rpa").kernel, OP_KERNEL),
        ("pyconfig", lambda: pyconfig.validate_attention_kernel("vllm_rpa"), ACCEPTED),
        ("alias", lambda: user.validate_attention_kernel("vllm_rpa"), ACCEPTED),
    ]  # fmt: skip


class Callers(CallerThreads):
    """CALLERS threads cycling through every call site; a failure is an exception or an unexpected result."""

    def __init__(self, fake: FakeRelease) -> None:
        super().__init__(CALLERS, YIELD_EVERY)
        self.fake = fake
        self.outcomes: list[set[tuple[str, str]]] = [set() for _ in range(CALLERS)]

    def prepare(self, i: int) -> list[Site]:
        return call_sites(self.fake)

    def step(self, i: int, n: int, sites: list[Site]) -> None:
        name, call, valid = sites[n % len(sites)]
        try:
            out = call()
            kind = valid.get(out)
            if kind is None:
                self.failures.append(f"{name} -> {out!r}")
            else:
                self.outcomes[i].add((name, kind))
        except BaseException as exc:
            self.failures.append(f"{name} raised {type(exc).__name__}: {exc}")


@pytest.fixture
def fake() -> Iterator[FakeRelease]:
    fk = FakeRelease()
    yield fk
    if PROFILE in profiles.registered_profiles():
        shims.uninstall(PROFILE, force=True)
        shims.unregister_profile(PROFILE)
    fk.cleanup()


@pytest.mark.usefixtures("checkless_write_path")  # strings stand in for caches: the routing is what churns
def test_patched_classes_and_adapters_never_fail_while_the_shim_churns(fake: FakeRelease, record_property):
    wrapper_calls = itertools.count()
    shims.register_profile(PROFILE, lambda: specs(fake, wrapper_calls))
    with Callers(fake) as callers:
        t0 = time.perf_counter()
        for _ in range(CYCLES):
            shims.install(PROFILE)
            shims.uninstall(PROFILE)
        elapsed = time.perf_counter() - t0
    calls = sum(callers.calls)
    record_property("cycles", CYCLES)
    record_property("seconds", round(elapsed, 3))
    print(f"\n{CYCLES} install/uninstall cycles, {CALLERS} callers: {elapsed:.2f} s, {calls} calls")
    assert callers.failures == [], callers.failures[:5]
    seen = set().union(*callers.outcomes)
    for name, _, valid in call_sites(fake):
        assert {(name, kind) for kind in set(valid.values())} <= seen, f"{name}: not every state was exercised"
    assert next(wrapper_calls) > 0  # the pass-through wrapper on Attention ran
    # originals restored by identity, nothing recorded, nothing left in the patching core
    fake.assert_pristine()
    assert not shims.installed(PROFILE)
    assert [p for p in ledger.active_patches() if p.profile == PROFILE] == []
    assert [layer for layer in patching.installed_layers() if layer.profile == PROFILE] == []


def test_the_fake_row_gives_the_real_profiles_targets(fake: FakeRelease):
    """The spec list is the real one (same targets as the 0.2.5 row's known-defects profile, re-rooted)."""
    real = [s.target for s in maxtext_profiles.defect_specs(ROW)]
    ours = [s.target for s in maxtext_profiles.defect_specs(fake.row)]
    assert real and ours == [f"{fake.pkg}.{t}" for t in real]
    assert isinstance(fake.row, MaxTextRow) and fake.row.has_kv_params


# ----------------------------------------------------------------------------------------------
# An adapter over a class a vllm-backport shim patched (legacy rows): the rule is applied once
# ----------------------------------------------------------------------------------------------

LEGACY = shipped_matrix().row("0.1.0")
LEGACY_ATTENTION = """
class Attention:
    def __call__(self, inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *, model_mode='train',
                 deterministic=False, previous_chunk=None, slot=None, page_state=None, bidirectional_mask=None):
        return "OUT"
"""


@pytest.fixture
def backport_over_fake(mocker) -> Iterator[tuple[type, Any]]:
    """vllm-backport's real call-rule spec for a fake 0.1.0 Attention, registered under the real name; the real
    registration is put back afterwards. Yields the fake class and a factory of adapters over it (built when asked,
    so a test decides whether the shim is installed then)."""
    pkg = f"fakelegacy_{uuid.uuid4().hex[:8]}"
    ref = LEGACY.classes["attention"]
    assert ref is not None
    module = types.ModuleType(f"{pkg}.{ref.module}")
    exec(textwrap.dedent(LEGACY_ATTENTION), module.__dict__)
    sys.modules[module.__name__] = module
    classes = {k: None if r is None else ClassRef(f"{pkg}.{r.module}", r.qualname) for k, r in LEGACY.classes.items()}
    row = dataclasses.replace(LEGACY, classes=classes)
    target = f"{row.classes['attention']}.__call__"
    spec = next(s for s in maxtext_profiles.backport_specs(row) if s.target == target)
    shims.registered_profiles()  # registers the real profiles (lazily) so they can be put back
    real = profiles.REGISTRY.profiles[maxtext_profiles.BACKPORT]
    shims.register_profile(maxtext_profiles.BACKPORT, lambda: [spec], replace=True)
    # Train-mode new calls never route attention; the context-gated hooks (backport-hooks, tested with the
    # real MaxText) would otherwise be registered here for this fake row and outlive the test.
    mocker.patch("maxtext_compat.shims.backport_hooks.ensure_installed")
    try:
        yield module.Attention, lambda: adapted_class(module.Attention, row=row, kind="attention")
    finally:
        shims.uninstall(maxtext_profiles.BACKPORT, force=True)
        shims.register_profile(real.name, real.builder, description=real.description, replace=True)
        del sys.modules[module.__name__]


NEW_TRAIN = {"model_mode": "train", "kv_cache": "KV", "attention_metadata": "MD"}


@pytest.mark.parametrize("built", ["before the install", "while installed"])
def test_an_adapter_over_an_installed_backport_applies_the_rule_once(backport_over_fake, mocker, built):
    """The adapter applies the rule and the shim beneath passes its native call through: an old call's return is
    reduced once, a new call never reaches 0.1.0's own __call__ with kv_cache= (it takes no such argument)."""
    cls, adapter_of = backport_over_fake
    raw = vars(cls)["__call__"]
    adapter = adapter_of() if built == "before the install" else None
    shims.install(maxtext_profiles.BACKPORT)
    adapter = adapter or adapter_of()
    assert "kv_cache" in inspect.signature(cls.__call__).parameters  # the shim advertises the new keywords
    shim_rule = mocker.spy(rule_patches, "call_rule")
    assert adapter()("x", "x") == "OUT"
    assert adapter()("x", "x", **NEW_TRAIN) == ("OUT", "KV")  # train mode: the caches come back as given
    assert shim_rule.call_count == 0  # the shim passed the adapter's native calls through: the rule ran once each
    assert cls()("x", "x", **NEW_TRAIN) == ("OUT", "KV") and shim_rule.call_count == 1  # a direct call: the shim's
    shims.uninstall(maxtext_profiles.BACKPORT)
    assert vars(cls)["__call__"] is raw
    assert adapter()("x", "x", **NEW_TRAIN) == ("OUT", "KV") and adapter()("x", "x") == "OUT"


def test_a_backport_uninstalled_during_the_adapters_call(backport_over_fake, mocker):
    """Another thread uninstalls the shim while the adapter's call is under way (between the rule's decision and the
    native call): the native call then reaches 0.1.0's own __call__ with the release's own arguments only."""
    _, adapter_of = backport_over_fake
    adapter = adapter_of()
    shims.install(maxtext_profiles.BACKPORT)
    real_declared = caller_convention.declared

    def declared_then_uninstall(*args, **kwargs):
        shims.uninstall(maxtext_profiles.BACKPORT)
        return real_declared(*args, **kwargs)

    mocker.patch.object(caller_convention, "declared", side_effect=declared_then_uninstall)
    assert adapter()("x", "x", **NEW_TRAIN) == ("OUT", "KV")
    assert not shims.installed(maxtext_profiles.BACKPORT)
