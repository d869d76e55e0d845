#!/usr/bin/env bash
# Stop the two-node Slurm started by tests/cluster/slurm_up.sh and remove what it created: cancel its
# jobs, stop every node's slurmd, slurmctld and munged by their PID files (never by name), then delete
# the namespaces, veths and bridge recorded in $FEDRUN_SLURM_DIR/net.state. Packages stay installed.
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

# jobs first, so that no slurmstepd outlives its slurmd
if [ -s "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
  if [ -n "$(squeue --noheader --states=PD,R,CG --format=%i 2>/dev/null)" ]; then
    scancel --full --user="$(id -un)" 2>/dev/null
    for _ in $(seq 100); do
      [ -z "$(squeue --noheader --states=R,CG --format=%i 2>/dev/null)" ] && break; sleep 0.1
    done
  fi
fi
for pidfile in "$DIR"/slurmd.*.pid "$DIR/slurmd.pid"; do
  [ -e "$pidfile" ] || continue
  name=${pidfile##*/}; name=${name%.pid}
  stop "$name" "$pidfile"
done
stop slurmctld "$DIR/slurmctld.pid"
stop munged /run/munge/munged.pid

# the network, in reverse order of creation; a namespace whose processes are gone disappears with its name
if [ -s "$DIR/net.state" ]; then
  tac "$DIR/net.state" | while read -r kind name rest; do
    case $kind in
      netns)
        left=$(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')
        [ -z "$left" ] || echo "netns $name: processes still inside: $left"
        ip netns del "$name" 2>/dev/null && echo "netns $name: removed" ;;
      veth)
        ! ip link show "$name" >/dev/null 2>&1 || { ip link del "$name" && echo "veth $name: removed"; } ;;
      bridge)
        ! ip link show "$name" >/dev/null 2>&1 || { ip link del "$name" && echo "bridge $name: removed"; } ;;
      iptables)
        # shellcheck disable=SC2086
        iptables -D $name $rest 2>/dev/null && echo "iptables rule removed: $name $rest" ;;
    esac
  done
  rm -f "$DIR/net.state"
fi

if [ "${1:-}" = --purge ]; then
  [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$DIR/etc/slurm.conf" ] && rm -f /etc/slurm/slurm.conf
  [ "$(readlink /usr/local/bin/sacct 2>/dev/null)" = "$DIR/bin/sacct" ] && rm -f /usr/local/bin/sacct
  rm -rf "$DIR"
  echo "purged $DIR"
fi
exit 0
