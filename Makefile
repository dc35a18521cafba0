# `make` sets up the virtual environment and runs the main job (the Snakemake pipeline on the CPU
# default config); `make test` sets up and runs the tests. Nothing needs to be preinstalled but python3.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zen-installed
CORES ?= all
export XDG_CACHE_HOME ?= $(CURDIR)/.cache
export MPLCONFIGDIR ?= $(CURDIR)/.cache/matplotlib
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE := 1

.PHONY: all setup run validate test test-quick lint bench-quick clean

all: run

$(STAMP): requirements.lock requirements-workloads.txt requirements-dev.txt pyproject.toml scripts/setup_simgrid.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-deps -r requirements.lock
	$(PY) -m pip install -q --no-deps -r requirements-workloads.txt
	$(PY) -m pip install -q --no-deps -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@# the harness (baselines/, workloads/, harness/, simulator/) runs from this checkout: put it on the venv's path
	$(PY) -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'zen-checkout.pth').write_text('$(CURDIR)\n')"
	sh scripts/setup_simgrid.sh $(PY)  # the step simulator's engine (simulator/): SimGrid's Python module
	touch $(STAMP)

setup: $(STAMP)

# Resumes after an interrupted run (SIGINT or SIGKILL): incomplete outputs are redone, and a lock left by a
# killed run is released, but only while holding .snakemake/make-run.lock, i.e. when no other `make` runs here.
SNAKEMAKE := $(VENV)/bin/snakemake --configfile workflow/config/default.yaml
run: setup
	@mkdir -p .snakemake
	@flock -n -E 75 .snakemake/make-run.lock sh -c '$(SNAKEMAKE) --unlock >/dev/null 2>&1; \
		exec $(SNAKEMAKE) --cores $(CORES) --rerun-incomplete $(SNAKEFLAGS)'; rc=$$?; \
		if [ $$rc -eq 75 ]; then echo "make: another 'make' is running the pipeline in this checkout" >&2; fi; \
		exit $$rc

# The step simulator against the emulated cluster at two link rates (the default's 1 Gbit/s training cells plus
# 2.5 Gbit/s launches): results/figures/sim_validation.{png,csv}; time nothing else meanwhile.
validate: setup
	$(VENV)/bin/snakemake results/figures/sim_validation.png --configfile workflow/config/default.yaml \
		workflow/config/validation.yaml --cores $(CORES) --rerun-incomplete $(SNAKEFLAGS)

test: setup
	$(PY) -m pytest -q

# The tests that start no other process (no ranks, torchrun, snakemake or Python subprocess; those carry the
# `slow` marker): the short loop while changing a scheme, an encoding or a kernel.
test-quick: setup
	$(PY) -m pytest -q -m "not slow"

# The loopback benchmark table (4 gloo ranks, 2^24 floats at 1%) in under two minutes; time it on a quiet machine.
bench-quick: setup
	$(PY) scripts/bench_quick.py

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf results/* .snakemake build
