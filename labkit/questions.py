"""Predict, then measure: the cell after an experiment sets the student's prediction beside what happened.

A lab asks for a prediction in an answer cell above the experiment (``predicted_speedup = ...``); the cell after the
experiment calls :func:`compare`. It only shows a line: predictions are read and scored by the instructor (``labkit
grade`` collects them into ``answers.html``), never by the machine, and a prediction left blank is said to be blank.

In a notebook the line is display data marked :data:`PREDICTION_MIME`, which carries the same line without the
prediction: the report's published copy of the instructor's run (:func:`labkit.report.published`) shows that one, so
the model predictions are never published while their measurements are.

:func:`yours_or_labkits` (the function) and :func:`result_of` (its result) let a cell that builds on an exercise run
before the student has written it.
"""

from __future__ import annotations

import ast
import inspect
import math
import numbers
import textwrap

import numpy as np

PREDICTION_MIME = "application/vnd.labkit.prediction+json"
YOURS = "(yours to make)"  # where a published line had the instructor's prediction


def blank(value) -> bool:
    """Whether a prediction was left as handed out: ``...``, None or an empty string."""
    return value is ... or value is None or (isinstance(value, str) and not value.strip())


def compare(predicted, measured, unit: str = "", what: str = "", exact: bool = False,
            mistakes: dict | None = None) -> None:
    """Show the prediction beside the measurement, and how far apart they are (and return nothing, so that a cell
    ending in it shows the line once).

    Numbers are compared by their ratio; with ``exact`` (a count: bank conflicts, messages, rounds) only an equal
    number is right, and a prediction found in ``mistakes`` (value -> what that value counted instead) is named.
    Anything else (a choice such as ``"ring"``) by equality, case and surrounding blanks ignored. A blank or
    unreadable prediction is said to be so; this never raises.
    """
    label = f"{what}: " if what else ""
    u = f" {unit}" if unit else ""
    if blank(predicted):  # no prediction to keep from a published copy: a plain line
        print(f"{label}no prediction: the answer cell above still holds `...`. Write your guess there before you "
              f"run the experiment; the measurement was {_fmt(measured)}{u}.")
        return
    line, measurement = _beside(predicted, measured, u, exact, mistakes or {})
    _show(label + line, {"what": what, "unit": unit, "measurement": measurement,
                         "published": f"{label}your prediction: {YOURS}; {measurement}."})


def _beside(predicted, measured, u: str, exact: bool = False, mistakes: dict | None = None) -> tuple[str, str]:
    """The line setting a prediction beside its measurement, and its part that names the measurement alone."""
    if _number(predicted) and _number(measured):
        p, m = float(predicted), float(measured)
        measurement = f"measured {_fmt(m)}{u}"
        if exact:  # a count: right or off by so many, and why where that number is a known slip
            if p == m:
                return f"you predicted {_fmt(p)}{u}; {measurement}: right.", measurement
            why = next((w for v, w in (mistakes or {}).items() if _number(v) and float(v) == p), "")
            return (f"you predicted {_fmt(p)}{u}; {measurement}: off by {_fmt(abs(p - m))}, and a count is right only "
                    f"when exact" + (f": {why}." if why else "."), measurement)
        if m == 0 or p == 0 or not (math.isfinite(p) and math.isfinite(m)):
            return f"you predicted {_fmt(p)}{u}; {measurement}.", measurement
        ratio = m / p
        closeness = ("within 10 %" if abs(ratio - 1) <= 0.1 else
                     f"the measurement is {ratio:.2g}x your prediction" if ratio > 1 else
                     f"the measurement is {1 / ratio:.2g}x smaller than your prediction")
        return f"you predicted {_fmt(p)}{u}; {measurement}: {closeness}.", measurement
    if isinstance(predicted, str) and isinstance(measured, str):
        same = predicted.strip().lower() == measured.strip().lower()
        measurement = f"it was {measured!r}"
        return f"you predicted {predicted.strip()!r}; {measurement}" + (": right." if same else "."), measurement
    return (f"your prediction {predicted!r} is a {type(predicted).__name__}, the measurement a "
            f"{type(measured).__name__} ({_fmt(measured)}{u}): write a {_kind(measured)} in the answer cell.",
            f"the measurement was {_fmt(measured)}{u}")


def _show(line: str, marked: dict) -> None:
    """Print ``line``; in a notebook, as display data marked :data:`PREDICTION_MIME` (``marked``: the line without
    the prediction, and what it measured), which the report's published copy shows in its place."""
    if _shell() is None:
        print(line)
        return
    from IPython.display import display

    display({PREDICTION_MIME: marked, "text/plain": line}, raw=True)


def written(fn) -> bool:
    """Whether a student's function is written: not the stub as handed out, whose body (after its docstring) is only
    ``raise NotImplementedError``. A function whose source cannot be read counts as written."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return True
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return True
    exc = body[0].exc
    name = exc.func if isinstance(exc, ast.Call) else exc
    return not (isinstance(name, ast.Name) and name.id == "NotImplementedError")


def yours_or_labkits(yours, labkits, *probe, what: str = "your function"):
    """``yours`` (a student's exercise function) once it is written, else ``labkits`` (labkit's own; None: what needs
    it waits) after a line saying so. With ``probe`` arguments it is tried on them, and one that raises counts as not
    ready; without, a function whose body is still the stub as handed out counts as not written (:func:`written`)."""
    why = None
    if probe:
        try:
            yours(*probe)
        except NotImplementedError:
            why = "is not written yet"
        except Exception as e:  # noqa: BLE001 - the student's code: say what it raised, then go on without it
            why = f"raised {type(e).__name__}: {e}"
    elif not written(yours):
        why = "is not written yet"
    if why is None:
        return yours
    print(f"({what} {why}: " + ("labkit's own runs in its place here)" if labkits is not None else
                                "what needs it waits until it runs)"))
    return labkits


def result_of(yours, labkits, *args, what: str = "your function", agree: bool = False):
    """``yours(*args)``, the student's exercise function on the lab's own numbers; while it is not written yet, or
    when it raises (or, with ``agree``, gives another answer than ``labkits(*args)``, to 1e-6), labkit's result stands
    in and a line says so, once per cell run: the lab's later cells run either way."""
    want = labkits(*args) if agree else None
    try:
        got = yours(*args)
    except NotImplementedError:
        _say(f"({what} is not written yet: labkit's stands in for it here)")
        return labkits(*args) if want is None else want
    except Exception as e:  # noqa: BLE001 - the student's code: say what it raised, then go on with labkit's
        _say(f"({what} raised {type(e).__name__}: {e}; labkit's stands in for it here)")
        return labkits(*args) if want is None else want
    if agree and not _same(got, want):
        _say(f"({what} gave another answer than labkit's on these numbers, which stands in for it here; its check "
             "above says what differs)")
        return want
    return got


def _same(a, b) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    except (TypeError, ValueError):
        return False
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=1e-6, atol=1e-12, equal_nan=True))


_said: set = set()


def _shell():
    """IPython's shell this runs in, or None (a script, a test)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _say(line: str) -> None:
    """Print ``line`` once per notebook cell run (IPython's execution count), or once outside IPython."""
    shell = _shell()
    key = (getattr(shell, "execution_count", None), line)
    if key not in _said:
        _said.add(key)
        print(line)


def _number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _kind(x) -> str:
    return "number" if _number(x) else "text in quotes, one of the choices" if isinstance(x, str) else type(x).__name__


def _fmt(x) -> str:
    if _number(x):
        x = float(x)
        return f"{x:,.0f}" if abs(x) >= 1000 and x == int(x) else f"{x:.3g}"
    return repr(x)


__all__ = ["PREDICTION_MIME", "YOURS", "blank", "compare", "result_of", "written", "yours_or_labkits"]
