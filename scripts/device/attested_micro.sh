#!/bin/bash
# Signed gate-1 evidence on the lent GPU (issue 39): N baseline runs of PROFILE (`--purpose baseline`, K trials each)
# and one deliberately slowed run (`--num-sms 8`), every run folder signed on the device with the integrator's key
# (reprostack.evidence), its console transcript signed after the run (`reprostack attest DIR`).
#   bash scripts/device/attested_micro.sh PROFILE [N] [K]        PROFILE: h100-ep1 on an H100, h200-ep1 on an H200
# (defaults N=3, K=5; cold first run ~130 s, each warm run ~30 s: N=3 fits one call of <= 10 min)
# Needs, carried (git-ignored), as for micro_trials.sh:
#   .carry/sources.tar          `reprostack bundle -o .carry/sources.tar deepep nccl`
#   .whl/*.whl                  reprostack's dependencies for the device's python, now with securesystemslib 1.6.0,
#                               cryptography 51.0.1, cffi and pycparser (pyproject.toml; README "A GPU node without
#                               internet")
#   .carry/signing-key.pem      the integrator's key (/work/wt/integrator.key; its public half is keys/reprostack-
#                               session-12-integrator-*.pub.json); never committed
#   .carry/project-stamp.txt    scripts/device/project_stamp.sh (no .git on the device: the commit each run records)
# Into $OUT: attested.tar (out/attested/<run>/ for each run: reports, raw logs, cli.log, run.intoto.jsonl) and a
# line per run. Commit what it gives under results/gate_micro/<date>-<PROFILE>-attested/ as it is (never edit a
# file of a signed folder: verify-report flags any byte changed or added).
set -u
[ $# -ge 1 ] || { echo "usage: $0 PROFILE [N] [K]" >&2; exit 2; }
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
PROFILE=$1 N=${2:-3} K=${3:-5}
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
export REPROSTACK_SIGNING_KEY=$R/.carry/signing-key.pem
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
A=out/attested
rm -rf "$A"
mkdir -p "$OUTD" "$A" "$REPROSTACK_CACHE/builds"
for need in .carry/sources.tar .carry/signing-key.pem; do
  [ -f "$need" ] || { echo "missing $need (see the head of $0)" >&2; exit 2; }
done
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
for t in .carry/nccl-build.tar.xz .carry/builds/*.tar.xz; do
  [ -f "$t" ] && { tar -xJf "$t" -C "$REPROSTACK_CACHE/builds" || exit 1; }
done
WHEELS=$(ls .whl/*.whl | grep -v '/reprostack-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
RS="env PYTHONPATH=$R/src:/tmp/site $PY -m reprostack"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader

one() {  # NAME, then the gate's own options
  local name=$1; shift
  local D=$A/$name t0
  mkdir -p "$D"
  t0=$(date +%s)
  timeout -k 10 400 $RS gate micro --profile "$PROFILE" --trials "$K" --offline --bundle .carry/sources.tar \
    --out "$D" --python "$PY" --timeout 300 "$@" > "$D/cli.log" 2>&1
  local rc=$?
  $RS attest "$D" > "$A/$name.attest.txt" 2>&1 || { cat "$A/$name.attest.txt"; }
  echo "$name rc=$rc wall_s=$(( $(date +%s) - t0 )) $(grep -m1 '^micro \[' "$D/cli.log")"
}
# ATTESTED_PURPOSE=none: N ordinary runs (run-1 ..., judged against the profile's bar as any user's run) instead of
# baseline runs, e.g. once the bar is made of the baseline runs: the ordinary run and the slowed one then meet it
if [ "${ATTESTED_PURPOSE:-baseline}" = none ]; then
  for i in $(seq 1 "$N"); do one "run-$i"; done
else
  for i in $(seq 1 "$N"); do one "baseline-$i" --purpose baseline; done
fi
one "slowed-sms8" --num-sms 8
$RS verify-run "$A"/*/ --keyring keys   # on the device (no .git): every folder signed, every subject holds
tar -cf "$OUTD/attested.tar" -C out attested
