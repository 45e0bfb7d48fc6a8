"""A profile installed after JAX compiled functions warns, names them, and doctor lists them.

A function traced before the install keeps its compiled code and never reaches the patch (shown below
with a real MaxText Attention); nothing of ours ran during that trace, so the warning names every jitted
function outside JAX/Flax that already holds compiled code, and clears once they are retraced.
"""

from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.needs_maxtext

jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")

from maxtext_compat import doctor, shims  # noqa: E402
from maxtext_compat.errors import TracedBeforeInstallWarning  # noqa: E402
from maxtext_compat.patching import traced  # noqa: E402
from maxtext_compat.testing import tiny  # noqa: E402

ROW = tiny.installed_row()
PROFILE = "count-attention-calls"


def _counting_profile(calls):
    def factory(original):
        def wrapper(wrapped, instance, args, kwargs):
            calls.append(1)
            return wrapped(*args, **kwargs)

        return wrapper

    return lambda: [shims.PatchSpec(f"{ROW.classes['attention']}.__call__", factory)]


def _traced_attention_step(graphdef, state, x, pos, seg):
    out = nnx.merge(graphdef, state)(x, x, pos, seg, model_mode="train", deterministic=True)
    return out[0] if isinstance(out, tuple) else out


def test_install_after_a_trace_warns_and_the_trace_runs_unpatched_until_cleared():
    cfg = tiny.tiny_config("default")
    mesh = tiny.tiny_mesh(cfg)
    inp = tiny.tiny_inputs(cfg)
    step = jax.jit(_traced_attention_step, static_argnums=0)  # a pure jit: only a cleared cache retraces it
    calls: list[int] = []
    shims.register_profile(PROFILE, _counting_profile(calls), replace=True)
    try:
        with tiny.mesh_context(cfg, mesh):
            graphdef, state = nnx.split(tiny.tiny_attention(cfg, mesh))
            args = (graphdef, state, inp["x"], inp["positions"], inp["segment_ids"])
            step(*args)
            with pytest.warns(TracedBeforeInstallWarning, match="_traced_attention_step") as seen:
                shims.install(PROFILE)
            assert seen[0].filename == __file__  # the warning points at the install line
            assert any("_traced_attention_step" in f for f in traced.compiled_before(PROFILE))
            report = doctor.collect()
            assert PROFILE in report["traced_before_install"]
            assert f"WARNING profile {PROFILE} was installed after" in doctor.render(report)
            step(*args)
            assert calls == []  # what the warning says: the compiled trace never reaches the patch
            jax.clear_caches()
            step(*args)
            assert calls  # retraced: the patch runs
            shims.uninstall(PROFILE)
            assert traced.compiled_before(PROFILE) == ()
            jax.clear_caches()
            with warnings.catch_warnings():
                warnings.simplefilter("error", TracedBeforeInstallWarning)
                shims.install(PROFILE)  # nothing compiled since the caches were cleared: no warning
    finally:
        shims.uninstall(PROFILE)
        shims.unregister_profile(PROFILE)
