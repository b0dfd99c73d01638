# The few targets a contributor needs. `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint typecheck wheel-check matrix bench install clean

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/python manage.py demo

test: install
	$(BIN)/python -m pytest -q

# The loop to run while working: all but Spark, the browser and the tests that start worker
# processes (markers in pyproject.toml; pgmsg_tests/test_markers.py keeps them marked).
test-fast: install
	$(BIN)/python -m pytest -q -m "not spark and not browser and not processes"

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

wheel-check: install
	.ci/wheel-check

# Every Python x Django x PostgreSQL cell (noxfile.py); writes docs/compatibility.md's table.
matrix: install
	$(BIN)/nox

bench: install
	$(BIN)/python bench/all.py

clean:
	rm -rf $(VENV) .pgdata build *.egg-info
