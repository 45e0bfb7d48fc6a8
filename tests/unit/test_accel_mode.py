"""tests/helpers/accel_mode.py: the accelerator tier's mode, from MAXTEXT_COMPAT_ACCEL or its older name; a value
that names no mode is refused naming the variable (a typo must not run the tier as an accelerator run)."""

from __future__ import annotations

import pytest

from helpers import accel_mode


@pytest.mark.parametrize("value", ["", "1", "dry", "dry-gpu"])
def test_each_mode_is_read_from_either_name(monkeypatch, value):
    monkeypatch.delenv(accel_mode.ENV, raising=False)
    monkeypatch.setenv(accel_mode.OLD_ENV, value)
    assert accel_mode.mode() == value
    monkeypatch.setenv(accel_mode.ENV, value or "dry")
    assert accel_mode.mode() == (value or "dry")  # the new name wins where set


@pytest.mark.parametrize(("name", "value"), [("MAXTEXT_COMPAT_ACCEL", "tpu"), ("MAXTEXT_COMPAT_TPU", "yes")])
def test_a_value_that_names_no_mode_is_refused_naming_the_variable(monkeypatch, name, value):
    monkeypatch.delenv(accel_mode.ENV, raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"{name}='{value}' names no mode"):
        accel_mode.mode()
