# The two commands of the README: `make search` and `make test`.
# Both build the project's own virtual environment on first use (and again when pyproject.toml
# changes), so a fresh machine needs nothing but Python 3.11 and this file.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: search test install clean

search: $(STAMP)
	$(BIN)/rankitect search $(ARGS)

# Two workers, whatever the machine (CI has 2 cores); tests are dealt out as they finish
# (worksteal), so the long end-to-end ones do not pile up on one worker. ARGS="-n 0" runs serially.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal $(ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -e ".[dev]"
	$(BIN)/python -m pip install --no-deps $$($(BIN)/python -c \
	  "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['rankitect']['no-deps']))")
# tests/track/test_ui_browser.py renders `rankitect ui` in headless Chromium: Debian's package,
# installed once (as root, as here and in CI) instead of any browser download. Where apt-get
# cannot run, the install goes on and that test fails saying what is missing.
	command -v chromium >/dev/null || { apt-get update && apt-get install -y --no-install-recommends chromium; } \
	  || echo "warning: chromium not installed; tests/track/test_ui_browser.py needs it"
# tests/search/test_runner.py shares one search between two processes through a PostgreSQL
# server it starts itself on 127.0.0.1: Debian's server package, installed the same way.
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	  || { apt-get update && apt-get install -y --no-install-recommends postgresql; } \
	  || echo "warning: postgresql not installed; the PostgreSQL test of tests/search/test_runner.py needs it"
	touch $(STAMP)

clean:
	rm -rf $(VENV)
