"""labkit.check.capture and labkit.grading.replay: a check recorded in the student's process and replayed in the grader's gives
the plain check's verdict and message; a record cannot stand in for other inputs, hide labkit's reference, or make the
grader import or unpickle anything."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import record_check

from labkit import bench, check, mlp
from labkit.check import capture
from labkit.check.exercises import exercise
from labkit.grading import replay

SEED = 4242


def _record(monkeypatch, folder, name, fn, seed=SEED):
    return record_check(monkeypatch, folder, name, fn, seed)


def right_backprop(params, x, Y):
    acts = [x]
    for W, b in params:
        acts.append(mlp.sigmoid(acts[-1] @ W.T + b))
    delta = (acts[-1] - Y) * acts[-1] * (1 - acts[-1]) / x.shape[0]
    grads = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        grads[i] = (delta.T @ acts[i], delta.sum(axis=0))
        if i:
            delta = (delta @ params[i][0]) * acts[i] * (1 - acts[i])
    return grads


def right_topk(g, residual, ratio):
    import math

    corrected = g + residual
    n = corrected.size
    k = min(n, max(1, math.ceil(ratio * n)))
    idx = np.argpartition(np.abs(corrected), n - k)[n - k:]
    new = corrected.copy()
    new[idx] = 0
    return idx, corrected[idx], new


def right_accumulate(params, x, Y, acc):
    total = 0.0
    for k in range(x.shape[0]):
        loss, grads = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        total += loss
        for (aW, ab), (dW, db) in zip(acc, grads):
            aW += dW
            ab += db
    return total


def right_gustafson(t1, tp):
    s = t1 / tp
    if s.size < 2:
        raise ValueError("one rank count")
    x = np.arange(1, s.size)  # p - 1 of the rows p > 1
    return s, float(np.sum((x + 1 - s[1:]) * x) / np.sum(x * x))


CASES = {
    "backprop": (right_backprop, lambda p, x, Y: [(a, 2 * b) for a, b in right_backprop(p, x, Y)]),
    "accumulate": (right_accumulate, lambda p, x, Y, acc: right_accumulate(p, x, Y, acc) * 2),
    "topk_feedback": (right_topk, lambda g, r, ratio: right_topk(g, 0 * r, ratio)),
    "karp_flatt": (lambda p, s: (1 / s - 1 / p) / (1 - 1 / p), lambda p, s: 1 / s - 1 / p),
    "gustafson_fit": (right_gustafson, lambda t1, tp: (t1 / tp, 0.5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_replay_gives_the_checks_own_verdict_and_message(tmp_path, monkeypatch, name):
    right, wrong = CASES[name]
    assert _record(monkeypatch, tmp_path / "right", name, right) == (True, "")
    assert replay.replay(name, tmp_path / "right", SEED)[0] is True
    plain = _record(monkeypatch, tmp_path / "wrong", name, wrong)
    assert plain[0] is False
    # word for word the message the student saw, less the step of the derivation the student's failed run was shown
    student_saw = (plain[0], re.sub(r"\nStep \d+ of \d+.*", "", plain[1], flags=re.S))
    named = "\nHint: " in plain[1].split("\nStep ")[0]  # a named mistake has its own hint, and no step
    assert ("\nStep " in plain[1]) == (bool(exercise(name).hints) and not named)
    assert replay.replay(name, tmp_path / "wrong", SEED) == student_saw
    # the grader's inputs are its own draw: a record made on other inputs answers nothing
    passed, message = replay.replay(name, tmp_path / "right", SEED + 1)
    assert not passed and "was not recorded" in message


def test_plain_mode_records_nothing_and_draws_the_usual_inputs(tmp_path, monkeypatch):
    monkeypatch.delenv(capture.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    check.backprop(right_backprop)
    assert not list(tmp_path.iterdir())
    assert capture.seed(7) == 7 and capture.mode() == "plain"


@pytest.mark.parametrize("fn", [mlp.backprop, lambda p, x, Y: mlp.backprop(p, x, Y),
                                lambda p, x, Y: mlp.loss_and_grads(p, x, Y)[1]])
def test_labkits_reference_as_or_in_the_students_function_is_named(tmp_path, monkeypatch, fn):
    assert _record(monkeypatch, tmp_path, "backprop", fn) == (True, "")  # it passes in the notebook...
    passed, message = replay.replay("backprop", tmp_path, SEED)  # ...but not in the grade
    assert not passed and "uses labkit's reference (labkit.mlp." in message


def _copied(fn, name: str, by: str):
    """labkit's ``fn`` compiled again under ``name`` from its source, as a student's run could: by
    inspect.getsource, or by reading its file."""
    if by == "getsource":
        text = inspect.getsource(fn)
    else:
        lines = Path(inspect.getsourcefile(fn)).read_text().splitlines(keepends=True)
        first = next(i for i, line in enumerate(lines) if line.startswith(f"def {fn.__name__}("))
        end = next((i for i in range(first + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "")), len(lines))
        text = "".join(lines[first:end])
    tree = ast.parse(text)
    tree.body[0].name = name
    if ast.get_docstring(tree.body[0]) is not None:
        tree.body[0].body.pop(0)  # a copy without the docstring is still a copy
    space = {**vars(importlib.import_module(fn.__module__))}
    exec(compile(tree, "<student>", "exec"), space)  # noqa: S102 - the attack under test
    return space[name]


@pytest.mark.parametrize("by", ["getsource", "file"])
@pytest.mark.parametrize("name, ref", [("karp_flatt", bench.karp_flatt), ("gustafson_fit", bench.fit_gustafson_times)])
def test_labkits_reference_copied_from_its_source_at_run_time_is_named(tmp_path, monkeypatch, name, ref, by):
    """exec(inspect.getsource(...)), or labkit's file read and run: the same code under another name, its docstring
    dropped, is still labkit's answer; the honest formula beside it (CASES) is not."""
    copy = _copied(ref, "mine", by)
    assert copy.__code__ is not ref.__code__ and copy.__doc__ is None
    assert _record(monkeypatch, tmp_path, name, copy) == (True, "")
    passed, message = replay.replay(name, tmp_path, SEED)
    assert not passed and f"uses labkit's reference (labkit.bench.{ref.__name__}, its source copied)" in message
    wrapped = lambda *a: copy(*a)  # noqa: E731 - called from the student's own function
    assert _record(monkeypatch, tmp_path / "inside", name, wrapped) == (True, "")
    assert "its source copied" in replay.replay(name, tmp_path / "inside", SEED)[1]


def test_helpers_of_labkit_that_are_not_the_reference_are_allowed(tmp_path, monkeypatch):
    """Lab 02's accumulator calls mlp.loss_and_grads_per_sample, which calls the per-sample sum inside labkit."""
    assert _record(monkeypatch, tmp_path, "accumulate", right_accumulate) == (True, "")
    assert replay.replay("accumulate", tmp_path, SEED)[0] is True


def test_a_forged_record_makes_the_grader_import_and_unpickle_nothing(tmp_path, monkeypatch):
    _record(monkeypatch, tmp_path, "karp_flatt", CASES["karp_flatt"][0])
    path = tmp_path / "karp_flatt.r0.json"
    record = json.loads(path.read_text())
    for entry in record["entries"]:
        entry.pop("result", None)
        entry["raised"] = {"type": "SystemExit", "module": "labkit.__main__", "message": "forged"}
    path.write_text(json.dumps(record))
    sys.modules.pop("labkit.__main__", None)
    passed, message = replay.replay("karp_flatt", tmp_path, SEED)
    assert not passed and "SystemExit: forged" in message and "labkit.__main__" not in sys.modules
    np.savez(tmp_path / "karp_flatt.r0.npz", a0=np.array([object()], dtype=object))  # an array only pickle can read
    passed, message = replay.replay("karp_flatt", tmp_path, SEED)
    assert not passed and "no readable record" in message
    assert replay.replay("no_such_check", tmp_path, SEED) == (False, f"no_such_check: no such check in labkit "
                                                                         f"{__import__('labkit').__version__}")
