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
from labkit import costmodel, data, param_server

RUNS = 5
comm = MPI.COMM_WORLD
rank, p = comm.Get_rank(), comm.Get_size()


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


@case("collapse: lr 0.6 with the most workers, one master (lab 09, section 5)")
def _():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (x, y), test = data.load_mnist(quiet=True)
    for _ in range(RUNS):
        rows = param_server.accuracy_table(comm, [784, 100, 10], (x[:10_000], y[:10_000]), test, 1, lrs=(0.6,),
                                           masters=(1,))
        if rank == 0:
            worst = min(acc for w, m, lr, acc, *_ in rows if w == p - 1)
            measured("09-collapse", {"predicted_at_lr_06": "trains" if worst > 0.8 else "collapses"})


run_cases()
