#!/usr/bin/env bash
# One device call of the TPU session (docs/tpu.md, "The device window"): install a stage, then its tests and its
# benchmark section in one process (tools/tpu/session.py), then docs/tpu.md's measured section from every section
# measured on this machine so far. Everything goes to $OUT as it comes (build/tpu/call-N without one).
#   1  carry build/tpu-parts/part-1: core stage (kernel, rpa_xla, MaxText's layers, the tiny decode) + bench kernel
#   2  carry build/tpu-parts/part-2: model stage (SmolLM2 paged and dense, vllm.LLM) + bench model, then the page;
#      it installs both stages (the core one is up to date after call 1), so on a machine that went cold it stops
#      at once naming part-1 (exit 3), and the same command carrying part-1 then finds both parts there
# usage: tools/tpu/call.sh 1|2 [pytest args ...]     env: as run.sh (MAXTEXT_COMPAT_TPU=dry rehearses it on CPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  1) STAGE=core INSTALL=core SECTION=kernel ;;
  2) STAGE=model INSTALL=all SECTION=model ;;
  *) echo "usage: tools/tpu/call.sh 1|2" >&2; exit 2 ;;
esac
N=$1; shift
export OUT=${OUT:-build/tpu/call-$N}
mkdir -p "$OUT" build/tpu
LOG=$OUT/call-$N.log
export TPU_RESULTS=$OUT/results-$STAGE
t0=$(date +%s)
echo "[call $N] $(date -u '+%F %T') UTC: stage $STAGE, bench $SECTION, mode ${MAXTEXT_COMPAT_TPU:-1}" | tee "$LOG"
tools/tpu/install.sh "$INSTALL" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "[call $N] install failed after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"; exit 3; }
# shellcheck source=tools/tpu/env.sh
source tools/tpu/env.sh > >(tee -a "$LOG")
"${TPU_RUN[@]}" tools/tpu/session.py "$STAGE" --junit "$OUT/junit-$STAGE.xml" --bench "$SECTION" \
  --json "build/tpu/bench-$SECTION.json" -- "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
[ -f "build/tpu/bench-$SECTION.json" ] && cp "build/tpu/bench-$SECTION.json" "$OUT/"
runs=()
for s in kernel model; do [ -f "build/tpu/bench-$s.json" ] && runs+=("build/tpu/bench-$s.json"); done
if [ ${#runs[@]} -gt 0 ]; then
  if [ "${MAXTEXT_COMPAT_TPU:-1}" = dry ]; then doc=build/tpu/tpu.md; cp docs/tpu.md "$doc"; else doc=docs/tpu.md; fi
  "${TPU_PYTHON:-python3}" benchmarks/bench_tpu.py render --doc "$doc" "${runs[@]}" >> "$LOG" 2>&1 && cp "$doc" "$OUT/tpu.md"
fi
echo "[call $N] exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
exit "$rc"
