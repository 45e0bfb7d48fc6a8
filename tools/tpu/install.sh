#!/usr/bin/env bash
# The TPU tier's install recipe (make test-tpu runs it). Installs the pins of tools/tpu/*.txt, without dependency
# resolution (the lists are the measured closure), into one folder that goes first on PYTHONPATH; the interpreter's
# own jax/jaxlib/libtpu (the TPU machine has them on PYTHONPATH) are used as they are, never replaced.
#   from the registries when they answer (a user's TPU VM), else offline from the wheel folder `make tpu-wheels`
#   prepared (build/tpu-wheels, reassembled from its parts) plus the machine's own index (/opt/pypi/files, /opt/wheels).
# usage: tools/tpu/install.sh            env: TPU_PYTHON (python3), TPU_SITE (build/tpu-site), TPU_WHEELS
#        (build/tpu-wheels), TPU_OFFLINE=1|0 (default: probe the registry), TPU_LOCAL_INDEX (/opt/pypi/files:/opt/wheels)
set -euo pipefail
cd "$(dirname "$0")/../.."
here=tools/tpu
PY=${TPU_PYTHON:-python3}
SITE=${TPU_SITE:-build/tpu-site}
WHEELS=${TPU_WHEELS:-build/tpu-wheels}
LOCAL_INDEX=${TPU_LOCAL_INDEX:-/opt/pypi/files:/opt/wheels}
say() { echo "[tpu-install] $*"; }

# 1. The interpreter: Python 3.11 (the route these lists are for) and jax 0.10.2, or jax installed below.
ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$ver" = 3.11 ] || { say "need Python 3.11 (the TPU VM's; these pins are its closure), found $ver at $PY"; exit 2; }
jax_have=$("$PY" -c 'import jax; print(jax.__version__)' 2>/dev/null || echo none)
say "python $ver ($("$PY" -c 'import sys; print(sys.executable)')), jax $jax_have"

# 2. pip: the interpreter's, else the one in the local index run from its wheel.
if "$PY" -m pip --version >/dev/null 2>&1; then PIP=("$PY" -m pip)
else
  whl=$(ls ${LOCAL_INDEX//:/ } 2>/dev/null | grep -m1 -E '^pip-[0-9.]+-py3-none-any\.whl$' || true)
  [ -n "$whl" ] || { say "no pip: neither '$PY -m pip' nor a pip wheel in $LOCAL_INDEX"; exit 2; }
  for d in ${LOCAL_INDEX//:/ }; do [ -f "$d/$whl" ] && PIP=("$PY" "$d/$whl/pip") && break; done
fi
PIP+=(--isolated --disable-pip-version-check)

# 3. Where from.
offline=${TPU_OFFLINE:-}
if [ -z "$offline" ]; then
  if timeout 30 "${PIP[@]}" index versions packaging >/dev/null 2>&1; then offline=0; else offline=1; fi
fi
if [ "$offline" = 1 ]; then
  "$PY" "$here/parts.py" join "$WHEELS" --parts "${TPU_PARTS:-build/tpu-parts}"  # checked against the manifest
  SRC=(--no-index --find-links "$WHEELS")
  for d in ${LOCAL_INDEX//:/ }; do [ -d "$d" ] && SRC+=(--find-links "$d"); done
  say "offline: $WHEELS + ${LOCAL_INDEX}"
else
  SRC=()
  for d in "$WHEELS" ${LOCAL_INDEX//:/ }; do [ -d "$d" ] && SRC+=(--find-links "$d"); done
  say "registry reachable: installing from it"
fi

# 4. Up to date? (the lists and the jax found)
stamp=$(cat "$here"/*.txt | sha256sum | cut -c1-16)-$jax_have-$offline
if [ -f "$SITE/.tpu-site" ] && [ "$(cat "$SITE/.tpu-site")" = "$stamp" ]; then
  say "$SITE up to date"
else
  rm -rf "$SITE"; mkdir -p "$SITE"
  lists=(-r "$here/local.txt" -r "$here/bring.txt")
  [ "$jax_have" = none ] && lists+=(-r "$here/jax.txt")
  t0=$(date +%s)
  # MaxText says Requires-Python >=3.12; 0.2.3's code runs on 3.11 (docs/tpu.md).
  "${PIP[@]}" install -q --no-deps --ignore-requires-python --target "$SITE" "${SRC[@]}" "${lists[@]}"
  # Wheels built for Python 3.12 only whose code runs on 3.11 (vllm-tpu: see docs/python.md).
  "${PIP[@]}" install -q --no-deps --target "$SITE" "${SRC[@]}" --only-binary=:all: --python-version 3.12 \
    -r "$here/bring-cp312.txt"
  echo "$stamp" > "$SITE/.tpu-site"
  say "installed into $SITE in $(( $(date +%s) - t0 )) s ($(du -sh "$SITE" | cut -f1))"
fi
# The project itself, built from this checkout every time (hatchling from the same sources), beside the pins:
# run.sh puts it first on PYTHONPATH (its entry points: the pytest and vLLM plugins).
rm -rf "$SITE-project"
"${PIP[@]}" install -q --no-deps --target "$SITE-project" "${SRC[@]}" .
say "maxtext-compat from this checkout into $SITE-project"
