"""The demo where MaxText is not installed: exit code 2 and what to run instead."""

from __future__ import annotations

import io
import os
from unittest import mock

import pytest

from maxtext_compat import demo

pytestmark = pytest.mark.envs("unit")


def test_demo_without_maxtext_says_what_to_run():
    out = io.StringIO()
    # The demo sets the CPU stand-ins for the TPU variables in its own process (TPU_NAME, ...): kept inside this
    # test, so a later test does not see a caller that had them set (test_nox_helper's "the caller's value wins").
    with mock.patch.dict(os.environ):
        assert demo.run(out=out) == 2
    text = out.getvalue()
    assert "MaxText is not installed" in text and "make demo" in text
