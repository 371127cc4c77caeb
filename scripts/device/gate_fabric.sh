#!/bin/bash
# Gate 0 (fabric) on one lent GPU (H100 or H200; issue 24 item 5, issue 37): nccl-tests v2.19.6 built here from the
# carried source against the pinned NCCL 2.30.4 wheel, all_reduce_perf and alltoall_perf at one GPU (-g 1,
# -N 5 cycles of 8 B .. 1 GiB, -c 1) with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET; the raw logs, the checks and
# the figures into $OUT. One GPU moves no byte over a network: the run proves the build, the pinned NCCL (nccl-tests
# prints nccl-library=23004), the parser, the report on real output, and the local copy's algbw at 1 GiB against
# the profile's measured bar; until 3 accepted runs of this GPU model are committed the result is FAIL "no measured
# bar yet; numbers reported" when everything else passed (exit 1), never PASS.
#
# It runs the registered gate: `reprostack gate fabric --profile h200-ep1|h100-ep1` (gates.fabric.FabricGate).
#
# Run from the repository root on the device (no network there), after the NCCL wheel was seeded
# (scripts/device/seed_wheelhouse.sh: .cache/wheelhouse/ holds nvidia_nccl_cu13-2.30.4-...whl; a last part carried as
# .cN with this call is joined first). Needs, carried (git-ignored):
#   .carry/sources.tar   `reprostack bundle -o .carry/sources.tar nccl nccl-tests` (~1.9 MB: the nccl tree is read for
#                        its version.mk, the wheel of that release is what is used; nccl-tests is built)
#   .whl/*.whl           reprostack's own dependencies for the device's CPython (README: "A GPU node without internet")
#   .carry/signing-key.pem  optional: REPROSTACK_SIGNING_KEY=$PWD/.carry/signing-key.pem signs each run folder
#                        (its cli.log and wall.txt after the gate: `reprostack attest`), so it commits as it is
# The call sequence (one warm machine, consecutive calls; parts 60+60+60+23 MiB):
#   here:  reprostack bundle -o .carry/sources.tar nccl nccl-tests; bash scripts/device/seed_wheelhouse.sh split
#   run(carry=[".c1"], command="bash scripts/device/seed_wheelhouse.sh receive")
#   run(carry=[".c2"], command="bash scripts/device/seed_wheelhouse.sh receive")
#   ... one call per part up to .c5 (seed_wheelhouse.sh split makes 6 parts of 36 MiB)
#   run(carry=[".c6", ".carry/sources.tar", ".whl"], timeout_s=600, command="bash scripts/device/gate_fabric.sh")
# Time: the nccl-tests build (4 .cu files + verifiable.cu, sm_90 only) took 198 s on 2 cores here; expect about a
# minute on the H200's 16; the tests themselves seconds at one GPU. Everything is under `timeout` (540 s).
# The profile is this GPU model's one-GPU profile (h100-ep1 or h200-ep1; FABRIC_PROFILE overrides), run FABRIC_RUNS
# times (default 3): the runs its measured bar is made of (gates/fabric.yaml: baseline, runs-from).
# Into $OUT: baseline/<profile>/<date>-<gpu>-run<i>/ per run (fabric.json: the gate report with checks, figures,
# statistics, transports per rank, host; summary.md, cli.log, fabric/all_reduce.log and fabric/alltoall.log, the raw
# output): commit each run folder under results/gate_fabric/baseline/<profile>/; buildlogs/, wall.txt, gpu.txt,
# fabric.tar (all of it).
# Exit: the worst of the runs' (0 PASS, 1 FAIL or ERROR or unmeasured, 2 operator error, 3 SKIP).
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache}
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
PROFILE=${FABRIC_PROFILE:-}
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
# the profile of this GPU model (its bar is made of that model's runs only): H100 -> h100-ep1, H200 -> h200-ep1
if [ -z "${FABRIC_PROFILE:-}" ]; then
  case "$(head -1 "$D/gpu.txt")" in
    *H100*) PROFILE=h100-ep1 ;;
    *H200*) PROFILE=h200-ep1 ;;
    *) echo "no one-GPU fabric profile for $(head -1 "$D/gpu.txt"): set FABRIC_PROFILE" >&2; exit 2 ;;
  esac
fi
# FABRIC_RUNS runs (default 3, the bar's min-runs), each a whole gate run of -N 5 cycles into its own folder
# $OUT/baseline/$PROFILE/<UTC date>-<GPU>-run<i>/ (fabric.json, summary.md, cli.log, fabric/*.log): commit each such
# folder under results/gate_fabric/baseline/$PROFILE/, the folder gates/fabric.yaml's baseline bar reads (its
# median of the accepted runs x 0.9). The first runs of a profile FAIL on bars_status alone (accepted); a run that
# fails anything else is never taken into a bar.
RUNS=${FABRIC_RUNS:-3}
STAMP=$(date -u +%Y-%m-%d)
GPU=$(echo "$PROFILE" | cut -d- -f1)
rc=0
for i in $(seq 1 "$RUNS"); do
  RD="$D/baseline/$PROFILE/$STAMP-$GPU-run$i"
  mkdir -p "$RD"
  cp "$D/gpu.txt" "$RD/"
  timeout -k 10 540 "$PY" -m reprostack gate fabric --profile "$PROFILE" --offline --bundle .carry/sources.tar \
    --out "$RD" --python "$PY" > "$RD/cli.log" 2>&1
  r=$?
  echo "profile=$PROFILE run=$i rc=$r wall_s=$(( $(date +%s) - T0 ))" | tee -a "$D/wall.txt" | tee "$RD/wall.txt"
  # signed (REPROSTACK_SIGNING_KEY): the gate signed the folder as it ended; what was written after it (cli.log, the
  # console transcript, and wall.txt) is signed now, as attested_micro.sh does, so the folder commits as it is
  if [ -f "$RD/run.intoto.jsonl" ] && [ -n "${REPROSTACK_SIGNING_KEY:-}" ]; then
    "$PY" -m reprostack attest "$RD" || rc=2
  fi
  grep -v "^ *[0-9.]* *Compiling" "$RD/cli.log" | tail -12
  for t in all_reduce alltoall; do
    f=$(ls "$RD"/fabric/$t.log 2>/dev/null | head -1)
    [ -n "$f" ] && { echo "--- run $i $t: $(grep -c . "$f") lines; header, last rows, footer:"; grep -E "^# (nccl-tests|nThread)|^#  Rank" "$f"; grep -E "^ +[0-9]+ " "$f" | tail -2; grep -E "^# (Out of bounds|Avg bus)" "$f"; }
  done
  [ "$r" -gt "$rc" ] && rc=$r
done
mkdir -p "$D/buildlogs"
for b in "$REPROSTACK_CACHE"/builds/nccl*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "$D/buildlogs/$(basename "$b").build.log"
done
tar -cf "$OUTD/fabric.tar" -C out fabric
cp -r "$D/baseline" "$OUTD/" 2>/dev/null
for f in wall.txt gpu.txt; do
  [ -f "$D/$f" ] && cp "$D/$f" "$OUTD/"
done
cp -r "$D/buildlogs" "$OUTD/" 2>/dev/null
exit $rc
