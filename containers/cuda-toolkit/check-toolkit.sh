#!/bin/sh
# In the cuda-toolkit image's build: nvcc must be release $1 (the lock's nvidia-cuda-nvcc), and compile a kernel for
# sm_$2 to a cubin; writes /opt/reprostack/toolkit-check.json (nvcc version line, the cubin's sha256). Exit 1 on any
# difference, naming it.
set -eu
want=$1 arch=$2
got=$(nvcc --version | sed -n 's/.*V\([0-9.]*\)$/\1/p')
[ "$got" = "$want" ] || { echo "nvcc is $got, the lock pins nvidia-cuda-nvcc $want" >&2; exit 1; }
d=$(mktemp -d)
cat > "$d/k.cu" <<'CU'
#include <cuda_runtime.h>
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
CU
(cd "$d" && nvcc -arch=sm_"$arch" -cubin -o k.cubin k.cu)
head -c 4 "$d/k.cubin" | od -An -c | grep -q 'E   L   F' || { echo "nvcc wrote no ELF cubin" >&2; exit 1; }
sha=$(sha256sum "$d/k.cubin" | cut -d' ' -f1)
printf '{"nvcc": "%s", "arch": "sm_%s", "axpy_cubin_sha256": "%s"}\n' "$got" "$arch" "$sha" > /opt/reprostack/toolkit-check.json
cat /opt/reprostack/toolkit-check.json
rm -rf "$d"
