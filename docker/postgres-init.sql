-- Run once by docker/postgres-init.sh (psql, with :'pw' the application role's password from ABLATE_PG_PASSWORD
-- and :'rpw' the read-only login's from ABLATE_PG_READ_PASSWORD)
-- when the postgres service starts on an empty data volume. The application never connects as a superuser: it is
-- the ordinary role `ablate`, which owns its two databases, ablate's results (and Optuna studies) and Prefect's
-- own state.
CREATE ROLE ablate LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
-- `ablate sql` logs in as this role (ABLATE_READ_URL, with :'rpw' from ABLATE_PG_READ_PASSWORD): it belongs to no
-- other role, so no SQL can switch from it to one that writes; ablate's migration 0005 grants it SELECT on the
-- results tables and views only. `ablate` belongs to it (for the migrations' grants and `SET ROLE`).
CREATE ROLE ablate_reader LOGIN PASSWORD :'rpw' NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
GRANT ablate_reader TO ablate;
CREATE DATABASE ablate OWNER ablate;
CREATE DATABASE prefect OWNER ablate;
