#!/bin/bash
# Issue 41's figures on the lent GPU (H100 or H200; the file is named after it): gate micro cold with a kernel cache
# miss, warm, cold with a cache hit, and from nothing with a cache hit, each the whole `reprostack gate micro` process
# from a fresh folder, --repeat rounds, every run listed (`reprostack bench gate_micro --runs KINDS`, src/reprostack/
# bench.py: bench_kernel_cache). The cache is a folder on the device (.cache/bench-kcache, git-ignored, kept while
# the machine stays warm): the first cold miss that builds DeepEP pushes its entry there, signed with a key made on the
# device for the bench (.cache/bench-kcache-key.pem; its keyring .cache/bench-kcache-keys/, named in the JSON), and the
# *_hit runs pull it, verified, as any node would.
#
# The four kinds take ~13 min on an H200 (cold miss ~115 s, warm ~28 s, hit ~40 s, from nothing ~60 s, x3), more than
# one call's 10 min, so they run in two consecutive calls on one warm machine; the run lists of both calls are merged
# into one file (same lock, commit and host), which each call copies to $OUT. BENCH_RUNS picks the kinds of a call.
#
# Before, on the same warm machine (as scripts/device/bench_gate_micro.sh says): the NCCL wheel seeded into
# .cache/wheelhouse by `bash scripts/device/seed_wheelhouse.sh receive` with carries .c1 .. .c5 (one call each);
# the last part .c6 may ride with call A. Carried (git-ignored):
#   .carry/sources.tar          `reprostack bundle -o .carry/sources.tar deepep nccl` (verified sources: the bundle)
#   .whl/*.whl                  reprostack's dependencies for the device's CPython 3.12 and setuptools==80.9.0 (the
#                               from-nothing run pip-installs the project from them, --no-index): README "A GPU node
#                               without internet"; now with securesystemslib 1.6.0, cryptography 51.0.1 (+ cffi,
#                               pycparser) for the signing
#   .carry/project-stamp.txt    `bash scripts/device/project_stamp.sh` (the commit the JSON records)
# Calls:
#   A: run(carry=[".c6", ".carry/sources.tar", ".whl", ".carry/project-stamp.txt"], timeout_s=600,
#          command="BENCH_RUNS=cold_miss,warm bash scripts/device/bench_kernel_cache.sh")
#   B: run(carry=[".carry/sources.tar", ".whl", ".carry/project-stamp.txt"], timeout_s=600,
#          command="BENCH_RUNS=cold_hit,from_nothing_hit bash scripts/device/bench_kernel_cache.sh")
# Into $OUT after each call: kcache-<gpu>.json (after B: commit it as results/bench/kcache-<gpu>-<date>.json), bench.log,
#   gpu.txt, bench.tar (every run's report, cli.log and build logs; no caches, venvs or entries).
# BENCH_GATE_ARGS: more options for every benched gate run (e.g. `--purpose baseline`: each run, a whole K-trial
# measurement on this GPU, signed as a baseline run of the profile);
# BENCH_REPEAT (default 3) rounds; BENCH_PROFILE (default: h200-ep1 on an H200; h100-ep1 on an H100 when
# gates/micro.yaml has it, else h200-ep1, said in the output: a timing, not evidence for that profile); BENCH_TIMEOUT (default 560 s): the JSON is written after every round, so a call cut at
# its limit keeps the rounds it finished (a later call with the same BENCH_RUNS adds more).
set -u
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # the lender's rule
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
RUNS=${BENCH_RUNS:-cold_miss,warm}
mkdir -p "$OUTD" "$R/.cache"
T0=$(date +%s)
ls .c[0-9]*/meta >/dev/null 2>&1 && { bash scripts/device/seed_wheelhouse.sh receive || exit 2; }
ls .cache/wheelhouse/nvidia_nccl_cu13-*.whl >/dev/null 2>&1 || { echo "no NCCL wheel in .cache/wheelhouse: seed it first (scripts/device/seed_wheelhouse.sh)" >&2; exit 2; }
[ -f .carry/sources.tar ] || { echo "missing .carry/sources.tar (reprostack bundle -o .carry/sources.tar deepep nccl)" >&2; exit 2; }
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
ls .whl/setuptools-*.whl >/dev/null 2>&1 || { echo "missing .whl/setuptools-*.whl (the from-nothing install's build backend)" >&2; exit 2; }
WHEELS=$(ls .whl/*.whl | grep -v -e '/reprostack-' -e '/setuptools-')
SITE=${BENCH_SITE:-/tmp/site}   # reprostack's dependencies for the bench's own process (the runs' venv: from nothing)
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $WHEELS || exit 1
export PYTHONPATH=$R/src:$SITE REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse:$R/.whl
GPU=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | head -1)
echo "$GPU" | tee "$OUTD/gpu.txt"
case "$GPU" in *H200*) L=h200 ;; *H100*) L=h100 ;; *) L=gpu ;; esac
PROFILE=${BENCH_PROFILE:-}
if [ -z "$PROFILE" ]; then
  PROFILE=$L-ep1
  if ! grep -q "^  $PROFILE:" gates/micro.yaml; then  # e.g. an H100 before it has its own profile (issue 39 item 7)
    PROFILE=h200-ep1
    echo "gates/micro.yaml has no $L-ep1 profile: timing with h200-ep1 (one GPU, EP1, the same sm_90 kernels); the" \
      "runs' verdicts are not evidence for h200-ep1 (the JSON's host_inventory names this $GPU)"
  fi
fi
echo "bench kcache on $L ($GPU), profile $PROFILE, runs $RUNS x ${BENCH_REPEAT:-3}"

timeout -k 10 "${BENCH_TIMEOUT:-560}" "$PY" -m reprostack bench gate_micro --runs "$RUNS" --repeat "${BENCH_REPEAT:-3}" \
  --host "$L" --results .cache/bench-results --work out/bench-kcache --kernel-cache "$R/.cache/bench-kcache" \
  -- --profile "$PROFILE" --offline --bundle .carry/sources.tar --python "$PY" ${BENCH_GATE_ARGS:-} 2>&1 | tee "$OUTD/bench.log"
rc=${PIPESTATUS[0]}
cp ".cache/bench-results/kcache-$L.json" "$OUTD/" 2>/dev/null || echo "no kcache-$L.json written (see bench.log)"
mkdir -p out/bench-kcache/buildlogs
for b in out/bench-kcache/kcache/r*/*/cache/builds/*/ out/bench-kcache/kcache/r*/*/nothing-cache/builds/*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "out/bench-kcache/buildlogs/$(echo "$b" | tr '/' '_').build.log"
done
tar -cf "$OUTD/bench.tar" --exclude=cache --exclude=nothing-cache --exclude=nothing-venv --exclude=empty-kcache \
  -C out bench-kcache 2>/dev/null
echo "bench kcache rc=$rc wall_s=$(( $(date +%s) - T0 ))"
exit $rc
