"""Known defects that apply only with some tpu-inference releases and configs: refused with a typed error.

Every environment here has tpu-inference 0.32.0, so the conditions hold for real:
* MaxText 0.2.4/0.2.5, attention "vllm_batched_rpa": MaxText sets USE_BATCHED_RPA_KERNEL per call, after
  tpu-inference bound its default kernel; the stock test shows what the real tpu-inference then does.
* MaxText 0.2.2-0.2.4 (#3481): Gemma 4 E2B/E4B and hybrid models on the vLLM path.
* MaxText 0.2.3 (#3016): Qwen3-Next on the vLLM path imports a class tpu-inference 0.24.0 removed.
* Any 0.2.x: a vLLM server whose --attention-backend is not RPA.
The refusals happen when MaxText builds the config (pyconfig.initialize, wrapped by the known-defects
profile that shims.install() picks), before any weight is loaded.
"""

from __future__ import annotations

import sys
import types

import pytest

pytestmark = [pytest.mark.needs_maxtext, pytest.mark.needs_tpu_inference]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from maxtext_compat import shims  # noqa: E402
from maxtext_compat.errors import ShimRefusedError  # noqa: E402
from maxtext_compat.resolution import defects  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
IDS = {d.id for d in ROW.known_defects}
BATCHED = "batched-rpa-kernel-bound-at-import"


@pytest.fixture(autouse=True)
def _builtin_profiles():
    from maxtext_compat.shims import maxtext_profiles

    maxtext_profiles.register()


@pytest.fixture
def installed():
    """shims.install() as a user (or the vLLM plugin) runs it; everything it brought is removed after."""
    before = shims.active_profiles()
    shims.install()
    yield shims.active_profiles()
    for name in reversed(shims.active_profiles()):
        if name not in before:
            shims.uninstall(name)


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4")
def test_stock_batched_rpa_call_after_maxtext_sets_the_variable_is_a_type_error(monkeypatch):
    """What MaxText's forward_serve_vllm leads to on tpu-inference 0.32.0: the default kernel is bound at
    import, the variable is read per call, so the batched kernel's keyword reaches the default kernel."""
    from tpu_inference.layers.common import attention_interface as ai

    from maxtext_compat import paged
    from maxtext_compat.cpu import rpa as cpu_rpa

    assert cpu_rpa.install().active
    assert "batched_rpa" not in ai.ragged_paged_attention.__module__  # bound at import: the default kernel
    cfg = tiny.tiny_config("default", vllm=True)
    mesh = tiny.tiny_mesh(cfg)
    layout = paged.KVCacheLayout(8, 16, cfg.num_kv_heads, cfg.head_dim, "float32")
    md = paged.build_metadata([paged.SequenceSlice(5, 5, (0,), "A")], layout, max_num_tokens=8, max_num_seqs=2,
                              pages_per_seq=1)  # fmt: skip
    q = jnp.ones((8, cfg.num_query_heads, cfg.head_dim))
    k = jnp.ones((8, cfg.num_kv_heads, cfg.head_dim))
    monkeypatch.setenv("USE_BATCHED_RPA_KERNEL", "1")  # what forward_serve_vllm does for vllm_batched_rpa
    with tiny.mesh_context(cfg, mesh), pytest.raises(TypeError, match="decode_query_size"):
        ai.sharded_ragged_paged_attention(mesh, q, k, k, layout.allocate(1)[0], *md.kernel_arrays(), None, 1.0)


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4")
def test_batched_rpa_config_is_refused_naming_the_defect_and_the_fix(installed, monkeypatch):
    assert "known-defects" in installed
    monkeypatch.delenv("USE_BATCHED_RPA_KERNEL", raising=False)
    with pytest.raises(ShimRefusedError) as e:
        tiny.tiny_config("default", vllm=True, attention="vllm_batched_rpa")
    text = str(e.value)
    assert BATCHED in text and "0.32.0" in text and e.value.argument == "attention"
    assert "vllm_rpa" in text and "USE_BATCHED_RPA_KERNEL=1" in text and "#5621" in text
    tiny.tiny_config("default", vllm=True)  # the default kernel's config is not refused


@pytest.mark.envs("maxtext-0.2.5")
def test_batched_rpa_config_passes_when_the_batched_kernel_is_the_one_bound(installed, monkeypatch):
    """USE_BATCHED_RPA_KERNEL=1 before tpu-inference's import binds the batched kernel: nothing to refuse."""
    module = types.ModuleType("tpu_inference.layers.common.attention_interface")
    module.ragged_paged_attention = types.SimpleNamespace(
        __module__="tpu_inference.kernels.experimental.batched_rpa.wrapper"
    )
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cfg = tiny.tiny_config("default", vllm=True, attention="vllm_batched_rpa")
    assert cfg.attention == "vllm_batched_rpa"


def _models_here() -> list[str]:
    """The KV-sharing / hybrid models this release has a config for (0.2.2 has no Gemma 4 E2B)."""
    from maxtext_compat.resolution.probes import package_dir

    root = package_dir(ROW.import_root)
    if root is None:  # no MaxText here: the tests below are deselected anyway
        return []
    models = root / "configs" / "models"
    return [m for m in ("gemma4-e2b", "gemma4-e4b", "qwen3-next-80b-a3b") if (models / f"{m}.yml").exists()]


@pytest.mark.envs("maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2")
@pytest.mark.parametrize("model", _models_here())
def test_kv_sharing_and_hybrid_models_on_the_vllm_path_are_refused(installed, model):
    with pytest.raises(ShimRefusedError) as e:
        tiny.tiny_config("default", vllm=True, model_name=model, override_model_config=True)
    assert "kv-slots-out-of-layer-order" in str(e.value) or "gdn-config-import-gone" in str(e.value)
    assert "model_name" in e.value.argument and model in str(e.value)


@pytest.mark.envs("maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2")
def test_the_same_model_outside_the_vllm_path_is_not_refused(installed):
    """The condition is the vLLM path (tpu-inference's KV caches): training the same model is left alone."""
    cfg = tiny.tiny_config("default", model_name="qwen3-next-80b-a3b", override_model_config=True)
    assert cfg.model_name == "qwen3-next-80b-a3b"


@pytest.mark.envs("maxtext-0.2.3")
def test_stock_qwen3_next_vllm_path_imports_a_class_tpu_inference_removed():
    """#3016, stock: the import MaxText 0.2.3's Qwen3-Next layer makes on the vLLM path fails."""
    with pytest.raises(ImportError, match="GdnAttentionConfig"):
        from tpu_inference.layers.common.gdn_attention import GdnAttentionConfig  # noqa: F401


@pytest.mark.envs("maxtext-0.2.3")
def test_qwen3_next_refusal_names_the_removed_class_defect(installed):
    with pytest.raises(ShimRefusedError) as e:
        tiny.tiny_config("default", vllm=True, model_name="qwen3-next-80b-a3b", override_model_config=True)
    assert "kv-slots-out-of-layer-order" in str(e.value)  # the first matching defect of the row
    config = types.SimpleNamespace(model_name="qwen3-next-80b-a3b", attention="vllm_rpa")
    gdn = next(d for d in ROW.known_defects if d.id == "gdn-config-import-gone")
    assert defects.config_matches(gdn, config)
    assert "MaxText 0.2.4" in str(defects.refusal(ROW, gdn, defects.installed_tpu_inference(), config))


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2")
def test_a_non_rpa_attention_backend_is_refused_on_the_vllm_path(installed, monkeypatch):
    """A server started with --attention-backend NAME (a registered backend): refused, named, before loading."""
    from tpu_inference.layers.common import attention_backend

    vllm_config = pytest.importorskip("vllm.config")
    monkeypatch.setattr(attention_backend, "attention_backend_name", lambda config: "my_flash")
    monkeypatch.setattr(vllm_config, "get_current_vllm_config_or_none", lambda: object())
    with pytest.raises(ShimRefusedError) as e:
        tiny.tiny_config("default", vllm=True)
    assert e.value.argument == "--attention-backend" and "my_flash" in str(e.value)
    tiny.tiny_config("default")  # not a vLLM config: nothing to check


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4", "maxtext-0.2.3", "maxtext-0.2.2")
def test_doctor_lists_the_rows_defects_with_their_conditions():
    from maxtext_compat import doctor

    text = doctor.render(doctor.collect())
    for defect in ROW.known_defects:
        assert defect.id in text
    if BATCHED in IDS:
        assert f"{BATCHED}: may apply - tpu-inference 0.32.0; applies when attention in ['vllm_batched_rpa']" in text


@pytest.mark.envs("maxtext-0.2.5", "maxtext-0.2.4")
def test_uninstall_takes_the_config_check_away(installed, monkeypatch):
    monkeypatch.delenv("USE_BATCHED_RPA_KERNEL", raising=False)
    shims.uninstall("known-defects")
    cfg = tiny.tiny_config("default", vllm=True, attention="vllm_batched_rpa")
    assert cfg.attention == "vllm_batched_rpa"
