"""Predictions that noise cannot decide. Before an experiment a lab asks for a prediction; the instructor's model
answer is the release notebook's answer cell. Where the answer depends on a measurement that noise could decide (a
timing, an asynchronous run), the measurement is repeated RUNS times here as its lab makes it on the quick profile,
beside a busy loop on every core (a class's shared machine), and the model answer must be right every time: a
choice equal to the one measured, a ratio on the measured side of 1. Every other prediction is listed in EXACT with
why no noise decides it."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import busy_loops, run_mpi_cases

from labkit import kernels, runner
from labkit.machine import usable_cores

RUNS = 5
ROOT = Path(__file__).resolve().parent.parent

# why each of these predictions has one answer in every run: an exact count, a formula, or a seeded computation
EXACT = {
    "04-stream-gain": "compared with exercise 5's model of 8 equal batches, exact",
    "05-reads-of-A": "the emulator's exact load counts",
    "05-bank-conflicts": "the emulator's exact bank-conflict counts",
    "05-softmax-overflow": "float32 arithmetic: inf and nan in every run",
    "06-bcast-rounds": "the algorithms' round counts",
    "07-naive-kB": "the bytes rank 0 sends, counted",
    "07-ring-traffic": "the ring's messages and bytes, counted",
    "07-wire": "an estimate from the cable's rate, printed beside the run and the alpha-beta model",
    "08-progress-predict": "the buckets a step sends and their sizes, fixed by the layers and bucket_bytes",
    "08-wire": "an estimate from the cable's rate, printed beside the run",
    "09-staleness": "the mean over the updates before the first worker is done is W - 1 whatever the order (each update "
                    "counts once in each other worker's next staleness): 1.93-1.99 in 5 runs beside a busy core",
    "09-stable-step": "the delayed recurrence, computed exactly",
    "10-topk-bytes": "the bytes are counted and the errors computed on seeded draws",
    "10-feedback-reach": "a seeded simulation, the same in every run",
    "10-wire": "the bytes' ratio is counted; the exchange times' ratio is printed beside it, not predicted: it fell on "
               "both sides of the bytes' (1.5 to 13 beside other load, 53.4 on a quiet machine)",
    "11-bytes": "bytes counted from the layer sizes",
    "11-bubble": "the schedule's exact idle fraction",
    "11-1f1b": "the schedule's exact step count and held activations",
    "12-serial-fraction": "the model answer is computed from the run's own 2-rank speedup",
    "12-wire": "the model answer is computed from the run's one-rank step and the cable's beta; the claim checks the "
               "measured side of 1 (hosts with shaped cables: five runs would cost minutes)",
}


def model_answer(answer: str) -> dict:
    """The variables of the release notebook's answer cell ``answer`` (its metadata ``labkit.answer``), as written
    for the kernels' backend on this machine."""
    for path in runner.find_notebooks():
        for cell in json.loads(path.read_text())["cells"]:
            if cell.get("metadata", {}).get("labkit", {}).get("answer") == answer:
                scope: dict = {}
                given = {"BACKEND": kernels.backend(), "usable_cores": usable_cores}  # what model answers name
                exec("".join(cell["source"]), given, scope)
                return scope
    raise KeyError(answer)


# the model answers that say "no gain" (1.0): right while the measurement gains less than half of what a second core
# could give
NO_GAIN = 1.5


def right(model, measured) -> bool:
    """A choice is right when it is the one measured; a ratio when it lies on the measured side of 1 (a model answer
    of exactly 1, "no gain", while the measurement stays under NO_GAIN)."""
    if isinstance(model, str):
        return model.strip().lower() == str(measured).strip().lower()
    if model == 1:
        return measured < NO_GAIN
    return (model > 1) == (measured > 1)


def predictions() -> dict[str, str]:
    """Every prediction of the labs: answer id -> notebook."""
    found = {}
    for path in runner.find_notebooks():
        for cell in json.loads(path.read_text())["cells"]:
            meta = cell.get("metadata", {}).get("labkit", {})
            if meta.get("kind") == "predict":
                found[meta["answer"]] = path.name
    return found


@pytest.fixture
def busy_cores():
    """Every core kept busy by another process for the length of the test, as other students' notebooks on a shared
    machine. (Lab 02's narrow-layer prediction was a speedup, which read 1.53x in CI and 1.99x by hand here: beside a
    busy loop per core two threads get two shares of the cores where one gets one. It is now the cores the two threads
    kept busy, which the neighbours can only lower.)"""
    with busy_loops(usable_cores()):
        yield


def judge(answer: str, runs: list[dict]) -> None:
    """Every run's measurements against the model answer of ``answer``: fail naming each run it was wrong in."""
    model = model_answer(answer)
    wrong = [f"run {k}: {name} = {model[name]!r}, measured {got[name]!r}"
             for k, got in enumerate(runs, 1) for name in got if not right(model[name], got[name])]
    assert len(runs) >= RUNS and not wrong, f"{answer}: the model answer was wrong in {len(wrong)} of {len(runs)} runs: " \
                                            + "; ".join(wrong)


# ---- measured in this process ---------------------------------------------------------------------------------------

def _lab01(digits, samples: int = 2000) -> dict:
    from threadpoolctl import threadpool_limits

    from labkit import mlp

    (x, y), _ = digits
    x, y = x[:samples], y[:samples]

    def epoch(method: str, batch: int) -> float:
        h = mlp.train(mlp.init_params([784, 30, 10], seed=0), (x, y), epochs=1, batch_size=batch, lr=3.0,
                      method=method, progress=False)
        return float(np.median(h.epoch_time))

    with threadpool_limits(1):  # as the lab times everything: BLAS on one thread
        return {"predicted_speedup": epoch("per_sample", 10) / epoch("vectorised", 10),
                "predicted_slowdown": epoch("vectorised", 1) / epoch("vectorised", 100)}


def _lab02(digits) -> dict:
    from labkit import mlp
    from labkit.cpu_parallel import CORES_KEPT, thread_speedups, two_worker_speedups

    (x, y), _ = digits
    xb, yb = x[:100], y[:100]
    _, speedups = thread_speedups(mlp.init_params([784, 30, 10]), xb, yb, [1, 2, 4, 8], repeat=3)
    kept = two_worker_speedups([30, 300, 3000], xb, yb, repeat=3)[CORES_KEPT]
    return {"predicted_best_speedup": max(max(s) for s in speedups.values()),
            "predicted_narrow_cores": kept[0]}


def _lab03(digits) -> dict:
    from labkit import mlp, openmp

    (x, y), _ = digits
    xb, Yb = x[:100], mlp.targets(y[:100], 10, np.float32)
    params = mlp.init_params([784, 100, 10], seed=0)
    narrow, wide = mlp.init_params([784, 30, 10], seed=0), mlp.init_params([784, 1000, 10], seed=0)
    t = openmp.batch_times({"-O0": dict(params=params, version="fused", opt="-O0"),
                            "-O2": dict(params=params, version="fused", opt="-O2"),
                            "narrow": dict(params=narrow, version="omp_reduction", threads=1),
                            "wide": dict(params=wide, version="omp_reduction", threads=1)}, xb, Yb, 3, 1)
    return {"predicted_O2_speedup": t["-O0"] / t["-O2"], "predicted_work_ratio": t["wide"] / t["narrow"]}


def _lab04(digits) -> dict:
    from labkit.kernels.offload import PHASES, offload_crossover, offload_tables, transfer_breakdown

    t = transfer_breakdown(1000, 784, repeat=5)
    widths = [10, 30, 100, 300, 1000, 3000]
    resident = offload_tables(widths, 784, repeat=5)["resident"]
    return {"predicted_most": "copies" if 1 - t["kernel"] / sum(t[ph] for ph in PHASES) > 0.5 else "kernel",
            "predicted_crossover": offload_crossover(widths, resident["host"], resident["copy"], resident["kernel"]) or 0}


def _lab12(digits) -> dict:
    from labkit import scaling

    share = {b: scaling.strong_scaling("backprop", (1, 2), size=b, repeat=1, rounds=5).transfer_share[1] for b in (128, 4096)}
    return {"predicted_more_comm": "128" if share[128] > share[4096] else "large"}


# answer id -> (how its measurements are made, the marks its test needs)
IN_PROCESS = {
    "02-thread-speedup": (_lab02, ()),
    "02-narrow-threads": (_lab02, ()),
    "01-vectorised-speedup": (_lab01, ()),
    "01-batch-size": (_lab01, ()),
    "03-O2-speedup": (_lab03, (pytest.mark.compile,)),
    "03-wide-work": (_lab03, (pytest.mark.compile,)),
    "04-copy-share": (_lab04, (pytest.mark.compile,)),
    "04-crossover": (_lab04, (pytest.mark.compile,)),
    "12-comm-share": (_lab12, (pytest.mark.mpi,)),
}
# answer id -> (the case of tests/mpi/cases_predictions.py that measures it, its ranks)
ON_MPI = {
    "06-small-allreduce": ("small allreduce", 4),
    "07-small-winner": ("large allreduce", 4),
    "08-speedup": ("epochs by ranks", 4),
    "08-fused": ("fused", 4),
    "09-small-step": ("small step", 4),
}


def test_every_prediction_is_measured_here_or_exact():
    found = predictions()
    assert not set(IN_PROCESS) - set(found) and not set(ON_MPI) - set(found) and not set(EXACT) - set(found), \
        "listed here, but no such prediction in the labs"
    left = set(found) - set(IN_PROCESS) - set(ON_MPI) - set(EXACT)
    assert not left, f"predictions neither measured by this file nor listed in EXACT: {sorted(left)}"


def test_a_model_answer_is_judged_by_its_kind():
    assert right("naive", " Naive") and not right("naive", "ring")
    assert right(1.3, 1.01) and not right(1.3, 0.98) and right(0.7, 0.95) and not right(0.7, 1.2)
    assert right(1.0, 1.1) and right(1.0, 0.5) and not right(1.0, 1.6)
    assert model_answer("06-small-allreduce")["predicted_faster_small"] == "recursive_doubling"
    with pytest.raises(AssertionError, match="wrong in 1 of 5 runs: run 3: predicted_faster_small"):
        judge("06-small-allreduce", [{"predicted_faster_small": "recursive_doubling"}] * 2
              + [{"predicted_faster_small": "ring"}] + [{"predicted_faster_small": "recursive_doubling"}] * 2)


def _measures() -> list:
    """One test per measuring function, with the marks its answers need: the answers it measures share its runs."""
    by: dict = {}
    for answer, (measure, marks) in IN_PROCESS.items():
        answers, _ = by.setdefault(measure, ([], marks))
        answers.append(answer)
    return [pytest.param(m, a, marks=k, id=m.__name__.strip("_")) for m, (a, k) in by.items()]


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("measure, answers", _measures())
def test_the_model_answer_holds_in_every_run(measure, answers, digits, busy_cores):
    runs = [measure(digits) for _ in range(RUNS)]
    for answer in answers:
        wanted = set(model_answer(answer))
        judge(answer, [{k: v for k, v in got.items() if k in wanted} for got in runs])


@pytest.mark.mpi
@pytest.mark.full
@pytest.mark.parametrize("answer", sorted(ON_MPI))
def test_the_model_answer_holds_in_every_run_on_mpi(answer, busy_cores):
    name, n = ON_MPI[answer]
    out = run_mpi_cases("cases_predictions.py", n, only=name, timeout=600)
    runs = [json.loads(line.split(" ", 2)[2]) for line in out.splitlines() if line.startswith(f"MEASURED {answer} ")]
    judge(answer, runs)
