#!/usr/bin/env bash
# Runs deploy/slurm/island.sbatch on a real one-node Slurm cluster made for the occasion (Debian's
# slurmctld, slurmd and munge, everything under a temporary directory), against a local
# coordinator: an island of 2 ranks started by srun trains a tiny model for 2 rounds.
#   deploy/slurm/check_local.sh [ATOLL_BINARY]     (root; apt-get install slurmctld slurmd
#                                                   slurm-client munge)
# Prints the job's log; exits 0 when the coordinator committed every round.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
binary="$(realpath "${1:-$root/build/src/atoll}")"
for tool in slurmctld slurmd sbatch munged mungekey; do
  command -v "$tool" >/dev/null ||
    { echo "check_local.sh: error: $tool is missing (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "check_local.sh: error: run as root (it starts slurmd)" >&2; exit 1; }

dir="$(mktemp -d /tmp/atoll-slurm-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -f "$dir/slurmd.pid" ]] && kill "$(cat "$dir/slurmd.pid")" 2>/dev/null || true
  [[ -f "$dir/slurmctld.pid" ]] && kill "$(cat "$dir/slurmctld.pid")" 2>/dev/null || true
  [[ -f "$dir/munged.pid" ]] && kill "$(cat "$dir/munged.pid")" 2>/dev/null || true
  sleep 1
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir"/{spool,state,munge}
chmod 700 "$dir/munge"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host="$(hostname -s)"

# munge with its own key and socket.
mungekey --create --keyfile="$dir/munge/munge.key" 2>/dev/null
munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" 2>/dev/null

cat >"$dir/slurm.conf" <<EOF
ClusterName=atoll-check
SlurmctldHost=$host
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmdSpoolDir=$dir/spool
StateSaveLocation=$dir/state
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
export SLURM_CONF="$dir/slurm.conf"
slurmctld
slurmd
for _ in $(seq 50); do
  sinfo -h -o %t 2>/dev/null | grep -q idle && break
  sleep 0.2
done
sinfo -h -o %t | grep -q idle || { echo "check_local.sh: error: the node did not come up" >&2; cat "$dir"/slurm*.log >&2; exit 1; }

# The run: one island of 2 ranks, a tiny model, 2 rounds.
for i in $(seq 2000); do echo "island $i trains on its shard; the service averages round $((i % 7))"; done >"$dir/text.txt"
cat >"$dir/run.toml" <<EOF
[model]
n_layer = 2
d_model = 32
n_head = 2
context = 32
[data]
path = "$dir/text.txt"
val_fraction = 0.1
[train]
steps = 8
batch_size = 4
eval_every = 4
eval_batches = 2
threads = 1
checkpoint_every = 4
[optim]
warmup_steps = 2
[outer]
sync_every = 4
islands = 1
EOF
export ATOLL_TOKEN="check-$RANDOM$RANDOM"
"$binary" coordinator --config "$dir/run.toml" --listen 127.0.0.1:0 --run-dir "$dir/coordinator" \
  >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  address="$(grep -o 'listening on [0-9.:]*' "$dir/coordinator.log" | awk '{print $3}' || true)"
  [[ -n "$address" ]] && break
  sleep 0.1
done
[[ -n "$address" ]] || { echo "check_local.sh: error: the coordinator did not start" >&2; cat "$dir/coordinator.log" >&2; exit 1; }

ATOLL_BIN="$binary" timeout 300 sbatch --wait --nodes=1 --ntasks=2 --ntasks-per-node=2 \
  --output="$dir/job.log" "$root/deploy/slurm/island.sbatch" "$address" slurm0 "$dir/run.toml" "$dir/island" ||
  { echo "check_local.sh: error: the job failed" >&2; cat "$dir/job.log" >&2; exit 1; }
wait "${pids[0]}" || true
cat "$dir/job.log"
tail -2 "$dir/coordinator.log"
grep -q "stopped after 2 rounds" "$dir/coordinator.log" ||
  { echo "check_local.sh: error: the coordinator did not commit both rounds" >&2; exit 1; }
echo "check_local.sh: the island's 2 ranks ran under srun and the run committed both rounds"
