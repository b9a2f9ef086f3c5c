"""One epoch of a view: what it may do, and how it runs.

A sink's call runs one epoch (``run.py``); each attempt of it::

    micro-batch (desired) ──────────────┐
                                         v
    snapshot ──> decide ──> plan ──> stage ──> commit ──> Delta log
       ^         (desc)            (files)      │
       └──────── conflict: discard staged files, reload, retry ──┘

* decide (``decide.py``, over ``mint``, ``lineage`` and ``clock``): from the latest snapshot
  (version ``v``, frontier ``lower``), commit the batch description ``(lower, epoch + 1)``, or
  skip, for a named reason (``report.Reason``), or refuse, with an error.
* plan (``plan/``): the mode plans the rows to insert and the files to rewrite.
* stage (``table/staging.py``): the plan as Parquet that nothing references yet, through the I/O
  layer (``table/storage.py``), on the driver or in Spark tasks.
* commit (``table/delta.py``): removes, adds and the frontier in one Delta version, only if no
  commit at all landed since ``v``.

The frontier of view ``name`` is the app transaction ``mvsink:<name>`` (``table/record.py``):
the target holds desired as of epoch ``frontier - 1``.

Invariants (cited elsewhere by number):

* I1. The view moves forward: each committed description's lower is the frontier the one
  before it set, and at most one description is valid at a time (the one whose lower is the
  current frontier). A plain description's upper is past its lower (checked where it is
  minted, ``mint.py``), so within a lineage the frontier strictly increases; a takeover
  description (a new lineage's first epoch) counts in the new lineage's epochs and may set it
  lower, after which the old lineage is fenced; under a shared clock the committed time
  strictly increases instead (a clocked description commits only ahead of it; its upper is
  its replica's own epoch).
* I2. A commit is only ever made against the snapshot its correction was computed from
  (``table/commit.py`` is strict: any commit since that snapshot makes it lose).
* I3. After a successful append at ``upper`` the target equals desired of epoch ``upper - 1``
  as a multiset, whatever it held before (complete mode); every key the batch touched holds
  exactly its desired row (upsert mode); the batch's rows were added once (append mode).
* I4. No staged file is referenced unless its whole description committed; a failed attempt
  deletes its staged files, and a crash leaves only unreferenced files that vacuum removes.
* I5. Nothing is lost: an epoch commits, is found already reflected (a newer frontier), or
  raises.

``workers.py`` checks Spark's workers before the first epoch; ``query.py`` reads the running
streaming query. Imports ``plan``, ``config``, ``table`` and the base modules.
"""
