#!/bin/bash
# issue 25 item 5 on the lent H200, in ONE call (< 1 min, no build, no carry): the raw output of every tool the
# preflight node checks read (cluster/nodecheck.py), captured as the tools print it on a real H200 node, and the
# node checks judged on it as preflight judges a node (cluster/preflight.py judge_node).
#
# Run from the repository root on the device:  run(command="bash scripts/device/preflight_nodecheck.sh")
# Needs nothing carried: the readers are stdlib-only (reprostack's own src on PYTHONPATH; cluster.preflight needs
# reprostack's dependencies only for its file readers, which this script does not call: it imports judge_node
# only when they are importable, else it prints the facts alone).
# Into $OUT: nvidia-smi-q-h200.txt, nvidia-smi-h200.txt, nvlink-s-h200.txt, nvcc-h200.txt, fi_info-efa.txt (with its
#   exit code), limits.txt, meminfo.txt, modules.txt (/proc/modules), sys-module.txt (efa / gdrdrv / nvidia* under
#   /sys/module with their version files), dmesg.txt (or why it could not be read), libgdrapi.txt, facts.json (what
#   nodecheck.collect recorded) and checks.txt (one line per check: status and detail, one-node view, profile with
#   8 GPUs and no EFA on this lent node: the EFA checks say not-needed). New fixtures for tests/fixtures/preflight
#   come from these files (cite results/device/... and the date in its README).
set -u
R=$(pwd)
OUTD=${OUT:-$R/out/device}
mkdir -p "$OUTD"
cap() {  # cap FILE CMD...: stdout+stderr of CMD into $OUTD/FILE, its exit code on the last line
  local f=$1; shift
  { "$@" 2>&1; echo "[exit $?]"; } > "$OUTD/$f" 2>&1 || true
}
cap nvidia-smi-q-h200.txt nvidia-smi -q
cap nvidia-smi-h200.txt nvidia-smi
cap nvlink-s-h200.txt nvidia-smi nvlink -s
cap nvcc-h200.txt bash -c 'nvcc --version || /usr/local/cuda/bin/nvcc --version'
cap fi_info-efa.txt fi_info -p efa
cap limits.txt cat /proc/self/limits
cap meminfo.txt cat /proc/meminfo
cap modules.txt cat /proc/modules
cap sys-module.txt bash -c 'for m in efa gdrdrv nvidia nvidia_peermem nvidia_uvm; do d=/sys/module/$m; [ -d $d ] && echo "$m: present, version: $(cat $d/version 2>/dev/null || echo none), initstate: $(cat $d/initstate 2>/dev/null || echo none)" || echo "$m: absent"; done'
cap dmesg.txt bash -c 'dmesg | tail -n 2000'
cap libgdrapi.txt bash -c 'ls -l /usr/lib/x86_64-linux-gnu/libgdrapi.so* /usr/lib64/libgdrapi.so* /usr/local/lib/libgdrapi.so* /opt/gdrcopy/lib*/libgdrapi.so* 2>&1'
PY=$(command -v python3)
PYTHONPATH=$R/src "$PY" - "$OUTD" <<'PYEOF'
import json, sys
from pathlib import Path
from reprostack.cluster import nodecheck
out = Path(sys.argv[1])
facts = nodecheck.collect(need_gpu=True, need_efa=True)
(out / "facts.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")
lines = []
try:
    from reprostack.cluster.preflight import judge_node
except Exception as e:  # reprostack's dependencies absent on this python: the facts alone
    lines.append(f"judge_node not importable here ({type(e).__name__}: {e}); facts.json holds what was read")
else:
    def row(check, node, ok, detail=""):
        lines.append(f"{check}: {ok if isinstance(ok, str) else ('pass' if ok else 'fail')}: {detail}")
    judge_node(facts, 0, row, need_gpu=True, gpus_per_node=len(facts["gpus"]) or 1, efa_devices=0, need_gin=False)
(out / "checks.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"driver {facts['driver_version']} (CUDA {facts['driver_cuda']}), image CUDA {facts['image_cuda']} "
      f"({facts['image_cuda_source']}), {len(facts['gpus'])} GPU(s), gdrdrv {facts['gdrdrv']}, libgdrapi "
      f"{facts['libgdrapi']}, efa module {facts['efa_module']}, memlock {facts['memlock']}, notes: {facts['notes']}")
PYEOF
ls -l "$OUTD"
