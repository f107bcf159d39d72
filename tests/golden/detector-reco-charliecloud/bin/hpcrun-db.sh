#!/bin/bash
# hpcrun 0.1.0: per-node database supervisor of campaign detector-reco-charliecloud.
# Copies the payload into node-local storage, starts /usr/sbin/mariadbd, waits until it
# answers, restarts it if it dies (at most 3 times), and shuts it
# down cleanly on SIGTERM or when the job creates "$HPCRUN_RUNDIR/db/stop".
set -uo pipefail
# everything this helper creates is its user's alone: the node may be shared with other users
umask 077
export HPCRUN_NODE=${SLURMD_NODENAME:-$(hostname)}
node=$HPCRUN_NODE
status="$HPCRUN_RUNDIR/db"
cache=/tmp/hpcrun.${HPCRUN_NODE_KEY}.${HPCRUN_JOB_ID}.${HPCRUN_NODE}
socket="$cache/mysqld.sock"
payload=/tmp/hpcrun-test-cluster/pfs/detector-reco/conditions
server=/usr/sbin/mariadbd
ready_timeout=60
max_restarts=3
log() { printf '%s %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$node" "$*" >> "$status/$node.log"; }
mark() { printf '%s\n' "$2" > "$status/$node.$1"; }
defaults="$cache/client.cnf"  # the clients' option file: socket, and in tcp mode the job's account
probe() {
  mariadb-admin --no-defaults --socket="$socket" --connect-timeout=2 ping > /dev/null 2>&1 || return 1
  mariadb --defaults-file="$defaults" --connect-timeout=2 -e 'SELECT COUNT(*) FROM conditions.calib' > /dev/null 2>&1
}
# ---- node-local directories of this campaign: private to the job's user, held while it runs,
# ---- reclaimed by a later job once the one that made them is gone (killed: no EXIT trap ran)
# shellcheck disable=SC2329  # called below
private_dir() {
  # 0700 and ours: a directory another user made at this name first is refused, not used
  mkdir -p -- "${1%/*}" 2>/dev/null
  mkdir -m 700 -- "$1" 2>/dev/null && return 0
  [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && chmod 700 -- "$1"
}
# shellcheck disable=SC2329  # called below
hold_dir() {
  # fd 9 holds a lock on the directory for as long as any process of this job lives (children
  # inherit it); made under a temporary name and renamed when held, so a reclaiming job never
  # sees a lock file nobody holds yet
  command -v flock > /dev/null || return 0
  exec 9> "$1/.lock.new" && flock -n 9 && mv -f -- "$1/.lock.new" "$1/.lock"
}
# shellcheck disable=SC2329  # called below
remove_tree() {
  # rm -rf, and where a program left a read-only directory in it (a tool's cache), made writable first (never
  # through a symbolic link); fails only if something is left
  rm -rf -- "$1" 2>/dev/null && return 0
  [ -L "$1" ] || chmod -R u+w -- "$1" 2>/dev/null
  rm -rf -- "$1"
}
# shellcheck disable=SC2329  # called on the way out
remove_node_dir() {
  # everything but the lock first: a removal cut short (SIGKILL after the grace period) leaves a
  # directory with its lock, which a later job reclaims
  local entry
  for entry in "$1"/* "$1"/.[!.]*; do
    [ -e "$entry" ] || [ -L "$entry" ] || continue
    [ "${entry##*/}" = .lock ] || remove_tree "$entry" || true
  done
  remove_tree "$1" || true
}
# shellcheck disable=SC2329  # called below
reclaim_dirs() {
  # $1 root, $2 this campaign's name prefix, $3 our own directory, $4 the record (path, bytes)
  command -v flock > /dev/null || return 0
  local dir bytes
  for dir in "$1/$2"*; do
    [ "$dir" != "$3" ] && [ -d "$dir" ] && [ ! -L "$dir" ] && [ -O "$dir" ] && [ -e "$dir/.lock" ] || continue
    # shellcheck disable=SC2016  # $1 is the inner shell's
    bytes=$(flock -n "$dir/.lock" sh -c '[ -e "$1/.lock" ] || exit 1; b=$(du -sb -- "$1" | cut -f1); rm -rf -- "$1" || { chmod -R u+w -- "$1"; rm -rf -- "$1"; }; echo "$b"' _ "$dir" 2>/dev/null) || continue
    printf '%s\t%s\n' "$dir" "${bytes:-0}" >> "$4"
  done
}

watcher=""
# shellcheck disable=SC2329  # EXIT trap: on every way out, free node-local space
cleanup() {
  [ -z "$watcher" ] || kill "$watcher" 2>/dev/null
  remove_node_dir "$cache"
}
trap cleanup EXIT

mkdir -p "$status"
for tool in "$server" mariadb-admin mariadb; do
  if ! command -v "$tool" > /dev/null; then
    mark failed "'$tool' was not found on $node (PATH=$PATH); set database.server or fix the image"
    exit 5
  fi
done
if ! private_dir "$cache" || ! hold_dir "$cache" || ! mkdir -p "$cache/tmp"; then
  mark failed "payload: cannot create the node-local cache $cache as a directory of $(id -un) alone (0700)"
  exit 4
fi
mkdir -p "$HPCRUN_RUNDIR/reclaimed"
reclaim_dirs "${cache%/*}" "hpcrun.${HPCRUN_NODE_KEY}." "$cache" "$HPCRUN_RUNDIR/reclaimed/$node.tsv"
log "copying payload $payload to $cache/data"
t0=$(date +%s%N)
if ! cp -a "$payload/." "$cache/data/"; then
  mark failed "payload: copy of $payload to $cache failed"
  exit 4
fi
mark copied "$(( ($(date +%s%N) - t0) / 1000000 )) ms"
printf '[client]\nsocket=%s\n' "$socket" > "$defaults"

args=(--no-defaults --datadir="$cache/data" --socket="$socket" --pid-file="$cache/mysqld.pid"
  --log-error="$status/$node.err" --tmpdir="$cache/tmp" --skip-networking --skip-grant-tables --innodb-buffer-pool-size=16M --innodb-log-file-size=8M)

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
  sleep 1
done
exit 0
