"""The SparkSession mvsink's jobs, commands, demo and tests run on.

Precedence of a setting when the session starts here, strongest first:

1. ``explicit`` (a command's ``--conf``);
2. what the launcher set before mvsink runs: ``spark-submit``'s ``--master`` and ``--conf``,
   ``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS`` (the JVM's configuration when the
   session starts);
3. ``conf`` (a job file's ``[spark]``) and the ``master`` argument;
4. ``DEFAULTS``.

Under ``spark-submit`` the master is spark-submit's. In a plain Python process the job file's
master applies (unless ``spark-defaults.conf`` or ``PYSPARK_SUBMIT_ARGS`` sets one). A session
already running (a notebook's) is taken as it is: only ``explicit`` settings change it.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shlex
import sys
from collections.abc import Mapping

from pyspark import SparkConf, SparkContext
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # On local disk, skip the .crc side files Hadoop's checksummed file system writes.
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}


def under_spark_submit() -> bool:
    """This Python driver was started by ``spark-submit`` (which hands it its JVM's gateway)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT")) and SparkContext._active_spark_context is None


def launcher_settings() -> dict[str, str]:
    """The settings the launcher gives the session.

    Under spark-submit its JVM is running and holds them (``--master``, ``--conf``,
    ``spark-defaults.conf``). Otherwise the JVM is not started yet (it must start with the
    session's settings: driver memory and class path are fixed at launch): the settings are
    ``spark-defaults.conf``'s, read here as spark-submit reads it."""
    if under_spark_submit():
        SparkContext._ensure_initialized()
        return dict(SparkConf().getAll())
    home = os.environ.get("SPARK_HOME") or _find_spark_home()
    folder = os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
    return {**_properties(os.path.join(folder, "spark-defaults.conf")), **_submit_args()}


def _submit_args() -> dict[str, str]:
    """The ``--master`` and ``--conf`` of ``PYSPARK_SUBMIT_ARGS`` (which PySpark hands its
    launcher after the session's own settings, so they win)."""
    words = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    settings = {}
    for flag, value in itertools.pairwise(words):
        if flag == "--master":
            settings["spark.master"] = value
        elif flag == "--conf" and "=" in value:
            key, _, setting = value.partition("=")
            settings[key] = setting
    return settings


def _properties(path: str) -> dict[str, str]:
    """``spark.*`` settings of a Java properties file (``key value``, ``key=value``)."""
    if not os.path.isfile(path):
        return {}
    settings = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line or line[0] in "#!":
                continue
            match = re.match(r"([^\s=:]+)\s*[=:\s]\s*(.*)", line)
            if match and match[1].startswith("spark."):
                settings[match[1]] = match[2].strip()
    return settings


def local_session(
    app_name: str = "mvsink",
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    explicit: Mapping[str, str] | None = None,
    own_process_group: bool = False,
) -> SparkSession:
    """Get or create a SparkSession: ``explicit``, then the launcher's settings, then ``conf``
    and ``master``, then ``DEFAULTS`` (the module's docstring).

    ``own_process_group``: a JVM started here runs in a process group of its own, with Spark's
    Python workers, so a terminal's Ctrl-C reaches this process alone (``mvsink run`` stops
    a job between epochs; PySpark's workers would take it as a ``KeyboardInterrupt`` each)."""
    # Python workers must run this interpreter, which has pyarrow (not whatever is on PATH).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if SparkContext._active_spark_context is not None:
        # A running session (a notebook's, the tests'): its settings are its owner's; only the
        # command line's change it.
        settings = dict(explicit or {})
        ignored = sorted(set(conf or {}) - set(settings) - {"spark.master"})
        if ignored:
            log.warning("a Spark session is running: kept as it is, without %s", ", ".join(ignored))
    else:
        settings = {**DEFAULTS, **(conf or {})}
        settings.setdefault("spark.master", master)
        settings.update(launcher_settings())
        settings.update(explicit or {})
        if str(settings["spark.master"]).startswith("local"):
            # A local job needs no routable address; this also silences Spark's loopback warning.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    app = settings.pop("spark.app.name", app_name)
    if own_process_group and SparkContext._gateway is None and not under_spark_submit():
        _launch_apart({**settings, "spark.app.name": app})
    builder = SparkSession.builder.appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _launch_apart(settings: Mapping[str, str]) -> None:
    """Start the session's JVM as PySpark would (``spark-submit`` with the session's settings),
    in a new session of its own: out of the terminal's process group."""
    from pyspark.java_gateway import launch_gateway

    launch_conf = SparkConf(loadDefaults=False)
    for key, value in settings.items():
        launch_conf.set(key, value)
    gateway = launch_gateway(launch_conf, popen_kwargs={"start_new_session": True})  # type: ignore[no-untyped-call]
    SparkContext._ensure_initialized(gateway=gateway)
