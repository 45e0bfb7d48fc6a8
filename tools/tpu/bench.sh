#!/usr/bin/env bash
# make bench-accel (make bench-tpu): install the tier (tools/tpu/install.sh) and measure benchmarks/bench_tpu.py's
# figures in one process, then render them into docs/accelerators.md's measured section. MAXTEXT_COMPAT_ACCEL=1 on a
# TPU or GPU (the default), =dry or dry-gpu on a CPU: the rehearsals, rendered into build/tpu/accelerators.md (a copy
# of the page, labelled a CPU dry run), never into docs/.
# usage: tools/tpu/bench.sh [kernel|step|model|all|kernel,step]   (kernel and step need the core stage, model both)
# Writes to $OUT when set (a device call's output folder), else build/tpu: bench-NAME.json, bench-NAME.log (NAME: the
# sections joined by -) and accelerators.md; the JSON is kept in build/tpu too, so a later call renders every
# section measured so far.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECTION=${1:-all}
NAME=${SECTION//,/-}
case ,$SECTION, in
  *,model,* | ,all,) STAGE=all ;;
  *) STAGE=core ;;
esac
DEST=${OUT:-build/tpu}
mkdir -p "$DEST" build/tpu
LOG=$DEST/bench-$NAME.log
tools/tpu/install.sh "$STAGE" 2>&1 | tee "$LOG"
# shellcheck source=tools/tpu/env.sh
source tools/tpu/env.sh > >(tee -a "$LOG")
"${TPU_RUN[@]}" benchmarks/bench_tpu.py "$SECTION" --json "build/tpu/bench-$NAME.json" 2>&1 | tee -a "$LOG"
[ "$DEST" = build/tpu ] || cp "build/tpu/bench-$NAME.json" "$DEST/"
# What this run measured, rendered alone (a mix of runs in this folder may mix dry and accelerator figures).
if [ "$MAXTEXT_COMPAT_ACCEL" = 1 ]; then doc=docs/accelerators.md
else doc=build/tpu/accelerators.md; cp docs/accelerators.md "$doc"; fi
"${TPU_PYTHON:-python3}" benchmarks/bench_tpu.py render --doc "$doc" "build/tpu/bench-$NAME.json" | tee -a "$LOG"
[ "$DEST" = build/tpu ] || cp "$doc" "$DEST/accelerators.md"
echo "[bench-accel] $SECTION: $doc" | tee -a "$LOG"
