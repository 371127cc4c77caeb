#!/bin/bash
# Where a warm gate micro's seconds go on the lent GPU (issue 41's warm <= 25 s): one cold gate micro (builds), then
# WARM_N warm runs of the whole `reprostack gate micro` process (wall from outside, as the kcache bench times it), then
# the warm test's command again under the timeline probe (scripts/device/warm_timeline.py --warm-only: interpreter
# up, imports of torch and deep_ep, init_dist, ElasticBuffer, each bench_kineto, exit; seconds since launch).
# Diagnostic, not a gate and not a benchmark figure. Run after the NCCL wheel was seeded (scripts/device/
# seed_wheelhouse.sh receive, one call per part; the last part .cN may ride with this call); carry .carry and .whl.
# Then one warm run with --trials 1 (the fixed cost; K=5 minus K=1 is what four trials cost).
# Into $OUT: anatomy.log, timeline.json, runs.tsv (each run's result, duration and stage seconds from its report).
set -u
R=$(pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}; mkdir -p "$OUTD"
ls .c[0-9]*/meta >/dev/null 2>&1 && { bash scripts/device/seed_wheelhouse.sh receive || exit 2; }
WHEELS=$(ls .whl/*.whl | grep -v -e '/reprostack-' -e '/setuptools-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS 2>/dev/null || exit 1
export PYTHONPATH=$R/src:/tmp/site REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse:$R/.whl REPROSTACK_CACHE=$R/out/anat/cache
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
GPU=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | head -1)
case "$GPU" in *H200*) P=h200-ep1 ;; *) P=h100-ep1 ;; esac
G=(-m reprostack gate micro --profile "$P" --offline --bundle .carry/sources.tar --python "$PY")
{
echo "$GPU; profile $P; commit $(head -1 .carry/project-stamp.txt 2>/dev/null)"
ms() { echo $(( $(date +%s%N) / 1000000 )); }   # no bc on the device
t=$(ms); "$PY" "${G[@]}" --out out/anat/cold >/dev/null 2>&1; rc=$?
echo "cold rc=$rc wall $(( $(ms) - t )) ms"
for i in $(seq 1 "${WARM_N:-3}"); do
  t=$(ms); "$PY" "${G[@]}" --out "out/anat/warm-$i" >/dev/null 2>&1; rc=$?
  echo "warm-$i rc=$rc wall $(( $(ms) - t )) ms"
done
t=$(ms); "$PY" "${G[@]}" --trials 1 --out out/anat/warm-k1 >/dev/null 2>&1; rc=$?   # what the trials cost: K=1
echo "warm-k1 (--trials 1) rc=$rc wall $(( $(ms) - t )) ms"
# each run's figures, one row each (the reports stay on the device: a report committed under results/ must carry
# its attestation, and these are a diagnostic, not evidence)
"$PY" - "$OUTD/runs.tsv" out/anat/cold out/anat/warm-[0-9]* out/anat/warm-k1 <<'PYEOF'
import json, os, sys
from reprostack.report.docsgen import STAGES as keys  # the gate report's stages, as docs/bench.md tabulates them
rows = ["\t".join(("run", "result", "duration_s") + keys)]
for d in sys.argv[2:]:
    r = json.load(open(os.path.join(d, "micro.json")))
    t = r["data"].get("timings_s") or {}
    rows.append("\t".join([os.path.basename(d), r["result"], str(r["duration_s"])] + [str(t.get(k, "")) for k in keys]))
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PYEOF
"$PY" scripts/device/warm_timeline.py out/anat/warm-1 --warm-only && cp out/anat/warm-1/timeline.json "$OUTD/"
} 2>&1 | tee "$OUTD/anatomy.log"
