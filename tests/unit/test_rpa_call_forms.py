"""The dispatcher makes exactly the call each tpu-inference release accepts (fake entry points, every matrix row).

Only tpu-inference 0.32.0 is installed for real; the other forms are checked here against the
matrix rows with pytest-mock, without jax.
"""

from __future__ import annotations

import pytest

from maxtext_compat.errors import KernelUnavailableError
from maxtext_compat.kernel.rpa import call_rpa, check_features, plan_call
from maxtext_compat.matrix import load_matrix
from maxtext_compat.resolution.installed_kernel import first_release_with

ROWS = load_matrix().tpu_inference
NAMES = ("mesh", "q", "k", "v", "kv_cache", "kv_lens", "page_indices", "cu_q_lens", "distribution")


def _values(**extra):
    values = {n: object() for n in NAMES}  # sentinels: the exact objects must reach the entry point
    values.update(sm_scale=0.125, attention_chunk_size=None, attention_sink=None)
    values.update(update_kv_cache=True, use_causal_mask=True, attn_logits_soft_cap=None)
    values.update(extra)
    return values


@pytest.mark.parametrize("row", ROWS, ids=[str(r.versions) for r in ROWS])
def test_each_row_gets_its_exact_call(row, mocker):
    vals = _values()
    out, cache = object(), object()
    fake = mocker.Mock(name=row.rpa.function)
    if row.rpa.call_form == "curried":
        fake.return_value.return_value = (out, cache)
    else:
        fake.return_value = (out, cache)

    assert call_rpa(fake, plan_call(row, vals)) == (out, cache)

    q, k, v, kvc = vals["q"], vals["k"], vals["v"], vals["kv_cache"]
    meta = (vals["kv_lens"], vals["page_indices"], vals["cu_q_lens"], vals["distribution"])
    if row.rpa.call_form == "curried":  # 0.11.x: factory(sm_scale, mesh, chunk, q/k/v scale)(q, k, v, ...)
        fake.assert_called_once_with(0.125, vals["mesh"], None, None, None, None)
        fake.return_value.assert_called_once_with(q, k, v, kvc, *meta)
        return
    kwargs = {}
    opt = row.rpa.optional_kwargs
    if "update_kv_cache" in opt:
        kwargs["update_kv_cache"] = True
    if "use_causal_mask" in opt:
        kwargs["use_causal_mask"] = True
    if "attn_logits_soft_cap" in opt:
        kwargs["attn_logits_soft_cap"] = None
    # flat: (mesh, q, k, v, kv_cache, kv_lens, page_indices, cu_q_lens, distribution, sink, sm_scale, chunk, scales)
    fake.assert_called_once_with(vals["mesh"], q, k, v, kvc, *meta, None, 0.125, None, None, None, None, **kwargs)
    assert "decode_query_size" not in fake.call_args.kwargs  # never passed: it only selects the batched kernel


def test_rows_cover_both_forms():
    assert {r.rpa.call_form for r in ROWS} == {"curried", "flat"}


@pytest.mark.parametrize(
    ("feature", "value", "since"),
    [
        ("update_kv_cache", False, "0.22.0"),
        ("use_causal_mask", False, "0.25.0"),
        ("attn_logits_soft_cap", 30.0, "0.27.0"),
        ("attention_sink", "sink", "0.12.0"),
    ],
)
def test_features_a_release_lacks_are_typed_errors(feature, value, since):
    for row in ROWS:
        takes = {*row.rpa.params, *row.rpa.factory_params, *row.rpa.optional_kwargs}
        if feature in takes:
            check_features(row, _values(**{feature: value}))
            continue
        with pytest.raises(KernelUnavailableError) as info:
            check_features(row, _values(**{feature: value}))
        assert str(row.versions) in str(info.value)  # names the tpu-inference release
        assert info.value.fix == f"upgrade to tpu-inference >= {since}"
    assert first_release_with(feature) == since


def test_supported_feature_values_are_forwarded(mocker):
    row = ROWS[-1]
    fake = mocker.Mock(return_value=("o", "c"))
    vals = _values(update_kv_cache=False, attn_logits_soft_cap=30.0, attention_chunk_size=12)
    call_rpa(fake, plan_call(row, vals))
    args, kwargs = fake.call_args
    assert args[11] == 12  # attention_chunk_size carries the sliding window
    assert kwargs == {"update_kv_cache": False, "use_causal_mask": True, "attn_logits_soft_cap": 30.0}


def test_swapped_return_order_is_normalised(mocker):
    import dataclasses

    row = ROWS[-1]
    swapped = dataclasses.replace(row, rpa=dataclasses.replace(row.rpa, returns="(kv_cache, output)"))
    fake = mocker.Mock(return_value=("cache", "out"))
    assert call_rpa(fake, plan_call(swapped, _values())) == ("out", "cache")


def test_unknown_row_parameters_are_refused():
    import dataclasses

    row = ROWS[-1]
    odd = dataclasses.replace(row, rpa=dataclasses.replace(row.rpa, params=(*row.rpa.params, "new_thing")))
    with pytest.raises(KernelUnavailableError, match="cannot fill"):
        plan_call(odd, _values())


@pytest.mark.parametrize("row", ROWS, ids=[str(r.versions) for r in ROWS])
def test_each_row_metadata_class_takes_the_fields_we_fill(row, mocker):
    """Every release's AttentionMetadata has the five fields the builder fills, and is loaded from the
    module and class the row names (the import is mocked: only 0.32.0 is installed)."""
    from maxtext_compat.paged.metadata import ATTENTION_METADATA_FIELDS
    from maxtext_compat.resolution.installed_kernel import attention_metadata_class

    assert set(ATTENTION_METADATA_FIELDS.values()) <= set(row.metadata.fields)
    assert not set(row.metadata.fields) & set(row.metadata.meta_fields)
    module = mocker.Mock(name=row.metadata.module)
    load = mocker.patch("importlib.import_module", return_value=module)
    assert attention_metadata_class(row) is getattr(module, row.metadata.cls)
    load.assert_called_once_with(row.metadata.module)


@pytest.mark.parametrize(
    ("maxtext", "want"),
    [
        ("0.2.0", "pip install vllm-tpu==0.19.0 (pins tpu-inference 0.19.0, the newest MaxText 0.2.0 works with"),
        ("0.2.1", "jax 0.9.2"),
        ("0.2.5", "pip install vllm-tpu==0.32.0 (pins tpu-inference 0.32.0, the newest MaxText 0.2.5 works with"),
        ("0.1.0", "pip install vllm-tpu==0.32.0 (pins tpu-inference 0.32.0, it needs jax 0.11.2)"),
        (None, "pip install vllm-tpu==0.32.0"),
    ],
)
def test_missing_tpu_inference_names_the_release_that_fits_the_installed_maxtext(maxtext, want, mocker):
    """MaxText 0.2.0/0.2.1 need tpu-inference < 0.20: the fix must not send them to the newest vllm-tpu."""
    from maxtext_compat.resolution import installed_kernel
    from maxtext_compat.versions import DistInfo

    versions = {} if maxtext is None else {"maxtext": DistInfo("maxtext", maxtext)}
    mocker.patch("maxtext_compat.versions.installed_versions", return_value=versions)
    installed_kernel.installed_rpa.cache_clear()
    try:
        with pytest.raises(KernelUnavailableError) as info:
            installed_kernel.installed_rpa()
    finally:
        installed_kernel.installed_rpa.cache_clear()
    assert want in info.value.fix and "tpu-inference is not installed" in str(info.value)
