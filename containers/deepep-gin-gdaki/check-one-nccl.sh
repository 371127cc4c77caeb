#!/bin/sh
# Exactly one NCCL for the process (docs/campaign.md: torch's own libnccl.so.2 first -> missing
# ncclCommQueryProperties; LD_PRELOAD trips DeepEP's duplicate-runtime check): the venv's nvidia/nccl
# must resolve to the pinned build given as $1.
set -eu
want="$1"
test -f "$want"
found=$(python3 - <<'PY'
import glob, os, site
hits = []
for d in site.getsitepackages():
    hits += glob.glob(os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so*"))
print("\n".join(sorted(hits)))
PY
)
for f in $found; do
  if ! cmp -s "$f" "$want"; then
    echo "check-one-nccl: $f is not the pinned NCCL $want (two NCCLs would load)" >&2
    exit 1
  fi
done
echo "check-one-nccl: ok ($want)"
