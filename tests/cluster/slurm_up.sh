#!/usr/bin/env bash
# fedrun's two-node Slurm for tests and CI: munge + slurmctld + one slurmd per compute node, from
# Debian's slurm-wlm, started as root without systemd and without cgroups.
#
#   bash tests/cluster/slurm_up.sh          # idempotent: starts only what is not running
#   bash tests/cluster/slurm_down.sh        # stops and removes everything this created; --purge wipes state
#
# The cluster on one machine:
#
#     root namespace (this machine)                      netns fedrun-node1        netns fedrun-node2
#     munged  slurmctld (UTS "fedrun-ctl")               slurmd -N node1           slurmd -N node2
#     bridge fedrun-br0 10.77.0.1/24 --- veth fr-node1 --- eth0 10.77.0.11/24
#                                    \-- veth fr-node2 ---------------------------- eth0 10.77.0.12/24
#
#   * Each compute node is a slurmd in its own network namespace (its own address, its own loopback,
#     port 6818 in each), UTS namespace (hostname node1, node2) and mount namespace (only to give it an
#     /etc/hosts that names the nodes; every other mount, this machine's filesystem, is shared and
#     stands in for a cluster's shared storage). The jobs' processes inherit all three, so the ranks of
#     `srun -N 2` see two hostnames and talk to each other over the veths and the bridge.
#   * The addresses are a private range on a bridge this script creates: no NAT, no default route in the
#     nodes, nothing forwarded; a node reaches the other node and the bridge address, nothing else.
#   * slurmctld runs in this machine's network namespace and listens on the bridge address, so the
#     Slurm clients here (sbatch, srun, squeue, submitit) and the slurmds reach it; it gets a UTS
#     namespace of its own only so that its hostname matches SlurmctldHost.
#   * munged runs here; its socket is a file (/run/munge), which every namespace sees.
#   * srun started here (the tests' "login node") is reached by the nodes' slurmstepds (I/O, PMI2) at
#     the bridge address, the address its requests come from.
#
# Environment:
#   FEDRUN_SLURM_DIR    state, logs, slurm.conf, per-node spool and PID files (default /tmp/fedrun-slurm)
#   FEDRUN_SLURM_NODES  compute nodes (default 2)
#   FEDRUN_SLURM_CPUS   CPUs each node advertises (default: nproc, at least 4, so that two 2-rank jobs fit
#                       on one node; Slurm happily oversubscribes a small machine when told it has more)
#   FEDRUN_SLURM_MEM_MB memory each node advertises (default 90 % of MemTotal / nodes; slurmd drains a node
#                       claiming more than it sees)
#   FEDRUN_SLURM_NET    the /24 of the nodes (default 10.77.0; the bridge is .1, node i is .(10+i))
#
# Why the Slurm configuration looks like this:
#   * ProctrackType=proctrack/linuxproc + TaskPlugin=task/none: containers and CI boxes have no
#     writable cgroup tree; plain /proc tracking works everywhere.
#   * SlurmdParameters=config_overrides: trust the CPUs= we configure (may exceed the hardware's) instead
#     of draining the node for "Low socket*core*thread count".
#   * SlurmdSpoolDir/SlurmdPidFile/SlurmdLogFile with %n: one spool, PID file and log per node.
#   * SelectTypeParameters=CR_CPU: only CPUs are consumed, so jobs without --mem can share a node.
#   * AuthInfo=cred_expire=10: a requeued job (submitit checkpoint -> scontrol requeue) may only start
#     again after the credential of its previous run expires (default 120 s).
#   * SchedulerParameters=sched_interval=2,bf_interval=1: schedule every couple of seconds, not every
#     minute, so requeued and array jobs start promptly.
#   * MinJobAge=3600: finished jobs stay in slurmctld's memory, where the sacct stand-in reads them.
#   * No slurmdbd: /usr/local/bin/sacct becomes a stand-in answering from `squeue --states=all`;
#     without it submitit sees every job as UNKNOWN and never learns that a job died or was cancelled.
set -euo pipefail

DIR=${FEDRUN_SLURM_DIR:-/tmp/fedrun-slurm}
NODES=${FEDRUN_SLURM_NODES:-2}
NCPU=$(nproc)
CPUS=${FEDRUN_SLURM_CPUS:-$(( NCPU < 4 ? 4 : NCPU ))}
MEM_MB=${FEDRUN_SLURM_MEM_MB:-$(awk -v n="$NODES" '/^MemTotal:/ {print int($2 / 1024 * 0.9 / n)}' /proc/meminfo)}
NET=${FEDRUN_SLURM_NET:-10.77.0}
BRIDGE=fedrun-br0
CTL_ADDR=$NET.1
START_NS=$(date +%s%N)

say() { local ms=$(( ($(date +%s%N) - START_NS) / 1000000 )); printf '[slurm_up %d.%03ds] %s\n' $((ms / 1000)) $((ms % 1000)) "$*"; }
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# retry CMD up to N times, 0.1 s apart; the last try's output is shown
retry() { local n=$1; shift; local i; for ((i = 1; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done; "$@"; }
stop_by_pidfile() {
  running "$1" || return 0
  local pid; pid=$(cat "$1"); kill "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid"
}
node_name() { echo "node$1"; }
node_ns() { echo "fedrun-node$1"; }
node_addr() { echo "$NET.$((10 + $1))"; }

if [ "$(id -u)" != 0 ]; then echo "slurm_up.sh: needs root (installs packages, namespaces, runs the daemons)" >&2; exit 1; fi
if ! [[ $NODES =~ ^[1-9]$ ]]; then echo "slurm_up.sh: FEDRUN_SLURM_NODES: expected 1..9, got '$NODES'" >&2; exit 2; fi

# ---------------------------------------------------------------- 1. packages (only when missing)
missing=()
for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge ip:iproute2 unshare:util-linux; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---------------------------------------------------------------- 2. munge (authentication)
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
fi
if ! running /run/munge/munged.pid; then
  rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  runuser -u munge -- /usr/sbin/munged
  say "munged started"
fi
retry 50 sh -c 'munge -n </dev/null | unmunge'

# ---------------------------------------------------------------- 3. the network: bridge, veths, namespaces
mkdir -p "$DIR"/{etc,state,spool,log,bin}
# what exists is recorded before it is created, so that slurm_down.sh removes exactly this
net_state=$DIR/net.state
record() { grep -qxF "$1" "$net_state" 2>/dev/null || echo "$1" >> "$net_state"; }
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  record "bridge $BRIDGE"
  ip link add "$BRIDGE" type bridge
  say "bridge $BRIDGE created"
fi
ip addr replace "$CTL_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
# hosts that bridge traffic through iptables (br_netfilter, e.g. Docker hosts with FORWARD DROP) would
# drop the nodes' packets: accept what stays on our bridge (removed again by slurm_down.sh)
if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null || echo 0)" = 1 ] && command -v iptables >/dev/null; then
  if ! iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; then
    record "iptables FORWARD -i $BRIDGE -o $BRIDGE -j ACCEPT"
    iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
  fi
fi
{
  echo "127.0.0.1 localhost"
  echo "$CTL_ADDR fedrun-ctl"
  for i in $(seq "$NODES"); do echo "$(node_addr "$i") $(node_name "$i")"; done
} > "$DIR/etc/hosts"
for i in $(seq "$NODES"); do
  ns=$(node_ns "$i"); veth=fr-$(node_name "$i")
  if ! ip netns list | grep -qw "^$ns"; then
    record "netns $ns"
    ip netns add "$ns"
  fi
  if ! ip link show "$veth" >/dev/null 2>&1; then
    record "veth $veth"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr replace "$(node_addr "$i")/24" dev eth0
  ip -n "$ns" link set eth0 up
done
say "network up: $BRIDGE $CTL_ADDR/24, nodes $(for i in $(seq "$NODES"); do printf '%s=%s ' "$(node_name "$i")" "$(node_addr "$i")"; done)"

# ---------------------------------------------------------------- 4. slurm.conf
conf=$DIR/etc/slurm.conf
node_lines=$(for i in $(seq "$NODES"); do
  echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN"
done)
cat > "$conf.tmp" <<CONF
# generated by fedrun tests/cluster/slurm_up.sh
ClusterName=fedrun
SlurmctldHost=fedrun-ctl($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
MaxArraySize=1001
KillWait=5
InactiveLimit=0
MinJobAge=3600
SlurmdTimeout=60
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
conf_changed=0
if cmp -s "$conf.tmp" "$conf"; then rm -f "$conf.tmp"; else mv "$conf.tmp" "$conf"; conf_changed=1; fi
# every client (srun, sbatch, squeue, submitit) reads /etc/slurm/slurm.conf: point it at ours
mkdir -p /etc/slurm
if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null || true)" != "$conf" ]; then
  if [ -e /etc/slurm/slurm.conf ] || [ -L /etc/slurm/slurm.conf ]; then
    mv /etc/slurm/slurm.conf "/etc/slurm/slurm.conf.before-fedrun.$(date +%s)"
  fi
  ln -s "$conf" /etc/slurm/slurm.conf
fi

# ---------------------------------------------------------------- 5. sacct stand-in
cat > "$DIR/bin/sacct" <<'SACCT'
#!/usr/bin/env bash
# sacct for a Slurm without accounting storage (fedrun tests/cluster/slurm_up.sh).
# Uses the real sacct when it works; otherwise answers `sacct -o FIELDS --parsable2 -j ID ...`
# (what submitit asks) from `squeue --states=all`, which keeps finished jobs for MinJobAge seconds.
if real=$(/usr/bin/sacct "$@" 2>/dev/null); then printf '%s\n' "$real"; exit 0; fi
fields=JobID,State; ids=(); header=1
while (($#)); do
  case $1 in
    -o|--format) fields=$2; shift ;;
    --format=*) fields=${1#*=} ;;
    -j|--jobs) IFS=, read -ra more <<<"$2"; ids+=("${more[@]}"); shift ;;
    --jobs=*) IFS=, read -ra more <<<"${1#*=}"; ids+=("${more[@]}") ;;
    -n|--noheader) header=0 ;;
  esac
  shift
done
IFS=, read -ra names <<<"$fields"
spec=
for name in "${names[@]}"; do
  name=${name%%%*}
  case $name in
    JobID|JobIDRaw) code=%i ;;  State) code=%T ;;  NodeList) code=%N ;;  JobName) code=%j ;;
    Partition) code=%P ;;  User) code=%u ;;  Elapsed) code=%M ;;  AllocCPUS|NCPUS) code=%C ;;
    Reason) code=%r ;;  ExitCode) code=0:0 ;;  *) code= ;;
  esac
  spec+=${spec:+|}$code
done
if ((header)); then (IFS='|'; printf '%s\n' "${names[*]%%%*}"); fi
# all jobs, filtered here: squeue -j fails outright when one of several ids is unknown
squeue --states=all --noheader --format="%i|$spec" 2>/dev/null | awk -F'|' -v want="${ids[*]}" '
  BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) keep[w[i]] = 1 }
  { id = $1; main = id; sub(/_.*/, "", main)
    if (n == 0 || (id in keep) || (main in keep)) { sub(/^[^|]*\|/, ""); print } }'
exit 0
SACCT
chmod 0755 "$DIR/bin/sacct"
ln -sfn "$DIR/bin/sacct" /usr/local/bin/sacct

# ---------------------------------------------------------------- 6. daemons
any_slurmd_running() { local i; for i in $(seq "$NODES"); do running "$DIR/slurmd.$(node_name "$i").pid" && return 0; done; return 1; }
if ((conf_changed)) && { running "$DIR/slurmctld.pid" || any_slurmd_running; }; then
  say "slurm.conf changed: restarting the daemons"
  for i in $(seq "$NODES"); do stop_by_pidfile "$DIR/slurmd.$(node_name "$i").pid"; done
  stop_by_pidfile "$DIR/slurmctld.pid"
fi
if ! running "$DIR/slurmctld.pid"; then
  # -i: ignore unreadable state from an earlier configuration
  unshare --uts sh -c 'hostname fedrun-ctl && exec slurmctld -i'
  say "slurmctld started"
fi
retry 100 sh -c 'scontrol ping | grep -q "is UP"' || { tail -n 20 "$DIR/log/slurmctld.log" >&2; exit 1; }
for i in $(seq "$NODES"); do
  name=$(node_name "$i")
  mkdir -p "$DIR/spool/$name"
  if ! running "$DIR/slurmd.$name.pid"; then
    # the node's own UTS (hostname) and mount namespace (its /etc/hosts) inside its network namespace;
    # slurmd daemonizes and keeps all three, and so does every job step it starts. (nsenter, not
    # `ip netns exec`: that remounts /sys for the namespace and so hides /sys/fs/cgroup, which slurmd's
    # cgroup plugin probes at start-up even with proctrack/linuxproc and task/none)
    nsenter --net="/run/netns/$(node_ns "$i")" unshare --uts --mount --propagation slave \
      sh -c "mount --bind '$DIR/etc/hosts' /etc/hosts && hostname '$name' && exec slurmd -N '$name'"
    say "slurmd $name started in $(node_ns "$i")"
  fi
done
nodes_csv=$(for i in $(seq "$NODES"); do printf '%s,' "$(node_name "$i")"; done); nodes_csv=${nodes_csv%,}
nodes_usable() {
  [ "$(sinfo --noheader --Node --nodes="$nodes_csv" --format=%t | grep -Ec '^(idle|mix|alloc|comp)')" = "$NODES" ]
}
if ! retry 150 nodes_usable; then
  scontrol update nodename="$nodes_csv" state=resume >/dev/null 2>&1 || true
  retry 50 nodes_usable || { sinfo -R >&2; tail -n 20 "$DIR"/log/slurmd.*.log >&2; exit 1; }
fi
# usable nodes have reached the controller and back; check node <-> node too (each slurmd's port)
for i in $(seq "$NODES"); do
  for j in $(seq "$NODES"); do
    retry 30 ip netns exec "$(node_ns "$i")" bash -c "exec 3<>/dev/tcp/$(node_addr "$j")/6818" \
      || { echo "slurm_up.sh: $(node_name "$i") cannot reach $(node_name "$j") at $(node_addr "$j"):6818" >&2; exit 1; }
  done
done
say "up: $(sinfo --noheader --Node --format='%N %t %cCPUs %mMB' | paste -sd ' ' | sed 's/  */ /g') (state in $DIR)"
