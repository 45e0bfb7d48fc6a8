"""Where the matrix runner's caches live, outside the tree: the one place that names a cache path.

Why one module: the test runs, the demo, the real-model helpers and the benchmarks all read the same caches (JAX's
compilation cache per jaxlib, the bytecode prefix, the cross-era answers, transformers' readings of the real model);
each used to import the whole runner for a path. Set MAXTEXT_COMPAT_COMPILE_CACHE to move them, or to "" to turn
them off.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from maxtext_compat.atomic_file import PARTIAL_GLOB

TYPE_CHECKING = False
if TYPE_CHECKING:
    from maxtext_compat.matrix import CompatMatrix

# A persistent XLA compilation cache outside the tree (beside uv's cache): a warm rerun skips compiles.
COMPILE_CACHE_VAR = "MAXTEXT_COMPAT_COMPILE_CACHE"
COMPILE_CACHE_MAX_BYTES = 1 << 30  # per environment; JAX drops the least recently used entries beyond it
PYCACHE = "pycache"  # every environment's .pyc files (PYTHONPYCACHEPREFIX), keyed by each source's own path
PARTNER_ANSWERS = "era-partner"  # the cross-era test's answers, beside the compilation caches
HF_REFERENCE = "hf-reference"  # transformers' reading of the real model's file (testing.real_model.hf_reference)
# Each folder's entries and the age at which an unused one goes: a hit touches its file, and their keys include
# what they were computed from (our source, the readers' versions), so a change leaves the old ones unreachable.
UNUSED_CACHE_MAX_AGE_S = 14 * 24 * 3600.0
# A writer killed mid-write (a timed-out environment's process group) leaves its `.partial` file behind.
PRUNED_CACHES = {PARTNER_ANSWERS: ("*.npz", PARTIAL_GLOB), HF_REFERENCE: ("*.safetensors", PARTIAL_GLOB)}


def cache_base() -> Path | None:
    """Where the suite's caches live outside the tree (None when the variable is set to "": no caches)."""
    root = os.environ.get(COMPILE_CACHE_VAR)
    if root == "":
        return None
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "maxtext-compat"


def compile_cache_folder(name: str, m: CompatMatrix | None = None) -> str:
    """The cache folder's name: one per jaxlib release among the environments of `m` that pin one, else the
    environment's own. JAX's key for an entry holds the program (debug locations stripped), the devices, the compile
    options, the XLA flags and jaxlib's version, so an entry one environment wrote is another's hit only where that
    one compiles the very same program (the same tiny model under two MaxText releases, the same kernel under two
    tpu-inference releases); its lock file serialises the processes that share it."""
    spec = m.environments.get(name) if m is not None else None
    if spec is None:
        return name
    jaxlib = spec.pinned("jaxlib") or spec.pinned("jax")
    return f"jaxlib-{jaxlib}" if jaxlib else name


def compile_cache_dir(name: str, m: CompatMatrix | None = None) -> Path | None:
    """The folder of one environment's JAX compilation cache (None when caches are off); with the matrix `m`, the
    folder it shares with the environments of the same jaxlib (compile_cache_folder)."""
    base = cache_base()
    return None if base is None else base / "jax-compile" / compile_cache_folder(name, m)


def compile_cache_env(name: str, m: CompatMatrix | None = None) -> dict[str, str]:
    """JAX's persistent compilation cache for one environment (off when the variable is set to "")."""
    folder = compile_cache_dir(name, m)
    if folder is None:
        return {}
    return {
        "JAX_COMPILATION_CACHE_DIR": str(folder),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0.2",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "JAX_COMPILATION_CACHE_MAX_SIZE": str(COMPILE_CACHE_MAX_BYTES),
    }


def bytecode_cache_env() -> dict[str, str]:
    """Where test processes write their compiled modules: outside the tree and the environments, so a rebuilt
    environment (same path) starts warm. A machine that sets PYTHONDONTWRITEBYTECODE (CI does) otherwise
    compiles vllm, torch and tpu-inference from source again in every process: run_env drops that variable."""
    base = cache_base()
    return {} if base is None else {"PYTHONPYCACHEPREFIX": str(base / PYCACHE)}


def partner_answers_dir() -> Path | None:
    """Where the cross-era test keeps its partner's answers between environments (None: caches are off)."""
    base = cache_base()
    return None if base is None else base / PARTNER_ANSWERS


def hf_reference_dir() -> Path | None:
    """Where transformers' reading of the real model is kept between environments (None: caches are off)."""
    base = cache_base()
    return None if base is None else base / HF_REFERENCE


def prune_unused_caches(now: float | None = None) -> list[Path]:
    """Delete the cache entries (cross-era answers, transformers' readings) nobody used for
    UNUSED_CACHE_MAX_AGE_S; other files in those folders are left alone. Returns those deleted."""
    base = cache_base()
    if base is None:
        return []
    cutoff = (time.time() if now is None else now) - UNUSED_CACHE_MAX_AGE_S
    gone = []
    for folder, patterns in PRUNED_CACHES.items():
        for f in sorted(f for pattern in patterns for f in (base / folder).glob(pattern)):
            with contextlib.suppress(FileNotFoundError):  # another run pruning at the same time
                if f.stat().st_mtime < cutoff:
                    f.unlink()
                    gone.append(f)
    return gone


def cache_is_cold(name: str, m: CompatMatrix | None = None) -> bool:
    """True when this environment's compilation cache holds no entry now (missing, empty, or caches turned off):
    its run will compile everything."""
    folder = compile_cache_dir(name, m)
    if folder is None:
        return True
    try:
        return not any(f.is_file() for f in folder.rglob("*"))
    except OSError:
        return True
