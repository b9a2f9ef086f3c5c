"""Cadence: when an epoch creates a Delta version.

Two options share one form, a number of epochs or a duration (``"30s"``, ``"10m"``, ``"2h"``,
``"1d"``, ``"250ms"``), counted since the view's last commit:

* ``heartbeat`` (complete mode): an epoch whose correction is empty (the target already
  equals desired) commits nothing unless a heartbeat is due. Then a 1-second trigger on a quiet view makes a
  version every 10 minutes (the default), not 86,400 a day, and the frontier still moves
  often enough for replay detection and for app-transaction retention. ``0`` commits every
  epoch, as before.
* ``refresh_every`` (complete mode): the view advances only when a refresh is due; the epochs
  in between write nothing (their batch still runs, as Spark requires, but is neither
  collected nor compared). A due refresh commits even when nothing changed, so the next one
  counts from it. At a refresh the commit reflects the latest desired (a complete batch is
  the whole view, so nothing skipped is lost). The sink acts only when Spark runs a batch: the
  changes of epochs after the last refresh wait for the next due epoch, which for a source
  that goes quiet means its next input.

"Since the last commit" is read from the target, never kept in memory, so a restart or a
replica sees the same cadence: in epochs, ``epoch + 1 - frontier`` of the epoch's lineage; in
time, the app transaction ``mvsink:<view>#at`` (milliseconds since 1970) every commit records.

What must land always commits, due or not: a view's first commit, a lineage taking the view
over or recording itself for the first time (``lineage.py``). In upsert and append mode every
epoch commits: there a version is the proof that an epoch was applied, and an epoch missing
between the frontier and the next one is refused as lost (a skipped epoch's rows are gone; a
complete batch repairs everything, so only complete mode can skip).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def at_key(app_id: str) -> str:
    """The app transaction holding the time of the view's last commit."""
    return f"{app_id}#at"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Cadence:
    """Every ``epochs`` epochs, or every ``seconds`` seconds, since the last commit."""

    epochs: int | None = None
    seconds: float | None = None

    @staticmethod
    def parse(value: int | str) -> Cadence:
        """A number of epochs (an int, or digits) or a duration; ``0`` means every epoch."""
        if isinstance(value, bool):
            raise ValueError(f"expected a number of epochs or a duration like '10m', got {value!r}")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            n = int(value)
            if n < 0:
                raise ValueError(f"a number of epochs must be >= 0, got {n}")
            return Cadence(epochs=max(n, 1))
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(
                f"expected a number of epochs or a duration like '250ms', '30s', '10m', '2h', '1d'; "
                f"got {value!r}"
            )
        return Cadence(seconds=float(match.group(1)) * _UNIT[match.group(2)])

    @property
    def always(self) -> bool:
        return self.epochs == 1 or self.seconds == 0

    def due(self, *, epochs_since: int | None, last_at_ms: int | None, now: int | None = None) -> bool:
        """Whether the epoch ``epochs_since`` epochs after the last commit (None: unknown),
        ``last_at_ms`` after its time (None: unknown), is due. Unknown counts as due."""
        if self.always:
            return True
        if self.epochs is not None:
            return epochs_since is None or epochs_since >= self.epochs
        assert self.seconds is not None
        if last_at_ms is None:
            return True
        return (now_ms() if now is None else now) - last_at_ms >= self.seconds * 1000
