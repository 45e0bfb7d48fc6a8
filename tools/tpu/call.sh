#!/usr/bin/env bash
# One device call of the accelerator tier (docs/accelerators.md, "Lent a machine?"): install a stage, then its tests
# and its benchmark sections in one process (tools/tpu/session.py), then docs/accelerators.md's measured section from
# every section measured on this machine so far. Everything goes to $OUT as it comes (build/tpu/call-N without one).
#   1  carry build/tpu-parts/part-1: core stage (kernel, rpa_xla, MaxText's layers, the tiny decode) + bench kernel
#      and step (a decoder layer's decode step per shape: through the layer / native, rpa_xla / dense, copy ceiling)
#   2  carry build/tpu-parts/part-2: model stage (SmolLM2 paged and dense, vllm.LLM) + bench model, then the page;
#      it installs both stages (the core one is up to date after call 1), so on a machine that went cold it stops
#      at once naming part-1 (exit 3), and the same command carrying part-1 then finds both parts there
# usage: tools/tpu/call.sh 1|2 [pytest args ...]   env: as run.sh (MAXTEXT_COMPAT_ACCEL=dry or dry-gpu: on a CPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  1) STAGE=core INSTALL=core SECTION=kernel,step ;;
  2) STAGE=model INSTALL=all SECTION=model ;;
  *) echo "usage: tools/tpu/call.sh 1|2" >&2; exit 2 ;;
esac
N=$1; shift
export OUT=${OUT:-build/tpu/call-$N}
mkdir -p "$OUT" build/tpu
LOG=$OUT/call-$N.log
export TPU_RESULTS=$OUT/results-$STAGE
t0=$(date +%s)
MODE=${MAXTEXT_COMPAT_ACCEL:-${MAXTEXT_COMPAT_TPU:-1}}
echo "[call $N] $(date -u '+%F %T') UTC: stage $STAGE, bench $SECTION, mode $MODE" | tee "$LOG"
tools/tpu/install.sh "$INSTALL" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "[call $N] install failed after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"; exit 3; }
# shellcheck source=tools/tpu/env.sh
source tools/tpu/env.sh > >(tee -a "$LOG")
# the figures straight into $OUT (a call stopped at its limit still brings back the shapes measured), then kept in
# build/tpu for the next call's page
"${TPU_RUN[@]}" tools/tpu/session.py "$STAGE" --junit "$OUT/junit-$STAGE.xml" --bench "$SECTION" \
  --json "$OUT/bench-$STAGE.json" -- "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
[ -f "$OUT/bench-$STAGE.json" ] && cp "$OUT/bench-$STAGE.json" build/tpu/
runs=()
for s in core model; do [ -f "build/tpu/bench-$s.json" ] && runs+=("build/tpu/bench-$s.json"); done
if [ ${#runs[@]} -gt 0 ]; then
  if [ "$MODE" = 1 ]; then doc=docs/accelerators.md; else doc=build/tpu/accelerators.md; cp docs/accelerators.md "$doc"; fi
  "${TPU_PYTHON:-python3}" benchmarks/bench_tpu.py render --doc "$doc" "${runs[@]}" >> "$LOG" 2>&1 \
    && cp "$doc" "$OUT/accelerators.md"
fi
echo "[call $N] exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
exit "$rc"
