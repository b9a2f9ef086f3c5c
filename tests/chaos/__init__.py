"""Faults for tests: an S3 endpoint that injects them (``proxy``), and the chaos suite."""
