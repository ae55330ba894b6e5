#!/usr/bin/env bash
# start.sh [run dir]: starts one NetBox instance for tests and prints where it is.
#   - starts PostgreSQL and Redis if they are not running (no systemd needed);
#   - creates the instance's own database from the template database (install.sh made it; re-made here from
#     the cached dump if the PostgreSQL cluster lost it), which already holds the admin user and v2 token;
#   - starts gunicorn on a free 127.0.0.1 port (or $NETBOX_PORT) and waits for GET /api/status/ → 200.
# Writes <run dir>/netbox.env (mode 600): NETBOX_URL, NETBOX_TOKEN, NETBOX_RUN_DIR, NETBOX_DB_NAME, NETBOX_PORT.
# Prints NETBOX_URL=… and NETBOX_ENV_FILE=… on stdout (never the token). The run dir defaults to a new
# directory under ${TMPDIR:-/tmp}. Instances started with different run dirs run side by side.
# Stop with stop.sh <run dir>. Needs install.sh to have run (fails with a clear message otherwise).
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
started="$EPOCHREALTIME"

[[ -x "$NB_VENV/bin/gunicorn" && -f "$NB_ROOT/conf/configuration.py" ]] \
  || nb_die "NetBox $NETBOX_VERSION is not installed in $NB_CACHE (run hack/netbox/install.sh)"

run="${1:-}"
if [[ -z "$run" ]]; then run="$(mktemp -d "${TMPDIR:-/tmp}/netbox-run.XXXXXX")"; fi
mkdir -p "$run"
chmod 700 "$run"
run="$(cd "$run" && pwd)"
if [[ -f "$run/netbox.env" ]]; then
  if "$NB_HERE/web.sh" status "$run"; then
    nb_die "an instance is already running in $run (stop it with stop.sh $run)"
  fi
  "$NB_HERE/stop.sh" "$run"  # the leftovers of an instance that died: drop its database
fi

nb_start_postgres
nb_start_redis
nb_load_secrets
# Under install.sh's lock: two ALTER ROLEs at once fail ("tuple concurrently updated"), and the template is
# install.sh's to make.
exec {install_lock}>"$NB_CACHE/.install.lock"
flock "$install_lock"
nb_ensure_role
nb_ensure_template
nb_gc_databases
flock -u "$install_lock"

db="netbox_run_$(od -An -N5 -tx1 /dev/urandom | tr -d ' \n')"
port="${NETBOX_PORT:-$(nb_free_port)}"

# The env file is written before the database exists, so a concurrent nb_gc_databases never takes the new
# database for a leftover.
(
  umask 077
  cat >"$run/netbox.env.partial" <<ENV
NETBOX_URL=http://127.0.0.1:$port
NETBOX_TOKEN=nbt_$NB_TOKEN_KEY.$NB_TOKEN_SECRET
NETBOX_RUN_DIR=$run
NETBOX_DB_NAME=$db
NETBOX_PORT=$port
NETBOX_TEMPLATE_DB=$NB_TEMPLATE_DB
ENV
  mv "$run/netbox.env.partial" "$run/netbox.env"
)
db_started="$EPOCHREALTIME"
nb_psql -v db="$db" -v tpl="$NB_TEMPLATE_DB" -v owner="$NB_DB_ROLE" -v run="$run" >/dev/null <<'SQL'
CREATE DATABASE :"db" TEMPLATE :"tpl" OWNER :"owner";
COMMENT ON DATABASE :"db" IS :'run';
SQL
nb_log "database $db created from the template in $(nb_elapsed "$db_started") s"

if ! "$NB_HERE/web.sh" start "$run"; then
  nb_drop_db "$db"
  rm -f "$run/netbox.env"
  nb_die "NetBox did not start (log: $run/gunicorn.log)"
fi
nb_log "NetBox $NETBOX_VERSION ready in $(nb_elapsed "$started") s"
echo "NETBOX_URL=http://127.0.0.1:$port"
echo "NETBOX_ENV_FILE=$run/netbox.env"
