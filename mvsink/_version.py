"""The package version (one place: ``mvsink.__version__`` and the workers check read it)."""

__version__ = "0.1.0"
