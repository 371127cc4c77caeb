#!/bin/bash
# Device run of gate 5 (megatron) at EP1 on the lent H200: NCCL pre-built (same pinned tree, recipe, nvcc,
# sm_90: same cache key as the device computes), DeepEP built here, then both arms.
set -u
R=$(pwd); C=$R/.carry-train; O=/tmp/out
mkdir -p /tmp/wt $O && tar xzf $C/wt.tgz -C /tmp/wt || exit 1
export REPROSTACK_CACHE=/tmp/rc PYTHONUNBUFFERED=1
mkdir -p $REPROSTACK_CACHE/builds && tar -xJf $C/nccl-build.tar.xz -C $REPROSTACK_CACHE/builds || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $C/whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee $O/gpu.txt
cd /tmp/wt
t0=$(date +%s)
PYTHONPATH=/tmp/site:/tmp/wt/src python3 -m reprostack gate megatron --offline --bundle $C/sources.tar \
  --out $O/h200 --timeout ${1:-240} > $O/cli.log 2>&1
echo "rc=$? wall_s=$(( $(date +%s) - t0 ))" | tee $O/wall_time.txt
grep -v "^Running NVCC" $O/cli.log | grep -v Warning | tail -40
for d in $REPROSTACK_CACHE/builds/*/; do [ -f $d/build.log ] && cp $d/build.log $O/h200/$(basename $d).build.log; done
(cd $O && tar -czf $OUT/results.tgz .)
cp $O/h200/megatron.json $OUT/ 2>/dev/null; true
