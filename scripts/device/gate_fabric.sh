#!/bin/bash
# Gate 0 (fabric) on the one lent H200 (issue 24 item 5): nccl-tests v2.19.6 built here from the carried source
# against the pinned NCCL 2.30.4 wheel, all_reduce_perf and alltoall_perf at one GPU (profile h200-ep1: -g 1,
# -N 5 cycles of 8 B .. 1 GiB, -c 1) with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET; the raw logs, the checks and
# the figures into $OUT. One GPU moves no byte over a network: the run proves the build, the pinned NCCL (nccl-tests
# prints nccl-library=23004), the parser and the report on real output; h200-ep1's bars are unmeasured, so the
# result is FAIL "no measured bar yet; numbers reported" when everything else passed (exit 1), never PASS.
#
# It runs the registered gate: `reprostack gate fabric --profile h200-ep1` (gates.fabric.FabricGate).
#
# Run from the repository root on the device (no network there), after the NCCL wheel was seeded
# (scripts/device/seed_wheelhouse.sh: .cache/wheelhouse/ holds nvidia_nccl_cu13-2.30.4-...whl; a last part carried as
# .cN with this call is joined first). Needs, carried (git-ignored):
#   .carry/sources.tar   `reprostack bundle -o .carry/sources.tar nccl nccl-tests` (~1.9 MB: the nccl tree is read for
#                        its version.mk, the wheel of that release is what is used; nccl-tests is built)
#   .whl/*.whl           reprostack's own dependencies for the device's CPython (README: "A GPU node without internet")
# The call sequence (one warm machine, consecutive calls; parts 60+60+60+23 MiB):
#   here:  reprostack bundle -o .carry/sources.tar nccl nccl-tests; bash scripts/device/seed_wheelhouse.sh split
#   run(carry=[".c1"], command="bash scripts/device/seed_wheelhouse.sh receive")
#   run(carry=[".c2"], command="bash scripts/device/seed_wheelhouse.sh receive")
#   run(carry=[".c3"], command="bash scripts/device/seed_wheelhouse.sh receive")
#   run(carry=[".c4", ".carry/sources.tar", ".whl"], timeout_s=600, command="bash scripts/device/gate_fabric.sh")
# Time: the nccl-tests build (4 .cu files + verifiable.cu, sm_90 only) took 198 s on 2 cores here; expect about a
# minute on the H200's 16; the tests themselves seconds at one GPU. Everything is under `timeout` (540 s).
# Into $OUT: fabric.json (the gate report: checks, figures, transports per rank, kernels, host), summary.md,
# logs/all_reduce.log and logs/alltoall.log (the raw output: commit as tests/fixtures/nccl-tests/real/h200-ep1-*.log with an .expect.json, and
# under results/gate_fabric/), buildlogs/, cli.log, wall.txt, gpu.txt, fabric.tar (all of it).
# Exit: the gate's (0 PASS, 1 FAIL or ERROR or unmeasured, 2 operator error, 3 SKIP).
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache}
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
PROFILE=${FABRIC_PROFILE:-h200-ep1}
OUTD=${OUT:-$R/out/device}
D=out/fabric
rm -rf "$D"
mkdir -p "$OUTD" "$D" "$REPROSTACK_CACHE"
T0=$(date +%s)
ls .c[0-9]*/meta >/dev/null 2>&1 && { bash scripts/device/seed_wheelhouse.sh receive || exit 2; }
ls .cache/wheelhouse/nvidia_nccl_cu13-2.30.4-*.whl >/dev/null 2>&1 || { echo "no NCCL 2.30.4 wheel in .cache/wheelhouse: seed it first (scripts/device/seed_wheelhouse.sh)" >&2; exit 2; }
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar nccl nccl-tests)" >&2; exit 2; }
if ls .whl/*.whl >/dev/null 2>&1; then
  WHEELS=$(ls .whl/*.whl | grep -v '/reprostack-')
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
elif ! PYTHONPATH=$R/src "$PY" -c "import reprostack.gates.fabric" 2>/dev/null; then
  echo "missing .whl/*.whl (reprostack's dependencies) and $PY cannot import reprostack without them" >&2; exit 2
fi
export PYTHONPATH=$R/src:/tmp/site REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse:$R/.whl
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1 | tee "$D/gpu.txt"
command -v nvcc >/dev/null && nvcc --version | tail -2 | tee -a "$D/gpu.txt"

timeout -k 10 540 "$PY" -m reprostack gate fabric --profile "$PROFILE" --offline --bundle .carry/sources.tar \
  --out "$D" --python "$PY" > "$D/cli.log" 2>&1
rc=$?
echo "profile=$PROFILE rc=$rc wall_s=$(( $(date +%s) - T0 ))" | tee "$D/wall.txt"
cat "$D/cli.log" | grep -v "^ *[0-9.]* *Compiling" | tail -40
for t in all_reduce alltoall; do
  f=$(ls "$D"/fabric/$t.log 2>/dev/null | head -1)
  [ -n "$f" ] && { echo "--- $t: $(grep -c . "$f") lines; header, last rows, footer:"; grep -E "^# (nccl-tests|nThread)|^#  Rank" "$f"; grep -E "^ +[0-9]+ " "$f" | tail -3; grep -E "^# (Out of bounds|Avg bus)" "$f"; grep -E "NCCL INFO (NET/|Using network|.*Init COMPLETE)" "$f" | head -6; }
done
mkdir -p "$D/buildlogs"
for b in "$REPROSTACK_CACHE"/builds/nccl*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "$D/buildlogs/$(basename "$b").build.log"
done
tar -cf "$OUTD/fabric.tar" -C out fabric
cp -r "$D/fabric" "$OUTD/logs" 2>/dev/null
for f in fabric.json summary.md cli.log wall.txt gpu.txt; do
  [ -f "$D/$f" ] && cp "$D/$f" "$OUTD/"
done
cp -r "$D/buildlogs" "$OUTD/" 2>/dev/null
exit $rc
