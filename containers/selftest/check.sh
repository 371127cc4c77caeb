#!/bin/sh
# Runs inside the build: the context arrived with fixed owners/modes and the build has no network.
set -eu
d=/opt/reprostack/selftest
test "$1" = strict
test -s "$d/hello.txt"
test -x "$d/check.sh"
test "$(stat -c %u:%g "$d/hello.txt")" = 0:0
test "$(stat -c %a "$d/hello.txt")" = 644
# network_mode=none: the loopback device only
test "$(ls /sys/class/net)" = lo
sha256sum "$d/hello.txt" > /opt/reprostack/selftest.sha256
echo "selftest: ok"
