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
NEAR="$Q/near/${HPCRUN_NODE%%.*}"   # locality hints are named by the short node name (the cache index's)
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
mkdir -p "$HPCRUN_PILOT_RUNDIR/claims" "$Q/live" "$Q/done"
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
SLOT_PIDS=()
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

timer=()
[ ! -x /usr/bin/time ] || timer=(/usr/bin/time -f '%U %S %M' -o)
own_group=()   # each claim's script in a process group of its own, signalled as a whole
! command -v setsid > /dev/null || own_group=(setsid)

# shellcheck disable=SC2329  # called below
signal_claim() {
  # $1 the claim's process (the timer, or the script itself), $2 the signal. The script leads a process group
  # of its own (setsid), so TERM and KILL reach its chains too, which would otherwise write on; USR1 (the time
  # limit's warning) is the script's alone.
  local kids=() k
  if [ "${#timer[@]}" -gt 0 ]; then mapfile -t kids < <(pgrep -P "$1" 2>/dev/null); else kids=("$1"); fi
  for k in "${kids[@]}"; do
    if [ "$2" != USR1 ] && [ "${#own_group[@]}" -gt 0 ]; then kill "-$2" -- "-$k" 2>/dev/null && continue; fi
    kill "-$2" "$k" 2>/dev/null || true
  done
}

# shellcheck disable=SC2329  # called below
claim() {
  # the next task into $task: first one whose inputs this node's cache holds (locality hints, near/<node>/),
  # then a few of the waiting ones tried from a random place (the slots of every pilot look at once),
  # leaving those hinted to another node's pilot until this slot idled steal_s; the first rename that
  # succeeds wins. No process is started but the rename.
  local near waiting k n tries=0 hinted
  for near in "$NEAR"/*_*; do
    [ -e "$near" ] || break
    task=${near##*/}
    [ ! -e "$Q/ready/$task" ] || ! mv -- "$Q/ready/$task" "$ME/$task" 2>/dev/null || return 0
  done
  waiting=("$Q"/ready/*_*)
  n=${#waiting[@]}
  [ -e "${waiting[0]}" ] || return 1
  k=$(( RANDOM % n ))
  while [ "$tries" -lt 6 ] && [ "$tries" -lt "$n" ]; do
    task=${waiting[(k + tries) % n]##*/}
    tries=$((tries + 1))
    if [ "$1" -lt "$steal_s" ]; then
      hinted=("$Q"/near/*/"$task")
      [ ! -e "${hinted[0]}" ] || continue
    fi
    mv -- "$Q/ready/$task" "$ME/$task" 2>/dev/null && return 0
  done
  return 1
}

# shellcheck disable=SC2329  # called below
commit() {
  # $1 task, $2 claim id, $3 the result line. The commit is one link(2) into done/, from this pilot's
  # directory: a fenced pilot's directory was renamed away, so however long it stalled, its link finds
  # nothing; and a result already there is never replaced (the first commit stands). No output is moved
  # here: the claim's outputs wait in its own directory, and the supervisor places the committed claim's.
  if { printf '%s\n' "$3" > "$ME/$1" && ln -T -- "$ME/$1" "$Q/done/$1"; } 2>/dev/null; then
    rm -f -- "$ME/$1"
    return 0
  fi
  # fenced (the claim is gone from here), or another claim's result is there already (this one goes)
  [ ! -e "$Q/done/$1" ] || rm -f -- "$ME/$1" 2>/dev/null
  log "claim $2 of $1 was taken from this pilot: its result is dropped, its outputs never placed"
  return 1
}

# shellcheck disable=SC2329  # called below
run_claim() {
  # $1 task, $2 slot, $3 the slot's claim number: the plan's array script for that task, timed, limited
  local task=$1 slot=$2 qid=${1%_*} idx=${1##*_} script limit cid t0 t1 rc=0 state cpu="" rss="" pid watch line u sy
  cid="$HPCRUN_PILOT_ID.$slot.$3"
  if ! IFS=$'\t' read -r script limit _ < "$Q/arrays/$qid"; then
    log "no descriptor for $task: returned"
    mv -- "$ME/$task" "$Q/ready/$task" 2>/dev/null
    sleep 5   # not claimed again at once by this slot
    return 0
  fi
  # the task names the first cluster's script; this cluster's copy is in clusters/<name>/ of its plan (or generation)
  if [ -n "$seat_dir" ] && [[ "$script" == */jobs/* ]] && [ -e "${script%/jobs/*}/${seat_dir}jobs/${script##*/jobs/}" ]; then
    script="${script%/jobs/*}/${seat_dir}jobs/${script##*/jobs/}"
  fi
  t0=${EPOCHREALTIME/[!0-9]/.}   # the locale's decimal point (a comma in de_DE) made a dot
  printf '%s\t%s\t%s\t%s\n' "$cid" "$slot" "$HPCRUN_NODE" "$t0" > "$ME/$task" 2>/dev/null || return 0
  HPCRUN_CLAIM_ID=$cid HPCRUN_CLAIM_INDEX=$idx "${timer[@]}" ${timer[0]:+"$ME/.$task.time"} \
    "${own_group[@]}" bash "$script" > "$HPCRUN_PILOT_RUNDIR/claims/$cid.log" 2>&1 &
  pid=$!
  printf '%s\n' "$pid" > "$ME/.$task.pid"
  # the input's own time limit, as its array task would have it: the pre-timeout signal, then the end
  (
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep "$(( limit > claim_before ? limit - claim_before : limit ))" & sp=$!
    wait "$sp"
    signal_claim "$pid" USR1
    sleep "$claim_before" & sp=$!
    wait "$sp"
    : > "$ME/.$task.timeout"
    signal_claim "$pid" KILL
    kill -KILL "$pid" 2>/dev/null
  ) &
  watch=$!
rc=0
wait "$pid" || rc=$?
while kill -0 "$pid" 2>/dev/null; do
  rc=0
  wait "$pid" || rc=$?
done
  kill "$watch" 2>/dev/null
  wait "$watch" 2>/dev/null
  t1=${EPOCHREALTIME/[!0-9]/.}
  if [ -e "$ME/.$task.cancelled" ]; then state=CANCELLED
  elif [ -e "$ME/.$task.timeout" ]; then state=TIMEOUT
  elif [ "$rc" -eq 0 ]; then state=COMPLETED
  else state=FAILED
  fi
  if [ -s "$ME/.$task.time" ]; then   # the timer's last line: user and system seconds, maximum RSS in KiB
    while read -r line; do read -r u sy rss <<< "$line"; done < "$ME/.$task.time"
    u=${u/,/.} sy=${sy/,/.}
    if [[ "$u" =~ ^[0-9.]+$ && "$sy" =~ ^[0-9.]+$ ]]; then cpu="$u+$sy"; else cpu=""; rss=""; fi
  fi
  rm -f -- "$ME/.$task.pid" "$ME/.$task.time" "$ME/.$task.timeout" "$ME/.$task.cancelled"
  printf -v line '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$task" "$cid" "$HPCRUN_PILOT_ID" \
    "$slot" "$HPCRUN_NODE" "$t0" "$t1" "$rc" "$state" "$cpu" "$rss"
  commit "$task" "$cid" "$line" || true
  log "slot $slot: $task ($cid) $state, exit $rc"
}

# shellcheck disable=SC2329  # run in the background below
slot_loop() {
  # one slot: claim, run, commit, until the campaign is done, the pilot drains or is fenced, or nothing
  # came to claim for idle_s while the whole pilot had nothing running
  local slot=$1 n=0 idle_since=$SECONDS nap=0 task expected left held stop_at until naps=(0.2 0.5 1 2 5)
  # on TERM: its claim's timer and script too, if any (their result would be dropped)
  trap '[ -z "${watch:-}" ] || kill "$watch" 2>/dev/null; [ -z "${pid:-}" ] || signal_claim "$pid" TERM; exit 143' TERM
  trap ':' USR1   # the drain is the pilot's (a handler, not ignored: the claims' scripts trap USR1 themselves)
  # the slots start a tenth of a second apart: their inputs then start (and end) spread out, not all at
  # once on a node whose CPUs they share
  [ "$slot" -eq 0 ] || sleep "$(( slot / 10 )).$(( slot % 10 ))"
  while :; do
    [ -d "$ME" ] || return 0
    [ ! -e "$Q/stop" ] || return 0
    [ ! -e "$ME/draining" ] || return 0
    if [ ! -e "$Q/paused" ]; then
      read -r expected 2>/dev/null < "$Q/expected" || expected=28800
      stop_at=$(( ends - drain_s ))
      # a maintenance window of this cluster (the supervisor writes its start): every input ends before it
      if read -r until 2>/dev/null < "$ME/until" && [[ "$until" =~ ^[0-9]+$ ]] && [ "$until" -lt "$stop_at" ]; then
        stop_at=$until
      fi
      left=$(( stop_at - EPOCHSECONDS ))
      if [ "${expected:-0}" -gt "$left" ]; then
        log "slot $slot: $left s left before the drain or the cluster's maintenance, an input takes about ${expected} s: claiming nothing more"
        return 0
      fi
      if claim $(( SECONDS - idle_since )); then
        run_claim "$task" "$slot" "$n"
        n=$((n + 1))
        idle_since=$SECONDS
        nap=0
        continue
      fi
    fi
    if [ $(( SECONDS - idle_since )) -ge "$idle_s" ]; then
      held=("$ME"/*_*)
      [ -e "${held[0]}" ] || { log "slot $slot: nothing to claim for ${idle_s} s: released"; return 0; }
    fi
    sleep "${naps[nap]}"   # the queue looked at soon after a miss, then less and less often
    [ "$nap" -ge 4 ] || nap=$((nap + 1))
  done
}

# shellcheck disable=SC2329  # trap handler: the scheduler's drain signal (--signal=B:USR1@drain_s)
on_drain() {
  touch "$ME/draining" 2>/dev/null
  log "drain signal: claiming nothing more; running inputs finish"
}
# shellcheck disable=SC2329  # trap handler
on_exit() {
  trap - EXIT
  trap '' TERM
  [ -z "${BEAT_PID:-}" ] || kill "$BEAT_PID" 2>/dev/null
  # the slots first: once they are gone nothing claims, so what this pilot holds is known and stays so
  local pid f
  for pid in "${SLOT_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${SLOT_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  # inputs still running: their results would be dropped, so they stop (TERM, KILL after 15 s) before
  # their claims go back, lest one write on while its input runs again elsewhere
  local pids=() waited=0
  for f in "$ME"/.*.pid "$Q/fenced/$HPCRUN_PILOT_ID"/.*.pid "$Q/ended/$HPCRUN_PILOT_ID"/.*.pid; do
    [ -e "$f" ] || continue
    read -r pid < "$f" && pids+=("$pid") && signal_claim "$pid" TERM
  done
  while [ "${#pids[@]}" -gt 0 ] && kill -0 "${pids[@]}" 2>/dev/null && [ "$waited" -lt 150 ]; do
    sleep 0.1; waited=$((waited + 1))
  done
  for pid in "${pids[@]}"; do signal_claim "$pid" KILL; kill -KILL "$pid" 2>/dev/null; done
  stop_db
  printf '%s\t%s\t%s\t%s\n' "$HPCRUN_NODE" "$slots" "$started" "$EPOCHSECONDS" > "$HPCRUN_PILOT_RUNDIR/pilot.tsv"
  # its directory leaves live/ as a whole: to fenced/ when it holds claims (the supervisor returns them, none
  # counted as an attempt), removed when it holds none (a fenced pilot's is already gone)
  held=("$ME"/*_*)
  if [ -e "${held[0]}" ]; then
    mv -T -- "$ME" "$Q/fenced/$HPCRUN_PILOT_ID" 2>/dev/null && log "its ${#held[@]} claim(s) handed back to the queue"
  elif [ -d "$ME" ]; then
    rm -rf -- "$ME"
  fi
  log "pilot ends"
}
trap on_drain USR1
trap on_exit EXIT
trap 'log "pilot cancelled (SIGTERM): its claims return to the queue"; exit 143' TERM

# ---- the lease: renewed every beat_s seconds; operators' cancels of running inputs carried out ----
(
  trap 'exit 0' TERM
  while [ -d "$ME" ]; do
    touch "$ME/beat" 2>/dev/null || break
    for c in "$Q"/cancel/*; do
      [ -e "$c" ] || break
      t=${c##*/}
      if [ -e "$ME/$t" ] && [ -e "$ME/.$t.pid" ]; then
        : > "$ME/.$t.cancelled"
        read -r p < "$ME/.$t.pid" && signal_claim "$p" TERM
      fi
    done
    sleep "$beat_s" & wait $!
  done
  # fenced: the claims here were returned to the queue; the pilot stops, its slots first, then their claims'
  # scripts (each in a process group of its own, which a TERM to this group would not reach)
  kill -TERM $$ 2>/dev/null
) &
BEAT_PID=$!

for ((s = 0; s < slots; s++)); do
  slot_loop "$s" &
  SLOT_PIDS+=($!)
done
for pid in "${SLOT_PIDS[@]}"; do
rc=0
wait "$pid" || rc=$?
while kill -0 "$pid" 2>/dev/null; do
  rc=0
  wait "$pid" || rc=$?
done
done
exit 0
