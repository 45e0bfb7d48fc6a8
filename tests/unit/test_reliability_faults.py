"""Fault injection on the REAL MaxText shim profiles' spec lists: all or nothing, at every position.

The specs come from `maxtext_profiles.backport_specs(row)` (vllm-backport, MaxText 0.1.0) and
`maxtext_profiles.defect_specs(row)` (known-defects, 0.2.2 and 0.2.5), unchanged. Their targets
resolve to fake modules registered in sys.modules under the row's own dotted names
(`MaxText.layers.attentions`, ...; restored afterwards, so a real MaxText in the same process
is untouched). At each position of the install sequence a target disappears, raises when it is
read, or is already wrapped by a foreign wrapper; the install then fails with a typed error and
changes nothing (no record, every attribute back by identity), or, where the fault is
harmless, installs completely and uninstalls to the same state.
"""

from __future__ import annotations

import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import wrapt

from helpers.shipped import shipped_matrix
from maxtext_compat import patching, shims
from maxtext_compat.errors import PatchConflictError, PatchError, PatchTargetError
from maxtext_compat.matrix import MaxTextRow
from maxtext_compat.patching import MARKER, PatchSpec, ledger, profiles
from maxtext_compat.shims import maxtext_profiles

MATRIX = shipped_matrix()
PROFILE = "rel-faults"
# profile label -> (matrix row, the real builder of its spec list)
PROFILES: dict[str, tuple[str, Callable[[MaxTextRow], list[Any]]]] = {
    "vllm-backport@0.1.0": ("0.1.0", maxtext_profiles.backport_specs),
    "known-defects@0.2.2": ("0.2.2", maxtext_profiles.defect_specs),
    "known-defects@0.2.5": ("0.2.5", maxtext_profiles.defect_specs),
}

# Each release's parameter lists (exact for 0.1.0 and 0.2.3+; see test_adapters_mocked_rows.py).
ATTENTION = {
    "0.1.0": "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, *, model_mode='train', "
    "deterministic=False, previous_chunk=None, slot=None, page_state=None, bidirectional_mask=None",
    "0.2": "inputs_q, inputs_kv, inputs_positions=None, decoder_segment_ids=None, out_sharding=None, *, "
    "model_mode='train', deterministic=False, previous_chunk=None, slot=None, bidirectional_mask=None, "
    "rope_kwargs=None, kv_cache=None, attention_metadata=None, shared_key=None, shared_value=None",
}
LAYER = {
    "0.1.0": "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, slot=None, "
    "page_state=None, previous_chunk=None",
    "0.2": "inputs, decoder_segment_ids, decoder_positions, deterministic, model_mode, previous_chunk=None, "
    "slot=None, kv_cache=None, attention_metadata=None",
}
DECODER = (
    "shared_embedding, decoder_input_tokens, decoder_positions, decoder_segment_ids=None, deterministic=False, "
    "model_mode='train', previous_chunk=None, slot=None, page_state=None, bidirectional_mask=None"
)
TRANSFORMER = (
    "decoder_input_tokens, decoder_positions, decoder_segment_ids=None, encoder_images=None, enable_dropout=True, "
    "previous_chunk=None, true_length=None, slot=None, page_state=None"
)


def class_source(key: str, name: str, era: str) -> str:
    """A fake class for a row's class key with the release's `__call__` parameters."""
    if key in ("attention", "mla"):
        body = f"    def __call__(self, {ATTENTION[era]}):\n        return 'OUT'\n"
    elif key == "attention_op":
        body = (
            "    def __init__(self, config=None, *, attention_kernel='dot_product'):\n"
            "        self.kernel = attention_kernel\n\n"
            "    def __call__(self, query, key, value, decoder_segment_ids=None, model_mode='train', sinks=None):\n"
            "        return query\n"
        )
    elif key in ("decoder", "nnx_decoder"):
        body = (
            f"    def __call__(self, {DECODER}):\n        return 'LOGITS', 'HIDDEN'\n\n"
            "    def set_remat_policy(self, block_layers, policy):\n        return block_layers\n\n"
            "    def _apply_output_head(self, shared_embedding, y, deterministic):\n        return y\n"
        )
    elif key in ("transformer", "transformer_linen"):
        body = f"    def __call__(self, {TRANSFORMER}):\n        return 'LOGITS'\n"
    else:  # a decoder layer
        body = f"    def __call__(self, {LAYER[era]}):\n        return 'Y'\n"
    return f"class {name}:\n{body}\n\n"


HOSTILE_SOURCE = """
class HostileMeta(type):
    @property
    def __dict__(cls):
        raise RuntimeError("this class refuses to be read")
"""


class HostileModule(types.ModuleType):
    """A module whose attributes cannot be listed (a broken lazy-import placeholder)."""

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        raise RuntimeError("this module refuses to be read")


class FakeMaxText:
    """Fake modules under the row's own dotted names, holding every class its shims touch."""

    def __init__(self, release: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.row = MATRIX.row(release)
        self.monkeypatch = monkeypatch
        era = "0.1.0" if release == "0.1.0" else "0.2"
        sources: dict[str, str] = {}
        refs = [*self.row.classes.items(), *(("layer", r) for r in dict.fromkeys(self.row.decoder_layers.values()))]
        for key, ref in refs:
            if ref is not None:
                sources[ref.module] = sources.get(ref.module, "") + class_source(key, ref.qualname, era)
        pyconfig = "def validate_attention_kernel(s):\n    return None\n\n\ndef initialize(*a, **k):\n    return None\n"
        sources[self.row.config.pyconfig] = sources.get(self.row.config.pyconfig, "") + pyconfig
        self.modules = {name: self.register(name, src) for name, src in sources.items()}
        # `from ...pyconfig import validate_attention_kernel` elsewhere in the package: an alias the sweep swaps
        root = self.row.import_root
        self.alias = self.register(f"{root}.rel_alias_user", f"from {self.row.config.pyconfig} import *\n")
        self.specs = PROFILES_BY_RELEASE[release](self.row)
        self.take()

    def register(self, name: str, source: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        exec(textwrap.dedent(source), mod.__dict__)
        self.monkeypatch.setitem(sys.modules, name, mod)
        return mod

    def owners(self) -> list[Any]:
        out: list[Any] = [*self.modules.values(), self.alias]
        out += [v for m in self.modules.values() for v in vars(m).values() if type(v) is type]  # not HostileMeta
        return out

    def take(self) -> None:
        """The state every fault must leave behind (taken after the fault is injected)."""
        self.snapshot = [(o, dict(vars(o))) for o in self.owners()]

    def owner_of(self, target: str) -> tuple[Any, str]:
        module, _, path = target.partition(":")
        *classes, attr = path.split(".")
        owner: Any = sys.modules[module]
        for part in classes:
            owner = getattr(owner, part)
        return owner, attr

    def install(self, specs: list[PatchSpec] | None = None, **kw: Any) -> None:
        chosen = list(self.specs if specs is None else specs)
        shims.register_profile(PROFILE, lambda: chosen, replace=True)
        shims.install(PROFILE, **kw)

    def assert_nothing_changed(self) -> None:
        for owner, before in self.snapshot:
            now = dict(vars(owner))
            assert now.keys() == before.keys(), owner
            assert all(now[k] is v for k, v in before.items()), owner
            assert MARKER not in now or now[MARKER] is before.get(MARKER)
        assert [p for p in ledger.active_patches() if p.profile == PROFILE] == []
        assert [layer for layer in patching.installed_layers() if layer.profile == PROFILE] == []
        assert not shims.installed(PROFILE)

    def assert_fully_installed(self) -> None:
        assert {p.target for p in ledger.active_patches() if p.profile == PROFILE} == {s.target for s in self.specs}
        for spec in self.specs:
            owner, attr = self.owner_of(spec.target)
            assert patching.layer_of(vars(owner)[attr]).profile == PROFILE, spec.target
        assert shims.verify(PROFILE) == {PROFILE: []}


PROFILES_BY_RELEASE = {release: build for release, build in PROFILES.values()}


def _positions(*, classes_only: bool = False) -> list[Any]:
    """(release, index) for every spec of every profile, with the target in the test id."""
    out = []
    for label, (release, build) in PROFILES.items():
        for i, spec in enumerate(build(MATRIX.row(release))):
            path = spec.target.split(":")[1]
            if "." in path or not classes_only:
                out.append(pytest.param(release, i, id=f"{label}-{i:02d}-{path}"))
    return out


POSITIONS = _positions()
CLASS_POSITIONS = _positions(classes_only=True)  # targets inside a class (all but pyconfig's function)


@pytest.fixture
def make(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], FakeMaxText]]:
    yield lambda release: FakeMaxText(release, monkeypatch)
    if PROFILE in profiles.registered_profiles():
        shims.uninstall(PROFILE, force=True)
        shims.unregister_profile(PROFILE)


def test_spec_lists_are_the_real_profiles(make):
    """Sanity: every target resolves in the fake, a clean install and uninstall round-trips."""
    for release in PROFILES_BY_RELEASE:
        fake = make(release)
        assert len(fake.specs) >= 2
        fake.install()
        fake.assert_fully_installed()
        shims.uninstall(PROFILE)
        fake.assert_nothing_changed()
    assert len(MATRIX.row("0.1.0").decoder_layers) == 4 and len(POSITIONS) >= 15


# --------------------------------------------------------------------------------------------- install faults


@pytest.mark.parametrize("release,position", POSITIONS)
def test_target_attribute_disappears(make, release, position):
    fake = make(release)
    target = fake.specs[position].target
    owner, attr = fake.owner_of(target)
    delattr(owner, attr)
    fake.take()
    inherited = isinstance(owner, type) and any(attr in vars(base) for base in owner.__mro__[1:])
    if inherited:  # e.g. AttentionOp.__init__ gone: object.__init__ is what the class has now, and is patched
        fake.install()
        fake.assert_fully_installed()
        shims.uninstall(PROFILE)
    else:
        with pytest.raises(PatchTargetError) as err:
            fake.install()
        assert err.value.argument == target and f"no {attr!r}" in str(err.value.found)
        assert "Fix:" in str(err.value)
    fake.assert_nothing_changed()


@pytest.mark.parametrize("release,position", POSITIONS)
def test_target_class_disappears_from_its_module(make, release, position):
    fake = make(release)
    module, _, path = fake.specs[position].target.partition(":")
    name = path.split(".")[0]
    delattr(sys.modules[module], name)
    fake.take()
    with pytest.raises(PatchTargetError) as err:
        fake.install()
    assert err.value.argument.startswith(f"{module}:{name}")  # the first spec that needs it
    fake.assert_nothing_changed()


@pytest.mark.parametrize("release,position", POSITIONS)
def test_target_module_is_unloaded_between_import_and_swap(make, release, position, mocker):
    fake = make(release)
    module = fake.specs[position].target.partition(":")[0]
    real_import = patching.import_modules

    def import_then_unload(specs):
        real_import(specs)
        del sys.modules[module]  # another thread unloads it before the swap takes the lock

    mocker.patch.object(patching, "import_modules", side_effect=import_then_unload)
    with pytest.raises(PatchTargetError, match="is not imported") as err:
        fake.install()
    assert err.value.argument.startswith(f"{module}:")
    sys.modules[module] = fake.modules[module]  # monkeypatch restores the original entry at teardown
    fake.assert_nothing_changed()


@pytest.mark.parametrize("release,position", CLASS_POSITIONS)
def test_target_class_raises_on_access(make, release, position):
    fake = make(release)
    module, _, path = fake.specs[position].target.partition(":")
    name = path.split(".")[0]
    ns: dict[str, Any] = {}
    exec(HOSTILE_SOURCE + f"\nclass {name}(metaclass=HostileMeta):\n    pass\n", ns)
    setattr(sys.modules[module], name, ns[name])
    fake.take()
    with pytest.raises(PatchTargetError, match="refuses to be read") as err:
        fake.install()
    assert err.value.argument.startswith(f"{module}:{name}.") and isinstance(err.value.__cause__, RuntimeError)
    fake.assert_nothing_changed()


@pytest.mark.parametrize("release,position", POSITIONS)
def test_target_module_raises_on_access(make, release, position):
    fake = make(release)
    module = fake.specs[position].target.partition(":")[0]
    hostile = HostileModule(module)  # same contents; only listing its attributes raises
    for key, value in vars(fake.modules[module]).items():
        setattr(hostile, key, value)
    fake.monkeypatch.setitem(sys.modules, module, hostile)  # the snapshot keeps the readable twin's state
    with pytest.raises(PatchTargetError, match="refuses to be read") as err:
        fake.install()
    assert err.value.argument.startswith(f"{module}:")
    fake.assert_nothing_changed()


@pytest.mark.parametrize("release,position", POSITIONS)
def test_target_whose_signature_raises(make, release, position):
    """The real factories read the original's signature: one that raises is a typed error, or harmless."""
    fake = make(release)
    spec = fake.specs[position]
    owner, attr = fake.owner_of(spec.target)

    class Opaque:
        @property
        def __signature__(self):
            raise RuntimeError("no signature for you")

        def __call__(self, *args, **kwargs):
            return "opaque"

    setattr(owner, attr, Opaque())
    fake.take()
    reads_signature = spec.signature is not None or "_rule_factory" in spec.describe_origin()
    reads_signature = reads_signature or "_scan_kv_fix" in spec.describe_origin()
    if reads_signature:
        with pytest.raises(PatchError, match="no signature for you") as err:
            fake.install()
        assert err.value.argument == spec.target
    else:
        fake.install()
        fake.assert_fully_installed()
        shims.uninstall(PROFILE)
    fake.assert_nothing_changed()


@pytest.mark.parametrize("release,position", POSITIONS)
def test_target_already_wrapped_by_a_foreign_wrapper(make, release, position):
    fake = make(release)
    target = fake.specs[position].target
    owner, attr = fake.owner_of(target)

    def theirs(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(owner, attr, theirs)
    foreign = vars(owner)[attr]
    fake.take()  # their wrapper is part of the state to preserve
    with pytest.raises(PatchConflictError) as err:
        fake.install()
    assert err.value.argument == target and "stack=True" in str(err.value)
    fake.assert_nothing_changed()
    # stacking on purpose works, and uninstalling gives their wrapper back by identity
    fake.install(stack=True)
    fake.assert_fully_installed()
    shims.uninstall(PROFILE)
    assert vars(owner)[attr] is foreign
    fake.assert_nothing_changed()


@pytest.mark.parametrize("release", list(PROFILES_BY_RELEASE))
def test_every_write_of_the_install_can_fail_and_is_rolled_back(make, release, mocker):
    fake = make(release)
    spy = mocker.patch.object(patching.writes, "_write", side_effect=patching.writes._write)
    fake.install()
    writes = spy.call_count
    mocker.stopall()
    shims.uninstall(PROFILE)
    assert writes >= len(fake.specs) + 1  # targets, aliases, markers
    real = patching.writes._write
    for at in range(writes):
        calls = {"n": 0}

        def write(obj, name, value, at=at, calls=calls):
            calls["n"] += 1
            if calls["n"] == at + 1:
                raise TypeError("read-only")
            real(obj, name, value)

        mocker.patch.object(patching.writes, "_write", side_effect=write)
        with pytest.raises(PatchTargetError, match=f"the {at} earlier change"):
            fake.install()
        mocker.stopall()
        fake.assert_nothing_changed()
    fake.install()  # and a clean install still works afterwards
    fake.assert_fully_installed()


# --------------------------------------------------------------------------------------------- uninstall faults


@pytest.mark.parametrize("release,position", POSITIONS)
def test_replaced_wrapper_at_any_position_blocks_the_whole_uninstall(make, release, position):
    fake = make(release)
    fake.install()
    target = fake.specs[position].target
    owner, attr = fake.owner_of(target)
    theirs = staticmethod(lambda *a, **k: "theirs")
    setattr(owner, attr, theirs)
    with pytest.raises(PatchConflictError) as err:
        shims.uninstall(PROFILE)
    assert target in str(err.value) and "force=True" in str(err.value)
    assert shims.installed(PROFILE) and len([p for p in ledger.active_patches() if p.profile == PROFILE]) == len(
        fake.specs
    )
    assert vars(owner)[attr] is theirs  # nothing was removed, theirs included
    assert shims.uninstall(PROFILE, force=True) == [PROFILE]
    fake.assert_nothing_changed()  # force puts every original back, theirs replaced by the original


# --------------------------------------------------------------------------------------------- aliases in scope


def test_unreadable_module_in_the_alias_scope_is_typed_or_skipped(make):
    """A module in the package that cannot be listed (not a target: the sweep for `from x import f`
    aliases reads it) gives a typed PatchError with nothing changed, or is skipped like a placeholder."""
    fake = make("0.1.0")
    name = f"{fake.row.import_root}.rel_unreadable"
    fake.monkeypatch.setitem(sys.modules, name, HostileModule(name))
    try:
        fake.install()
    except PatchError:
        fake.assert_nothing_changed()
    else:
        fake.assert_fully_installed()
