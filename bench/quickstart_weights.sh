#!/usr/bin/env bash
# Does a refactor leave training as it was? For each COMMIT, train the embedded default
# (configs/quickstart.yaml) for 3 stages in a scratch worktree at that commit, with this
# checkout's .venv, and print one digest of every agent's saved weights (the safetensors of
# stages 0-2). Equal digests: the same weights bit for bit. Not a timed test: ~70 s a commit
# on 2 idle cores.
#
#   bench/quickstart_weights.sh 56a8f89 de9fa25 HEAD
set -euo pipefail
repo=$(git rev-parse --show-toplevel)
scratch=$(mktemp -d "$repo/.quickstart_weights.XXXX")
trap 'git -C "$repo" worktree remove --force "$scratch/tree" >/dev/null 2>&1; rm -rf "$scratch"' EXIT
git -C "$repo" worktree add --detach -q "$scratch/tree" HEAD
for commit in "$@"; do
    sha=$(git -C "$repo" rev-parse --short "$commit")
    git -C "$scratch/tree" checkout -q "$sha"
    out="$scratch/run-$commit"
    (cd "$scratch/tree" && PYTHONPATH="$scratch/tree" "$repo/.venv/bin/satseq" train \
        --output-dir "$out" --set trainer.stages=3 --set trainer.val_every=3 >"$out.log" 2>&1) ||
        { echo "$commit: training failed, see $out.log" >&2; trap - EXIT; exit 1; }
    digest=$(cd "$out" && find agent_* -name '*.safetensors' | sort | xargs sha256sum | sha256sum)
    echo "$sha ${digest:0:16}"
done
