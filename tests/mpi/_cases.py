"""Named cases for the MPI test programs (run as scripts, so this folder is on sys.path).

A program registers its cases with ``@case("name")`` and ends with ``run_cases()``; a case that needs more ranks
(or fewer) is registered inside ``with on_ranks(3):`` (at least 3) or ``with on_ranks(2, 2):`` (exactly 2), and is
left out on the others. Every rank runs every case in order; after each one the ranks share whether it passed (one
allgather), so every rank agrees on each case's verdict.

Run by hand (``mpiexec -n 3 python -m mpi4py tests/mpi/cases_x.py [-k WORD]``), the first failure stops every rank
at the same case, and rank 0 prints which case failed on which ranks and why (``FAIL case 'ring allreduce' on
rank 2: ...``), ``case NAME`` before each case (so a case that never returns, a deadlock, is the last one named
before the job's time limit) and ``OK <ranks> (<n> cases)`` at the end.

Under pytest (tests/mpicases.py), each case at each rank count is a test of its own: ``--only FILE`` names the cases
to run (a JSON list), ``--report FILE`` is where rank 0 writes each case's start and verdict as a JSON line while it
runs, and a failed case does not stop the cases after it. ``list_cases(files)`` lists each program's cases and the
ranks they run on, without MPI jobs.
"""

import contextlib
import io
import json
import runpy
import sys
import traceback
from pathlib import Path

from mpi4py import MPI

_CASES: list[tuple[str, object, dict]] = []
_RANKS = [(1, None)]  # the ranks the cases registered now run on: (at least, at most)


class _Listed(Exception):
    """Raised by run_cases() while the cases are only being listed."""


_LISTING = False


@contextlib.contextmanager
def on_ranks(least: int, most: int | None = None):
    """The cases registered inside run on ``least`` to ``most`` ranks (no upper bound by default), and are left out
    on other rank counts."""
    _RANKS.append((least, most))
    try:
        yield
    finally:
        _RANKS.pop()


PASSED = "on 1 to {p} ranks: all"  # what an MPI exercise check prints when it passes on every rank count


def case(name: str, prints: str = ""):
    """Register the decorated function as the case ``name`` (run in the order registered). ``prints``: what rank 0
    must print during the case (``{p}`` stands for the number of ranks), such as a check's ✔ line."""
    def register(fn):
        if any(n == name for n, _, _ in _CASES):
            raise ValueError(f"two cases are called {name!r}")
        least, most = _RANKS[-1]
        _CASES.append((name, fn, {"least": least, "most": most, "prints": prints}))
        return fn
    return register


def runs_on(spec: dict, p: int) -> bool:
    return spec["least"] <= p and (spec["most"] is None or p <= spec["most"])


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


class _Tee(io.StringIO):
    """What a case prints, kept for its verdict and, when run by hand, printed as it comes."""

    def __init__(self, through):
        super().__init__()
        self.through = through

    def write(self, text):
        if self.through is not None:
            self.through.write(text)
        return super().write(text)

    def flush(self):
        if self.through is not None:
            self.through.flush()


def _run_one(fn, spec: dict, rank: int, p: int, by_hand: bool) -> tuple[str | None, str]:
    """Run one case on this rank: (its error's traceback or None, what it printed)."""
    out = _Tee(sys.stdout if by_hand else None)
    try:
        with contextlib.redirect_stdout(out):
            fn()
        want = spec["prints"].format(p=p)
        if want and rank == 0 and want not in out.getvalue():
            raise AssertionError(f"rank 0 should have printed {want!r}; it printed {out.getvalue()[-800:]!r}")
        return None, out.getvalue()
    except Exception:  # noqa: BLE001 - every failure is reported with its case
        return traceback.format_exc(limit=-3), out.getvalue()


def _option(flag: str) -> str | None:
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv[:-1] else None


def _chosen(p: int) -> list:
    """The registered cases this run runs: those for ``p`` ranks that ``--only`` lists, or whose name holds ``-k``'s
    word."""
    here = [c for c in _CASES if runs_on(c[2], p)]
    only, word = _option("--only"), _option("-k")
    if only is not None:
        names = set(json.loads(open(only).read()))
        return [c for c in here if c[0] in names]
    chosen = [c for c in here if word is None or word in c[0]]
    if not chosen:
        raise SystemExit(f"no case matches {word!r} on {p} ranks; cases: {', '.join(c[0] for c in here)}")
    return chosen


def run_cases(comm=None) -> None:
    """Run the registered cases (see the module's text); by hand, rank 0 ends with ``OK <ranks> (<n> cases)``."""
    if _LISTING:
        raise _Listed
    comm = comm or MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    report = _option("--report")
    log = open(report, "a", buffering=1) if report and rank == 0 else None  # noqa: SIM115 - open for the whole run
    chosen, failed = _chosen(p), 0
    for name, fn, spec in chosen:
        if rank == 0:
            print(f"case {name}", flush=True)
            if log:
                log.write(json.dumps({"start": name}) + "\n")
        error, printed = _run_one(fn, spec, rank, p, by_hand=report is None)
        errors = comm.allgather(error)
        bad = [r for r, e in enumerate(errors) if e]
        if log:
            log.write(json.dumps({"case": name, "failed_on": bad, "error": errors[bad[0]] if bad else None,
                                  "printed": printed[-4000:]}) + "\n")
        if bad:
            failed += 1
            if rank == 0:
                print(f"FAIL case {name!r} on rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}:\n"
                      f"{errors[bad[0]]}", flush=True)
            if report is None:
                sys.exit(1)
    comm.Barrier()
    if rank == 0:
        print(f"OK {p} ({len(chosen)} cases)" if not failed else f"FAILED {failed} of {len(chosen)} cases", flush=True)
    if failed:
        sys.exit(1)


def list_cases(files: list[str]) -> dict[str, list[dict] | str]:
    """Each program's cases, by its file name: [{"name", "least", "most"}], in the order they run; for a program that
    cannot be listed (it needs CuPy, say), the error. The programs run as far as their ``run_cases()``, on one rank
    (MPI's singleton), which they leave at once."""
    global _LISTING
    _LISTING, found = True, {}
    for path in files:
        _CASES.clear()
        try:
            runpy.run_path(path, run_name="__main__")
        except _Listed:
            pass
        except BaseException:  # noqa: BLE001 - said in the listing, for the test that asks for this program
            found[Path(path).name] = traceback.format_exc(limit=-2)
            continue
        found[Path(path).name] = [{"name": n, "least": s["least"], "most": s["most"]} for n, _, s in _CASES]
    return found


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
