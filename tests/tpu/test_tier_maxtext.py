"""MaxText 0.2.3 (the release that runs on the TPU VM's Python 3.11 + jax 0.10.2: docs/tpu.md) through the layer on
the chip: the tiny model called the old way and the new way through `wrap()`, and three prompts prefilled and
decoded through the paged KV cache and the compiled RPA kernel, token for token equal to MaxText's own dense
decode (`maxtext_compat.demo`, the same code `make demo` runs on CPU)."""

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


def test_old_and_new_calls_through_the_adapter(tier):
    from maxtext_compat import demo

    out = demo.calls(_Quiet())
    assert out["old_call"]["returns"] == "logits" and out["old_call"]["shape"][-1] > 0, out
    assert "unavailable" not in out["new_call"], out["new_call"]
    assert out["new_call"]["returns"] == "(hidden, kv_caches)", out


def test_paged_decode_on_the_kernel_equals_maxtexts_dense_decode(tier):
    from maxtext_compat import demo

    result = demo.serving(_Quiet(), 8 if tier.tpu else 3)
    assert result["all_tokens_match"], result["table"]
