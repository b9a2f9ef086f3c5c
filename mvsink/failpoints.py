"""Fail points: named places in the epoch where a test makes mvsink fail on purpose.

A fail point is a call ``hit("name", where, ...)`` at one of the epoch's seams. It does nothing
unless the point is armed, and costs one check of an empty dict when none is. Nothing arms a
point in production: like Materialize's ``fail_point!``, they are off unless a test turns
them on, in one of two ways:

* inside a test, with ``armed({"after_commit": "raise"})``, in this process only; an action
  may also be a callable, run with the point's arguments (``before_commit`` passes the
  snapshot), and ``view=`` scopes the points to one view's sink:
  ``armed({"before_commit": land_a_competing_commit}, view="v")``;
* for a process and the Spark workers it starts (Spark's Python workers see only the
  environment they started with, so task points need this route), by the environment
  variable ``MVSINK_FAILPOINTS``, ``"after_commit=raise;write_task=kill@0.2;before_commit=sleep:5"``,
  honoured only when ``MVSINK_FAILPOINTS_ENABLE=1`` is set too (the explicit opt-in of a test
  harness): read when this module is first imported, or again by ``from_environment()``.
  A stray ``MVSINK_FAILPOINTS`` alone arms nothing, so it can never fail (or SIGKILL) a job.

A spelled action is ``raise`` (an ``InjectedFault``, as an unexpected error there would),
``sleep:S`` (seconds), or ``kill`` (SIGKILL of this process, as a crash or an OOM kill would).
``@p`` fires it with probability ``p``, drawn from a generator seeded by
``MVSINK_FAILPOINTS_SEED`` (default 0) and the process id.

The points (``POINTS``) and what failing there proves:

* ``after_snapshot``: nothing is staged yet; the epoch fails and nothing is written.
* ``after_staging``: staged files exist and nothing references them (invariant I4).
* ``before_commit``: the same, at the last moment; the attempt's files are discarded. Called
  with the snapshot the commit is made on (tests land a competing commit in that window).
* ``after_schema_commit``: through delta-rs in upsert or append mode, the version adding
  desired's columns landed and the epoch's own commit was not made (a crash between them).
* ``after_commit_call``: the commit call was made, its outcome unknown to the caller: the log
  decides (``table/commit.py``). Every strict commit of the view passes it: an epoch's, a
  compaction's, a promotion's.
* ``after_commit``: the commit landed and the sink did not record it; Spark runs the batch
  again and finds it reflected (a replay).
* ``metrics_before_commit``: the metrics table's append, before its commit call
  (``ops/metrics.record``).
* ``history_before_commit``: a history commit's files are staged, its commit not made
  (``history/keep.py``); called with the history's snapshot (tests land a replica's history
  commit in that window: this one must lose, and its files go).
* ``write_task``, ``rewrite_task``: inside Spark tasks that stage files. Tasks do not know
  their view: these points are armed for every view (``armed`` refuses a ``view`` for them).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

POINTS = (
    "after_snapshot",
    "after_staging",
    "before_commit",
    "after_schema_commit",
    "after_commit_call",
    "after_commit",
    "metrics_before_commit",
    "history_before_commit",
    "write_task",
    "rewrite_task",
)
TASK_POINTS = frozenset({"write_task", "rewrite_task"})
"""Points hit inside Spark tasks, without a view."""
ENV = "MVSINK_FAILPOINTS"
ENABLE = "MVSINK_FAILPOINTS_ENABLE"
"""Set to ``1`` to let ``MVSINK_FAILPOINTS`` arm points (a test harness's opt-in)."""

Action = str | Callable[..., object]
"""A spelled action (``raise``, ``sleep:S``, ``kill``, each with an optional ``@p``) or a
callable run with the point's arguments."""


class Where(Protocol):
    """Where a point is hit: an ``errors.Where`` (its ``view`` scopes points armed for one)."""

    @property
    def view(self) -> str | None: ...


class InjectedFault(Exception):
    """Raised by an armed fail point (not an ``MVSinkError``: it stands for an unexpected one)."""


def parse(spec: str) -> dict[str, str]:
    """``"a=raise;b=kill@0.5"`` as ``{"a": "raise", "b": "kill@0.5"}``, every name and
    action checked."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, action = part.partition("=")
        name = name.strip()
        _check_name(name)
        _check(action.strip(), name)
        out[name] = action.strip()
    return out


def _check_name(name: str) -> None:
    if name not in POINTS:
        raise ValueError(f"{ENV}: no fail point {name!r} (the points: {', '.join(POINTS)})")


def _check(action: str, name: str) -> None:
    what, _, p = action.partition("@")
    kind, _, arg = what.partition(":")
    if kind not in ("raise", "sleep", "kill") or (kind == "sleep") != bool(arg):
        raise ValueError(f"{ENV}: {name}: an action is raise, sleep:SECONDS or kill, got {action!r}")
    float(arg or 0), float(p or 1)


_armed: dict[tuple[str, str | None], Action] = {}
"""The armed points by (point, view); view None: every view's."""
# Each process (a Spark worker is one) draws its own sequence from the seed.
_random = random.Random(int(os.environ.get(f"{ENV}_SEED", "0")) * 1_000_003 + os.getpid())


def from_environment() -> dict[str, str]:
    """Arm (for every view) the points ``MVSINK_FAILPOINTS`` names, if ``MVSINK_FAILPOINTS_ENABLE``
    is ``1``; returns what it armed. Run when this module is imported."""
    if os.environ.get(ENABLE) != "1":
        return {}
    points = parse(os.environ.get(ENV, ""))
    _armed.update({(name, None): action for name, action in points.items()})
    return points


from_environment()


def hit(name: str, where: Where | None = None, *args: Any) -> None:
    """The fail point ``name`` (of the sink ``where`` is of, if known): act if it is armed,
    for that view or for every view. A callable action is run with ``args``."""
    if _armed:
        view = None if where is None else where.view
        action = _armed.get((name, view)) if view is not None else None
        if action is None:
            action = _armed.get((name, None))
        if action is not None:
            _fire(name, action, args)


def _fire(name: str, action: Action, args: tuple[Any, ...]) -> None:
    if callable(action):
        action(*args)
        return
    what, _, p = action.partition("@")
    if p and _random.random() >= float(p):
        return
    kind, _, arg = what.partition(":")
    if kind == "sleep":
        time.sleep(float(arg))
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise InjectedFault(f"fail point {name}")


@contextlib.contextmanager
def armed(points: Mapping[str, Action], *, view: str | None = None) -> Iterator[None]:
    """Arm ``points`` in this process for the block (on top of the environment's), for the
    sinks of view ``view`` only, or for all."""
    for name, action in points.items():
        _check_name(name)
        if not callable(action):
            _check(action, name)
        if view is not None and name in TASK_POINTS:
            raise ValueError(f"fail point {name} runs in Spark tasks, which know no view: arm it for all")
    saved = dict(_armed)
    _armed.update({(name, view): action for name, action in points.items()})
    try:
        yield
    finally:
        _armed.clear()
        _armed.update(saved)
