"""What the epoch layer reads of a sink's options.

``config.SinkOptions`` has every field here; the epoch layer names the ones it reads instead
of importing the options model, which sits above it (``config.py`` parses its cadences with
``cadence.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from mvsink.epoch.cadence import Cadence


class EpochOptions(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def app_id(self) -> str: ...

    @property
    def mode(self) -> str: ...

    @property
    def as_of(self) -> int: ...

    @property
    def new_lineage_policy(self) -> str: ...

    @property
    def writer(self) -> str | None: ...

    @property
    def refresh(self) -> Cadence | None: ...

    @property
    def heartbeat_cadence(self) -> Cadence: ...

    @property
    def allow_gaps(self) -> bool: ...

    @property
    def lineage(self) -> str | None: ...

    @property
    def clock(self) -> str | Callable[[Any, int], Any]: ...

    @property
    def checkpoint(self) -> str | None: ...

    @property
    def storage_options(self) -> Mapping[str, str]: ...
