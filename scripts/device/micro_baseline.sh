#!/bin/bash
# Gate 1 against its baseline bar on the one lent H200 (issue 27 item 1): the h200-ep1 D+C bar is the median of the
# accepted K=5 runs x 1.07 (gates/micro.yaml, reprostack.evidence.bars.baseline); a normal run must clear it and a
# deliberately slowed one (DeepEP given fewer SMs: `--num-sms K`, which the report names) must not pass it.
#
#   bash scripts/device/micro_baseline.sh [SMS...]       (default: 64 16; each a slowed run after the normal one)
#
# Run from the repository root on the device (no network there), in ONE call, after the NCCL 2.30.4 wheel was seeded
# (scripts/device/seed_wheelhouse.sh: .cache/wheelhouse/; a last part carried as .cN with this call is joined first).
# Needs, carried (git-ignored):
#   .carry/sources.tar   `reprostack bundle -o .carry/sources.tar deepep nccl nccl-tests` (verified sources)
#   .whl/*.whl           reprostack's own dependencies for the device's CPython
# Every run: `reprostack gate micro --profile h200-ep1 --trials 5` (the slowed ones add `--num-sms K`), each into its
# own folder out/baseline/<name>/; DeepEP is built once (keyed) and reused. Into $OUT: baseline.tar (the whole
# folder: reports, raw logs, build logs), runs.txt (one line per run: name, exit, verdict, D+C mean and interval, the
# bar), gpu.txt. Exit 0 when the normal run passed and every slowed run ended FAIL or INCONCLUSIVE; else 1.
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
D=out/baseline
SMS=${*:-64 16}
rm -rf "$D"
mkdir -p "$OUTD" "$D" "$REPROSTACK_CACHE"
ls .c[0-9]*/meta >/dev/null 2>&1 && { bash scripts/device/seed_wheelhouse.sh receive || exit 2; }
ls .cache/wheelhouse/nvidia_nccl_cu13-2.30.4-*.whl >/dev/null 2>&1 || { echo "no NCCL 2.30.4 wheel in .cache/wheelhouse: seed it first (scripts/device/seed_wheelhouse.sh)" >&2; exit 2; }
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar deepep nccl nccl-tests)" >&2; exit 2; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $(ls .whl/*.whl | grep -v '/reprostack-') || exit 1
export PYTHONPATH=$R/src:/tmp/site REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse
nvidia-smi --query-gpu=name,driver_version,compute_cap,uuid --format=csv,noheader | tee "$D/gpu.txt"

run() {  # run NAME [GATE OPTIONS...]
  name=$1; shift
  t0=$(date +%s)
  timeout -k 10 280 "$PY" -m reprostack gate micro --profile h200-ep1 --trials 5 --offline \
    --bundle .carry/sources.tar --out "$D/$name" --python "$PY" --timeout 240 "$@" > "$D/$name.cli.log" 2>&1
  rc=$?
  line=$("$PY" - "$D/$name/micro.json" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except OSError as e:
    print(f"no report ({e.strerror})"); sys.exit()
s = d.get("data", {}).get("statistics", {}).get("dc_p50_us") or {}
bar = next((c for c in d.get("checks", []) if c["metric"] == "dc_p50_us"), {})
print(f"{d['result']} D+C {s.get('mean')} {s.get('ci95')} bar {bar.get('op')} {bar.get('threshold')} | {d['reason'][:160]}")
EOF
)
  echo "$name rc=$rc wall_s=$(( $(date +%s) - t0 )) $line" | tee -a "$D/runs.txt"
}

run normal
ok=0
grep -q "^normal rc=0 .* pass D+C" "$D/runs.txt" || ok=1
for k in $SMS; do
  run "sms$k" --num-sms "$k"
  grep -Eq "^sms$k rc=1 .* (fail|inconclusive) D\+C" "$D/runs.txt" || ok=1
done
mkdir -p "$D/buildlogs"
for b in "$REPROSTACK_CACHE"/builds/*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "$D/buildlogs/$(basename "$b").build.log"
done
tar -cf "$OUTD/baseline.tar" -C out baseline
cp "$D/runs.txt" "$D/gpu.txt" "$OUTD/"
exit $ok
