#!/bin/bash
# Issue 26 item 4, the H200 side: the device code of a host-mode DeepEP build from the lock's pins, by sha256, so the
# image's (the same record made from the deepep image's files) can be compared kernel by kernel
# (`python3 scripts/cubins.py compare results/images/cubins-h200-host.json results/images/cubins-image.json`).
#
#   bash scripts/device/cubins.sh
#
# Run from the repository root on the device (no network there), in ONE call, after the NCCL 2.30.4 wheel was seeded
# (scripts/device/seed_wheelhouse.sh: .cache/wheelhouse/; a last part carried as .cN with this call is joined first).
# Needs, carried (git-ignored), as scripts/device/micro_baseline.sh:
#   .carry/sources.tar   `reprostack bundle -o .carry/sources.tar deepep nccl nccl-tests` (verified sources)
#   .whl/*.whl           reprostack's own dependencies for the device's CPython
# What it does: one `reprostack gate micro --profile h200-ep1 --trials 1` in a FRESH cache (DeepEP built from the
# pins, sm_90a; its JIT kernels compiled in that build's own cache, kernels/jit/h200-ep1.json prewarmed), then
# `scripts/cubins.py record` over the cache's builds/: every `_C*.so` cubin (cuobjdump -xelf all, the toolkit's
# cuobjdump next to the nvcc the build used) and every JIT `kernel.<name>.<digest>/kernel.cubin`.
# Into $OUT: cubins-h200-host.json (commit as results/images/cubins-h200-host.json), cubins/ (the _C cubins themselves,
# for `scripts/cubins.py sass` against the image's), gpu.txt, micro.cli.log,
# buildlogs.tar (the DeepEP build log with its nvcc flags). Exit: the gate's exit code when no record was made, else 0.
set -u
R=$(pwd)
export REPROSTACK_CACHE=/tmp/reprostack-cubins-cache PYTHONUNBUFFERED=1
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi   # reports name this commit
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
D=out/cubins
rm -rf "$D" "$REPROSTACK_CACHE"
mkdir -p "$OUTD" "$D" "$REPROSTACK_CACHE"
ls .c[0-9]*/meta >/dev/null 2>&1 && { bash scripts/device/seed_wheelhouse.sh receive || exit 2; }
ls .cache/wheelhouse/nvidia_nccl_cu13-2.30.4-*.whl >/dev/null 2>&1 || { echo "no NCCL 2.30.4 wheel in .cache/wheelhouse: seed it first (scripts/device/seed_wheelhouse.sh)" >&2; exit 2; }
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar deepep nccl nccl-tests)" >&2; exit 2; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v '/reprostack-') || exit 1
export PYTHONPATH=$R/src:/tmp/site REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse
nvidia-smi --query-gpu=name,driver_version,compute_cap,uuid --format=csv,noheader | tee "$OUTD/gpu.txt"

timeout -k 10 400 "$PY" -m reprostack gate micro --profile h200-ep1 --trials 1 --offline \
  --bundle .carry/sources.tar --out "$D/run" --python "$PY" --timeout 240 > "$OUTD/micro.cli.log" 2>&1
rc=$?
echo "gate micro rc=$rc"
tail -3 "$OUTD/micro.cli.log"

NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
export CUOBJDUMP=${CUOBJDUMP:-$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")/cuobjdump}
echo "nvcc: ${NVCC:-none} ($("${NVCC:-nvcc}" --version 2>/dev/null | tail -1)); cuobjdump: $CUOBJDUMP"
"$PY" scripts/cubins.py record --label h200-host --keep "$OUTD/cubins" "$REPROSTACK_CACHE/builds" > "$OUTD/cubins-h200-host.json" || {
  echo "no cubin record made"; exit "$([ "$rc" -ne 0 ] && echo "$rc" || echo 1)"; }
"$PY" - "$OUTD/cubins-h200-host.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for so in r["shared_objects"]:
    print(f"{so['path']}: {len(so['cubins'])} cubin(s) {sorted({c['arch'] for c in so['cubins']})}, {len(so['ptx'])} ptx")
print(f"JIT kernels: {len(r['jit'])}")
EOF
mkdir -p "$D/buildlogs"
for b in "$REPROSTACK_CACHE"/builds/*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "$D/buildlogs/$(basename "$b").build.log"
done
tar -cf "$OUTD/buildlogs.tar" -C "$D" buildlogs
exit 0
