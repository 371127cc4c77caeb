#!/bin/sh
# The aws-ofi-nccl plugin in $1 must export a GIN plugin table NCCL 2.30 looks up (ncclGinPlugin_v13, or the
# older _v11) next to its net plugin (ncclNetPlugin_v*): without it NCCL_GIN_TYPE=2 has no GIN to load.
set -eu
dir="$1"
found=0
for lib in "$dir"/libnccl-net*.so; do
  [ -f "$lib" ] || continue
  syms=$(nm -D --defined-only "$lib")
  gin=$(printf '%s\n' "$syms" | awk '$3 ~ /^ncclGinPlugin_v(11|13)$/ {print $3}' | sort -u | tr '\n' ' ')
  net=$(printf '%s\n' "$syms" | awk '$3 ~ /^ncclNetPlugin_v[0-9]+$/ {print $3}' | sort -u | tr '\n' ' ')
  if [ -n "$gin" ] && [ -n "$net" ]; then
    echo "check-gin-plugin: $lib exports $gin$net"
    found=1
  fi
done
if [ "$found" != 1 ]; then
  echo "check-gin-plugin: no libnccl-net*.so in $dir exports ncclGinPlugin_v13/_v11 and ncclNetPlugin_v*" >&2
  exit 1
fi
