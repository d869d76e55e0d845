#!/usr/bin/env bash
# Run `python -m fedrun train` as R ranks under Slurm's srun.
#
#   launch/srun.sh [-n RANKS] [--run-dir DIR] [--dry-run] [--] [--config FILE] [--resume auto] [key=value ...]
#
# Inside an sbatch/salloc allocation, or standalone (srun then asks Slurm for an allocation itself).
# RANKS: -n, else one rank per GPU of the allocation (GPUs on node x nodes), else $SLURM_NTASKS, else 1.
# Each rank gets --cpus-per-task of the allocation, cores bound to it (--cpu-bind=cores; FEDRUN_CPU_BIND
# overrides, e.g. "none" where the task/affinity plugin is off), OMP_NUM_THREADS = its CPUs, and with GPUs
# --gpus-per-task=1. No MPI by default (--mpi=none): fedrun takes its ranks from SLURM_PROCID / SLURM_LOCALID /
# SLURM_NTASKS and bootstraps torch.distributed (NCCL on GPUs, gloo on CPUs) from a store on the first node,
# so no PMI handshake between the MPI library and Slurm can fail. FEDRUN_MPI=pmi2 (MPICH) or pmix (Open MPI)
# starts the ranks through MPI instead (docs/clusters.md).
# Exit status is fedrun's: 0 done, 75 stopped by SIGTERM/SIGUSR1 after a checkpoint (requeue), 1 error.
#
# Environment: FEDRUN_PYTHON (interpreter), FEDRUN_TRAIN (replaces "python -m fedrun train"),
# FEDRUN_RUN_DIR (as --run-dir), FEDRUN_MPI, FEDRUN_CPU_BIND, FEDRUN_IFNAME (NCCL/gloo socket interface),
# FEDRUN_SRUN_ARGS (more srun options, blank-separated).
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "$(readlink -f "$0")")/common.sh"
fedrun_parse_args "$@"

gpus=$(fedrun_gpu_count)
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
if [ -z "$RANKS" ]; then
  if [ "$gpus" -gt 0 ]; then RANKS=$(( gpus * nodes )); else RANKS=${SLURM_NTASKS:-1}; fi
fi
cpus=${SLURM_CPUS_PER_TASK:-1}
fedrun_env "$cpus"
fedrun_command

# --kill-on-bad-exit=0 --wait=30: on SIGUSR1/SIGTERM every rank checkpoints and exits 75, but srun learns of
# the exits one node at a time, and with --kill-on-bad-exit=1 it kills the ranks of the other nodes while they
# exit and returns 143, not 75 (seen on the two-node test cluster). A rank that fails ends the job through
# fedrun itself (MPI_Abort, or its peers' lost gloo/NCCL connection); --wait=30 ends the ranks left 30 s after
# the first one exited whatever the cause (a crash inside MPI, say).
args=(srun "--ntasks=$RANKS" "--mpi=${FEDRUN_MPI:-none}" --kill-on-bad-exit=0 --wait=30 "--cpu-bind=${FEDRUN_CPU_BIND:-cores}")
# since Slurm 22.05 srun no longer inherits --cpus-per-task from the allocation: pass it on
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then args+=("--cpus-per-task=$SLURM_CPUS_PER_TASK"); fi
if [ "$gpus" -gt 0 ]; then args+=(--gpus-per-task=1); fi
if [ -n "${FEDRUN_SRUN_ARGS:-}" ]; then read -ra extra <<<"$FEDRUN_SRUN_ARGS"; args+=("${extra[@]}"); fi
fedrun_exec "${args[@]}" "${FEDRUN_CMD[@]}"
