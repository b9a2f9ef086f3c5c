"""mvsink's test suite: a package, so that test modules mirroring the package may share a name."""
