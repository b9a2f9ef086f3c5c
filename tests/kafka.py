"""A Kafka broker in a subprocess, and what the Kafka tests and benchmark do with it.

Apache Kafka 4.4 in KRaft mode: one JVM that is broker and controller, on 127.0.0.1 ports of
its own, its log in a temporary folder formatted first (``kafka.tools.StorageTool``). Its jars
come from Maven Central (``jvm/kafka-broker/pom.xml``); Spark's Kafka source comes from
``jvm/kafka-4`` or ``jvm/kafka-3.5`` (``MVSINK_KAFKA_JARS``). ``scripts/jvm_jars.sh`` fetches both.
Records are produced with ``confluent-kafka`` (librdkafka), as a service would produce them.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tests.s3server import free_port, serving

KAFKA_JARS = sorted(glob.glob(os.path.join(os.environ.get("MVSINK_KAFKA_JARS", ""), "*.jar")))
"""Spark's Kafka source and its dependencies, put on the test sessions' classpath."""

_ROOT = Path(__file__).resolve().parent.parent
BROKER_JARS = os.environ.get("MVSINK_KAFKA_BROKER_JARS") or str(_ROOT / ".jvm" / "kafka-broker")


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else (shutil.which("java") or "java")


@contextlib.contextmanager
def kafka_broker(jars: str, folder: Path) -> Iterator[str]:
    """Format a KRaft log under ``folder``, start the broker from ``jars`` (a folder holding
    its classpath), yield its bootstrap address, and stop it."""
    port, controller = free_port(), free_port()
    config = folder / "server.properties"
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(folder / "data"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "2",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
    }
    config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    # A JVM of modest size (Kafka's own start script gives it 1 GiB).
    java = [_java(), "-Xms128m", "-Xmx512m", "-cp", f"{jars}/*"]
    log = folder / "broker.log"
    cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    with open(log, "wb") as out:
        subprocess.run(
            # (one argument: a cluster id may start with "-", which a separate one reads as a flag)
            [*java, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=120,
        )
    with serving([*java, "kafka.Kafka", str(config)], port, "Kafka broker", log):
        yield f"127.0.0.1:{port}"


class Kafka:
    """A running broker, as the tests use it: topics, records, partitions."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient

        self.bootstrap = bootstrap
        # Errors reach the tests through the calls' results; librdkafka's own log stays quiet.
        quiet = {"bootstrap.servers": bootstrap, "log_level": 0}
        self.admin = AdminClient(quiet)
        self.producer = Producer({**quiet, "linger.ms": 5})

    def topic(self, partitions: int = 3) -> str:
        """A new topic with ``partitions`` partitions."""
        from confluent_kafka.admin import NewTopic

        name = f"t{uuid.uuid4().hex[:10]}"
        for done in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            done.result(60)
        return name

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        for done in self.admin.create_partitions([NewPartitions(topic, total)]).values():
            done.result(60)

    def produce(self, topic: str, records: Iterable[Mapping[str, Any]], key: str | None = None) -> int:
        """Each record as a JSON value (keyed by its ``key`` field when given: one key, one
        partition); returns how many, all acknowledged."""
        count = 0
        for record in records:
            k = None if key is None else str(record[key])
            self.producer.produce(topic, value=json.dumps(record), key=k)
            count += 1
            if count % 10_000 == 0:
                self.producer.poll(0)
        left = self.producer.flush(60)
        assert left == 0, f"{left} record(s) not acknowledged by the broker"
        return count

    def options(self, topic: str) -> dict[str, str]:
        """Spark's Kafka source options for ``topic``."""
        return {"kafka.bootstrap.servers": self.bootstrap, "subscribe": topic}


def kafka_broker_for_tests(folder: Path) -> Iterator[Kafka]:
    """The session's broker (``conftest.kafka``), or a skip saying what is missing."""
    import pytest

    if not KAFKA_JARS:
        pytest.skip(
            "no Spark Kafka source in the test session: set MVSINK_KAFKA_JARS to a folder of "
            "spark-sql-kafka-0-10 and its dependencies (`make test` fetches them from Maven "
            "Central: jvm/kafka-4/pom.xml, jvm/kafka-3.5/pom.xml)"
        )
    if not glob.glob(os.path.join(BROKER_JARS, "kafka_2.13-*.jar")):
        pytest.skip(
            f"no Kafka broker jars in {BROKER_JARS}: `make test` fetches them from Maven Central "
            "(jvm/kafka-broker/pom.xml); MVSINK_KAFKA_BROKER_JARS names another folder"
        )
    with kafka_broker(BROKER_JARS, folder) as bootstrap:
        yield Kafka(bootstrap)
