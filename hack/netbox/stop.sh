#!/usr/bin/env bash
# stop.sh <run dir>: stops the instance start.sh created there: gunicorn (master and every worker) and its
# database. Removes netbox.env (it holds the token); keeps gunicorn.log. Safe to run twice.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

run="${1:-}"
[[ -n "$run" ]] || nb_die "usage: $0 <run dir>"
if [[ ! -f "$run/netbox.env" ]]; then
  nb_log "no instance in $run (already stopped?)"
  exit 0
fi
# shellcheck source=/dev/null
source "$run/netbox.env"
"$NB_HERE/web.sh" stop "$run"
if nb_as_postgres pg_isready -q 2>/dev/null; then nb_drop_db "$NETBOX_DB_NAME"; fi
rm -f "$run/netbox.env"
nb_log "stopped the instance in $run"
