# Every common task is one command. The first run creates .venv and installs labkit into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PROFILE ?= quick

.PHONY: help venv report test test-fast lab lint bench doctor clean

help:
	@echo "make report   set up .venv, run every lab notebook headlessly ($(PROFILE) profile), write report/index.html"
	@echo "make test     set up .venv and run the whole test suite"
	@echo "make lab      JupyterLab on notebooks/"
	@echo "make bench    the backprop, allreduce, kernel and scaling benchmarks"
	@echo "make doctor   what labkit finds on this machine (Python, BLAS, GPU, MPI, data)"
	@echo "make lint     ruff"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

venv: $(STAMP)

report: $(STAMP)
	$(BIN)/labkit report --profile $(PROFILE) --out report

test: $(STAMP)
	$(BIN)/python -m pytest

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not notebooks"

lab: $(STAMP)
	$(BIN)/labkit lab

lint: $(STAMP)
	$(BIN)/ruff check labkit tests

bench: $(STAMP)
	$(BIN)/labkit bench backprop
	$(BIN)/labkit bench allreduce
	$(BIN)/labkit bench kernels
	$(BIN)/labkit bench scaling

doctor: $(STAMP)
	$(BIN)/labkit doctor

clean:
	rm -rf $(VENV) report .pytest_cache .ruff_cache
