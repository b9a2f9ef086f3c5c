"""The embedded demo's feed and queries (``mvsink.demo``); tests/test_docs.py runs its job files
and tests/cli/test_main.py ``mvsink run`` on it."""

from __future__ import annotations

import json
import threading

import pytest

from mvsink.demo import ORDERS_PER_FILE, feed_orders, latest_order_query, orders_query, revenue_query
from mvsink.errors import ConfigError


def _orders(folder) -> list[dict]:
    rows = []
    for path in sorted(folder.iterdir()):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def test_each_feed_writes_the_next_orders_as_one_new_file(tmp_path):
    folder = tmp_path / "orders"
    for _ in range(3):
        feed_orders(None, str(folder))  # type: ignore[arg-type]
    assert sorted(p.name for p in folder.iterdir()) == [f"orders-{n:06d}.json" for n in range(3)]
    rows = _orders(folder)
    assert [r["order_id"] for r in rows] == list(range(3 * ORDERS_PER_FILE))
    assert all(r["product"] == f"p{r['order_id'] % 5}" and r["amount"] == r["order_id"] % 7 + 1 for r in rows)


def test_feeders_racing_never_write_the_same_file(tmp_path):
    folder = tmp_path / "orders"
    folder.mkdir()
    start = threading.Barrier(4)

    def feed() -> None:
        start.wait()
        for _ in range(5):
            feed_orders(None, str(folder))  # type: ignore[arg-type]

    threads = [threading.Thread(target=feed) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"orders-{n:06d}.json" for n in range(20)]  # no hidden file left either
    ids = [r["order_id"] for r in _orders(folder)]
    assert sorted(ids) == list(range(20 * ORDERS_PER_FILE))


@pytest.mark.parametrize("query", [revenue_query, latest_order_query, orders_query])
def test_a_query_over_an_empty_folder_says_the_feed_writes_it(spark, tmp_path, query):
    with pytest.raises(ConfigError, match="holds no orders"):
        query(spark, str(tmp_path / "none"))


def test_the_revenue_view_sums_the_orders(spark, tmp_path):
    folder = tmp_path / "orders"
    feed_orders(spark, str(folder))
    got = {}

    def keep(df, epoch):
        got.update({r["product"]: (float(r["revenue"]), r["orders"]) for r in df.collect()})

    q = revenue_query(spark, str(folder)).writeStream.outputMode("complete").foreachBatch(keep).start()
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    want: dict[str, tuple[float, int]] = {}
    for i in range(ORDERS_PER_FILE):
        revenue, count = want.get(f"p{i % 5}", (0.0, 0))
        want[f"p{i % 5}"] = (revenue + i % 7 + 1, count + 1)
    assert got == want
