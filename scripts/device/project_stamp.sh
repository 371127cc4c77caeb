#!/bin/bash
# Write .carry/project-stamp.txt on the machine that has the git checkout, before a device call: the commit (line 1)
# and `git ls-tree -r` of it. The device gets the working tree's files without .git; with
# REPROSTACK_PROJECT_STAMP=.carry/project-stamp.txt (the device scripts export it when the file is there) every
# report records that commit and whether the copied files are its files (reprostack.project: each tracked file is
# hashed there as a git blob and compared), never a commit it cannot back.
#
#   bash scripts/device/project_stamp.sh        (then carry .carry with the call)
set -eu
cd "$(git rev-parse --show-toplevel)"
mkdir -p .carry
{ git rev-parse --verify 'HEAD^{commit}'; git ls-tree -r HEAD; } > .carry/project-stamp.txt
if [ -n "$(git status --porcelain --untracked-files=normal)" ]; then
  echo "project_stamp: the tree differs from $(git rev-parse --short HEAD) (git status): the device's reports will say dirty" >&2
fi
echo "project_stamp: .carry/project-stamp.txt ($(git rev-parse --short HEAD), $(($(wc -l < .carry/project-stamp.txt) - 1)) files)"
