#!/usr/bin/env bash
# make test-tpu: install the tier (tools/tpu/install.sh) and run the tests marked `tpu` (tests/tpu) in one process
# (one program at a time may hold the chip). MAXTEXT_COMPAT_TPU=1 on a TPU (the default), =dry on a CPU: the
# rehearsal with the kernel interpreted and, where a C compiler is found, every IP socket refused as on the TPU
# machine (tools/tpu/nosocket.c; TPU_DRY_SOCKETS=1 keeps them).
# usage: tools/tpu/run.sh [core|model|all] [pytest args ...]   (all: both stages, the order below)
#   core   the kernel vs float64, rpa_xla, MaxText's layers native vs the layer (HLO counts), the tiny model's decode
#   model  SmolLM2 vs transformers (paged and dense), vllm.LLM in-process
# Writes to $OUT when set (a device call's output folder: it comes back even when the call is stopped), else
# build/tpu: tier-STAGE.log, junit-STAGE.xml, results-STAGE/progress.jsonl (a line per finished test, as it ends)
# and results-STAGE/records.json (what the tests measured).
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:-all}
[ $# -gt 0 ] && shift
case $STAGE in
  core) FILES=(test_tier_kernel.py test_tier_layers.py test_tier_maxtext.py) ;;
  model) FILES=(test_tier_smollm2.py test_tier_vllm.py) ;;
  all) FILES=(test_tier_kernel.py test_tier_layers.py test_tier_maxtext.py test_tier_smollm2.py test_tier_vllm.py) ;;
  *) echo "[test-tpu] unknown stage '$STAGE': core, model or all" >&2; exit 2 ;;
esac
export MAXTEXT_COMPAT_TPU=${MAXTEXT_COMPAT_TPU:-1}
SITE=${TPU_SITE:-build/tpu-site}
DEST=${OUT:-build/tpu}
mkdir -p "$DEST" build/tpu
LOG=$DEST/tier-$STAGE.log
export TPU_RESULTS=$DEST/results-$STAGE PYTHONUNBUFFERED=1
rm -rf "$TPU_RESULTS"
t0=$(date +%s)
tools/tpu/install.sh "$STAGE" 2>&1 | tee "$LOG"
export PYTHONPATH=$SITE-project:$SITE:$SITE-model${PYTHONPATH:+:$PYTHONPATH}
WRAP=()
if [ "$MAXTEXT_COMPAT_TPU" = dry ]; then
  export JAX_PLATFORMS=cpu TPU_ACCELERATOR_TYPE=${TPU_ACCELERATOR_TYPE:-cpu}
  if [ "${TPU_DRY_SOCKETS:-0}" != 1 ]; then
    if command -v cc >/dev/null && cc -O2 -o build/tpu/nosocket tools/tpu/nosocket.c; then
      WRAP=(build/tpu/nosocket)
      echo "[test-tpu] dry run without IP sockets (tools/tpu/nosocket.c), as on the TPU machine" | tee -a "$LOG"
    else
      echo "[test-tpu] no C compiler: the dry run keeps IP sockets (the TPU machine has none)" | tee -a "$LOG"
    fi
  fi
else
  export JAX_PLATFORMS=${JAX_PLATFORMS:-tpu}
fi
# tpu-inference asks GCE's metadata server for the TPU's name unless these are set (no network on that machine).
export TPU_NAME=${TPU_NAME:-local} TPU_WORKER_ID=${TPU_WORKER_ID:-0}
set +e
"${WRAP[@]}" "${TPU_PYTHON:-python3}" -m pytest "${FILES[@]/#/tests/tpu/}" -m tpu -p no:cacheprovider -rA \
  --junitxml="$DEST/junit-$STAGE.xml" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "[test-tpu] stage $STAGE, mode ${MAXTEXT_COMPAT_TPU}, pytest exit $rc, $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
exit "$rc"
