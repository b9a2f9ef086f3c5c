"""What an epoch may do: ``decide`` (one function, every reason), over ``mint``, ``lineage`` (and
active writers), ``clock``, ``cadence``; ``workers`` checks Spark's workers before the first epoch.
Imports ``table`` and the base modules; reads options through ``options.EpochOptions``."""
