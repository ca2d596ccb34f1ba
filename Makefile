# `make demo` and `make test` work on a fresh clone with only python3 and make.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint typecheck unit bench perf soak clean

# editable_mode=compat: a plain path in a .pth file rather than an import hook, so that
# type checkers (mypy, pyright), which do not run import hooks, find fusee and its py.typed.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]' --config-settings editable_mode=compat
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(PY) -m ruff check fusee tests bench examples

typecheck: $(STAMP)
	$(PY) -m mypy
	$(PY) -m mypy --strict --warn-unused-ignores tests/typing

unit: $(STAMP)
	$(PY) -m pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(PY) bench/run_all.py

# The CPU-per-step regression guard: run it on a quiet machine; never part of make test.
perf: $(STAMP)
	$(PY) bench/perf_smoke.py

# The simulator over a long seed range, sharded across processes, with a canary and a
# coverage atlas (docs/sim.md); hours on a quiet machine, never part of make test.
SEEDS ?= 0..20000
JOBS ?= 2
SOAK_OUT ?= bench/results/soak
SOAK_ARGS ?=
soak: $(STAMP)
	$(PY) -m fusee.sim.soak --seeds $(SEEDS) --jobs $(JOBS) --out $(SOAK_OUT) $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
