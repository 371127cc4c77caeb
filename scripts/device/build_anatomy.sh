#!/bin/bash
# issue 17: where the cold gate_micro's build and JIT seconds go, on the lent H200. Run right after
# scripts/device/bench_gate_micro.sh in the same call (it reuses that bench's cache: the verified DeepEP tree, the
# unpacked NCCL, the JIT cache the cold test filled). Nothing here is a gate or a verdict: it times
#   1. DeepEP's extension built by `setup.py build` straight (no pip: no metadata pass, no wheel), upstream's flags;
#   2. the same with CFLAGS=-g0 (g++ emits no debug info for python_api.cpp; GCC's code does not depend on -g);
#   3. each JIT kernel the cold test compiled (kernel.cu in the JIT cache) compiled again with the flags of
#      DeepEP's csrc/jit/compiler.hpp, one after another and then all at once; each cubin compared with the cache's
#      (the same bytes = the flags were reconstructed right).
# Prints one `anatomy ...` line per figure; writes $OUT/anatomy.json and the build logs.
set -u
R=$(pwd)
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
OUTD=${OUT:-$R/out/device}
C=$R/out/bench/gate_micro/cache
T=$(ls -d "$C"/trees/deepep-* 2>/dev/null | head -1)
N=$(ls -d "$C"/builds/nccl-*/build 2>/dev/null | head -1)
D=$(ls -d "$C"/builds/deepep-* 2>/dev/null | head -1)
[ -n "$T" ] && [ -n "$N" ] && [ -n "$D" ] || { echo "anatomy: no bench cache under $C (run bench_gate_micro.sh first)" >&2; exit 2; }
NVSHMEM=$("$PY" -c 'import nvidia.nvshmem, os; print(os.path.dirname(nvidia.nvshmem.__file__) if nvidia.nvshmem.__file__ else list(nvidia.nvshmem.__path__)[0])')
CUDA=${CUDA_HOME:-/usr/local/cuda}
lscpu | grep -Ei "^(CPU\(s\)|Thread|Core|Socket|Model name)" | sed "s/^/anatomy lscpu /"
echo "anatomy torch_pycache_in_site $(ls "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"/torch/__pycache__ 2>/dev/null | wc -l) files"
J='{}'
put() { J=$("$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); d[sys.argv[2]]=json.loads(sys.argv[3]); print(json.dumps(d))' "$J" "$1" "$2"); }
steps() {  # ninja's per-step seconds, longest first, as JSON
  "$PY" - "$1" <<'EOF'
import glob, json, os, sys
out = []
for p in glob.glob(os.path.join(sys.argv[1], "temp*", ".ninja_log")):
    for ln in open(p):
        f = ln.rstrip("\n").split("\t")
        if len(f) >= 4 and f[0].isdigit():
            out.append([round((int(f[1]) - int(f[0])) / 1000, 1), os.path.basename(f[3])])
print(json.dumps(sorted(out, key=lambda t: -t[0])))
EOF
}
for v in base g0; do
  W=/tmp/anat-$v
  rm -rf "$W"; mkdir -p "$W"; cp -a "$T" "$W/src"; rm -rf "$W/src/.git"
  extra=(); [ $v = g0 ] && extra=(CFLAGS=-g0)
  t0=$(date +%s.%N)
  (cd "$W/src" && env "${extra[@]}" TORCH_CUDA_ARCH_LIST=9.0 LDFLAGS=-Wl,--exclude-libs,ALL MAX_JOBS=$(nproc) \
     EP_NCCL_ROOT_DIR="$N" EP_NVSHMEM_ROOT_DIR="$NVSHMEM" CUDA_HOME="$CUDA" GIT_CEILING_DIRECTORIES="$W" \
     PYTHONPYCACHEPREFIX="$C/pycache" EP_JIT_CACHE_DIR=/tmp/anat-jit \
     timeout -k 5 200 "$PY" setup.py build --build-base "$W/build" --build-lib "$W/site" > "$W/build.log" 2>&1)
  rc=$?
  wall=$("$PY" -c "import time; print(round($(date +%s.%N) - $t0, 1))")
  so=$(ls "$W"/site/deep_ep/_C*.so 2>/dev/null | head -1)
  size=$( [ -n "$so" ] && stat -c %s "$so" || echo 0)
  st=$(steps "$W/build")
  echo "anatomy build_$v rc=$rc wall_s=$wall so_bytes=$size steps=$st"
  put "build_$v" "{\"rc\": $rc, \"wall_s\": $wall, \"so_bytes\": $size, \"ninja_steps\": $st}"
  cp "$W/build.log" "$OUTD/anatomy-build-$v.log"
done
# 3. JIT kernels: the flags of compiler.hpp (NVCC >= 12.9: the arch's family suffix, sm_90a)
INC="$D/site/deep_ep/include"
FLAGS=(-std=c++20 --diag-suppress=39,161,174,177,186,940,3012 --ptxas-options=--register-usage-level=10 -I "$N/include"
  "-I$INC" --gpu-architecture=sm_90a --compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi
  -O3 --expt-relaxed-constexpr --expt-extended-lambda)
K=/tmp/anat-jitk; rm -rf "$K"; mkdir -p "$K"
seq_json='['; same=0; n=0
t0=$(date +%s.%N)
for d in "$D"/jit/cache/kernel.*; do
  [ -f "$d/kernel.cu" ] || continue
  name=$(basename "$d"); n=$((n+1))
  a=$(date +%s.%N)
  (cd "$K" && "$CUDA/bin/nvcc" "$d/kernel.cu" -cubin -o "$K/$name.cubin" "${FLAGS[@]}" > "$K/$name.log" 2>&1)
  s=$("$PY" -c "import time; print(round($(date +%s.%N) - $a, 2))")
  cmp -s "$K/$name.cubin" "$d/kernel.cubin" && { same=$((same+1)); m=true; } || m=false
  seq_json="$seq_json{\"kernel\": \"${name%%.*}.${name#kernel.}\", \"s\": $s, \"same_cubin\": $m},"
done
seq_wall=$("$PY" -c "import time; print(round($(date +%s.%N) - $t0, 1))")
seq_json="${seq_json%,}]"
echo "anatomy jit_sequential kernels=$n wall_s=$seq_wall same_cubin=$same/$n each=$seq_json"
t0=$(date +%s.%N)
for d in "$D"/jit/cache/kernel.*; do
  [ -f "$d/kernel.cu" ] || continue
  name=$(basename "$d")
  (cd "$K" && "$CUDA/bin/nvcc" "$d/kernel.cu" -cubin -o "$K/p-$name.cubin" "${FLAGS[@]}" > /dev/null 2>&1) &
done
wait
par_wall=$("$PY" -c "import time; print(round($(date +%s.%N) - $t0, 1))")
echo "anatomy jit_parallel kernels=$n wall_s=$par_wall"
put jit "{\"kernels\": $n, \"sequential_s\": $seq_wall, \"parallel_s\": $par_wall, \"same_cubin\": $same, \"each\": $seq_json}"
echo "$J" | "$PY" -m json.tool > "$OUTD/anatomy.json"
