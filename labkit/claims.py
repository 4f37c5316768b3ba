"""What a lab notebook calls to publish its key numbers and check its text against its run: :func:`record` and
:func:`claim`, shown in the notebook as display data that the report (:mod:`labkit.report`) and the notebook tests
read back (:func:`labkit.runner.collect`)."""

from __future__ import annotations

import math

METRIC_MIME = "application/vnd.labkit.metric+json"
CLAIM_MIME = "application/vnd.labkit.claim+json"


def record(name: str, value, unit: str = "", note: str = "") -> None:
    """Show a key number in the notebook and mark it for the report (e.g. ``record("test accuracy", 0.953, "%")``)."""
    from IPython.display import display

    text = format_metric(name, value, unit)
    if isinstance(value, float) and not math.isfinite(value):
        value = str(value)  # JSON has no NaN or infinity; the report shows "nan" as it is
    display({METRIC_MIME: {"name": name, "value": value, "unit": unit, "note": note}, "text/plain": text}, raw=True)


def claim(statement: str, holds, reading: str) -> None:
    """Check a sentence of the lab's text against this run's measurement and show whether it held.

    ``statement`` is the lesson as the text puts it ("error feedback closes the top-k gap"), ``holds`` the test
    of it on the numbers just measured, ``reading`` those numbers in words. A claim that does not hold is
    shown, not raised: the notebook goes on, the report lists it, and the notebook tests fail on it.
    """
    from IPython.display import display

    holds = bool(holds)
    text = f"{'✔ holds' if holds else '✘ does not hold in this run'}: {statement} ({reading})"
    display({CLAIM_MIME: {"statement": statement, "holds": holds, "reading": reading}, "text/plain": text}, raw=True)


def format_metric(name: str, value, unit: str) -> str:
    if unit == "%" and isinstance(value, float):
        return f"{name}: {value:.2%}"
    if unit == "x" and isinstance(value, float):
        return f"{name}: {value:.2f}x"
    if unit == "points" and isinstance(value, float):
        return f"{name}: {value:.2f} percentage points"
    if isinstance(value, float):
        text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        return f"{name}: {text} {unit}".rstrip()
    return f"{name}: {value} {unit}".rstrip()
