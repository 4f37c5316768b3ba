"""Verdicts a student's code cannot forge: record what the student's function returned on the check's inputs, and
replay the check on that record in the grader's own process.

The checks (:mod:`labkit.check`) run in three modes:

- **plain** (a student at work): the check calls the student's function and says what is wrong, as always.
- **record** (the student's notebook while it is graded; ``LABKIT_CAPTURE`` names a folder): the check runs the same
  way, and every call of the student's function (its inputs' digest, what it returned, the arrays it changed in place,
  the messages it sent, the exception it raised) and every step that ran the student's code (a compile, a training
  run, a timing) is written to ``<folder>/<check>.r<rank>.json`` and ``.npz``: plain JSON and arrays, no pickle.
  Whether the student's function is, or called, labkit's own reference for that exercise is recorded too.
- **replay** (the grader): the same check runs again in a process of the grader's, with the record standing in for the
  student's function: each call returns what was recorded for those inputs. The check's comparisons, its messages and
  its verdict all happen here, where the student's code never ran, so patching ``labkit.check``, NumPy or ``print``
  in the notebook, catching the check's error or writing files changes nothing: a pass needs the right results on the
  check's inputs, which the grader draws afresh for every submission (``LABKIT_CHECK_SEED``).

**A hidden part** (``LABKIT_HIDDEN_PARTS`` names the exercises, ``labkit grade --hidden-part``): while graded, such a
check runs a second time right after its cell's own run, silently, on inputs of another secret draw
(``LABKIT_HIDDEN_SEED``), recorded as ``<check>~hidden.r<rank>``. The grader replays both: the first is the public
verdict, the second a row of its own whose message only the instructor reads.

What the record cannot prove: a student who rewrites this module inside their own kernel can hide a call of the
reference, and a timing is what their process measured. The grader's side is :mod:`labkit.grading.replay`.
"""

from __future__ import annotations

import builtins
import dataclasses
import dis
import hashlib
import importlib
import json
import os
import re
import sys
import threading
from collections import deque
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .. import settings
from ..errors import LabkitError
from ..native.csource import strip_comments
from .exercises import exercise

ENV = "LABKIT_CAPTURE"
SEED_ENV = "LABKIT_CHECK_SEED"
HIDDEN_ENV = "LABKIT_HIDDEN_PARTS"
HIDDEN_SEED_ENV = "LABKIT_HIDDEN_SEED"
HIDDEN = "~hidden"  # a hidden part's record, and its row in the grades: <exercise>~hidden
FORMAT = 1
PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)  # labkit/

class NotRecorded(LabkitError, AssertionError):
    """The replay asked for a result the record does not hold."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


_session = None  # the check being recorded or replayed (checks run one at a time)


def mode() -> str:
    if isinstance(_session, Replay):
        return "replay"
    return "record" if isinstance(_session, Record) else "plain"


def seed(base: int) -> int:
    """The seed of a check's inputs: ``base`` when a student runs the check, shifted by the grader's draw when graded."""
    if isinstance(_session, (Replay, Record)):
        return base + _session.seed

    return base + (settings.get(SEED_ENV) or 0)


def hidden_part(check: str) -> bool:
    """Whether the notebook is being graded with a hidden part of ``check``: a second, silent run on another draw."""
    if not settings.get(ENV):
        return False
    wanted = {name.strip() for name in (settings.get(HIDDEN_ENV) or "").split(",")}
    return check in wanted or "all" in wanted


# ---- plain data: JSON with arrays beside it ------------------------------------------------------------------------

def _encode(v, arrays: dict):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.ndarray) and v.dtype.kind not in "OV":
        key = f"a{len(arrays)}"
        arrays[key] = np.ascontiguousarray(v)
        return {"nd": key}
    if isinstance(v, np.generic) and not isinstance(v, np.object_):
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(v)
        return {"np": key}
    if isinstance(v, tuple):
        return {"tuple": [_encode(x, arrays) for x in v]}
    if isinstance(v, list):
        return {"list": [_encode(x, arrays) for x in v]}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"dict": {k: _encode(x, arrays) for k, x in v.items()}}
    cls = type(v)
    if dataclasses.is_dataclass(v) and cls.__module__.startswith("labkit."):
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: _encode(getattr(v, f.name), arrays) for f in dataclasses.fields(v)}}
    try:
        text = repr(v)[:200]
    except Exception:  # noqa: BLE001 - a student's object whose repr fails
        text = "?"
    return {"object": cls.__name__, "repr": text}


def _decode(v, arrays):
    if not isinstance(v, dict):
        return v
    if "nd" in v:
        return np.array(arrays[v["nd"]])
    if "np" in v:
        return np.asarray(arrays[v["np"]])[()]
    if "tuple" in v:
        return tuple(_decode(x, arrays) for x in v["tuple"])
    if "list" in v:
        return [_decode(x, arrays) for x in v["list"]]
    if "dict" in v:
        return {k: _decode(x, arrays) for k, x in v["dict"].items()}
    if "dataclass" in v:
        module, _, name = str(v["dataclass"]).partition(":")
        cls = getattr(_known_module(module), name, None)
        if cls is None or not dataclasses.is_dataclass(cls):
            raise NotRecorded(f"the record names an unknown result type {v['dataclass']}")
        return cls(**{k: _decode(x, arrays) for k, x in v["fields"].items()})
    if "object" in v:  # a value that is not plain data: the checks see its type's name, nothing else
        text = str(v.get("repr", ""))
        return type(str(v["object"]), (), {"__repr__": lambda self: text})()
    raise NotRecorded(f"the record holds a value it cannot read: {sorted(v)}")


def _encode_error(e: BaseException) -> dict:
    out = {"type": type(e).__name__, "module": type(e).__module__, "message": str(e)}
    if type(e).__module__ == "mpi4py.MPI":
        try:
            out["mpi_error"] = int(e.Get_error_class())
        except Exception:  # noqa: BLE001
            pass
    return out


# the modules whose exceptions and results the checks catch and read: a record may name these, and only these are
# imported for it (a record is the student's file: importing what it names could run anything, labkit.__main__ say)
KNOWN_MODULES = ("labkit.check.common", "labkit.check.ring", "labkit.check.capture", "labkit.hostc", "labkit.kernels.emulator",
                 "labkit.kernels.source", "labkit.native.csource", "labkit.param_server", "labkit.collectives", "labkit.mlp",
                 "labkit.data")


def _known_module(module: str):
    if module not in KNOWN_MODULES:
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _decode_error(d: dict) -> BaseException:
    module, name, message = str(d.get("module", "")), str(d.get("type", "Exception")), str(d.get("message", ""))
    cls = None
    if module == "builtins":
        cls = getattr(builtins, name, None)
    elif module.startswith("labkit."):
        cls = getattr(_known_module(module), name, None)
    elif module == "mpi4py.MPI" and "mpi_error" in d:
        from mpi4py import MPI

        return MPI.Exception(int(d["mpi_error"]))
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = type(name, (Exception,), {"__module__": module})  # the student's own exception: its name and message
    e = cls.__new__(cls)
    Exception.__init__(e, message)
    return e


# ---- what a call's inputs are --------------------------------------------------------------------------------------

def _is_comm(v) -> bool:
    return hasattr(v, "Get_size") and hasattr(v, "Get_rank") and callable(v.Get_size)


def digest(args: tuple, kwargs: dict) -> str:
    """A digest of a call's inputs: the arrays' bytes, the numbers, a communicator by its size and rank."""
    h = hashlib.sha256()

    def feed(v):
        if isinstance(v, np.ndarray):
            h.update(f"nd{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes() if v.dtype.kind not in "OV" else repr(v).encode())
        elif isinstance(v, np.generic):
            h.update(f"np{v.dtype.str}".encode() + np.asarray(v).tobytes())
        elif isinstance(v, (list, tuple)):
            h.update(b"[" if isinstance(v, list) else b"(")
            for x in v:
                feed(x)
            h.update(b"]")
        elif isinstance(v, dict):
            for k in sorted(v, key=repr):
                feed(k)
                feed(v[k])
        elif v is None or isinstance(v, (bool, int, float, str, bytes)):
            h.update(repr((type(v).__name__, v)).encode())
        elif _is_comm(v):
            h.update(f"comm{v.Get_size()},{v.Get_rank()}".encode())
        elif type(v).__module__ == "mpi4py.MPI" and type(v).__name__ == "Op":
            from ..collectives import op_name

            h.update(f"op{op_name(v)}".encode())
        else:
            h.update(f"obj{type(v).__name__}".encode())
        h.update(b",")

    feed(args)
    feed(kwargs)
    return h.hexdigest()[:32]


def _array_leaves(v, path=()):
    if isinstance(v, np.ndarray):
        yield path, v
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from _array_leaves(x, path + (i,))


def _at(args, path):
    for i in path:
        args = args[i]
    return args


def _traffic_logs(args) -> list:
    return [(i, a) for i, a in enumerate(args)
            if any(c.__name__ == "TrafficComm" for c in type(a).__mro__) and isinstance(getattr(a, "log", None), list)]


# ---- labkit's references -------------------------------------------------------------------------------------------

def _reference_codes(check: str) -> dict:
    codes = {}
    declared = exercise(check)
    for spec in declared.references if declared else ():
        module, name = spec.split(":")
        try:
            obj = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        functions = [obj] if not isinstance(obj, type) else [
            getattr(m, "__func__", m) for m in vars(obj).values()
            if callable(getattr(m, "__func__", m)) or isinstance(m, property)]
        for f in functions:
            if isinstance(f, property):
                f = f.fget
            code = getattr(f, "__code__", None)
            if code is not None:
                codes[code] = f"{module}.{name}"
    return codes


def _fingerprint(code) -> tuple:
    """What a function's code does, apart from where and how it was compiled: its instructions with the names and
    values they use (a nested function's by its own fingerprint), its variables. Left out: the docstring, constant
    and jump positions, and the two forms of an attribute call (CPython 3.11 loads ``np.f`` as an attribute inside
    a module that imports ``np`` and as a method in code compiled alone). So labkit's reference compiled again from
    its source (``exec(inspect.getsource(...))``, or its file read and run) has the reference's fingerprint."""
    steps = []
    for ins in dis.get_instructions(code):
        if ins.opname in _NOT_WORK:
            continue
        arg = ins.argval
        if hasattr(arg, "co_code"):
            arg = _fingerprint(arg)
        elif ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs or not isinstance(arg, (str, int, float, tuple,
                                                                                              bytes, type(None))):
            arg = None
        steps.append((_SAME_OP.get(ins.opname, ins.opname), arg))
    return tuple(steps), code.co_varnames[:code.co_argcount + code.co_kwonlyargcount], code.co_freevars


_NOT_WORK = {"RESUME", "CACHE", "PRECALL", "PUSH_NULL", "NOP", "EXTENDED_ARG"}
_SAME_OP = {"LOAD_METHOD": "LOAD_ATTR", "CALL_METHOD": "CALL"}
COPY_STEPS = 12  # a reference of fewer instructions than this (a one-line wrapper) is left out: honest code can match it


def _reference_copies(watch: dict) -> dict:
    """{fingerprint: "labkit's name, copied from its source"} for the references in ``watch`` long enough that
    matching them is a copy, not a coincidence."""
    return {_fingerprint(code): f"{name}, its source copied" for code, name in watch.items()
            if len(_fingerprint(code)[0]) >= COPY_STEPS}


def _unwrap(fn, depth: int = 0):
    """The functions a callable stands for: through partial, bound methods and __wrapped__."""
    if depth > 8 or fn is None:
        return []
    found = [fn]
    for attr in ("func", "__func__", "__wrapped__"):
        inner = getattr(fn, attr, None)
        if inner is not None and inner is not fn:
            found += _unwrap(inner, depth + 1)
    return found


def _normalise_c(text: str) -> str:
    return "".join(strip_comments(text).split())


def _c_function(text: str, name: str | None) -> str:
    """One function's definition in C source (from its name to its closing brace), or the whole text."""
    if name is None:
        return text

    m = re.search(r"\b" + re.escape(name) + r"\s*\(", text)
    if not m:
        return ""
    start = text.find("{", m.end())
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[m.start():i + 1]
    return ""


def source_reference(check: str, source) -> str | None:
    """The labkit file whose function the student's C or CUDA C source is a copy of, if it is one."""
    if not isinstance(source, str):
        return None
    mine = _normalise_c(source)
    declared = exercise(check)
    for rel, name in declared.sources if declared else ():
        path = Path(PACKAGE_DIR) / rel
        try:
            body = _normalise_c(_c_function(path.read_text(), name))
        except OSError:
            continue
        # the function's body, from its first brace: a copy with another name is still a copy
        body = body[body.find("{"):] if "{" in body else body
        if len(body) > 40 and body in mine:
            return f"labkit/{rel}" + (f" ({name})" if name else "")
    return None


# ---- record --------------------------------------------------------------------------------------------------------

class Record:
    def __init__(self, check: str, folder: Path, seed_: int = 0, tag: str = ""):
        self.check, self.folder, self.seed, self.tag = check, folder, seed_, tag
        self.entries: list[dict] = []
        self.arrays: dict = {}
        self.reference: str | None = None
        self.source: str | None = None
        self.active = 0
        self.watch = _reference_codes(check)
        self.copies = _reference_copies(self.watch)
        self._seen: dict = {}  # code -> the reference it copies, or None: a code object is fingerprinted once
        self._lock = threading.Lock()
        self._previous = None

    def start(self) -> None:
        if not self.watch:
            return
        self._previous = sys.getprofile()

        def hook(frame, event, arg):
            if event != "call" or not self.active:
                return
            if frame.f_code in self.watch:
                caller = frame.f_back
                if caller is None or not caller.f_code.co_filename.startswith(PACKAGE_DIR):
                    self.reference = self.reference or self.watch[frame.f_code]
            elif not frame.f_code.co_filename.startswith(PACKAGE_DIR):
                self.reference = self.reference or self.copied(frame.f_code)

        sys.setprofile(hook)
        threading.setprofile(hook)

    def add(self, entry: dict) -> None:
        with self._lock:
            self.entries.append(entry)

    def run(self, entry: dict, thunk, after=None):
        """Run ``thunk`` (the student's code, watched for labkit's reference); write its result or its error into
        ``entry`` (and what ``after(entry)`` adds, once it has run), then keep the entry."""
        self.active += 1
        try:
            result = thunk()
            entry["result"] = _encode(result, self.arrays)
            return result
        except Exception as e:
            entry["raised"] = _encode_error(e)
            raise
        except BaseException:
            entry["interrupted"] = True
            raise
        finally:
            self.active -= 1
            if after is not None:
                with self._lock:
                    after(entry)
            self.add(entry)

    def copied(self, code) -> str | None:
        """The reference whose source ``code`` was compiled from, if it was (under any name)."""
        if code not in self._seen:
            self._seen[code] = self.copies.get(_fingerprint(code)) if self.copies else None
        return self._seen[code]

    def note_identity(self, fn) -> None:
        """Notice a student's function that is labkit's reference itself (through partial, methods, __wrapped__), or
        a copy of its source."""
        for f in _unwrap(fn):
            code = getattr(f, "__code__", None)
            name = self.watch.get(code) or (self.copied(code) if code is not None else None)
            if name:
                self.reference = self.reference or name

    def close(self) -> None:
        if self.watch:
            sys.setprofile(self._previous)
            threading.setprofile(None)
        rank = _rank()
        self.folder.mkdir(parents=True, exist_ok=True)
        base = str(self.folder / f"{self.check}{self.tag}.r{rank}")
        record = {"labkit_capture": FORMAT, "check": self.check, "rank": rank, "seed": self.seed,
                  "reference": self.reference, "source": self.source, "entries": self.entries}
        with open(base + ".tmp.npz", "wb") as f:
            np.savez(f, **self.arrays)
        os.replace(base + ".tmp.npz", base + ".npz")
        Path(base + ".tmp.json").write_text(json.dumps(record))
        os.replace(base + ".tmp.json", base + ".json")


def _rank() -> int:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        world = mpi.COMM_WORLD  # the real one also while a check guards it (common.on_given_comm)
        return getattr(world, "real_world", world).Get_rank()
    return 0


def _recorded_call(session: Record, label: str, fn):
    def wrapper(*args, **kwargs):
        leaves = list(_array_leaves(args))
        before = [a.copy() for _, a in leaves]

        def changes(entry):  # the arrays it changed in place, and the messages it sent
            entry["mutated"] = [[list(p), _encode(a, session.arrays)] for (p, a), b in zip(leaves, before)
                                if a.shape != b.shape or a.tobytes() != b.tobytes()]
            entry["logs"] = [[i, [list(map(int, row)) for row in tc.log]] for i, tc in _traffic_logs(args)]

        entry = {"kind": "call", "label": label, "key": digest(args, kwargs)}
        return session.run(entry, lambda: fn(*args, **kwargs), after=changes)

    wrapper.unrecorded = fn
    return wrapper


# ---- replay --------------------------------------------------------------------------------------------------------

class Replay:
    def __init__(self, check: str, folder: Path, rank: int, seed_: int):
        base = str(Path(folder) / f"{check}.r{rank}")
        try:
            self.record = json.loads(Path(base + ".json").read_text())
            with np.load(base + ".npz", allow_pickle=False) as z:
                self.arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError) as e:
            raise NotRecorded(f"{check}: no readable record for rank {rank} ({type(e).__name__})") from None
        if self.record.get("labkit_capture") != FORMAT or self.record.get("check") != check:
            raise NotRecorded(f"{check}: the record for rank {rank} is not one of this check's")
        self.check, self.seed = check, seed_
        self.queues: dict = {}
        for entry in self.record.get("entries", []):
            self.queues.setdefault((entry.get("kind"), entry.get("label"), entry.get("key")), deque()).append(entry)

    def take(self, kind: str, label: str, key: str, what: str) -> dict:
        q = self.queues.get((kind, label, key))
        if not q:
            raise NotRecorded(
                f"{what} was not recorded when your notebook ran: the check cell stopped before it (see the executed "
                "notebook), or labkit's check was changed in the notebook")
        entry = q.popleft()
        if entry.get("interrupted"):
            raise NotRecorded(f"{what} was interrupted when your notebook ran (the time limit per cell?)")
        return entry


def _replayed_call(session: Replay, label: str, ex: str):
    def replayed(*args, **kwargs):
        entry = session.take("call", label, digest(args, kwargs), f"{ex}: your function's result on one of the inputs")
        for path, value in entry.get("mutated", []):
            try:
                np.copyto(_at(args, path), _decode(value, session.arrays))
            except (IndexError, TypeError, ValueError):
                pass
        for i, rows in entry.get("logs", []):
            if i < len(args) and isinstance(getattr(args[i], "log", None), list):
                args[i].log[:] = [tuple(r) for r in rows]
        return _outcome(entry, session.arrays)

    return replayed


def _outcome(entry: dict, arrays):
    """What a recorded call or step came to: its error raised again, or its result."""
    if "raised" in entry:
        raise _decode_error(entry["raised"])
    return _decode(entry.get("result"), arrays)


def replayed(session: Replay, label: str = "fn", ex: str = ""):
    """A stand-in for the student's function that answers from ``session``'s record."""
    return _replayed_call(session, label, ex or session.check)


def begin(session: Replay) -> None:
    """Replay the next check on ``session`` (:mod:`labkit.grading.replay`); :func:`end` after it."""
    global _session
    _session = session


def end() -> None:
    global _session
    _session = None


# ---- what the checks call ------------------------------------------------------------------------------------------

@contextmanager
def session(check: str, hidden: bool = False):
    """Around a check: records it when ``LABKIT_CAPTURE`` is set (the notebook being graded); else nothing.
    ``hidden``: the run of its hidden part, on the inputs of ``LABKIT_HIDDEN_SEED``, recorded apart."""
    global _session
    if _session is not None:  # replaying, or a check inside a check
        yield _session
        return

    folder = settings.get(ENV)
    if not folder:
        yield None
        return
    draw = settings.get(HIDDEN_SEED_ENV if hidden else SEED_ENV) or 0
    _session = Record(check, Path(folder), draw, HIDDEN if hidden else "")
    _session.start()
    try:
        yield _session
    finally:
        s, _session = _session, None
        s.close()


def replaying() -> bool:
    """Whether a check runs now in the grader's replay (its verdict, not a student's run)."""
    return isinstance(_session, Replay)


def student(fn, label: str = "fn", ex: str = ""):
    """The student's function as the check should call it: itself (plain), recorded, or the record (replay)."""
    s = _session
    if isinstance(s, Replay):
        return _replayed_call(s, label, ex or s.check)
    if isinstance(s, Record):
        s.note_identity(fn)
        return _recorded_call(s, label, fn)
    return fn


def watched(fn):
    """The student's function passed on to labkit's code that calls it live (the parameter server's worker): when
    recording, calls of labkit's reference from inside it are noticed; nothing is recorded per call."""
    s = _session
    if not isinstance(s, Record) or not callable(fn):
        return fn
    s.note_identity(fn)

    def wrapper(*args, **kwargs):
        s.active += 1
        try:
            return fn(*args, **kwargs)
        finally:
            s.active -= 1

    return wrapper


def source(text):
    """The student's C or CUDA C source: recorded (with whether it copies labkit's), and what the replay checks."""
    s = _session
    if isinstance(s, Record):
        s.source = text if isinstance(text, str) else None
        s.reference = s.reference or source_reference(s.check, text)
    return text


def step(label: str, thunk, key: str = "", what: str = ""):
    """A step of the check that runs the student's code as a whole (compiling it, a training run with it as the
    worker, timing it): run (plain), run and record its result or error (record), or the recorded outcome (replay)."""
    s = _session
    if isinstance(s, Replay):
        return _outcome(s.take("step", label, key, what or f"{s.check}: the step {label!r}"), s.arrays)
    if not isinstance(s, Record):
        return thunk()
    return s.run({"kind": "step", "label": label, "key": key}, thunk)


def build(label: str, thunk, ex: str = ""):
    """Compiling the student's source into a callable: the callable (plain), recorded with its calls (record), or a
    stand-in that answers from the record (replay). A compile error is recorded and raised again on replay."""
    s = _session
    if isinstance(s, Replay):
        step(label, lambda: None, key="build")
        return _replayed_call(s, label, ex or s.check)
    if not isinstance(s, Record):
        return thunk()
    fn = s.run({"kind": "step", "label": label, "key": "build"}, thunk)  # a compile error is kept and raised
    return _recorded_call(s, label, fn)


# ---- the grader's side ---------------------------------------------------------------------------------------------

def records(folder: Path | str, check: str) -> list[Path]:
    """The record files of one check in a folder, one per rank, in rank order."""
    found = [p for p in Path(folder).glob(f"{check}.r*.json") if p.stem.rsplit(".r", 1)[1].isdigit()]
    found.sort(key=lambda p: int(p.stem.rsplit(".r", 1)[1]))
    return [p for p in found if p.with_suffix(".npz").is_file()]


def recorded_reference(folder: Path | str, check: str) -> str | None:
    for path in records(folder, check):
        try:
            ref = json.loads(path.read_text()).get("reference")
        except (OSError, ValueError):
            continue
        if ref:
            return str(ref)
    return None


