# Two commands do all the set-up on a fresh machine (Python 3.11+ and Java 17+ needed):
#   make demo   creates .venv, installs mvsink, runs the embedded default job
#   make test   creates .venv, installs mvsink with its dev tools, runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mvsink-installed

.PHONY: demo test lint bench clean

# Spark needs Java 17+: say so in one line, before anything is installed.
ifneq ($(filter demo test bench,$(MAKECMDGOALS)),)
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

demo: $(STAMP)
	$(BIN)/mvsink run

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check mvsink tests bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/complete_mode.py

clean:
	rm -rf $(VENV) data .pytest_cache
