#!/usr/bin/env bash
# make bench-tpu: install the tier (tools/tpu/install.sh) and measure benchmarks/bench_tpu.py's figures in one
# process, then render them into docs/tpu.md's measured section. MAXTEXT_COMPAT_TPU=1 on a TPU (the default), =dry
# on a CPU: the rehearsal, rendered into build/tpu/tpu.md (a copy of the page, labelled a CPU dry run), never into
# docs/tpu.md.
# usage: tools/tpu/bench.sh [kernel|model|all]   (kernel needs the core stage, model and all both stages)
# Writes to $OUT when set (a device call's output folder), else build/tpu: bench-SECTION.json, bench-SECTION.log,
# and tpu.md; the JSON is kept in build/tpu too, so a later call renders every section measured so far.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECTION=${1:-all}
case $SECTION in kernel) STAGE=core ;; model | all) STAGE=all ;; *) echo "[bench-tpu] unknown section '$SECTION'" >&2; exit 2 ;; esac
DEST=${OUT:-build/tpu}
mkdir -p "$DEST" build/tpu
LOG=$DEST/bench-$SECTION.log
tools/tpu/install.sh "$STAGE" 2>&1 | tee "$LOG"
# shellcheck source=tools/tpu/env.sh
source tools/tpu/env.sh > >(tee -a "$LOG")
"${TPU_RUN[@]}" benchmarks/bench_tpu.py "$SECTION" --json "build/tpu/bench-$SECTION.json" 2>&1 | tee -a "$LOG"
[ "$DEST" = build/tpu ] || cp "build/tpu/bench-$SECTION.json" "$DEST/"
# Every section measured in this mode so far (the kernel in one call, the model in the next), newest of each.
runs=()
if [ "$SECTION" = all ]; then runs=(build/tpu/bench-all.json)
else for s in kernel model; do [ -f "build/tpu/bench-$s.json" ] && runs+=("build/tpu/bench-$s.json"); done; fi
if [ "$MAXTEXT_COMPAT_TPU" = dry ]; then doc=build/tpu/tpu.md; cp docs/tpu.md "$doc"; else doc=docs/tpu.md; fi
"${TPU_PYTHON:-python3}" benchmarks/bench_tpu.py render --doc "$doc" "${runs[@]}" | tee -a "$LOG"
[ "$DEST" = build/tpu ] || cp "$doc" "$DEST/tpu.md"
echo "[bench-tpu] $SECTION: $doc" | tee -a "$LOG"
