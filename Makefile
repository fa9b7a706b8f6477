# The two commands of the README: `make demo` (kiln's main job) and `make test` (every test).
.PHONY: setup demo test test-python test-py312 test-latest lock test-cpp bench

setup:
	@scripts/setup.sh

demo: setup
	@.venv/bin/python -m kiln demo

test: setup
	@scripts/test.sh

test-python: setup
	@.venv/bin/python -m pytest -q tests/python

test-py312: setup
	@scripts/test_py312.sh

# The Python suite on the newest versions requirements.txt allows (not part of `make test`).
test-latest: setup
	@scripts/deps.sh latest

# requirements.lock moved forward to those newest versions.
lock: setup
	@scripts/deps.sh lock

bench: setup
	@.venv/bin/python bench/run_all.py
