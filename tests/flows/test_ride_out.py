"""The sweep flow rides out a Prefect API outage and says so, whether the outage reached `ride_out` as errors or
was hidden inside Prefect's own client retries (a call started mid-outage returns, a minute late): either way the
pool's workers are not judged until they have had time to beat again. A fake clock; no server."""

from __future__ import annotations

import logging

import httpx
import pytest

import flows.dispatch as dispatch


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(dispatch.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(dispatch.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    monkeypatch.setattr(dispatch, "API_BACK_AT", float("-inf"))
    return now


def test_an_outage_seen_as_errors_is_said_when_it_goes_and_when_it_is_back(clock, caplog):
    answers = iter([httpx.ConnectError("refused"), httpx.ConnectError("refused"), "rows"])

    def call():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with caplog.at_level(logging.INFO):
        assert dispatch.ride_out(call, logging.getLogger("t"), "finding trials") == "rows"
    said = caplog.text
    assert said.count("the Prefect API is unreachable (ConnectError)") == 2, said
    assert "the Prefect API is back after 6 s: finding trials went through" in said, said  # slept 2 + 4
    assert dispatch.API_BACK_AT == clock[0]


def test_an_outage_hidden_by_prefects_own_retries_still_defers_the_worker_check(clock, caplog):
    def call():  # Prefect's client retried inside the call: it returns, 70 s later
        clock[0] += 70
        return "rows"

    with caplog.at_level(logging.INFO):
        assert dispatch.ride_out(call, logging.getLogger("t"), "finding trials") == "rows"
    assert "the Prefect API answered only after 70 s" in caplog.text, caplog.text
    assert dispatch.API_BACK_AT == clock[0]


def test_a_prompt_answer_says_nothing_and_leaves_the_worker_check_alone(clock, caplog):
    def call():
        clock[0] += 1
        return "rows"

    with caplog.at_level(logging.INFO):
        assert dispatch.ride_out(call, logging.getLogger("t"), "finding trials") == "rows"
    assert caplog.text == ""
    assert dispatch.API_BACK_AT == float("-inf")


def test_a_client_error_is_not_ridden_out(clock):
    request = httpx.Request("GET", "http://x")

    def call():
        raise httpx.HTTPStatusError("gone", request=request, response=httpx.Response(404, request=request))

    with pytest.raises(httpx.HTTPStatusError):
        dispatch.ride_out(call, logging.getLogger("t"), "reading")
