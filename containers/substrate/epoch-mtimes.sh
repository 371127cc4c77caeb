#!/bin/sh
# Make a RUN step's layer the same bytes on every build: the engine's layer tar records each path's mtime, and a
# build writes every path at build time. `epoch-mtimes.sh begin` (first in a RUN) leaves a mark outside the layer
# (/dev/shm) two seconds before the engine made this step's container (the mtime of its /.dockerenv and /etc/mtab,
# or now when earlier); `epoch-mtimes.sh end` (last) sets the mtime of every path of the image's root filesystem newer
# than the mark to $SOURCE_DATE_EPOCH (symlinks themselves, -h), the engine's per-container files (/etc/hosts,
# /etc/hostname, /etc/resolv.conf) and the kernel's file systems left alone. The mark is older than what the engine
# made for the container so that /etc/mtab (and /etc) are touched, and so copied up into the layer, on every build:
# with a mark two seconds before `begin` (as before), a step whose container took longer to start left them out, and
# its layer differed from a faster build's by those two entries (issue 26 item 3: the substrate's pip layer).
# A RUN step must not delete what a lower layer holds (a deletion is a whiteout whose mtime is the build time).
set -eu
mark=/dev/shm/reprostack-epoch-mark
case "${1:-}" in
  begin)
    t=$(date +%s)
    for f in /.dockerenv /etc/mtab; do   # made by the engine with the container, before this step ran
      [ -e "$f" ] || [ -L "$f" ] || continue
      m=$(stat -c %Y "$f") && [ "$m" -lt "$t" ] && t=$m
    done
    touch -d "@$(( t - 2 ))" "$mark" ;;
  end)
    : "${SOURCE_DATE_EPOCH:?epoch-mtimes.sh: SOURCE_DATE_EPOCH is not set}"
    [ -e "$mark" ] || { echo "epoch-mtimes.sh: no mark (run 'begin' first in the same RUN)" >&2; exit 1; }
    find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /etc/hosts -o -path /etc/hostname \
        -o -path /etc/resolv.conf \) -prune -o -newer "$mark" -print0 \
      | xargs -0r touch -h -d "@$SOURCE_DATE_EPOCH"
    rm -f "$mark" ;;
  *) echo "usage: epoch-mtimes.sh begin|end" >&2; exit 2 ;;
esac
