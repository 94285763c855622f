# The README's two commands: `make demo` and `make test`. Both do all set-up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
FASHION_MNIST := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

.PHONY: demo test install install-test data postgres benchmarks clean

UV := $(VENV)/bin/uv

# uv installs the packages (parallel downloads and byte-compiling); pip installs uv. The bytecode is
# compiled at install: where PYTHONDONTWRITEBYTECODE is set, each process would otherwise compile
# TensorFlow's sources again (measured: the TF half 561 s without it, against 365 s).
$(PY):
	$(PYTHON) -m venv $(VENV)

$(UV): $(PY)
	$(PY) -m pip install --quiet uv

$(VENV)/.installed: $(UV) pyproject.toml
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -e ".[all]"
	touch $@

$(VENV)/.installed-test: $(UV) pyproject.toml
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -e ".[all,test]"
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

# Fashion-MNIST from the Debian package, where apt is available and it is missing.
data:
	@if [ ! -f $(FASHION_MNIST) ] && command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q dataset-fashion-mnist >/dev/null; }; \
	fi

# The recipe (fast_resnet) under a simulated 64 MiB device: 2 micro-batches of 128 per logical batch of 256.
demo: install data
	$(VENV)/bin/kadapt train --data fashion_mnist --memory-budget 64MiB --epochs 8 --out runs/demo --overwrite

# PostgreSQL for the record-store tests (each test run starts a throwaway cluster), where apt is available and it is missing.
postgres:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1 \
		&& command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get install -y -q postgresql >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q postgresql >/dev/null; }; \
	fi

test: install-test data postgres
	$(PY) -m pytest -n 4 --dist loadfile --no-loadscope-reorder --durations=12 tests  # four workers on 2 cores: many tests wait on subprocesses; a module stays on one (its shared fixtures); the long modules start early (conftest's `scheduled`)
	KERAS_BACKEND=jax $(PY) -m pytest -n 2 --durations=6 tests  # the modules marked `backends(..., "jax")` (tests/conftest.py), in conftest's order

benchmarks: install data
	$(PY) benchmarks/accumulation/accumulation.py
	$(PY) benchmarks/probe/probe.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
