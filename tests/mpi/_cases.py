"""Named cases for the MPI test programs (run as scripts, so this folder is on sys.path).

A program registers its cases with ``@case("name")`` and ends with ``run_cases()``. Every rank runs every case in
order; after each one the ranks share whether it passed (one allgather), so a failure stops every rank at the
same case, and rank 0 prints which case failed on which ranks and why (``FAIL case 'ring allreduce' on rank 2:
...``). Rank 0 prints ``case NAME`` before each case, so a case that never returns (a deadlock) is the last one
named before the job's time limit. ``program.py -k WORD`` runs only the cases whose name contains WORD.
"""

import sys
import traceback

from mpi4py import MPI

_CASES: list[tuple[str, object]] = []


def case(name: str):
    """Register the decorated function as the case ``name`` (run in the order registered)."""
    def register(fn):
        if any(n == name for n, _ in _CASES):
            raise ValueError(f"two cases are called {name!r}")
        _CASES.append((name, fn))
        return fn
    return register


def refused(call, error, *words: str) -> BaseException:
    """``call()`` must raise ``error`` (a class or tuple) whose message holds every one of ``words``; returns it."""
    try:
        call()
    except error as e:
        for w in words:
            assert w in str(e), f"expected {w!r} in: {e}"
        return e
    raise AssertionError(f"expected {error} saying {words!r}")


def mistake(name: str, run_check, fn, *needles: str) -> None:
    """The case ``name``: ``run_check(fn)`` (an exercise check) must fail a student's wrong ``fn`` with one
    ExerciseError, on rank 0, whose message holds every one of ``needles``; the other ranks return quietly, so a
    ``%%px`` cell shows the student one message."""
    from labkit.check import ExerciseError

    @case(name)
    def _():
        rank = MPI.COMM_WORLD.Get_rank()
        try:
            run_check(fn)
        except ExerciseError as e:
            assert rank == 0, f"rank {rank} raised too ({e}): the student should see one message, rank 0's"
            for needle in needles:
                assert needle in str(e), (needle, str(e))
            return
        assert rank != 0, f"the check passed a wrong function; expected {needles}"


def run_cases(comm=None) -> None:
    """Run the registered cases (those matching ``-k WORD`` when given); rank 0 ends with ``OK <ranks>``."""
    comm = comm or MPI.COMM_WORLD
    rank = comm.Get_rank()
    word = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv[:-1] else None
    chosen = [(n, fn) for n, fn in _CASES if word is None or word in n]
    if not chosen:
        raise SystemExit(f"no case matches {word!r}; cases: {', '.join(n for n, _ in _CASES)}")
    for name, fn in chosen:
        if rank == 0:
            print(f"case {name}", flush=True)
        try:
            fn()
            error = None
        except Exception:  # noqa: BLE001 - every failure is reported with its case
            error = traceback.format_exc(limit=-3)
        errors = comm.allgather(error)
        bad = [r for r, e in enumerate(errors) if e]
        if bad:
            if rank == 0:
                print(f"FAIL case {name!r} on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}:\n"
                      f"{errors[bad[0]]}", flush=True)
            sys.exit(1)
    comm.Barrier()
    if rank == 0:
        print(f"OK {comm.Get_size()} ({len(chosen)} cases)", flush=True)


def record_and_replay(name, fn, seed=4242):
    """Run check ``name`` on ``fn`` recording (as in a graded notebook), replay it on the record (as the grader does,
    here on the same ranks): (the student's verdict, the grader's, the grader's on another draw of the inputs),
    without the step of the hints."""
    import os
    import re
    import shutil
    import tempfile

    from labkit import check
    from labkit.check import ExerciseError, capture
    from labkit.grading import replay

    comm = MPI.COMM_WORLD
    folder = comm.bcast(tempfile.mkdtemp(prefix="labkit-replay-") if comm.Get_rank() == 0 else None)
    os.environ[capture.ENV], os.environ[capture.SEED_ENV] = folder, str(seed)
    try:
        getattr(check, name)(fn, timeout=3)
        plain = (True, "")
    except ExerciseError as e:
        plain = (False, f"ExerciseError: {e}")
    finally:
        del os.environ[capture.ENV], os.environ[capture.SEED_ENV]
    comm.Barrier()  # every rank's record written, as before the grader starts
    graded = replay.replay(name, folder, seed, comm)
    other_draw = replay.replay(name, folder, seed + 1, comm)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(folder)
    strip = lambda verdict: (verdict[0], re.sub(r"\nStep \d+ of \d+.*", "", verdict[1], flags=re.S))  # noqa: E731
    return strip(plain), strip(graded), other_draw
