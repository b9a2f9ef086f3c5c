"""The attempt loop's retry (``table/commit.retrying``), shared by epochs and compactions: what
a lost race, a restart and an exhausted policy do. The stages themselves run against real
tables in the sink's suites (``tests/test_sink.py``, ``tests/test_concurrency.py``)."""

from __future__ import annotations

import pytest

from mvsink.config import RetryPolicy
from mvsink.errors import ConflictError, RetriesExhaustedError, Where
from mvsink.table.commit import Lost, retrying

WHERE = Where("v", "/t", 3)
FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.0, max_backoff_s=0.0)
LOSSES: list[tuple[int, str]] = []


def lost(n: int, race: Lost, pause: float) -> None:
    LOSSES.append((n, race.reason))


def exhausted(n: int) -> Exception:
    return RetriesExhaustedError(f"lost the commit race {n} times in a row; nothing changed", WHERE)


def test_lost_races_are_retried_until_an_attempt_lands() -> None:
    seen: list[int] = []

    def attempt(n: int) -> str | Lost | None:
        seen.append(n)
        return Lost("version 7 was taken") if n < 3 else f"landed at attempt {n}"

    LOSSES.clear()
    assert retrying(FAST, attempt, lost=lost, exhausted=exhausted) == "landed at attempt 3"
    assert seen == [1, 2, 3] and LOSSES == [(1, "version 7 was taken"), (2, "version 7 was taken")]


def test_a_restart_counts_as_an_attempt_without_backing_off(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("mvsink.epoch.run.time.sleep", slept.append)
    slow = RetryPolicy(max_attempts=3, initial_backoff_s=9.0, max_backoff_s=9.0)
    results = iter([None, Lost("taken"), "done"])
    assert retrying(slow, lambda n: next(results), lost=lost, exhausted=exhausted) == "done"
    assert len(slept) == 1 and 4.5 <= slept[0] <= 9.0  # only the lost race backed off


def test_an_exhausted_policy_raises_with_the_reason(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("mvsink.epoch.run.time.sleep", slept.append)
    with pytest.raises(RetriesExhaustedError, match="4 times in a row; nothing changed") as info:
        retrying(FAST, lambda n: Lost("taken"), lost=lost, exhausted=exhausted)
    assert isinstance(info.value, ConflictError) and info.value.epoch == 3
    assert len(slept) == 3  # no sleep after the last attempt
