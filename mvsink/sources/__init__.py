"""``mvsink-delta``: a Delta table as a Spark stream (``reader``), its options (``options``), and
the exact change of one commit (``changes``). ``register(spark)`` is the entry point.
Imports ``table`` and the base modules."""

from mvsink.sources.reader import register

__all__ = ["register"]
