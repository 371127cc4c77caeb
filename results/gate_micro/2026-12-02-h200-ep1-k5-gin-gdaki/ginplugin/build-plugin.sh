#!/bin/bash
# Rendered by reprostack (kernels/ginplugin.py) from the lock's pins; run with bash, no network needed.
set -euo pipefail
mkdir -p /work/main/out/ginplugin/work/src /work/main/out/ginplugin/work/build /work/main/out/ginplugin/prefix /work/main/out/ginplugin/prefix/flags
step() { echo "[ginplugin] $(date +%T) $*"; }
trap 'echo "[ginplugin] FAILED at: ${STEP:-setup}" >&2; L=$(ls -t /work/main/out/ginplugin/work/*.log 2>/dev/null | head -1); [ -n "$L" ] && { echo "[ginplugin] tail of $L:" >&2; tail -25 "$L" >&2; }' ERR
PREGEN=${GINPLUGIN_PREGEN:-}
STEP='copy rdma-core'; step "$STEP (f272237493ef)"
rm -rf /work/main/out/ginplugin/work/src/rdma-core
mkdir -p /work/main/out/ginplugin/work/src/rdma-core
tar -C /tmp/reprostack-cache-plugin/trees/rdma-core-99abc56eee53264382d9e74f3d29ddafb8f9cc81 --exclude=./.git -cf - . | tar -C /work/main/out/ginplugin/work/src/rdma-core -xf -
STEP='copy libfabric'; step "$STEP (5de2d6a2df83)"
rm -rf /work/main/out/ginplugin/work/src/libfabric
mkdir -p /work/main/out/ginplugin/work/src/libfabric
if [ -n "$PREGEN" ]; then
  [ "$(cat "$PREGEN/libfabric/.reprostack-source" 2>/dev/null)" = '5de2d6a2df83595bcc38531cb91bf59495559495 9e46915894d66f8c367468baf809121e4e181c03' ] || { echo "[ginplugin] $PREGEN/libfabric/.reprostack-source does not name libfabric 5de2d6a2df83595bcc38531cb91bf59495559495 9e46915894d66f8c367468baf809121e4e181c03 (the lock's pin)" >&2; exit 2; }
  tar -C "$PREGEN/libfabric" -cf - . | tar -C /work/main/out/ginplugin/work/src/libfabric -xf -
  D=$(diff -rq -x .git /tmp/reprostack-cache-plugin/trees/libfabric-9e46915894d66f8c367468baf809121e4e181c03 /work/main/out/ginplugin/work/src/libfabric | grep -v "^Only in /work/main/out/ginplugin/work/src/libfabric" || true)
  [ -z "$D" ] || { echo "[ginplugin] $PREGEN/libfabric differs from the verified tree of libfabric: $D" | head -5 >&2; exit 2; }
else
  tar -C /tmp/reprostack-cache-plugin/trees/libfabric-9e46915894d66f8c367468baf809121e4e181c03 --exclude=./.git -cf - . | tar -C /work/main/out/ginplugin/work/src/libfabric -xf -
fi
STEP='libfabric autogen'; step "$STEP"
cd /work/main/out/ginplugin/work/src/libfabric
[ -x ./configure ] || ./autogen.sh > /work/main/out/ginplugin/work/libfabric.autogen.log 2>&1
echo '5de2d6a2df83595bcc38531cb91bf59495559495 9e46915894d66f8c367468baf809121e4e181c03' > /work/main/out/ginplugin/work/src/libfabric/.reprostack-source
STEP='copy gdrcopy'; step "$STEP (c91ad9f178e5)"
rm -rf /work/main/out/ginplugin/work/src/gdrcopy
mkdir -p /work/main/out/ginplugin/work/src/gdrcopy
tar -C /tmp/reprostack-cache-plugin/trees/gdrcopy-62ee051cb11f4284916021c371b5a10df051a2f6 --exclude=./.git -cf - . | tar -C /work/main/out/ginplugin/work/src/gdrcopy -xf -
STEP='copy aws-ofi-nccl'; step "$STEP (2475c4c73690)"
rm -rf /work/main/out/ginplugin/work/src/aws-ofi-nccl
mkdir -p /work/main/out/ginplugin/work/src/aws-ofi-nccl
if [ -n "$PREGEN" ]; then
  [ "$(cat "$PREGEN/aws-ofi-nccl/.reprostack-source" 2>/dev/null)" = '2475c4c736907e68ebeadb3848f31231ee4a44d0 f7ddf15df23b55f78b0be1f11b63a9184834e9d8' ] || { echo "[ginplugin] $PREGEN/aws-ofi-nccl/.reprostack-source does not name aws-ofi-nccl 2475c4c736907e68ebeadb3848f31231ee4a44d0 f7ddf15df23b55f78b0be1f11b63a9184834e9d8 (the lock's pin)" >&2; exit 2; }
  tar -C "$PREGEN/aws-ofi-nccl" -cf - . | tar -C /work/main/out/ginplugin/work/src/aws-ofi-nccl -xf -
  D=$(diff -rq -x .git /tmp/reprostack-cache-plugin/trees/aws-ofi-nccl-f7ddf15df23b55f78b0be1f11b63a9184834e9d8 /work/main/out/ginplugin/work/src/aws-ofi-nccl | grep -v "^Only in /work/main/out/ginplugin/work/src/aws-ofi-nccl" || true)
  [ -z "$D" ] || { echo "[ginplugin] $PREGEN/aws-ofi-nccl differs from the verified tree of aws-ofi-nccl: $D" | head -5 >&2; exit 2; }
else
  tar -C /tmp/reprostack-cache-plugin/trees/aws-ofi-nccl-f7ddf15df23b55f78b0be1f11b63a9184834e9d8 --exclude=./.git -cf - . | tar -C /work/main/out/ginplugin/work/src/aws-ofi-nccl -xf -
fi
export BRAZIL_PACKAGE_CHANGE_ID=2475c4c736907e68ebeadb3848f31231ee4a44d0
STEP='aws-ofi-nccl autogen'; step "$STEP"
cd /work/main/out/ginplugin/work/src/aws-ofi-nccl
[ -x ./configure ] || ./autogen.sh > /work/main/out/ginplugin/work/aws-ofi-nccl.autogen.log 2>&1
echo '2475c4c736907e68ebeadb3848f31231ee4a44d0 f7ddf15df23b55f78b0be1f11b63a9184834e9d8' > /work/main/out/ginplugin/work/src/aws-ofi-nccl/.reprostack-source
STEP='rdma-core cmake'; step "$STEP"
printf '%s\n' -DCMAKE_BUILD_TYPE=Release -DNO_MAN_PAGES=1 -DNO_PYVERBS=1 -DENABLE_STATIC=0 -DENABLE_VALGRIND=0 -DENABLE_RESOLVE_NEIGH=0 -DIOCTL_MODE=both -DCMAKE_INSTALL_PREFIX=/work/main/out/ginplugin/prefix > /work/main/out/ginplugin/prefix/flags/rdma-core.flags
mkdir -p /work/main/out/ginplugin/work/build/rdma-core
GEN=; command -v ninja >/dev/null && GEN=-GNinja
cmake $GEN $(cat /work/main/out/ginplugin/prefix/flags/rdma-core.flags) -S /work/main/out/ginplugin/work/src/rdma-core -B /work/main/out/ginplugin/work/build/rdma-core > /work/main/out/ginplugin/work/rdma-core.cmake.log 2>&1
STEP='rdma-core build'; step "$STEP"
cmake --build /work/main/out/ginplugin/work/build/rdma-core -j 16 > /work/main/out/ginplugin/work/rdma-core.build.log 2>&1
cmake --install /work/main/out/ginplugin/work/build/rdma-core > /dev/null
test -e /work/main/out/ginplugin/prefix/include/infiniband/efadv.h
STEP='libfabric configure'; step "$STEP"
printf '%s\n' --prefix=/work/main/out/ginplugin/prefix --enable-efa=/work/main/out/ginplugin/prefix --enable-shm --disable-verbs --disable-psm2 --disable-psm3 --disable-opx --disable-usnic --disable-ucx --disable-cxi --disable-lpp --disable-tcp --disable-udp --disable-rxm --disable-rxd --disable-sockets --disable-sm2 --disable-monitor --disable-mrail --disable-perf --disable-hook_debug --disable-hook_hmem --disable-dmabuf_peer_mem --disable-trace --disable-profile --disable-lnx > /work/main/out/ginplugin/prefix/flags/libfabric.flags
if [ -f /usr/local/cuda-13.0/include/nvml.h ]; then printf '%s\n' --with-cuda=/usr/local/cuda-13.0 --enable-cuda-dlopen >> /work/main/out/ginplugin/prefix/flags/libfabric.flags; else echo "[ginplugin] no nvml.h under /usr/local/cuda-13.0/include: libfabric without CUDA HMEM (the plugin still compiles GDAKI; EFA-GDA on a real host needs HMEM)"; echo --without-cuda >> /work/main/out/ginplugin/prefix/flags/libfabric.flags; fi
cd /work/main/out/ginplugin/work/src/libfabric
./configure $(cat /work/main/out/ginplugin/prefix/flags/libfabric.flags) > /work/main/out/ginplugin/work/libfabric.configure.log 2>&1
STEP='libfabric build'; step "$STEP"
make -j 16 > /work/main/out/ginplugin/work/libfabric.build.log 2>&1
make install > /dev/null 2>&1
test -e /work/main/out/ginplugin/prefix/include/rdma/fi_ext_efa.h
STEP='aws-ofi-nccl configure'; step "$STEP"
printf '%s\n' --prefix=/work/main/out/ginplugin/prefix --with-libfabric=/work/main/out/ginplugin/prefix --with-cuda=/usr/local/cuda-13.0 --with-gdrcopy=/work/main/out/ginplugin/work/src/gdrcopy --disable-tests --disable-werror > /work/main/out/ginplugin/prefix/flags/aws-ofi-nccl.flags
cd /work/main/out/ginplugin/work/src/aws-ofi-nccl
./configure $(cat /work/main/out/ginplugin/prefix/flags/aws-ofi-nccl.flags) > /work/main/out/ginplugin/work/aws-ofi-nccl.configure.log 2>&1
grep -E 'GDAKI support (enabled|disabled)' /work/main/out/ginplugin/work/aws-ofi-nccl.configure.log || true
STEP='aws-ofi-nccl build'; step "$STEP"
make -j 16 > /work/main/out/ginplugin/work/aws-ofi-nccl.build.log 2>&1
make install > /dev/null 2>&1
STEP='record'; step "$STEP"
cat > /work/main/out/ginplugin/prefix/built.json <<'JSON'
{
  "aws-ofi-nccl": {
    "flags": "flags/aws-ofi-nccl.flags",
    "prefix": "/work/main/out/ginplugin/prefix",
    "rev": "2475c4c736907e68ebeadb3848f31231ee4a44d0",
    "tree": "f7ddf15df23b55f78b0be1f11b63a9184834e9d8"
  },
  "gdrcopy": {
    "flags": "headers only (--with-gdrcopy)",
    "prefix": "/work/main/out/ginplugin/prefix",
    "rev": "c91ad9f178e5fb729fc5b6dc62a77c3bb364d6c9",
    "tree": "62ee051cb11f4284916021c371b5a10df051a2f6"
  },
  "libfabric": {
    "flags": "flags/libfabric.flags",
    "prefix": "/work/main/out/ginplugin/prefix",
    "rev": "5de2d6a2df83595bcc38531cb91bf59495559495",
    "tree": "9e46915894d66f8c367468baf809121e4e181c03"
  },
  "rdma-core": {
    "flags": "flags/rdma-core.flags",
    "prefix": "/work/main/out/ginplugin/prefix",
    "rev": "f272237493ef309984036f7b85655e11104c61c8",
    "tree": "99abc56eee53264382d9e74f3d29ddafb8f9cc81"
  }
}
JSON
step done
