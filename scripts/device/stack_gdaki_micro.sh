#!/bin/bash
# Issue 18 item 3: the GPU-initiated stack (lock stack gin-gdaki, docs/stacks.md) built on the lent H200 and gate 1
# run on it at EP1 with both arms, in ONE device call (< 9 min):
#   A (background, niced): `reprostack --stack gin-gdaki stacks plugin`: rdma-core -> libfabric -> aws-ofi-nccl from
#      the stack's verified pins (kernels/ginplugin.py), all cores, then the check that the plugin exports
#      ncclGinPlugin_v14 (compiled only with GDAKI) next to ncclNetPlugin_v*; then a dlopen of the built plugin.
#   B (foreground): `reprostack --stack gin-gdaki gate micro --profile h200-ep1 --arm deepep,dense`: the stack's NCCL
#      (2.32.3 from the wheel alone, lock pin nccl-wheel-2-32: unpacked, no NCCL build) and DeepEP (upstream + the
#      campaign's series) built from the pins against it, test_ep.py at EP1, dense arm.
# What EP1 on one H200 proves: the stack's pins fetch, verify, build and load, and DeepEP V2 runs intranode on the
# stack's NCCL. What it does not: no EFA here, so no GIN traffic, no EFA-GDA and nothing about the transports.
#
# Run from the repository root on the device (no network there). Needs, carried (git-ignored; see docs/stacks.md):
#   $BUNDLE (.carry/sources.tar)  reprostack --stack gin-gdaki bundle -o .carry/gdaki.tar \
#                                   deepep aws-ofi-nccl rdma-core libfabric gdrcopy     (no nccl: a wheel here)
#                                 (BUNDLE=.carry/gdaki.tar when the campaign's bundle is carried as sources.tar)
#   .cache/wheelhouse/nvidia_nccl_cu13-2.32.3-...whl  the stack's NCCL, seeded before this call (305 MB = 6 parts):
#                                 here: SEED_PART_BYTES=$((56*1024*1024)) bash scripts/device/seed_wheelhouse.sh \
#                                 split nccl-wheel-2-32; then one device call per part `seed_wheelhouse.sh receive`
#                                 (carry .cN), consecutive on one warm machine
#   .carry/ginplugin-pregen.tar[.xz]  the generated build systems of libfabric and aws-ofi-nccl (autotools are not on
#                                 the device): reprostack --stack gin-gdaki stacks plugin --autogen-only --out out/pregen
#                                 && tar -cf - -C out/pregen/work/src . | xz -T0 -9 > .carry/ginplugin-pregen.tar.xz
#                                 (58 MB as a plain tar, 4.5 MB with xz: it must fit one call's 64 MiB with the rest)
#                                 (each tree stamped with the rev and tree it came from; checked against the lock here)
#   .carry/debs/*.deb             optional: hwloc for the plugin's configure if the device has none
#                                 (apt-get download libhwloc-dev libhwloc15 libudev1); unpacked under /tmp, never /
#   .whl/*.whl                    reprostack's own dependencies (README: "A GPU node without internet")
# Into $OUT: micro.json, summary.md, cli.log, wall.txt, plugin.log, plugin-exports.txt, plugin-dlopen.txt, built.json,
# preflight.txt, stack-gdaki.tar (reports, raw logs, build logs, the plugin chain's flags and logs).
set -u
# the commit of this copy of the project (no .git here): scripts/device/project_stamp.sh wrote it, reports record it
if [ -f .carry/project-stamp.txt ]; then export REPROSTACK_PROJECT_STAMP=$PWD/.carry/project-stamp.txt; fi
R=$(pwd)
STACK=${STACK:-gin-gdaki}
BUNDLE=${BUNDLE:-.carry/sources.tar}
PREGEN=.carry/ginplugin-pregen.tar; [ -f "$PREGEN" ] || PREGEN=.carry/ginplugin-pregen.tar.xz
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # lender's rule
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
OUTD=${OUT:-$R/out/device}
D=out/stack-gdaki
T=/tmp/ginplugin-tools
PLUGIN_ENV=()
mkdir -p "$OUTD" "$D" "$T/bin"
t0=$(date +%s)
for f in "$BUNDLE" "$PREGEN"; do
  [ -f "$f" ] || { echo "missing $f (scripts/device/stack_gdaki_micro.sh header says how to make it)" >&2; exit 2; }
done
ls .whl/*.whl >/dev/null 2>&1 || { echo "missing .whl/*.whl (reprostack's dependencies)" >&2; exit 2; }
WHEELS=$(ls .whl/*.whl | grep -v '/reprostack-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
export REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse:$R/.whl   # the NCCL wheel (seeded) is checked against the lock
RS() { PYTHONPATH=$R/src:/tmp/site "$PY" -m reprostack --stack "$STACK" "$@"; }

# ---- preflight: what the chain needs; fill gaps from what was carried, under $T only
{
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  for t in cmake ninja make cc c++ nvcc nm perl pkg-config autoreconf; do
    printf '%-11s %s\n' "$t" "$(command -v $t || echo MISSING)"; done
  ls /usr/include/hwloc.h 2>/dev/null || echo "hwloc.h     MISSING in /usr/include"
} > "$D/preflight.txt" 2>&1
if ! command -v pkg-config >/dev/null; then
  # rdma-core's cmake requires a pkg-config program; no module it needs here is looked up with it (libnl is off:
  # -DENABLE_RESOLVE_NEIGH=0), so one that knows no module is enough
  printf '#!/bin/sh\ncase "$1" in --version) echo 0.29.2 ;; *) exit 1 ;; esac\n' > "$T/bin/pkg-config"
  chmod +x "$T/bin/pkg-config"; echo "pkg-config: stand-in that knows no module ($T/bin)" >> "$D/preflight.txt"
fi
if [ ! -f /usr/include/hwloc.h ] && ls .carry/debs/*.deb >/dev/null 2>&1; then
  for f in .carry/debs/*.deb; do dpkg-deb -x "$f" "$T/root"; done
  ML=$T/root/usr/lib/x86_64-linux-gnu   # used by the plugin build and its dlopen only, never by the gate
  PLUGIN_ENV=(CPPFLAGS="-I$T/root/usr/include" LDFLAGS="-L$ML" LD_LIBRARY_PATH="$ML${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  echo "hwloc: carried debs under $T/root" >> "$D/preflight.txt"
fi
export PATH=$T/bin:$PATH
cat "$D/preflight.txt"
rm -rf /tmp/ginplugin-pregen && mkdir -p /tmp/ginplugin-pregen && tar -xf "$PREGEN" -C /tmp/ginplugin-pregen

# ---- A: the GIN plugin chain, in the background (niced: the gate's NCCL build is the long pole)
( export REPROSTACK_CACHE=/tmp/reprostack-cache-plugin GINPLUGIN_PREGEN=/tmp/ginplugin-pregen
  tA=$(date +%s)
  timeout -k 10 470 nice -n 10 env "${PLUGIN_ENV[@]}" PYTHONPATH="$R/src:/tmp/site" "$PY" -m reprostack --stack "$STACK" stacks plugin \
    --offline --bundle "$BUNDLE" --out out/ginplugin
  echo "plugin rc=$? wall_s=$(( $(date +%s) - tA ))" ) > "$D/plugin.log" 2>&1 &
PA=$!

# ---- B: gate micro at EP1, both arms, on the stack
export REPROSTACK_CACHE=${REPROSTACK_CACHE:-/tmp/reprostack-cache}
tB=$(date +%s)
RS stacks 2>&1 | tee "$D/stacks.txt"
PYTHONPATH=$R/src:/tmp/site timeout -k 10 "${GATE_TIMEOUT:-480}" "$PY" -m reprostack --stack "$STACK" gate micro \
  --profile h200-ep1 --arm deepep,dense --offline --bundle "$BUNDLE" --out "$D" --python "$PY" \
  --timeout "${1:-180}" > "$D/cli.log" 2>&1
rc=$?
echo "gate rc=$rc wall_s=$(( $(date +%s) - tB ))" | tee "$D/wall.txt"
wait $PA
cat "$D/plugin.log" | grep -v "^Running" | tail -15
tail -1 "$D/plugin.log" >> "$D/wall.txt"

# ---- the plugin: exports and a dlopen with its libfabric / rdma-core
P=out/ginplugin/prefix
RS stacks check-plugin "$P/lib" > "$D/plugin-exports.txt" 2>&1; prc=$?
nm -D --defined-only "$P"/lib/libnccl-net*.so 2>/dev/null | grep -E ' (ncclGinPlugin|ncclNetPlugin|ncclRmaPlugin)_v' \
  >> "$D/plugin-exports.txt"
env "${PLUGIN_ENV[@]}" LD_LIBRARY_PATH="$R/$P/lib:$R/$P/lib64:${ML:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$PY" - "$R/$P/lib/libnccl-net-ofi.so" \
  > "$D/plugin-dlopen.txt" 2>&1 <<'EOF'
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
for s in ("ncclGinPlugin_v14", "ncclNetPlugin_v10", "ncclRmaPlugin_v15"):
    try:
        getattr(lib, s); print(f"dlopen ok: {s} resolves")
    except AttributeError:
        print(f"dlopen ok: {s} absent")
EOF
echo "check-plugin rc=$prc" | tee -a "$D/wall.txt"
cat "$D/plugin-exports.txt" "$D/plugin-dlopen.txt"
echo "total wall_s=$(( $(date +%s) - t0 ))" | tee -a "$D/wall.txt"

tail -4 "$D/cli.log"
grep -v "^Running NVCC" "$D/micro/test_ep.log" 2>/dev/null | tail -6
grep "^\[dense_a2a\]" "$D/micro/dense_a2a.log" 2>/dev/null | tail -3
mkdir -p "$D/buildlogs" "$D/ginplugin"
for b in "$REPROSTACK_CACHE"/builds/*/; do
  [ -f "$b/build.log" ] && cp "$b/build.log" "$D/buildlogs/$(basename "$b").build.log"
done
cp -r out/ginplugin/work/*.log "$P/flags" "$P/built.json" out/ginplugin/build-plugin.sh "$D/ginplugin/" 2>/dev/null
tar -cf "$OUTD/stack-gdaki.tar" -C out stack-gdaki
for f in micro.json summary.md cli.log wall.txt plugin.log plugin-exports.txt plugin-dlopen.txt preflight.txt \
         stacks.txt ginplugin/built.json; do
  [ -f "$D/$f" ] && cp "$D/$f" "$OUTD/$(basename "$f")"
done
[ "$rc" = 0 ] && [ "$prc" = 0 ] && exit 0
[ "$rc" != 0 ] && exit "$rc"
exit 4  # the gate passed, the plugin chain did not
