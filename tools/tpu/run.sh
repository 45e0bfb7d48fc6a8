#!/usr/bin/env bash
# make test-accel (make test-tpu): install the tier (tools/tpu/install.sh) and run the tests marked `tpu`
# (tests/tpu) in one process (tools/tpu/session.py: one program at a time may hold the chip).
# MAXTEXT_COMPAT_ACCEL=1 on a TPU or GPU (the default; a GPU deselects the tests marked `pallas`), =dry on a CPU: the
# TPU route with the kernel interpreted and, where a C compiler is found, every IP socket refused as on the TPU
# machine (tools/tpu/env.sh); =dry-gpu: the GPU route on a CPU (no Pallas, rpa_xla).
# usage: tools/tpu/run.sh [core|model|gemma|all] [pytest args ...]   (all: every stage, in session.py's order)
#   core   the kernel vs float64, rpa_xla, MaxText's layers native vs the layer (HLO counts), the tiny model's decode
#   model  SmolLM2 vs transformers (paged and dense), vllm.LLM in-process
#   gemma  Gemma 3 270M vs transformers (paged with the sliding window on the kernel, dense), past the window
# Writes to $OUT when set (a device call's output folder: it comes back even when the call is stopped), else
# build/tpu: tier-STAGE.log, junit-STAGE.xml, results-STAGE/progress.jsonl (a line per finished test, as it ends)
# and results-STAGE/records.json (what the tests measured).
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:-all}
[ $# -gt 0 ] && shift
case $STAGE in core | model | gemma | all) ;; *) echo "[test-tpu] unknown stage '$STAGE': core, model, gemma or all" >&2; exit 2 ;; esac
DEST=${OUT:-build/tpu}
mkdir -p "$DEST" build/tpu
LOG=$DEST/tier-$STAGE.log
export TPU_RESULTS=$DEST/results-$STAGE
rm -rf "$TPU_RESULTS"
t0=$(date +%s)
tools/tpu/install.sh "$STAGE" 2>&1 | tee "$LOG"
# shellcheck source=tools/tpu/env.sh
source tools/tpu/env.sh > >(tee -a "$LOG")
set +e
"${TPU_RUN[@]}" tools/tpu/session.py "$STAGE" --junit "$DEST/junit-$STAGE.xml" -- "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "[test-accel] stage $STAGE, mode ${MAXTEXT_COMPAT_ACCEL}, exit $rc, $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
exit "$rc"
