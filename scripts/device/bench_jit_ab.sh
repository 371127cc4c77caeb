#!/bin/bash
# issue 17, one call on the lent H200: the bench (scripts/device/bench_gate_micro.sh: cold in a fresh cache, then
# warm) twice, on one machine: A without a JIT manifest for h200-ep1 (DeepEP compiles its kernels one after another
# in the test, as upstream does), then B with the manifest A's cold run recorded (its micro/jit-kernels.json, as
# kernels/jit/h200-ep1.json): B's kernels are compiled all at once before the test (reprostack.kernels.jit).
# Same carry and wheelhouse as bench_gate_micro.sh. Into $OUT: a/ and b/ (each bench.log, gate_micro-h200.json,
# bench.tar, jit-kernels.json, jit-src.tar: the JIT cache's kernel.cu files), and h200-ep1.json (B's manifest).
set -u
R=$(pwd)
OUTD=${OUT:-$R/out/device}
MAN=kernels/jit/h200-ep1.json
keep() {  # $1: a or b
  mkdir -p "$OUTD/$1"
  for f in bench.log gate_micro-h200.json bench.tar gpu.txt; do [ -f "$OUTD/$f" ] && mv "$OUTD/$f" "$OUTD/$1/"; done
  cp out/bench/gate_micro/cold/micro/jit-kernels.json "$OUTD/$1/" 2>/dev/null
  d=$(ls -d out/bench/gate_micro/cache/builds/deepep-*/jit 2>/dev/null | head -1)
  [ -n "$d" ] && tar -cf "$OUTD/$1/jit-src.tar" --exclude='*.cubin' -C "$d" cache
}
if [ -e "$MAN" ] && [ "${JIT_AB_ONLY_B:-0}" != 1 ]; then mv "$MAN" /tmp/h200-ep1.json.kept; fi
if [ "${JIT_AB_ONLY_B:-0}" != 1 ]; then
  BENCH_TIMELINE=0 bash scripts/device/bench_gate_micro.sh; echo "A rc=$?"
  keep a
  n=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["kernels"]))' "$OUTD/a/jit-kernels.json" 2>/dev/null || echo 0)
  echo "A recorded $n JIT kernel(s)"
  [ "$n" -gt 0 ] || { echo "no kernels recorded: B not run"; exit 1; }
  mkdir -p kernels/jit && cp "$OUTD/a/jit-kernels.json" "$MAN"
fi
BENCH_TIMELINE=0 bash scripts/device/bench_gate_micro.sh; echo "B rc=$?"
keep b
rm -f "$OUTD/b/jit-src.tar" "$OUTD/b/gpu.txt"  # at most 8 files come back
cp "$MAN" "$OUTD/h200-ep1.json"
python3 - "$OUTD" <<'PY'
import json, sys, os
for ab in ("a", "b"):
    p = os.path.join(sys.argv[1], ab, "gate_micro-h200.json")
    if os.path.exists(p):
        d = json.load(open(p))
        for k in ("cold", "warm"):
            r = d["runs"][k]
            print(f"{ab} {k}: {r['wall_s']} s {r['result']} stages {r['stages_s']}")
PY
