"""The deletion-vector codec (issue 54.8): the hand-written numpy codec vs pyroaring.

Until commit 341c8f1 ``mvsink.table.deletion_vectors`` wrote and read the portable 64-bit
Roaring format by hand with numpy; it now calls pyroaring (CRoaring). This times both on the
same vectors, encode (row positions -> bytes) and decode (bytes -> sorted positions), best of
``--runs`` (fewer when one run passes ``--budget`` seconds), and the peak resident memory each
adds (in a forked child whose high-water mark is reset first), for:

* ``hand``: the codec at 341c8f1, read from git;
* ``hand+sort``: the same with its first ``np.unique`` (hash-based in numpy 2.4: 40 times slower
  than a sort on 10M values here) replaced by a sort: what the hand codec could be;
* ``pyroaring``: the module as it is now.

The vectors: 1k, 100k and 10M deleted rows of files of 1M to 100M rows, sparse (random), dense
(half the rows), a deleted block (runs), and the vectors the JVM Delta wrote (``--delta-tables``:
a folder of Delta tables, each with one deletion vector; ``--make-delta-tables`` makes them with
delta-spark, run with the Python that has it)::

    MVSINK_DELTA_JARS=$(scripts/jvm_jars.sh delta-4.4 ../shared/delta-jvm/jars) \\
        .venv-delta/bin/python bench/dv_codec.py --make-delta-tables /tmp/dv-tables
    .venv/bin/python bench/dv_codec.py --delta-tables /tmp/dv-tables --placement driver task

Both placements run the same code: ``driver`` in this process, ``task`` inside a Spark Python
worker (local[1]), where the codec runs when Spark tasks write vectors. Each placement also
times a fresh interpreter's ``import pyroaring`` (once per Python worker: Spark reuses them).

Measured on 2 shared cores (Python 3.11, numpy 2.4.6, pyroaring 1.2.0), driver, best of 5,
encode / decode in ms:

    vector                 hand           hand+sort    pyroaring    bytes (pyroaring)
    10M of 100M, sparse    15406 / 388    383 / 365    304 / 76     12.5 MB (same)
    10M of 20M, dense      15143 / 178    371 / 179    285 / 57     2.5 MB (same)
    10M of 100M, a block   11089 / 57     365 / 80     276 / 46     2 KB (hand: 1.25 MB)
    100k of 100M, sparse   22.6 / 5.9     6.3 / 5.4    3.2 / 1.0    212 KB (same)
    Delta's, 1.33M of 2M   911 / 8.0      38 / 8.1     31 / 1.7     254 KB (= JVM's)
    Delta's, a block       556 / 3.7      21 / 3.7     17 / 0.34    204 B (= JVM's; hand: 107 KB)

Peak memory for 10M positions: encode 544 / 403 / 231 MB, decode 309 / 309 / 78-126 MB. In a
Spark task the same, within noise; ``import pyroaring`` takes 3 ms (numpy: 75-140 ms).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HAND_COMMIT = "341c8f1"
"""The last commit with the hand-written codec."""

_CASES: dict[str, tuple[int, int, str]] = {
    # name: (deleted rows, rows in the file, how they are spread)
    "1k of 1M, sparse": (1_000, 1_000_000, "random"),
    "1k of 100M, sparse": (1_000, 100_000_000, "random"),
    "100k of 1M, dense": (100_000, 1_000_000, "random"),
    "100k of 100M, sparse": (100_000, 100_000_000, "random"),
    "10M of 100M, sparse": (10_000_000, 100_000_000, "random"),
    "10M of 20M, dense": (10_000_000, 20_000_000, "random"),
    "10M of 100M, a block": (10_000_000, 100_000_000, "block"),
}


# --- the codecs ------------------------------------------------------------------------------


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))] if len(values) else values


def codecs(root: Path) -> dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]]:
    """Each codec's (encode, decode)."""
    from mvsink.table import deletion_vectors as now

    source = subprocess.run(
        ["git", "show", f"{HAND_COMMIT}:mvsink/table/deletion_vectors.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # Only its bitmap functions run here; the descriptors' NewFile is not needed.
    source = source.replace("from mvsink.table.delta import NewFile", "NewFile = None")
    out = {}
    for name, text in {
        "hand": source,
        "hand+sort": source.replace("np.unique(np.asarray(", "_sorted_unique(np.asarray("),
    }.items():
        namespace: dict[str, Any] = {
            "__name__": f"hand_codec_{HAND_COMMIT}",
            "_sorted_unique": _sorted_unique,
        }
        exec(compile(text, f"{HAND_COMMIT}:deletion_vectors.py", "exec"), namespace)
        out[name] = (namespace["serialize"], namespace["deserialize"])
    out["pyroaring"] = (now.serialize, now.deserialize)
    return out


# --- the vectors -----------------------------------------------------------------------------


def synthetic(name: str) -> np.ndarray:
    deleted, rows, spread = _CASES[name]
    if spread == "block":
        start = rows // 5
        return np.arange(start, start + deleted, dtype=np.int64)
    rng = np.random.default_rng(54)
    return np.sort(rng.choice(rows, deleted, replace=False)).astype(np.int64)


def delta_vectors(folder: Path) -> dict[str, bytes]:
    """The deletion vectors (bytes, magic number first) of the JVM Delta's tables in ``folder``,
    by table name."""
    from mvsink.table import deletion_vectors as dv

    out = {}
    for table in sorted(p for p in folder.iterdir() if (p / "_delta_log").is_dir()):
        for log in sorted((table / "_delta_log").glob("*.json")):
            for line in log.read_text().splitlines():
                add = json.loads(line).get("add") or {}
                if d := add.get("deletionVector"):
                    raw = (table / dv.file_path(d)).read_bytes()
                    at = int(d.get("offset") or 0) + 4
                    out[f"delta: {table.name}"] = raw[at : at + int(d["sizeInBytes"])]
    return out


# --- measuring -------------------------------------------------------------------------------


def best_of(fn: Callable[[Any], Any], arg: Any, runs: int, budget: float) -> tuple[float, int]:
    """The fastest of up to ``runs`` calls (stopping once they took ``budget`` seconds)."""
    times: list[float] = []
    while len(times) < runs and sum(times) < budget:
        gc.collect()
        start = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - start)
    return min(times), len(times)


def _status(key: str) -> int:
    found = re.search(rf"^{key}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    return int(found.group(1)) if found else 0


def peak_mb(fn: Callable[[Any], Any], arg: Any) -> float | None:
    """The resident memory ``fn(arg)`` adds at its peak, in a forked child (Linux only)."""
    if not Path("/proc/self/clear_refs").exists():
        return None
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            gc.collect()
            # Free heap pages back to the system, so that reusing them counts (they were the
            # parent's, already resident), then the high-water mark := now.
            ctypes.CDLL(None).malloc_trim(0)
            Path("/proc/self/clear_refs").write_text("5")
            base = _status("VmRSS")
            fn(arg)
            os.write(write, str(_status("VmHWM") - base).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        text = fh.read()
    os.waitpid(pid, 0)
    return round(int(text) / 1024, 1) if text else None


def import_seconds(module: str) -> float:
    """A fresh interpreter's import of ``module`` (what a new Python worker pays once)."""
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = [
        float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
        for _ in range(3)
    ]
    return min(times)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Every case with every codec, here: the placement's whole measurement."""
    root = Path(spec["root"])
    sys.path.insert(0, str(root))
    import pyroaring

    all_codecs = codecs(root)
    hand_decode = all_codecs["hand"][1]
    vectors: dict[str, tuple[np.ndarray, bytes | None]] = {n: (synthetic(n), None) for n in spec["cases"]}
    if spec["delta_tables"]:
        for name, data in delta_vectors(Path(spec["delta_tables"])).items():
            vectors[name] = (hand_decode(data), data)
    rows = []
    for case, (positions, jvm_bytes) in vectors.items():
        written = {}
        for codec, (encode, decode) in all_codecs.items():
            if codec not in spec["codecs"]:
                continue
            data = encode(positions)
            written[codec] = data
            source = jvm_bytes if jvm_bytes is not None else data  # decode Delta's own bytes
            assert np.array_equal(decode(source), positions), (case, codec)
            enc, enc_runs = best_of(encode, positions, spec["runs"], spec["budget"])
            dec, dec_runs = best_of(decode, source, spec["runs"], spec["budget"])
            rows.append(
                {
                    "case": case,
                    "codec": codec,
                    "deleted": len(positions),
                    "bytes": len(data),
                    "same_bytes_as_jvm": None if jvm_bytes is None else data == jvm_bytes,
                    "encode_ms": round(enc * 1e3, 3),
                    "decode_ms": round(dec * 1e3, 3),
                    "runs": [enc_runs, dec_runs],
                    "encode_peak_mb": peak_mb(encode, positions) if spec["memory"] else None,
                    "decode_peak_mb": peak_mb(decode, source) if spec["memory"] else None,
                }
            )
        for codec, data in written.items():  # each decodes what the other wrote
            for other, (_, decode) in all_codecs.items():
                if other in written:
                    assert np.array_equal(decode(data), positions), (case, codec, other)
    return {
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "pyroaring": pyroaring.__version__,
        "croaring": pyroaring.__croaring_version__,
        "import_pyroaring_s": round(import_seconds("pyroaring"), 4),
        "import_numpy_s": round(import_seconds("numpy"), 4),
        "rows": rows,
    }


def in_a_task(spec: dict[str, Any]) -> dict[str, Any]:
    """``run`` inside a Spark Python worker (one task on local[1])."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # else python3 on the PATH
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYTHONPATH", spec["root"])
        .getOrCreate()
    )
    try:
        result: dict[str, Any] = spark.sparkContext.parallelize([spec], 1).map(run).collect()[0]
        return result
    finally:
        spark.stop()


# --- the JVM Delta's vectors -----------------------------------------------------------------


def make_delta_tables(folder: Path) -> None:
    """One table per case, a single file of 2M rows, and a DELETE that leaves a deletion vector
    (run with delta-spark's Python; the jars from ``MVSINK_DELTA_JARS``)."""
    import glob

    from pyspark.sql import SparkSession

    jars = sorted(glob.glob(os.path.join(os.environ["MVSINK_DELTA_JARS"], "*.jar")))
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    deletes = {
        "one": "id = 123457",
        "sparse": "id % 1000 = 7",
        "dense": "id % 3 != 0",
        "range": "id BETWEEN 100000 AND 899999",
        "mixed": "(id BETWEEN 100000 AND 199999) OR id % 97 = 0",
    }
    for name, where in deletes.items():
        path = folder / name
        spark.range(2_000_000).coalesce(1).write.format("delta").option(
            "delta.enableDeletionVectors", "true"
        ).save(str(path))
        spark.sql(f"DELETE FROM delta.`{path}` WHERE {where}")
    spark.stop()


# --- the table -------------------------------------------------------------------------------


def table(placement: str, result: dict[str, Any]) -> str:
    head = (
        f"{placement}: Python {result['python']}, numpy {result['numpy']}, pyroaring {result['pyroaring']} "
        f"(CRoaring {result['croaring']}); a fresh interpreter imports pyroaring in "
        f"{result['import_pyroaring_s'] * 1e3:.0f} ms, numpy in {result['import_numpy_s'] * 1e3:.0f} ms"
    )
    lines = [
        head,
        f"{'case':24} {'codec':10} {'bytes':>10} {'=jvm':>5} {'encode ms':>11} {'decode ms':>10} "
        f"{'enc MB':>7} {'dec MB':>7}",
    ]
    for r in result["rows"]:
        same = "" if r["same_bytes_as_jvm"] is None else ("yes" if r["same_bytes_as_jvm"] else "no")
        lines.append(
            f"{r['case']:24} {r['codec']:10} {r['bytes']:>10} {same:>5} {r['encode_ms']:>11.2f} "
            f"{r['decode_ms']:>10.2f} {r['encode_peak_mb'] or '':>7} {r['decode_peak_mb'] or '':>7}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--delta-tables", type=Path, help="Delta tables with one deletion vector each")
    parser.add_argument("--make-delta-tables", type=Path, help="make them there with the JVM Delta, and stop")
    parser.add_argument("--placement", nargs="+", default=["driver"], choices=["driver", "task"])
    parser.add_argument("--cases", nargs="+", default=list(_CASES), choices=list(_CASES))
    parser.add_argument("--codecs", nargs="+", default=["hand", "hand+sort", "pyroaring"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of runs to stop after")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.make_delta_tables:
        make_delta_tables(args.make_delta_tables)
        return
    spec = {
        "root": str(ROOT),
        "cases": args.cases,
        "codecs": args.codecs,
        "runs": args.runs,
        "budget": args.budget,
        "memory": not args.no_memory,
        "delta_tables": str(args.delta_tables) if args.delta_tables else None,
    }
    results = {}
    for placement in args.placement:
        results[placement] = run(spec) if placement == "driver" else in_a_task(spec)
        print(table(placement, results[placement]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
