"""Fail points (``mvsink/failpoints.py``): parsing, arming and scoping, off by default. Pure:
no Spark (what failing at each point proves is tests/test_faults.py's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mvsink import failpoints
from mvsink.errors import Where
from mvsink.failpoints import InjectedFault


def test_a_spec_is_parsed_and_checked():
    assert failpoints.parse(" after_commit=raise ; write_task=sleep:0.5@0.1;") == {
        "after_commit": "raise",
        "write_task": "sleep:0.5@0.1",
    }
    with pytest.raises(ValueError, match="no fail point 'after_lunch'"):
        failpoints.parse("after_lunch=raise")
    with pytest.raises(ValueError, match="raise, sleep:SECONDS or kill"):
        failpoints.parse("after_commit=explode")
    with pytest.raises(ValueError, match="raise, sleep:SECONDS or kill"):
        failpoints.parse("after_commit=sleep")


def test_an_unarmed_point_does_nothing():
    failpoints.hit("after_commit")
    failpoints.hit("before_commit", Where("v", "/t"), object())


def test_an_armed_point_fires_inside_the_block_only():
    with failpoints.armed({"after_commit": "raise"}), pytest.raises(InjectedFault, match="after_commit"):
        failpoints.hit("after_commit")
    failpoints.hit("after_commit")


def test_a_callable_runs_with_the_points_arguments_for_its_view_only():
    seen: list[tuple[str, object]] = []
    snap = object()
    with failpoints.armed({"before_commit": lambda s: seen.append(("v", s))}, view="v"):
        failpoints.hit("before_commit", Where("other", "/t"), snap)
        failpoints.hit("before_commit", None, snap)  # a point hit without a view: not v's
        assert seen == []
        failpoints.hit("before_commit", Where("v", "/t"), snap)
        assert seen == [("v", snap)]
        with failpoints.armed({"before_commit": lambda s: seen.append(("any", s))}):
            failpoints.hit("before_commit", Where("other", "/t"), snap)
            failpoints.hit("before_commit", Where("v", "/t"), snap)  # v's own comes first
    assert seen == [("v", snap), ("any", snap), ("v", snap)]
    failpoints.hit("before_commit", Where("v", "/t"), snap)
    assert len(seen) == 3


def test_arming_an_unknown_point_or_action_is_refused():
    with pytest.raises(ValueError, match="no fail point"), failpoints.armed({"nowhere": "raise"}):
        pass
    with pytest.raises(ValueError, match="an action is"), failpoints.armed({"after_commit": "boom"}):
        pass
    # A task's point is hit without a view: scoped to one, it would never fire.
    with pytest.raises(ValueError, match="for all"), failpoints.armed({"write_task": "raise"}, view="v"):
        pass


def _armed_in_a_fresh_process(env: dict[str, str]) -> str:
    code = "from mvsink import failpoints; print(sorted(k for k, _ in failpoints._armed))"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(failpoints.ENV)}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_the_environment_arms_nothing_without_the_opt_in():
    """A stray MVSINK_FAILPOINTS in production arms nothing: only MVSINK_FAILPOINTS_ENABLE=1
    (a test harness's) lets it."""
    spec = {failpoints.ENV: "after_commit=kill"}
    assert _armed_in_a_fresh_process(spec) == "[]"
    assert _armed_in_a_fresh_process({**spec, failpoints.ENABLE: "1"}) == "['after_commit']"
    assert _armed_in_a_fresh_process({**spec, failpoints.ENABLE: "yes"}) == "[]"


def test_from_environment_arms_what_the_enabled_variable_names(monkeypatch):
    monkeypatch.setenv(failpoints.ENV, "after_snapshot=raise")
    monkeypatch.delenv(failpoints.ENABLE, raising=False)
    with failpoints.armed({}):  # restores what was armed after the block
        assert failpoints.from_environment() == {}
        failpoints.hit("after_snapshot")
        monkeypatch.setenv(failpoints.ENABLE, "1")
        assert failpoints.from_environment() == {"after_snapshot": "raise"}
        with pytest.raises(InjectedFault):
            failpoints.hit("after_snapshot", Where("v", "/t"))
    failpoints.hit("after_snapshot")
