#!/bin/bash
# hpcrun 0.1.0: per-node database supervisor of campaign star-reco-2019.
# Copies the payload into node-local storage, starts /usr/sbin/mysqld, waits until it
# answers, restarts it if it dies (at most 3 times), and shuts it
# down cleanly on SIGTERM or when the job creates "$HPCRUN_RUNDIR/db/stop".
set -uo pipefail
# everything this helper creates is its user's alone: the node may be shared with other users
umask 077
export HPCRUN_NODE=${SLURMD_NODENAME:-$(hostname)}
node=$HPCRUN_NODE
status="$HPCRUN_RUNDIR/db"
cache=/dbcache
socket="$cache/mysqld.sock"
payload=/global/cscratch1/sd/starprod/conditions/mysql-2019
server=/usr/sbin/mysqld
ready_timeout=600
max_restarts=3
log() { printf '%s %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$node" "$*" >> "$status/$node.log"; }
mark() { printf '%s\n' "$2" > "$status/$node.$1"; }
defaults="$cache/client.cnf"  # the clients' option file: socket, and in tcp mode the job's account
probe() {
  mysqladmin --no-defaults --socket="$socket" --connect-timeout=2 ping > /dev/null 2>&1 || return 1
  mysql --defaults-file="$defaults" --connect-timeout=2 -e 'SELECT 1' > /dev/null 2>&1
}

watcher=""
# shellcheck disable=SC2329  # EXIT trap: on every way out, free node-local space
cleanup() {
  [ -z "$watcher" ] || kill "$watcher" 2>/dev/null
}
trap cleanup EXIT

mkdir -p "$status"
for tool in "$server" mysqladmin mysql; do
  if ! command -v "$tool" > /dev/null; then
    mark failed "'$tool' was not found on $node (PATH=$PATH); set database.server or fix the image"
    exit 5
  fi
done
if ! mkdir -p "$cache/tmp" || ! chmod 700 "$cache"; then
  mark failed "payload: cannot create the node-local cache $cache"
  exit 4
fi
log "copying payload $payload to $cache/data"
t0=$(date +%s%N)
if ! cp -a "$payload/." "$cache/data/"; then
  mark failed "payload: copy of $payload to $cache failed"
  exit 4
fi
mark copied "$(( ($(date +%s%N) - t0) / 1000000 )) ms"
printf '[client]\nsocket=%s\n' "$socket" > "$defaults"

args=(--no-defaults --datadir="$cache/data" --socket="$socket" --pid-file="$cache/mysqld.pid"
  --log-error="$status/$node.err" --tmpdir="$cache/tmp" --skip-networking --skip-grant-tables --innodb-buffer-pool-size=2G --max-connections=200)

child=""
stopping=0
# shellcheck disable=SC2329  # trap handler
on_term() {
  stopping=1
  [ -z "$child" ] || kill -TERM "$child" 2>/dev/null || true   # a child gone meanwhile: no error under set -e
}
trap on_term TERM INT
# Belt and braces: the job also asks for a stop by creating db/stop (if a launcher does not
# forward SIGTERM, the watcher below delivers it).
( while [ ! -e "$status/stop" ]; do sleep 1; done; kill -TERM $$ 2>/dev/null ) &
watcher=$!
restarts=0
ready_once=0
while :; do
  rm -f "$socket" "$cache/mysqld.pid"
  "$server" "${args[@]}" &
  child=$!
  log "started $server (pid $child)"
  deadline=$(( SECONDS + ready_timeout ))
  until probe; do
    kill -0 "$child" 2>/dev/null || break
    if [ "$SECONDS" -ge "$deadline" ]; then
      mark failed "not answering after ${ready_timeout}s: $(tail -n 3 "$status/$node.err" 2>/dev/null | tr '\n' ' ')"
      kill -TERM "$child" 2>/dev/null
      wait "$child"
      exit 5
    fi
    sleep 0.5
  done
  if kill -0 "$child" 2>/dev/null; then
    if [ "$ready_once" -eq 0 ]; then
      mark ready "$(date +%s.%N)"
      ready_once=1
    fi
    log "server answers on $socket"
  fi
  rc=0
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do
    rc=0
    wait "$child" || rc=$?
  done
  child=""
  if [ "$stopping" -eq 1 ] || [ -e "$status/stop" ]; then
    log "server shut down (exit code $rc)"
    mark stopped "$rc"
    break
  fi
  restarts=$(( restarts + 1 ))
  printf '%s %s\n' "$(date +%s.%N)" "$rc" >> "$status/$node.restarts"
  log "server exited with code $rc; restart $restarts of $max_restarts"
  if [ "$restarts" -gt "$max_restarts" ]; then
    mark failed "server died $restarts times (max_restarts $max_restarts); see $node.err"
    exit 6
  fi
  if [ "$ready_once" -eq 0 ] && [ "$SECONDS" -ge "$deadline" ]; then
    mark failed "not answering after ${ready_timeout}s"
    exit 5
  fi
  sleep 10
done
exit 0
