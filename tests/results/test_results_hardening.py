"""Hardening of the read side: `ablate sql` as the reader role may read Optuna's tables too.

(A campaign across the house: `pytest -m hardening` runs all of it.)
"""

from __future__ import annotations


import pytest

from ablate import store



pytestmark = pytest.mark.hardening


def test_sql_as_the_reader_role_may_join_runs_with_optunas_trials(postgres_url, capsys):
    """Optuna makes its tables after the migrations: creating a study grants the reader role SELECT on them."""
    from tests.search.test_search import tiny

    from ablate import search
    from ablate.cli import main
    from ablate.config import parse_spec

    search.create_study(parse_spec(tiny()), postgres_url)
    query = ("SELECT current_user AS who, count(t.trial_id) AS n FROM studies s "
             "LEFT JOIN trials t ON t.study_id = s.study_id")
    assert main(["sql", query, "--db", postgres_url, "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == f"{store.READER_ROLE},0"
