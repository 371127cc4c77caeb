#!/bin/bash
# Apply reprostack's SGLang seam (patches/sglang/0001: the DeepEP normal-mode dispatcher on DeepEP V2's ElasticBuffer)
# onto an installed SGLang 0.5.11, i.e. onto the pinned wheel's files where pip put them (an overlay: the image / host
# install keeps the pinned wheel, sha256-checked against upstreams.lock, and replaces that one file by the patched one).
#
#   bash scripts/device/sglang_seam.sh SITE      # SITE: the folder holding sglang/ (site-packages, pip --target)
#
# Checked, never guessed: the installed file must be the wheel's (its git blob is the base blob of the patch's `index`
# line), the patch applies with zero fuzz (`git apply`: no fuzz, no --3way, no reject, whitespace never fixed), and the
# result must be the patch's target blob. A file already at the target blob is left as it is (exit 0, said so).
# Any other file: one line naming it and both blobs, exit 2, nothing written.
set -u
SITE=${1:?usage: sglang_seam.sh SITE (the folder holding sglang/)}
SITE=$(cd "$SITE" 2>/dev/null && pwd) || { echo "sglang_seam: $1: no such folder" >&2; exit 2; }
R=$(cd "$(dirname "$0")/../.." && pwd)
PATCH=$R/patches/sglang/0001-deepep-normal-dispatcher-on-DeepEP-V2-ElasticBuffer.patch
REL=sglang/srt/layers/moe/token_dispatcher/deepep.py   # python/$REL in the SGLang repository, $REL in the wheel
F=$SITE/$REL
[ -f "$F" ] || { echo "sglang_seam: $F: no such file (is SGLang 0.5.11 installed in $SITE?)" >&2; exit 2; }
read -r BASE TARGET < <(sed -n 's/^index \([0-9a-f]\{40\}\)\.\.\([0-9a-f]\{40\}\) .*/\1 \2/p' "$PATCH")
[ -n "${TARGET:-}" ] || { echo "sglang_seam: $PATCH: no full-index line (git format-patch --full-index)" >&2; exit 2; }
HAVE=$(git hash-object "$F")
if [ "$HAVE" = "$TARGET" ]; then
  echo "sglang_seam: $F is already the patched file (blob $TARGET)"
  exit 0
fi
if [ "$HAVE" != "$BASE" ]; then
  echo "sglang_seam: $F is blob $HAVE, not the pinned wheel's $BASE (nor the patched $TARGET): not patched" >&2
  exit 2
fi
# -p2: the patch names python/sglang/...; the install has sglang/... GIT_CEILING_DIRECTORIES: SITE is never taken
# for a folder of some repository above it.
KEEP=$(mktemp)
cp "$F" "$KEEP"
(cd "$SITE" && GIT_CEILING_DIRECTORIES=$(dirname "$SITE") git apply -p2 --whitespace=nowarn "$PATCH") || {
  rm -f "$KEEP"; echo "sglang_seam: $PATCH does not apply with zero fuzz onto $F" >&2; exit 2; }
GOT=$(git hash-object "$F")
if [ "$GOT" != "$TARGET" ]; then
  cp "$KEEP" "$F"; rm -f "$KEEP"
  echo "sglang_seam: $F became blob $GOT, not the patch's $TARGET (the wheel's file put back)" >&2
  exit 2
fi
rm -f "$KEEP"
rm -rf "$SITE/sglang/srt/layers/moe/token_dispatcher/__pycache__"
echo "sglang_seam: $F patched: blob $BASE -> $TARGET ($(basename "$PATCH"))"
