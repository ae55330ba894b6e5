#!/usr/bin/env bash
# Installs everything a real NetBox ($NETBOX_VERSION from hack/versions.env) needs for the tests, idempotently:
#   1. Debian packages postgresql, redis-server, libpq-dev (apt runs only when one is missing);
#   2. a Python 3.12 venv with netbox==$NETBOX_VERSION (it pins gunicorn), in the cache (see lib.sh);
#   3. locally generated secrets and an instance root with conf/configuration.py;
#   4. a migrated database dumped with `pg_dump -Fc` into the cache (the ~400 s step, done once per version);
#   5. the template database (dump + admin user + v2 token) that start.sh copies per instance.
# A warm run only checks and returns in a few seconds. Each expensive step prints how long it took (stderr).
# Leaves PostgreSQL and Redis running.
set -euo pipefail
# shellcheck source=lib.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
install_started="$EPOCHREALTIME"
mkdir -p "$NB_CACHE"
# One install at a time per cache (parallel test sessions each call this script).
exec {install_lock}>"$NB_CACHE/.install.lock"
flock "$install_lock"

# --- 1. Debian packages -------------------------------------------------------------------------------
missing=()
for pkg in postgresql redis-server libpq-dev; do
  if [[ "$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null)" != "install ok installed" ]]; then missing+=("$pkg"); fi
done
if ((${#missing[@]})); then
  pg_was_up=$(pg_lsclusters -h 2>/dev/null | awk '$4 == "online"' | wc -l || true)
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
  nb_timed "apt-get install ${missing[*]}" apt_install
  # An upgraded PostgreSQL must be restarted, or plpgsql fails with undefined symbols.
  if [[ "${pg_was_up:-0}" -gt 0 && " ${missing[*]} " == *" postgresql "* ]]; then
    nb_run_daemon pg_ctlcluster "$(nb_pg_version)" main restart || true
  fi
fi

nb_start_postgres
nb_start_redis

# --- 2. The NetBox venv -------------------------------------------------------------------------------
marker="$NB_VENV/.installed-netbox-$NETBOX_VERSION"
if [[ ! -f "$marker" ]]; then
  python="$(nb_python)"
  rm -rf "$NB_VENV"
  nb_timed "creating the venv" "$python" -m venv "$NB_VENV"
  "$NB_VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip wheel
  mkdir -p "$NB_WHEELHOUSE"
  # Building psycopg-c takes ~45 s; keep every wheel so the next venv installs from local files.
  if ! compgen -G "$NB_WHEELHOUSE/psycopg_c-*.whl" >/dev/null; then
    nb_timed "building the wheelhouse (psycopg-c from source)" \
      "$NB_VENV/bin/pip" wheel -q --disable-pip-version-check --wheel-dir "$NB_WHEELHOUSE" \
      "netbox==$NETBOX_VERSION"
  fi
  nb_timed "installing netbox==$NETBOX_VERSION into the venv" \
    "$NB_VENV/bin/pip" install -q --disable-pip-version-check --find-links "$NB_WHEELHOUSE" \
    "netbox==$NETBOX_VERSION"
  touch "$marker"
fi

# --- 3. Secrets and the instance root -----------------------------------------------------------------
if [[ ! -f "$NB_SECRETS" ]]; then
  (
    umask 077
    "$NB_VENV/bin/python" - >"$NB_SECRETS.partial" <<'PY'
import secrets
import string

alnum = string.ascii_letters + string.digits


def rand(n: int, chars: str = alnum) -> str:
    return "".join(secrets.choice(chars) for _ in range(n))


print(f"NB_SECRET_KEY={rand(64)}")
print(f"NB_API_TOKEN_PEPPER={rand(64)}")
print(f"NB_DB_PASSWORD={rand(32)}")
print(f"NB_ADMIN_PASSWORD={rand(32)}")
print(f"NB_TOKEN_KEY={rand(12)}")
print(f"NB_TOKEN_SECRET={rand(40)}")
PY
    mv "$NB_SECRETS.partial" "$NB_SECRETS"
  )
fi
chmod 600 "$NB_SECRETS"
nb_load_secrets

if [[ ! -d "$NB_ROOT/conf" ]]; then
  nb_timed "netbox setup" nb_netbox setup --target "$NB_ROOT" >/dev/null
fi
(
  umask 077
  sed "s#@SECRETS_FILE@#$NB_SECRETS#" "$NB_HERE/configuration.py.in" >"$NB_ROOT/conf/configuration.py.partial"
  mv "$NB_ROOT/conf/configuration.py.partial" "$NB_ROOT/conf/configuration.py"
)

# --- 4. The migrated dump -----------------------------------------------------------------------------
nb_ensure_role
if [[ ! -f "$NB_DUMP" ]]; then
  db="netbox_migrate_${NB_VERSION_ID}"
  if nb_db_exists "$db"; then nb_drop_db "$db"; fi
  nb_as_postgres createdb -O "$NB_DB_ROLE" "$db"
  NETBOX_DB_NAME="$db" nb_timed "netbox migrate (once per version)" nb_netbox migrate --no-input -v 0
  nb_timed "pg_dump of the migrated database" \
    nb_as_postgres pg_dump -Fc -d "$db" >"$NB_DUMP.partial"
  mv "$NB_DUMP.partial" "$NB_DUMP"
  nb_drop_db "$db"
fi

# --- 5. The template database -------------------------------------------------------------------------
nb_ensure_template
nb_log "install complete in $(nb_elapsed "$install_started") s (cache: $NB_CACHE)"
