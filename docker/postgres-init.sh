#!/bin/sh
# Runs once, as the superuser, when the postgres service starts on an empty data volume: the statements of
# roles.sql with the application role's and the read-only login's passwords from the environment
# (ABLATE_PG_PASSWORD, ABLATE_PG_READ_PASSWORD), never a default.
set -eu
: "${ABLATE_PG_PASSWORD:?set ABLATE_PG_PASSWORD}"
: "${ABLATE_PG_READ_PASSWORD:?set ABLATE_PG_READ_PASSWORD}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres -v pw="$ABLATE_PG_PASSWORD" \
    -v rpw="$ABLATE_PG_READ_PASSWORD" \
    -f /etc/ablate/postgres-init.sql
