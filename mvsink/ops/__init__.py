"""Operators' tools over a view's table: ``status``, ``verify``, ``compact``, ``vacuum``,
``metrics``, ``promote`` (and ``frontier``).
Imports ``plan`` and everything below it; never ``sink``."""
