"""MaxText 0.2.3 (the release that runs on the TPU VM's Python 3.11 + jax 0.10.2: docs/accelerators.md) through
the layer on the chip: three prompts prefilled and decoded by the tiny model through the paged KV cache and the
compiled RPA kernel, token for token equal to MaxText's own dense decode (`maxtext_compat.demo`, the same code
`make demo` runs on CPU). The old and new calls of each class against the native call: test_tier_layers.py."""

from __future__ import annotations

import contextlib

import pytest

pytestmark = pytest.mark.tpu


class _Quiet:
    def stage(self, *args, **kwargs):
        return contextlib.nullcontext()


def test_the_installed_release_is_the_tiers(tier):
    from maxtext_compat.testing import tiny

    assert tiny.installed_row().name == "0.2.3"


def test_paged_decode_on_the_kernel_equals_maxtexts_dense_decode(tier):
    from maxtext_compat import demo

    result = demo.serving(_Quiet(), 8 if tier.accelerator else 3)
    assert result["all_tokens_match"], result["table"]
