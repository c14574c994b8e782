#!/usr/bin/env bash
# The seeds' DAPO training entry point: a thin wrapper over `satseq train configs/sat_seq.yaml`.
#
# Environment (each optional; an unset one keeps the config's value):
#   NUM_STAGES                      trainer.stages
#   TRAIN_BATCH_SIZE                trainer.batch_size (prompts per stage)
#   PPO_MINI_BATCH_SIZE             trainer.mini_batch_size, converted: verl counts it in prompts,
#                                   each with its responses, satseq in trajectories, so it is
#                                   PPO_MINI_BATCH_SIZE × the run's sat_seq.group_size (a --set
#                                   among the arguments, or the config's)
#   PPO_EPOCHS                      trainer.ppo_epochs: passes over a stage's batch
#   AGENT1_PATH, AGENT2_PATH, ...   model of the 1st, 2nd, ... agent (sat_seq.agents.<i-1>.path):
#                                   a local HF model directory or a hub name
#   CONFIG                          the config file (default: configs/sat_seq.yaml of this repo)
#   OUTPUT_DIR                      --output-dir (default: output.dir/output.exp_name)
#   RAY_ADDRESS                     the Ray cluster to join (read by satseq; default: a local one)
#   DRY_RUN=1                       print the command instead of running it
# Arguments are passed on to `satseq train`, e.g. --resume or --set rollout.engine=hf.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
config="${CONFIG:-$repo_root/configs/sat_seq.yaml}"
command=(satseq train "$config")

if [[ -n "${NUM_STAGES:-}" ]]; then
  command+=(--set "trainer.stages=$NUM_STAGES")
fi
if [[ -n "${TRAIN_BATCH_SIZE:-}" ]]; then
  command+=(--set "trainer.batch_size=$TRAIN_BATCH_SIZE")
fi
# AGENT<k>_PATH for every k that is set, in numeric order (AGENT10 after AGENT9).
for variable in $(compgen -e | grep -E '^AGENT[0-9]+_PATH$' | sort -V || true); do
  number="${variable//[!0-9]/}"
  if ((10#$number < 1)); then
    echo "train_dapo.sh: $variable: agents are numbered from 1 (AGENT1_PATH)" >&2
    exit 2
  fi
  command+=(--set "sat_seq.agents.$((10#$number - 1)).path=${!variable}")
done
if [[ -n "${PPO_EPOCHS:-}" ]]; then
  command+=(--set "trainer.ppo_epochs=$PPO_EPOCHS")
fi
if [[ -n "${OUTPUT_DIR:-}" ]]; then
  command+=(--output-dir "$OUTPUT_DIR")
fi
command+=("$@")
if [[ -n "${PPO_MINI_BATCH_SIZE:-}" ]]; then  # the run's group size: a --set among them, or the file's
  satseq=satseq
  source "$repo_root/scripts/run_settings.sh"
  group_size="$(run_setting "$config" sat_seq.group_size "${command[@]:3}")"
  command+=(--set "trainer.mini_batch_size=$((PPO_MINI_BATCH_SIZE * group_size))")
fi

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${command[@]}"
  echo
  exit 0
fi
exec "${command[@]}"
