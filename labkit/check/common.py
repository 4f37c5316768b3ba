"""What every exercise check shares: the error students see, the pass line, calling their function safely,
and comparing gradients with a message that names the first wrong layer."""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import io
import re
import textwrap
from dataclasses import asdict, dataclass

import numpy as np

from .. import mlp
from ..cluster import first_ranks
from ..errors import LabkitError
from . import capture
from .exercises import exercise as declared


class ExerciseError(LabkitError, AssertionError):
    """A student's function gave a wrong answer; the message says what and suggests why.

    IPython (a notebook, and each MPI engine of a ``%%px`` cell) shows it as its message alone: the frames of the
    check's own code would only bury what went wrong and the hint.
    """

    def _render_traceback_(self) -> list[str]:
        return [f"ExerciseError: {self}"]



class WorldUsed(ExerciseError):
    """The student's function reached for MPI.COMM_WORLD inside a check that runs it on a smaller communicator."""


class _GuardedWorld:
    """What ``MPI.COMM_WORLD`` is while a collective check runs the student's function (:func:`on_given_comm`): any
    use of it fails at once, naming the mistake. Left alone, a call on the world from the ranks of a smaller
    communicator waits for ranks that never join it, and the engines hang inside MPI, beyond any interrupt."""

    def __init__(self, real, ex: str):
        object.__setattr__(self, "real_world", real)
        object.__setattr__(self, "ex", ex)

    def __getattr__(self, name):
        raise WorldUsed(f"{self.ex}: your function used MPI.COMM_WORLD.{name}. The check runs it on communicators of "
                        "1 to p ranks, and a call on the world of all ranks would wait for ranks that are not taking "
                        "part, forever. Use the communicator your function is given (its comm argument) for every "
                        "message and every query of rank and size")

    def __setattr__(self, name, value):
        self.__getattr__(name)


def on_given_comm(fn, ex: str):
    """``fn`` (the student's function, as :func:`capture.student` gives it) called with ``MPI.COMM_WORLD`` out of
    its reach: for the checks that run it on sub-communicators, where using the world deadlocks the engines."""

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        from mpi4py import MPI

        real = MPI.COMM_WORLD
        if isinstance(real, _GuardedWorld):
            return fn(*args, **kwargs)
        MPI.COMM_WORLD = _GuardedWorld(real, ex)
        try:
            return fn(*args, **kwargs)
        finally:
            MPI.COMM_WORLD = real

    return guarded


def world(mpi):
    """The real ``MPI.COMM_WORLD`` of the module ``mpi``, also while :func:`on_given_comm` guards it."""
    w = mpi.COMM_WORLD
    return w.real_world if isinstance(w, _GuardedWorld) else w


class Tally:
    """How many of a check's cases the answer passed, of how many: what partial credit per case is made of; and the
    score an open exercise's answer earned (:func:`scored`), which the class's leaderboard ranks."""

    def __init__(self):
        self.done, self.of = 0, None
        self.score: Score | None = None

    def counted(self) -> tuple[int, int] | None:
        return (self.done, self.of) if self.of else None


@dataclass(frozen=True)
class Score:
    """What an open exercise's answer scored, beside its verdict: ``value`` in ``unit`` (for example a modelled time
    in µs), ``lower_is_better`` to rank it, and ``label`` saying what was measured, for the leaderboard's column."""

    label: str
    value: float
    unit: str
    lower_is_better: bool = True

    def to_json(self) -> dict:
        return asdict(self)


def scored(label: str, value: float, unit: str, lower_is_better: bool = True) -> Score:
    """Record what the running check's answer scored (an open exercise: its leaderboard's number), and return it.
    Only a number the check computed from what the answer did: never one the student's code reported."""
    score = Score(label, float(value), unit, lower_is_better)
    if _tallies:
        _tallies[-1].score = score
    return score


_tallies: list[Tally] = []  # one per check running, the outermost first
_last: list[tuple[int, int] | None] = [None]  # the outermost check's, once it ended
_last_score: list[Score | None] = [None]  # the outermost check's score, once it ended (open exercises only)


def each_case(items, more: int = 0):
    """The check's cases, one by one, each counted as passed once the check moves on from it (a case that fails
    raises inside the loop, and is not). The first call of a check sets its number of cases: ``len(items)`` and
    ``more`` to come in later loops or after this one (each later loop's cases are counted by calling this again)."""
    items = list(items)
    tally = _tallies[-1] if _tallies else Tally()
    if tally.of is None:
        tally.of = len(items) + more
    for item in items:
        yield item
        tally.done += 1


def last_cases() -> tuple[int, int] | None:
    """(cases passed, cases) of the last check that ran to its end or to a failure in this process, or None for a
    check that counts no cases."""
    return _last[0]


def last_score() -> Score | None:
    """The score of the last check that ran in this process to its end (:func:`scored`), None where it scored none."""
    return _last_score[0]


def recorded(check):
    """A check that, while a notebook is graded, records what the student's code returned (:mod:`labkit.check.capture`),
    and whose failures carry the exercise's next hint (:func:`next_hint`)."""

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        ran = False  # to its end or to an error: not stopped by an interrupt (a cell over its time limit)
        top = capture.mode() == "plain"  # not inside another check, not replayed
        _tallies.append(Tally())
        try:
            with capture.session(check.__name__):
                result = check(*args, **kwargs)
            ran = True
            if _tallies[-1].of:  # it passed: every case
                _tallies[-1].done = _tallies[-1].of
            return result
        except ExerciseError as e:
            ran = True
            tally = _tallies[-1]
            if tally.of is not None and tally.done >= tally.of:  # failed past its counted cases: one case more
                tally.of = tally.done + 1
            if capture.replaying():  # the grader's verdict: the mistake, without the steps
                raise
            # a diagnosis carries its own hint: the derivation's steps are for the failures nothing named
            hint = "" if DIAGNOSED in str(e) else next_hint(check.__name__, str(e), answer_of(args, kwargs))
            if hint:
                raise ExerciseError(f"{e}\n{hint}") from None
            raise
        except Exception:
            ran = True
            raise
        finally:
            tally = _tallies.pop()
            if not _tallies:
                _last[0] = tally.counted()
                _last_score[0] = tally.score
            if ran and top and capture.hidden_part(check.__name__):
                _hidden_part(check, args, kwargs)

    return wrapper


def _hidden_part(check, args, kwargs) -> None:
    """The check's hidden part, while graded: the same check again on another secret draw, recorded apart, its
    output and its verdict kept out of the notebook (the grader replays the record for a row of its own)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            with capture.session(check.__name__, hidden=True):
                check(*args, **kwargs)
        except Exception:  # noqa: BLE001 - the replay of the record gives the verdict, not this run
            pass


DIAGNOSED = "\nHint: "  # what a failure that named its mistake carries (:func:`fail` with a hint)
_failed_runs: dict[str, tuple[int, str]] = {}  # per exercise, this process's hint step and the answer that last failed


def next_hint(exercise: str, message: str, answer: str = "") -> str:
    """The next step of the exercise's derivation, for a failure no diagnosis explains: one more after each failed
    run of an answer that changed (``answer`` is its :func:`fingerprint`: comments, spaces and renames change
    nothing), the same one again for the same answer, the last one repeating; nothing for a function not written
    yet, or an exercise without hints."""
    ex = declared(exercise)
    if ex is None or not ex.hints or "not written yet" in message:
        return ""
    k, last = _failed_runs.get(exercise, (0, None))
    if answer != last or k == 0:
        k = min(k + 1, len(ex.hints))
    _failed_runs[exercise] = (k, answer)
    more = " (change your answer and run the check again for another)" if k < len(ex.hints) else ""
    return f"Step {k} of {len(ex.hints)}{more}: {ex.hints[k - 1]}"


def answer_of(args, kwargs) -> str:
    """The fingerprint of the student's answer a check was given: its first argument, or ``fn`` or ``source``."""
    answer = args[0] if args else kwargs.get("fn", kwargs.get("source"))
    return fingerprint(answer)


def fingerprint(answer, _seen=None) -> str:
    """What identifies a student's answer by what it does, across runs and edits of its cell: a function's syntax tree
    (:func:`python_shape`), with the functions of its own module that it names and the values it closes over; a C or
    CUDA C source's tokens (:func:`c_shape`). Comments, docstrings, spaces and renamed variables leave it as it was;
    any other edit of the function, of a helper it calls, or of the source changes it."""
    seen = set() if _seen is None else _seen
    if isinstance(answer, str):
        return hashlib.sha256(c_shape(answer).encode()).hexdigest()[:16]
    if not callable(answer):
        return hashlib.sha256(repr(answer).encode()).hexdigest()[:16]
    fn = getattr(answer, "func", answer)  # a functools.partial: its function
    if id(fn) in seen:
        return ""
    seen.add(id(fn))
    code = getattr(fn, "__code__", None)
    parts = [python_shape(fn)]
    if code is not None:
        scope = getattr(fn, "__globals__", {})
        parts += [fingerprint(scope[n], seen) for n in code.co_names
                  if inspect.isfunction(scope.get(n)) and scope[n].__module__ == fn.__module__]
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
            parts.append(fingerprint(value, seen) if callable(value) else repr(value)[:200])
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


class _Renamed(ast.NodeTransformer):
    """Every name a function binds or reads, numbered in order of first appearance (attributes and keywords kept:
    ``np.sum`` and ``np.mean`` differ); docstrings dropped."""

    def __init__(self):
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        return self.names.setdefault(name, f"_{len(self.names)}")

    def visit_Name(self, node):
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node):
        node.arg, node.annotation = self._name(node.arg), None
        return node

    def _body(self, node):
        if node.body and isinstance(node.body[0], ast.Expr) and isinstance(getattr(node.body[0], "value", None),
                                                                         ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
        if hasattr(node, "name"):
            node.name = self._name(node.name)
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _body

    def visit_Global(self, node):
        node.names = [self._name(n) for n in node.names]
        return node

    visit_Nonlocal = visit_Global


def python_shape(fn) -> str:
    """A function's syntax tree with its names numbered (:class:`_Renamed`), as text; where its source cannot be read
    or parsed alone (a lambda inside a longer line, say), its bytecode, constants and global names."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        return ast.dump(_Renamed().visit(tree), annotate_fields=False, include_attributes=False)
    except (OSError, TypeError, SyntaxError, IndentationError):
        code = getattr(fn, "__code__", None)
        return repr(_code_shape(code)) if code is not None else repr(fn)


def _code_shape(code) -> tuple:
    consts = tuple(_code_shape(c) if inspect.iscode(c) else c for c in code.co_consts)
    return code.co_code, consts, code.co_names


_C_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*(?:[eE][+-]?\d+)?[fFuUlL]*|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|\S")
_C_TYPES = frozenset("void char short int long float double signed unsigned bool size_t auto const volatile "
                     "__shared__ __restrict__ restrict register static extern float2 float4 int2 int4 dim3".split())


def c_shape(source: str) -> str:
    """A C or CUDA C source as its tokens, comments and spaces gone, and every name it declares (a name right after a
    type, a ``*`` or a ``,`` of a declaration) numbered in order of first appearance: the rest, CUDA's and C's own
    names and the members after ``.`` or ``->``, kept."""
    from ..native.csource import strip_comments

    tokens = _C_TOKEN.findall(strip_comments(source))
    declared, kind, current = {}, None, None  # the type before the next name; the declaration's, for a "," after
    for t in tokens:
        if t in _C_TYPES:
            kind = current = t
        elif kind is not None and (t[0].isalpha() or t[0] == "_"):
            declared.setdefault(t, f"_{len(declared)}")
            kind = None
        elif t == "," and current is not None:
            kind = current
        elif t not in ("*", "&", "[", "]") and not t[0].isdigit():
            kind = current = None if t in (";", "{", "}", "=", "(", ")") else current
    member = {i for i, t in enumerate(tokens) if i and (tokens[i - 1] == "." or tokens[i - 2:i] == ["-", ">"])}
    return " ".join(t if i in member else declared.get(t, t) for i, t in enumerate(tokens))


def fail(exercise: str, what: str, hint: str = "") -> None:
    raise ExerciseError(f"{exercise}: {what}" + (f"\nHint: {hint}" if hint else ""))


def passed(exercise: str, n: int) -> None:
    print(f"✔ {exercise}: all {n} checks passed")


def not_written(exercise: str) -> str:
    """The message for a function that still raises NotImplementedError."""
    return (f"{exercise}: not written yet (the function raises NotImplementedError)\nHint: replace the "
            "`raise NotImplementedError` line with your code, run the cell, then run this check again")


def call(exercise: str, fn, *args, where: str = "",
         hint: str = "run it on a small batch by hand and print the shapes of every array"):
    """The student's ``fn(*args)``: "not written yet" for NotImplementedError; anything else it raises fails the
    exercise with ``where`` (the input) and ``hint``. In the grader's replay, an input never recorded passes through."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise ExerciseError(not_written(exercise)) from None
    except (ExerciseError, capture.NotRecorded):
        raise
    except Exception as e:  # noqa: BLE001 - the student's code: say what it raised, on which input
        if isinstance(e, TypeError) and "slice indices must be integers" in str(e):
            hint = "slice bounds are whole numbers: compute them with // and %, not /"
        fail(exercise, f"{where + ': ' if where else ''}your function raised {type(e).__name__}: {e}", hint)


def problems(seed: int = 0):
    rng = np.random.default_rng(seed)
    for sizes, batch in (([5, 4, 3], 1), ([5, 4, 3], 8), ([7, 6, 5, 3], 13)):
        params = mlp.init_params(sizes, seed=int(rng.integers(1000)), dtype=np.float64)
        x = rng.random((batch, sizes[0]))
        Y = mlp.targets(rng.integers(0, sizes[-1], batch), sizes[-1], np.float64)
        yield params, x, Y


def compare_grads(exercise: str, got, want, batch: int, where: str) -> None:
    if not isinstance(got, (list, tuple)) or len(got) != len(want):
        fail(exercise, f"{where}: expected a list of {len(want)} (dW, db) pairs, got {type(got).__name__}"
              + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""),
              "return one (dW, db) pair per layer, in the same order as params")
    last = len(want) - 1
    for i in range(last, -1, -1):  # from the output back, as the error flows: the first bad layer is the one to fix
        g, w = got[i], want[i]
        if not isinstance(g, (list, tuple)) or len(g) != 2:
            fail(exercise, f"{where}, layer {i}: expected a (dW, db) pair, got {type(g).__name__}")
        for name, a, b in (("dW", g[0], w[0]), ("db", g[1], w[1])):
            a = np.asarray(a)
            if a.shape != b.shape:
                hint = "you have it transposed: dW = delta^T a has shape (n_out, n_in)" if a.shape == b.shape[::-1] else \
                    "db sums delta over the batch: shape (n_out,)" if name == "db" else ""
                fail(exercise, f"{where}, layer {i}: {name} has shape {a.shape}, expected {b.shape}", hint)
            if np.allclose(a, b, rtol=1e-6, atol=1e-9):
                continue
            if batch > 1 and np.allclose(a, b * batch, rtol=1e-6, atol=1e-9):
                fail(exercise, f"{where}, layer {i}: {name} is {batch} (the batch size) times too large",
                      "the gradient of the mean loss divides the sum over samples by the batch size")
            hint = ("the output layer's delta is (a - y) * sigma'(z), with sigma'(z) = a (1 - a)" if i == last else
                    "the output layer is right; the error goes back as delta = (delta_next @ W_next) * a (1 - a)")
            err = np.abs(a - b).max()
            fail(exercise, f"{where}, layer {i}: {name} differs from the reference by up to {err:.3g}\n"
                  f"  yours, first values:    {np.array2string(a.ravel()[:4], precision=5)}\n"
                  f"  expected, first values: {np.array2string(b.ravel()[:4], precision=5)}", hint)


OFF_BY_ONE = {-1: "yours is one value short: a series holds its first value (index 0) as well as the last",
              1: "yours has one value too many: count the values from index 0 to the last one asked for"}


def compare_series(ex: str, where: str, got, want, hints: list[tuple[np.ndarray, str]]) -> None:
    """``got`` must equal ``want`` (1-D, same length); if it equals one of the ``hints``' arrays, say that hint (a hint
    whose array is None does not apply to this case), if it is one value short or long, say so; anything else fails
    without a hint of its own (the exercise's derivation gives the next step)."""
    try:
        a = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        a = None
    if a is None or a.shape != want.shape:
        off = a.size - want.size if a is not None and a.ndim == want.ndim == 1 else None
        fail(ex, f"{where}: expected an array of shape {want.shape}, got "
              f"{type(got).__name__}{'' if a is None else f' of shape {a.shape}'}", OFF_BY_ONE.get(off, ""))
    if np.allclose(a, want, rtol=1e-9, atol=1e-12, equal_nan=True):
        return
    hint = next((why for wrong, why in hints
                 if wrong is not None and np.allclose(a, wrong, rtol=1e-9, atol=1e-12, equal_nan=True)), "")
    fail(ex, f"{where}:\n  yours:    {np.array2string(a, precision=4)}\n  expected: {np.array2string(want, precision=4)}", hint)


def collective_check(comm, ex: str, cases) -> None:
    """Run ``cases(sub, k)`` (a generator of case functions returning an error string or None) on
    sub-communicators of the first k = 1..p ranks. Ranks agree after every case, so nobody starts a case
    the others skipped; on failure every rank raises (rank 0 with the message)."""
    from ..collectives import first_cause

    p, rank = comm.Get_size(), comm.Get_rank()
    n_checks, error = 0, None
    for k in each_case(range(1, p + 1)):
        with first_ranks(comm, k) as sub:
            if sub:
                for case in cases(sub, k):
                    if error is None:
                        error = case()
                    n_checks += 1
                    error = first_cause(sub.allgather(error))
                    if error:
                        break
        error = first_cause(comm.allgather(error))
        if error:
            if rank == 0:  # one message for the student: the other ranks return quietly, rank 0's error fails the cell
                raise ExerciseError(error)
            return
    if rank == 0:
        passed(f"{ex} on 1 to {p} ranks", n_checks)


def one_number(ex: str, where: str, got, what: str, fix: str = "", not_finite: str = "") -> float:
    """A student's answer that must be one number (any single value, a 0-d or one-element array too), as a float;
    else fail with ``where: what, got <its type> of shape <its shape>`` and ``fix``. With ``not_finite``, an inf or
    NaN fails too, with that hint."""
    size = np.size(got) if not isinstance(got, (str, bytes)) else 1
    shape = f" of shape {np.shape(got)}" if np.ndim(got) and not isinstance(got, (str, bytes)) else ""
    value = None
    if got is not None and not isinstance(got, (bool, np.bool_, str, bytes)) and size == 1:
        try:
            value = float(np.asarray(got, dtype=float).reshape(()))
        except (TypeError, ValueError):
            value = None
    if value is None:
        fail(ex, f"{where + ': ' if where else ''}{what}, got {type(got).__name__}{shape}", fix)
    if not_finite and not np.isfinite(value):
        fail(ex, f"{where + ': ' if where else ''}the value you returned is {value}", not_finite)
    return value


def as_seconds(ex: str, where: str, got) -> float:
    """A student's answer that must be one number of seconds."""
    return one_number(ex, where, got, "expected one number of seconds", "return a single float: the time of it all")


