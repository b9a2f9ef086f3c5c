"""The chaos run with replicas as processes: three Spark drivers (``replica.py``) keep two views
of one source on S3 behind the fault proxy, while they are SIGKILLed and restarted from their
checkpoints, fail points fire inside them, a standby is promoted midway, and a compactor, a
vacuum and a rogue writer act on the same tables. Afterwards every table's whole history is
checked, and every epoch the replicas journaled as ``unchanged`` or ``replay`` against the
version it read (``invariants.py``).

* replicas ``a`` and ``b`` are active (no promotion: each commit is conditional on the shared
  clock), ``c`` is a read-only standby, promoted to the ``totals`` view's active writer halfway;
* ``totals`` (complete mode, with an errors table and a metrics table) and ``latest`` (upsert
  mode) both read the source's versions as their clock, so every replica's epochs are
  comparable and desired at a time is a function of the source at that version.

``make soak`` (by hand) runs a short one (``CHAOS_SECONDS``, default 20) with a fixed seed; ``make
chaos`` a long one with a new seed. The seed is printed, and ``CHAOS_SEED`` replays the producer's
rows and the run's choices (what to kill, which chore); the processes' timing, and so what a
fault or a fail point hits, is not replayed: a replay is close, not exact.

The tables' retention is one hour (the vacuum sets it): a run longer than that would see the
vacuum delete files old versions reference, so runs are capped below it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from mvsink import promote, vacuum
from mvsink.ops.compact import compact
from mvsink.ops.vacuum import RETENTION
from mvsink.table.log import history
from mvsink.table.storage import Store
from tests.chaos.invariants import History, check_history, check_metrics, check_verdicts
from tests.helpers import multiset
from tests.s3server import BUCKET, FaultyS3

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.string()), ("v", pa.int64()), ("seq", pa.int64())])
FAULTS = {
    "GET": {"error": 0.008, "reset": 0.004, "lost": 0.004, "delay": 0.001, "delay_s": 11},
    "LIST": {"error": 0.02, "reset": 0.01, "delay": 0.004, "delay_s": 11},
    "PUT": {"error": 0.03, "reset": 0.02, "lost": 0.03},
    "CPUT": {"error": 0.06, "reset": 0.03, "lost": 0.08},
    "DELETE": {"error": 0.1, "lost": 0.1},
}
# Per hit; a replica's epoch passes each driver point about three times (two views and the
# errors table), so one in a few dozen epochs crashes or fails.
FAILPOINTS = (
    "after_snapshot=raise@0.004;after_staging=kill@0.004;before_commit=raise@0.004;"
    "after_commit_call=kill@0.006;after_commit=kill@0.004;write_task=kill@0.004"
)


class Replica:
    """One replica process: started, killed and restarted from its checkpoints."""

    def __init__(self, writer: str, read_only: bool, root: Path, shared: dict[str, Any], seed: int) -> None:
        self.writer, self.root, self.seed = writer, root / writer, seed
        self.root.mkdir(parents=True)
        self.config = {
            **shared,
            "writer": writer,
            "read_only": read_only,
            "checkpoints": str(self.root / "checkpoints"),
            "journal": str(self.root / "journal.jsonl"),
            "ready": str(self.root / "ready"),
        }
        (self.root / "config.json").write_text(json.dumps(self.config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.exits: Counter[int] = Counter()

    def start(self, failpoints: str) -> None:
        self.kill()  # whatever is left of the last run (its JVM) must not share the checkpoint
        self.starts += 1
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "MVSINK_FAILPOINTS": failpoints,
            "MVSINK_FAILPOINTS_ENABLE": "1",  # the opt-in: the variable alone arms nothing
            "MVSINK_FAILPOINTS_SEED": str(self.seed * 100 + self.starts),
        }
        with open(self.root / "out.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.replica", str(self.root / "config.json")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its JVM and Python workers die with it
                cwd=ROOT,
                env=env,
            )

    def running(self) -> bool:
        if self.proc is None:
            return False
        code = self.proc.poll()
        if code is None:
            return True
        self.exits[code] += 1
        self.proc = None
        return False

    def kill(self) -> None:
        """SIGKILL the replica's whole process group (its JVM and Python workers too)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def journal(self) -> list[dict[str, Any]]:
        path = Path(self.config["journal"])
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):  # the line a SIGKILL cut short
                out.append(json.loads(line))
        return out


class Source:
    """The events, a local Delta table a producer appends to; desired per version from it."""

    def __init__(self, path: Path, rng: random.Random) -> None:
        self.path, self.rng, self.seq = str(path), rng, 0
        self.append()

    def append(self, final: bool = False) -> int:
        rows = []
        for _ in range(self.rng.randint(1, 4)):
            self.seq += 1
            rows.append(
                (self.rng.randrange(40), f"g{self.rng.randrange(5)}", self.rng.randint(-30, 30), self.seq)
            )
        if final:  # one row that surely changes the view: +1 to a group that keeps the rule
            kept = sorted(self.totals(DeltaTable(self.path).version(), broken=False))
            self.seq += 1
            rows = [(0, kept[0][0] if kept else "g0", 1 if kept else 10_000, self.seq)]
        columns = list(zip(*rows, strict=True))
        table = pa.table([pa.array(c) for c in columns], schema=SCHEMA)
        write_deltalake(self.path, table, mode="append")
        return DeltaTable(self.path).version()

    @cache  # noqa: B019 (one source per test)
    def rows(self, version: int) -> tuple[tuple[int, str, int, int], ...]:
        table = DeltaTable(self.path, version=version).to_pyarrow_table()
        return tuple((r["id"], r["g"], r["v"], r["seq"]) for r in table.to_pylist())

    def totals(self, version: int, broken: bool) -> Counter[Any]:
        groups: dict[str, list[int]] = {}
        for _, g, v, _ in self.rows(version):
            groups.setdefault(g, []).append(v)
        return Counter((g, len(vs), sum(vs)) for g, vs in groups.items() if (sum(vs) < 0) == broken)

    def latest(self, version: int) -> Counter[Any]:
        last: dict[int, tuple[int, int, int]] = {}
        for i, _, v, seq in self.rows(version):
            if i not in last or seq > last[i][2]:
                last[i] = (i, v, seq)
        return Counter(last.values())


@pytest.mark.spark4("the replicas read mvsink-delta, a Python data source")
def test_replica_processes_killed_and_promoted_keep_every_version_exact(
    tmp_path, s3_options, faults: FaultyS3
):
    seed = int(os.environ.get("CHAOS_SEED", "20261125"))
    seconds = min(float(os.environ.get("CHAOS_SECONDS", "20")), 3000.0)  # within the retention
    rng = random.Random(seed)  # the run's choices; the producer has its own stream
    print(f"\nchaos (processes): seed {seed}, {seconds:.0f} s (CHAOS_SEED={seed} replays it)")
    base = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
    tables = {"totals": f"{base}/totals", "latest": f"{base}/latest", "metrics": f"{base}/metrics"}
    errors = tables["totals"] + "_errors"
    faulty = {**faults.options, "timeout": "10s"}
    source = Source(tmp_path / "source", random.Random(seed + 1))
    shared = {**tables, "source": source.path, "storage_options": faulty, "stop": str(tmp_path / "stop")}
    replicas = {name: Replica(name, name == "c", tmp_path, shared, seed + i) for i, name in enumerate("abc")}
    figures = Counter[str]()
    failures = Counter[str]()
    promoted_at: float | None = None
    faults.set(FAULTS, seed=seed)
    started = time.monotonic()
    try:
        for r in replicas.values():
            r.start(FAILPOINTS)
        if not _wait(lambda: all(Path(r.config["ready"]).exists() for r in replicas.values()), 240):
            raise AssertionError("the replicas did not start")
        started = time.monotonic()
        kill_every = max(seconds / 14, 20.0)
        next_kill, next_chore, last = started + kill_every, started + 10, 0
        while time.monotonic() - started < seconds:
            last = source.append()
            now = time.monotonic()
            for r in replicas.values():
                if not r.running():
                    figures["restarts after a crash or failure"] += 1
                    r.start(FAILPOINTS)
            if now >= next_kill:
                victim = replicas[rng.choice("abc")]
                if victim.running():
                    victim.kill()
                    figures["SIGKILLs"] += 1
                    time.sleep(rng.uniform(0, 2))
                    victim.start(FAILPOINTS)
                next_kill = now + rng.uniform(0.5, 1.5) * kill_every
            promote_due = (
                promoted_at is None
                and now - started > seconds / 2
                and _exist(tables["totals"], options=s3_options)
            )
            if promote_due and _attempt(
                "promote", failures, promote, tables["totals"], "totals", "c", faulty
            ):
                promoted_at = time.time()
                figures["promotions"] += 1
            if now >= next_chore and _exist(tables["totals"], tables["latest"], options=s3_options):
                chore = rng.choice(["compact", "vacuum", "rogue"])
                figures[chore] += _attempt(chore, failures, _chore, chore, tables, faulty, rng)
                next_chore = now + rng.uniform(3, 8)
            time.sleep(0.4)
        # A short run may end before the view's table existed at half time: promote now.
        while promoted_at is None and time.monotonic() - started < seconds + 240:
            if _exist(tables["totals"], options=s3_options) and _attempt(
                "promote", failures, promote, tables["totals"], "totals", "c", faulty
            ):
                promoted_at = time.time()
                figures["promotions"] += 1
            time.sleep(1)
        counts = faults.counts()
        # The end: no faults, every replica restarted clean, one more source version, and the
        # views (and the errors table) must all reach it.
        faults.set({})
        for r in replicas.values():
            r.kill()
            r.start("")
        last = source.append(final=True)

        def reached() -> bool:
            return (
                _held(tables["totals"], s3_options, ["g", "n", "total"]) == source.totals(last, False)
                and _held(errors, s3_options, ["g", "n", "total"]) == source.totals(last, True)
                and _held(tables["latest"], s3_options, ["id", "v", "seq"]) == source.latest(last)
                # The metrics append follows the view's commit: it reaches the view's last.
                and _metrics_reach(tables["metrics"], tables["totals"], s3_options)
            )

        done = _wait(reached, 300)
    finally:
        Path(shared["stop"]).touch()
        for r in replicas.values():
            try:
                if r.proc is not None:
                    r.proc.wait(120)
            except subprocess.TimeoutExpired:
                r.kill()
    elapsed = time.monotonic() - started
    logs = {n: (r.root / "out.log").read_text(errors="replace") for n, r in replicas.items()}
    assert done, f"the views never came to desired at source version {last}: {_tails(logs)}"

    totals = check_history(
        tables["totals"],
        s3_options,
        "totals",
        lambda t: source.totals(t, False),
        ["g", "n", "total"],
        "0.version",
    )
    errs = check_history(
        errors, s3_options, "totals", lambda t: source.totals(t, True), ["g", "n", "total"], "0.version"
    )
    latest = check_history(
        tables["latest"], s3_options, "latest", source.latest, ["id", "v", "seq"], "0.version"
    )
    histories = (totals, errs, latest)
    metrics = check_metrics(tables["metrics"], s3_options, "totals", totals)
    violations = [*totals.violations, *errs.violations, *latest.violations, *metrics]
    violations += _writers(totals, errs, latest, _promotion(tables["totals"], s3_options))

    reports = [e for r in replicas.values() for e in r.journal()]
    verdicts = [
        check_verdicts(
            tables[view],
            s3_options,
            [e for e in reports if e.get("view") == view],
            found,
            want,
            cols,
            "0.version",
        )
        for view, found, want, cols in (
            ("totals", totals, lambda t: source.totals(t, False), ["g", "n", "total"]),
            ("latest", latest, source.latest, ["id", "v", "seq"]),
        )
    ]
    violations += [v for _, wrong in verdicts for v in wrong]
    outcomes = Counter(f"{e.get('view')}:{e.get('outcome') or e.get('error')}" for e in reports)
    # An epoch retries after a lost commit race, or a table made since its snapshot (sink.py):
    # every attempt of an epoch that ended but its last (a failed epoch journals no attempts).
    retries = sum(max(e.get("attempts", 1) - 1, 0) for e in reports if "attempts" in e)
    resolved = sum(text.count("is ours: the epoch committed") for text in logs.values())
    # Epochs that ended with the outcome unknown (each journals it once; a log repeats it).
    unknown = sum(n for k, n in outcomes.items() if k.endswith(":CommitOutcomeUnknownError"))
    injected = {k: {f: n for f, n in v.items() if f != "forward"} for k, v in counts.items()}
    by_fate = Counter[str]()
    for per_kind in injected.values():
        by_fate.update(per_kind)
    exits = sum((r.exits for r in replicas.values()), Counter[int]())
    print(
        f"chaos (processes): {elapsed:.0f} s, source versions 0..{last}\n"
        f"  view commits: totals {len(totals.commits)}, errors table {len(errs.commits)}, "
        f"latest {len(latest.commits)}; versions checked {sum(h.versions for h in histories)}, "
        f"files read {sum(h.files for h in histories)}; unchanged and replay verdicts checked "
        f"{sum(n for n, _ in verdicts)}\n"
        f"  outcomes {dict(sorted(outcomes.items()))}\n"
        f"  attempts retried (lost commit races) {retries}; "
        f"commit outcomes resolved from the log {resolved}; "
        f"epochs ended with the outcome unknown {unknown}\n"
        f"  faults by kind {injected}; by fate {dict(by_fate)}\n"
        f"  {dict(figures)}; process exits by status {dict(exits)}"
    )
    assert not violations, violations[:20]
    assert totals.compared == len(totals.commits) >= 1 and latest.compared == len(latest.commits) >= 1
    # Only what the faults cause may fail; anything else is a defect, whatever the tables hold.
    expected = {"InjectedFault", "StorageError", "ConflictError", "CommitOutcomeUnknownError"}
    expected |= {"RetriesExhaustedError", "SparkJobError", "CommitFailedError", "DeltaError", "OSError"}
    errors_seen = {k for k in outcomes if k.split(":")[1][0].isupper()}
    assert {k.split(":")[1] for k in errors_seen} <= expected, errors_seen
    assert {k.split(": ")[1] for k in failures} <= expected, failures
    assert set(exits) <= {-signal.SIGKILL, 3}, exits  # killed by a fail point, or a failed query
    assert promoted_at is not None and any(i.get("mvsink.writer") == "c" for i in totals.commits.values())


def _attempt(what: str, failures: Counter[str], action: Callable[..., Any], *args: Any) -> int:
    """1 if ``action(*args)`` went through; 0 if it failed, counted by error type (a fault or
    a lost race stops it: the chaos goes on; the test checks what failed)."""
    try:
        action(*args)
        return 1
    except Exception as exc:
        failures[f"{what}: {type(exc).__name__}"] += 1
        return 0


def _chore(chore: str, tables: dict[str, str], options: dict[str, str], rng: random.Random) -> None:
    """A compaction, a vacuum or a rogue append against the live tables."""
    if chore == "compact":
        view = rng.choice(["totals", "latest"])
        compact(tables[view], view, options, max_rows_per_file=40, small_rows=8)
    elif chore == "vacuum":
        # The shortest retention the docs allow with writers running (operations.md): the
        # property is set once, a metadata commit racing the replicas.
        target = tables[rng.choice(["totals", "latest"])]
        table = DeltaTable(target, storage_options=options)
        if table.metadata().configuration.get(RETENTION) != "interval 1 hours":
            # And a checkpoint every 10 versions: snapshots read fewer commits, and the sink's
            # checkpoints run under the faults too.
            table.alter.set_table_properties(
                {RETENTION: "interval 1 hours", "delta.checkpointInterval": "10"}
            )
        vacuum(target, options, apply=True)
    else:  # the next view commit must repair it
        rogue = pa.table({"g": ["rogue"], "n": [1], "total": [rng.randint(0, 9)]})
        write_deltalake(tables["totals"], rogue, mode="append", storage_options=options)


def _exist(*targets: str, options: dict[str, str]) -> bool:
    """The chores start once the replicas made the tables."""
    try:
        for target in targets:
            DeltaTable(target, storage_options=options)
        return True
    except TableNotFoundError:
        return False


def _wait(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(1)
    return False


def _held(target: str, options: dict[str, str], columns: list[str]) -> Counter[Any] | None:
    """The rows the table holds now, or None before it exists."""
    try:
        return multiset(DeltaTable(target, storage_options=options).to_pyarrow_table(), columns)
    except TableNotFoundError:
        return None


def _metrics_reach(metrics: str, totals: str, options: dict[str, str]) -> bool:
    """The metrics table holds the view's newest commit."""
    try:
        held = DeltaTable(metrics, storage_options=options).to_pyarrow_table()["version"].to_pylist()
        view = DeltaTable(totals, storage_options=options)
    except TableNotFoundError:
        return False
    commits = history(Store(totals, options), view.version(), view.version() + 1)  # not view.history()
    newest = next(c["version"] for c in commits if c.get("mvsink.upper"))
    return newest in held


def _writers(totals: History, errs: History, latest: History, promotion: dict[str, Any] | None) -> list[str]:
    """Who wrote what: the standby ``c`` writes nothing before its promotion (the ``totals``
    version ``promotion``), neither the view nor its errors table, and only it writes the view
    after; ``latest`` (never promoted) is ``a``'s and ``b``'s alone."""
    if promotion is None:
        return ["c was never promoted"]
    wrong = []
    for version, info in totals.commits.items():
        if (info.get("mvsink.writer") == "c") != (version > promotion["version"]):
            writer = info.get("mvsink.writer")
            wrong.append(f"totals v{version}: {writer} wrote it; c was promoted in v{promotion['version']}")
    for version, info in errs.commits.items():
        if info.get("mvsink.writer") == "c" and int(info.get("timestamp") or 0) < promotion["timestamp"]:
            wrong.append(f"errors table v{version}: the standby c wrote before its promotion")
    wrong += [
        f"latest v{v}: the standby c wrote"
        for v, i in latest.commits.items()
        if i.get("mvsink.writer") == "c"
    ]
    return wrong


def _promotion(target: str, options: dict[str, str]) -> dict[str, Any] | None:
    """The (first) commit that promoted ``c``."""
    found = [
        c
        for c in history(Store(target, options), DeltaTable(target, storage_options=options).version(), 10**6)
        if c.get("mvsink.promoted") == "c"
    ]
    return min(found, key=lambda c: c["version"]) if found else None


def _tails(logs: dict[str, str]) -> str:
    return "\n".join(f"--- {name}\n{text[-4000:]}" for name, text in logs.items())
