# Two commands do all the set-up (see README): `make demo` and `make test`.
# Both create .venv from requirements.lock (pinned, tested set) on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-slow evaluate bench clean

$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.lock
	$(BIN)/pip install --disable-pip-version-check -q --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dpatlas demo

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -n 2 -q -m slow

evaluate: $(STAMP)
	$(BIN)/dpatlas evaluate

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_estimators.py

clean:
	rm -rf $(VENV) build *.egg-info
