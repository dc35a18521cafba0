# `make` sets up the virtual environment and runs the main job (the Snakemake pipeline on the CPU
# default config); `make test` sets up and runs the tests. Nothing needs to be preinstalled but python3.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.zen-installed
CORES ?= all
# The lock pins torch's CPU build (+cpu), which only PyTorch's own index serves: tried when pip's indexes lack it
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
export XDG_CACHE_HOME ?= $(CURDIR)/.cache
export MPLCONFIGDIR ?= $(CURDIR)/.cache/matplotlib
export WANDB_MODE ?= offline
export HF_HUB_OFFLINE := 1

.PHONY: all setup run sim-fidelity simulated test test-quick lint bench-quick clean

all: run

$(STAMP): requirements.lock requirements-workloads.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first from its own index, then the rest from pip's as configured (an --extra-index-url given here would
	@# replace the user's own extra indexes, not add to them)
	$(PY) -m pip install -q --no-deps -r requirements.lock 2>$(VENV)/pip-lock.err || { \
		echo "setup: requirements.lock did not install from pip's indexes ($(VENV)/pip-lock.err); torch's +cpu build is served only by PyTorch's CPU index: retrying with torch from $(TORCH_INDEX)" >&2; \
		$(PY) -m pip install -q --no-deps --index-url $(TORCH_INDEX) $$(grep '^torch==' requirements.lock) && \
		$(PY) -m pip install -q --no-deps -r requirements.lock; }
	$(PY) -m pip install -q --no-deps -r requirements-workloads.txt
	$(PY) -m pip install -q --no-deps -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	@# the harness (baselines/, workloads/, harness/, simulator/) runs from this checkout: put it on the venv's path
	$(PY) -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'zen-checkout.pth').write_text('$(CURDIR)\n')"
	touch $(STAMP)

# SimGrid (the step simulator's engine) is optional and checked on every setup, so one installed later is found;
# without it the line printed says how to get it (SIMGRID_DIST: where a system's module is looked for).
setup: $(STAMP)
	@sh scripts/setup_simgrid.sh $(PY) $(SIMGRID_DIST)

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
# 2.5 Gbit/s launches): results/figures/sim_fidelity.{png,csv}; time nothing else meanwhile.
sim-fidelity: setup
	$(VENV)/bin/snakemake results/figures/sim_fidelity.png --configfile workflow/config/default.yaml \
		workflow/config/fidelity.yaml --cores $(CORES) --rerun-incomplete $(SNAKEFLAGS)

# The paper's setting simulated (workflow/config/simulated.yaml: Table 1-density traces, Figs 11, 12 and 15 at 16 x 8
# GPUs with the compute halved and doubled, Fig 8 at 2..128 GPUs, the LLMs of Figs 13/14; about 12 minutes on 2
# cores, too long for `make`), then committed under results/simulated/ with its commit, date and command: the report
# reads it from there and says when the code it came from has changed since. Every step reruns (--forceall): the
# shell rules do not see a change of the simulator's code, and the outputs are labelled with this commit.
SIMULATED := sim_paper sim_fig8 sim_llm sparsity
simulated: setup
	@$(PY) -c "import simgrid" 2>/dev/null || { echo "make simulated: needs SimGrid (make setup says how to get it)" >&2; exit 2; }
	$(VENV)/bin/snakemake $(SIMULATED:%=results/aggregate/%.csv) --configfile workflow/config/default.yaml \
		workflow/config/simulated.yaml --cores $(CORES) --forceall $(SNAKEFLAGS)
	$(PY) workflow/scripts/simulated.py --from results/aggregate --out results/simulated --command "make simulated" \
		$(SIMULATED)

# -rs: the reasons of skipped tests (SimGrid missing, no link emulation) in the summary. -n: pytest-xdist workers,
# more than the cores: ranks mostly wait (timeouts, dead or frozen peers, sockets, start-up), so modules overlap their
# waits; loadfile keeps a module (and its launch-once fixtures) on one worker. The kernels are built first: else the
# first tests' ranks, started side by side, would all wait on that one build (a failed build: its tests say so).
TEST_WORKERS ?= 3
PYTEST_XDIST = -n $(TEST_WORKERS) --dist loadfile
test: setup
	-$(VENV)/bin/zen build
	$(PY) -m pytest -q -rs $(PYTEST_XDIST)

# The tests that start no other process (no ranks, torchrun, snakemake or Python subprocess; those carry the
# `slow` marker): the short loop while changing a scheme, an encoding or a kernel.
test-quick: setup
	-$(VENV)/bin/zen build
	$(PY) -m pytest -q -m "not slow" $(PYTEST_XDIST)

# The loopback benchmark table (4 gloo ranks, 2^24 floats at 1%) in under two minutes; time it on a quiet machine.
bench-quick: setup
	$(PY) scripts/bench_quick.py

lint: setup
	$(VENV)/bin/ruff check .

clean:  # keeps the committed simulations (results/simulated)
	find results -mindepth 1 -maxdepth 1 ! -name simulated -exec rm -rf {} +
	rm -rf .snakemake build
