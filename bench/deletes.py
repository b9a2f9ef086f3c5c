"""Deleting many files from an object store (issue 17.7): one at a time vs ``Store.delete``.

An epoch that rewrites N files removes N index entries; a sweep or a discarded attempt deletes
as many. On S3 every delete is a request with tens of milliseconds of latency. Here a moto S3
server on 127.0.0.1 sits behind a proxy (its own process) that holds each request for
``--latency-ms`` before passing it on, so the figures show what the request count costs, not
moto's own speed:

* serial: delta-rs's file system handler, one delete after the other (the old ``Store.delete``);
* ``Store.delete``: the same handler in helper processes (it holds the GIL while it waits, so
  threads in one process do not overlap).

    python bench/deletes.py --files 2000 --latency-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mvsink.table.storage import Store, _filesystem
from tests.s3server import BUCKET, free_port, moto_server


def _proxy(listen: int, upstream: int, latency: float) -> None:
    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        try:
            while chunk := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(reader, up_writer, latency), pipe(up_reader, writer, 0.0))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    with moto_server(Path(tempfile.mkdtemp()) / "moto.log") as options:
        upstream = int(options["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
        port = free_port()
        proxy = multiprocessing.Process(
            target=_proxy, args=(port, upstream, args.latency_ms / 1000), daemon=True
        )
        proxy.start()
        time.sleep(1.0)  # the proxy process listens
        slow = {**options, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        store = Store(f"s3://{BUCKET}/bench", slow)
        names = [f"_mvsink/v/index/d/{i:05d}.parquet" for i in range(args.files)]
        fast = Store(f"s3://{BUCKET}/bench", options)  # fills without the latency
        results = {"files": args.files, "latency_ms": args.latency_ms}
        for label in ("serial", "Store.delete"):
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: fast.put(n, b"x" * 100), names))
            start = time.perf_counter()
            if label == "serial":
                fs = _filesystem(store.root, tuple(sorted(slow.items())))
                for name in names:
                    fs.delete_file(name)
            else:
                store.delete(names)
            results[f"{label}_s"] = round(time.perf_counter() - start, 2)
            assert fast.files("_mvsink") == [], "every file deleted"
        proxy.terminate()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
