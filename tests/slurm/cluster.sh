# A private Slurm cluster for tests: sourced by tests/slurm/*.sh (bash).
#
# Everything lives in one directory: slurm.conf, state, spool, logs, pid files, and a munged of
# its own with its own key and socket (AuthInfo=socket=...), on ports found free, so a test
# leaves the machine's /etc/slurm, /run/munge and any other cluster alone. SLURM_CONF alone
# points every daemon, client command and job step at it. The daemons run as root (as CI
# does), munged as the munge user (it refuses to run as root).
#
#   slurm_install                       apt-get install slurm-wlm (no recommends) when missing
#   slurm_write_conf DIR NODELINES...   DIR/slurm.conf; each NODELINE is "name addr cpus"
#   slurm_start_munge DIR               munged for DIR (pid in DIR/munge/munged.pid)
#   slurm_start_ctld DIR                slurmctld
#   slurm_start_slurmd DIR NAME [WRAP]  slurmd for node NAME, started through WRAP (e.g. a
#                                       command entering a network namespace)
#   slurm_wait_idle DIR N SECONDS       until N nodes are idle
#   netns_hosts_up / netns_hosts_down / netns_exec: hosts as network namespaces (below);
#   netns_shape PREFIX I RATE           shape host I's link with tc tbf (bench/hsdp_two_hosts.sh)
#   slurm_stop DIR                      cancel jobs, stop every daemon started here by pid, and
#                                       any job step daemon left with this SLURM_CONF
#   job_field ID FIELD                  one field of `scontrol show job`
#   wait_job ID SECONDS                 until the job ends; skips the requeue delay on the way
#   start_requeued ID                   skip a requeued job's delay (StartTime=now), once safe
# Helpers of the training scenarios (they use $T, the test's directory, $BIN, $SRC, $N):
#   sbatch_cpu NAME [sbatch opts] -- [train flags]   slurm/train_cpu.sbatch; run dir $T/NAME,
#                                       output $T/NAME.out; prints the job id
#   check_losses LOG FIRST BITWISE_UPTO TOL   LOG has steps FIRST..$N once each; losses equal
#                                       $T/ref.jsonl bitwise up to BITWISE_UPTO, within TOL after
#   expect_job ID STATE EXIT, wait_rows LOG K SECONDS, stop_step OUTPUT
# GPU nodes (tests/slurm/gpu.sh):
#   slurm_add_gpus DIR N                every node of DIR/slurm.conf gets Gres=gpu:N over
#                                       placeholder devices DIR/dev/gpu0..N-1 (DIR/gres.conf)
#   sbatch_gpu NAME [sbatch opts] -- [train flags]   slurm/train_gpu.sbatch (unmodified) on one
#                                       node of this machine; run dir $T/NAME, output
#                                       $T/NAME.out; prints the job id

slurm_install() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    echo "installing slurm-wlm (no recommends)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm >/dev/null
  fi
}

# A free TCP port pair (ctld, slurmd base) in 20000-39999.
_free_port() {
  local p
  for _ in $(seq 1 50); do
    p=$((20000 + RANDOM % 20000))
    [ -z "$(ss -Htln "( sport = :$p or sport = :$((p + 1)) )" 2>/dev/null)" ] && { echo "$p"; return; }
  done
  return 1
}

# slurm_write_conf DIR CTLD_ADDR "name addr cpus" ...
slurm_write_conf() {
  local d=$1 ctld=$2; shift 2
  local port; port=$(_free_port) || { echo "no free port"; return 1; }
  mkdir -p "$d/state" "$d/log" "$d/run"
  {
    echo "# private test cluster (tests/slurm/cluster.sh); SLURM_CONF=$d/slurm.conf"
    echo "ClusterName=shardgpt-test"
    echo "SlurmctldHost=$ctld"
    echo "SlurmctldPort=$port"
    echo "SlurmdPort=$((port + 1))"
    echo "SlurmUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$d/munge/munge.sock"
    echo "MailProg=/bin/true"
    echo "MpiDefault=pmix"
    # no cgroups here: processes tracked by parent pid, no task binding
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SchedulerType=sched/backfill"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "ReturnToService=2"
    # the nodes are what this file says (CPUs), not what slurmd detects under an affinity mask
    echo "SlurmdParameters=config_overrides"
    # job ids (and so PMIx's /tmp/spmix_appdir_0_<job>.<step>) unlike another test cluster's
    echo "FirstJobId=$((1000 + RANDOM * 30))"
    # finished jobs stay visible to scontrol for an hour; a timed-out step is killed 5 s after SIGTERM
    echo "MinJobAge=3600"
    echo "KillWait=5"
    echo "StateSaveLocation=$d/state"
    echo "SlurmdSpoolDir=$d/spool-%n"
    echo "SlurmctldPidFile=$d/run/slurmctld.pid"
    echo "SlurmdPidFile=$d/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$d/log/slurmctld.log"
    echo "SlurmdLogFile=$d/log/slurmd-%n.log"
    local n names=""
    for n in "$@"; do
      set -- $n
      echo "NodeName=$1 NodeAddr=$2 NodeHostname=$1 CPUs=$3 Boards=1 SocketsPerBoard=1 CoresPerSocket=$3 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
      names="${names:+$names,}$1"
    done
    echo "PartitionName=test Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } > "$d/slurm.conf"
}

slurm_start_munge() {
  local d=$1
  install -d -o munge -g munge -m 0755 "$d/munge"
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1 count=1024 status=none
  chown munge:munge "$d/munge/munge.key"; chmod 0400 "$d/munge/munge.key"
  runuser -u munge -- /usr/sbin/munged --socket="$d/munge/munge.sock" --key-file="$d/munge/munge.key" \
    --pid-file="$d/munge/munged.pid" --log-file="$d/munge/munged.log" --seed-file="$d/munge/munged.seed" || return 1
  munge -S "$d/munge/munge.sock" -n | unmunge -S "$d/munge/munge.sock" >/dev/null || { echo "munge does not work"; return 1; }
}

slurm_start_ctld() { SLURM_CONF=$1/slurm.conf /usr/sbin/slurmctld; }

slurm_start_slurmd() {
  local d=$1 name=$2; shift 2
  mkdir -p "$d/spool-$name"
  SLURM_CONF=$d/slurm.conf "$@" /usr/sbin/slurmd -N "$name"
}

slurm_wait_idle() {
  local d=$1 want=$2 secs=$3 n=0
  for _ in $(seq 1 $((secs * 2))); do
    n=$(SLURM_CONF=$d/slurm.conf sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$n" -ge "$want" ] && return 0
    sleep 0.5
  done
  echo "only $n of $want node(s) idle after $secs s:"; SLURM_CONF=$d/slurm.conf sinfo -N -l; SLURM_CONF=$d/slurm.conf sinfo -R
  tail -5 "$d"/log/*.log
  return 1
}

_stop_pid() {  # SIGTERM, wait up to 10 s, then SIGKILL
  local p=$1
  kill "$p" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true
}

slurm_stop() {
  local d=$1 f p
  [ -f "$d/slurm.conf" ] || return 0
  if [ -s "$d/run/slurmctld.pid" ]; then
    SLURM_CONF=$d/slurm.conf scancel --user=root 2>/dev/null || true
    for _ in $(seq 1 40); do
      [ -z "$(SLURM_CONF=$d/slurm.conf squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.25
    done
  fi
  for f in "$d"/run/slurmd-*.pid "$d/run/slurmctld.pid" "$d/munge/munged.pid"; do
    [ -s "$f" ] && _stop_pid "$(cat "$f")"
  done
  # job step daemons are children of init, not of slurmd: find the ones carrying this SLURM_CONF
  for p in $(pgrep -x slurmstepd); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "SLURM_CONF=$d/slurm.conf" && _stop_pid "$p"
  done
  return 0
}

# ---- scaffolding of a scenario script ----
# slurm_work_dir TEMPLATE: T = a new folder (mktemp -d TEMPLATE) that munged (user munge) can
# reach, and C = its cluster/ folder.
slurm_work_dir() {
  T=$(mktemp -d "$1") || return 1
  chmod 755 "$T"
  C=$T/cluster
  mkdir -p "$C"
}
# slurm_local_cluster_up CLUSTER_DIR [CONF_STEP...]: a one-node cluster on localhost (all this
# machine's CPUs, at least 2): slurm.conf written, then each CONF_STEP run as a command (e.g. extra lines
# or gres), SLURM_CONF exported, munged, slurmctld and slurmd started, the node idle within
# 60 s. On failure it prints which step failed and returns 1. Not in a $(...): the daemons
# would hold its pipe.
slurm_local_cluster_up() {
  local c=$1 step; shift
  # the scenarios run 2 tasks on the node: at least 2 CPUs, whatever the affinity mask allows
  # (under `taskset -c 0` they share one core; no task binding here)
  local cpus; cpus=$(nproc); [ "$cpus" -ge 2 ] || cpus=2
  slurm_write_conf "$c" localhost "localhost 127.0.0.1 $cpus" || { echo "slurm.conf"; return 1; }
  for step in "$@"; do eval "$step" || { echo "$step"; return 1; }; done
  export SLURM_CONF=$c/slurm.conf
  slurm_start_munge "$c" || { echo "munged"; return 1; }
  slurm_start_ctld "$c" || { echo "slurmctld"; return 1; }
  slurm_start_slurmd "$c" localhost || { echo "slurmd"; return 1; }
  slurm_wait_idle "$c" 1 60 || { echo "node not idle"; return 1; }
}
# slurm_test_scaffold DIR CLUSTER_DIR SECONDS: on exit (whatever happens) stop the cluster's
# daemons, run the script's own `extra_cleanup` if it defines one, and remove DIR (kept with
# KEEP_SLURM_TEST=1); a watchdog ends the script after SECONDS. The watchdog holds none of our
# output pipes (CTest would wait for it) and takes its sleep with it when it is ended.
slurm_test_scaffold() {
  SCAFFOLD_DIR=$1 SCAFFOLD_CLUSTER=$2
  local limit=$3
  ( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep "$limit" & s=$!; wait $s && kill -TERM $$ ) </dev/null >/dev/null 2>&1 &
  SCAFFOLD_WATCHDOG=$!
  trap _slurm_test_cleanup EXIT
  trap "echo \"FAIL: interrupted (signal, or the ${limit}-second watchdog)\"; exit 1" INT TERM
}
_slurm_test_cleanup() {
  kill "$SCAFFOLD_WATCHDOG" 2>/dev/null
  slurm_stop "$SCAFFOLD_CLUSTER"
  if declare -F extra_cleanup >/dev/null; then extra_cleanup; fi
  if [ -n "${KEEP_SLURM_TEST:-}" ]; then echo "kept $SCAFFOLD_DIR"; else rm -rf "$SCAFFOLD_DIR"; fi
}
fail() { echo "FAIL: $*"; exit 1; }
show() { echo "---- $1"; tail -n "${2:-30}" "$1"; }

job_field() { scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1; }

# start_requeued ID: a requeued job waits ~2 minutes (BeginTime); start it now, but only once
# the step daemons of its previous run are gone: a new step 0 must bind the PMIx socket the
# old step 0 may still hold for a few seconds (its launch fails otherwise). A step daemon
# keeps files named after its job in its node's spool directory until it ends (its process
# title is cut short, so it cannot be found by job id in `ps`).
start_requeued() {
  [ "$(job_field "$1" JobState)" = PENDING ] && [ "$(job_field "$1" Reason)" = BeginTime ] &&
    [ "$(job_field "$1" Restarts)" -gt 0 ] &&
    ! ls -1 "$(dirname "$SLURM_CONF")"/spool-*/ 2>/dev/null | grep -Eq "(_|\.|^job)$1(\.|$)" &&
    scontrol update JobId="$1" StartTime=now 2>/dev/null
  return 0
}

# wait_job ID SECONDS: 0 when the job ended within SECONDS (any final state), 1 otherwise.
wait_job() {
  local id=$1 st end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    st=$(job_field "$id" JobState)
    case "$st" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED) return 0 ;;
    esac
    start_requeued "$id"
    sleep 0.5
  done
  echo "job $id still $st after $2 s"
  return 1
}

sbatch_cpu() {
  local name=$1 opts=(); shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  RUN_DIR=$T/$name SHARDGPT=$BIN sbatch --parsable --job-name="$name" --chdir="$T" --output="$T/$name.out" \
    "${opts[@]}" "$SRC/slurm/train_cpu.sbatch" "$@"
}

# ---- GPU nodes ----
# slurm_add_gpus DIR N: after slurm_write_conf, before the daemons start. Every node of
# DIR/slurm.conf gets N GPUs (Gres=gpu:N, GresTypes=gpu), backed in DIR/gres.conf (Slurm reads
# gres.conf next to slurm.conf) by placeholder devices DIR/dev/gpu0..N-1. slurmd 22.05 wants
# each File= to be a character or block device: a plain file is refused in its log ("... is not
# a valid character or block device, fix your gres.conf") while the node still shows Gres=gpu:N,
# and jobs then run with no CUDA_VISIBLE_DEVICES at all; a missing file stops slurmd after 20 s
# ("fatal: can't stat gres.conf file"). So: character devices with the NVIDIA major, 195, and
# minor i, as /dev/nvidia<i> would be. No driver has that major here: opening one fails (ENXIO),
# and nothing opens them (no cgroup device constraint with task/none, proctrack/linuxproc).
# DIR must not be on a nodev mount, nor under /tmp for hosts made by netns_exec (own /tmp).
slurm_add_gpus() {
  local d=$1 n=$2 i files
  mkdir -p "$d/dev"
  for i in $(seq 0 $((n - 1))); do
    rm -f "$d/dev/gpu$i"
    mknod -m 0666 "$d/dev/gpu$i" c 195 "$i" || return 1
  done
  sed -i "s/^\(NodeName=.*\) State=UNKNOWN$/\1 Gres=gpu:$n State=UNKNOWN/" "$d/slurm.conf"
  grep -q "^NodeName=.* Gres=gpu:$n " "$d/slurm.conf" || { echo "no NodeName line to add Gres=gpu:$n to"; return 1; }
  echo "GresTypes=gpu" >> "$d/slurm.conf"
  if [ "$n" = 1 ]; then files=$d/dev/gpu0; else files="$d/dev/gpu[0-$((n - 1))]"; fi
  echo "Name=gpu File=$files" > "$d/gres.conf"
}

# sbatch_gpu NAME [sbatch opts] -- [train flags]: slurm/train_gpu.sbatch as it is, with
# SHARDGPT=$BIN and RUN_DIR=$T/NAME. What a node of this machine cannot give is overridden on
# the command line, before the caller's options: one node (--nodes=1, not 2), $GPU_TASKS tasks
# on it (default 2, not 8: one per GPU of slurm_add_gpus) and one core each (--cpus-per-task=1,
# not 8; the template passes it to srun and to --threads). The template's --gpus-per-task=1,
# srun --mpi=pmix --gpu-bind=$SHARDGPT_GPU_BIND (default none), --mem=0, --time, --signal,
# --requeue and --open-mode stay as they are.
sbatch_gpu() {
  local name=$1 opts=(); shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  RUN_DIR=$T/$name SHARDGPT=$BIN sbatch --parsable --job-name="$name" --chdir="$T" --output="$T/$name.out" \
    --nodes=1 --ntasks-per-node="${GPU_TASKS:-2}" --cpus-per-task=1 "${opts[@]}" "$SRC/slurm/train_gpu.sbatch" "$@"
}

check_losses() {
  /usr/bin/python3 - "$T/ref.jsonl" "$1" "$2" "$3" "$4" "$N" <<'PY'
import json, sys
ref = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
rows = [json.loads(l) for l in open(sys.argv[2])]
first, bitwise_upto, tol, n = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
steps = [r["step"] for r in rows]
assert steps == list(range(first, n + 1)), f"steps logged: {steps[:5]}...{steps[-5:]} ({len(steps)}), expected {first}..{n} once each"
exact = [r for r in rows if r["step"] <= bitwise_upto]
rest = [r for r in rows if r["step"] > bitwise_upto]
assert all(r["loss"] == ref[r["step"]] for r in exact), "losses differ from the reference where they must be bitwise equal"
diff = max([abs(r["loss"] - ref[r["step"]]) for r in rest], default=0.0)
assert diff < tol, f"max loss difference {diff:.3e} >= {tol}"
what = []
if exact: what.append(f"steps {exact[0]['step']}..{exact[-1]['step']} bitwise equal")
if rest: what.append(f"steps {rest[0]['step']}..{rest[-1]['step']} within {diff:.1e}")
print(f"  steps {first}..{n} logged once each; " + ", ".join(what) + " (vs the uninterrupted reference)")
PY
}

expect_job() {
  local st ec
  st=$(job_field "$1" JobState); ec=$(job_field "$1" ExitCode)
  [ "$st" = "$2" ] && [ "$ec" = "$3" ] && return 0
  scontrol show job "$1"
  echo "---- $(job_field "$1" StdOut)"; tail -n 30 "$(job_field "$1" StdOut)"
  echo "FAIL: job $1: $st $ec, expected $2 $3"
  exit 1
}

wait_rows() {
  for _ in $(seq 1 $(($3 * 10))); do [ "$(cat "$1" 2>/dev/null | wc -l)" -ge "$2" ] && return 0; sleep 0.1; done
  return 1
}

stop_step() { sed -n 's/.*stop signal received.*checkpointing at step \([0-9]*\) .*/\1/p' "$1" | tail -1; }

# ---- hosts made of network namespaces ----
# netns_tools: the tools of the two-host cluster: ip (iproute2, installed when missing), nsenter and unshare
# (util-linux). Fails with one line naming them.
netns_tools() {
  command -v ip >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
  command -v ip >/dev/null && command -v nsenter >/dev/null && command -v unshare >/dev/null \
    || { echo "FAIL: needs ip (iproute2), nsenter and unshare (util-linux)"; exit 1; }
}

# netns_pick_prefix: sets P (a name prefix) and NET (a /24) that no namespace, bridge or
# interface here uses yet.
netns_pick_prefix() {
  for _ in $(seq 1 20); do
    P=sg$((RANDOM % 900 + 100)); NET=10.$((RANDOM % 50 + 200)).$((RANDOM % 250))
    [ ! -e "/run/netns/$P-h1" ] && ! ip link show "$P-br" >/dev/null 2>&1 && ! ip -4 -o addr | grep -q " $NET\." && break
  done
}
# netns_hosts_up PREFIX SUBNET N: a bridge PREFIX-br with SUBNET.1/24 in this (the root)
# namespace, and N network namespaces PREFIX-h1..hN, each joined to the bridge by a veth pair,
# with its own loopback and eth0 = SUBNET.(10+i)/24. What runs inside sees only its own
# interfaces: traffic between two of them crosses the bridge over TCP/IP. Each gets its own
# hostname from netns_exec (a UTS namespace per command tree).
netns_hosts_up() {
  local p=$1 net=$2 n=$3 i
  ip link add "$p-br" type bridge || return 1
  ip addr add "$net.1/24" dev "$p-br" && ip link set "$p-br" up || return 1
  for i in $(seq 1 "$n"); do
    ip netns add "$p-h$i" || return 1
    ip link add "$p-v$i" type veth peer name eth0 netns "$p-h$i" || return 1
    ip link set "$p-v$i" master "$p-br" && ip link set "$p-v$i" up || return 1
    ip -n "$p-h$i" addr add "$net.$((10 + i))/24" dev eth0 || return 1
    ip -n "$p-h$i" link set eth0 up && ip -n "$p-h$i" link set lo up || return 1
  done
}
# netns_hosts_down PREFIX N: removes what netns_hosts_up made (the veth pairs go with them).
# netns_cluster_up DIR CLUSTER_DIR CPUS: a two-host Slurm cluster: hosts h1, h2 made of network
# namespaces (prefix P and subnet NET from netns_pick_prefix, CPUS each), one slurmd per host,
# slurmctld and munged in the root namespace (the hosts reach it through the bridge address);
# SLURM_CONF exported; the nodes idle within 60 s. On failure it says which step failed.
netns_cluster_up() {
  local t=$1 c=$2 cpus=$3 i
  netns_hosts_up "$P" "$NET" 2 || { echo "cannot make network namespaces (ip netns add / veth / bridge refused)"; return 1; }
  slurm_write_conf "$c" "$(hostname -s)($NET.1)" "h1 $NET.11 $cpus" "h2 $NET.12 $cpus" || { echo "slurm.conf"; return 1; }
  export SLURM_CONF=$c/slurm.conf
  slurm_start_munge "$c" || { echo "munged"; return 1; }
  slurm_start_ctld "$c" || { echo "slurmctld"; return 1; }
  for i in 1 2; do
    slurm_start_slurmd "$c" "h$i" netns_exec "$P" "$i" "$t/tmp-h$i" || { echo "slurmd h$i"; return 1; }
  done
  slurm_wait_idle "$c" 2 60 || { echo "nodes not idle"; return 1; }
}

netns_hosts_down() {
  local p=$1 n=$2 i
  for i in $(seq 1 "$n"); do ip netns del "$p-h$i" 2>/dev/null; done
  ip link del "$p-br" 2>/dev/null
  return 0
}
# netns_shape PREFIX I RATE: a token bucket filter (tc tbf, RATE e.g. 1gbit) on both directions
# of host I's link: the egress of its eth0 (host -> bridge) and of its veth end here (bridge ->
# host). Only the rate: this kernel has no netem qdisc ("Specified qdisc kind is unknown"), so
# no delay can be added.
netns_shape() {
  local p=$1 i=$2 rate=$3
  tc qdisc replace dev "$p-v$i" root tbf rate "$rate" burst 256kb latency 100ms || return 1
  ip netns exec "$p-h$i" tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 100ms
}

# netns_exec PREFIX I TMP CMD...: CMD inside host I: its network namespace, a UTS namespace
# whose hostname is hI, and a mount namespace where the directory TMP is its /tmp (hosts do not
# share /tmp: Slurm's PMIx plugin makes /tmp/spmix_appdir_<uid>_<job>.<step> on every node of
# a step and fails when it exists). Shared storage must therefore live outside /tmp.
# nsenter, not `ip netns exec`: the latter also remounts /sys for the namespace, which hides
# /sys/fs/cgroup, and slurmd 22.05 will not start without it ("Unable to initialize cgroup
# plugin") even with proctrack/linuxproc.
netns_exec() {
  local p=$1 i=$2 tmp=$3; shift 3
  mkdir -p "$tmp" && chmod 1777 "$tmp"
  nsenter --net="/run/netns/$p-h$i" unshare --uts --mount --propagation private \
    /bin/sh -c 'hostname "$0" && mount --bind "$1" /tmp && shift && exec "$@"' "h$i" "$tmp" "$@"
}
