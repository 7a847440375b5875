-- Run once by docker/postgres-init.sh (psql, with :'pw' the application role's password from ABLATE_PG_PASSWORD)
-- when the postgres service starts on an empty data volume. The application never connects as a superuser: it is
-- the ordinary role `ablate`, which owns its two databases, ablate's results (and Optuna studies) and Prefect's
-- own state.
CREATE ROLE ablate LOGIN PASSWORD :'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION;
-- `ablate sql` runs its statements as this role; ablate's migration 0005 grants it SELECT on the results
-- tables and views only.
CREATE ROLE ablate_reader NOLOGIN;
GRANT ablate_reader TO ablate;
CREATE DATABASE ablate OWNER ablate;
CREATE DATABASE prefect OWNER ablate;
