# Sourced by train.sh and train_dapo.sh: `run_setting CONFIG KEY ARGS...` prints KEY's value in
# the run that `satseq train CONFIG ARGS...` starts, i.e. after every --set among ARGS (a later
# --set grpo.group_size=4 wins over the file), by asking `satseq config show`. $satseq is the
# command to call.
run_setting() {
    local config="$1" key="$2"
    shift 2
    local sets=() args=("$@") i
    for ((i = 0; i < ${#args[@]}; i++)); do
        case "${args[i]}" in
            --set) sets+=(--set "${args[i + 1]:-}"); i=$((i + 1)) ;;
            --set=*) sets+=(--set "${args[i]#--set=}") ;;
        esac
    done
    "$satseq" config show "$config" "${sets[@]}" --key "$key"
}
