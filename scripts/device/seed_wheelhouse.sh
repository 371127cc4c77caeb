#!/bin/bash
# Seed the device's wheelhouse with a wheel larger than one call may carry (64 MiB): NCCL's nvidia-nccl-cu13
# 2.30.4 wheel is 212,855,427 bytes, so it travels as 6 parts of <= 36 MiB in git-ignored folders .c1 .c2 ...,
# one part per call, and is put together on the device, where it is checked against the sha256 the lock pins.
# (Smaller does not work: the lock pins the wheel's bytes; lib + include repacked with xz -9 is still ~2/3 of
# the wheel and could not be checked against the lock.)
#
#   here:    bash scripts/device/seed_wheelhouse.sh split [PIN]     (default PIN nccl-wheel)
#            gin-gdaki's NCCL 2.32.3 (305,100,071 bytes = 6 parts of 56 MiB):
#            SEED_PART_BYTES=$((56*1024*1024)) bash scripts/device/seed_wheelhouse.sh split nccl-wheel-2-32
#            fetches the pin's wheel into the cache (sha256-checked against upstreams.lock) and writes
#            .c1/ .c2/ ... each holding one part and a `meta` line: FILENAME PARTS INDEX PART_SHA256 WHEEL_SHA256
#   device:  bash scripts/device/seed_wheelhouse.sh receive         (one call per part, carry: [".cN"])
#            moves each carried part into .cache/wheelhouse-parts/ (its own sha256 checked); once every part
#            is there, joins them into .cache/wheelhouse/FILENAME, checks the sha256 the lock pins for FILENAME
#            (upstreams.lock, `filename:` then `sha256:`) and only then renames it into place.
# .cache/ is git-ignored and kept on the device between calls while the machine stays warm, so the calls must be
# consecutive on one warm machine; `receive` is idempotent and says what is still missing. Every problem is one
# line on stderr and exit 2; nothing half-written stays in .cache/wheelhouse.
set -u
R=$(pwd)
# 36 MiB: a call carries the tracked tree too (about 20 MB in session 15), and 44 MiB parts no longer fitted
PART_BYTES=${SEED_PART_BYTES:-$((36 * 1024 * 1024))}
die() { echo "seed_wheelhouse: $*" >&2; exit 2; }

lock_sha() {  # the sha256 upstreams.lock pins for wheel filename $1 (the line after its `filename:`)
  # compared as a string, never as a regex: a forged `a|b.whl` or `.*` must match no filename line
  awk -v f="$1" '$(NF-1) == "filename:" && $NF == f {want=1; next} want && /sha256:/ {print $NF; exit}' "$R/upstreams.lock"
}

split_wheel() {
  pin=${1:-nccl-wheel}
  py=${PYTHON:-python3}
  cache=${REPROSTACK_CACHE:-$R/.cache/seed-cache}
  "$py" -m reprostack.fetch.wheels "$cache" "$pin" >/dev/null || die "cannot fetch pin $pin (see above)"
  f=$(awk -v p="  $pin:" '$0 == p {inpin=1; next} inpin && /^  [^ ]/ {exit} inpin && /filename:/ {print $NF; exit}' \
      "$R/upstreams.lock")
  [ -n "$f" ] || die "upstreams.lock: no filename for pin $pin"
  sha=$(lock_sha "$f")
  src="$cache/wheels/$sha/$f"
  [ -f "$src" ] || die "$src: not in the cache after fetching"
  [ "$(sha256sum "$src" | cut -d' ' -f1)" = "$sha" ] || die "$src: sha256 is not the lock's $sha"
  rm -rf "$R"/.c[0-9]*
  tmp=$(mktemp -d)
  split -b "$PART_BYTES" -d -a 2 "$src" "$tmp/part-"
  n=$(ls "$tmp" | wc -l)
  i=0
  for p in "$tmp"/part-*; do
    i=$((i + 1))
    mkdir -p "$R/.c$i"
    mv "$p" "$R/.c$i/part"
    echo "$f $n $i $(sha256sum "$R/.c$i/part" | cut -d' ' -f1) $sha" > "$R/.c$i/meta"
    echo ".c$i: part $i/$n of $f ($(stat -c %s "$R/.c$i/part") bytes)"
  done
  rmdir "$tmp"
}

receive() {
  store="$R/.cache/wheelhouse-parts" house="$R/.cache/wheelhouse"
  mkdir -p "$store" "$house"
  for d in "$R"/.c[0-9]*; do
    [ -f "$d/meta" ] || continue
    read -r f n i psha wsha < "$d/meta" || die "$d/meta: unreadable"
    case "$f" in *[!A-Za-z0-9._+-]*|.*|"") die "$d/meta: bad wheel filename '$f'";; esac
    case "$n" in *[!0-9]*|""|0*) die "$d/meta: part numbers must be integers from 1";; esac
    case "$i" in *[!0-9]*|""|0*) die "$d/meta: part numbers must be integers from 1";; esac
    [ "$i" -le "$n" ] && [ "$n" -le 9999 ] || die "$d/meta: part $i of $n is out of range"
    [ "$(sha256sum "$d/part" | cut -d' ' -f1)" = "$psha" ] || die "$d/part: sha256 differs from its meta (torn transfer)"
    [ "$wsha" = "$(lock_sha "$f")" ] || die "$d/meta: $f sha256 $wsha is not the one upstreams.lock pins"
    cp "$d/part" "$store/$f.$n.$i.tmp" && mv "$store/$f.$n.$i.tmp" "$store/$f.$n.$i"
    echo "stored part $i/$n of $f"
  done
  for meta_f in $(ls "$store" 2>/dev/null | sed -n 's/\.[0-9]*\.[0-9]*$//p' | sort -u); do
    f=$meta_f
    n=$(ls "$store" | sed -n "s/^$f\.\([0-9]*\)\.[0-9]*$/\1/p" | sort -u | head -1)
    if [ -f "$house/$f" ]; then echo "$house/$f: present"; continue; fi
    missing=""
    for i in $(seq 1 "$n"); do [ -f "$store/$f.$n.$i" ] || missing="$missing $i"; done
    if [ -n "$missing" ]; then echo "$f: still missing part(s)$missing of $n"; continue; fi
    want=$(lock_sha "$f")
    for i in $(seq 1 "$n"); do cat "$store/$f.$n.$i"; done > "$house/.$f.tmp"
    got=$(sha256sum "$house/.$f.tmp" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then rm -f "$house/.$f.tmp"; die "$f: joined parts have sha256 $got, upstreams.lock pins $want"; fi
    mv "$house/.$f.tmp" "$house/$f" && rm -f "$store/$f.$n."*
    echo "$house/$f: joined from $n parts, sha256 $got (as upstreams.lock pins)"
  done
}

case "${1:-}" in
  split) shift; split_wheel "$@" ;;
  receive) receive ;;
  *) die "usage: $0 split [PIN] | receive" ;;
esac
