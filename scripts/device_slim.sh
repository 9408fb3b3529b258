#!/usr/bin/env bash
# Reproduces: no result itself; the step before every GPU run that reproduces one (scripts/gpu_run.sh,
#   scripts/gpu_smollm2.sh), as docs/cuda.md ("The prepared GPU run") tells.
# Run: scripts/device_slim.sh enter (before the device calls), scripts/device_slim.sh leave (after them).
#
# Make the checkout small enough for a GPU device run, and back.
#
# A device run carries the checkout's tracked and untracked-not-ignored files, at most 64 MiB; the tracked tree is
# about 130 MB (model_cards/ 102 MB, data/ 18 MB). `enter` switches to a local branch on which model_cards/ and data/
# are untracked and ignored (their files stay on disk, untouched), so about 10 MB travels; a run then names what it
# needs of them in `carry` (one checkpoint folder, or a part of the data), up to the same limit. `leave` switches
# back to the branch it came from and deletes the local branch. Nothing is pushed; the files never change.
#
#   scripts/device_slim.sh enter    # before the device runs
#   scripts/device_slim.sh leave    # after them (commit work on the real branch only)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SLIM=device-slim
EXCLUDE=.git/info/exclude
MARK="# device_slim.sh"
HEAVY=(model_cards data)

case "${1:-}" in
  enter)
    [ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "commit or stash your changes first" >&2; exit 1; }
    git rev-parse --abbrev-ref HEAD > .git/device_slim_from
    git switch -q -c "$SLIM"
    git rm -r -q --cached "${HEAVY[@]}"
    { echo "$MARK begin"; for path in "${HEAVY[@]}"; do echo "/$path/"; done; echo "$MARK end"; } >> "$EXCLUDE"
    git commit -q -m "device run: ${HEAVY[*]} untracked (local branch, never pushed)"
    size=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
    echo "on $SLIM: $((size / 1048576)) MiB tracked; name what the run needs of ${HEAVY[*]} in carry" ;;
  leave)
    from=$(cat .git/device_slim_from)
    git switch -q "$from"  # while the heavy folders are still ignored: git restores them as tracked files
    sed -i "/^$MARK begin\$/,/^$MARK end\$/d" "$EXCLUDE"
    git branch -q -D "$SLIM"
    rm -f .git/device_slim_from
    echo "back on $from" ;;
  *)
    echo "usage: $0 enter|leave" >&2; exit 2 ;;
esac
