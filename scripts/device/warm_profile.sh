#!/bin/bash
# Where the warm micro test's seconds go (issue 17): builds once (gate micro --trials 1, cold cache), then runs the
# gate's own test command again, warm, under py-spy (all processes, 50 samples/s) and prints the frames that hold the
# most wall time (inclusive), plus a warm gate at K=1 next to K=5 (what one trial costs). Diagnostic, not a gate.
# Run on the lent H200 from the repository root, in one call after the NCCL wheel was seeded like for
# bench_gate_micro.sh (a last part .cN carried with this call is joined first); carry also .carry/sources.tar, .whl
# and .diag (the py-spy wheel: pip download py-spy --only-binary=:all: into .diag/).
# Into $OUT: warm.collapsed (py-spy raw stacks), top.txt, prof.log.
set -u
R=$(pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
OUTD=${OUT:-$R/out/device}; mkdir -p "$OUTD"
ls .c[0-9]*/meta >/dev/null 2>&1 && { bash scripts/device/seed_wheelhouse.sh receive || exit 2; }
WHEELS=$(ls .whl/*.whl .diag/*.whl | grep -v '/reprostack-')
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHEELS || exit 1
export PYTHONPATH=$R/src:/tmp/site REPROSTACK_WHEELHOUSE=$R/.cache/wheelhouse:$R/.whl REPROSTACK_CACHE=/tmp/prof-cache
G=(-m reprostack gate micro --profile h200-ep1 --offline --bundle .carry/sources.tar --python "$PY")
# PROF_FROM=<the --out of a finished warm gate run on this machine> (e.g. out/bench/gate_micro/warm after
# bench_gate_micro.sh): profile that run's test command again, no builds here
PROF_FROM=${PROF_FROM:-}
{
[ -n "$PROF_FROM" ] || {
t=$(date +%s); "$PY" "${G[@]}" --trials 1 --out out/prof/cold >/dev/null 2>&1; echo "cold K=1 rc=$? wall $(( $(date +%s)-t )) s"
t=$(date +%s); "$PY" "${G[@]}" --trials 1 --out out/prof/k1 >/dev/null 2>&1; echo "warm K=1 rc=$? wall $(( $(date +%s)-t )) s"
t=$(date +%s); "$PY" "${G[@]}" --trials 5 --out out/prof/k5 >/dev/null 2>&1; echo "warm K=5 rc=$? wall $(( $(date +%s)-t )) s"
for d in cold k1 k5; do "$PY" -c "import json,sys; r=json.load(open('out/prof/$d/micro.json')); print('$d', r['result'], r['data'].get('timings_s'))"; done
}
"$PY" - "$OUTD" "${PROF_FROM:-out/prof/k5}" <<'PYEOF'
import json, os, subprocess, sys, time, collections
out = sys.argv[1]
r = json.load(open(os.path.join(sys.argv[2], "micro.json")))
cmd, env = r["data"]["command"], dict(os.environ, **r["data"]["env"])
t = time.monotonic()
p = subprocess.run(["/tmp/site/bin/py-spy", "record", "--subprocesses", "--idle", "-r", "50", "--format", "raw",
                    "-o", f"{out}/warm.collapsed", "--", *cmd], env=env, capture_output=True, text=True)
print(f"py-spy warm K=5 test: rc {p.returncode}, wall {time.monotonic() - t:.1f} s"); print(p.stderr[-1500:])
incl, total = collections.Counter(), collections.Counter()
for line in open(f"{out}/warm.collapsed"):
    stack, _, n = line.rstrip().rpartition(" ")
    frames = stack.split(";"); n = int(n); total[frames[0]] += n
    for f in set(frames):
        incl[f] += n
with open(f"{out}/top.txt", "w") as f:
    for k, v in total.items(): print(f"process {k}: {v / 50:.1f} s", file=f)
    for k, v in incl.most_common(60): print(f"{v / 50:8.1f} s  {k}", file=f)
print(open(f"{out}/top.txt").read())
PYEOF
} 2>&1 | tee "$OUTD/prof.log"
