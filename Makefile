# Every common task is one command. The first run creates .venv and installs labkit into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
GPU_STAMP := $(VENV)/.gpu-stamp
PROFILE ?= quick
WHEELHOUSE ?= wheelhouse
# The semester lock: the exact versions the course was tested with (`make lock` refreshes it; CONSTRAINTS= ignores it)
CONSTRAINTS ?= constraints.txt
PIN := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
# The test tiers (CONTRIBUTING.md): test-fast leaves out every test with a costly marker; test-smoke keeps one run of each kind
COSTLY := slow or notebooks or mpi or compile or cluster or hosts or sandbox or browser or gpu

.PHONY: help venv report test test-full test-fast test-smoke lab lint bench doctor gpu-check wheelhouse lock clean

help:
	@echo "make report   set up .venv, run every lab notebook headlessly ($(PROFILE) profile), write report/index.html"
	@echo "make lab      JupyterLab on your copies of the labs, exercises to do (labkit-work/);"
	@echo "              make lab SOLUTIONS=1: the worked solutions, apart (labkit-solutions/)"
	@echo "make test     set up .venv and run the test suite (as CI does), all but the full tier: a worker per core and one more, then the notebooks"
	@echo "make test-full   the full-profile notebooks and the predictions measured 5 times beside a busy core"
	@echo "make test-fast   the pure-Python units, under a minute: run it every few minutes"
	@echo "make test-smoke  test-fast plus one MPI run and one compile of each kind"
	@echo "make bench    the backprop, allreduce, kernel and scaling benchmarks"
	@echo "make doctor   what labkit finds on this machine (Python, BLAS, GPU, MPI, data)"
	@echo "make lint     ruff"
	@echo "make gpu-check  on a CUDA machine: install the GPU extra, run the GPU tests, kernel benchmark, labs 04-05 (full)"
	@echo "make wheelhouse  the wheels for make gpu-check on a node without a network (WHEEL_PYTHON=, WHEEL_PLATFORM=)"
	@echo "make lock     refresh constraints.txt, the semester's exact versions"

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[mpi,test]" $(PIN)
	@touch $(STAMP)

# The GPU check's venv sees the machine's own packages (a node's CuPy for CUDA 12 or 13, PyTorch) and installs what
# is missing: from wheelhouse/ alone where it exists (a node without a network), else from PyPI
$(GPU_STAMP):
	test -d $(VENV) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PYTHON) -m labkit.wheelhouse install --python $(BIN)/python $(if $(wildcard $(WHEELHOUSE)/*.whl),--wheelhouse $(WHEELHOUSE))
	@touch $(GPU_STAMP)

# On a machine with a network, for a GPU node without one: every wheel it needs, CuPy left out
# (WHEEL_PYTHON=3.12 WHEEL_PLATFORM=manylinux_2_28_x86_64 for a node unlike this machine)
wheelhouse:
	$(PYTHON) -m labkit.wheelhouse download --out $(WHEELHOUSE) $(if $(WHEEL_PYTHON),--python-version $(WHEEL_PYTHON)) \
	  $(if $(WHEEL_PLATFORM),--platform $(WHEEL_PLATFORM))

venv: $(STAMP)

report: $(STAMP)
	$(BIN)/labkit report --profile $(PROFILE) --out report

# make test: the tests on TEST_JOBS workers (pytest-xdist, a file's tests on one worker), the labs' notebooks and their
# claims among them, beside each other; then alone the few marked quiet (a cable's measured rate, which a busy
# neighbour would change); both runs always run, and either failing fails. TEST_JOBS: one worker more than the usable cores, at most 8: many of these tests wait (a cell's
# time limit, a SLURM job, a host's timeout), and a third worker on 2 cores took the first run from 730 s to 515 s
TEST_JOBS ?= $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') \
  else os.cpu_count(); print(min(n + 1, 8))")
test: $(STAMP)
	@$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile -m "not (full or quiet)"; shared=$$?; \
	$(BIN)/python -m pytest -m "quiet and not full"; alone=$$?; \
	test $$shared = 0 -a $$alone = 0

test-full: $(STAMP)
	$(BIN)/python -m pytest -m full

test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS) -m "not ($(COSTLY))"

test-smoke: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile -m "not ($(COSTLY)) or smoke"

lab: $(STAMP)
	$(BIN)/labkit lab $(if $(SOLUTIONS),--solutions)

lint: $(STAMP)
	$(BIN)/ruff check labkit tests

bench: $(STAMP)
	$(BIN)/labkit bench backprop
	$(BIN)/labkit bench allreduce
	$(BIN)/labkit bench kernels
	$(BIN)/labkit bench openmp
	$(BIN)/labkit bench scaling

doctor: $(STAMP)
	$(BIN)/labkit doctor

gpu-check: $(GPU_STAMP)
	$(BIN)/labkit gpu-check --out gpu-check

lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet -e ".[mpi,test]"
	{ echo "# The versions labkit was tested with this semester: make installs with -c constraints.txt."; \
	  echo "# Refresh with 'make lock' (a fresh venv, the newest releases), run 'make test', commit."; \
	  .lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^-e '; } > constraints.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) report gpu-check .pytest_cache .ruff_cache
