"""What one epoch did, as the sink reports it (returned, kept on the sink, and logged)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Reason = Literal["before_as_of", "replay", "fenced", "read_only", "between_refreshes"]
"""Why an epoch wrote nothing, one reason each, decided in ``epoch/decide.py`` (its doc says
when); ``between_refreshes``: not a refresh epoch (``refresh_every``): the batch ran, nothing
was compared."""

Outcome = Literal["committed", "unchanged", Reason]
"""What an epoch did: committed a version; ``unchanged``: nothing to change and no heartbeat
due, so no version (``decide.unchanged``); or wrote nothing, for a ``Reason``."""

HELD: tuple[Outcome, ...] = ("committed", "unchanged", "replay", "between_refreshes")
"""The outcomes after which the view holds the epoch (committed, or found it already there):
only for those does a sink write what follows the view, such as its errors table."""


@dataclass(frozen=True)
class EpochReport:
    """Per-epoch figures. ``version`` is the Delta version committed (None if none was)."""

    view: str
    target: str
    epoch: int
    outcome: Outcome
    lower: int | None
    upper: int | None
    version: int | None
    inserted: int = 0
    retracted: int = 0
    files_added: int = 0
    files_removed: int = 0
    bytes_written: int = 0
    files_read: int = 0
    """Data files read back: complete mode, files indexed for the first time; upsert mode,
    files whose partition or key statistics could hold a touched key."""
    attempts: int = 0
    seconds: float = 0.0
    whole: bool = False
    """Complete mode wrote desired whole, replacing every file, as that moved fewer bytes
    than correcting file by file (``inserted`` and ``retracted`` then count every row)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds spent per step: snapshot, collect, fingerprint, index, diff, fetch, read, write,
    commit (and prepare and rules where they ran)."""
    snapshot_version: int | None = None
    """The table version the epoch's last attempt read and decided against (None while the
    table did not exist): an ``unchanged`` epoch found that version already equal to desired,
    a ``replay`` found the epoch already reflected in it."""
    clock_time: dict[str, int] | None = None
    """The epoch's time under a shared clock (``clock``): its parts, such as ``{"0.version":
    12}``; None without a clock."""

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object (the ``mvsink.metrics`` log record): every field above,
        ``phases`` as an object of seconds. Fields are only ever added."""
        return {"format": 1, **asdict(self)}

    def __str__(self) -> str:
        head = f"view {self.view} epoch {self.epoch}: {self.outcome}"
        if self.outcome == "replay":
            return f"{head} (frontier already {self.lower}; nothing written)"
        if self.outcome != "committed":
            return f"{head} (nothing written)"
        where = f" as version {self.version}" if self.version is not None else ""
        return (
            f"{head}{where} [{self.lower} -> {self.upper}]: +{self.inserted} -{self.retracted} rows, "
            f"{self.files_added} file(s) added, {self.files_removed} removed, "
            f"{self.bytes_written:,} bytes{' (desired written whole)' if self.whole else ''}, "
            f"{self.attempts} attempt(s), {self.seconds:.2f}s{self._slowest()}"
        )

    def _slowest(self, n: int = 2) -> str:
        """Where most of the epoch's time went: its ``n`` longest phases, e.g. `` (write 8.1s,
        collect 2.0s)``; nothing for an epoch too quick to say."""
        slow = sorted(((s, p) for p, s in self.phases.items() if s >= 0.1), reverse=True)[:n]
        return f" ({', '.join(f'{p} {s:.1f}s' for s, p in slow)})" if slow else ""
