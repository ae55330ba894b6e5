#!/usr/bin/env bash
# reset-db.sh <run dir>: gives the running instance in <run dir> a fresh database, a copy of the template
# (migrated, admin user and token, nothing else), under the same name, while gunicorn keeps running.
# Safe because the configuration sets CONN_MAX_AGE=0 (no connection outlives a request) and NetBox keeps no
# per-process cache of database rows between requests. Requests in flight during the swap fail.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

run="${1:-}"
[[ -n "$run" && -f "$run/netbox.env" ]] || nb_die "usage: $0 <run dir of a started instance>"
# shellcheck source=/dev/null
source "$run/netbox.env"
nb_psql -v db="$NETBOX_DB_NAME" -v tpl="$NETBOX_TEMPLATE_DB" -v owner="$NB_DB_ROLE" -v run="$NETBOX_RUN_DIR" \
  <<'SQL' >/dev/null
SET client_min_messages = warning;
DROP DATABASE IF EXISTS :"db" WITH (FORCE);
CREATE DATABASE :"db" TEMPLATE :"tpl" OWNER :"owner";
COMMENT ON DATABASE :"db" IS :'run';
SQL
