"""What an epoch may do: ``decide`` (one function, every reason), over ``mint``, ``lineage`` (and
active writers) and ``clock``; ``workers`` checks Spark's workers before the first epoch.
Imports ``plan``, ``config``, ``table`` and the base modules."""
