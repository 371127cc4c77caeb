#!/bin/bash
# Gate 1 at EP1 on the one lent H200 with the dense comparison arm (issue 7, the part one GPU can run):
#   reprostack gate micro --profile h200-ep1 --arm deepep,dense
# DeepEP's legacy test_intranode.py is NOT run: it cannot run at one rank (gates/micro.yaml: legacy.ep-sizes).
#
# Run from the repository root on the device (no network there). Needs, carried (git-ignored):
#   .carry/sources.tar         `reprostack bundle -o .carry/sources.tar` (verified sources of every pin)
#   .whl/*.whl                 reprostack's own dependencies (README: "A GPU node without internet")
#   .carry/nccl-build.tar.xz   optional: a prebuilt NCCL cache entry (`builds/nccl-<key>/`, same recipe, nvcc
#                              13.0, sm_90); without it NCCL is built here (~233 s on 16 cores, DeepEP ~90 s)
# Optional argument: test_ep watchdog seconds (default 180). Everything is bounded by `timeout` so the whole
# command ends inside ~9 minutes even with a cold NCCL build; what it wrote is in $OUT either way (jobs and
# arch are left to detection, as in the PASS run, so a carried NCCL build's cache key matches):
#   ep1-arms.tar (reports, raw logs, build logs), micro.json, summary.md, cli.log, dense_a2a.log, wall.txt
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache} PYTHONUNBUFFERED=1
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
D=out/ep1-arms
mkdir -p "$OUTD" "$D" "$REPROSTACK_CACHE/builds"
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar)" >&2; exit 2; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
if [ -f .carry/nccl-build.tar.xz ]; then
  tar -xJf .carry/nccl-build.tar.xz -C "$REPROSTACK_CACHE/builds" || exit 1
fi
WHEELS=$(ls .whl/*.whl | grep -v '/reprostack-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$D/gpu.txt"

t0=$(date +%s)
PYTHONPATH=$R/src:/tmp/site timeout -k 10 520 "$PY" -m reprostack gate micro --profile h200-ep1 \
  --arm deepep,dense --offline --bundle .carry/sources.tar --out "$D" --python "$PY" \
  --timeout "${1:-180}" > "$D/cli.log" 2>&1
rc=$?
echo "rc=$rc wall_s=$(( $(date +%s) - t0 ))" | tee "$D/wall.txt"

tail -4 "$D/cli.log"
grep -v "^Running NVCC" "$D/micro/test_ep.log" 2>/dev/null | tail -8
grep "^\[dense_a2a\]" "$D/micro/dense_a2a.log" 2>/dev/null || tail -20 "$D/micro/dense_a2a.log" 2>/dev/null
mkdir -p "$D/buildlogs"
for b in "$REPROSTACK_CACHE"/builds/*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "$D/buildlogs/$(basename "$b").build.log"
done
tar -cf "$OUTD/ep1-arms.tar" -C out ep1-arms
for f in micro.json summary.md cli.log wall.txt micro/dense_a2a.log; do
  [ -f "$D/$f" ] && cp "$D/$f" "$OUTD/$(basename "$f")"
done
exit $rc
