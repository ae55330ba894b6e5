#!/usr/bin/env bash
# web.sh start|stop|kill|status <run dir>: starts or stops only the gunicorn serving the NetBox instance
# that start.sh created in <run dir>, keeping its port and database. Used by tests to take NetBox away
# mid-run and bring it back.
#   start   starts gunicorn on the recorded port and waits until GET /api/status/ answers 200 (exit 1 if not)
#   stop    SIGQUIT (gunicorn's quick shutdown), up to $NETBOX_STOP_GRACE_S (3) s for its process group
#           to exit, then SIGKILL for anything left; returns when no process of the group is left.
#   kill    SIGKILL to the whole process group at once, like a crash (~0.1 s)
#   status  exit 0 when the recorded gunicorn master is alive
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

action="${1:-}"
run="${2:-}"
[[ -n "$action" && -n "$run" ]] || nb_die "usage: $0 start|stop|kill|status <run dir>"
run="$(cd "$run" && pwd)"
[[ -f "$run/netbox.env" ]] || nb_die "$run/netbox.env is missing; was the instance started with start.sh?"
# shellcheck source=/dev/null
source "$run/netbox.env"
: "${NETBOX_URL:?}" "${NETBOX_PORT:?}" "${NETBOX_DB_NAME:?}"
pidfile="$run/gunicorn.pid"

# alive <pid>: true while the process runs. A zombie does not count: once the launching shell has exited,
# gunicorn's parent is the init process, which may take seconds to reap it.
alive() {
  local state
  state=$(ps -o stat= -p "$1" 2>/dev/null || true)
  [[ -n "$state" && "$state" != Z* ]]
}

# group_alive <pgid>: true while any process of the group runs.
group_alive() {
  local pid
  for pid in $(pgrep -g "$1" 2>/dev/null || true); do
    if alive "$pid"; then return 0; fi
  done
  return 1
}

# Prints the gunicorn master's pid if it is alive.
master_pid() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [[ -n "$pid" ]] && alive "$pid"; then echo "$pid"; fi
}

# port_in_use: true when something accepts connections on the instance's port.
port_in_use() {
  "$NB_VENV/bin/python" -c 'import socket, sys
s = socket.socket()
s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)' "$NETBOX_PORT"
}

start_web() {
  if [[ -n "$(master_pid)" ]]; then nb_log "gunicorn already running"; return 0; fi
  if port_in_use; then
    nb_die "127.0.0.1:$NETBOX_PORT is already in use by another process; not starting a second server"
  fi
  local started="$EPOCHREALTIME"
  rm -f "$pidfile"
  # setsid: gunicorn leads its own session and process group (its pid is the group id), so stop can reap
  # every worker even if the master dies. A background job of a script is never a group leader, so setsid
  # does not fork: $! is the gunicorn master. Were that ever wrong, the check below fails the start.
  # Keep-alive: gunicorn never closes an idle connection during a test session (--keep-alive 3600 s, and no
  # worker recycling: --max-requests 0). Test clients keep pooled connections and reuse them after any pause.
  # A server that closes idle connections (gunicorn's default is after 2 s) races with a request sent just then:
  # gunicorn closes a socket that holds an unread request, the kernel answers with a reset, and the client gets
  # ECONNRESET although NetBox was fine. The client checks for a closed connection before reusing it, but
  # cannot see a close that happens after that check. Only stop/kill below close connections on purpose.
  export NETBOX_DB_NAME
  nb_exec_clean "$run/gunicorn.log" setsid "$NB_VENV/bin/gunicorn" \
    --bind "127.0.0.1:$NETBOX_PORT" \
    --workers "${NETBOX_GUNICORN_WORKERS:-2}" --threads "${NETBOX_GUNICORN_THREADS:-4}" \
    --keep-alive 3600 --max-requests 0 \
    --timeout 120 --graceful-timeout 10 --preload \
    --no-control-socket --pid "$pidfile" \
    --chdir "$NB_ROOT" \
    --error-logfile - \
    netbox.wsgi &
  local master=$!
  echo "$master" >"$run/gunicorn.pgid"
  local deadline=$((SECONDS + ${NETBOX_START_TIMEOUT:-180}))
  while ((SECONDS < deadline)); do
    if ! alive "$master"; then
      stop_web kill
      tail -n 40 "$run/gunicorn.log" >&2 || true
      nb_die "gunicorn exited during start-up (log: $run/gunicorn.log)"
    fi
    local rc=0
    "$NB_VENV/bin/python" "$NB_HERE/probe.py" "$NETBOX_URL" "$run/netbox.env" || rc=$?
    if ((rc == 0)); then
      if [[ "$(cat "$pidfile" 2>/dev/null || true)" != "$master" ]]; then
        stop_web kill
        nb_die "the server answering on $NETBOX_URL is not the gunicorn just started (pid $master)"
      fi
      nb_log "NetBox answered on $NETBOX_URL after $(nb_elapsed "$started") s"
      return 0
    elif ((rc == 2)); then
      stop_web kill
      nb_die "NetBox refused the harness token (401/403); delete $NB_SECRETS and re-run install.sh"
    fi
    sleep 0.5
  done
  tail -n 40 "$run/gunicorn.log" >&2 || true
  stop_web kill
  nb_die "NetBox did not answer GET /api/status/ with 200 within ${NETBOX_START_TIMEOUT:-180} s"
}

stop_web() {
  local mode="${1:-quit}" pid pgid
  pid=$(master_pid)
  pgid=$(cat "$run/gunicorn.pgid" 2>/dev/null || true)
  # The master leads its process group; fall back to its pid if the group file is gone.
  pgid="${pgid:-$pid}"
  # QUIT: gunicorn's quick shutdown (workers drop in-flight requests, as when a server goes away).
  if [[ -n "$pid" && "$mode" == quit ]]; then kill -QUIT "$pid" 2>/dev/null || true; fi
  if [[ -n "$pgid" ]]; then
    # gunicorn's own shutdown takes 5-10 s on a busy 2-core box (its workers linger ~3 s after "Worker
    # exiting", the master waits for them); after the grace period the rest is killed. A test NetBox holds
    # nothing that needs a graceful exit: PostgreSQL keeps every committed transaction.
    local grace_ms=$((${NETBOX_STOP_GRACE_S:-3} * 1000)) waited_ms=0
    if [[ "$mode" == kill ]]; then grace_ms=0; fi
    while group_alive "$pgid" && ((waited_ms < grace_ms)); do sleep 0.1; waited_ms=$((waited_ms + 100)); done
    # Whatever is left (a hung worker, a master that lost track of one) gets SIGKILL.
    kill -KILL -- "-$pgid" 2>/dev/null || true
    local deadline=$((SECONDS + 5))
    while group_alive "$pgid" && ((SECONDS < deadline)); do sleep 0.1; done
    if group_alive "$pgid"; then nb_die "gunicorn processes of group $pgid survived SIGKILL"; fi
  fi
  rm -f "$pidfile" "$run/gunicorn.pgid"
}

case "$action" in
  start) start_web ;;
  stop) stop_web quit ;;
  kill) stop_web kill ;;
  status) [[ -n "$(master_pid)" ]] ;;
  *) nb_die "unknown action $action (start|stop|kill|status)" ;;
esac
