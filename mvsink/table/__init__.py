"""The table's bytes and log: the I/O layer (``storage``, ``stats``), the Delta shim (``delta``,
``jvm_delta``, ``deletion_vectors``, ``catalog``), schemas, fingerprints, the index, staging (``write``).
Imports only ``errors``, ``report`` and ``compat`` from the rest of mvsink."""
