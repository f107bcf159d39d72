#!/bin/bash
#SBATCH --job-name=star-reco-2019-apptainer-late.pilot
#SBATCH --partition=compute
#SBATCH --account=star
#SBATCH --nodes=1
#SBATCH --exclusive
#SBATCH --time=1-00:00:00
#SBATCH --signal=B:USR1@120
#SBATCH --no-requeue
#SBATCH --output=/plans/star-generic-apptainer-late/logs/%x-%j.out
#SBATCH --comment=hpcrun:star-reco-2019-apptainer-late
#
# hpcrun 0.1.0: campaign star-reco-2019-apptainer-late, a pilot (late binding).
# Generated from examples/star-generic-apptainer-late/campaign.yaml with site profile generic-apptainer; re-run `hpcrun plan`
# instead of editing. Exit 0: it stopped by itself (campaign done, idle, drained or fenced).
set -uo pipefail
umask 022
export HPCRUN_CAMPAIGN=star-reco-2019-apptainer-late
export HPCRUN_PLAN_DIR=/plans/star-generic-apptainer-late
export HPCRUN_NODE_KEY=8587dd28c8
export HPCRUN_PILOT_NODE_KEY=$HPCRUN_NODE_KEY   # its database's node-local directory, whatever an input's generation
export HPCRUN_RELEASE=SL19c
export STAR_LEVEL=SL19c
export HPCRUN_JOB_ID=${SLURM_JOB_ID:-}
export HPCRUN_NODES=${SLURM_JOB_NUM_NODES:-1}
export HPCRUN_ARRAY_INDEX=${SLURM_ARRAY_TASK_ID:?this script is a job array}
export HPCRUN_NODE=${SLURMD_NODENAME:-$(hostname)}
pilot_prefix=''   # job ids repeat across a campaign's clusters: its pilots' ids name theirs
export HPCRUN_PILOT_ID=$pilot_prefix$HPCRUN_JOB_ID
seat_dir=''   # where this cluster's copies of the plan's scripts are ("": the first cluster's)
export HPCRUN_PILOT_RUNDIR="$HPCRUN_PLAN_DIR/run/pilots/$HPCRUN_PILOT_ID"
export HPCRUN_RUNDIR=$HPCRUN_PILOT_RUNDIR
Q=/plans/star-generic-apptainer-late/queue
ME="$Q/live/$HPCRUN_PILOT_ID"
slots=3
idle_s=300
beat_s=10
drain_s=120
claim_before=120
steal_s=0   # a slot idle this long takes inputs cached on another node (jobs.locality_wait)
started=$EPOCHSECONDS
ends=$(( started + 86400 ))

log() { TZ=UTC printf '%(%Y-%m-%dT%H:%M:%SZ)T pilot[%s]: %s\n' -1 "$HPCRUN_PILOT_ID" "$*" >&2; }
[ ! -e "$Q/stop" ] || { log "the campaign is done: nothing to claim"; exit 0; }
py=python3   # the site profile's tools.python
command -v "$py" > /dev/null || { log "$py is not on this node's PATH: the pilot's agent cannot run (tools.python in the site profile)"; exit 3; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 7))' 2> /dev/null \
  || { log "$("$py" -V 2>&1) on this node: the pilot's agent needs Python 3.7 or later (tools.python in the site profile)"; exit 3; }
mkdir -p "$HPCRUN_PILOT_RUNDIR/claims" "$Q/live" "$Q/done" "$Q/results"
mkdir -- "$ME" || { log "cannot make $ME"; exit 3; }
printf '%s\t%s\t%s\t%s\n' "$HPCRUN_NODE" "$slots" "$started" "$ends" > "$ME/info"
touch "$ME/beat"
log "pilot on $HPCRUN_NODE: $slots slot(s) until $(date -u -d "@$ends" +%H:%M:%SZ), queue $Q"
# shellcheck disable=SC2329  # called below
launch_in_batch() {
  # $1 tasks, then their command: each task a process of this batch step (no scheduler step, so no
  # controller RPC), told its rank by HPCRUN_TASK_RANK and HPCRUN_TASK_COUNT; bound to its share of
  # the job's CPUs where the job is confined to exactly those (as the launcher binds tasks); SIGTERM,
  # SIGINT, SIGUSR1 and SIGUSR2 are passed on to every task and the highest exit status of the tasks
  # is returned, as the launcher does
  trap - EXIT
  local n=$1 k range cpus=() ranges=() pids=() per=0 rc=0 one pid node_cpus=""
  shift
  if [ -n "$node_cpus" ] && command -v taskset > /dev/null; then
    IFS=, read -ra ranges < <(awk '/^Cpus_allowed_list/ { print $2 }' /proc/self/status) || true
    for range in "${ranges[@]}"; do
      for ((k = ${range%-*}; k <= ${range#*-}; k++)); do cpus+=("$k"); done
    done
    if [ "${#cpus[@]}" -eq "${node_cpus:-0}" ] && [ "${#cpus[@]}" -ge "$n" ]; then per=$(( ${#cpus[@]} / n )); fi
  fi
  # shellcheck disable=SC2317  # trap handler
  trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM
  trap 'kill -INT "${pids[@]}" 2>/dev/null || true' INT
  trap 'kill -USR1 "${pids[@]}" 2>/dev/null || true' USR1
  trap 'kill -USR2 "${pids[@]}" 2>/dev/null || true' USR2
  for ((k = 0; k < n; k++)); do
    if [ "$per" -gt 0 ]; then
      HPCRUN_TASK_RANK=$k HPCRUN_TASK_COUNT=$n taskset -c "$(IFS=,; printf '%s' "${cpus[*]:k*per:per}")" "$@" &
    else
      HPCRUN_TASK_RANK=$k HPCRUN_TASK_COUNT=$n "$@" &
    fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    one=0
    wait "$pid" || one=$?
    while kill -0 "$pid" 2>/dev/null; do
      one=0
      wait "$pid" || one=$?
    done
    [ "$one" -le "$rc" ] || rc=$one
  done
  return "$rc"
}

DB_PID=""
# ---- one database server for every input this pilot runs: the payload copied once ----------
export HPCRUN_PILOT_DB_PORT=$(( 20000 + HPCRUN_JOB_ID % 10000 ))
export HPCRUN_DB_PORT=$HPCRUN_PILOT_DB_PORT HPCRUN_DB_HOST=localhost
mkdir -p "$HPCRUN_RUNDIR/db"
launch_in_batch 1 \
  apptainer exec -B "${HPCRUN_PLAN_DIR}":"${HPCRUN_PLAN_DIR}" -B /scratch/starprod/conditions/mysql-2019:/scratch/starprod/conditions/mysql-2019:ro -B /local:/local -B /scratch/starprod/work:/scratch/starprod/work -B /scratch/starprod/reco/2019:/scratch/starprod/reco/2019 -B /scratch/starprod/raw/2019:/scratch/starprod/raw/2019:ro /scratch/starprod/images/star-sl19c.sif bash "$HPCRUN_PLAN_DIR/bin/hpcrun-db.sh" \
  > "$HPCRUN_RUNDIR/db/supervisor.log" 2>&1 &
DB_PID=$!
db_deadline=$(( SECONDS + 1660 ))
while :; do
  ready=("$HPCRUN_RUNDIR"/db/*.ready)
  failed=("$HPCRUN_RUNDIR"/db/*.failed)
  if [ -e "${failed[0]}" ] || ! kill -0 "$DB_PID" 2>/dev/null || [ "$SECONDS" -ge "$db_deadline" ]; then
    log "the database server did not start; this pilot claims nothing (see $HPCRUN_RUNDIR/db)"
    rmdir "$ME" 2>/dev/null || rm -rf -- "$ME"
    exit 5
  fi
  [ ! -e "${ready[0]}" ] || break
  sleep 1
done
printf '1\n' > "$HPCRUN_RUNDIR/payload-copies"
db_payload=/scratch/starprod/conditions/mysql-2019
log "database server ready (payload $db_payload copied once for this pilot)"

# shellcheck disable=SC2329  # called on the way out
stop_db() {
  [ -n "$DB_PID" ] || return 0
  touch "$HPCRUN_RUNDIR/db/stop"
  local waited=0
  while kill -0 "$DB_PID" 2>/dev/null && [ "$waited" -lt 20 ]; do sleep 1; waited=$((waited + 1)); done
  kill -TERM "$DB_PID" 2>/dev/null || true
  wait "$DB_PID" 2>/dev/null || true
  DB_PID=""
}

AGENT_PID=""
# shellcheck disable=SC2329  # trap handler: the scheduler's drain signal (--signal=B:USR1@drain_s), passed on
on_drain() {
  [ -z "$AGENT_PID" ] || kill -USR1 "$AGENT_PID" 2>/dev/null
}
# shellcheck disable=SC2329  # called by the trap handler
pgroups() {
  # whether any of these process groups still has a process
  local g
  for g in "$@"; do kill -0 -- "-$g" 2>/dev/null && return 0; done
  return 1
}
# shellcheck disable=SC2329  # trap handler
on_exit() {
  trap - EXIT
  trap '' TERM USR1
  local pid pids=() waited=0 f line
  if [ -n "$AGENT_PID" ]; then   # the agent stops its inputs and hands its claims back itself
    kill -TERM "$AGENT_PID" 2>/dev/null
    wait "$AGENT_PID" 2>/dev/null
  fi
  # an agent that could not (killed): its inputs' scripts stopped here, each leads a process group of its own
  # (only this pilot's claims: a token returned from another pilot names a process of another node). Only as a
  # group: a script that ended was reaped, and its pid may be another process of the user's now
  for f in "$ME"/*_* "$Q/fenced/$HPCRUN_PILOT_ID"/*_* "$Q/ended/$HPCRUN_PILOT_ID"/*_*; do
    [ -e "$f" ] || continue
    IFS=$'\t' read -r -a line < "$f" || true
    pid=${line[4]:-}
    [[ "${line[0]:-}" == "$HPCRUN_PILOT_ID."* && "$pid" =~ ^[1-9][0-9]*$ ]] || continue   # never 0: "-0" is our own group
    pids+=("$pid")
    kill -TERM -- "-$pid" 2>/dev/null
  done
  while [ "${#pids[@]}" -gt 0 ] && pgroups "${pids[@]}" && [ "$waited" -lt 150 ]; do
    sleep 0.1; waited=$((waited + 1))
  done
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  if [ -d "$ME" ]; then
    if compgen -G "$ME/*_*" > /dev/null || compgen -G "$ME/.take.*" > /dev/null || compgen -G "$ME/.rest.*" > /dev/null; then
      mv -T -- "$ME" "$Q/fenced/$HPCRUN_PILOT_ID" 2>/dev/null && log "its claims handed back to the queue"
    else
      rm -rf -- "$ME"
    fi
  fi
  stop_db
  printf '%s\t%s\t%s\t%s\n' "$HPCRUN_NODE" "$slots" "$started" "$EPOCHSECONDS" > "$HPCRUN_PILOT_RUNDIR/pilot.tsv"
}
trap on_drain USR1
trap on_exit EXIT
trap 'log "pilot cancelled (SIGTERM): its claims return to the queue"; exit 143' TERM

# ---- the agent: one process claims, runs, times and commits every input of this pilot (3 at once) ----
"$py" "$HPCRUN_PLAN_DIR/${seat_dir}bin/hpcrun-pilot.py" --queue "$Q" --pilot "$HPCRUN_PILOT_ID" --node "$HPCRUN_NODE" \
  --rundir "$HPCRUN_PILOT_RUNDIR" --slots "$slots" --ends "$ends" --idle-s "$idle_s" --beat-s "$beat_s" \
  --drain-s "$drain_s" --claim-before "$claim_before" --steal-s "$steal_s" --input-s 28800 \
  --seat-dir "$seat_dir" --bb-root "${BB:-}" &
AGENT_PID=$!
rc=0
wait "$AGENT_PID" || rc=$?
while kill -0 "$AGENT_PID" 2>/dev/null; do
  rc=0
  wait "$AGENT_PID" || rc=$?
done
AGENT_PID=""
exit 0
