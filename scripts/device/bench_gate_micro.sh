#!/bin/bash
# issue 17 benchmark on the lent H200, in ONE call (<= 9 min): `reprostack bench gate_micro` (gate micro cold, in a
# fresh cache dir, then warm) and then the warm test's timeline (scripts/device/warm_timeline.py: where its seconds go,
# JIT cache warm vs empty).
#
# Run from the repository root on the device, after the NCCL wheel was seeded (scripts/device/seed_wheelhouse.sh:
# .cache/wheelhouse/ holds nvidia_nccl_cu13-2.30.4-...whl; a last part carried as .cN with this call is joined first).
# Needs, carried (git-ignored):
#   .carry/sources.tar   `reprostack bundle -o .carry/sources.tar deepep nccl` (verified sources)
#   .whl/*.whl           reprostack's own dependencies for the device's CPython (README: "A GPU node without internet")
# The wheelhouse is pre-seeded, not part of the cold figure (the output says so); everything else is: sources from the
# bundle into the fresh cache, NCCL from the wheel (sha256-checked, unpacked), DeepEP built, JIT, the test.
# The call sequence (one warm machine, consecutive calls; sizes: parts 60+60+60+23 MiB, sources.tar ~4 MB, .whl ~12 MB):
#   here:  reprostack bundle -o .carry/sources.tar deepep nccl; bash scripts/device/seed_wheelhouse.sh split
#   run(carry=[".c1"], command="bash scripts/device/seed_wheelhouse.sh receive")      -> "stored part 1/4 ..."
#   run(carry=[".c2"], command="bash scripts/device/seed_wheelhouse.sh receive")      -> "stored part 2/4 ..."
#   run(carry=[".c3"], command="bash scripts/device/seed_wheelhouse.sh receive")      -> "stored part 3/4 ..."
#   run(carry=[".c4", ".carry/sources.tar", ".whl"], timeout_s=600,
#       command="bash scripts/device/bench_gate_micro.sh")   -> "... joined from 4 parts, sha256 534dbf30...", then
#       the bench lines and "bench gate_micro: cold X s, warm Y s, verdict pass / pass (same)", then the timeline.
# BENCH_TIMELINE=0: no timeline (it re-runs the warm test twice, ~80 s).
# Honest figures (issue 27 item 4), two more calls on the same warm machine after the parts are stored, each with
# .carry/project-stamp.txt (`bash scripts/device/project_stamp.sh`: the commit the bench records):
#   run(carry=[".carry/sources.tar", ".whl", ".carry/project-stamp.txt"], timeout_s=600,
#       command="BENCH_TIMELINE=0 BENCH_TIMEOUT=560 BENCH_ARGS='--repeat 3' bash scripts/device/bench_gate_micro.sh")
#       -> every run in repeats, "bench gate_micro: n=3: cold median X s [min A, max B], warm median ...";
#          commit $OUT/gate_micro-h200.json as results/bench/gate_micro-h200-<date>-repeat3/gate_micro-h200.json
#   run(carry=[same], timeout_s=600,
#       command="BENCH_TIMELINE=0 BENCH_TIMEOUT=560 BENCH_ARGS='--from-nothing' bash scripts/device/bench_gate_micro.sh")
#       -> "bench gate_micro: from nothing X s (venv, install, gate)" beside the seeded cold run; commit it as
#          results/bench/gate_micro-h200-<date>-from-nothing/gate_micro-h200.json; then `nox -s docs`.
# Into $OUT: gate_micro-h200.json (commit as results/bench/gate_micro-h200.json), timeline.json, bench.log,
#   timeline.log, bench.tar (both runs' reports, raw logs and build logs).
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
mkdir -p "$OUTD"
T0=$(date +%s)
ls .c[0-9]*/meta >/dev/null 2>&1 && { bash scripts/device/seed_wheelhouse.sh receive || exit 2; }
ls .cache/wheelhouse/nvidia_nccl_cu13-*.whl >/dev/null 2>&1 || { echo "no NCCL wheel in .cache/wheelhouse: seed it first (scripts/device/seed_wheelhouse.sh)" >&2; exit 2; }
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar deepep nccl)" >&2; exit 2; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
WHEELS=$(ls .whl/*.whl | grep -v '/reprostack-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
export PYTHONPATH=$R/src:/tmp/site REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse:$R/.whl
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUTD/gpu.txt"
echo "ninja on PATH: $(command -v ninja || echo none); torch sees ninja: $("$PY" -c 'import torch.utils.cpp_extension as c; print(c.is_ninja_available())' 2>/dev/null)"

# shellcheck disable=SC2086  # BENCH_ARGS: bench's own options, word-split on purpose
timeout -k 10 "${BENCH_TIMEOUT:-420}" "$PY" -m reprostack bench gate_micro ${BENCH_ARGS:-} --host h200 --work out/bench -- --profile h200-ep1 \
  --offline --bundle .carry/sources.tar --python "$PY" 2>&1 | tee "$OUTD/bench.log"
rc=${PIPESTATUS[0]}
cp results/bench/gate_micro-h200.json "$OUTD/" 2>/dev/null
left=$(( 530 - ($(date +%s) - T0) ))
if [ "${BENCH_TIMELINE:-1}" = 1 ] && [ -f out/bench/gate_micro/warm/micro.json ] && [ "$left" -gt 60 ]; then
  timeout -k 5 "$left" "$PY" scripts/device/warm_timeline.py out/bench/gate_micro/warm 2>&1 | tee "$OUTD/timeline.log"
  cp out/bench/gate_micro/warm/timeline.json "$OUTD/" 2>/dev/null
else
  echo "timeline skipped (${left} s left, or no warm report)"
fi
mkdir -p out/bench/buildlogs
for b in out/bench/gate_micro/cache/builds/*/ out/bench/gate_micro/r*/cache/builds/*/ out/bench/gate_micro/nothing-cache/builds/*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "out/bench/buildlogs/$(basename "$b").build.log"
done
tar -cf "$OUTD/bench.tar" --exclude=cache --exclude=nothing-cache --exclude=nothing-venv -C out bench
echo "bench rc=$rc wall_s=$(( $(date +%s) - T0 ))"
exit $rc
