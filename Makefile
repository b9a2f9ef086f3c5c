# Two commands do all the set-up on a fresh machine (Python 3.11+ and Java 17+ needed):
#   make demo   creates .venv, installs mvsink (no dev tools), runs the embedded default job
#   make test   creates .venv (and .venv-spark35, PySpark 3.5; .venv-delta, PySpark 4.2 for the
#               JVM Delta line), fetches the JVM jars the lines need from Maven Central (jvm/)
#               and Azurite from npm (tools/), installs mvsink with its dev tools, runs the
#               test suite (Kafka and Azure against servers it starts) on the newest PySpark,
#               each test again on 3.5 (with Connect), and the Delta lines: delta-spark 3.3
#               on 3.5 and 4.4 on 4.2 (tests/interop, and behaviour suites on their engine),
#               in two tracks side by side, each line's output in build/test/ (what each line
#               runs: docs/testing.md)
#   make soak   the short seeded fault runs (tests/chaos) and the longer model runs (by hand)
#   make fuzz   runs the model-based test (tests/test_model.py) long, from a random seed it prints
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mvsink-installed

.PHONY: demo test test-track1 test-track2 soak chaos fuzz lint bench clean

# Spark needs Java 17+: say so in one line, before anything is installed.
ifneq ($(filter demo test soak chaos fuzz bench,$(MAKECMDGOALS)),)
JAVA_PROBLEM := $(shell $(PYTHON) scripts/check_java.py 2>&1)
ifneq ($(JAVA_PROBLEM),)
$(error $(JAVA_PROBLEM))
endif
endif

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The demo's light install: mvsink and what it needs to run, no dev tools.
DEMO_STAMP := $(VENV)/.mvsink-demo-installed

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	@touch $(DEMO_STAMP)

# The Delta line: mvsink beside the JVM Delta runtime Spark users run (delta-spark 4.4, which
# needs PySpark 4.2.x), in a virtualenv of its own. Its jars: MVSINK_DELTA_JARS (here, the ones
# built from source beside the repository); without them its tests are skipped with the reason.
DELTA_VENV := .venv-delta
DELTA_STAMP := $(DELTA_VENV)/.mvsink-installed

$(DELTA_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DELTA_VENV)
	$(DELTA_VENV)/bin/pip install --quiet --upgrade pip
	$(DELTA_VENV)/bin/pip install --quiet -e '.[dev,interop]' 'pyspark[sql]==4.2.0'
	@touch $(DELTA_STAMP)

# The Spark 3.5 line: the behaviour suite again on the newest PySpark 3.5 (most production Spark
# runs it), in a virtualenv of its own, with the spark35 extra's pins (pyproject.toml).
SPARK35_VENV := .venv-spark35
SPARK35_STAMP := $(SPARK35_VENV)/.mvsink-installed

$(SPARK35_STAMP): pyproject.toml
	$(PYTHON) -m venv $(SPARK35_VENV)
	$(SPARK35_VENV)/bin/pip install --quiet --upgrade pip
	$(SPARK35_VENV)/bin/pip install --quiet -e '.[dev,spark35,interop]'
	@touch $(SPARK35_STAMP)

# Servers the tests start that come from npm (Azurite), pinned in tools/package.json and its
# lock file; without npm their tests are skipped with the reason.
NODE_STAMP := tools/node_modules/.mvsink-installed

$(NODE_STAMP): tools/package.json tools/package-lock.json
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "make: no npm on this machine: the Azure store tests will be skipped" >&2; \
	elif npm ci --prefix tools --no-audit --no-fund --loglevel=error; then touch $(NODE_STAMP); \
	else echo "make: npm could not install Azurite: the Azure store tests will be skipped" >&2; fi

demo: $(DEMO_STAMP)
	$(BIN)/mvsink run

# The lines run in two tracks side by side, each line's output in build/test/LINE.log
# (scripts/test_line.sh); a failed line does not stop the others, and `make test` fails at the
# end naming it. The JVM jars are fetched first, once (jvm/*/pom.xml, scripts/jvm_jars.sh):
# MVSINK_DELTA_JARS, MVSINK_DELTA33_JARS, MVSINK_CONNECT_JARS, MVSINK_KAFKA4_JARS,
# MVSINK_KAFKA35_JARS (Spark's Kafka source), MVSINK_S3A_JARS (hadoop-aws) and
# MVSINK_KAFKA_BROKER_JARS name other folders. The JVMs
# the Spark lines start (Spark's, Connect's, a cluster's, a CLI job's) run with C1 only and the
# serial collector: a quarter less CPU on short runs, with 2 cores shared by two tracks; nothing
# a test checks depends on it.
test: $(STAMP) $(SPARK35_STAMP) $(DELTA_STAMP) $(NODE_STAMP)
	@rm -f build/test/*.failed
	@DELTA44="$${MVSINK_DELTA_JARS:-$$(scripts/jvm_jars.sh delta-4.4 ../shared/delta-jvm/jars)}"; \
	DELTA33="$${MVSINK_DELTA33_JARS:-$$(scripts/jvm_jars.sh delta-3.3)}"; \
	CONNECT35="$${MVSINK_CONNECT_JARS:-$$(scripts/jvm_jars.sh connect-3.5)}"; \
	KAFKA4="$${MVSINK_KAFKA4_JARS:-$$(scripts/jvm_jars.sh kafka-4)}"; \
	KAFKA35="$${MVSINK_KAFKA35_JARS:-$$(scripts/jvm_jars.sh kafka-3.5)}"; \
	S3A="$${MVSINK_S3A_JARS:-$$(scripts/jvm_jars.sh s3a-3.5)}"; \
	export MVSINK_KAFKA_BROKER_JARS="$${MVSINK_KAFKA_BROKER_JARS:-$$(scripts/jvm_jars.sh kafka-broker)}"; \
	JDK_JAVA_OPTIONS="$${JDK_JAVA_OPTIONS:--XX:TieredStopAtLevel=1 -XX:+UseSerialGC}" \
	PYTEST_ADDOPTS="$${PYTEST_ADDOPTS:---durations=25}" \
		$(MAKE) --no-print-directory -j2 DELTA44="$$DELTA44" DELTA33="$$DELTA33" \
		CONNECT35="$$CONNECT35" KAFKA4="$$KAFKA4" KAFKA35="$$KAFKA35" S3A="$$S3A" test-track1 test-track2
	@failed="$$(cd build/test && ls *.failed 2>/dev/null | sed 's/\.failed$$//' | tr '\n' ' ')"; \
	if [ -n "$$failed" ]; then echo "make test: these lines failed: $$failed(logs in build/test/)"; exit 1; fi; \
	echo "make test: every line passed"

LINE := scripts/test_line.sh
# The Delta lines' JVMs do Delta's own heavy work (log replay, DML): C2-compiled, as users run.
DELTA_JVM := env -u JDK_JAVA_OPTIONS

# What each line runs of the suite's matrix: tests/conftest.py (_line_runs).
# The newest PySpark (every test but the distributed suite, which the standalone line runs on
# the same PySpark, on a cluster, last in this track), then delta-spark 3.3 on PySpark 3.5: the suites of how the
# engine reaches that release's internals (the commit, the snapshot's adds, deletion vectors,
# column mapping), in the driver placement (the Delta 4.4 line runs the behaviour suites on the
# engine, whose code is the same on both releases but for how it reaches their internals).
# Delta's own DML, OPTIMIZE, VACUUM, readers, change feed and catalog on mvsink's tables run on
# the Delta 4.4 line only: the 3.3 line keeps CI in its budget with the engine's own share.
DELTA33_SUITES := tests/interop/test_delta_jvm.py tests/interop/test_jvm_commit_store.py \
	tests/interop/test_versions.py tests/table/test_commit.py -k "not operations_work_on_a_table_only \
	and not change_data_feed and not auto_keeps and not every_version_of_a_partitioned_view \
	and not catalog and not deltas_own and not duckdb and not describe_history and not ancient_dates \
	and not change_feed_sums"
test-track1: $(STAMP) $(SPARK35_STAMP)
	-@MVSINK_KAFKA_JARS="$(KAFKA4)" $(LINE) 4.x $(BIN)/python -m pytest -q --ignore=tests/chaos \
		--ignore=tests/plan/test_distributed.py
	-@MVSINK_INTEROP=1 MVSINK_DELTA_JARS="$(DELTA33)" $(DELTA_JVM) $(LINE) delta-3.3 \
		$(SPARK35_VENV)/bin/python -m pytest -q $(DELTA33_SUITES)
	-@MVSINK_TEST_MASTER=standalone $(LINE) standalone $(BIN)/python -m pytest -q tests/plan/test_distributed.py

# PySpark 3.5 (with Connect: its server jar from Maven Central), then delta-spark 4.4 on PySpark
# 4.2. The first track ends with the distributed suite on a standalone cluster (executors in
# their own JVMs).
test-track2: $(SPARK35_STAMP) $(DELTA_STAMP) $(STAMP)
	-@MVSINK_CONNECT_JARS="$(CONNECT35)" MVSINK_KAFKA_JARS="$(KAFKA35)" $(LINE) 3.5 \
		$(SPARK35_VENV)/bin/python -m pytest -q
	-@MVSINK_INTEROP=1 MVSINK_DELTA_JARS="$(DELTA44)" MVSINK_S3A_JARS="$(S3A)" $(DELTA_JVM) $(LINE) delta-4.4 \
		$(DELTA_VENV)/bin/python -m pytest -q

# The short seeded fault runs (tests/chaos, fixed seeds: 3 Spark driver processes SIGKILLed and
# restarted, fail points, a fault proxy), the model's histories past make test's (8 a profile,
# other seeds) and the tests marked soak (process races and kills, Spark processes of their own:
# a memory bound, CLI runs against a metastore), on the lines they belong to, about 20 minutes:
# by hand (docs/testing.md says when); neither make test nor CI runs them, to fit CI's budget.
soak: $(STAMP) $(SPARK35_STAMP) $(DELTA_STAMP) $(NODE_STAMP)
	MVSINK_SOAK=1 MVSINK_KAFKA_JARS="$${MVSINK_KAFKA4_JARS:-$$(scripts/jvm_jars.sh kafka-4)}" \
	MVSINK_KAFKA_BROKER_JARS="$${MVSINK_KAFKA_BROKER_JARS:-$$(scripts/jvm_jars.sh kafka-broker)}" \
		$(BIN)/python -m pytest -q tests/chaos tests/test_model.py tests/test_concurrency.py \
		tests/test_kafka.py tests/plan/test_upsert.py
	MVSINK_SOAK=1 MVSINK_INTEROP=1 \
	MVSINK_DELTA_JARS="$${MVSINK_DELTA_JARS:-$$(scripts/jvm_jars.sh delta-4.4 ../shared/delta-jvm/jars)}" \
		$(DELTA_VENV)/bin/python -m pytest -q tests/interop/test_delta_jvm.py tests/interop/test_jvm_commit_store.py
	MVSINK_SOAK=1 MVSINK_INTEROP=1 MVSINK_DELTA_JARS="$${MVSINK_DELTA33_JARS:-$$(scripts/jvm_jars.sh delta-3.3)}" \
		$(SPARK35_VENV)/bin/python -m pytest -q tests/interop/test_delta_jvm.py tests/interop/test_jvm_commit_store.py

# A long seeded chaos run (tests/chaos): CHAOS_EPOCHS epochs in one process, then replica
# processes for CHAOS_SECONDS; CHAOS_SEED replays one.
chaos: $(STAMP)
	CHAOS_EPOCHS=$${CHAOS_EPOCHS:-200} CHAOS_SECONDS=$${CHAOS_SECONDS:-2700} \
	CHAOS_SEED=$${CHAOS_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')} \
		$(BIN)/python -m pytest -q -s tests/chaos

# A long model-based run (tests/test_model.py): per profile, MVSINK_FUZZ_EXAMPLES histories of up
# to MVSINK_FUZZ_STEPS steps from a random seed it prints, a failure shrunk to a minimal history;
# MVSINK_FUZZ_SEED replays one. PYTEST_ADDOPTS="-k upsert" runs one profile.
fuzz: $(STAMP)
	@seed=$${MVSINK_FUZZ_SEED:-$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}; echo "fuzz seed $$seed"; \
	MVSINK_FUZZ_SEED=$$seed MVSINK_FUZZ_EXAMPLES=$${MVSINK_FUZZ_EXAMPLES:-60} \
	MVSINK_FUZZ_STEPS=$${MVSINK_FUZZ_STEPS:-30} $(BIN)/python -m pytest -q -s tests/test_model.py

lint: $(STAMP)
	$(BIN)/ruff check mvsink tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/complete_mode.py

clean:
	rm -rf $(VENV) $(SPARK35_VENV) $(DELTA_VENV) data build/test .pytest_cache tools/node_modules
