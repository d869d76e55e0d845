#!/usr/bin/env bash
# Stop the single-node Slurm started by tests/cluster/slurm_up.sh: cancel its jobs, then stop slurmd,
# slurmctld and munged by their PID files (never by name). Packages stay installed.
#   --purge  also delete $FEDRUN_SLURM_DIR and the links slurm_up.sh made in /etc/slurm and /usr/local/bin
set -uo pipefail
DIR=${FEDRUN_SLURM_DIR:-/tmp/fedrun-slurm}

stop() {  # NAME PIDFILE
  local pid
  if ! [ -s "$2" ]; then echo "$1: no PID file"; return 0; fi
  pid=$(cat "$2")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "$1 ($pid): still alive after 15 s, SIGKILL"; kill -KILL "$pid"; fi
    echo "$1 ($pid): stopped"
  else
    echo "$1: not running"
  fi
  rm -f "$2"
}

# jobs first, so that no slurmstepd outlives slurmd
if [ -s "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
  if [ -n "$(squeue --noheader --states=PD,R,CG --format=%i 2>/dev/null)" ]; then
    scancel --full --user="$(id -un)" 2>/dev/null
    for _ in $(seq 100); do
      [ -z "$(squeue --noheader --states=R,CG --format=%i 2>/dev/null)" ] && break; sleep 0.1
    done
  fi
fi
stop slurmd "$DIR/slurmd.pid"
stop slurmctld "$DIR/slurmctld.pid"
stop munged /run/munge/munged.pid

if [ "${1:-}" = --purge ]; then
  [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$DIR/etc/slurm.conf" ] && rm -f /etc/slurm/slurm.conf
  [ "$(readlink /usr/local/bin/sacct 2>/dev/null)" = "$DIR/bin/sacct" ] && rm -f /usr/local/bin/sacct
  rm -rf "$DIR"
  echo "purged $DIR"
fi
exit 0
