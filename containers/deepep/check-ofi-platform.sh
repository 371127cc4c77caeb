#!/bin/sh
# check-ofi-platform.sh CONFIGURE_LOG PLATFORM: aws-ofi-nccl's configure summary (the `* Enabled Platforms: ...` line
# configure.ac prints last) in CONFIGURE_LOG must list PLATFORM (AWS: --enable-platform-aws took effect, the p5en
# topology and tunings are built in). Exit 1 naming the line configure printed, or its absence.
set -eu
log=$1 want=$2
line=$(sed -n 's/^\* Enabled Platforms: //p' "$log" | tail -n 1)
[ -n "$line" ] || { echo "check-ofi-platform: $log has no '* Enabled Platforms:' line (not aws-ofi-nccl's configure output?)" >&2; exit 1; }
case ", $line," in
  *", $want,"*) echo "check-ofi-platform: Enabled Platforms: $line" ;;
  *) echo "check-ofi-platform: configure says 'Enabled Platforms: $line', not $want ($log)" >&2; exit 1 ;;
esac
