#!/bin/bash
# The one-NCCL check against an older NCCL shadowing the pinned one, on the lent H200 (issue 29 item 1):
# `LD_PRELOAD` of the torch venv's own NCCL (nvidia-nccl-cu13 2.28.9) made gate micro end in
# `ERROR python_exception: ImportError ... undefined symbol: ncclCommQueryProperties`. Now:
#   A. the gate with that LD_PRELOAD: ERROR `one-NCCL preflight: the environment would load another NCCL than the
#      pinned one (nothing was started): LD_PRELOAD loads <torch's libnccl.so.2> (NCCL 2.28.9, LD_PRELOAD, the file
#      of wheel nvidia_nccl_cu13 2.28.9) ahead of the pinned NCCL 2.30.4 ...`, before any build, exit 1, no test log;
#   B. the record a measured process leaves when the preflight is not in the way (the trials driver's own reader,
#      src/reprostack/launch/procmaps.py, in a process that imported torch with that LD_PRELOAD): which NCCL it
#      mapped, its version from its bytes and how it got there;
#   C. the same gate without LD_PRELOAD (the control): PASS or FAIL on its bar, never an ERROR of the one-NCCL check.
#
# Run from the repository root on the device (no network there), in ONE call (cold <= 5 min: C builds the kernels;
# with the kernel cache entries carried, ~1 min):
#   bash scripts/device/shadow_nccl.sh [K]        (default K=1 trial for C; A and B run nothing timed)
# Needs, carried (git-ignored), as for micro_trials.sh:
#   .carry/sources.tar          `reprostack bundle -o .carry/sources.tar deepep nccl` (verified sources)
#   .whl/*.whl                  reprostack's own dependencies for the device's python
#   optional: .carry/nccl-build.tar.xz and/or .carry/builds/*.tar.xz (kernel cache entries: C then builds nothing);
#   REPROSTACK_CACHE=<the cache of an earlier call on the same warm machine> (cubins.sh's) does the same
# Into $OUT: shadow.txt (what A, B and C printed, their exit codes), a-cli.log, a-micro.json, b-record.json,
# c-cli.log, c-micro.json, gpu.txt. Exit 0 when A is the preflight ERROR naming 2.28.9 and LD_PRELOAD, B's record
# names the 2.28.9 file and LD_PRELOAD, and C is not a one-NCCL ERROR; else 1.
set -u
R=$(pwd)
K=${1:-1}
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache} PYTHONUNBUFFERED=1
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi   # reports name this commit
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
D=out/shadow
rm -rf "$D"
mkdir -p "$OUTD" "$D" "$REPROSTACK_CACHE/builds"
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar deepep nccl)" >&2; exit 2; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
for t in .carry/nccl-build.tar.xz .carry/builds/*.tar.xz; do
  [ -f "$t" ] && { tar -xJf "$t" -C "$REPROSTACK_CACHE/builds" || exit 1; }
done
WHEELS=$(ls .whl/*.whl | grep -v '/reprostack-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
# the NCCL 2.30.4 wheel, when seeded (scripts/device/seed_wheelhouse.sh): C then takes the wheel fast path, no NCCL build
ls .cache/wheelhouse/nvidia_nccl_cu13-2.30.4-*.whl >/dev/null 2>&1 && export REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$OUTD/gpu.txt"

# torch's own NCCL: the nvidia-nccl wheel of the torch venv (2.28.9 on the lent H200)
TORCH_NCCL=$("$PY" -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))")
[ -f "$TORCH_NCCL" ] || { echo "no torch NCCL at '$TORCH_NCCL'" >&2; exit 2; }
{ echo "torch's NCCL: $TORCH_NCCL"; grep -a -o -m1 "NCCL version [0-9.]*+cuda[0-9.]*" "$TORCH_NCCL"; } | tee "$D/shadow.txt"
GATE=(-m reprostack gate micro --profile h200-ep1 --trials "$K" --offline --bundle .carry/sources.tar --python "$PY")

echo "== A: LD_PRELOAD=$TORCH_NCCL reprostack gate micro" | tee -a "$D/shadow.txt"
t0=$(date +%s)
LD_PRELOAD=$TORCH_NCCL PYTHONPATH=$R/src:/tmp/site timeout -k 10 300 "$PY" "${GATE[@]}" --out "$D/a" > "$D/a-cli.log" 2>&1
ra=$?
echo "A: rc=$ra wall_s=$(( $(date +%s) - t0 )) test_ep.log: $([ -f "$D/a/micro/test_ep.log" ] && echo present || echo absent)" | tee -a "$D/shadow.txt"
grep -o '"reason": "[^"]*"' "$D/a/micro.json" 2>/dev/null | head -1 | tee -a "$D/shadow.txt"

echo "== B: the maps record of a process that imported torch with that LD_PRELOAD" | tee -a "$D/shadow.txt"
LD_PRELOAD=$TORCH_NCCL "$PY" - "$R/src/reprostack/launch/procmaps.py" > "$D/b-record.json" 2>> "$D/shadow.txt" <<'EOF'
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("procmaps", sys.argv[1])
procmaps = importlib.util.module_from_spec(spec); spec.loader.exec_module(procmaps)
import torch, torch.distributed  # noqa: F401  (torch maps its NCCL)
print(json.dumps(procmaps.record(), indent=1, sort_keys=True))
EOF
rb=$?
echo "B: rc=$rb" | tee -a "$D/shadow.txt"
cat "$D/b-record.json" | tee -a "$D/shadow.txt"

echo "== C: the same gate without LD_PRELOAD (control)" | tee -a "$D/shadow.txt"
t0=$(date +%s)
PYTHONPATH=$R/src:/tmp/site timeout -k 10 500 "$PY" "${GATE[@]}" --out "$D/c" > "$D/c-cli.log" 2>&1
rc=$?
echo "C: rc=$rc wall_s=$(( $(date +%s) - t0 ))" | tee -a "$D/shadow.txt"
grep -o '"reason": "[^"]*"' "$D/c/micro.json" 2>/dev/null | head -1 | tee -a "$D/shadow.txt"

cp "$D/shadow.txt" "$D/a-cli.log" "$D/c-cli.log" "$D/b-record.json" "$OUTD/" 2>/dev/null
[ -f "$D/a/micro.json" ] && cp "$D/a/micro.json" "$OUTD/a-micro.json"
[ -f "$D/c/micro.json" ] && cp "$D/c/micro.json" "$OUTD/c-micro.json"
ok=1
grep -q '"reason": "one-NCCL preflight: .*LD_PRELOAD loads .*NCCL 2\.28\.9' "$D/a/micro.json" 2>/dev/null || ok=0
[ -f "$D/a/micro/test_ep.log" ] && ok=0
grep -q '"2\.28\.9"' "$D/b-record.json" && grep -q 'LD_PRELOAD' "$D/b-record.json" || ok=0
grep -q '"reason": "one-NCCL' "$D/c/micro.json" 2>/dev/null && ok=0
[ -f "$D/c/micro.json" ] || ok=0
echo "shadow_nccl: $([ $ok = 1 ] && echo as expected || echo NOT as expected)" | tee -a "$OUTD/shadow.txt"
[ $ok = 1 ]
