"""mvsink beside the JVM Delta runtime: these tests run in the Delta line only (its session,
``tests/delta_session.py``), on tables Spark made with Delta's features."""
