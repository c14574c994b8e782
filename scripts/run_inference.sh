#!/usr/bin/env bash
# Evaluate a trained team with the seeds' flags, as a thin wrapper over `satseq eval` (design §10).
#
#   scripts/run_inference.sh --dataset aime24 --checkpoint_dir outputs/sat_seq_dapo \
#       --output_dir results/aime24
#   scripts/run_inference.sh --dataset data/test.jsonl --checkpoint_dir DIR --output_dir OUT
#
#   --dataset          aime24 | aime25 | math (MATH-500) | a .jsonl/.parquet file | synthetic:test
#   --checkpoint_dir   a training output dir (agent_<name>/stage_<k>/) or per-agent HF model dirs
#   --output_dir       where predictions.jsonl, summary.json and inference_config.yaml go
# Any other argument goes to `satseq eval` as it is (e.g. --samples-per-agent 8, --stage 3,
# --set eval.temperature=0.6). SATSEQ names the satseq command (default: satseq on PATH, else
# the repository's .venv).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
satseq="${SATSEQ:-satseq}"
if ! command -v "$satseq" >/dev/null && [[ -x "$root/.venv/bin/satseq" ]]; then
    satseq="$root/.venv/bin/satseq"
fi

args=()
while (($#)); do
    case "$1" in
        --checkpoint_dir) args+=(--checkpoint-dir "${2:?--checkpoint_dir needs a value}"); shift 2 ;;
        --output_dir) args+=(--output-dir "${2:?--output_dir needs a value}"); shift 2 ;;
        --checkpoint_dir=*) args+=(--checkpoint-dir "${1#*=}"); shift ;;
        --output_dir=*) args+=(--output-dir "${1#*=}"); shift ;;
        *) args+=("$1"); shift ;;
    esac
done
exec "$satseq" eval "${args[@]}"
