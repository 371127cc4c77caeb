#!/bin/sh
# The gin-gdaki stack's plugin in $1 must export ncclGinPlugin_v14 (aws-ofi-nccl compiles it only with GDAKI: libfabric
# with FI_EFA_GDA_OPS and the completion-counter ABI, and CUDA) next to a net plugin table (ncclNetPlugin_v*).
# The same check as `reprostack stacks check-plugin` (src/reprostack/kernels/ginplugin.py), for inside the image.
set -eu
dir="$1"
for lib in "$dir"/libnccl-net*.so; do
  [ -f "$lib" ] || continue
  syms=$(nm -D --defined-only "$lib")
  if printf '%s\n' "$syms" | awk '$3 == "ncclGinPlugin_v14" {f=1} END {exit !f}' \
     && printf '%s\n' "$syms" | awk '$3 ~ /^ncclNetPlugin_v[0-9]+$/ {f=1} END {exit !f}'; then
    echo "check-gin-plugin-v14: $lib exports ncclGinPlugin_v14 and $(printf '%s\n' "$syms" | awk '$3 ~ /^ncclNetPlugin_v/ {print $3}' | sort -u | tr '\n' ' ')"
    exit 0
  fi
done
echo "check-gin-plugin-v14: no libnccl-net*.so in $dir exports ncclGinPlugin_v14 with ncclNetPlugin_v* (GDAKI not compiled in: libfabric without FI_EFA_GDA_OPS, or the wrong stack's aws-ofi-nccl)" >&2
exit 1
