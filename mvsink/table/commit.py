"""The strict commit, top to bottom: prepare -> call -> outcome -> after.

Modelled on delta-rs's ``CommitBuilder`` -> ``PreparedCommit`` -> ``PostCommit``:

* **prepare** (``prepare_append``, ``prepare_add_columns``): check what is to be committed
  and build the ``Prepared`` commit, which holds one engine path (``Path``) up to its call.
  Nothing here can land anything: an error discards the staged files.
* **call** (``Prepared.call``): the one place a commit call is made, under the table's
  commit turn. Its outcome is a value: ``Landed``, ``Lost`` (another commit holds the version:
  nothing references the staged files) or ``Unknown`` (the log cannot tell). A call that
  raised proves nothing by itself (delta-rs may fail after writing the commit file, an object
  store's retried put may find our own commit in place): the log at the version decides
  (``_outcome_in_log``), as persist's indeterminate ``compare_and_append``.
* **after** (``after``): on a landed commit, what follows it: the check that delta-rs's
  overwrite replaced every file, and checkpointing (``_maintain_log``), best-effort.

Strict: a commit lands only if no commit at all landed since its snapshot (delta-rs retries
are off, because its rebase turns our removes of concurrently compacted files into silent
no-ops). Every commit records its ``attempt_id`` in its metadata (``record.ATTEMPT``): how a
failed call is told apart from a landed one, read from the version's own log file.

What an outcome allows a caller to do with the staged files (I4): ``Lost``: delete them;
``Unknown``: keep them (the commit may still land). A caller that cannot go on with an
``Unknown`` raises ``CommitOutcomeUnknownError`` from it (``Unknown.error``). The one retry
loop over lost races is ``retrying``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import quote, unquote

from deltalake import DeltaTable, Field, Schema
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from mvsink import failpoints
from mvsink.errors import (
    CommitOutcomeUnknownError,
    ConflictError,
    InvariantViolation,
    MVSinkError,
    Where,
)
from mvsink.table import record
from mvsink.table.delta import (
    NO_HOOKS,
    DataFile,
    NewFile,
    Snapshot,
    keeps_files_across_schema_change,
    open_table,
    physical_names,
    unique_id,
)
from mvsink.table.log import LogFiles, commit_attempt
from mvsink.table.uris import is_local

log = logging.getLogger(__name__)


# -- outcomes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Landed:
    """A commit that landed, as version ``version``."""

    version: int


@dataclass(frozen=True)
class Lost:
    """A commit that did not land: another commit held the version (``reason`` says which).
    Nothing can reference its files."""

    reason: str
    cause: BaseException | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Unknown:
    """A commit call that failed, and the log could not tell whether it landed: the staged
    files must be kept. ``message`` is what the user sees (``error``)."""

    message: str
    cause: BaseException | None = field(default=None, repr=False, compare=False)

    def error(self, where: Where) -> CommitOutcomeUnknownError:
        """The error a caller that cannot go on raises (``from self.cause``)."""
        return CommitOutcomeUnknownError(self.message, where)


Outcome = Landed | Lost | Unknown

Path = Literal["create", "jvm", "overwrite", "append", "add_columns"]
"""The engine paths of a commit: a new table (delta-rs), the session's JVM Delta, delta-rs's
overwrite (a new schema, every file replaced), delta-rs's append, delta-rs's alter (columns
added, nothing else)."""


# -- prepare --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """A commit up to its call: one engine path, ready to be sent once."""

    snap: Snapshot
    log_files: LogFiles
    """The table's storage: the log that decides a failed call."""
    version: int
    """The version it lands as, or none."""
    attempt_id: str
    where: Where
    path: Path
    send: Callable[[], int | None] = field(repr=False)
    """The engine's commit call; returns the version the JVM Delta reports, else None."""
    hit_point: bool = True
    """Whether the ``after_commit_call`` fail point follows the call."""

    def call(self) -> Outcome:
        """Make the commit call, the only one, and say what it did."""
        # mvsink's delta-rs commits to a local table take the commit turn too: the JVM's local
        # store replaces a commit file it found free a moment before (``jvm_delta.commit_turn``);
        # the JVM Delta's own call takes it itself (``JvmDelta.prepare``).
        turn: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self.path != "jvm" and is_local(self.snap.root):
            from mvsink.table.jvm_delta import commit_turn

            turn = commit_turn(self.snap.root)
        # Only the commit call is inside: whatever it raises, the log decides what it did.
        try:
            with turn:
                reported = self.send()
        except Exception as exc:
            return _outcome_in_log(self.log_files, self.version, self.attempt_id, exc, self.where)
        if reported is not None and reported != self.version:
            # Landed, but not on top of the snapshot it was planned on: its files are referenced.
            raise InvariantViolation(
                f"the session's Delta committed version {reported}, not {self.version}: it rebased the "
                "commit over another one (is spark.databricks.delta.maxCommitAttempts=0 honoured?). The "
                "staged files are kept; the next epoch repairs the view.",
                self.where,
            )
        try:
            if self.hit_point:
                failpoints.hit("after_commit_call", self.where)
        except Exception as exc:  # a failure right after the call, as a post-commit step's can be
            return _outcome_in_log(self.log_files, self.version, self.attempt_id, exc, self.where)
        return Landed(self.version)


def prepare_append(
    snap: Snapshot,
    log_files: LogFiles,
    *,
    adds: Sequence[NewFile],
    removes: Sequence[DataFile],
    app_id: str,
    upper: int | None,
    attempt_id: str,
    metadata: Mapping[str, str],
    schema_json: str,
    partition_by: Sequence[str],
    where: Where,
    transactions: Mapping[str, int] | None = None,
    data_change: bool = True,
    changes: Sequence[NewFile] = (),
    updates: Sequence[DataFile] = (),
) -> Prepared:
    """The commit of ``adds``, ``removes`` and the frontier ``upper`` (None: left as it is) as
    one Delta version on ``snap`` (see ``compare_and_append``), up to its call."""
    version = 0 if snap.version is None else snap.version + 1
    now = int(time.time() * 1000)
    txns = {**({app_id: upper} if upper is not None else {}), **(transactions or {})}
    props = _properties(metadata, attempt_id, txns, now)
    new_schema = snap.version is not None and schema_json != snap.schema_json
    _check_engine_can(snap, removes, changes, updates, new_schema, where)
    prepared = Prepared(snap, log_files, version, attempt_id, where, "append", lambda: None)
    if snap._jvm is not None:
        # Through the session's JVM Delta, everything before its commit call (a failure there
        # cannot have landed anything) happens now.
        changed = schema_json if new_schema else None
        jvm = _prepare_jvm(
            snap, log_files, adds, removes, changes, updates, props, data_change, where, changed
        )
        return replace(prepared, path="jvm", send=_jvm_send(jvm, log_files, version, attempt_id))
    add_actions = [
        AddAction(f.path, f.size, dict(f.partition_values), now, data_change, f.stats) for f in adds
    ]
    parts = list(partition_by) or None
    if snap.version is None:
        send = _create(snap, schema_json, add_actions, parts, props)
        return replace(prepared, path="create", send=send)
    table: DeltaTable = snap._table
    if new_schema:
        # delta-rs's overwrite: removes every file of the snapshot it was loaded at (the same
        # files as ``removes``, checked) and writes the new schema.
        actions = list[AddAction | RemoveAction](add_actions)
        send = _write(table, actions, "overwrite", Schema.from_json(schema_json), parts, props)
        return replace(prepared, path="overwrite", send=send)
    remove_actions = [
        RemoveAction(
            path=f.key,
            data_change=data_change,
            deletion_timestamp=now,
            size=f.size,
            partition_values=dict(f.partition_values) or None,
        )
        for f in removes
    ]
    send = _write(table, [*remove_actions, *add_actions], "append", table.schema(), parts, props)
    return replace(prepared, path="append", send=send)


def prepare_add_columns(
    snap: Snapshot,
    log_files: LogFiles,
    *,
    schema_json: str,
    attempt_id: str,
    metadata: Mapping[str, str],
    where: Where,
    transactions: Mapping[str, int] | None = None,
) -> Prepared:
    """The commit adding the columns of ``schema_json`` that the table lacks (see
    ``add_columns``), up to its call."""
    assert snap.version is not None and snap.schema_json is not None
    have = {f["name"] for f in json.loads(snap.schema_json)["fields"]}
    fields = [
        Field.from_json(json.dumps(f)) for f in json.loads(schema_json)["fields"] if f["name"] not in have
    ]
    props = _properties(metadata, attempt_id, transactions or {}, int(time.time() * 1000))
    table: DeltaTable = snap._table

    def send() -> None:
        table.alter.add_columns(fields, commit_properties=props, post_commithook_properties=NO_HOOKS)

    version = snap.version + 1
    return Prepared(snap, log_files, version, attempt_id, where, "add_columns", send, hit_point=False)


def _properties(
    metadata: Mapping[str, str], attempt_id: str, transactions: Mapping[str, int], now: int
) -> CommitProperties:
    """The commit's metadata (with its attempt id) and app transactions; no delta-rs retry."""
    return CommitProperties(
        custom_metadata={**metadata, record.ATTEMPT: attempt_id},
        max_commit_retries=0,
        app_transactions=[Transaction(k, v, now) for k, v in transactions.items()],
    )


def _check_engine_can(
    snap: Snapshot,
    removes: Sequence[DataFile],
    changes: Sequence[NewFile],
    updates: Sequence[DataFile],
    new_schema: bool,
    where: Where,
) -> None:
    """Refuse what the snapshot's engine cannot commit: through delta-rs, a schema change
    only with every file removed (``keeps_files_across_schema_change``), and no change files
    or deletion vectors."""
    if new_schema and not keeps_files_across_schema_change(snap):
        left = {f.path for f in snap.files} - {f.path for f in removes}
        if left or updates:
            raise InvariantViolation(
                f"a schema change through delta-rs must replace every file, and {len(left)} "
                "of the table's would stay",
                where,
            )
    if (changes or updates) and snap._jvm is None:
        raise InvariantViolation(
            "change files or deletion vectors were staged for a commit through delta-rs, which "
            "cannot commit them",
            where,
        )


def _create(
    snap: Snapshot,
    schema_json: str,
    add_actions: list[AddAction],
    parts: list[str] | None,
    props: CommitProperties,
) -> Callable[[], None]:
    """delta-rs's call making the table with its first files (fails if a table is there)."""

    def send() -> None:
        create_table_with_add_actions(
            snap.root,
            Schema.from_json(schema_json),
            add_actions,
            mode="error",
            partition_by=parts,
            storage_options=dict(snap.storage_options) or None,
            commit_properties=props,
            post_commithook_properties=NO_HOOKS,
        )

    return send


def _write(
    table: DeltaTable,
    actions: list[AddAction | RemoveAction],
    mode: Literal["append", "overwrite"],
    schema: Schema,
    parts: list[str] | None,
    props: CommitProperties,
) -> Callable[[], None]:
    """delta-rs's call committing ``actions`` on the version ``table`` was loaded at."""

    def send() -> None:
        table.create_write_transaction(
            actions,
            mode=mode,
            schema=schema,
            partition_by=parts,
            commit_properties=props,
            post_commithook_properties=NO_HOOKS,
        )

    return send


def _jvm_send(
    jvm: Callable[[], int], log_files: LogFiles, version: int, attempt_id: str
) -> Callable[[], int]:
    """The JVM Delta's prepared call, checked against the log."""

    def send() -> int:
        landed = jvm()
        # The JVM's store may replace a commit file (local disk: check, then rename), so its
        # success proves nothing the log does not show: raising lets the log decide.
        if landed == version and commit_attempt(log_files, version) != attempt_id:
            raise MVSinkError(
                f"the session's Delta reported version {version} committed, and its log file "
                "holds another commit"
            )
        return landed

    return send


def _prepare_jvm(
    snap: Snapshot,
    log_files: LogFiles,
    adds: Sequence[NewFile],
    removes: Sequence[DataFile],
    changes: Sequence[NewFile],
    updates: Sequence[DataFile],
    props: CommitProperties,
    data_change: bool,
    where: Where,
    schema_json: str | None = None,
) -> Callable[[], int]:
    """The commit through the session's JVM Delta, up to its call. Removed and re-added files
    repeat what the snapshot's add actions say of them; a ``schema_json`` becomes the table's
    schema in the same commit."""
    from mvsink.table.jvm_delta import add_action, cdc_action, readd_action, remove_action, txn_action

    assert snap.version is not None
    metadata = dict(props.custom_metadata or {})
    user_metadata = metadata.pop("userMetadata", None)
    transactions = list(props.app_transactions or ())
    jvm = snap._jvm
    held = _held(snap, log_files, [f.path for f in (*removes, *updates)])
    for f in (*removes, *updates):  # (an update's vector is its new one)
        found = held.get(f.path)
        if found is None or (
            f in removes and unique_id(found.get("deletionVector")) != unique_id(f.deletion_vector)
        ):
            jvm.forget(snap.root, snap.table_id)  # (read anew by the next attempt)
            raise InvariantViolation(
                f"the session's Delta does not hold {f.path} as version {snap.version} of the table does",
                where,
            )
    # The log keys partition values by the columns' physical names (column mapping).
    names = physical_names(snap.schema_json)

    def keyed(values: Mapping[str, str | None]) -> dict[str, str | None]:
        return {names.get(k, k): v for k, v in values.items()}

    actions = [
        *(remove_action(held[f.path], data_change) for f in removes),
        *(readd_action(held[f.path], f.deletion_vector or {}, data_change) for f in updates),
        # Spelled as delta-rs spells it: partition folders are already escaped on disk.
        *(
            add_action(quote(f.path, safe="/="), f.size, keyed(f.partition_values), f.stats, data_change)
            for f in adds
        ),
        *(cdc_action(quote(f.path, safe="/="), f.size, keyed(f.partition_values)) for f in changes),
        *(txn_action(t.app_id, t.version) for t in transactions),
    ]
    changed = {} if schema_json is None else {"schema_json": schema_json}
    return jvm.prepare(snap.root, snap.version, actions, metadata, user_metadata, **changed)  # type: ignore[no-any-return]


def _held(snap: Snapshot, log_files: LogFiles, paths: Sequence[str]) -> Mapping[str, Mapping[str, Any]]:
    """The add actions of the snapshot's files at ``paths``, by path: from the log
    (``JvmDelta.adds``), or from the session's Delta for a table too big to keep them."""
    if not paths:
        return {}
    assert snap.version is not None and snap.table_id is not None
    jvm = snap._jvm
    adds = jvm.adds(snap.root, snap.table_id, snap.version, log_files, len(snap.files))
    if adds is None:
        return jvm.add_actions(snap.root, snap.version, paths)  # type: ignore[no-any-return]
    return adds.by_path  # type: ignore[no-any-return]


# -- outcome --------------------------------------------------------------------------------


def _outcome_in_log(
    log_files: LogFiles, version: int, attempt_id: str, exc: Exception, where: Where
) -> Outcome:
    """What a commit call that raised ``exc`` did, as the log at ``version`` tells: ours there
    (``Landed``), another's (``Lost``), nothing or unreadable (``Unknown``)."""
    try:
        holder = commit_attempt(log_files, version)
    except Exception as read_exc:
        return Unknown(
            f"committing version {version} failed ({exc}) and the Delta log could not be read back "
            f"to see whether it landed ({read_exc}); the staged files are kept. Rerun the epoch: "
            "it commits, or finds the epoch already written.",
            exc,
        )
    if holder == attempt_id:
        log.warning(
            "%s: the commit call failed (%s) but version %d is ours: the epoch committed", where, exc, version
        )
        return Landed(version)
    if holder is not None:
        return Lost(f"another commit landed as version {version} first ({exc})", exc)
    return Unknown(
        f"committing version {version} failed ({exc}) and the version is not in the log yet; the "
        "staged files are kept in case the commit still lands. Rerun the epoch: it commits, or "
        "finds the epoch already written.",
        exc,
    )


# -- after ----------------------------------------------------------------------------------


def after(prepared: Prepared) -> None:
    """What follows a landed commit: delta-rs's overwrite checked to have replaced every file;
    checkpointing of delta-rs's commits (the JVM Delta checkpoints its own)."""
    if prepared.path == "overwrite":
        _check_replaced_every_file(prepared.snap, prepared.log_files, prepared.version, prepared.where)
    if prepared.path != "jvm":
        _maintain_log(prepared.snap, prepared.version, prepared.where)


def _check_replaced_every_file(snap: Snapshot, log_files: LogFiles, version: int, where: Where) -> None:
    """delta-rs's overwrite removes the snapshot's files itself (not the removes it is handed):
    the version it made must remove every one of them, or its rows are there twice. Raises
    ``InvariantViolation`` if not (a delta-rs whose overwrite does not: the next epoch of a
    complete view retracts the rows it left)."""
    from mvsink.table.log import log_actions

    actions = log_actions(log_files, version) or []
    gone = {unquote(a["remove"]["path"]) for a in actions if "remove" in a}
    left = [f.key for f in snap.files if f.key not in gone]
    if left:
        raise InvariantViolation(
            f"version {version}, which changed the table's schema through delta-rs's overwrite, "
            f"left {len(left)} of the table's files in place (e.g. {left[0]}): this deltalake "
            "does not replace every file in an overwrite; the next epoch retracts their rows",
            where,
        )


def _maintain_log(snap: Snapshot, version: int, where: Where) -> None:
    """Checkpoint (every ``delta.checkpointInterval`` versions) and clean up expired log files,
    as delta-rs's post-commit hooks would, but after the commit and never failing it."""
    props = snap.properties
    interval = props.checkpoint_interval
    if version == 0 or interval <= 0 or version % interval:
        return
    try:
        dt = open_table(snap.root, snap.storage_options, version=version)
        dt.create_checkpoint()
        if props.expired_log_cleanup:
            dt.cleanup_metadata()
    except Exception as exc:
        log.warning("%s: version %d committed, but checkpointing it failed: %s", where, version, exc)


class Backoff(Protocol):
    """What ``retrying`` needs of a retry policy (``config.RetryPolicy``)."""

    @property
    def max_attempts(self) -> int: ...

    def backoff(self, attempt: int, rand: float) -> float: ...


T = TypeVar("T")


def retrying(
    policy: Backoff,
    attempt: Callable[[int], T | Lost | None],
    *,
    lost: Callable[[int, Lost, float], None],
    exhausted: Callable[[int], Exception],
) -> T:
    """The one retry loop of everything that commits strictly (an epoch, a compaction): call
    ``attempt`` with its number until it returns a result. ``Lost`` (a commit race lost,
    nothing referenced) is told to ``lost`` (with the pause) and backs off by ``policy``,
    except after the last attempt; None starts over at once. After ``policy.max_attempts``
    attempts, raises ``exhausted(max_attempts)``."""
    for n in range(1, policy.max_attempts + 1):
        result = attempt(n)
        if result is None:
            continue
        if not isinstance(result, Lost):
            return result
        pause = policy.backoff(n, random.random())
        lost(n, result, pause)
        if n < policy.max_attempts:
            time.sleep(pause)
    raise exhausted(policy.max_attempts)


# -- the pipeline, whole --------------------------------------------------------------------


def commit(prepared: Prepared) -> Outcome:
    """Call, then, if it landed, what follows (``after``)."""
    outcome = prepared.call()
    if isinstance(outcome, Landed):
        after(prepared)
    return outcome


def append(snap: Snapshot, log_files: LogFiles, **request: Any) -> Landed | Lost:
    """``compare_and_append`` with its outcome as a value: ``Landed`` or ``Lost``. An outcome
    the log cannot tell raises ``CommitOutcomeUnknownError``: the commit may have landed."""
    outcome = commit(prepare_append(snap, log_files, **request))
    if isinstance(outcome, Unknown):
        raise outcome.error(request["where"]) from outcome.cause
    return outcome


def compare_and_append(snap: Snapshot, log_files: LogFiles, **request: Any) -> int:
    """Commit ``adds``, ``removes`` and the frontier ``upper`` (None: left as it is) as one
    Delta version, strictly on ``snap`` (the module doc); returns the new version.

    ``data_change=False`` marks a commit that moves rows without changing them (a compaction:
    streaming readers skip it). ``changes`` are change files (the commit's retracted and
    inserted rows with ``_change_type``, for Change Data Feed), committed as ``cdc`` actions;
    ``updates`` are files of ``removes`` added again with another deletion vector. Only the
    session's JVM Delta commits those. A ``schema_json`` other than the snapshot's changes the
    table's schema in the same commit (a ``metaData`` action): through delta-rs only with every
    file of the snapshot removed (``keeps_files_across_schema_change``). The keywords are
    ``prepare_append``'s.

    Raises ``ConflictError`` when another commit holds the version (ours cannot land: delete the
    files), ``CommitOutcomeUnknownError`` when the log could not say (the files must be kept).
    """
    outcome = append(snap, log_files, **request)
    if isinstance(outcome, Lost):
        raise ConflictError(outcome.reason, request["where"]) from outcome.cause
    return outcome.version


def add_columns(snap: Snapshot, log_files: LogFiles, **request: Any) -> Snapshot | Lost:
    """Add the columns of ``schema_json`` that the table lacks, in a commit of that alone (with
    the app ``transactions`` given), strictly on ``snap`` through delta-rs; the snapshot of the
    version it made, or the lost race (an unknown outcome raises, as ``append``). How a view in
    upsert or append mode takes added columns on that engine, which cannot commit a schema
    change beside the epoch's removes (``keeps_files_across_schema_change``): right before the
    epoch's commit, which is then made on that snapshot. The version holds the table's rows as
    they were, null in the added columns, which is what those modes leave in rows an epoch does
    not touch. The keywords are ``prepare_add_columns``'s."""
    prepared = prepare_add_columns(snap, log_files, **request)
    outcome = commit(prepared)
    if isinstance(outcome, Unknown):
        raise outcome.error(prepared.where) from outcome.cause
    if isinstance(outcome, Lost):
        return outcome
    table: DeltaTable = snap._table
    table.load_as_version(outcome.version)
    return replace(snap, version=outcome.version, schema_json=table.schema().to_json(), _txns={})


def append_rows(
    table: DeltaTable | str,
    rows: Any,
    *,
    app_id: str,
    version: int,
    storage_options: Mapping[str, str] | None,
    where: Where,
) -> Lost | None:
    """Append ``rows`` (an Arrow table) to ``table`` with the app transaction ``app_id`` at
    ``version``, strictly on the version ``table`` was loaded at (no delta-rs retry), or create
    the table at the path ``table`` (failing if another writer made it meanwhile): None when it
    landed, ``Lost`` to a concurrent commit or creation. Other
    failures raise ``StorageError``. (The metrics table's append: ``ops/metrics.py``.)"""
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    from mvsink.errors import StorageError
    from mvsink.table.delta import delta_errors

    creating = not isinstance(table, DeltaTable)
    with delta_errors(where, "append to the metrics table", refused=StorageError):
        try:
            write_deltalake(
                table,
                rows,
                # Creating the table: "error", so a replica that created it meanwhile is a
                # conflict (read again), not a table to append the same rows to.
                mode="error" if creating else "append",
                storage_options=dict(storage_options or {}) or None,
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id, version)], max_commit_retries=0
                ),
            )
        except CommitFailedError as exc:
            return Lost(f"another append landed first ({exc})", exc)
        except DeltaError as exc:
            if creating and "exists" in str(exc).lower():
                return Lost(f"another writer created the table first ({exc})", exc)
            raise
    return None
