#!/bin/bash
# A serving engine's locked wheels to the lent H200 in parts, checked against upstreams.lock there before anything is
# installed (issue 28 item 2). The work is scripts/device/engine_carry.py (its doc says how); what travels is
# scripts/device/carry/ENGINE.txt; the sizes of the last split are in results/carry/ENGINE-h200.json.
#
#   here:    bash scripts/device/seed_engine.sh split vllm       # .e1/ .e2/ ... (git-ignored), <= 54 MiB each
#   device:  bash scripts/device/seed_engine.sh receive          # one call per part, carry: [".eN"]; idempotent
#            bash scripts/device/seed_engine.sh install vllm SITE AIPERF_VENV
#                                                                # re-hash every wheel against the lock, then
#                                                                # pip --no-index --no-deps --target SITE, and the
#                                                                # pinned AIPerf's venv (REPROSTACK_AIPERF_VENV)
# The calls must follow each other on one warm machine (it is given back after ~30 s idle; .cache/ lives only there).
# A split with the NCCL wheel's seeding (seed_wheelhouse.sh, folders .cN) can share a call: both carry <= 64 MiB.
# Every problem is one line on stderr and exit 2.
set -u
R=$(pwd)
HERE_PY=${PYTHON:-$R/.venv/bin/python}
DEV_PY=${REPROSTACK_TORCH_PYTHON:-/opt/torch/.venv/bin/python3}
[ -x "$DEV_PY" ] || DEV_PY=$(command -v python3)
case "${1:-}" in
  split)
    shift
    [ -x "$HERE_PY" ] || HERE_PY=$(command -v python3)
    exec "$HERE_PY" "$R/scripts/device/engine_carry.py" split "$@" ;;
  receive)
    exec "$DEV_PY" "$R/scripts/device/engine_carry.py" receive ;;
  install)
    [ $# -eq 4 ] || { echo "seed_engine: usage: $0 install ENGINE SITE AIPERF_VENV" >&2; exit 2; }
    exec "$DEV_PY" "$R/scripts/device/engine_carry.py" install "$2" --site "$3" --aiperf-venv "$4" --python "$DEV_PY" ;;
  *)
    echo "seed_engine: usage: $0 split ENGINE [--part-bytes N] [--record FILE] | receive | install ENGINE SITE AIPERF_VENV" >&2
    exit 2 ;;
esac
