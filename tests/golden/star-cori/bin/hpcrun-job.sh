#!/bin/bash
#
# hpcrun 0.1.0: campaign star-reco-2019, the steps shared by the job scripts of this plan.
# Generated from examples/star-cori/campaign.yaml with site profile nersc-cori-haswell; re-run `hpcrun plan`
# instead of editing. Exit codes: 0 ok, 3 setup, 4 payload copy, 5 DB never ready,
# 6 DB died too often, 7 chain failed, 8 merge failed, 9 QA failed, 10 time limit,
# 11 input checksum mismatch, 13 input transfer failed, 14 a chain was killed by a signal.
set -euo pipefail
# records and outputs on the shared filesystem: readable by the team, writable by the user alone;
# node-local directories are made 0700 (see private_dir)
umask 022
# shellcheck disable=SC2034  # the full table of exit codes; not every job uses each one
readonly EXIT_SETUP=3 EXIT_PAYLOAD=4 EXIT_DB_NOT_READY=5 EXIT_DB_DIED=6 \
  EXIT_CHAIN=7 EXIT_MERGE=8 EXIT_QA=9 EXIT_TIMEOUT=10 EXIT_CHECKSUM=11 \
  EXIT_TRANSFER=13 EXIT_CHAIN_KILLED=14

export HPCRUN_CAMPAIGN=star-reco-2019
export HPCRUN_PLAN_DIR=/plans/star-cori
export HPCRUN_NODE_KEY=a43e68d0d8
export HPCRUN_RELEASE=SL19c
export STAR_LEVEL=SL19c
export HPCRUN_JOB_ID=${SLURM_JOB_ID:-}
export HPCRUN_NODES=${SLURM_JOB_NUM_NODES:-1}

# the stamp in UTC, worked out again only when the second changes: a TZ of its own on every line made bash read the
# zone files twice a line (a late input logs five lines; its claim's loop refreshes the stamp before it starts one);
# a bash without EPOCHSECONDS (before 5.0) works it out every line, as before
log_clock() {
  local now=${EPOCHSECONDS:-}
  [ -n "$now" ] && [ "$now" = "${hpcrun_log_second:-}" ] || {
    TZ=UTC printf -v hpcrun_log_stamp '%(%Y-%m-%dT%H:%M:%SZ)T' "${now:--1}"
    hpcrun_log_second=$now
  }
}
log() { log_clock; printf '%s hpcrun[%s]: %s\n' "$hpcrun_log_stamp" "${HPCRUN_JOB_ID:-local}" "$*" >&2; }
fail() {
  local code=$1
  shift
  log "FAILED: $*"
  printf '%s\n' "$*" > "${HPCRUN_RUNDIR:-.}/reason" 2>/dev/null || true
  exit "$code"
}


# ---- which job of the campaign this is ---------------------------------------------------
HPCRUN_JOB_INDEX=${HPCRUN_JOB_INDEX:?the job script sets it before it runs this shared body}
HPCRUN_JOB=""
HPCRUN_CHAINS_PER_NODE=""
HPCRUN_INPUTS=()
HPCRUN_EVENTS=()
HPCRUN_STEMS=()
HPCRUN_OUTPUT_NAMES=()
HPCRUN_CHECKSUMS=()
HPCRUN_SIZES=()
# shellcheck disable=SC2329  # called below
task_rows() {
  # $1 a job index: its rows of tasks.tsv, read where tasks.idx says they start (two reads, whatever the plan's
  # size), or, without the index or where it does not agree, found by a scan
  local off="" rows
  off=$(tail -c +$(( ($1 - 0) * 21 + 1 )) "$HPCRUN_PLAN_DIR/tasks.idx" 2>/dev/null \
        | head -c 20) || true
  if [[ "$off" =~ ^[0-9]+$ ]]; then
    rows=$(tail -c +$(( 10#$off + 1 )) "$HPCRUN_PLAN_DIR/tasks.tsv" | awk -F '\t' -v i="$1" '$1 == i { print; next } { exit }') || true
    if [ -n "$rows" ]; then printf '%s\n' "$rows"; return 0; fi
  fi
  awk -F '\t' -v i="$1" '$1 == i' "$HPCRUN_PLAN_DIR/tasks.tsv"
}
HPCRUN_TASK_ROWS=$(task_rows "$HPCRUN_JOB_INDEX") || true
while IFS=$'\t' read -r _index name chains path events stem output checksum size; do
  HPCRUN_JOB=$name
  HPCRUN_CHAINS_PER_NODE=$chains
  HPCRUN_INPUTS+=("$path")
  HPCRUN_EVENTS+=("$events")
  HPCRUN_STEMS+=("$stem")
  HPCRUN_OUTPUT_NAMES+=("$output")
  HPCRUN_CHECKSUMS+=("$checksum")
  HPCRUN_SIZES+=("$size")
done <<< "$HPCRUN_TASK_ROWS"
[ -n "$HPCRUN_JOB" ] || { log "no task $HPCRUN_JOB_INDEX in $HPCRUN_PLAN_DIR/tasks.tsv"; exit "$EXIT_SETUP"; }
export HPCRUN_JOB HPCRUN_CHAINS_PER_NODE
export HPCRUN_NCHAINS=$(( HPCRUN_NODES * HPCRUN_CHAINS_PER_NODE ))
export HPCRUN_RUNDIR="$HPCRUN_PLAN_DIR/run/$HPCRUN_JOB/${HPCRUN_JOB_ID:-local}"
export HPCRUN_INPUT_DIR="${DW_JOB_STRIPED%/}"/in
export HPCRUN_WORKDIR="${DW_JOB_STRIPED%/}"/work
export HPCRUN_OUTDIR="${DW_JOB_STRIPED%/}"/out
export HPCRUN_DB_PORT=$(( 20000 + ${HPCRUN_JOB_ID:-0} % 10000 ))
export HPCRUN_DB_HOST=localhost
mkdir -p "$HPCRUN_RUNDIR"
printf '%s\n' "$HPCRUN_TASK_ROWS" > "$HPCRUN_RUNDIR/inputs.tsv"
HPCRUN_GENERATION=1
log "job $HPCRUN_JOB: ${#HPCRUN_INPUTS[@]} input(s), $HPCRUN_NCHAINS chain(s) on $HPCRUN_NODES node(s), release ${HPCRUN_RELEASE:-(none)}, generation $HPCRUN_GENERATION"

DB_PID=""
CHAIN_PID=""
# Long steps run in the background and are waited for, so that bash handles the
# pre-timeout signal at once instead of after the step.
step() {
  "$@" &
  CHAIN_PID=$!
  local rc
  rc=0
  wait "$CHAIN_PID" || rc=$?
  while kill -0 "$CHAIN_PID" 2>/dev/null; do
    rc=0
    wait "$CHAIN_PID" || rc=$?
  done
  CHAIN_PID=""
  return "$rc"
}
# shellcheck disable=SC2329  # called from the EXIT trap
stop_db() {
  [ -n "$DB_PID" ] || return 0
  # Ask each supervisor to shut its server down (it watches for this file); signalling
  # the launcher instead would make the scheduler kill the step before the server has stopped.
  touch "$HPCRUN_RUNDIR/db/stop"
  local waited=0
  # stay well inside the scheduler's grace period (Slurm's KillWait: 30 s) after a cancel or time limit
  while kill -0 "$DB_PID" 2>/dev/null && [ "$waited" -lt 20 ]; do
    sleep 1
    waited=$((waited + 1))
  done
  if kill -0 "$DB_PID" 2>/dev/null; then
    log "database supervisors did not stop within 20 s; terminating the step"
    kill -TERM "$DB_PID" 2>/dev/null || true
    sleep 5
    kill -KILL "$DB_PID" 2>/dev/null || true
  fi
  wait "$DB_PID" 2>/dev/null || true
  DB_PID=""
  log "database servers stopped"
}
# shellcheck disable=SC2329  # called below
launch_in_batch() {
  # $1 tasks, then their command: each task a process of this batch step (no scheduler step, so no
  # controller RPC), told its rank by HPCRUN_TASK_RANK and HPCRUN_TASK_COUNT; bound to its share of
  # the job's CPUs where the job is confined to exactly those (as the launcher binds tasks); SIGTERM,
  # SIGINT, SIGUSR1 and SIGUSR2 are passed on to every task and the highest exit status of the tasks
  # is returned, as the launcher does
  trap - EXIT
  local n=$1 k range cpus=() ranges=() pids=() per=0 rc=0 one pid node_cpus="${SLURM_CPUS_ON_NODE:-}"
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
# shellcheck disable=SC2329  # trap handler
on_exit() {
  local rc=$?
  trap - EXIT
  set +e   # the way out runs to its end whatever fails in it: the exit code is rc, and it is recorded
  stop_db
  printf '%s\n' "$rc" > "$HPCRUN_RUNDIR/exit_code"
  log "job finished with exit code $rc"
  exit "$rc"
}
# shellcheck disable=SC2329  # trap handler for the pre-timeout signal
on_time_limit() {
  log "pre-timeout signal received: stopping chains and database servers cleanly"
  if [ -n "$CHAIN_PID" ]; then
    kill -TERM "$CHAIN_PID" 2>/dev/null || true
    local waited=0
    while kill -0 "$CHAIN_PID" 2>/dev/null && [ "$waited" -lt 30 ]; do
      sleep 1
      waited=$((waited + 1))
    done
  fi
  fail "$EXIT_TIMEOUT" "time limit reached before the job finished"
}
trap on_exit EXIT
trap on_time_limit USR1
trap 'fail 143 "job was cancelled (SIGTERM)"' TERM

for i in "${!HPCRUN_INPUTS[@]}"; do
  path=${HPCRUN_INPUTS[$i]}
  [ -z "$HPCRUN_INPUT_DIR" ] || path="$HPCRUN_INPUT_DIR/${path##*/}"
  [ -r "$path" ] || fail "$EXIT_SETUP" "input $path is missing or unreadable"
done
mkdir -p "$HPCRUN_WORKDIR" "$HPCRUN_OUTDIR" "$HPCRUN_RUNDIR/chains"

# ---- stage-in integrity: each input's md5, before any server or chain starts ----
checksum_algo=md5
checksum_tool=md5sum
checksum_hint='md5sum (GNU coreutils) must be on PATH on the compute nodes'
command -v "$checksum_tool" > /dev/null \
  || fail "$EXIT_SETUP" "checksum program $checksum_tool not found on $(hostname) ($checksum_hint)"
verify_start=$(date +%s%N)
verified=0
for i in "${!HPCRUN_INPUTS[@]}"; do
  expected=${HPCRUN_CHECKSUMS[$i]}
  [ "$expected" != "-" ] || continue
  path=${HPCRUN_INPUTS[$i]}
  [ -z "$HPCRUN_INPUT_DIR" ] || path="$HPCRUN_INPUT_DIR/${path##*/}"
  step md5sum -- "$path" > "$HPCRUN_RUNDIR/checksum.out" 2>> "$HPCRUN_RUNDIR/checksums.log" \
    || fail "$EXIT_CHECKSUM" "input checksum could not be computed: $path: $(tail -n 1 "$HPCRUN_RUNDIR/checksums.log")"
  read -r got _ < "$HPCRUN_RUNDIR/checksum.out" || true
  got=$checksum_algo:${got#\\}
  got=${got,,}
  printf '%s\t%s\t%s\n' "$path" "$expected" "$got" >> "$HPCRUN_RUNDIR/checksums.tsv"
  [ "$got" = "$expected" ] \
    || fail "$EXIT_CHECKSUM" "input checksum mismatch: $path: expected $expected, got $got"
  verified=$((verified + 1))
done
rm -f "$HPCRUN_RUNDIR/checksum.out"
log "verified the $checksum_algo checksum of $verified input(s) in $(( ($(date +%s%N) - verify_start) / 1000000 )) ms"

# ---- one database server per node, from a node-local copy of the payload ----------------
mkdir -p "$HPCRUN_RUNDIR/db"
db_server=/usr/sbin/mysqld
db_payload=/global/cscratch1/sd/starprod/conditions/mysql-2019
db_wait=1660
log "starting one $db_server per node (payload $db_payload)"
launch_in_batch 1 \
  shifter bash "$HPCRUN_PLAN_DIR/bin/hpcrun-db.sh" \
  > "$HPCRUN_RUNDIR/db/supervisor.log" 2>&1 &
DB_PID=$!
db_deadline=$(( SECONDS + db_wait ))
while :; do
  ready=("$HPCRUN_RUNDIR"/db/*.ready)
  failed=("$HPCRUN_RUNDIR"/db/*.failed)
  if [ -e "${failed[0]}" ]; then
    reason=$(cat "${failed[0]}")
    case "$reason" in
      payload*) fail "$EXIT_PAYLOAD" "database payload copy failed on ${failed[0]##*/}: $reason" ;;
      *) fail "$EXIT_DB_NOT_READY" "database server did not become ready: $reason" ;;
    esac
  fi
  [ -e "${ready[0]}" ] && [ "${#ready[@]}" -ge "$HPCRUN_NODES" ] && break
  kill -0 "$DB_PID" 2>/dev/null || fail "$EXIT_DB_NOT_READY" "database supervisor ended before the server answered; see $HPCRUN_RUNDIR/db"
  [ "$SECONDS" -lt "$db_deadline" ] || fail "$EXIT_DB_NOT_READY" "database server did not answer within ${db_wait}s"
  sleep 1
done
log "database servers answer on all $HPCRUN_NODES node(s)"

# ---- N chains per node, each its slice of every input ----------------------------------
log "starting $HPCRUN_NCHAINS chain(s)"
chains_rc=0
launch_in_batch "$HPCRUN_NCHAINS" \
  shifter bash "$HPCRUN_PLAN_DIR/bin/hpcrun-chain.sh" \
  > "$HPCRUN_RUNDIR/chains/launch.log" 2>&1 &
CHAIN_PID=$!
if [ -n "${CHAIN_PID:-}" ]; then   # none when the chain ran in this shell
  wait "$CHAIN_PID" || chains_rc=$?
fi
CHAIN_PID=""
# How each chain ended (chains.tsv): ok; failed (its program's own exit status: the same input
# fails again); crashed (a fault signal such as SIGSEGV: as deterministic); killed (SIGKILL,
# SIGTERM, SIGINT, SIGHUP, SIGXCPU from outside - the OOM killer, a health check - or no status
# at all because its helper was killed with it: transient, retried elsewhere).
failed_chains=""
killed_chains=""
for ((k = 0; k < HPCRUN_NCHAINS; k++)); do
  rc=missing
  read -r rc 2>/dev/null < "$HPCRUN_RUNDIR/chains/$k.rc" || true
  case $rc in
    0) ending=ok ;;
    missing | 129 | 130 | 137 | 143 | 152) ending=killed ;;
    *) if [ "$rc" -gt 128 ] 2>/dev/null; then ending=crashed; else ending=failed; fi ;;
  esac
  printf '%s\t%s\t%s\n' "$k" "$rc" "$ending" >> "$HPCRUN_RUNDIR/chains.tsv"
  case $ending in
    killed) killed_chains="$killed_chains $k(rc=$rc)" ;;
    failed | crashed) failed_chains="$failed_chains $k(rc=$rc)" ;;
  esac
done
db_failed=("$HPCRUN_RUNDIR"/db/*.failed)
if [ -e "${db_failed[0]}" ]; then
  fail "$EXIT_DB_DIED" "database server failed during the chains: $(cat "${db_failed[0]}")"
fi
if [ -n "$failed_chains" ]; then
  fail "$EXIT_CHAIN" "chain(s) failed:$failed_chains${killed_chains:+ (killed:$killed_chains)}; logs in $HPCRUN_RUNDIR/chains"
fi
if [ -n "$killed_chains" ] || [ "$chains_rc" -ne 0 ]; then
  fail "$EXIT_CHAIN_KILLED" "chain(s) killed by a signal:${killed_chains:- launcher exit $chains_rc}; logs in $HPCRUN_RUNDIR/chains"
fi
log "all $HPCRUN_NCHAINS chain(s) succeeded"

# ---- merge the chain parts of each input into one output --------------------------------
for i in "${!HPCRUN_STEMS[@]}"; do
  export HPCRUN_STEM=${HPCRUN_STEMS[$i]}
  export HPCRUN_INPUT=${HPCRUN_INPUTS[$i]}
  export HPCRUN_OUTPUT="$HPCRUN_OUTDIR/${HPCRUN_OUTPUT_NAMES[$i]}"
  HPCRUN_PARTS=()
  for ((k = 0; k < HPCRUN_NCHAINS; k++)); do
    HPCRUN_PARTS+=("$HPCRUN_WORKDIR/$HPCRUN_STEM.part$k")
  done
  export HPCRUN_NPARTS=${#HPCRUN_PARTS[@]}
  step shifter hadd -f "${HPCRUN_OUTPUT}" "${HPCRUN_PARTS[@]}" >> "$HPCRUN_RUNDIR/merge.log" 2>&1 \
    || fail "$EXIT_MERGE" "merge of $HPCRUN_STEM failed; see $HPCRUN_RUNDIR/merge.log"
done
log "merged ${#HPCRUN_STEMS[@]} output(s)"

# ---- QA: events in the merged output vs events in the input -----------------------------
qa_failed=""
qa_min_fraction=0.98
for i in "${!HPCRUN_STEMS[@]}"; do
  export HPCRUN_STEM=${HPCRUN_STEMS[$i]}
  export HPCRUN_INPUT=${HPCRUN_INPUTS[$i]}
  export HPCRUN_OUTPUT="$HPCRUN_OUTDIR/${HPCRUN_OUTPUT_NAMES[$i]}"
  if [ "${HPCRUN_EVENTS[$i]}" = "-" ]; then
    export HPCRUN_FILE="$HPCRUN_INPUT"
    [ -z "$HPCRUN_INPUT_DIR" ] || HPCRUN_FILE="$HPCRUN_INPUT_DIR/${HPCRUN_INPUT##*/}"
    HPCRUN_EVENTS_IN=$(shifter count-events "${HPCRUN_FILE}" 2>>"$HPCRUN_RUNDIR/qa.log" | tail -n 1)
  else
    HPCRUN_EVENTS_IN=${HPCRUN_EVENTS[$i]}
  fi
  export HPCRUN_FILE="$HPCRUN_OUTPUT"
  HPCRUN_EVENTS_OUT=$(shifter count-events "${HPCRUN_FILE}" 2>>"$HPCRUN_RUNDIR/qa.log" | tail -n 1)
  export HPCRUN_EVENTS_IN HPCRUN_EVENTS_OUT
  if [[ "$HPCRUN_EVENTS_IN" =~ ^[0-9]+$ && "$HPCRUN_EVENTS_OUT" =~ ^[0-9]+$ ]]; then
    verdict=$(awk -v o="$HPCRUN_EVENTS_OUT" -v n="$HPCRUN_EVENTS_IN" -v f="$qa_min_fraction" \
      'BEGIN { if (n == 0) print (o == 0 ? "pass" : "fail"); else print (o / n >= f ? "pass" : "fail") }')
  else
    verdict="fail"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$HPCRUN_STEM" "$HPCRUN_EVENTS_IN" "$HPCRUN_EVENTS_OUT" "$verdict" \
    "${HPCRUN_OUTPUT_NAMES[$i]}" "$HPCRUN_INPUT" >> "$HPCRUN_RUNDIR/qa.tsv"
  [ "$verdict" = pass ] || qa_failed="$qa_failed $HPCRUN_STEM($HPCRUN_EVENTS_OUT/$HPCRUN_EVENTS_IN events)"
  if [[ "$qa_failed" == *" $HPCRUN_STEM("* ]]; then
    # keep the output for inspection, but apart from the good ones
    mkdir -p "$HPCRUN_OUTDIR/qa-failed"
    mv -f -- "$HPCRUN_OUTPUT" "$HPCRUN_OUTDIR/qa-failed/" 2>/dev/null || true
  fi
done
[ -z "$qa_failed" ] || fail "$EXIT_QA" "QA failed for:$qa_failed (rule: >= $qa_min_fraction of input events)"
log "QA passed for ${#HPCRUN_STEMS[@]} output(s)"

# ---- what made the outputs: each one's size and md5 sum, the payload's identity ----
: > "$HPCRUN_RUNDIR/outputs.tsv"
for i in "${!HPCRUN_STEMS[@]}"; do
  out="$HPCRUN_OUTDIR/${HPCRUN_OUTPUT_NAMES[$i]}"
  [ -f "$out" ] || continue
  # LC_ALL=C: the two programs' locale is not loaded from its files once more for each output
  size=$(LC_ALL=C stat -c %s -- "$out")
  sum=""
  # the sum's last line read in place (no file per output); what the program said is kept only if it failed;
  # exec: the program replaces the substitution's shell (bash forks twice for it otherwise, 2>&1 being there)
  if said=$(LC_ALL=C exec md5sum -- "$out" 2>&1); then
    read -r sum _ <<< "${said##*$'\n'}" || true
    sum=md5:${sum#\\}
  else
    printf '%s\n' "$said" >> "$HPCRUN_RUNDIR/checksums.log"
  fi
  printf '%s\t%s\t%s\n' "${HPCRUN_OUTPUT_NAMES[$i]}" "$size" "${sum,,}" >> "$HPCRUN_RUNDIR/outputs.tsv"
done
# the image as the container runtime identifies it
image_id=$(shifterimg lookup docker:mmustafa/sl64_sl16d:v1_pdsf6 2>> "$HPCRUN_RUNDIR/checksums.log") || image_id=""
printf '%s\n' "${image_id%%$'\n'*}" > "$HPCRUN_RUNDIR/image.id"
# the conditions payload by its file list and sizes (not its bytes: it may be tens of GB)
payload_id=$(cd "$db_payload" && find . -type f -printf '%P\t%s\n' | LC_ALL=C sort | sha256sum) || payload_id=""
printf '%s\n' "${payload_id%% *}" > "$HPCRUN_RUNDIR/payload.id"

rmdir -- "$HPCRUN_WORKDIR" 2>/dev/null || true   # an empty directory left is an inode of the user's quota
log "all steps succeeded"
exit 0
