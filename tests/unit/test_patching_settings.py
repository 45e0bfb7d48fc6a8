"""Value settings go through the engine's transaction: all or none, recorded, restored only where still ours.

The oracle is the slots themselves, read back after every step (a module attribute, a dict entry, an
environment variable, a getter/setter global), and the registry `doctor` lists.
"""

from __future__ import annotations

import os
import types

import pytest

from maxtext_compat.errors import PatchError
from maxtext_compat.patching import ledger
from maxtext_compat.patching.settings import (
    Setting,
    apply_settings,
    attribute_slot,
    env_slot,
    global_slot,
    item_slot,
    remove_settings,
    replaced_value,
)
from maxtext_compat.patching.state import ABSENT

pytestmark = pytest.mark.envs("unit")

PROFILE = "settings-test"
VAR = "MAXTEXT_COMPAT_TEST_SETTING"


@pytest.fixture
def slots(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    mod = types.ModuleType("fake_interpreter")
    mod.get = original_get = lambda: "stock"
    table: dict[str, object] = {}
    box = {"value": "default"}
    yield types.SimpleNamespace(mod=mod, original_get=original_get, table=table, box=box)
    assert [p for p in ledger.active_patches() if p.profile == PROFILE] == []


def _settings(s, *, fail_last: bool = False):
    def boom(value):
        raise OSError("read-only")

    glob = global_slot(lambda: s.box["value"], boom if fail_last else (lambda v: s.box.update(value=v)), "box")
    return [
        Setting(attribute_slot(s.mod, "get", "fake_interpreter:get"), replacement, "test.replacement"),
        Setting(item_slot(s.table, "cpu", "table['cpu']"), "cpu-entry", "test.entry", keep_existing=True),
        Setting(env_slot(VAR), "1,64", "test.env", keep_existing=True),
        Setting(glob, "interpret", "test.global"),
    ]


def replacement():
    return "ours"


def test_applied_all_then_restored_by_identity(slots):
    applied = apply_settings(PROFILE, _settings(slots))
    assert slots.mod.get is replacement and slots.table == {"cpu": "cpu-entry"}
    assert os.environ[VAR] == "1,64" and slots.box["value"] == "interpret"
    recorded = {p.target for p in ledger.active_patches() if p.profile == PROFILE}
    assert recorded == {"fake_interpreter:get", "table['cpu']", f"os.environ:{VAR}", "box"}
    assert replaced_value("fake_interpreter:get") is slots.original_get
    assert sorted(remove_settings(applied)) == sorted(recorded)
    assert slots.mod.get is slots.original_get and slots.table == {} and VAR not in os.environ
    assert slots.box["value"] == "default" and replaced_value("fake_interpreter:get") is ABSENT


def test_a_failing_write_leaves_every_slot_as_it_was(slots):
    with pytest.raises(OSError, match="read-only"):
        apply_settings(PROFILE, _settings(slots, fail_last=True))
    assert slots.mod.get is slots.original_get and slots.table == {} and VAR not in os.environ
    assert slots.box["value"] == "default"


def test_existing_values_win_where_asked(slots, monkeypatch):
    monkeypatch.setenv(VAR, "user's own")
    slots.table["cpu"] = "someone else's"
    applied = apply_settings(PROFILE, _settings(slots))
    assert os.environ[VAR] == "user's own" and slots.table["cpu"] == "someone else's"
    assert set(applied.targets) == {"fake_interpreter:get", "box"}  # only what was written is ours
    remove_settings(applied)
    assert os.environ[VAR] == "user's own" and slots.table["cpu"] == "someone else's"


def test_a_value_replaced_after_us_is_left_to_whoever_set_it(slots):
    applied = apply_settings(PROFILE, _settings(slots))

    def theirs():
        return "theirs"

    slots.mod.get = theirs
    restored = remove_settings(applied)
    assert "fake_interpreter:get" not in restored and slots.mod.get is theirs
    assert slots.table == {} and VAR not in os.environ  # the rest is restored


def test_a_slot_another_profile_holds_is_refused_before_any_write(slots):
    first = apply_settings(PROFILE, _settings(slots)[:1])
    try:
        with pytest.raises(PatchError) as err:
            apply_settings("other", _settings(slots))
        assert err.value.argument == "fake_interpreter:get" and PROFILE in err.value.found
        assert slots.table == {} and VAR not in os.environ  # nothing of the refused set was written
    finally:
        remove_settings(first)
