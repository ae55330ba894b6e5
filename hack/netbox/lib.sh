# shellcheck shell=bash
# shellcheck disable=SC2034  # the variables here are used by the scripts that source this file
# Shared helpers for hack/netbox/*.sh. Sourced, never executed.
#
# Layout of the cache (outside the work tree, keyed by the NetBox version):
#   $NB_CACHE/venv/            Python 3.12 venv holding netbox==$NETBOX_VERSION and gunicorn
#   $NB_CACHE/wheelhouse/      wheels built/downloaded once (psycopg-c takes ~45 s to build)
#   $NB_CACHE/root/            instance root made by `netbox setup`; conf/configuration.py reads secrets.env
#   $NB_CACHE/secrets.env      generated locally, mode 600: SECRET_KEY, pepper, DB/admin passwords, API token
#   $NB_CACHE/migrated.dump    `pg_dump -Fc` of a freshly migrated database (no users, no secrets)
# In PostgreSQL (not in the cache): the template database $NB_TEMPLATE_DB = the dump restored once plus the
# admin user and its v2 token. Every instance gets `CREATE DATABASE ... TEMPLATE $NB_TEMPLATE_DB`.

NB_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../versions.env
source "$NB_HERE/../versions.env"
: "${NETBOX_VERSION:?NETBOX_VERSION is not set in hack/versions.env}"

NB_CACHE_ROOT="${IPAM_PROVIDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-provider}"
NB_CACHE="$NB_CACHE_ROOT/netbox-$NETBOX_VERSION"
NB_VENV="$NB_CACHE/venv"
NB_WHEELHOUSE="$NB_CACHE/wheelhouse"
NB_ROOT="$NB_CACHE/root"
NB_SECRETS="$NB_CACHE/secrets.env"
NB_DUMP="$NB_CACHE/migrated.dump"
NB_DB_ROLE="netbox"
NB_ADMIN_USER="admin"
NB_VERSION_ID="${NETBOX_VERSION//[^0-9a-zA-Z]/_}"
export NETBOX_ROOT="$NB_ROOT"

nb_log() { echo "[netbox] $*" >&2; }
nb_die() { echo "[netbox] error: $*" >&2; exit 1; }

# nb_timed <label> <command...>: runs the command and reports how long it took (stderr).
nb_timed() {
  local label="$1"; shift
  local started="$EPOCHREALTIME"
  "$@"
  nb_log "$label took $(nb_elapsed "$started") s"
}

# nb_elapsed <start $EPOCHREALTIME>: seconds since then, one decimal.
nb_elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# The Python used for NetBox's venv: NETBOX_PYTHON, else pyenv's 3.12.1, else python3.12 on PATH.
nb_python() {
  local p=""
  if [[ -n "${NETBOX_PYTHON:-}" ]]; then
    p="$NETBOX_PYTHON"
  elif command -v pyenv >/dev/null 2>&1 && [[ -x "$(pyenv root)/versions/3.12.1/bin/python" ]]; then
    p="$(pyenv root)/versions/3.12.1/bin/python"
  elif command -v python3.12 >/dev/null 2>&1; then
    p="$(command -v python3.12)"
  fi
  [[ -n "$p" ]] || nb_die "Python >= 3.12 not found (set NETBOX_PYTHON, or install pyenv's 3.12.1)"
  "$p" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
    || nb_die "$p is not a Python >= 3.12 with venv (NetBox $NETBOX_VERSION needs 3.12; set NETBOX_PYTHON)"
  echo "$p"
}

# nb_exec_clean <log> <command...>: replaces the current (sub)shell with the command, stdin from /dev/null,
# stdout and stderr appended to <log>, every other inherited descriptor closed. For daemons: they must not
# keep a caller's pipe (a test runner would wait for EOF forever) or a lock file open.
nb_exec_clean() {
  local log="$1" fd n; shift
  for fd in /proc/"$BASHPID"/fd/*; do
    n="${fd##*/}"
    if ((n > 2)); then eval "exec $n>&-" 2>/dev/null || true; fi
  done
  exec "$@" </dev/null >>"$log" 2>&1
}

# nb_run_daemon <command...>: runs a command that starts a daemon, detached from our descriptors (see
# nb_exec_clean); its output goes to $NB_SERVICES_LOG. Returns the command's exit status.
NB_SERVICES_LOG="${TMPDIR:-/tmp}/ipam-provider-netbox-services.log"
nb_run_daemon() { (nb_exec_clean "$NB_SERVICES_LOG" "$@"); }

# Runs a command as the postgres OS user, from a directory it can read.
nb_as_postgres() {
  if [[ $EUID -eq 0 ]]; then
    (cd /tmp && runuser -u postgres -- "$@")
  else
    (cd /tmp && sudo -n -u postgres -- "$@")
  fi
}

nb_psql() { nb_as_postgres psql -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }
# nb_sql_value <sql>: prints the single value a query returns (empty if no row).
nb_sql_value() { nb_as_postgres psql -X -qAt -v ON_ERROR_STOP=1 -d postgres -c "$1"; }

# The newest installed PostgreSQL major version.
nb_pg_version() {
  local v
  v=$(find /usr/lib/postgresql -mindepth 1 -maxdepth 1 -type d -printf '%f\n' 2>/dev/null | sort -V | tail -1)
  [[ -n "$v" ]] || nb_die "PostgreSQL is not installed (run hack/netbox/install.sh)"
  echo "$v"
}

nb_start_postgres() {
  local v; v=$(nb_pg_version)
  if ! pg_lsclusters -h 2>/dev/null | awk -v v="$v" '$1 == v && $2 == "main"' | grep -q .; then
    nb_log "creating PostgreSQL cluster $v/main"
    pg_createcluster "$v" main >/dev/null
  fi
  if ! pg_lsclusters -h | awk -v v="$v" '$1 == v && $2 == "main" && $4 == "online"' | grep -q .; then
    nb_run_daemon pg_ctlcluster "$v" main start || nb_die "PostgreSQL $v/main did not start (see $NB_SERVICES_LOG)"
  fi

  for _ in $(seq 1 60); do
    nb_as_postgres pg_isready -q && return 0
    sleep 0.5
  done
  nb_die "PostgreSQL $v/main did not become ready"
}

nb_start_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return 0; fi
  if [[ -x /etc/init.d/redis-server ]]; then nb_run_daemon service redis-server start || true; fi
  if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    nb_run_daemon redis-server --bind 127.0.0.1 --port 6379 --daemonize yes --save '' --appendonly no || true
  fi

  for _ in $(seq 1 40); do
    redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return 0
    sleep 0.25
  done
  nb_die "Redis did not answer on 127.0.0.1:6379"
}

nb_load_secrets() {
  [[ -f "$NB_SECRETS" ]] || nb_die "$NB_SECRETS is missing (run hack/netbox/install.sh)"
  # shellcheck source=/dev/null
  source "$NB_SECRETS"
  # The template name carries the token key, so regenerated secrets never meet a stale template.
  NB_TEMPLATE_DB="netbox_tpl_${NB_VERSION_ID}_${NB_TOKEN_KEY,,}"
}

nb_db_exists() { [[ "$(nb_sql_value "SELECT 1 FROM pg_database WHERE datname = '$1'")" == "1" ]]; }

# The role NetBox connects as; its password always follows secrets.env.
nb_ensure_role() {
  nb_psql -v role="$NB_DB_ROLE" -v pw="$NB_DB_PASSWORD" <<'SQL' >/dev/null
SELECT format('CREATE ROLE %I LOGIN', :'role') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'role')
\gexec
ALTER ROLE :"role" WITH LOGIN PASSWORD :'pw';
ALTER ROLE :"role" SET synchronous_commit = off;
SQL
}

# nb_drop_db <name>: terminates its sessions, then drops it (no error if absent).
nb_drop_db() {
  nb_psql -v db="$1" <<'SQL' >/dev/null
SET client_min_messages = warning;
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :'db' AND pid <> pg_backend_pid();
DROP DATABASE IF EXISTS :"db" WITH (FORCE);
SQL
}

# nb_netbox <args...>: the netbox console script against database $NETBOX_DB_NAME.
nb_netbox() { "$NB_VENV/bin/netbox" "$@"; }

# nb_restore_dump <db>: restores the cached dump into <db>. The dump goes in on stdin: the postgres user may
# not be able to read the cache (e.g. under /root).
nb_restore_dump() {
  nb_as_postgres pg_restore --no-owner --role="$NB_DB_ROLE" --exit-on-error -d "$1" <"$NB_DUMP"
}

# Creates $NB_TEMPLATE_DB from the cached dump plus the admin user and v2 token, unless it exists.
# Built under a temporary name and renamed at the end, so an interrupted run leaves no half template.
nb_ensure_template() {
  nb_load_secrets
  if nb_db_exists "$NB_TEMPLATE_DB"; then return 0; fi
  # Parallel test sessions may all find it missing: one builds it, the others wait and then see it.
  exec {lock_fd}>"$NB_CACHE/.template.lock"
  flock "$lock_fd"
  if nb_db_exists "$NB_TEMPLATE_DB"; then flock -u "$lock_fd"; return 0; fi
  [[ -f "$NB_DUMP" ]] || nb_die "$NB_DUMP is missing (run hack/netbox/install.sh)"
  local tmp="${NB_TEMPLATE_DB}_building"
  if nb_db_exists "$tmp"; then nb_drop_db "$tmp"; fi
  nb_as_postgres createdb -O "$NB_DB_ROLE" "$tmp"
  nb_timed "restoring the migrated dump" \
    nb_restore_dump "$tmp"
  # Secrets travel in the environment, not on the command line.
  NETBOX_DB_NAME="$tmp" NB_ADMIN_USER="$NB_ADMIN_USER" NB_ADMIN_PASSWORD="$NB_ADMIN_PASSWORD" \
    NB_TOKEN_KEY="$NB_TOKEN_KEY" NB_TOKEN_SECRET="$NB_TOKEN_SECRET" \
    nb_timed "creating the admin user and API token" nb_netbox shell -c "$(cat <<'PY'
import os
from users.models import Token, User
user, _ = User.objects.get_or_create(username=os.environ['NB_ADMIN_USER'])
user.is_superuser = True
user.is_staff = True
user.set_password(os.environ['NB_ADMIN_PASSWORD'])
user.save()
Token.objects.filter(user=user).delete()
Token(user=user, key=os.environ['NB_TOKEN_KEY'], token=os.environ['NB_TOKEN_SECRET'], write_enabled=True,
      description='ipam-provider test harness').save()
PY
)" >/dev/null
  nb_psql -v tmp="$tmp" -v db="$NB_TEMPLATE_DB" <<'SQL' >/dev/null
ALTER DATABASE :"tmp" RENAME TO :"db";
ALTER DATABASE :"db" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false;
SQL
  flock -u "$lock_fd"
  nb_log "template database ready"
}

# nb_gc_databases: drops instance databases (netbox_run_*) left by sessions that died without stop.sh.
# Each carries its run dir as the database comment; a database whose run dir no longer holds netbox.env
# belongs to nobody (stop.sh and start.sh's failure path remove that file only after dropping it).
nb_gc_databases() {
  local db run
  while IFS='|' read -r db run; do
    [[ -n "$db" && -n "$run" && ! -f "$run/netbox.env" ]] || continue
    nb_log "dropping $db, left over by a dead instance ($run)"
    nb_drop_db "$db"
  done < <(nb_sql_value "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database
                         WHERE datname LIKE 'netbox\_run\_%' AND NOT datistemplate" || true)
}

# nb_free_port: prints a TCP port that is free on 127.0.0.1 right now.
nb_free_port() {
  "$NB_VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
