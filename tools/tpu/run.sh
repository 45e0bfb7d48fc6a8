#!/usr/bin/env bash
# make test-tpu: install the tier (tools/tpu/install.sh) and run the tests marked `tpu` (tests/tpu) in one process
# (one program at a time may hold the chip). MAXTEXT_COMPAT_TPU=1 on a TPU (the default), =dry on a CPU: the
# rehearsal with the kernel interpreted. Writes build/tpu/junit.xml and build/tpu/pytest.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
export MAXTEXT_COMPAT_TPU=${MAXTEXT_COMPAT_TPU:-1}
SITE=${TPU_SITE:-build/tpu-site}
tools/tpu/install.sh
export PYTHONPATH=$SITE-project:$SITE${PYTHONPATH:+:$PYTHONPATH}
if [ "$MAXTEXT_COMPAT_TPU" = dry ]; then export JAX_PLATFORMS=cpu; else export JAX_PLATFORMS=${JAX_PLATFORMS:-tpu}; fi
# tpu-inference asks GCE's metadata server for the TPU's name unless these are set (no network on that machine).
export TPU_NAME=${TPU_NAME:-local} TPU_WORKER_ID=${TPU_WORKER_ID:-0}
[ "$MAXTEXT_COMPAT_TPU" = dry ] && export TPU_ACCELERATOR_TYPE=${TPU_ACCELERATOR_TYPE:-cpu}
mkdir -p build/tpu
t0=$(date +%s)
set +e
"${TPU_PYTHON:-python3}" -m pytest tests/tpu -m tpu -p no:cacheprovider --junitxml=build/tpu/junit.xml "$@" \
  2>&1 | tee build/tpu/pytest.log
rc=${PIPESTATUS[0]}
echo "[test-tpu] mode ${MAXTEXT_COMPAT_TPU}, pytest exit $rc, $(( $(date +%s) - t0 )) s"
exit "$rc"
