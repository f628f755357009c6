# Two commands do all the set-up (see README): `make demo` and `make test`.
# Both create .venv from requirements.lock (pinned, tested set) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast test-slow evaluate bench clean browser

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.lock
	$(BIN)/pip install --disable-pip-version-check -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dpatlas demo

# The web map's tests drive Debian's Chromium (a real browser, not a downloaded one).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the web map's browser tests"; \
	  SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; } || { \
	  echo "could not install chromium: run 'apt-get install -y chromium' or skip the browser tests with pytest -m 'not browser'"; exit 1; }

test: $(STAMP) browser
	$(BIN)/python -m pytest -n 2 -q

# The unit tier (tests/unit: pure functions and mechanisms; no Prefect, database, subprocess or
# browser), for development: under a minute. `make test` runs every tier.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q tests/unit

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m slow

evaluate: $(STAMP)
	$(BIN)/dpatlas evaluate

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_estimators.py

clean:
	rm -rf $(VENV) build *.egg-info
