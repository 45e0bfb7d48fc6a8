"""The demo where MaxText is not installed: exit code 2 and what to run instead."""

from __future__ import annotations

import io

import pytest

from maxtext_compat import demo

pytestmark = pytest.mark.envs("unit")


def test_demo_without_maxtext_says_what_to_run():
    out = io.StringIO()
    assert demo.run(out=out) == 2
    text = out.getvalue()
    assert "MaxText is not installed" in text and "make demo" in text
