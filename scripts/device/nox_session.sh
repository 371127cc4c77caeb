#!/bin/bash
# Run one nox session of the README on the lent H200 the way an operator without network would
# (README: "A GPU node without internet"), and send back what it wrote:
#   bash scripts/device/nox_session.sh SESSION [-- ARGS...]     e.g. gate_micro, all_gates
#
# Run from the repository root on the device. Needs, carried (git-ignored):
#   .carry/sources.tar     `reprostack bundle -o .carry/sources.tar deepep nccl megatron-lm nemo-rl` (verified sources)
#   .whl/*.whl             nox, setuptools and reprostack's dependencies for the device's CPython (3.12)
#   .carry/builds/*.tar.xz optional: kernel cache entries (`builds/<name>-<key>/`) from an earlier call; their keys
#                          are (patched tree, recipe, nvcc, torch, python, arch, flags): a stale one is just unused
# The kernel cache is .cache/device (ignored, kept between calls while the machine stays warm).
# Into $OUT: session.log, wall.txt, gpu.txt, reports.tar (out/<session>/latest: this run's reports + raw logs), builds.tar
# (kernel build logs) and, with SAVE_BUILDS=1, each built kernel entry as <name>-<key>.tar.xz (<= 16 MiB each).
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
S=${1:?session}; shift
[ "${1:-}" = "--" ] && shift
export REPROSTACK_CACHE=$R/.cache/device PYTHONUNBUFFERED=1 REPROSTACK_WHEELHOUSE=$R/.whl
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
OUTD=${OUT:-$R/out/device}
mkdir -p "$OUTD" "$REPROSTACK_CACHE/builds"
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar" >&2; exit 2; }
for t in .carry/builds/*.tar.xz; do [ -f "$t" ] && tar -xJf "$t" -C "$REPROSTACK_CACHE/builds"; done
# nox and this project with its dependencies (noxfile.py imports the gate registry to make a session per gate)
python3 -m pip install -q --no-index --no-compile --target /tmp/nox-site --find-links .whl nox==2026.10.20 . || exit 1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUTD/gpu.txt"
rm -rf "out/$S"
t0=$(date +%s)
PYTHONPATH=/tmp/nox-site timeout -k 10 "${SESSION_TIMEOUT:-560}" python3 -m nox -s "$S" -- --offline \
  --bundle .carry/sources.tar "$@" > "$OUTD/session.log" 2>&1
rc=$?
echo "session=$S rc=$rc wall_s=$(( $(date +%s) - t0 ))" | tee "$OUTD/wall.txt"
grep -v "^Running NVCC" "$OUTD/session.log" | tail -25
mkdir -p out/buildlogs
for b in "$REPROSTACK_CACHE"/builds/*/; do
  n=$(basename "$b"); [ -f "$b/build.log" ] && cp "$b/build.log" "out/buildlogs/$n.build.log"
  if [ "${SAVE_BUILDS:-0}" = 1 ] && [ -f "$b/build.log" ]; then
    tar -cJf "$OUTD/$n.tar.xz" -C "$REPROSTACK_CACHE/builds" "$n"; ls -la "$OUTD/$n.tar.xz"
  fi
done
[ -d "out/$S/latest" ] && tar -chf "$OUTD/reports.tar" -C "out/$S" latest   # -h: the run folder itself
tar -cf "$OUTD/builds.tar" -C out buildlogs
exit $rc
