"""The run of one notebook for grading: executed once in its sandbox, each check cell's record moved out of its reach,
each check replayed on its record in the grader's processes, and a verdict for every exercise.

An exercise is a code cell that calls ``check.<name>(...)`` for a name declared in :mod:`labkit.check.exercises`.
Its verdict is the check's, replayed on what the student's function returned (never the cell's own success, which
the student's code could fake); a cell that ran past its limit, a kernel that died and an earlier cell that failed
are named in the message.

A cell's limit is its work, not the clock: ``timeout`` CPU-seconds over all the notebook's processes (its kernel, its
MPI engines), which a busy machine does not use up faster. A cell that does no work and does not end (a deadlock, a
sleep) is stopped by the clock, after :func:`hang_limit` seconds, with room to spare. The message says which.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..check import capture
from ..check.capture import HIDDEN
from ..check.exercises import exercise
from ..cluster import run_mpi
from ..runner import ANSI_ESCAPES, inject_parameters
from . import audit, replay, sandbox
from .assign import exercises_in
from .sandbox import Limits


@dataclass
class ExerciseResult:
    student: str
    notebook: str
    exercise: str
    passed: bool
    message: str
    points: float = 1.0  # what the row is worth (:mod:`.scores`); it scores them when passed
    cases: tuple[int, int] | None = None  # (cases passed, cases) of the check's replay; None where it counts none
    score: float | None = None  # what it scores (:mod:`.scores`): its points when passed, a share of them with partial
                                # credit per case, else 0
    performance: dict | None = None  # an open exercise's passing answer: what it scored beside its verdict (a modelled
                                     # time, say: :class:`labkit.check.common.Score` as JSON), which the class ranks


def hang_limit(timeout: int) -> int:
    """Wall-clock seconds a cell may run, however little work it does, under a limit of ``timeout`` CPU-seconds: three
    times that and half a minute, so that a machine whose cores are shared never trips it for honest work."""
    return 3 * timeout + 30


def _outcome(cell, timeout: int) -> tuple[bool, str]:
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return False, "not run (the notebook stopped before this cell)"
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            if out.get("ename") == "KeyboardInterrupt":
                return False, "stopped by an interrupt (KeyboardInterrupt)"
            if out.get("ename") in ENGINE_ERRORS:  # a %%px cell: the engines' own errors were printed above
                found = _engine_error(cell)
                if found:
                    return False, found
            first = ANSI_ESCAPES.sub("", str(out.get("evalue", ""))).strip().splitlines()
            return False, f"{out.get('ename')}: {first[0] if first else ''}".strip()
    return True, "passed"


INLINE_BACKEND = "module://matplotlib_inline.backend_inline"  # matplotlib's backend for the graded kernels
ENGINE_ERRORS = ("AlreadyDisplayedError", "CompositeError", "RemoteError")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.*)$")


def _engine_error(cell) -> str | None:
    """The exception line that the MPI engines printed for a ``%%px`` cell that says most (rank 0's ExerciseError)."""
    lines = []
    for out in cell.get("outputs", []):
        text = out.get("text", "") if out.get("output_type") == "stream" else ""
        lines += ANSI_ESCAPES.sub("", text).splitlines()
    found = [m for m in map(_EXCEPTION_LINE.match, (ln.strip() for ln in lines)) if m]
    if not found:
        return None
    # an ExerciseError first, and of those rank 0's (the other ranks say only that rank 0 shows what went wrong)
    best = min(found, key=lambda m: (not m.group(1).endswith("ExerciseError"), "rank 0 shows" in m.group(2)))
    return f"{best.group(1).rsplit('.', 1)[-1]}: {best.group(2)} (on the MPI engines)"


def _released_checks(nb, released: dict) -> tuple[list[tuple[int, str]], dict[str, str]]:
    """The released exercises found in a submission by their check cells' ids, each check cell put back as it was
    handed out; and, per exercise, what was wrong with its cell (missing, turned into markdown, edited)."""
    by_id = {c.get("id"): i for i, c in enumerate(nb.cells)}
    found, problems = [], {}
    for ex in released["exercises"]:
        i = by_id.get(ex["check_cell_id"])
        if i is None:
            problems[ex["name"]] = "its check cell is missing from the notebook (deleted?)"
            continue
        cell = nb.cells[i]
        if cell.cell_type != "code":
            problems[ex["name"]] = f"its check cell was turned into a {cell.cell_type} cell"
            continue
        if cell.source != ex["check_source"]:
            problems[ex["name"]] = "its check cell was edited (the cell as handed out was run instead)"
            cell.source = ex["check_source"]
        found.append((i, ex["name"]))
    return found, problems


Verdict = tuple[bool, str, tuple[int, int] | None, dict | None]  # (passed, message, cases, performance)


def _replay(check_name: str, folder: Path, seed: int, timeout: int) -> Verdict:
    """The check's verdict on the record, in the grader's processes: here, or for MPI ranks under mpiexec; with its
    (cases passed, cases), None where it counts none, and what a passing answer scored, None where it scored nothing."""
    files = capture.records(folder, check_name)
    declared = exercise(check_name)
    if len(files) <= 1 and not (declared and declared.mpi):
        return replay.verdict(check_name, folder, seed)
    if capture.recorded_reference(folder, check_name):
        return replay.verdict(check_name, folder, seed)  # says which reference, without starting ranks
    try:
        done = run_mpi(["-m", "labkit.grading.replay", check_name, str(folder), str(seed), "--mpi"], n=max(1, len(files)),
                       timeout=max(60, 2 * timeout))
    except subprocess.TimeoutExpired:
        return (False, f"{check_name}: replaying the record on {len(files)} ranks ran past {max(60, 2 * timeout)} s",
                None, None)
    for line in reversed(done.stdout.strip().splitlines()):
        try:
            return _read_verdict(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return False, f"{check_name}: replaying the record failed: {(done.stderr or done.stdout).strip()[-300:]}", None, None


def _read_verdict(verdict: dict) -> Verdict:
    """The verdict line of ``python -m labkit.grading.replay``, read back: a score only with a pass."""
    cases, score = verdict.get("cases"), verdict.get("score")
    passed = bool(verdict["passed"])
    return passed, str(verdict["message"]), tuple(cases) if cases else None, dict(score) if score and passed else None


def _earlier_error(nb, index: int) -> str | None:
    """The first error of a code cell above ``index``: why a name the check needs was never defined."""
    for j, cell in enumerate(nb.cells[:index]):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if out.get("output_type") == "error" and out.get("ename") != "KeyboardInterrupt":
                first = ANSI_ESCAPES.sub("", str(out.get("evalue", ""))).strip().splitlines()
                return f"an earlier cell (cell {j}) failed: {out.get('ename')}: {first[0] if first else ''}".strip()
    return None


def _verdict(cell, check_name: str, folder: Path, seed: int, timeout: int, stopped: str | None,
             earlier: str | None = None) -> Verdict:
    """One exercise: stopped or not run as the notebook says; otherwise what the check says on the record (and its
    cases passed, of how many, and what a passing answer scored)."""
    ran, message = _outcome(cell, timeout)
    if stopped and not ran and message.startswith("not run"):
        return False, stopped, None, None
    if not ran and (message.startswith("not run") or message.startswith("stopped after")):
        return False, message, None, None
    if not capture.records(folder, check_name):
        if not ran:
            return False, message + (f"; {earlier}" if earlier and "NameError" in message else ""), None, None
        return False, ("the check cell ran but recorded nothing of your function (was labkit's check replaced or "
                       "its call changed?)"), None, None
    passed, message, cases, performance = _replay(check_name, folder, seed, timeout)
    return passed, "passed" if passed else message, cases, performance


class NotebookRun:
    """One student's notebook, run once from top to bottom in its sandbox, then graded exercise by exercise.

    :meth:`execute` runs it; the two cell hooks move what each check cell recorded out of the notebook's reach as
    soon as the cell ends; a watchdog kills the kernel of a cell that ignores the interrupt; :meth:`verdicts`
    replays each check on its record; :meth:`results` gives every exercise its row; :meth:`escapes` lists what its
    sandbox contained (:mod:`.audit`); :meth:`close` removes the sandbox's cgroup and folders."""

    def __init__(self, path: Path, timeout: int = 60, profile: str = "quick", released: dict | None = None,
                 threads: int | None = None, isolate: bool | None = None, limits: Limits | None = None,
                 hidden_parts: frozenset[str] = frozenset()):
        import nbformat

        self.path, self.timeout, self.released, self.threads = Path(path), timeout, released, threads
        self.nb = nbformat.read(path, as_version=4)
        inject_parameters(self.nb, {"PROFILE": profile})
        self.exercises, self.problems = (_released_checks(self.nb, released) if released
                                         else (exercises_in(self.nb), {}))
        self.by_cell: dict[int, list[str]] = {}
        for i, name in self.exercises:
            self.by_cell.setdefault(i, []).append(name)
        self.seed = secrets.randbelow(1_000_000) + 1  # the checks' inputs, drawn afresh for this run
        self.hidden_parts = frozenset(hidden_parts)  # exercises checked a second time, on inputs drawn apart
        self.hidden_seed = secrets.randbelow(1_000_000) + 1_000_001
        self.cases: dict[str, tuple[int, int] | None] = {}  # per row, its replay's (cases passed, cases)
        self.performances: dict[str, dict | None] = {}  # per row, what its replay's passing answer scored
        self.isolate = sandbox.available()[0] if isolate is None else isolate
        self.limits = limits or Limits()
        self.private = Path(tempfile.mkdtemp(prefix="labkit-grader-"))  # the grader's alone: records, kernel spec
        # without bubblewrap's namespaces: a user of its own, whose every process is killed when the notebook ends
        self.uid = sandbox.claim_uid() if self.isolate and sandbox.kind() == "user" else None
        self.work = Path(tempfile.mkdtemp(prefix="labkit-sandbox-", dir=sandbox.scratch_parent() if self.uid else None))
        self.inbox = self.work / ".labkit-capture"  # where the check cells record, within the notebook's reach
        self.cgroups = sandbox.make_cgroup(self.limits) if self.isolate else []
        self.client = None
        self.cell, self.t0, self.killed = None, 0.0, None  # the cell running, since when; the cell killed
        self.cpu0, self.interrupted_at = 0.0, None  # the notebook's CPU-seconds when the cell began; (cell, when)
        self.lock = threading.Lock()  # between nbclient's callbacks and the watchdog
        self.hang = hang_limit(timeout)
        self.limit_hit: dict[int, str] = {}  # cell -> which limit stopped it, in words
        self.timed_out: set[int] = set()  # cells that ran to their limit (a %%px cell's interrupt raises nothing)
        self.engines_stopped: int | None = None  # the cell after which the MPI engines were killed

    # -- while the notebook runs ------------------------------------------------------------------------------------

    def cell_started(self, cell, cell_index, **kw) -> None:
        if cell_index in self.by_cell:  # what earlier cells recorded never counts
            shutil.rmtree(self.inbox, ignore_errors=True)
            self.inbox.mkdir()
            if self.uid is not None:  # a user of its own records into it
                os.chown(self.inbox, self.uid, self.uid)
        cpu0 = self.cpu_seconds()
        with self.lock:
            self.cpu0, self.cell, self.t0 = cpu0, cell_index, time.monotonic()

    def cell_executed(self, cell, cell_index, **kw) -> None:
        """Right after a check cell: its records go where the notebook cannot reach them."""
        with self.lock:
            if _interrupted(cell) and cell_index not in self.limit_hit and time.monotonic() - self.t0 >= self.hang:
                self.limit_hit[cell_index] = self._hang_words(self.cpu_seconds() - self.cpu0)  # nbclient's interrupt
            self.cell = None
        if cell_index in self.limit_hit and _interrupted(cell):
            self.timed_out.add(cell_index)
            if self.engines_stopped is None and _engine_cell(cell):
                self.engines_stopped = cell_index
                self.stop_engines()
        for name in self.by_cell.get(cell_index, []):
            check_name = name.split("#")[0]
            for row in rows_of(name, self.hidden_parts):  # a hidden part's records lose their tag: the check replays
                tag = row[len(name):]                      # them as its own
                target = self.private / "records" / row
                target.mkdir(parents=True, exist_ok=True)
                for f in [*self.inbox.glob(f"{check_name}{tag}.r*.json"), *self.inbox.glob(f"{check_name}{tag}.r*.npz")]:
                    if f.is_file() and not f.is_symlink() and f.stat().st_size <= RECORD_LIMIT:
                        shutil.copyfile(f, target / f.name.replace(tag, "", 1) if tag else target / f.name)
        shutil.rmtree(self.inbox, ignore_errors=True)

    def _env(self) -> dict:
        # the inline backend, not Agg: the run's figures stay in its outputs, for the feedback pages
        env = {**os.environ, "MPLBACKEND": INLINE_BACKEND, "LABKIT_PROGRESS": "0", capture.ENV: str(self.inbox),
               capture.SEED_ENV: str(self.seed)}
        if self.hidden_parts:
            env.update({capture.HIDDEN_ENV: ",".join(sorted(self.hidden_parts)),
                        capture.HIDDEN_SEED_ENV: str(self.hidden_seed)})
        if self.threads:  # several notebooks at once: each kernel's BLAS and OpenMP get their share of the cores
            env.update({k: str(self.threads) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
        return env

    def _client(self, env: dict):
        from nbclient import NotebookClient

        options = dict(timeout=self.hang, allow_errors=True, interrupt_on_timeout=True,
                       extra_arguments=["--IPKernelApp.log_level=ERROR"], on_cell_start=self.cell_started,
                       on_cell_executed=self.cell_executed)
        if self.isolate:
            km = _sandboxed_kernel(self.work, self.private, self.limits, self.cgroups,
                                   sandbox.environment(self.work, env), self.uid)
            return NotebookClient(self.nb, km=km, resources={"metadata": {"path": str(self.work)}}, **options)
        return NotebookClient(self.nb, kernel_name="python3", resources={"metadata": {"path": str(self.path.parent)}},
                              **options)

    def kill(self) -> None:
        """Kill the kernel and everything it started (its cgroup and its user, else its process group)."""
        sandbox.kill_cgroup(self.cgroups)
        sandbox.kill_user(self.uid)
        km = self.client.km if self.client is not None else None
        proc = getattr(getattr(km, "provisioner", None), "process", None) if km else None
        if proc is not None and proc.poll() is None:
            try:
                pgid = os.getpgid(proc.pid)
                os.killpg(pgid, signal.SIGKILL) if pgid != os.getpgid(0) else proc.kill()
            except OSError:
                pass

    def stop_engines(self) -> list[int]:
        """Kill the notebook's MPI engines and their mpiexec, leaving its kernel: after a cell that ran on them was
        stopped at its limit, they may be blocked inside an MPI call (a collective that some ranks never join), where
        no interrupt reaches; every later cell on them would wait its whole limit. Returns the pids killed."""
        km = self.client.km if self.client is not None else None
        kernel = getattr(getattr(getattr(km, "provisioner", None), "process", None), "pid", None)
        pids = (sandbox.cgroup_pids(self.cgroups) if self.cgroups else sandbox.user_pids(self.uid) if self.uid
                else _descendants(kernel) if kernel else set())
        killed = []
        for pid in sorted(pids):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(ENGINE_PROGRAM.search(a.decode(errors="replace")) for a in argv[:4]):
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except OSError:
                    pass
        return killed

    def _kernel_process(self):
        km = self.client.km if self.client is not None else None
        return getattr(getattr(km, "provisioner", None), "process", None) if km else None

    def cpu_seconds(self) -> float:
        """The CPU-seconds the notebook's processes have used: its cgroup's count where it keeps one (cgroup v2), else
        the sum over its processes (its cgroup's, its user's, or its kernel's process tree) of their own and their
        reaped children's."""
        for d in self.cgroups:
            try:
                usage = dict(line.split() for line in (d / "cpu.stat").read_text().splitlines())["usage_usec"]
                return int(usage) / 1e6
            except (OSError, KeyError, ValueError):
                continue
        return sum(_cpu_of(pid) for pid in self._processes())

    def _hang_words(self, used: float) -> str:
        return (f"stopped after {self.hang} s without finishing, having done {max(0.0, used):.1f} CPU-seconds of work: "
                "the limit for a cell that waits (a deadlock, or a wait that never ends?)")

    def _limit_words(self, cell: int) -> str:
        hit = self.limit_hit.get(cell, "")
        return f"was {hit}" if hit else "ran past its limit"

    def _processes(self) -> set[int]:
        """The notebook's processes: its cgroup's, its user's, or its kernel's process tree."""
        proc = self._kernel_process()
        return (sandbox.cgroup_pids(self.cgroups) if self.cgroups else
                sandbox.user_pids(self.uid) if self.uid is not None else
                {proc.pid} | _descendants(proc.pid) if proc is not None else set())

    def _interrupt(self) -> None:
        """SIGINT to the kernel's Python itself, inside its sandbox, as its own interrupt request does: while a cell
        runs it raises KeyboardInterrupt there (a %%px cell passes it on to the engines)."""
        for pid in self._processes():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"ipykernel_launcher" in argv and b"python" in Path(argv[0].decode(errors="replace")).name.encode():
                    os.kill(pid, signal.SIGINT)
            except (OSError, IndexError):
                continue

    def _watch(self, finished) -> None:
        """From outside the kernel: a cell over its CPU-seconds is interrupted (nbclient interrupts one over the hang
        limit); a cell still running GRACE seconds after its interrupt is killed with its kernel."""
        while not finished.wait(0.25):
            with self.lock:
                cell, t0, cpu0, hit = self.cell, self.t0, self.cpu0, self.interrupted_at
            if cell is None:
                continue
            now = time.monotonic()
            if hit is not None and hit[0] == cell:
                late = now - hit[1] > GRACE
            else:
                used = self.cpu_seconds() - cpu0
                with self.lock:
                    if self.cell != cell:  # it ended meanwhile
                        continue
                    if used > self.timeout:
                        self.limit_hit[cell] = (f"stopped after {self.timeout} CPU-seconds of work, the limit per "
                                                "cell (an endless loop, or far too slow?)")
                        self.interrupted_at = (cell, now)
                        self._interrupt()
                    elif now - t0 > self.hang + GRACE:  # deaf to nbclient's interrupt at the hang limit
                        self.limit_hit[cell] = self._hang_words(used)
                late = now - t0 > self.hang + GRACE
            if late and self.cell == cell:
                self.killed = cell
                self.kill()
                return

    def execute(self) -> str | None:
        """Run the notebook under the watchdog; why it stopped early, or None when it ran to its end."""

        env = self._env()
        self.client = self._client(env)
        finished = threading.Event()
        guard = threading.Thread(target=self._watch, args=(finished,), daemon=True, name="labkit-grade-watchdog")
        guard.start()
        stopped = None
        try:
            self.client.execute(env=env)
        except Exception as e:  # the kernel died (a crash in compiled code, memory, the watchdog): cells not reached fail
            stopped = f"the notebook's kernel stopped: {type(e).__name__}: {ANSI_ESCAPES.sub('', str(e)).strip()[:300]}"
        finally:
            finished.set()
            guard.join()
            sandbox.kill_user(self.uid)  # what it left running (a detached writer) ends before anything is written
        if self.killed is not None:
            return (f"not run: cell {self.killed} {self._limit_words(self.killed)} and did not stop when interrupted, "
                    "so the kernel and everything it started were killed")
        if self.cgroups and sandbox.oom_killed(self.cgroups):
            return f"the notebook went over its memory limit ({self.limits.memory_mb} MB) and its kernel was killed"
        return stopped

    # -- after it -----------------------------------------------------------------------------------------------------

    def verdicts(self, stopped: str | None) -> dict[str, tuple[bool, str]]:
        """Each exercise's (passed, message): the check replayed on its record, or why there is none."""
        forks = bool(self.cgroups) and sandbox.hit_process_limit(self.cgroups)
        outcomes = {}
        for i, name in self.exercises:
            for row in rows_of(name, self.hidden_parts):
                outcomes[row] = self._verdict(i, name, row, self.seed if row == name else self.hidden_seed, stopped,
                                              forks)
        return outcomes

    def _verdict(self, i: int, name: str, row: str, seed: int, stopped: str | None, forks: bool) -> tuple[bool, str]:
        """The (passed, message) of check cell ``i``'s exercise ``name``: its row ``row`` (the public verdict, or
        ``name~hidden``, its hidden part), replayed with the inputs of ``seed``."""
        if i in self.timed_out and i != self.killed:
            stopped_too = ("; the MPI engines were stopped with it, as they may be blocked in an MPI call that no "
                           "interrupt reaches") if i == self.engines_stopped else ""
            return False, f"{self.limit_hit[i]}{stopped_too}"
        if self.engines_stopped is not None and i > self.engines_stopped and _engine_cell(self.nb.cells[i]):
            return False, (f"not run: the MPI engines were stopped after cell {self.engines_stopped} "
                           f"{self._limit_words(self.engines_stopped)} on them (blocked in an MPI call?)")
        if i == self.killed:
            return False, (f"{self.limit_hit.get(i, 'stopped at its limit')}; it ignored the interrupt, so the kernel "
                           "and everything it started (engines, MPI ranks) were killed")
        folder = self.private / "records" / row
        if row != name and not capture.records(folder, name.split("#")[0]) and capture.records(
                self.private / "records" / name, name.split("#")[0]):
            return False, "the hidden part recorded nothing: the check cell stopped before it ran"
        passed, message, self.cases[row], self.performances[row] = _verdict(
            self.nb.cells[i], name.split("#")[0], folder, seed, self.timeout, stopped, _earlier_error(self.nb, i))
        if forks and not passed:
            message += f" (the notebook hit its limit of {self.limits.processes} processes and threads)"
        return passed, message

    def results(self, student: str, outcomes: dict[str, tuple[bool, str]],
                notebook: str | None = None) -> list[ExerciseResult]:
        """A row for every exercise: every released one, in the release's order, else those the notebook holds; each
        row names ``notebook`` (the lab found in it), else the file."""
        names = ([ex["name"] for ex in self.released["exercises"]] if self.released
                 else [name for _, name in self.exercises])
        rows = []
        for name in names:
            for row in rows_of(name, self.hidden_parts):
                passed, message = outcomes.get(row, (False, ""))
                if name in self.problems:
                    passed, message = False, self.problems[name] + (f"; when run: {message}" if row in outcomes else "")
                kept = name not in self.problems
                rows.append(ExerciseResult(student, notebook or self.path.name, row, passed, message,
                                           cases=self.cases.get(row) if kept else None,
                                           performance=self.performances.get(row) if kept and passed else None))
        return rows

    def escapes(self) -> list[dict]:
        """The escape attempts its kernel's audit hook noted (:mod:`.audit`): each kind and target once, with its
        count; none without a sandbox, where no hook runs."""
        return audit.read(self.private / KERNEL_LOG) if self.isolate else []

    def close(self) -> None:
        sandbox.remove_cgroup(self.cgroups)
        sandbox.release_uid(self.uid)
        shutil.rmtree(self.private, ignore_errors=True)
        shutil.rmtree(self.work, ignore_errors=True)


def rows_of(name: str, hidden_parts) -> list[str]:
    """The rows of one check cell's exercise (``name``, ``name#2``) in the grades: itself, then its hidden part where
    ``hidden_parts`` names the exercise or holds "all"."""
    hidden = "all" in hidden_parts or name.split("#")[0] in hidden_parts
    return [name] + ([name + HIDDEN] if hidden else [])


def exercise_of(row: str) -> str:
    """The exercise a row of the grades belongs to: ``ring_allreduce`` for ``ring_allreduce#2~hidden``."""
    return row.split(HIDDEN)[0].split("#")[0]


def is_secret(row: str, hidden=frozenset()) -> bool:
    """Whether a row's message stays with the instructor: a hidden part, or a check named hidden (``--hidden``)."""
    return row.endswith(HIDDEN) or row in hidden or exercise_of(row) in hidden


def shown_name(row: str) -> str:
    """A row as students read it: ``ring_allreduce (hidden part)`` for ``ring_allreduce~hidden``."""
    return row[: -len(HIDDEN)] + " (hidden part)" if row.endswith(HIDDEN) else row


def grade_notebook(path: Path, student: str, out_dir: Path, timeout: int = 60, profile: str = "quick",
                   released: dict | None = None, threads: int | None = None, isolate: bool | None = None,
                   limits: Limits | None = None, hidden_parts: frozenset[str] = frozenset(),
                   name: str | None = None, escapes: list | None = None) -> list[ExerciseResult]:
    """Execute one student's notebook into ``out_dir`` and return one result per exercise (never raises for the
    student's errors). ``name`` is the lab notebook it is (found by its content), which names its rows and the
    executed copy; the file's own name without it.

    The notebook runs in a sandbox of its own (:mod:`labkit.grading.sandbox`; ``isolate=None`` where one can be
    made) and in record mode (:mod:`labkit.check.capture`) on inputs drawn afresh: right after each check cell, what
    it recorded of the student's functions is moved out of the notebook's reach, and the check is replayed on it in
    the grader's own processes, which give the verdict. A cell over ``timeout`` is interrupted; one that does not
    stop within :data:`GRACE` more seconds has its kernel killed with everything it started.

    ``hidden_parts`` (exercise names, or "all"): those checks run a second time, silently, on inputs drawn apart, and
    each gets a second row, ``<name>~hidden``, its hidden part (:mod:`labkit.check.capture`).

    ``escapes``, a list, receives the escape attempts the sandbox contained, as the kernel's audit hook noted them
    (:mod:`.audit`): {"kind", "target", "count"} each."""
    import nbformat

    why = unreadable(path)
    if why:  # an empty upload, a file that is not a notebook: its rows say so, the class goes on
        names = ([row for ex in released["exercises"] for row in rows_of(ex["name"], hidden_parts)] if released
                 else ["(the notebook)"])
        return [ExerciseResult(student, name or Path(path).name, row, False, why) for row in names]
    run = NotebookRun(path, timeout, profile, released, threads, isolate, limits, hidden_parts)
    try:
        stopped = run.execute()
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        nbformat.write(run.nb, Path(out_dir) / (name or Path(path).name))
        outcomes = run.verdicts(stopped)
        if escapes is not None:
            escapes += run.escapes()
    finally:
        run.close()
    return run.results(student, outcomes, name)


def unreadable(path: Path) -> str | None:
    """Why a submitted file cannot be graded as a notebook (empty, not JSON, not a notebook nbformat can read), or
    None. An older notebook format (nbformat 3) is read, converted, as it would be in JupyterLab."""
    import nbformat

    try:
        size = Path(path).stat().st_size
        if size == 0:
            return "the notebook file is empty (0 bytes): an upload that failed? Nothing in it could be graded"
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, it is this student's row that says it
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return f"the file is not a notebook that can be read ({type(e).__name__}: {first})"
    return None


GRACE = 10  # seconds a cell has, after the interrupt, to stop before its kernel is killed
# the programs of a notebook's MPI engines (ipyparallel's engine and its nanny, MPICH's mpiexec and proxy)
ENGINE_PROGRAM = re.compile(r"ipyparallel\.engine|(^|/)(mpiexec|mpirun|mpiexec\.hydra|hydra_pmi_proxy)$")


def _interrupted(cell) -> bool:
    """Whether a cell's outputs show the interrupt that stopped it: a KeyboardInterrupt, or for a %%px cell, whose
    magic catches it and returns as if all went well, ipyparallel's line saying it passed the interrupt on."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error" and out.get("ename") == "KeyboardInterrupt":
            return True
        if out.get("output_type") == "stream" and "Received Keyboard Interrupt" in out.get("text", ""):
            return True
    return False


def _engine_cell(cell) -> bool:
    """Whether a code cell runs on the MPI engines: a %%px cell, or one that calls the cluster's view."""
    source = cell.get("source", "")
    return source.lstrip().startswith(("%%px", "%px")) or ".view" in source


def _cpu_of(pid: int) -> float:
    """A live process's CPU-seconds, its own and its reaped children's (user and system); 0 where it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (read from /proc): a kernel's engines when there is no sandbox cgroup."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


RECORD_LIMIT = 256 << 20  # bytes: a larger record file is not read (the checks' records are a few MB at most)
KERNEL_LOG = "kernel.log"  # in the grader's private folder: what the kernel printed outside the notebook, and its
                           # audit hook's notes


def _sandboxed_kernel(work: Path, private: Path, limits, cgroups, env: dict, uid: int | None = None):
    """A kernel manager whose kernel starts in the sandbox (as user ``uid``, where it is one of its own), talking over
    Unix sockets in the scratch folder (the sandbox has no network of its own beyond its loopback)."""
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    ipc = work / ".ipc"
    ipc.mkdir()
    spec_dir = private / "kernels" / "labkit-sandbox"
    spec_dir.mkdir(parents=True)
    # the kernel starts under the audit hook, which notes its escape attempts in the grader's kernel.log
    argv = sandbox.command(audit.kernel_argv(**sandbox.audited(work, uid is not None)), work, limits, cgroups, env,
                           log=private / KERNEL_LOG, uid=uid)
    (spec_dir / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "labkit sandbox",
                                                      "language": "python", "interrupt_mode": "message"}))
    ksm = KernelSpecManager(kernel_dirs=[str(private / "kernels")], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="labkit-sandbox", kernel_spec_manager=ksm, transport="ipc", ip=str(ipc / "k"),
                         connection_file=str(ipc / "kernel.json"))
