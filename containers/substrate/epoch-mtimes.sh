#!/bin/sh
# Make a RUN step's layer the same bytes on every build: the engine's layer tar records each path's mtime, and a
# build writes every path at build time. `epoch-mtimes.sh begin` (first in a RUN) leaves a mark two seconds in the
# past outside the layer (/dev/shm); `epoch-mtimes.sh end` (last) sets the mtime of every path of the image's root
# filesystem newer than the mark to $SOURCE_DATE_EPOCH (symlinks themselves, -h), the engine's per-container files
# (/etc/hosts, /etc/hostname, /etc/resolv.conf) and the kernel's file systems left alone. A RUN step must not delete
# what a lower layer holds (a deletion is a whiteout whose mtime is the build time).
set -eu
mark=/dev/shm/reprostack-epoch-mark
case "${1:-}" in
  begin) touch -d "@$(( $(date +%s) - 2 ))" "$mark" ;;
  end)
    : "${SOURCE_DATE_EPOCH:?epoch-mtimes.sh: SOURCE_DATE_EPOCH is not set}"
    [ -e "$mark" ] || { echo "epoch-mtimes.sh: no mark (run 'begin' first in the same RUN)" >&2; exit 1; }
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /etc/hosts -o -path /etc/hostname \
        -o -path /etc/resolv.conf \) -prune -o -newer "$mark" -print0 \
      | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"
    rm -f "$mark" ;;
  *) echo "usage: epoch-mtimes.sh begin|end" >&2; exit 2 ;;
esac
