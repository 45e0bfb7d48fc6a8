"""Keep the caller's XLA_FLAGS across a call into MaxText's pyconfig.

Why: pyconfig of 0.2.5 sets XLA_FLAGS to an HLO dump when it is empty, which would change every
later jax process start (and the virtual CPU device count tests rely on). The tiny-model helpers
and the serving backends both load configs through pyconfig, so both use this one guard.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def keep_xla_flags() -> Iterator[None]:
    """Restore XLA_FLAGS (or its absence) to what it was on entry."""
    saved = os.environ.get("XLA_FLAGS")
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = saved
