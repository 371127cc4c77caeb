#!/bin/bash
# Issue 42 item 2, for the integrator when a multi-GPU kind is lent (NOT run yet: no such kind was lent when it was
# written): one engine's DeepEP arm and its comparison arm at EP = every GPU of the host, the registered gate
#   reprostack gate ENGINE --profile host-epN      (gates/vllm.yaml, gates/sglang.yaml; N = 2, 4 or 8)
# with the pinned AIPerf at c1/c4/c8 ISL120/OSL128, K profile runs a cell (the DeepEP/alternative ratio's interval
# needs K >= 2), the multicast-off variables set, every number reported and never a PASS (the profiles have no bar).
#
#   ENGINE=vllm|sglang N=2|4|8 [K=3] bash scripts/device/gate_engines_host.sh
#
# Prerequisites on the warm machine, carried by earlier calls of the same session (64 MiB a call), as for the H200
# runs (scripts/device/gate_vllm_h200.sh, gate_micro_ep1_arms.sh):
#   the engine:   here `bash scripts/device/seed_engine.sh split ENGINE`, there one
#                 `bash scripts/device/seed_engine.sh receive` per .eN part (the last one may ride with this call)
#   .carry/sources.tar   `reprostack bundle -o .carry/sources.tar nccl deepep` (verified sources; no network there)
#   .whl/*.whl           reprostack's own dependencies for the device's CPython
#   optional .carry/nccl-build.tar.xz   a prebuilt NCCL cache entry (else NCCL builds here, ~4 min on 16 cores)
# Steps (each bounded; the whole call stays under the 600 s command limit only with a warm NCCL build):
#   1. install the engine's locked wheels into $SITE (re-hashed against upstreams.lock) and the AIPerf venv;
#   2. sglang only: scripts/device/sglang_seam.sh $SITE (the seam onto the pinned wheel's file, blobs checked);
#   3. gate micro --profile h200-nvl-epN: builds the pinned NCCL and DeepEP here (the cache's builds/) and is gate 1
#      at the same EP on this host (its own report, also evidence); the engine then imports that deep_ep, through
#      the build's overlay (one NCCL per process: kernels.runtime) -- the seam of this script that has not run yet;
#   4. the gate, whose backend assertion needs, per rank, DeepEP's construction line and its per-dispatch line.
# Into $OUT: gate_ENGINE_host.tar.xz (both run folders: reports, server logs, every AIPerf export), ENGINE.json,
# micro.json, summary.md, cli.log, micro-cli.log, steps.log, install.log, seam.log.
# Commit from it: results/gate_ENGINE/<date>-<card>x<N>-epN/ (the run folder as gate_vllm_h200.sh's were committed),
# results/gate_micro/<date>-<card>x<N>-nvl-epN/, then attest once signing exists.
# SGLang: its DeepEP arm is SKIP on host-epN (gates/sglang.yaml skip-arms): SGLang 0.5.11 serves DeepEP normal mode
# only for an FP8 model (through DeepGEMM) and the tiny model is BF16; an FP8 block-quantized variant of
# models/tiny-qwen3-moe is the missing piece; then drop that skip-arms entry. ENGINE=sglang alone gives the dense arm.
# Exit: the gate's (1 for an unmeasured profile that ran; 2 a step before it failed; 3 SKIP).
set -u
R=$(pwd)
ENGINE=${ENGINE:-vllm}
N=${N:-2}
K=${K:-3}
case "$ENGINE" in vllm|sglang) ;; *) echo "ENGINE=$ENGINE: vllm or sglang" >&2; exit 2 ;; esac
case "$N" in 2|4|8) ;; *) echo "N=$N: 2, 4 or 8 (profiles host-ep2/4/8)" >&2; exit 2 ;; esac
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-$R/.cache/device}
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
export REPROSTACK_TORCH_PYTHON=$PY
OUTD=${OUT:-$R/out/device}
BUDGET=${GATE_BUDGET_S:-570}
E=/tmp/rs-engine
SITE=$E/site AIPV=$E/aiperf RSITE=$E/reprostack-site
D=$R/out/gate_${ENGINE}_host
MODEL=$R/.cache/models/tiny-qwen3-moe
rm -rf "$D"
mkdir -p "$OUTD" "$D" "$E" "$REPROSTACK_CACHE/builds"
T0=$(date +%s)
step() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$D/steps.log"; }
left() { echo $(( BUDGET - ( $(date +%s) - T0 ) - ${1:-0} )); }
finish() {
  for f in steps.log install.log seam.log cli.log micro-cli.log; do [ -f "$D/$f" ] && cp "$D/$f" "$OUTD/"; done
  for f in "$D/run/$ENGINE.json" "$D/run/summary.md" "$D/micro/micro.json"; do [ -f "$f" ] && cp "$f" "$OUTD/"; done
  tar -cJf "$OUTD/gate_${ENGINE}_host.tar.xz" -C "$R/out" "gate_${ENGINE}_host" 2>/dev/null
  exit "$1"
}
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar nccl deepep)" >&2; exit 2; }
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "$GPUS" -ge "$N" ] || { echo "this host has $GPUS GPU(s): host-ep$N needs $N" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1 | tee -a "$D/steps.log"

step "1. install: the engine's carry into $SITE, AIPerf into $AIPV"
bash scripts/device/seed_engine.sh receive > "$D/install.log" 2>&1 || { tail -3 "$D/install.log"; finish 2; }
rm -rf "$SITE"
bash scripts/device/seed_engine.sh install "$ENGINE" "$SITE" "$AIPV" >> "$D/install.log" 2>&1 || {
  tail -3 "$D/install.log"; finish 2; }
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$RSITE" $(ls .whl/*.whl | grep -v '/reprostack-') \
    >> "$D/install.log" 2>&1 || { echo "pip install .whl failed (install.log)" >&2; finish 2; }
fi
if [ -f .carry/nccl-build.tar.xz ]; then tar -xJf .carry/nccl-build.tar.xz -C "$REPROSTACK_CACHE/builds" || finish 2; fi

if [ "$ENGINE" = sglang ]; then
  step "2. the seam: patches/sglang/0001 onto the installed sglang 0.5.11"
  bash scripts/device/sglang_seam.sh "$SITE" > "$D/seam.log" 2>&1 || { cat "$D/seam.log"; finish 2; }
  cat "$D/seam.log"
fi

step "3. gate micro --profile h200-nvl-ep$N: NCCL + DeepEP built here, gate 1 at EP$N (timeout $(left 300) s)"
PYTHONPATH=$R/src:$RSITE timeout -k 10 "$(left 300)" "$PY" -m reprostack gate micro --profile "h200-nvl-ep$N" \
  --offline --bundle .carry/sources.tar --out "$D/micro" --python "$PY" > "$D/micro-cli.log" 2>&1
step "3. gate micro: exit $? (its report is evidence of its own; the engine needs only the build)"
DEEPEP_OUT=$(ls -d "$REPROSTACK_CACHE"/builds/deepep-*/ 2>/dev/null | head -1)
[ -n "$DEEPEP_OUT" ] && [ -d "$DEEPEP_OUT/site" ] || { echo "no DeepEP build in $REPROSTACK_CACHE/builds" >&2; finish 2; }
# the build's overlay first (one NCCL per process, kernels.runtime.runtime_env), then its deep_ep, then the engine
export PYTHONPATH=$R/src:${DEEPEP_OUT}overlay:${DEEPEP_OUT}site:$SITE:$RSITE REPROSTACK_AIPERF_VENV=$AIPV
"$PY" -c "import reprostack.gates.serving, deep_ep, $ENGINE; print('deep_ep', deep_ep.__file__)" >> "$D/install.log" 2>&1 || {
  tail -5 "$D/install.log"; echo "reprostack, deep_ep or $ENGINE does not import (install.log)" >&2; finish 2; }

step "model: models/tiny-qwen3-moe/make.py -> $MODEL, checked against SHA256SUMS"
"$PY" models/tiny-qwen3-moe/make.py "$MODEL" > /dev/null || finish 2
(cd "$MODEL" && sha256sum -c --quiet "$R/models/tiny-qwen3-moe/SHA256SUMS") || {
  echo "the device's numpy made other bytes than SHA256SUMS: the model is not the recipe's" >&2; finish 2; }

step "4. gate: reprostack gate $ENGINE --profile host-ep$N --trials $K (timeout $(left 20) s)"
timeout -k 10 "$(left 20)" "$PY" -m reprostack gate "$ENGINE" --profile "host-ep$N" --no-container --trials "$K" \
  --out "$D/run" --python "$PY" > "$D/cli.log" 2>&1
rc=$?
step "4. gate: exit $rc"
grep -v "^ *$" "$D/cli.log" | tail -25
finish "$rc"
