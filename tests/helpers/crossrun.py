"""Run the same generation in this process or in another matrix environment, and compare them.

Why: "the backport on MaxText 0.1.0 computes what 0.2.5 computes natively" can only be shown
across two virtual environments (their MaxText, jax and flax differ). A `RunSpec` fixes
everything that decides the numbers: family, sizes, TP degree, prompts, steps, buckets and
the weights file. `run(spec)` executes it on the installed release (the paged engine, the
dense reference, the KV caches read back per prompt); `start_in_env(env, specs)` does the same
in another environment's python (one process for all specs: imports cost 20-50 s) and
`.results()` loads its outputs from .npz files.

    python -m helpers.crossrun SPECS.json OUT_0.npz ...   # what the subprocess runs
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from maxtext_compat.errors import CrossRunError, InvalidArgumentError

TESTS_DIR = Path(__file__).resolve().parents[1]

# What a CPU subprocess needs before jax / tpu-inference import (see maxtext_runtime.md, Q6).
CPU_ENV = {
    "JAX_PLATFORMS": "cpu",
    "TPU_NAME": "cpu-test",
    "TPU_WORKER_ID": "0",
    "TPU_ACCELERATOR_TYPE": "cpu",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
}


@dataclass(frozen=True)
class RunSpec:
    """Everything that decides a run's numbers (JSON-serialisable; equal specs give equal runs)."""

    family: str = "default"
    prompts: tuple[tuple[int, ...], ...] = ()
    num_steps: int = 8
    tp: int = 1
    overrides: tuple[tuple[str, Any], ...] = ()  # extra MaxText config keys, e.g. (("base_num_kv_heads", 4),)
    weights_in: str | None = None  # .npz to load (None: the release's random init, seed 0)
    weights_out: str | None = None  # .npz to write the model's parameters to (after loading)
    force: tuple[tuple[int, ...], ...] | None = None  # teacher forcing (see PagedEngine.generate)
    paged: bool = True  # False: only the dense reference (runs where tpu-inference is absent)
    dense: bool = True
    read_kv: bool = False
    num_pages: int = 16
    page_size: int = 16
    buckets: tuple[int, int, int] = (48, 4, 2)  # max_num_tokens (prefill and decode), max_num_seqs, pages_per_seq
    profile: str | None = None  # a shim profile installed before the models are built (e.g. "vllm-backport")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        d = json.loads(text)
        d["prompts"] = tuple(tuple(p) for p in d["prompts"])
        d["overrides"] = tuple((k, v) for k, v in d["overrides"])
        d["buckets"] = tuple(d["buckets"])
        if d.get("force") is not None:
            d["force"] = tuple(tuple(f) for f in d["force"])
        return cls(**d)


@dataclass
class RunResult:
    """Outputs of a run: the generations, KV read back per (layer, prompt), and what ran where."""

    paged: Any = None  # engine.Generation
    dense: Any = None
    kv: dict[tuple[int, int], tuple[Any, Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# In this process
# ----------------------------------------------------------------------------------------------


def native_mesh(cfg: Any, tp: int) -> Any:
    """MaxText 0.2.x vLLM mesh: vllm.yml's axes, 'model' of size tp (vllm.yml has no ici knob for it)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    devices = np.array(jax.devices()[:tp]).reshape([tp if a == "model" else 1 for a in cfg.mesh_axes])
    axis_type = getattr(getattr(jax.sharding, "AxisType", None), "Auto", None)
    if axis_type is None:
        return Mesh(devices, cfg.mesh_axes)
    return Mesh(devices, cfg.mesh_axes, axis_types=(axis_type,) * len(cfg.mesh_axes))


def build(spec: RunSpec) -> tuple[Any, Any]:
    """(paged-path model or None, dense reference model or None) of the installed release for `spec`.

    Both hold the same weights: `spec.weights_in` when given, else the paged model's random init.
    On 0.2.x the dense model is a base.yml twin (the vLLM config's attention cannot run densely).
    """
    from maxtext_compat.serving.param_trees import export_params, load_npz, load_params, save_params
    from maxtext_compat.testing import tiny

    if spec.profile is not None:
        from maxtext_compat import shims

        shims.install(spec.profile)
    row = tiny.installed_row()
    native = row.has_kv_params
    overrides = dict(spec.overrides)
    if native and spec.tp > 1:  # vllm.yml has no tensor axis: heads split over 'model' (MaxText pads KV heads to TP)
        overrides.setdefault("base_num_query_heads", max(2, spec.tp))
        overrides.setdefault("base_num_kv_heads", spec.tp)
    model = dense = None
    if spec.paged and native:
        cfg = tiny.tiny_config(spec.family, vllm=True, **overrides)
        model = tiny.tiny_transformer(cfg, native_mesh(cfg, spec.tp), model_mode="autoregressive")
    elif spec.paged:
        cfg = tiny.tiny_config(spec.family, tp=spec.tp, **overrides)
        model = tiny.tiny_transformer(cfg, tiny.tiny_mesh(cfg, spec.tp))
    if spec.dense and (native or model is None):
        base = tiny.tiny_config(spec.family, **overrides)
        dense = tiny.tiny_transformer(base, tiny.tiny_mesh(base))
    elif spec.dense:
        dense = model  # 0.1.0: the same train-mode model runs both paths
    source = model if model is not None else dense
    if source is None:
        raise InvalidArgumentError(
            "the spec runs nothing",
            argument="spec",
            expected="paged or dense True",
            found="paged=False, dense=False",
            fix="set RunSpec(paged=True) and/or RunSpec(dense=True)",
        )
    if spec.weights_in:
        load_params(source, load_npz(spec.weights_in), where=f"MaxText {row.name} {spec.family}")
    if dense is not None and dense is not source:
        load_params(dense, export_params(source), where="the dense twin")
    if spec.weights_out:
        save_params(source, spec.weights_out)
    return model, dense


def run(spec: RunSpec, model: Any = None, dense_model: Any = None) -> RunResult:
    """Execute `spec` here (models built from it unless given)."""
    from maxtext_compat.decode import Buckets, PagedEngine, dense_greedy
    from maxtext_compat.paged import read_kv
    from maxtext_compat.testing import tiny

    if not spec.prompts:
        raise InvalidArgumentError(
            "the spec has no prompts",
            argument="spec.prompts",
            expected="at least one prompt",
            found="()",
            fix="give the RunSpec at least one prompt (a tuple of token ids)",
        )
    if model is None:
        model, dense_model = build(spec)
    paged = dense = None
    if spec.paged:
        tokens, seqs, pages = spec.buckets
        buckets = Buckets(tokens, seqs, pages)
        engine = PagedEngine(model, num_pages=spec.num_pages, page_size=spec.page_size, buckets=buckets)
        paged = engine.generate(spec.prompts, spec.num_steps, force=spec.force)
    if spec.dense:
        dense = dense_greedy(dense_model, spec.prompts, spec.num_steps, force=spec.force)
    kv = {}
    if spec.read_kv and paged is not None:
        for layer, cache in enumerate(paged.caches or []):
            for i in range(len(spec.prompts)):
                kv[(layer, i)] = read_kv(cache, paged.layout, paged.pages[i], paged.kv_len(i))
    from maxtext_compat import shims

    row = tiny.installed_row()
    package = sys.modules.get(row.import_root)
    meta = {"release": row.name, "native": row.has_kv_params, "tp": spec.tp, "profiles": shims.active_profiles(),
            "maxtext_file": getattr(package, "__file__", None)}  # fmt: skip
    if paged is not None:
        meta["layout"] = paged.layout.describe()
    return RunResult(paged, dense, kv, meta)


# ----------------------------------------------------------------------------------------------
# Serialisation (.npz) and another environment
# ----------------------------------------------------------------------------------------------


def _pack_generation(prefix: str, gen: Any, out: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    for s, step in enumerate(gen.steps):
        for i, rows in enumerate(step.logits):
            out[f"{prefix}/logits/{s}/{i}"] = np.asarray(rows)
    out[f"{prefix}/tokens"] = np.asarray([step.tokens for step in gen.steps], np.int64)
    out[f"{prefix}/seconds"] = np.asarray([step.seconds for step in gen.steps], np.float64)
    return {"kinds": [step.kind for step in gen.steps], "compile_seconds": gen.compile_seconds}


def _unpack_generation(prefix: str, data: Any, info: dict[str, Any], prompts: Any, path: str) -> Any:
    from maxtext_compat.decode import Generation, StepRecord

    tokens = data[f"{prefix}/tokens"]
    seconds = data[f"{prefix}/seconds"]
    steps = []
    for s, kind in enumerate(info["kinds"]):
        logits = tuple(data[f"{prefix}/logits/{s}/{i}"] for i in range(len(prompts)))
        steps.append(StepRecord(kind, logits, tuple(int(t) for t in tokens[s]), float(seconds[s])))
    return Generation(path, tuple(tuple(p) for p in prompts), steps, info["compile_seconds"])


def save_result(result: RunResult, path: str | Path) -> Path:
    import numpy as np

    arrays: dict[str, Any] = {}
    meta = dict(result.meta)
    if result.paged is not None:
        meta["paged"] = _pack_generation("paged", result.paged, arrays)
    if result.dense is not None:
        meta["dense"] = _pack_generation("dense", result.dense, arrays)
    for (layer, i), (k, v) in result.kv.items():
        arrays[f"kv/{layer}/{i}/k"], arrays[f"kv/{layer}/{i}/v"] = k, v
    meta["prompts"] = [list(p) for p in (result.paged or result.dense).prompts]
    arrays["meta"] = np.asarray(json.dumps(meta))
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return Path(path)


def load_result(path: str | Path) -> RunResult:
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        data = {k: npz[k] for k in npz.files}
    meta = json.loads(str(data.pop("meta")))
    prompts = meta.pop("prompts")
    paged = _unpack_generation("paged", data, meta.pop("paged"), prompts, "paged") if "paged" in meta else None
    dense = _unpack_generation("dense", data, meta.pop("dense"), prompts, "dense") if "dense" in meta else None
    kv = {}
    for key in data:
        if key.startswith("kv/") and key.endswith("/k"):
            _, layer, i, _ = key.split("/")
            kv[(int(layer), int(i))] = (data[key], data[key[:-1] + "v"])
    return RunResult(paged, dense, kv, meta)


@dataclass
class PendingRun:
    """Runs started in another environment (one process, imports paid once); `.results()` waits."""

    env: str
    process: subprocess.Popen[str]
    outs: list[Path]
    log: Path
    started: float
    timeout: float
    owned_dir: Path | None = None  # a temporary folder start_in_env made: removed once the results are read

    def results(self) -> list[RunResult]:
        """The runs' results; a failed or hung run keeps its folder, whose log the error names."""
        try:
            code = self.process.wait(timeout=max(1.0, self.timeout - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise CrossRunError(
                f"the run in {self.env} did not finish",
                argument="timeout",
                expected=f"< {self.timeout:.0f} s",
                found=self._tail(),
                fix=f"read {self.log} for where it hung; pass a larger timeout= to start_in_env if it was only slow",
            ) from None
        if code != 0 or not all(out.is_file() for out in self.outs):
            raise CrossRunError(
                f"the run in {self.env} failed (exit code {code})",
                argument="env",
                expected="exit code 0 and one result file per spec",
                found=self._tail(),
                fix=f"read the traceback in {self.log}; rerun the spec in {self.env} by hand to debug it",
            )
        results = [load_result(out) for out in self.outs]
        for result in results:
            result.meta["wall_seconds"] = time.monotonic() - self.started
        if self.owned_dir is not None:
            shutil.rmtree(self.owned_dir, ignore_errors=True)
        return results

    def _tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def missing_env(env: str) -> str | None:
    """Why matrix environment `env` cannot run a spec (its python is absent), or None when it can.

    Under the matrix runner (MAXTEXT_COMPAT_ENV set) a partner not built, or built from other pins, is built here:
    the runner builds each environment as it starts it, and a partner may be needed before its own turn. Under the
    environment's build lock, so a build of it under way is waited for, not repeated (an up-to-date one is left as
    it is); a failed build is the test's failure."""
    from maxtext_compat.runner import envs, workspace

    python = envs.env_python(env)
    if os.environ.get("MAXTEXT_COMPAT_ENV"):
        ws = workspace.default()
        envs.build(ws.matrix.environment(env), log=lambda line: print(line, file=sys.stderr), ws=ws)
    return None if python.exists() else f"matrix environment {env} is not built ({python} does not exist)"


def start_in_env(
    env: str,
    specs: list[RunSpec],
    *,
    timeout: float = 900.0,
    workdir: str | Path | None = None,
    import_first: str | Path | None = None,
) -> PendingRun:
    """Start `specs` in matrix environment `env` (its bin/python, one process) and return at once.

    import_first: a directory put ahead of the environment's packages (a migrated copy of MaxText).
    """
    from maxtext_compat.runner.envs import env_python

    python = env_python(env)
    if missing_env(env) is not None:
        raise CrossRunError(
            f"matrix environment {env} is not built",
            argument="env",
            expected=str(python),
            fix=f"build it: maxtext-compat envs build {env}",
        )
    owned: Path | None = None
    if workdir:
        work = Path(workdir)
    else:
        work = owned = Path(tempfile.mkdtemp(prefix=f"crossrun_{env}_"))
    work.mkdir(parents=True, exist_ok=True)
    spec_path, log = work / "specs.json", work / "log.txt"
    outs = [work / f"result_{k}.npz" for k in range(len(specs))]
    spec_path.write_text(json.dumps([json.loads(s.to_json()) for s in specs]))
    child_env = {**os.environ, **CPU_ENV, "MAXTEXT_COMPAT_ENV": env}
    # The child runs this module as `helpers.crossrun`: the tests folder goes on its path (after a migrated copy).
    first = [str(import_first)] if import_first is not None else []
    child_env["PYTHONPATH"] = os.pathsep.join([*first, str(TESTS_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    with open(log, "w") as f:
        process = subprocess.Popen(
            [str(python), "-m", "helpers.crossrun", str(spec_path), *map(str, outs)],
            stdout=f, stderr=subprocess.STDOUT, env=child_env, text=True,
        )  # fmt: skip
    return PendingRun(env, process, outs, log, time.monotonic(), timeout, owned)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print("usage: python -m helpers.crossrun SPECS.json OUT_0.npz [OUT_1.npz ...]", file=sys.stderr)
        return 2
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    specs = [RunSpec.from_json(json.dumps(d)) for d in json.loads(Path(args[0]).read_text())]
    if len(specs) != len(args) - 1:
        print(f"{len(specs)} specs but {len(args) - 1} output paths", file=sys.stderr)
        return 2
    import importlib.util

    if any(s.paged for s in specs) and importlib.util.find_spec("tpu_inference") is not None:
        from maxtext_compat.cpu import rpa as cpu_rpa

        cpu_rpa.install()  # before MaxText is imported and before the first trace
    for spec, out in zip(specs, args[1:], strict=True):
        save_result(run(spec), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
