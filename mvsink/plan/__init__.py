"""How a mode turns an epoch into a plan: ``context``, ``complete``, ``upsert``, ``append``, the
diff (``correction``) and its Spark form (``distributed``), ``prune``, ``rules``, ``quarantine``.
Imports ``config``, ``epoch``, ``table`` and the base modules; never ``sink``."""
