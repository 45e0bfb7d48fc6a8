# Sourced by tools/tpu/run.sh and bench.sh (bash): the tier's interpreter settings, the same for tests and figures.
# In: MAXTEXT_COMPAT_ACCEL (1 on a TPU or GPU, the default; dry or dry-gpu on a CPU; MAXTEXT_COMPAT_TPU is its
# older name), TPU_SITE, TPU_DRY_SOCKETS, TPU_PYTHON.
# Out: PYTHONPATH (the installed stages first, the machine's own jax kept), JAX_PLATFORMS, JAX's compilation cache,
# the TPU_* variables
# tpu-inference reads instead of asking GCE's metadata server (no network there), and TPU_RUN: the command prefix
# (in a dry run tools/tpu/nosocket.c, which refuses every IP socket as the TPU machine does; TPU_DRY_SOCKETS=1
# keeps them).
export MAXTEXT_COMPAT_ACCEL=${MAXTEXT_COMPAT_ACCEL:-${MAXTEXT_COMPAT_TPU:-1}}
TPU_SITE=${TPU_SITE:-build/tpu-site}
export PYTHONPATH=$TPU_SITE-project:$TPU_SITE:$TPU_SITE-model:$TPU_SITE-gemma${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TPU_NAME=${TPU_NAME:-local} TPU_WORKER_ID=${TPU_WORKER_ID:-0}
# JAX's persistent compilation cache, every program (kept on a warm machine between calls): a program compiled once
# (the native call's and the layer's identical ones, a rerun's) loads instead of compiling again; bench_tpu.py
# marks a first call served from it, so a cached load never passes for a compile time.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/build/tpu/jax-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}
TPU_RUN=("${TPU_PYTHON:-python3}")
if [ "$MAXTEXT_COMPAT_ACCEL" != 1 ]; then  # dry, dry-gpu: the CPU rehearsals
  export JAX_PLATFORMS=cpu TPU_ACCELERATOR_TYPE=${TPU_ACCELERATOR_TYPE:-cpu}
  if [ "${TPU_DRY_SOCKETS:-0}" != 1 ]; then
    mkdir -p build/tpu
    if command -v cc >/dev/null && cc -O2 -o build/tpu/nosocket tools/tpu/nosocket.c; then
      TPU_RUN=(build/tpu/nosocket "${TPU_RUN[@]}")
      echo "[tpu] dry run without IP sockets (tools/tpu/nosocket.c), as on the TPU machine"
    else
      echo "[tpu] no C compiler: the dry run keeps IP sockets (the TPU machine has none)"
    fi
  fi
else
  # The accelerator this interpreter has (JAX_PLATFORMS may name only platforms that start), and cpu: host
  # callbacks (the traced KV-write check) run there.
  if [ -z "${JAX_PLATFORMS:-}" ]; then
    found=$("${TPU_PYTHON:-python3}" -c 'import importlib.util as u
print("tpu" if u.find_spec("libtpu") else "cuda" if u.find_spec("jax_cuda13_plugin") or u.find_spec("jax_cuda12_plugin") else "")')
    export JAX_PLATFORMS=${found:+$found,}cpu
  fi
fi
