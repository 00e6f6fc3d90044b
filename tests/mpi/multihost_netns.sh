#!/usr/bin/env bash
# Usage: multihost_netns.sh MPIRUN TRAIN_GPT RANKS_TEST SEQUENCE_TEST WORK_DIR
#
# Several machines for real, on one: two "hosts" as Linux network namespaces (each with its
# own network stack, addresses and loopback) joined by a virtual Ethernet cable (a veth
# pair), and MPI between them over TCP only (no shared memory). mpirun runs in the first
# namespace and starts Open MPI's daemon in each through a launch agent that enters the
# namespace, as ssh would log in to another machine. Then:
#   - train_gpt on 2 hosts x 2 ranks gives one process's losses and weights, and the bytes
#     that crossed the cable are at least what the gradient sums must move;
#   - the same with the optimizer's state sharded (--shard optimizer, ZeRO stage 1), and the
#     bytes that crossed the cable at least what its rings send;
#   - ring and Ulysses attention across the hosts equal one process (T = 512).
# Skips (exit 77, one line saying why) where namespaces cannot be made: not root, no
# iproute2, or a container that forbids them.
set -u
mpirun=$1 train_gpt=$2 ranks_test=$3 sequence_test=$4 work=$5
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root (CI runs as root)"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"

# Names of our own: this process's id and a random number keep two runs of the test apart
# (a process in another container on the same machine may have the same id). An interface's
# name has at most 15 characters: a, up to 7 digits of process id, 4 hex digits and a or b.
tag=$$$(printf '%04x' "$RANDOM")
h1=attn${tag}h1 h2=attn${tag}h2 v1=a${tag}a v2=a${tag}b
rm -rf "$work" && mkdir -p "$work"
if ! ip netns add "$h1" 2>"$work/netns.err"; then
  skip "network namespaces are not allowed here ($(head -1 "$work/netns.err"))"
fi
cleanup() { ip netns del "$h1" 2>/dev/null; ip netns del "$h2" 2>/dev/null; }
trap cleanup EXIT
set -e
ip netns add "$h2"
ip link add "$v1" type veth peer name "$v2"
ip link set "$v1" netns "$h1"
ip link set "$v2" netns "$h2"
ip -n "$h1" addr add 10.28.0.1/24 dev "$v1"
ip -n "$h2" addr add 10.28.0.2/24 dev "$v2"
for h in "$h1" "$h2"; do ip -n "$h" link set lo up; done
ip -n "$h1" link set "$v1" up
ip -n "$h2" link set "$v2" up
set +e

# mpirun's launch agent: "AGENT HOST COMMAND..." runs the command on that host. Each daemon
# gets a temp folder of its own, as on a machine of its own: in one folder the daemons of a
# job and those of the job before, still ending, made and removed the same session
# directory (ompi.HOST.UID) at once, and a daemon failed to start ("A call to mkdir was
# unable to create the desired directory").
cat >"$work/netns_agent.sh" <<'EOF'
#!/bin/sh
host=$1; shift
tmp=$(mktemp -d "${TMPDIR:-/tmp}/$host.XXXXXX") || exit 1
exec ip netns exec "$host" env TMPDIR="$tmp" sh -c "$*"
EOF
chmod +x "$work/netns_agent.sh"
# Two slots on each host; MPI over TCP on the cable only, daemons reached over it too.
# rtc_hwloc_vmhole none: no daemon shares its hardware map through shared memory mapped at
# an address it guesses is free; a daemon started in the second namespace crashed in
# hwloc_shmem_topology_write in about 4 runs of 10 without it.
across=("$mpirun" --allow-run-as-root --oversubscribe --bind-to none --host "$h1:2,$h2:2"
        --mca rtc_hwloc_vmhole none
        --mca plm_rsh_agent "$work/netns_agent.sh" --mca btl tcp,self
        --mca btl_tcp_if_include 10.28.0.0/24 --mca oob_tcp_if_include 10.28.0.0/24)
# PMIx's shared-memory store of the job's data (gds ds21) is one per machine, and here two
# daemons on one machine each think they own it: "PMIX ERROR ... dstore_base.c" in some runs.
# The hash store keeps that data in each daemon's own memory, as on separate machines.
export PMIX_MCA_gds=hash
tx_bytes() { ip netns exec "$h1" cat "/sys/class/net/$v1/statistics/tx_bytes"; }
status=0

# Each rank says which network namespace it runs in: two hosts, two ranks each.
ip netns exec "$h1" "${across[@]}" -np 4 sh -c 'echo "$OMPI_COMM_WORLD_RANK $(readlink /proc/self/ns/net)"' \
  >"$work/where.txt" 2>"$work/where.err"
hosts=$(awk '{print $2}' "$work/where.txt" | sort -u | wc -l)
if [ "$hosts" -eq 2 ] && [ "$(grep -cE '^[0-3] net:' "$work/where.txt")" -eq 4 ]; then
  echo "ok: 4 ranks in 2 network namespaces: $(sort "$work/where.txt" | tr '\n' ';')"
else
  echo "FAIL: expected 4 ranks in 2 namespaces, got:"; cat "$work/where.txt" "$work/where.err"; status=1
fi
if [ -s "$work/where.err" ]; then echo "(mpirun also said: $(head -3 "$work/where.err" | tr '\n' ' '))"; fi

# Data parallelism across the hosts against one process.
corpus=$work/corpus.txt
for i in $(seq 400); do echo "the quick brown fox jumps over the lazy dog, $i times."; done >"$corpus"
run=(--recipe tiny --max-iters 10 --eval-interval 5 --eval-iters 2 --sample 16 --threads 1 --data "$corpus")
"$train_gpt" "${run[@]}" --out "$work/alone" >"$work/alone.log" 2>&1 || { echo "FAIL: one process"; cat "$work/alone.log"; exit 1; }
# across NAME BYTES_PER_PARAMETER WHAT [FLAGS...]: train_gpt on 2 hosts x 2 ranks with FLAGS
# gives one process's run, and host 1 sends at least BYTES_PER_PARAMETER x P bytes a step
# over the cable (WHAT: what needs them).
across() {
  local name=$1 per=$2 what=$3; shift 3
  local before after rc params sent least label="train_gpt${*:+ $*}"
  before=$(tx_bytes)
  ip netns exec "$h1" "${across[@]}" -np 4 "$train_gpt" "${run[@]}" "$@" --out "$work/$name" >"$work/$name.log" 2>&1
  rc=$?
  after=$(tx_bytes)
  if [ $rc -ne 0 ]; then
    echo "FAIL: $label on 2 hosts x 2 ranks exited $rc:"; tail -20 "$work/$name.log"; status=1; return
  fi
  "$ranks_test" compare "$work/$name" "$work/alone" "$corpus" "${run[@]}" "$@" || status=1
  params=$(grep -oE '[0-9]+ parameters' "$work/$name.log" | head -1 | grep -oE '^[0-9]+')
  sent=$((after - before)) least=$((10 * per * params))
  if [ "$sent" -ge "$least" ]; then
    echo "ok: $label: host 1 sent $sent bytes over the cable during training ($what: at least $least)"
  else
    echo "FAIL: $label: host 1 sent $sent bytes over the cable, less than the $least $what need"; status=1
  fi
}
# Each step sums the P gradients (4 bytes each) over the 4 ranks: whatever MPI's algorithm,
# what host 1's ranks hold must reach host 2's, at least half the gradient bytes per step (a
# ring allreduce moves 2(N-1)/N of them per rank): 2 bytes a parameter.
across across 2 "the gradient sums"
# ZeRO stage 1: each rank's rings send every shard but one in the reduce-scatter and every
# shard but one in the all-gather, with 4 ranks 1.5 P floats a step each. However the ranks
# are placed, at least one ring edge runs from host 1 to host 2, so host 1 sends at least one
# rank's 6 bytes a parameter a step.
across sharded 6 "the rings" --shard optimizer

# Ring and Ulysses attention across the hosts.
ip netns exec "$h1" "${across[@]}" -np 4 "$sequence_test" --quick >"$work/sequence.log" 2>&1
rc=$?
grep -E "^(ok|FAIL)" "$work/sequence.log"
[ $rc -eq 0 ] || { echo "FAIL: ring and Ulysses attention across hosts exited $rc"; tail -5 "$work/sequence.log"; status=1; }
exit $status
