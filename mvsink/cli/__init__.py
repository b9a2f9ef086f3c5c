"""The command line (``main``), job files (``job``), the job runner and the local session.
``main`` is the ``mvsink`` command's entry point (the demo's views are ``mvsink.demo``).
The top of the tree: may import any part."""

from mvsink.cli.main import main

__all__ = ["main"]
