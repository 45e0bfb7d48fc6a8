"""tpu-inference's RPA kernel globals bound to rpa_xla (the XLA kernel): what the accelerator tier's GPU route runs
where the Pallas TPU kernel cannot (tests/helpers/accel_mode.py). A test aid, not library code: a GPU server of
ours would choose its kernel through the library (cpu/kernel_choice.py's MAXTEXT_COMPAT_RPA_KERNEL), not this."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from unittest import mock

IFACE = "tpu_inference.layers.common.attention_interface"


@contextlib.contextmanager
def rpa_xla_bound() -> Iterator[None]:
    """While it is open, programs traced through tpu-inference's attention interface run rpa_xla (its globals are
    read at each call)."""
    from maxtext_compat.kernel import rpa_xla

    iface = importlib.import_module(IFACE)
    with (
        mock.patch.object(iface, "ragged_paged_attention", rpa_xla.ragged_paged_attention),
        mock.patch.object(iface, "ragged_paged_attention_hd64", rpa_xla.ragged_paged_attention_hd64),
    ):
        yield
