#!/bin/bash
# Gate 1 at EP1 on the one lent H200 with K trials of both arms, interleaved in one launch (issue 16 items 1, 2):
#   reprostack gate micro --profile h200-ep1 --arm deepep,dense --trials K
# The report to commit under results/gate_micro/<date>-h200-ep1-k5/ (micro.json with data.statistics,
# summary.md with the trials table, junit.xml, the raw log with every trial of both arms, build logs).
#
# Run from the repository root on the device (no network there), in ONE call (<= 9 min even cold):
#   bash scripts/device/micro_trials.sh [K] [WATCHDOG_S]        (defaults: K=5, test watchdog 300 s)
# Needs, carried (git-ignored), as for gate_micro_ep1_arms.sh:
#   .carry/sources.tar          `reprostack bundle -o .carry/sources.tar deepep nccl` (verified sources)
#   .whl/*.whl                  reprostack's own dependencies for the device's python (README: "A GPU node
#                               without internet")
#   optional kernel cache entries: .carry/nccl-build.tar.xz and/or .carry/builds/*.tar.xz (`builds/<name>-<key>/`,
#                               same recipe, nvcc 13.0, sm_90); without them NCCL (~200 s) and DeepEP (~80 s) build here
# Into $OUT: k-trials.tar (the whole report folder: reports, raw logs, build logs), micro.json, summary.md,
# junit.xml, summary.json, cli.log, test_ep.log, wall.txt, gpu.txt. It prints the result line, the trials table
# and the verdict of the bar. Exit: the gate's (0 PASS, 1 FAIL or INCONCLUSIVE, 2 operator error, 3 SKIP).
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
K=${1:-5}
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
D=out/k-trials
rm -rf "$D"
mkdir -p "$OUTD" "$D" "$REPROSTACK_CACHE/builds"
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar deepep nccl)" >&2; exit 2; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
for t in .carry/nccl-build.tar.xz .carry/builds/*.tar.xz; do
  [ -f "$t" ] && { tar -xJf "$t" -C "$REPROSTACK_CACHE/builds" || exit 1; }
done
WHEELS=$(ls .whl/*.whl | grep -v '/reprostack-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$D/gpu.txt"

t0=$(date +%s)
PYTHONPATH=$R/src:/tmp/site timeout -k 10 520 "$PY" -m reprostack gate micro --profile h200-ep1 \
  --arm deepep,dense --trials "$K" --offline --bundle .carry/sources.tar --out "$D" --python "$PY" \
  --timeout "${2:-300}" > "$D/cli.log" 2>&1
rc=$?
echo "K=$K rc=$rc wall_s=$(( $(date +%s) - t0 ))" | tee "$D/wall.txt"

tail -3 "$D/cli.log"
grep -v "^Running NVCC" "$D/micro/test_ep.log" 2>/dev/null | grep -E "^\[micro_trials\].*done|EP: +0/|^\[dense_a2a\].*dispatch\"" | tail -8
sed -n '/^| micro /p;/^### trials/,/^### measurements/p' "$D/summary.md" 2>/dev/null | grep "^|"
grep -o '"reason": "[^"]*"' "$D/micro.json" 2>/dev/null | head -1
mkdir -p "$D/buildlogs"
for b in "$REPROSTACK_CACHE"/builds/*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "$D/buildlogs/$(basename "$b").build.log"
done
tar -cf "$OUTD/k-trials.tar" -C out k-trials
for f in micro.json summary.md summary.json junit.xml cli.log wall.txt gpu.txt micro/test_ep.log; do
  [ -f "$D/$f" ] && cp "$D/$f" "$OUTD/$(basename "$f")"
done
exit $rc
