#!/bin/bash
# hpcrun 0.1.0: one chain (one launched task) of campaign star-reco-2019-apptainer.
# Runs inside the container; processes its slice of the events of every input of the job.
set -uo pipefail
export HPCRUN_RANK=${HPCRUN_TASK_RANK:?started by launch_in_batch}
export HPCRUN_NRANKS=${HPCRUN_TASK_COUNT:?started by launch_in_batch}
export HPCRUN_NODE=${SLURMD_NODENAME:-$(hostname)}
chain=$HPCRUN_RANK
nchains=$HPCRUN_NRANKS
export HPCRUN_CHAIN=$chain HPCRUN_NCHAINS=$nchains
db_cache=/local/hpcrun.${HPCRUN_NODE_KEY}.${HPCRUN_JOB_ID}.${HPCRUN_NODE}
export HPCRUN_DB_SOCKET="$db_cache/mysqld.sock"
export HPCRUN_DB_DEFAULTS="$db_cache/client.cnf" HPCRUN_DB_USER=''
log="$HPCRUN_RUNDIR/chains/$chain.log"
timeline="$HPCRUN_RUNDIR/chains/$chain.timeline"
rc=0
# run by the input's own shell (chain_here, set by the job's hpcrun_chain_here), its traps stay the input's: a TERM
# ends the input, and its time limit stops the program (CHAIN_PID) before it fails
child=""
stopping=0
# shellcheck disable=SC2329  # trap handler: pass the launcher's SIGTERM on to the running program
on_term() {
  stopping=1
  [ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true   # a child gone meanwhile: no error under set -e
}
[ -n "${chain_here:-}" ] || trap on_term TERM INT
# the timeline opened once for all the lines of the chain, not once a line (an open is a metadata call on Lustre)
command exec {timeline_fd}>> "$timeline" || command exec {timeline_fd}> /dev/null   # none if it cannot be written
printf 'start %s %s\n' "${EPOCHREALTIME/,/.}" "$HPCRUN_NODE" >&"$timeline_fd"
chain_inputs() {   # the job's rows on standard input: each row an input of this chain's slice
while IFS=$'\t' read -r _index _name _chains path events stem _output _checksum; do
  rows_read=$(( rows_read + 1 ))
  if [ "$stopping" -eq 1 ]; then
    rc=143
    break
  fi
  export HPCRUN_STEM=$stem
  export HPCRUN_INPUT=$path
  [ -z "$HPCRUN_INPUT_DIR" ] || HPCRUN_INPUT="$HPCRUN_INPUT_DIR/${path##*/}"
  if [ "$events" != "-" ]; then
    first=$(( chain * events / nchains ))
    next=$(( (chain + 1) * events / nchains ))
    export HPCRUN_FIRST_EVENT=$first HPCRUN_NEVENTS=$(( next - first )) HPCRUN_LAST_EVENT=$(( next - 1 ))
  fi
  export HPCRUN_OUTPUT="$HPCRUN_WORKDIR/$stem.part$chain"
  printf 'begin %s %s\n' "${EPOCHREALTIME/,/.}" "$stem" >&"$timeline_fd"
  # the program: its stdin is not the rows' (a program that reads it took the next inputs' rows), and it does not
  # run the shell's EXIT trap if its words cannot be expanded (a fork of the input's shell in the input's own)
  { trap - EXIT USR1 TERM; exec root4star -b -q 'bfc.C('"${HPCRUN_FIRST_EVENT}","${HPCRUN_LAST_EVENT}"',"P2019a,StiCA,BAna,PicoVtxDefault","'"${HPCRUN_INPUT}"'","'"${HPCRUN_OUTPUT}"'")'; } < /dev/null >> "$log" 2>&1 {timeline_fd}>&- &
  child=$!
  # shellcheck disable=SC2034  # the input's, read by its time limit's trap (on_time_limit)
  [ -z "${chain_here:-}" ] || CHAIN_PID=$child
  step=0
  wait "$child" || step=$?
  while kill -0 "$child" 2>/dev/null; do
    step=0
    wait "$child" || step=$?
  done
  child=""
  # shellcheck disable=SC2034  # as above
  [ -z "${chain_here:-}" ] || CHAIN_PID=""
  printf 'end %s %s %s\n' "${EPOCHREALTIME/,/.}" "$stem" "$step" >&"$timeline_fd"
  if [ "$stopping" -eq 1 ]; then
    printf 'chain %s stopped by a signal during %s\n' "$chain" "$stem" >> "$log"
    rc=143
    break
  fi
  if [ "$step" -ne 0 ]; then
    rc=$step
    printf 'chain %s failed on %s with exit code %s\n' "$chain" "$stem" "$step" >> "$log"
  fi
done
}
rows_read=0
# chain_own: the job's own call of this chain in its shell (hpcrun_chain_here), which holds the rows and keeps the
# status itself; a caller of an older job template (a site's copy of the chains block) reads inputs.tsv and .rc
if [ -n "${chain_own:-}" ] && [ -n "${HPCRUN_TASK_ROWS:-}" ]; then
  chain_inputs <<< "$HPCRUN_TASK_ROWS"   # no inputs.tsv written and read again (issue 55)
else
  chain_inputs < "$HPCRUN_RUNDIR/inputs.tsv"
fi
if [ "$rows_read" -eq 0 ] && [ "$rc" -eq 0 ]; then   # no row (no inputs.tsv, a here-string not made): nothing ran
  rc=3
  printf 'chain %s read no input row: nothing ran\n' "$chain" >> "$log"
fi
printf 'stop %s %s\n' "${EPOCHREALTIME/,/.}" "$rc" >&"$timeline_fd"
if [ -n "${chain_here:-}" ]; then
  exec {timeline_fd}>&-   # the input's later steps do not inherit it
  if [ -n "${chain_own:-}" ]; then
    # shellcheck disable=SC2034  # the input's shell's: the status this chain ended with (left unset if it never ran)
    chain_here_rc=$rc
  else
    printf '%s\n' "$rc" > "$HPCRUN_RUNDIR/chains/$chain.rc"
  fi
  # shellcheck disable=SC2317  # sourced: back to the input's shell
  return "$rc"
fi
printf '%s\n' "$rc" > "$HPCRUN_RUNDIR/chains/$chain.rc"
exit "$rc"
