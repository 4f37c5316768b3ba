"""The "mpi" clock gives every rank the slowest rank's time; timelines gather every rank's phases.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_bench.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import time

import numpy as np
from _cases import case, run_cases
from mpi4py import MPI

from labkit import bench, mlp
from labkit.data_parallel import DataParallel

comm = MPI.COMM_WORLD
rank, p = comm.Get_rank(), comm.Get_size()


def uneven():
    time.sleep(0.02 * (rank + 1))  # the last rank is the slowest


@case("the mpi clock gives every rank the slowest rank's time")
def _():
    t = bench.measure(uneven, repeat=3, warmup=0, clock="mpi", comm=comm)
    everyone = comm.allgather(t.times)
    assert all(times == everyone[0] for times in everyone), everyone  # the same times on every rank
    assert min(t.times) >= 0.02 * p, (t.times, p)  # at least the slowest rank's sleep
    assert max(t.times) < 0.02 * p + 0.5, t.times
    with bench.timer("mpi", comm) as el:
        uneven()
    assert el.seconds >= 0.02 * p and comm.allgather(el.seconds) == [el.seconds] * p


@case("a timeline of data-parallel steps, gathered on rank 0")
def _():
    tl = bench.Timeline(rank)
    rng = np.random.default_rng(0)
    x, y = rng.random((40, 12)), rng.integers(0, 4, 40)
    params = mlp.init_params([12, 8, 4], seed=0, dtype=np.float64)
    dp = DataParallel(comm, allreduce="ring")
    dp.timeline = tl
    comm.Barrier()
    tl.reset()
    for _ in range(2):
        with tl.phase("step", "compute"):
            dp(params, x, y)
    events = tl.gather(comm)
    if rank == 0:
        assert len(events) == 3 * 2 * p, len(events)
        assert sorted({e["rank"] for e in events}) == list(range(p))
        names = {e["name"] for e in events}
        assert names == {"step", "backprop", "allreduce (ring)"}, names
        assert all(0 <= e["start"] <= e["end"] for e in events)
        trace = bench.chrome_trace(events)
        assert sum(ev["ph"] == "X" for ev in trace["traceEvents"]) == len(events)
    else:
        assert events is None
    assert set(tl.totals()) == {"compute", "comm"}


run_cases(comm)
