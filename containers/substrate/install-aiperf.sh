#!/bin/sh
# install-aiperf.sh WHEELS VENV: the pinned AIPerf with its whole closure (pin aiperf-wheels, CPython 3.11: the
# chain's interpreter) into its own venv VENV, apart from the engine's /opt/venv (AIPerf pins rich~=14.1 and its own
# transformers; the engines pin others): --no-index --no-deps --require-hashes, exactly the lock's files, checked
# installed-vs-lock; then the marker reprostack.gates.aiperftool accepts for a prebuilt venv (REPROSTACK_AIPERF_VENV):
# the version installed and the sha256 of the aiperf wheel it came from, hashed here. No .pyc written (each build the
# same bytes); the serving images (vllm, sglang) run it, with REPROSTACK_AIPERF_VENV=VENV in their ENV.
set -eu
wheels=$1 venv=$2
export PYTHONDONTWRITEBYTECODE=1
/usr/bin/python3 -m venv "$venv"
"$venv/bin/pip" install --no-index --find-links "$wheels" --no-deps --require-hashes --no-cache-dir --no-compile \
  -r "$wheels/requirements.txt"
mkdir -p /opt/reprostack/pins
cp "$wheels/pins.json" /opt/reprostack/pins/aiperf-wheels.json
"$venv/bin/python3" /opt/reprostack/bin/check-pins.py /opt/reprostack/pins/aiperf-wheels.json
set -- "$wheels"/aiperf-*.whl
[ "$#" = 1 ] && [ -f "$1" ] || { echo "install-aiperf: expected one aiperf wheel in $wheels, found: $*" >&2; exit 1; }
sha=$(sha256sum "$1" | cut -d' ' -f1)
ver=$("$venv/bin/python3" -c 'from importlib.metadata import version; print(version("aiperf"))')
printf '{"version": "%s", "sha256": "%s", "wheel": "%s"}\n' "$ver" "$sha" "$(basename "$1")" > "$venv/.reprostack-verified.json"
"$venv/bin/python3" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("aiperf") is None)' && test -x "$venv/bin/aiperf"
echo "install-aiperf: aiperf $ver ($(basename "$1") sha256 $sha) in $venv"
