#!/usr/bin/env bash
# GRPO or SPO training with the seeds' environment variables (recipe/spo/train.sh), as a thin
# wrapper over `satseq train configs/grpo.yaml|configs/spo.yaml --set ...` (design §10).
#
#   METHOD=SPO OUTPUT_DIR=outputs TRAIN_DATA_DIR=splits MODEL_PATH=Qwen/Qwen3-8B \
#     EXP_NAME=spo_training OFFLINE_VALUES=splits/offline_values.json scripts/train.sh
#   METHOD=SPO DEBUG=1 scripts/train.sh        # a tiny run on the CPU in a minute or two
#
# Each variable that is set (non-empty) becomes one --set; an unset one keeps the config's value.
#   METHOD           GRPO (the default, as in the seeds) -> configs/grpo.yaml; SPO -> configs/spo.yaml
#   OUTPUT_DIR       output.dir (the run writes OUTPUT_DIR/EXP_NAME)
#   EXP_NAME         output.exp_name
#   TRAIN_DATA_DIR   data.train: the directory of subset_<i>.parquet that `satseq offline-values
#                    split` wrote (all of them are read), or one .jsonl/.parquet file
#   MODEL_PATH       team.agents.0.path: HF directory, Hub name, or builtin:tiny
#   OFFLINE_VALUES   spo.offline_values: the JSON of `satseq offline-values merge` (SPO only)
#   N_TRAIN          grpo.group_size: responses per prompt (GRPO only; SPO samples one)
#   N_VAL            eval.samples_per_agent: samples per validation prompt (validation runs
#                    every trainer.val_every stages on data.val_files)
#   RESPONSE_LENGTH  rollout.max_new_tokens
#   PPO_MINI_BATCH_SIZE  trainer.mini_batch_size, converted: verl counts a mini-batch in prompts,
#                    each with its responses, satseq in trajectories, so GRPO's is
#                    PPO_MINI_BATCH_SIZE × the run's grpo.group_size (N_TRAIN, a --set among the
#                    arguments, or the config's) and
#                    SPO's (one response a prompt) PPO_MINI_BATCH_SIZE
#   PPO_EPOCHS       trainer.ppo_epochs: passes over a stage's batch
#   DEBUG            1 (or True): builtin:tiny on synthetic arithmetic, HF engine on the CPU,
#                    2 stages of 4 prompts; the variables above still override it
#   DRY_RUN          1: print the command and exit without running it
# Arguments are passed on to `satseq train`, e.g. --resume or --set trainer.lr=1e-6.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

is_true() {
    case "${1,,}" in
        1 | true | yes) return 0 ;;
        "" | 0 | false | no) return 1 ;;
        *) echo "error: $2=$1: use 1/True or 0/False" >&2; exit 2 ;;
    esac
}

# A YAML single-quoted string, so that --set keeps a value such as 'null' or '0123' as text.
yaml_string() {
    local quote="'"
    printf "'%s'" "${1//$quote/$quote$quote}"
}

METHOD="${METHOD:-GRPO}"
case "${METHOD^^}" in
    GRPO) config="$root/configs/grpo.yaml" ;;
    SPO) config="$root/configs/spo.yaml" ;;
    *) echo "error: METHOD=$METHOD: use GRPO or SPO" >&2; exit 2 ;;
esac

overrides=()
if is_true "${DEBUG:-0}" DEBUG; then
    overrides+=(
        team.agents.0.path=builtin:tiny
        data.train=synthetic
        data.synthetic.split=test data.synthetic.n_train=16
        data.synthetic.difficulty=1 data.synthetic.style=symbols
        rollout.engine=hf rollout.max_new_tokens=48
        rollout.resources.num_cpus=0.5 rollout.resources.num_gpus=0
        trainer.stages=2 trainer.batch_size=4 trainer.micro_batch_size=4
        trainer.lr=3.0e-4 trainer.dtype=auto
        trainer.resources.num_cpus=0.5 trainer.resources.num_gpus=0
        spo.candidate_pool_size=8
        output.exp_name="debug_${METHOD,,}"
    )
fi
[[ -n "${OUTPUT_DIR:-}" ]] && overrides+=("output.dir=$(yaml_string "$OUTPUT_DIR")")
[[ -n "${EXP_NAME:-}" ]] && overrides+=("output.exp_name=$(yaml_string "$EXP_NAME")")
[[ -n "${TRAIN_DATA_DIR:-}" ]] && overrides+=("data.train=$(yaml_string "$TRAIN_DATA_DIR")")
[[ -n "${MODEL_PATH:-}" ]] && overrides+=("team.agents.0.path=$(yaml_string "$MODEL_PATH")")
[[ -n "${RESPONSE_LENGTH:-}" ]] && overrides+=("rollout.max_new_tokens=$RESPONSE_LENGTH")
if [[ "${METHOD^^}" == SPO ]]; then
    [[ -n "${OFFLINE_VALUES:-}" ]] && overrides+=("spo.offline_values=$(yaml_string "$OFFLINE_VALUES")")
    [[ -n "${N_TRAIN:-}" ]] && echo "note: N_TRAIN=$N_TRAIN is not used: SPO samples one response per prompt" >&2
else
    [[ -n "${N_TRAIN:-}" ]] && overrides+=("grpo.group_size=$N_TRAIN")
    [[ -n "${OFFLINE_VALUES:-}" ]] && echo "note: OFFLINE_VALUES is not used: only SPO reads it" >&2
fi
[[ -n "${N_VAL:-}" ]] && overrides+=("eval.samples_per_agent=$N_VAL")

satseq="${SATSEQ:-satseq}"
if ! command -v "$satseq" >/dev/null && [[ -x "$root/.venv/bin/satseq" ]]; then
    satseq="$root/.venv/bin/satseq"
fi
[[ -n "${PPO_EPOCHS:-}" ]] && overrides+=("trainer.ppo_epochs=$PPO_EPOCHS")
command=("$satseq" train "$config")
for assignment in "${overrides[@]}"; do
    command+=(--set "$assignment")
done
command+=("$@")
if [[ -n "${PPO_MINI_BATCH_SIZE:-}" ]]; then
    responses=1  # SPO: one response per prompt
    if [[ "${METHOD^^}" == GRPO ]]; then  # the run's group size: N_TRAIN, or a --set, or the file's
        source "$root/scripts/run_settings.sh"
        responses="$(run_setting "$config" grpo.group_size "${command[@]:3}")"
    fi
    command+=(--set "trainer.mini_batch_size=$((PPO_MINI_BATCH_SIZE * responses))")
fi

printf '+'
printf ' %q' "${command[@]}"
printf '\n'
if is_true "${DRY_RUN:-0}" DRY_RUN; then
    exit 0
fi
exec "${command[@]}"
