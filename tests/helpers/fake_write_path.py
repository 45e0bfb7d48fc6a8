"""The `checkless_write_path` fixture: the call rule's routing tested where no jax is installed
(maxtext_compat.testing.checkless says why). The real checks run in the compat environments on arrays
(tests/compat/test_adapters_new_call.py, test_bad_input_catalog_real.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from maxtext_compat.testing.checkless import ChecklessWritePath, checkless_calls


@pytest.fixture
def checkless_write_path() -> Iterator[ChecklessWritePath]:
    with checkless_calls() as fake:
        yield fake
