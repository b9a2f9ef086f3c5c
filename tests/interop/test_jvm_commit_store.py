"""The log store the session's Delta commits through (``jvm_delta.JvmDelta.check_store``).

The engine asks Delta itself which log store it uses for the exact path it hands Delta
(``s3a://`` for an ``s3://`` target; chosen from the JVM's startup conf, not the session's
runtime conf) and refuses a store two writers can both "win" a version through. On local disk,
where Delta's store checks that a version is free and then renames (which replaces), mvsink's
commits to one table take turns across processes, and every JVM commit is read back from the
log: a commit another writer replaced is reported lost, never committed.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from mvsink import MVSink, UnsupportedTableError, failpoints
from mvsink.errors import EngineUnavailable
from mvsink.table.jvm_delta import JvmDelta
from tests.delta_session import delta_conf
from tests.helpers import commit_info, store, versions, view

STORES = "io.delta.storage."
DYNAMODB = STORES + "S3DynamoDBLogStore"


@contextlib.contextmanager
def startup_conf(spark: SparkSession, values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in the JVM's startup conf (``SparkEnv``'s, where Delta looks for its log
    stores), as ``--conf`` at launch would put them; restored afterwards."""
    conf = spark._jvm.org.apache.spark.SparkEnv.get().conf()  # type: ignore[union-attr]
    saved = {key: conf.getOption(key) for key in values}
    for key, value in values.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old.isDefined():
                conf.set(key, old.get())
            else:
                conf.remove(key)


@pytest.mark.parametrize(
    ("root", "conf", "verdict"),
    [
        ("/lake/view", {}, "local"),
        ("hdfs://nn/lake/view", {}, "store"),
        ("gs://lake/view", {}, "store"),
        ("abfss://c@a.dfs.core.windows.net/view", {}, "store"),
        ("s3://lake/view", {}, "S3SingleDriverLogStore"),
        # Delta is handed s3a://: a store set for s3 does not apply.
        ("s3://lake/view", {"spark.delta.logStore.s3.impl": DYNAMODB}, "S3SingleDriverLogStore"),
        # For s3a it does: Delta makes that store (its jar is not in these sessions).
        ("s3://lake/view", {"spark.delta.logStore.s3a.impl": DYNAMODB}, "S3DynamoDBLogStore"),
        ("gs://lake/view", {"spark.delta.logStore.gs.impl": STORES + "LocalLogStore"}, "LocalLogStore"),
        ("/lake/view", {"spark.delta.logStore.file.impl": STORES + "GCSLogStore"}, "GCSLogStore"),
    ],
    ids=["local", "hdfs", "gcs", "azure", "s3", "s3-key", "s3a-key", "gcs-local-store", "local-gcs-store"],
)
def test_the_store_is_the_one_delta_resolves_for_the_path_it_is_handed(spark, root, conf, verdict):
    with startup_conf(spark, conf):
        if verdict in ("local", "store"):
            assert JvmDelta(spark).check_store(root) == verdict
        else:
            with pytest.raises(EngineUnavailable, match=verdict) as info:
                JvmDelta(spark).check_store(root)
            print(info.value)
            # These sessions have no hadoop-aws: an S3 refusal names it too, with the version.
            hadoop = spark._jvm.org.apache.hadoop.util.VersionInfo.getVersion()  # type: ignore[union-attr]
            s3 = root.startswith("s3")
            assert (f"org.apache.hadoop:hadoop-aws:{hadoop}" in str(info.value)) == s3


@pytest.mark.parametrize("scheme", ["s3", "s3a"])
def test_a_store_set_with_spark_conf_set_is_refused_as_the_one_delta_ignores(spark, scheme):
    """``spark.conf.set`` does not reach the conf Delta picks its log store from (and a store
    for ``s3`` would not apply to the ``s3a://`` path Delta is handed anyway): the S3 table is
    refused as with no store set, before anything is staged."""
    import uuid

    from tests.s3server import BUCKET

    target = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/view"
    key = f"spark.delta.logStore.{scheme}.impl"
    spark.conf.set(key, DYNAMODB)
    try:
        with pytest.raises(UnsupportedTableError, match="S3SingleDriverLogStore") as info:
            MVSink(target, "v", engine="delta-spark")(view(spark, range(0, 8)), 0)
    finally:
        spark.conf.unset(key)
    assert "spark.conf.set" in str(info.value) and "nothing was staged" in str(info.value)
    assert "hadoop-aws" in str(info.value)  # these sessions have none: said in the same error
    assert store(target).files("") == []  # nothing written


SLOW_COMMIT_FS = """
package mvsinktest;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/** Local disk on which renaming a Delta commit file into place happens a while after the
 *  rename checked that the target is free (as on a busy NFS server). */
public class SlowCommitFs extends DelegateToFileSystem {
    private final long delayMs;

    public SlowCommitFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
        super(uri, new RawLocalFileSystem(), conf, "file", false);
        delayMs = conf.getLong("mvsinktest.commitDelayMs", 0);
    }

    @Override
    public boolean isValidName(String src) {
        return true;
    }

    /** What rename(src, dst, NONE) comes down to on local disk: check that dst is free, then
     *  rename (which replaces); for a commit file, with a pause in between. */
    @Override
    public void renameInternal(Path src, Path dst) throws IOException {
        if (!dst.getParent().getName().equals("_delta_log") || !dst.getName().endsWith(".json")) {
            super.renameInternal(src, dst);
            return;
        }
        if (fsImpl.exists(dst)) {
            throw new FileAlreadyExistsException("rename destination " + dst + " already exists");
        }
        try {
            Thread.sleep(delayMs);
        } catch (InterruptedException e) {
            throw new IOException(e);
        }
        if (!fsImpl.rename(src, dst)) {
            throw new IOException("could not rename " + src + " to " + dst);
        }
    }
}
"""


@pytest.fixture(scope="module")
def slow_commit_fs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Session conf that puts local disk behind ``SlowCommitFs`` (compiled here: needs a JDK)."""
    import shutil

    import pyspark

    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac: the slow local file system of this test is compiled from source")
    folder = tmp_path_factory.mktemp("slowfs")
    source = folder / "SlowCommitFs.java"
    source.write_text(SLOW_COMMIT_FS)
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    subprocess.run(
        [javac, "-nowarn", "-cp", jars, "-d", str(folder / "classes"), str(source)],
        check=True,
        capture_output=True,
    )
    return {
        "spark.driver.extraClassPath": str(folder / "classes"),
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "mvsinktest.SlowCommitFs",
        "spark.hadoop.mvsinktest.commitDelayMs": "1500",
    }


RACER = r"""
import contextlib, json, os, sys, time
sys.path.insert(0, os.getcwd())
import mvsink.table.jvm_delta
from mvsink.cli.session import local_session
from mvsink.errors import CommitOutcomeUnknownError, ConflictError, Where
from mvsink.table.commit import compare_and_append
from mvsink.table.delta import NewFile, load_snapshot
from mvsink.table.storage import Store

tables, sync, me, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
skip_turn = {int(r) for r in sys.argv[5].split(",") if r}
spark = local_session(f"racer-{me}", conf={"spark.driver.memory": "1g", **json.loads(sys.argv[6])})
take_turn = getattr(mvsink.table.jvm_delta, "commit_turn", None)


def barrier(name):
    open(os.path.join(sync, f"{name}.{me}"), "w").close()
    while sum(f.startswith(name + ".") for f in os.listdir(sync)) < 2:
        time.sleep(0.0002)


out = []
for r in range(rounds):
    target = os.path.join(tables, f"t{r}")
    where = Where("race", target, r)
    # In these rounds this process commits as a writer that does not take mvsink's turn would.
    if r in skip_turn:
        mvsink.table.jvm_delta.commit_turn = lambda root: contextlib.nullcontext()
    elif take_turn is not None:
        mvsink.table.jvm_delta.commit_turn = take_turn
    snap = load_snapshot(target, "mvsink:race", {}, where, engine="delta-spark", spark=spark)
    prepare = snap._jvm.prepare

    def synced(*args, _prepare=prepare, _r=r):
        commit = _prepare(*args)

        def call():
            barrier(f"go{_r}")  # both transactions are ready: commit at once
            return commit()

        return call

    snap._jvm.prepare = synced
    adds = [NewFile(f"{me}-{r}-{i}.parquet", 1000, 10, '{"numRecords":10}') for i in range(10)]
    try:
        version = compare_and_append(
            snap, Store(snap.root), adds=adds, removes=[], app_id="mvsink:race", upper=1,
            attempt_id=f"{me}-{r}", metadata={}, schema_json=snap.schema_json, partition_by=[],
            where=where,
        )
        out.append(["committed", version])
    except ConflictError as exc:
        out.append(["conflict", str(exc)])
    except CommitOutcomeUnknownError as exc:
        out.append(["unknown", str(exc)[:300]])
print(json.dumps(out))
"""


@pytest.mark.soak  # two Spark processes racing three rounds: about a minute
def test_two_processes_on_the_jvm_engine_racing_on_local_disk_never_both_win_a_version(
    tmp_path, slow_commit_fs
):
    """Two processes, each with its own Spark session and JVM Delta, commit to one local table
    at the same moment, on a disk slow enough that both are inside Delta's check-then-rename
    at once (``SlowCommitFs``): never do both report the same version committed; the one that
    does holds that version in the log, the other reports a conflict. mvsink's commits take
    turns (first rounds); a writer that does not take the turn replaces a commit, and the
    commit read back from the log is reported lost, not committed (last round)."""
    rounds, skip_turn = 3, "2"
    tables, sync = tmp_path / "tables", tmp_path / "sync"
    sync.mkdir()
    for r in range(rounds):
        write_deltalake(str(tables / f"t{r}"), pa.table({"id": pa.array([1], pa.int64())}))
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    conf = json.dumps({**delta_conf(tmp_path / "warehouse"), **slow_commit_fs})
    procs = {
        me: subprocess.Popen(
            [sys.executable, str(script), str(tables), str(sync), me, str(rounds), skip, conf],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
            cwd=os.getcwd(),
        )
        for me, skip in (("a", ""), ("b", skip_turn))
    }
    results = {}
    for me, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results[me] = json.loads(out.strip().splitlines()[-1])
    print("race outcomes:", results)
    for r in range(rounds):
        target = str(tables / f"t{r}")
        won = [me for me in results if results[me][r][0] == "committed"]
        assert len(won) <= 1, f"round {r}: both processes report version {results['a'][r][1]} committed"
        assert versions(target) == [0, 1]
        holder = commit_info(target, 1)["mvsink.attempt"]
        # The one that reports the version committed is the one the log shows; the other lost.
        assert won == [holder.split("-")[0]], (r, results["a"][r], results["b"][r], holder)
        lost = next(me for me in results if me not in won)
        assert results[lost][r][0] == "conflict", results[lost][r]
        if str(r) in skip_turn.split(","):
            # Both renamed into place; the one replaced read its version back and lost.
            assert "reported version 1 committed, and its log file holds another" in results[lost][r][1]


FOREIGN_JOB = r"""
import json, os, sys
sys.path.insert(0, os.getcwd())
from mvsink.cli.session import local_session

target, conf = sys.argv[1], json.loads(sys.argv[2])
spark = local_session("foreign-job", conf={"spark.driver.memory": "1g", **conf})
if sys.argv[3:] == ["check-store"]:  # what the sink's JVM engine would say in this session
    from mvsink.errors import EngineUnavailable
    from mvsink.table.jvm_delta import JvmDelta
    try:
        print(json.dumps(JvmDelta(spark).check_store(target)))
    except EngineUnavailable as exc:
        print(json.dumps(str(exc)))
spark.sql(f"DELETE FROM delta.`{target}` WHERE id = 0").collect()
last = spark.sql(f"DESCRIBE HISTORY delta.`{target}` LIMIT 1").collect()[0]
print(json.dumps([last["version"], last["operation"]]))
"""


def sink_commits_inside_a_replacing_job(
    spark: SparkSession,
    sink: MVSink,
    tmp_path: Path,
    args: list[str],
    conf: Mapping[str, str],
    reached: Callable[[], bool],
    settle: float = 0.0,
) -> list[str]:
    """Start ``FOREIGN_JOB`` (a Delta DELETE, with ``args`` after the table's path its
    arguments: the path first) in a Spark process of its own with ``conf``, and commit the
    sink's epoch 1 once ``reached()`` says the job is inside its commit (and ``settle``
    seconds more). Both report version 1 committed; the job's output lines."""
    script = tmp_path / "job.py"
    script.write_text(FOREIGN_JOB)
    settings = json.dumps({**delta_conf(tmp_path / "warehouse"), **conf})
    job = subprocess.Popen(
        [sys.executable, str(script), args[0], settings, *args[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        cwd=os.getcwd(),
    )

    def inside_the_jobs_commit(snap: object) -> None:
        deadline = time.monotonic() + 240
        while not reached():
            assert job.poll() is None, job.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the job never reached its commit"
            time.sleep(0.005)
        time.sleep(settle)

    with failpoints.armed({"before_commit": inside_the_jobs_commit}):
        report = sink(view(spark, range(0, 12)), 1)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, "\n".join(line for line in err.splitlines() if "Exception" in line)[-3000:]
    assert report.outcome == "committed" and report.version == 1
    return out.strip().splitlines()


def the_next_epoch_reports_the_replacement_and_the_one_after_repairs(
    spark: SparkSession, sink: MVSink, target: str
) -> str:
    """The sink's epoch 2 raises ``CommitReplacedError`` with nothing staged; run again, it
    repairs the view (complete mode). The error's message."""
    from mvsink import CommitReplacedError
    from tests.helpers import assert_equal_to

    files = sorted(store(target).files(""))
    with pytest.raises(CommitReplacedError, match="version 1, which epoch 1 of this sink") as info:
        sink(view(spark, range(0, 12)), 2)
    print(info.value)
    assert versions(target) == [0, 1] and sorted(store(target).files("")) == files  # nothing staged
    assert sink(view(spark, range(0, 12)), 2).version == 2  # told once; then complete mode repairs
    assert_equal_to(target, view(spark, range(0, 12)))
    return str(info.value)


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_a_spark_job_that_replaces_a_commit_of_the_sink_is_reported_by_its_next_epoch(
    spark, tmp_path, slow_commit_fs, engine
):
    """An unsafe writer pair, for real: a Spark job's Delta write on local disk checks that its
    version is free, then renames into place, which replaces (``SlowCommitFs`` holds it between
    the two, as a busy disk can). The sink commits that version in between and reports it; the
    job's rename replaces it and the job reports its DELETE committed too: both "won". The
    sink's next epoch finds its commit gone and raises ``CommitReplacedError`` before staging
    anything, naming the version and the epoch; the epoch after it repairs the view."""
    if engine == "delta-rs" and not s3a_jars()[1]:
        pytest.skip("on this line the S3 race (below) runs the delta-rs sink against the Spark job")
    target = str(tmp_path / "view")
    sink = MVSink(target, "v", engine=engine)
    sink(view(spark, range(0, 10)), 0)
    log_dir = os.path.join(target, "_delta_log")

    def reached() -> bool:
        """The job holds its commit in a temporary file and has checked that version 1 is free
        (right after writing it), to rename it into place after SlowCommitFs's pause."""
        return any(n.endswith(".tmp") and ".json." in n for n in os.listdir(log_dir))

    # The job renames its commit file into place 6 s after it checked that version 1 is free.
    slow = {**slow_commit_fs, "spark.hadoop.mvsinktest.commitDelayMs": "6000"}
    out = sink_commits_inside_a_replacing_job(spark, sink, tmp_path, [target], slow, reached, settle=0.5)
    assert json.loads(out[-1]) == [1, "DELETE"]  # the job "won" version 1 too
    assert commit_info(target, 1)["operation"] == "DELETE"  # its file replaced the sink's
    message = the_next_epoch_reports_the_replacement_and_the_one_after_repairs(spark, sink, target)
    assert "DELETE" in message and "epoch 2" in message


SLOW_S3A_FS = """
package mvsinktest;

import java.io.File;
import java.io.FilterOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.fs.s3a.S3AFileSystem;
import org.apache.hadoop.util.Progressable;

/** S3A on which a Delta commit file reaches S3 (its PUT, at close) a while after Delta checked
 *  that the version is free and S3A opened the file, as a slow network or a GC pause can. On
 *  entering the pause it creates a local file, so a test knows the job is inside its commit. */
public class SlowS3AFileSystem extends S3AFileSystem {
    @Override
    public FSDataOutputStream create(Path f, FsPermission permission, boolean overwrite,
            int bufferSize, short replication, long blockSize, Progressable progress)
            throws IOException {
        FSDataOutputStream out =
            super.create(f, permission, overwrite, bufferSize, replication, blockSize, progress);
        if (!f.getParent().getName().equals("_delta_log") || !f.getName().endsWith(".json")) {
            return out;
        }
        long delayMs = getConf().getLong("mvsinktest.commitDelayMs", 0);
        File marker = new File(getConf().get("mvsinktest.markerDir"), f.getName());
        OutputStream slow = new FilterOutputStream(out) {
            @Override
            public void write(byte[] b, int off, int len) throws IOException {
                out.write(b, off, len);
            }

            @Override
            public void close() throws IOException {
                marker.createNewFile();
                try {
                    Thread.sleep(delayMs);
                } catch (InterruptedException e) {
                    throw new IOException(e);
                }
                out.close();
            }
        };
        return new FSDataOutputStream(slow, null);
    }
}
"""


def s3a_jars() -> tuple[list[str], str]:
    """The jars of Hadoop's S3A that ``MVSINK_S3A_JARS`` names, if they are for the Hadoop in
    this line's PySpark (hadoop-aws must match it), else why not."""
    import pyspark

    s3a = sorted(glob.glob(os.path.join(os.environ.get("MVSINK_S3A_JARS", ""), "*.jar")))
    aws = [os.path.basename(j)[len("hadoop-aws-") : -len(".jar")] for j in s3a if "hadoop-aws-" in j]
    wheel = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar"))
    hadoop = os.path.basename(wheel[0])[len("hadoop-client-api-") : -len(".jar")] if wheel else "?"
    if not aws:
        return [], "no hadoop-aws: set MVSINK_S3A_JARS to a folder of the jars jvm/s3a-3.5 lists"
    if aws != [hadoop]:
        return [], f"MVSINK_S3A_JARS holds hadoop-aws {aws[0]}, and this PySpark's Hadoop is {hadoop}"
    return s3a, ""


@pytest.fixture(scope="module")
def slow_s3a(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Session conf for a Spark job on the suite's S3 server through Hadoop's S3A
    (``hadoop-aws`` and its AWS SDK, ``jvm/s3a-3.5``), with ``SlowS3AFileSystem`` (compiled
    here: needs a JDK) for ``s3a://`` and Delta's default store there, S3SingleDriverLogStore."""
    import shutil

    import pyspark

    s3a, why = s3a_jars()
    if why:
        pytest.skip(why)
    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("no javac: the slow S3A file system of this test is compiled from source")
    folder = tmp_path_factory.mktemp("slows3a")
    source = folder / "SlowS3AFileSystem.java"
    source.write_text(SLOW_S3A_FS)
    spark_jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    classpath = os.pathsep.join([spark_jars, *s3a])
    subprocess.run(
        [javac, "-nowarn", "-cp", classpath, "-d", str(folder / "classes"), str(source)],
        check=True,
        capture_output=True,
    )
    markers = folder / "markers"
    markers.mkdir()
    endpoint = os.environ["AWS_ENDPOINT_URL"]  # the suite's S3 server (the spark fixture's)
    return {
        # The system class path: S3AFileSystem and its subclass are loaded by one loader.
        "spark.driver.extraClassPath": os.pathsep.join([*s3a, str(folder / "classes")]),
        "spark.hadoop.fs.s3a.impl": "mvsinktest.SlowS3AFileSystem",
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": os.environ.get("AWS_REGION", "us-east-1"),
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        # Buffer uploads in memory: the session's local file system is the raw one (no
        # checksum files), which S3A's disk buffer cannot use.
        "spark.hadoop.fs.s3a.fast.upload.buffer": "bytebuffer",
        "spark.hadoop.fs.s3a.access.key": os.environ["AWS_ACCESS_KEY_ID"],
        "spark.hadoop.fs.s3a.secret.key": os.environ["AWS_SECRET_ACCESS_KEY"],
        "spark.hadoop.mvsinktest.markerDir": str(markers),
        "spark.hadoop.mvsinktest.commitDelayMs": "6000",
    }


def test_a_spark_job_on_s3_replaces_a_commit_of_the_sink_on_delta_rs_and_the_next_epoch_reports_it(
    spark, tmp_path, slow_s3a
):
    """The unsafe pair of ``docs/design.md`` on S3, for real: a Spark job's Delta DELETE
    through S3A and Delta's default S3 store (S3SingleDriverLogStore: it checks that the
    version is free, and S3A then PUTs the commit without a condition), beside mvsink on
    delta-rs (a PUT with ``If-None-Match``). The job's PUT reaches S3 after the sink's
    (``SlowS3AFileSystem``), replaces it, and both report version 1 committed. The sink's next
    epoch raises ``CommitReplacedError`` before staging anything; the epoch after repairs."""
    from tests.s3server import BUCKET

    target = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}/view"
    sink = MVSink(target, "v")
    sink(view(spark, range(0, 10)), 0)
    markers = slow_s3a["spark.hadoop.mvsinktest.markerDir"]

    def reached() -> bool:
        """The job has checked that version 1 is free and is about to PUT it."""
        return os.path.exists(os.path.join(markers, f"{1:020}.json"))

    job_args = ["s3a://" + target.removeprefix("s3://"), "check-store"]
    out = sink_commits_inside_a_replacing_job(spark, sink, tmp_path, job_args, slow_s3a, reached)
    refusal, outcome = (json.loads(line) for line in out[-2:])
    assert outcome == [1, "DELETE"]  # the job "won" version 1 too
    assert commit_info(target, 1)["operation"] == "DELETE"  # its PUT replaced the sink's
    # The sink's JVM engine in the job's session (hadoop-aws present) refuses its store alone.
    assert "S3SingleDriverLogStore" in refusal and "hadoop-aws" not in refusal, refusal
    the_next_epoch_reports_the_replacement_and_the_one_after_repairs(spark, sink, target)
