"""The history of a view (``history_target``): every row's lifetimes, in a second Delta table.

* ``lifetimes.py``: what a lifetime is, and the one rule that moves lifetimes from one version
  of the view's table to the next (``carry``).
* ``keep.py``: the history table kept version by version, each version of the view as one
  commit of the history, read from the view's log.
* ``tasks.py``: a version's lifetimes carried in Spark tasks, for a view planned there.

Invariants (cited elsewhere by number):

* H1. The history's frontier ``f`` (``record.HistoryKeys``) says it holds versions ``0 ..
  f - 1`` of the view's table, or those since ``#since`` (where it began, or past every
  lifetime its retention dropped: ``History.tidy``): its open lifetimes are then the rows of
  version ``f - 1``, one for one, and the view at any version or time it holds is the rows
  whose lifetime holds it (``valid_from <= t < valid_to``). A lifetime no version holds
  (``opened_version = closed_version``: an upsert view's late event) changes no answer.
* H2. A history commit holds exactly one version of the view, the one at its frontier, and
  lands only on the history's snapshot it was made from (the strict commit): so replicas,
  replays and restarts add each version once.
* H3. A sink that may write the view completes the history to the view's version before its
  epoch plans (and before a replay's skip), and follows its own commit right after it: when
  an epoch returns, the history holds every version up to its commit, unless the history's
  own commit failed (a WARNING; the next epoch completes it). Versions made after it
  by anything else (a compaction, a foreign write) wait for the next epoch; a crash between
  the two commits leaves the history one version behind until then.

Imports ``table`` and the base modules.
"""
