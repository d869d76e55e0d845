# Shared by launch/mpirun.sh and launch/srun.sh (sourced, not run).
# Parses the launcher's own options, sets the thread and communication environment, and builds the
# fedrun command line in FEDRUN_CMD (an array).

fedrun_usage() {
  sed -n '2,/^set /p' "$0" | sed -e '/^set /d' -e 's/^# \{0,1\}//'
  exit "${1:-0}"
}

# fedrun_parse_args "$@": sets RANKS (empty: launcher default), RUN_DIR, DRY_RUN, TRAIN_ARGS (array)
fedrun_parse_args() {
  RANKS=${FEDRUN_RANKS:-}; RUN_DIR=${FEDRUN_RUN_DIR:-}; DRY_RUN=${FEDRUN_DRY_RUN:-0}; TRAIN_ARGS=()
  while (($#)); do
    case $1 in
      -n|--ranks) RANKS=$2; shift 2 ;;
      -n*) RANKS=${1#-n}; shift ;;
      --ranks=*) RANKS=${1#*=}; shift ;;
      --run-dir) RUN_DIR=$2; shift 2 ;;
      --run-dir=*) RUN_DIR=${1#*=}; shift ;;
      --dry-run) DRY_RUN=1; shift ;;
      -h|--help) fedrun_usage 0 ;;
      --) shift; TRAIN_ARGS+=("$@"); break ;;
      *) TRAIN_ARGS+=("$1"); shift ;;
    esac
  done
  if [ -n "$RANKS" ] && ! [[ $RANKS =~ ^[1-9][0-9]*$ ]]; then
    echo "$(basename "$0"): -n: expected a positive integer, got '$RANKS'" >&2; exit 2
  fi
}

# number of GPUs this node offers the job (0 without GPUs)
fedrun_gpu_count() {
  if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then echo "$SLURM_GPUS_ON_NODE"; return; fi
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    if [ -z "$CUDA_VISIBLE_DEVICES" ] || [ "$CUDA_VISIBLE_DEVICES" = -1 ]; then echo 0; return; fi
    awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES"; return
  fi
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; return
  fi
  echo 0
}

# fedrun_env THREADS: thread counts and NCCL/gloo hints (a value already in the environment wins)
fedrun_env() {
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$1}
  export MKL_NUM_THREADS=${MKL_NUM_THREADS:-$OMP_NUM_THREADS}
  export PYTHONUNBUFFERED=1
  # a failed or hung NCCL collective raises instead of blocking every rank forever
  export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  # FEDRUN_IFNAME=ib0 (say) pins NCCL's and gloo's sockets to one network interface
  if [ -n "${FEDRUN_IFNAME:-}" ]; then
    export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$FEDRUN_IFNAME}
    export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-$FEDRUN_IFNAME}
  fi
  export CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID}
}

# fedrun_command: FEDRUN_CMD=(python -m fedrun train TRAIN_ARGS... [run.dir=RUN_DIR])
fedrun_command() {
  local python=${FEDRUN_PYTHON:-}
  if [ -z "$python" ]; then python=$(command -v python || command -v python3 || echo python3); fi
  if [ -n "${FEDRUN_TRAIN:-}" ]; then
    read -ra FEDRUN_CMD <<<"$FEDRUN_TRAIN"   # e.g. a test stand-in; word-split on blanks
  else
    FEDRUN_CMD=("$python" -m fedrun train)
  fi
  FEDRUN_CMD+=("${TRAIN_ARGS[@]}")
  if [ -n "$RUN_DIR" ]; then
    mkdir -p "$RUN_DIR"
    FEDRUN_CMD+=("run.dir=$RUN_DIR")
  fi
}

fedrun_exec() {  # print the command line, then replace this shell with it (or only print: --dry-run)
  echo "$(basename "$0"): $*" >&2
  if [ "$DRY_RUN" = 1 ]; then exit 0; fi
  exec "$@"
}
