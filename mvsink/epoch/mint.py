"""Mint: turn an epoch and the target's frontier into a batch description, or into nothing.

A description ``(lower, upper)`` reads "replace the contents valid at ``lower`` by desired as of
``upper - 1``". ``lower`` is the frontier read from the snapshot the correction is computed
against, ``upper`` is ``epoch + 1``. Epoch numbers compare only within a lineage
(``lineage.py``). We mint only when

1. the epoch is at or past ``as_of`` (earlier epochs produce nothing), and
2. the epoch's lineage is not fenced (superseded by another lineage: it never writes again),
3. the epoch is not yet reflected in its own lineage: ``epoch + 1 > `` that lineage's frontier
   (otherwise this is a replay after a restart, or a replica that is behind, and writing would
   move the frontier backwards); a new lineage either takes the view over from this epoch (a
   takeover description) or is refused, never taken for a replay of another's, and
4. the sink is not read-only.

Because every description is minted from a fresh snapshot and only ever committed against that
snapshot, lowers strictly increase across the committed descriptions of a lineage (I1), and at
most one description is valid at a time: the one whose lower is the current frontier (I2).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from mvsink.epoch.clock import Verdict
from mvsink.epoch.lineage import Lineage
from mvsink.errors import InvariantViolation, Where

log = logging.getLogger(__name__)

Skip = Literal["replay", "before_as_of", "read_only", "fenced"]


@dataclass(frozen=True)
class BatchDescription:
    """``(lower, upper)``: lower is None for a target this view never committed to."""

    lower: int | None
    upper: int
    takeover: bool = False
    """A new lineage's first epoch: its upper counts in its own epochs, not the old lineage's."""
    clocked: bool = False
    """Minted under a shared clock (``clock.py``): the time decides, not the upper."""

    def __post_init__(self) -> None:
        if self.lower is not None and self.upper <= self.lower and not (self.takeover or self.clocked):
            raise InvariantViolation(f"a description must advance the frontier: {self}")


def mint(
    epoch: int,
    frontier: int | None,
    lineage: Lineage,
    *,
    as_of: int,
    read_only: bool,
    adopt: bool,
    mode: str,
    where: Where,
    verdict: Verdict | None = None,
    active_writer: bool = False,
) -> BatchDescription | Skip:
    """The description for ``epoch`` of ``lineage`` against ``frontier``, or why there is
    none. A new lineage is refused (``LineageError``) unless ``adopt``. Under a shared clock
    (``verdict`` given, ``clock.compare``) only an epoch ahead of the committed time mints,
    whatever its lineage."""
    if epoch < as_of:
        return "before_as_of"
    if verdict is not None:
        if verdict != "ahead":
            log.info("%s: the epoch's time is %s the committed time: nothing to write", where, verdict)
            return "replay"
        return "read_only" if read_only else BatchDescription(frontier, epoch + 1, clocked=True)
    if lineage.fenced and not active_writer:
        return "fenced"
    if lineage.new or lineage.fenced:  # (a fenced lineage whose writer was promoted takes over)
        if read_only:
            return "read_only"
        if not adopt and not active_writer:
            lineage.refuse_new(mode, where)
        log.warning(
            "%s: lineage %s takes the view over at its epoch %d (the view's frontier was %s); the "
            "lineage that owned it is fenced from now on",
            where,
            lineage.name,
            epoch,
            frontier,
        )
        return BatchDescription(lower=frontier, upper=epoch + 1, takeover=True)
    own = lineage.frontier if lineage.owns else frontier
    if own is not None and epoch + 1 <= own:
        if lineage.owner is None:
            log.warning(
                "%s: epoch %d is below the frontier %d of a view with no recorded lineage: taken "
                "for a replay (if a new checkpoint started, pass a new lineage to take over)",
                where,
                epoch,
                own,
            )
        return "replay"
    if read_only:
        return "read_only"
    try:
        return BatchDescription(lower=frontier, upper=epoch + 1)
    except InvariantViolation as exc:
        raise InvariantViolation(exc.message, where) from None
