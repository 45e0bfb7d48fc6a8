"""The adapter on MaxText 0.2.5 and the backport on 0.1.0 answer the same input the same way.

Hypothesis draws new calls that write the paged KV cache, wrong in one or more ways at once (how many caches,
their dtype, KV heads and page count, the metadata's form and the cache it was built for, the positions), on
an Attention or a whole Transformer. Each drawn call runs here (MaxText 0.2.5: the adapter hands it to
MaxText's own vLLM path) and, unchanged, in maxtext-0.1.0-jax011 (the backport through the same tpu-inference
0.32.0 kernel on the same jax), on the same weights (saved here, loaded there) and the same inputs
(tests/compat/paths_partner.py). Both must give the same typed error (class, argument, expected), or both
run, with the same output and the same written caches (tolerance below).

The draws are collected first (derandomized, so every run checks the same calls), the partner runs them all
in one process while this one does, and then each pair is compared; a mismatch prints the call.
"""

from __future__ import annotations

import json
import os
import subprocess
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# make test-extended's: make test holds the backport on 0.1.0 to 0.2.5's own path in test_backport_numerics.
pytestmark = [pytest.mark.needs_maxtext, pytest.mark.envs("maxtext-0.2.5"), pytest.mark.extended]

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PARTNER = "maxtext-0.1.0-jax011"  # the backport, on 0.2.5's tpu-inference 0.32.0 and jax 0.11.2
PAGES, PAGE, TOKENS = 8, 16, 40
LENGTHS = (("A", 20), ("C", 13))
EXAMPLES = 24
# Same kernel and jax on both sides; measured: outputs and caches 0.0 apart (exact), bounded here as the
# backport numerics test bounds the whole model (f32).
TOL = 1e-5

CASE = st.fixed_dictionaries(
    {
        "call": st.sampled_from(["attention", "transformer"]),
        "caches": st.sampled_from([0, 0, 0, -1, 1]),  # how many more caches than layers (a Transformer call)
        "cache_form": st.sampled_from(["array", "array", "list"]),  # an Attention's one cache as a Python list
        "cache_dtype": st.sampled_from(["float32", "float32", "bfloat16"]),
        "cache_heads": st.sampled_from([0, 0, 1]),  # extra KV heads in the cache's layout
        "cache_pages": st.sampled_from([PAGES, PAGES, 4]),  # fewer pages than the metadata's block table names
        "metadata": st.sampled_from(["attention", "ragged", "ragged", "lists", "none", "per_layer", "other_page"]),
        "positions": st.sampled_from(["ok", "ok", "ok", "shifted"]),
    }
)


def draws() -> list[dict[str, Any]]:
    """The calls this run checks (the same every run: derandomized), duplicates dropped."""
    found: list[dict[str, Any]] = []

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(CASE)
    def collect(case: dict[str, Any]) -> None:
        if case not in found:
            found.append(case)

    collect()
    # A call with nothing wrong runs the kernel eagerly on both sides (~5-10 s each on 2 cores): one per
    # (module, metadata form) is the comparison; more of them compare the same numbers again.
    seen: set[tuple[str, str]] = set()
    for case in list(found):
        if _runs(case):
            key = (case["call"], case["metadata"])
            if key in seen:
                found.remove(case)
            seen.add(key)
    always = [  # the three cases, whatever hypothesis draws
        {**CASE_DEFAULTS, "call": "transformer", "caches": -1},
        {**CASE_DEFAULTS, "call": "transformer", "caches": 1},
        {**CASE_DEFAULTS, "call": "attention", "metadata": "ragged"},
    ]
    return always + [c for c in found if c not in always]


def _runs(case: dict[str, Any]) -> bool:
    """Whether nothing is wrong with the drawn call (it then runs on both sides)."""
    return (
        (case["caches"] == 0 if case["call"] == "transformer" else case["cache_form"] == "array")
        and case["cache_dtype"] == "float32"
        and case["cache_heads"] == 0
        and case["cache_pages"] == PAGES
        and (
            case["metadata"] in ("attention", "ragged", "per_layer")
            and (case["metadata"] != "per_layer" or case["call"] == "transformer")
        )
        and case["positions"] == "ok"
    )


CASE_DEFAULTS = {"call": "attention", "caches": 0, "cache_form": "array", "cache_dtype": "float32", "cache_heads": 0,
                 "cache_pages": PAGES, "metadata": "attention", "positions": "ok"}  # fmt: skip


# ----------------------------------------------------------------------------------------------
# One call, as either environment runs it (paths_partner.py imports these)
# ----------------------------------------------------------------------------------------------


class World:
    """The installed release's tiny Attention and Transformer (attention in a vLLM config on 0.2.x), the mesh,
    the inputs of one prefill step of two ragged sequences, and the valid metadata."""

    def __init__(self, save_to: Path | None = None) -> None:
        from maxtext_compat import paged
        from maxtext_compat.adapters import wrap
        from maxtext_compat.serving.param_trees import save_params
        from maxtext_compat.testing import tiny

        row = tiny.installed_row()
        native = row.has_kv_params
        self.cfg = cfg = tiny.tiny_config("default", vllm=native)
        if native:  # vllm.yml meshes have no ici knob for 'model': one device, every axis 1
            from jax.sharding import Mesh

            self.mesh = Mesh(np.array(jax.devices()[:1]).reshape([1] * len(cfg.mesh_axes)), cfg.mesh_axes)
        else:
            self.mesh = tiny.tiny_mesh(cfg)
        self.context = lambda: tiny.mesh_context(cfg, self.mesh)
        with self.context():
            mode = {"model_mode": "autoregressive"} if native else {}
            transformer = tiny.tiny_transformer(cfg, self.mesh, **mode)
            attention = tiny.tiny_attention(cfg, self.mesh, batch=TOKENS, seq=1, **mode)
            self.natives = {"transformer": transformer, "attention": attention}
            for name, module in self.natives.items():
                if save_to is not None:
                    save_params(module, save_to / f"{name}.npz")
        self.row = row
        self.transformer, self.attention = wrap(transformer), wrap(attention)  # sharing the natives' variables
        self.layers = cfg.num_decoder_layers
        self.paged = paged
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((TOKENS, 1, cfg.emb_dim)).astype(np.float32)
        self.tokens = rng.integers(0, cfg.vocab_size, (TOKENS, 1)).astype(np.int32)

    def load(self, weights: Path) -> None:
        """The other environment's weights (an adapter shares its module's variables: it sees them too)."""
        from maxtext_compat.serving.param_trees import load_npz, load_params

        with self.context():
            for name, module in self.natives.items():
                load_params(module, load_npz(weights / f"{name}.npz"), where=f"MaxText {self.row.name} {name}")

    def metadata(self, page_size: int = PAGE) -> Any:
        layout = self.paged.KVCacheLayout(PAGES, page_size, self.cfg.num_kv_heads, self.cfg.head_dim, "float32")
        alloc = self.paged.PageAllocator(PAGES, page_size)
        seqs = [self.paged.SequenceSlice(n, n, alloc.allocate(r, n), r) for r, n in LENGTHS]
        return self.paged.build_metadata(seqs, layout, max_num_tokens=TOKENS, max_num_seqs=4,
                                         pages_per_seq=PAGES)  # fmt: skip

    def run(self, case: dict[str, Any]) -> Any:
        """The drawn call through the adapter; returns its result (or raises what it raises)."""
        md = self.metadata()
        heads = self.cfg.num_kv_heads + case["cache_heads"]
        layout = self.paged.KVCacheLayout(case["cache_pages"], PAGE, heads, self.cfg.head_dim, case["cache_dtype"])
        n = self.layers + case["caches"] if case["call"] == "transformer" else 1
        caches = layout.allocate(n) if n > 0 else []
        given = {
            "attention": lambda: md.to_attention_metadata(),
            "ragged": lambda: md,
            "lists": lambda: types.SimpleNamespace(**{k: np.asarray(v).tolist() for k, v in
                                                      vars(md.to_attention_metadata()).items() if k[0] != "_"}),
            "none": lambda: None,
            "per_layer": lambda: {f"layer.{i}": md.to_attention_metadata() for i in range(self.layers)},
            "other_page": lambda: self.metadata(PAGE // 2).to_attention_metadata(),
        }[case["metadata"]]()  # fmt: skip
        pos = md.to_kernel_order(np.concatenate([np.arange(n) for _, n in LENGTHS]).astype(np.int32))
        if case["positions"] == "shifted":
            pos = pos + 1
        pos = jnp.asarray(pos)[:, None]
        with self.context():
            if case["call"] == "transformer":
                return self.transformer(jnp.asarray(self.tokens), pos, kv_caches=caches, attention_metadata=given,
                                        model_mode="autoregressive")  # fmt: skip
            kv = list(caches) if case["cache_form"] == "list" else caches[0]
            x = jnp.asarray(self.x)
            return self.attention(x, x, pos, None, model_mode="autoregressive", deterministic=True, kv_cache=kv,
                                  attention_metadata=given)  # fmt: skip


def outcome(world: World, case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(what happened, the arrays of a call that ran): a typed error by class, argument and expected."""
    from maxtext_compat.errors import CompatError

    try:
        result = world.run(case)
    except CompatError as exc:
        return {"error": type(exc).__name__, "argument": exc.argument, "expected": str(exc.expected)}, {}
    except Exception as exc:
        return {"error": f"untyped {type(exc).__module__}.{type(exc).__name__}", "message": str(exc)[:300]}, {}
    out, kv = result
    caches = kv if isinstance(kv, list) else [kv]
    arrays = {"out": np.asarray(out, np.float32), **{f"kv{i}": np.asarray(c, np.float32) for i, c in enumerate(caches)}}
    return {"ran": sorted(arrays)}, arrays


# ----------------------------------------------------------------------------------------------
# The test
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(this release's World, the draws, the partner process, the work folder). The partner starts first: it
    imports and builds its model while this process builds its own, then loads the weights this one wrote
    (it waits for WEIGHTS_READY, an event; the partner's timeout below guards a hang)."""
    from maxtext_compat.cpu import rpa as cpu_rpa

    assert cpu_rpa.install().active
    work = tmp_path_factory.mktemp("paths_agree")
    cases = draws()
    partner = _start_partner(work, cases)
    try:
        here = World(save_to=work)
        (work / WEIGHTS_READY).write_text("written")
        yield here, cases, partner, work
    finally:
        if partner.poll() is None:
            partner.kill()
            partner.wait()


WEIGHTS_READY = "weights.ready"


def _start_partner(work: Path, cases: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    from helpers.crossrun import CPU_ENV
    from helpers.partner_env import require_env
    from maxtext_compat.runner.envs import env_python, project_root

    require_env(PARTNER)
    request = {"weights": str(work), "ready": str(work / WEIGHTS_READY), "cases": cases, "out": str(work / "partner"),
               "parent": os.getpid()}  # fmt: skip
    (work / "request.json").write_text(json.dumps(request))
    log = open(work / "partner.log", "w")  # noqa: SIM115 - the child writes it until it exits
    return subprocess.Popen(
        [str(env_python(PARTNER)), str(Path(__file__).with_name("paths_partner.py")), str(work / "request.json")],
        cwd=project_root(), stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, **CPU_ENV, "MAXTEXT_COMPAT_ENV": PARTNER},
    )  # fmt: skip


def test_the_adapter_on_0_2_5_and_the_backport_on_0_1_0_give_the_same_answer(world):
    here, cases, partner, work = world
    ours = [outcome(here, case) for case in cases]
    code = partner.wait(timeout=1800)  # a hang guard: the partner's work is bounded (no wait on its speed)
    log = (work / "partner.log").read_text(errors="replace")
    assert code == 0, f"the partner failed in {PARTNER}:\n{log[-3000:]}"
    answers = json.loads((work / "partner" / "outcomes.json").read_text())
    mismatches = []
    for i, (case, (mine, arrays)) in enumerate(zip(cases, ours, strict=True)):
        theirs = answers[i]
        if "untyped" in str(mine.get("error")) or mine != theirs:
            mismatches.append(f"{case}\n  maxtext-0.2.5: {mine}\n  {PARTNER}: {theirs}")
            continue
        if "ran" in mine:
            with np.load(work / "partner" / f"{i}.npz") as npz:
                for name, a in arrays.items():
                    worst = float(np.max(np.abs(a - npz[name]))) if a.size else 0.0
                    if not worst <= TOL:
                        mismatches.append(f"{case}\n  {name} differs by {worst} (> {TOL})")
    assert not mismatches, "\n".join(mismatches)
    ran = sum("ran" in mine for mine, _ in ours)
    assert ran >= 2 and len(cases) - ran >= 10, f"{ran} of {len(cases)} calls ran: the draws lost their mix"
