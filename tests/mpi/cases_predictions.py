"""The measurements behind the labs' predictions that run on MPI ranks, RUNS times each, as the labs make them on the
quick profile; rank 0 prints ``MEASURED <answer id> <json>`` per run for tests/test_predictions.py to judge.

Run: mpiexec -n 4 python -m mpi4py tests/mpi/cases_predictions.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import json
import warnings

import numpy as np
from _cases import case, run_cases
from mpi4py import MPI

from labkit import collectives as C
from labkit import costmodel, data, data_parallel, param_server

RUNS = 5
comm = MPI.COMM_WORLD
rank, p = comm.Get_rank(), comm.Get_size()


def digits(samples: int = 10_000):
    """The quick profile's training rows of labs 08 and 09, and the test set."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (x, y), test = data.load_mnist(quiet=True)
    return (x[:samples], y[:samples]), test


def measured(answer: str, values: dict) -> None:
    if rank == 0:
        print(f"MEASURED {answer} {json.dumps(values)}", flush=True)


@case("small allreduce: recursive doubling against the ring at 8 bytes (lab 06, section 7)")
def _():
    for _ in range(RUNS):
        t = {name: costmodel.time_collective(comm, C.ALLREDUCES[name], np.ones(1), repeat=5, check=False)
             for name in ("recursive_doubling", "ring")}
        faster = min(t, key=t.get)
        measured("06-small-allreduce", {"predicted_faster_small": faster,
                                        "predicted_ratio_small": max(t.values()) / min(t.values())})


@case("large allreduce: naive against the ring at N = 1,000,000 (lab 07, section 5)")
def _():
    for _ in range(RUNS):
        t = {name: costmodel.time_collective(comm, C.ALLREDUCES[name], np.ones(1_000_000), repeat=5, check=False)
             for name in ("naive", "ring")}
        measured("07-small-winner", {"predicted_faster": min(t, key=t.get)})


@case("epochs by ranks: one epoch on 1, 2 and 4 ranks (lab 08, section 5)")
def _():
    (x, y), _ = digits()
    for _ in range(RUNS):
        timings = np.array(data_parallel.epochs_by_ranks(comm, x, y))
        if rank == 0:
            epoch = timings[:, 1]
            measured("08-speedup", {"predicted_speedup_4": float(epoch[0] / epoch[-1])})


@case("fused: one fused ring against a ring per array (lab 08, section 6)")
def _():
    (x, y), _ = digits()
    for _ in range(RUNS):
        per_step = data_parallel.allreduce_variants(comm, x, y)
        if rank == 0:
            measured("08-fused", {"predicted_cheaper": "fused" if per_step["ring, fused"] < per_step["ring, per layer"]
                                  else "per layer"})


@case("small step: lr 0.1 with the most workers, one master (lab 09, section 5)")
def _():
    (x, y), test = digits()
    for _ in range(RUNS):
        rows = param_server.accuracy_table(comm, [784, 100, 10], (x, y), test, 1, lrs=(0.1,), masters=(1,))
        if rank == 0:
            worst = min(acc for w, m, lr, acc, *_ in rows if w == p - 1)
            measured("09-small-step", {"predicted_at_lr_01": "trains" if worst > 0.8 else "collapses"})


run_cases()
