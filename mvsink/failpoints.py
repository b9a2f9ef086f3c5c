"""Fail points: named places in the epoch where a test makes mvsink fail on purpose.

A fail point is a call ``hit("name")`` at one of the epoch's seams. It does nothing unless the
point is armed, and costs one check of an empty dict when none is. Points are armed:

* for a process (and the Spark workers it starts), by the environment variable
  ``MVSINK_FAILPOINTS``, read when this module is first imported:
  ``"after_commit=raise;write_task=kill@0.2;before_commit=sleep:5"``;
* inside a test, with ``armed({"after_commit": "raise"})`` (in this process only: Spark's
  Python workers see the environment they started with, so task points need the variable).

An action is ``raise`` (an ``InjectedFault``, as an unexpected error there would), ``sleep:S``
(seconds), or ``kill`` (SIGKILL of this process, as a crash or an OOM kill would). ``@p`` fires it
with probability ``p``, drawn from a generator seeded by ``MVSINK_FAILPOINTS_SEED`` (default 0)
and the process id.

The points (``POINTS``) and what failing there proves:

* ``after_snapshot``: nothing is staged yet; the epoch fails and nothing is written.
* ``after_staging``: staged files exist and nothing references them (invariant I4).
* ``before_commit``: the same, at the last moment; the attempt's files are discarded.
* ``after_schema_commit``: through delta-rs in upsert or append mode, the version adding
  desired's columns landed and the epoch's own commit was not made (a crash between them).
* ``after_commit_call``: the commit call was made, its outcome unknown to the caller: the log
  decides (``delta.compare_and_append``).
* ``after_commit``: the commit landed and the sink did not record it; Spark runs the batch
  again and finds it reflected (a replay).
* ``write_task``, ``rewrite_task``: inside Spark tasks that stage files.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Iterator, Mapping

POINTS = (
    "after_snapshot",
    "after_staging",
    "before_commit",
    "after_schema_commit",
    "after_commit_call",
    "after_commit",
    "write_task",
    "rewrite_task",
)
ENV = "MVSINK_FAILPOINTS"


class InjectedFault(Exception):
    """Raised by an armed fail point (not an ``MVSinkError``: it stands for an unexpected one)."""


def parse(spec: str) -> dict[str, str]:
    """``"a=raise;b=kill@0.5"`` as ``{"a": "raise", "b": "kill@0.5"}``, every name and
    action checked."""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, action = part.partition("=")
        name = name.strip()
        if name not in POINTS:
            raise ValueError(f"{ENV}: no fail point {name!r} (the points: {', '.join(POINTS)})")
        _check(action.strip(), name)
        out[name] = action.strip()
    return out


def _check(action: str, name: str) -> None:
    what, _, p = action.partition("@")
    kind, _, arg = what.partition(":")
    if kind not in ("raise", "sleep", "kill") or (kind == "sleep") != bool(arg):
        raise ValueError(f"{ENV}: {name}: an action is raise, sleep:SECONDS or kill, got {action!r}")
    float(arg or 0), float(p or 1)


_armed: dict[str, str] = parse(os.environ.get(ENV, ""))
# Each process (a Spark worker is one) draws its own sequence from the seed.
_random = random.Random(int(os.environ.get(f"{ENV}_SEED", "0")) * 1_000_003 + os.getpid())


def hit(name: str) -> None:
    """The fail point ``name``: act if it is armed."""
    if _armed:
        action = _armed.get(name)
        if action is not None:
            _fire(name, action)


def _fire(name: str, action: str) -> None:
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
def armed(points: Mapping[str, str]) -> Iterator[None]:
    """Arm ``points`` in this process for the block (on top of the environment's)."""
    for name, action in points.items():
        parse(f"{name}={action}")
    saved = dict(_armed)
    _armed.update(points)
    try:
        yield
    finally:
        _armed.clear()
        _armed.update(saved)
