-- One server, two databases: ablate's results (and Optuna studies) and Prefect's own state.
CREATE DATABASE prefect;
