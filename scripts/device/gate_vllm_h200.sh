#!/bin/bash
# Gate 2 (vLLM 0.24.0) on the lent H200, profile h200-ep1 (issue 28): a real engine serving the tiny Qwen3-MoE, both
# arms attempted (the DeepEP V2 arm is SKIP when vLLM does not engage it, quoting vLLM; the default arm runs), the
# pinned AIPerf at c1/c4/c8 ISL120/OSL128 with 3 profile runs a cell, every number reported, never a PASS (the
# profile's bars are unmeasured). It runs the registered gate: `reprostack gate vllm --profile h200-ep1`.
#
# ENGINE=sglang runs gate sglang the same way (scripts/device/gate_sglang_h200.sh; its carry: seed_engine.sh split
# sglang; no EP2 probe).
#
# Run from the repository root on the device (no network there), as the last of the seeding calls:
#   here:  bash scripts/device/seed_engine.sh split vllm        # .e1 ... .e12 (results/carry/vllm-h200.json)
#   run(carry=[".e1"], command="bash scripts/device/seed_engine.sh receive")      # ... one call per part, back to back
#   run(carry=[".e11"], command="bash scripts/device/seed_engine.sh receive")
#   run(carry=[".e12", ".whl"], timeout_s=600, command="bash scripts/device/gate_vllm_h200.sh")
# .whl/*.whl: reprostack's own dependencies for CPython 3.12 (as for gate_fabric.sh; only platformdirs and docker are
# not already in the vLLM carry). Nothing else travels: the model is made here by models/tiny-qwen3-moe/make.py and
# checked against its SHA256SUMS; vLLM at DP1 builds no DeepEP buffer, so neither DeepEP nor the NCCL wheel is needed
# (a carried .cache/wheelhouse NCCL wheel is left alone). /opt/torch/.venv is never written: the engine goes to
# /tmp/rs-engine/site (PYTHONPATH), AIPerf to its own venv /tmp/rs-engine/aiperf (REPROSTACK_AIPERF_VENV).
#
# Steps and the time planned for each on the H200 (16 cores), 560 s in all under `timeout`:
#   receive + join the last part, every wheel sha256-checked against upstreams.lock      ~10 s (651 MB hashed)
#   install: re-hash, pip --no-index --no-deps --target (135 wheels), the AIPerf venv     ~60-90 s (49 s on 2 cores here
#            (130 wheels)                                                                  for the two, warm disk)
#   the model: make.py + sha256sum -c                                                      ~2 s
#   the gate: the DeepEP arm's server start (torch.compile, CUDA graphs) and its SKIP     ~60-120 s
#             the default arm's start and AIPerf c1/c4/c8 x 3 runs                        ~150-200 s
#   the EP2 probe (vLLM asked for DP2 on one GPU; its own refusal kept), if time is left  <= 90 s
# Into $OUT (8 files at most): gate_vllm.tar.xz (the run folder: vllm.json, summary.md, junit.xml, server logs,
# every AIPerf export of every profile run), vllm.json, summary.md, cli.log, steps.log, install.log, ep2-probe.log,
# freeze.txt (what the device's torch venv holds: the next carry can count on it).
# Exit: the gate's (1 for an unmeasured profile that ran; 2 a step before it failed; 3 SKIP).
set -u
R=$(pwd)
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-$R/.cache/device}
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
export REPROSTACK_TORCH_PYTHON=$PY
OUTD=${OUT:-$R/out/device}
BUDGET=${GATE_BUDGET_S:-560}
E=/tmp/rs-engine
SITE=$E/site AIPV=$E/aiperf RSITE=$E/reprostack-site
ENGINE=${ENGINE:-vllm}
case "$ENGINE" in vllm|sglang) ;; *) echo "ENGINE=$ENGINE: vllm or sglang" >&2; exit 2 ;; esac
D=$R/out/gate_${ENGINE}_h200
MODEL=$R/.cache/models/tiny-qwen3-moe
rm -rf "$D"
mkdir -p "$OUTD" "$D" "$E" "$REPROSTACK_CACHE"
T0=$(date +%s)
step() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$D/steps.log"; }
finish() {
  cp "$D/steps.log" "$OUTD/" 2>/dev/null
  for f in install.log ep2-probe.log freeze.txt cli.log; do [ -f "$D/$f" ] && cp "$D/$f" "$OUTD/"; done
  exit "$1"
}

step "receive: the carried part(s), then the join (each wheel against upstreams.lock)"
bash scripts/device/seed_engine.sh receive > "$D/install.log" 2>&1 || { tail -3 "$D/install.log"; finish 2; }
tail -1 "$D/install.log"
"$PY" -m pip list --format=freeze > "$D/freeze.txt" 2>/dev/null
CID=$(ls -d .cache/engine-parts/*/ 2>/dev/null | while read -r d; do [ -f "$d/complete" ] && basename "$d"; done | tail -1)
[ -n "$CID" ] || { echo "no complete carry in .cache/engine-parts: seed every part first (seed_engine.sh receive)" >&2; finish 2; }
if [ "$(cat "$SITE/.carry-id" 2>/dev/null)" = "$CID" ] && [ -f "$AIPV/.reprostack-verified.json" ]; then
  step "install: carry ${CID:0:12} already installed in $SITE"
else
  step "install: carry ${CID:0:12} into $SITE and $AIPV"
  rm -rf "$SITE"
  bash scripts/device/seed_engine.sh install "$ENGINE" "$SITE" "$AIPV" >> "$D/install.log" 2>&1 || { tail -3 "$D/install.log"; finish 2; }
  echo "$CID" > "$SITE/.carry-id"
fi
tail -4 "$D/install.log"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$RSITE" $(ls .whl/*.whl | grep -v '/reprostack-') \
    >> "$D/install.log" 2>&1 || { echo "pip install .whl failed (install.log)" >&2; finish 2; }
fi
export PYTHONPATH=$R/src:$SITE:$RSITE REPROSTACK_AIPERF_VENV=$AIPV
"$PY" -c "import reprostack.gates.serving, $ENGINE" 2>> "$D/install.log" || {
  echo "reprostack or $ENGINE does not import with PYTHONPATH=$PYTHONPATH (install.log; carry .whl for reprostack's deps)" >&2; finish 2; }

step "model: models/tiny-qwen3-moe/make.py -> $MODEL, checked against SHA256SUMS"
"$PY" models/tiny-qwen3-moe/make.py "$MODEL" > /dev/null || finish 2
(cd "$MODEL" && sha256sum -c --quiet "$R/models/tiny-qwen3-moe/SHA256SUMS") || {
  echo "the device's numpy made other bytes than SHA256SUMS: the model is not the recipe's" >&2; finish 2; }

nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1 | tee -a "$D/steps.log"
LEFT=$(( BUDGET - ( $(date +%s) - T0 ) - 20 ))
step "gate: reprostack gate $ENGINE --profile h200-ep1 (timeout ${LEFT} s)"
timeout -k 10 "$LEFT" "$PY" -m reprostack gate "$ENGINE" --profile h200-ep1 --no-container --out "$D/run" \
  --python "$PY" > "$D/cli.log" 2>&1
rc=$?
step "gate: exit $rc"
grep -v "^ *$" "$D/cli.log" | tail -25

LEFT=$(( BUDGET - ( $(date +%s) - T0 ) - 15 ))
if [ "$ENGINE" = vllm ] && [ "${PROBE_EP2:-1}" = 1 ] && [ "$LEFT" -ge 45 ]; then
  P=$(( LEFT < 90 ? LEFT : 90 ))
  step "probe: vLLM asked for DP2 (EP2) on one GPU, its answer kept (timeout $P s)"
  timeout -k 5 "$P" env VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
    "$PY" -m vllm.entrypoints.cli.main serve "$MODEL" --served-model-name tiny-qwen3-moe --host 127.0.0.1 --port 18911 \
    --tensor-parallel-size 1 --data-parallel-size 2 --enable-expert-parallel --all2all-backend deepep_v2 \
    --max-model-len 512 --max-num-seqs 16 --gpu-memory-utilization 0.3 > "$D/ep2-probe.log" 2>&1
  echo "probe exit $?" >> "$D/ep2-probe.log"
  grep -E "Error|error|refus|duplicate|invalid device|Exception" "$D/ep2-probe.log" | tail -6
fi

step "collect"
RUN=$(ls -d "$D"/run 2>/dev/null)
[ -n "$RUN" ] && for f in "$ENGINE.json" summary.md; do [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUTD/"; done
tar -cJf "$OUTD/gate_$ENGINE.tar.xz" -C "$R/out" "gate_${ENGINE}_h200"
ls -la "$OUTD"
finish "$rc"
