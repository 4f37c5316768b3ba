import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import uuid
import warnings
from pathlib import Path

import bylab
import labruns
import leaks
import pytest
import tiers

os.environ.setdefault("LABKIT_PROGRESS", "0")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parent.parent


def real_data_dir() -> Path | None:
    """The folder with the reference MNIST files, when the run has one (CI points LABKIT_DATA at it)."""
    from labkit import settings

    env = settings.data_dir()
    for cand in ([env] if env else []) + [ROOT / "data", ROOT.parent / "shared" / "data"]:
        if (cand / "mnist" / "train-labels-idx1-ubyte.gz").exists():
            return cand
    return None


@pytest.fixture(scope="session")
def data_dir():
    d = real_data_dir()
    if d is None:
        pytest.skip("no MNIST files here (set LABKIT_DATA to a folder holding mnist/ and fashion-mnist/)")
    return d


@pytest.fixture(scope="session")
def digits():
    """MNIST when available, else the subset shipped with labkit: ((x_train, y_train), (x_test, y_test))."""
    from labkit.data import SubsetDataWarning, load_mnist

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SubsetDataWarning)
        return load_mnist(root=real_data_dir())


@pytest.fixture(autouse=True)
def hints_start_over(monkeypatch):
    """Every test starts at an exercise's first hint, as a fresh kernel does: the count of failed runs is per process."""
    from labkit.check import common

    monkeypatch.setattr(common, "_failed_runs", {})


def edited(answer, k: int):
    """The same wrong answer as a student's k-th try at it, edited: for a hint to advance the answer must change
    (:func:`labkit.check.common.next_hint`). A source gets a macro of value k; a function is wrapped in one that
    closes over k."""
    import inspect

    if isinstance(answer, str):  # a comment would not do: comments, spaces and renames are the same answer
        return f"{answer}\n#define LABKIT_TRY {k}\n"

    def tried(*args, **kwargs):
        assert k is not None  # the closure over k makes each try another answer
        return answer(*args, **kwargs)

    try:
        tried.__signature__ = inspect.signature(answer)
    except (TypeError, ValueError):
        pass
    return tried


def record_check(monkeypatch, folder, name: str, answer, seed: int, **kwargs) -> tuple[bool, str]:
    """``check.<name>(answer, **kwargs)`` in record mode, as the grader runs a notebook (into ``folder``, on the inputs
    of ``seed``): (passed, the message the student saw)."""
    from labkit import check
    from labkit.check import capture

    monkeypatch.setenv(capture.ENV, str(folder))
    monkeypatch.setenv(capture.SEED_ENV, str(seed))
    try:
        getattr(check, name)(answer, **kwargs)
        return True, ""
    except check.ExerciseError as e:
        return False, f"ExerciseError: {e}"
    finally:
        monkeypatch.delenv(capture.ENV)
        monkeypatch.delenv(capture.SEED_ENV)


# ---- the contract every exercise keeps (tests/test_contract.py): each family's answers ----

def blank(*args, **kwargs):
    """A function not written yet, as a student version hands it out."""
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Wrong:
    """A wrong answer of the contract, where it needs more than itself: the pattern its message matches (each run,
    and as recorded) and the marks of the tests that run it (``needs_cc`` where it is compiled)."""
    answer: object
    says: str = ""
    marks: tuple = ()


@dataclasses.dataclass(frozen=True)
class Mistake:
    """A mistake an exercise's check names, in its family's ``MISTAKES`` table (exercise -> mistakes), which
    tests/test_contract.py walks: the answer that makes it, a pattern of what the diagnosis says of it, and a pattern
    of what its own hint speaks of (that mistake, not another), and the marks of the test that runs it. The check
    must give that hint alone, no step of the derivation."""
    answer: object
    says: str
    hint: str
    marks: tuple = ()


@dataclasses.dataclass(frozen=True)
class Reference:
    """labkit's own answer, as a student could hand it in: ``named`` is what the grader names it by (``labkit.mlp.
    output_error``, ``labkit/kernels/matmul.cu (matmul_naive)``); ``passes``: whether the check passes it, printing
    ``prints`` (by default the exercise's ✔ line)."""
    answer: object
    named: str
    passes: bool = True
    prints: str = ""


@dataclasses.dataclass(frozen=True)
class Answers:
    """One exercise's answers for its contract (tests/test_contract.py), in its family's ``CONTRACT`` table."""
    right: object                 # passes, printing ``passes``
    wrong: object                 # fails, with one more hint after each failed run of it changed (a Wrong, or itself)
    blank: object = blank         # "not written yet" without a hint: NotImplementedError, or the C/CUDA source stub
    passes: str = "✔"            # what the right answer's run prints
    replayed: object = None       # the wrong answer the replay records, where it is not ``wrong`` (a Wrong, or itself)
    references: tuple = ()        # labkit's own answers handed in (Reference), which the grader must catch
    marks: tuple = ()             # of the tests that run the right answer (needs_cc, needs_cxx, slow)
    one_rank: bool = False        # an MPI check, run here on one rank: given (and replayed on) MPI.COMM_SELF
    drawn: bool = True            # its inputs come from the grader's draw (capture.seed); False: the same on every draw

    def wrong_one(self, replayed: bool = False) -> Wrong:
        """The wrong answer of the hints (or of the replay) as a Wrong; a bare answer takes the exercise's marks."""
        w = self.replayed if replayed and self.replayed is not None else self.wrong
        return w if isinstance(w, Wrong) else Wrong(w, marks=self.marks)


@contextlib.contextmanager
def busy_loops(n: int):
    """``n`` other processes spinning on the cores for as long as the block runs: the other students' notebooks of a
    shared machine. Each is killed and waited for at the end, whatever the block raised."""
    spins = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(1, n))]
    try:
        yield
    finally:
        for spin in spins:
            spin.kill()
            spin.wait()


def run_mpi_cases(script: str, n: int, timeout: float = 300, only: str | None = None, hosts=None) -> str:
    """Run the named cases of tests/mpi/<script> under the real mpiexec on n ranks (``only``: those whose name holds
    it; ``hosts``: spread over these, see labkit.cluster.hosts); assert every case passed, and on failure say which case failed
    on which rank and why. Returns stdout."""
    from labkit import cluster

    args = [str(ROOT / "tests" / "mpi" / script)] + (["-k", only] if only else [])
    res = cluster.run_mpi(args, n=n, timeout=timeout, hosts=hosts)
    if res.returncode == 0 and f"OK {n} (" in res.stdout:
        return res.stdout
    failed = [ln for ln in res.stdout.splitlines() if ln.startswith("FAIL case")]
    started = [ln[5:] for ln in res.stdout.splitlines() if ln.startswith("case ")]
    head = (res.stdout[res.stdout.index(failed[0]):][:3000] if failed else
            f"{script} on {n} ranks ended (exit {res.returncode}) in case {started[-1]!r}" if started else
            f"{script} on {n} ranks ended (exit {res.returncode}) before its first case")
    pytest.fail(f"{head}\n--- stderr ---\n{res.stderr[-3000:]}", pytrace=False)


def ranks(*counts: int, smoke: int = 2) -> list:
    """Rank counts to parametrize an MPI test with: the run at ``smoke`` ranks is kept in ``make test-smoke``."""
    return [pytest.param(n, marks=pytest.mark.smoke) if n == smoke else n for n in counts]


def run_failing_mpi(tmp_path, source: str, n: int, within: float) -> str:
    """Run ``source`` as an MPI program on n ranks that must fail: assert it ended with an error within
    ``within`` seconds and left no process behind; return its stderr (where the failing rank's traceback is)."""
    import subprocess
    import time

    from labkit import cluster

    script = tmp_path / "failing_job.py"
    script.write_text(source)
    t0 = time.monotonic()
    res = cluster.run_mpi([str(script)], n=n, timeout=60)
    elapsed = time.monotonic() - t0
    assert res.returncode != 0, "the job should have failed"
    assert elapsed < within, f"the job took {elapsed:.1f} s to end (limit {within} s)"
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"
    return res.stderr


@functools.cache
def _have_cxx() -> bool:
    from labkit.kernels.emulator import EmulatorUnavailable, compiler

    try:
        compiler()
        return True
    except EmulatorUnavailable:
        return False


# the compile marker: the test is skipped, with the reason, where its compiler is missing
needs_cxx = pytest.mark.compile("c++")


@functools.cache
def _have_cc() -> bool:
    from labkit.hostc import CompilerMissing, compiler

    try:
        compiler()
        return True
    except CompilerMissing:
        return False


needs_cc = pytest.mark.compile("c")
COMPILERS = {"c++": (_have_cxx, "no C++ compiler here for the CUDA emulator (apt install g++)"),
             "c": (_have_cc, "no C compiler here for labkit.hostc (apt install gcc)")}


# ---- the tiers (see tests/tiers.py) and the leak checks (tests/leaks.py) ----

def pytest_collection_modifyitems(items):
    for item in items:
        marks = {m for name in tiers.used_names(item) for m in tiers.USES.get(name, ())}
        for mark in sorted(marks - {m.name for m in item.iter_markers()}):
            item.add_marker(mark)
    bylab.mark(items)  # pytest -m lab07: every test of lab 07 (tests/bylab.py)


def pytest_collection_finish(session):
    _lab_names.update(item.callspec.params["path"].name for item in session.items  # the selected tests' notebooks
                      if "lab_runs" in getattr(item, "fixturenames", ()) and hasattr(item, "callspec")
                      and "path" in item.callspec.params)


_lab_names: set[str] = set()


@pytest.fixture(scope="session")
def lab_runs(tmp_path_factory):
    """Each selected lab notebook graded once per version (instructor's, student's) in this run (tests/labruns.py)."""
    return labruns.LabRuns(tmp_path_factory.mktemp("lab-runs"), _lab_names)


def pytest_runtest_setup(item):
    for mark in item.iter_markers("compile"):
        if mark.args and not COMPILERS[mark.args[0]][0]():  # a bare compile marker names no compiler it needs
            pytest.skip(COMPILERS[mark.args[0]][1])


_running: dict = {"item": None, "teardown": False}
_started: dict = {}  # item nodeid -> [(program, missing markers)]
_made: set[str] = set()  # the network namespaces and links this run made (tests/leaks.py)
LEFT = pytest.StashKey[dict]()  # what the leak check found, for the summary
_POPEN_INIT = subprocess.Popen.__init__


def _guarded_init(original):
    def __init__(self, args, *rest, **kwargs):
        if made := leaks.made_by(args):
            _made.add(made)
        item = _running["item"]
        if item is not None and not _running["teardown"]:  # a module's fixtures stop in any test's teardown
            missing = tiers.kinds_of(args) - {m.name for m in item.iter_markers()}
            if missing:
                shown = args if isinstance(args, str) else " ".join(map(str, args))
                _started.setdefault(item.nodeid, []).append((shown[:200], sorted(missing)))
        original(self, args, *rest, **kwargs)
    return __init__


def pytest_addoption(parser):
    parser.addoption("--tier-audit", metavar="FILE", default=None,
                     help="write the programs each test starts beyond its markers to FILE (JSON lines) instead of failing")


def pytest_configure(config):
    bylab.register(config)
    subprocess.Popen.__init__ = _guarded_init(_POPEN_INIT)
    os.environ[leaks.RUN] = uuid.uuid4().hex  # this run's mark on everything it starts (tests/leaks.py)
    _running["tmp"] = leaks.own_tempdir(os.environ[leaks.RUN])  # and its temporary folders, apart from another job's
    _running["audit"] = config.getoption("--tier-audit")


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _POPEN_INIT
    if _running.get("tmp"):  # nothing of the run's stays on the machine
        leaks.remove_own_tempdir(_running["tmp"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.update(item=item, teardown=False)
    try:
        return (yield)
    finally:
        _running["item"] = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    _running["teardown"] = True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    started = _started.pop(item.nodeid, None) if call.when in ("setup", "call") else None
    if started and _running.get("audit"):
        with open(_running["audit"], "a") as out:
            out.write(json.dumps({"test": item.nodeid, "started": started}) + "\n")
    elif started and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(
            ["this test started programs its markers do not allow (make test-fast would run it):"] +
            [f"  {prog}  -> mark it {', '.join(missing)}" for prog, missing in started] +
            ["(add the marker, or use a conftest helper that brings it; see tests/tiers.py)"])
    return report


def pytest_sessionfinish(session, exitstatus):
    found = leaks.left_behind(_made)
    session.config.stash[LEFT] = found
    if found and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    found = config.stash.get(LEFT, {})
    if found:
        terminalreporter.section("left behind by the tests", red=True)
        for kind, items in found.items():
            terminalreporter.line(f"{kind}:", red=True)
            for it in items:
                terminalreporter.line(f"  {it}")

