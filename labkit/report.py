"""The labs' report: every lab notebook run headlessly (:mod:`labkit.runner`), its figures, key numbers and claims
(:mod:`labkit.claims`) gathered into one HTML page.

Run: ``labkit report [--profile quick|full] [--out DIR]``

A notebook that fails is shown with its error and the others still run.

The report is what instructors publish, so the executed notebooks it writes (``.ipynb`` and ``.html``) show each
exercise as students get it, its solution region a stub and each written answer blank, above the outputs of the
instructor's run, less the model predictions: a comparison of a prediction with its measurement shows the
measurement alone (:data:`labkit.questions.PREDICTION_MIME`). ``solutions=True`` (``labkit report --solutions``)
keeps the solution code, model answers and predictions.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

from . import __version__, data, handout
from .bench import machine_info
from .claims import format_metric
from .data import status as data_status
from .labs import NOTEBOOKS, is_draft
from .progress import progress_bar
from .questions import PREDICTION_MIME, YOURS
from .runner import NotebookResult, execute, find_notebooks, with_solutions


def published(nb):
    """A copy of an executed notebook as it may be published: each solution region replaced by its stub and each
    answer cell as handed out (:mod:`labkit.handout`) with no output, the outputs of the run kept but for its model
    predictions (:func:`without_prediction`). Raises ValueError for solution markers that do not pair up."""
    import nbformat

    nb = nbformat.from_dict(nb)
    for i, cell in enumerate(nb.cells):
        if handout.answer_meta(cell):
            cell.source = handout.blank_answer(cell)
            if cell.cell_type == "code":
                cell.outputs = []  # whatever the model prediction's cell showed would show the prediction
        elif cell.cell_type == "code":
            try:
                cell.source = handout.stub_solutions(cell.source)
            except ValueError as e:
                raise ValueError(f"{nb.metadata.get('name', 'the notebook')}, cell {i}: {e}") from None
            cell.outputs = [without_prediction(out) for out in cell.outputs]
    return nb


def without_prediction(out):
    """An output as published: a prediction beside its measurement (display data marked
    :data:`~labkit.questions.PREDICTION_MIME`) becomes the line that names the measurement alone; any other output
    is kept as it is."""
    from nbformat.v4 import new_output

    marked = out.get("data", {}).get(PREDICTION_MIME)
    if marked is None:
        return out
    marked = json.loads(marked) if isinstance(marked, str) else marked
    return new_output("display_data", data={"text/plain": str(marked.get("published", f"your prediction: {YOURS}"))})


def try_fetch_once(progress: bool | None = None, timeout: float = 10.0) -> bool:
    """Without the full MNIST, try ``labkit data fetch`` once, giving each mirror ``timeout`` seconds: the labs then
    run on MNIST where there is a network, and on the shipped subset, after a line saying so, where there is none."""
    try:
        if data.locate("mnist").kind != "subset":
            return False  # MNIST is here (or LABKIT_DATA names a place without it: the labs say so themselves)
    except data.DataError:
        return False
    print(f"No full MNIST found: trying `labkit data fetch` once ({timeout:.0f} s per mirror)...", flush=True)
    try:
        folder = data.fetch("mnist", progress=progress, timeout=timeout)
    except data.DataError as e:
        reason = next((ln.strip() for ln in str(e).splitlines()[1:2]), str(e))
        print(f"  no download ({reason[:160]}).\n  The labs run on {data.SUBSET_DESCRIPTION}.", flush=True)
        return False
    print(f"  fetched and verified MNIST into {folder}", flush=True)
    return True


def run(profile: str = "quick", out: Path | str = "report", notebooks: Path | str = NOTEBOOKS, only: str | None = None,
        timeout: int = 600, progress: bool | None = None, fetch: bool = True,
        solutions: bool = False) -> tuple[list[NotebookResult], Path]:
    """Execute every lab notebook (a draft only when ``only`` names it) and write ``out/index.html``; return the
    results and the page's path.

    ``fetch``: without the full MNIST, first try to download it once (:func:`try_fetch_once`). ``solutions``: the
    executed notebooks keep their solution code (for instructors); without it they are safe to publish."""
    if profile not in ("quick", "full"):
        raise ValueError(f"profile must be 'quick' or 'full', got {profile!r}")
    out = Path(out)
    paths = with_solutions(find_notebooks(notebooks, only), "labkit report")  # the labs' claims rest on their solutions
    if only is None:  # a lab still being written is run only when named (--only 13)
        paths = [p for p in paths if not is_draft(p.name)]
    if fetch:
        try_fetch_once(progress)
    results = []
    t0 = time.perf_counter()
    for path in progress_bar(paths, enable=progress, desc="notebooks", unit="nb"):
        results.append(execute(path, out, {"PROFILE": profile}, timeout, progress,
                               publish=None if solutions else published))
    page = write_html(results, out, profile, time.perf_counter() - t0)
    return results, page


def summary(results: list[NotebookResult], page: Path) -> str:
    """A one-screen summary: each notebook's status, time and first few key numbers."""
    lines = []
    for r in results:
        status = "ok  " if r.ok else "FAIL"
        nums = "; ".join(format_metric(m["name"], m["value"], m.get("unit", "")) for m in r.metrics[:3])
        lines.append(f"{status} {r.name:<32} {r.seconds:6.1f} s  {len(r.figures):2d} fig  {nums}")
        if not r.ok:
            last = [ln for ln in (r.error or "").strip().splitlines() if ln.strip()][-1:] or ["(no message)"]
            lines.append(f"     {last[0][:150]}")
    n_ok = sum(r.ok for r in results)

    claims = [(r.name, c) for r in results for c in r.claims]
    if claims:
        lines.append(f"claims of the labs' text checked on this run: {sum(c['holds'] for _, c in claims)} of "
                     f"{len(claims)} held" + "".join(f"\n     not held: {name[:2]}: {c['statement']} ({c['reading']})"
                                                  for name, c in claims if not c["holds"]))
    lines.append("data: " + data_status()[0])  # the shipped subset or the full MNIST: the figures depend on it
    lines.append(f"{n_ok}/{len(results)} notebooks passed. Report: {page.resolve()}")
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em} .meta{color:#666;font-size:.9em} table{border-collapse:collapse;margin:1em 0}
td,th{border-bottom:1px solid #ddd;padding:.35em .8em;text-align:left;vertical-align:top}
.ok{color:#2a7d2a;font-weight:600} .fail{color:#c62828;font-weight:600}
section{border-top:2px solid #eee;margin-top:2em;padding-top:1em}
pre{background:#fff4f4;border-left:4px solid #c62828;padding:.8em;overflow-x:auto;font-size:.85em;white-space:pre-wrap}
img{max-width:100%;margin:.5em 0;border:1px solid #eee} .metrics td:nth-child(2){font-variant-numeric:tabular-nums}
"""


def write_html(results: list[NotebookResult], out: Path, profile: str, seconds: float) -> Path:
    """One self-contained page: summary table, then per notebook its numbers, error and figures."""
    esc = html.escape
    info = machine_info()
    rows = []
    for r in results:
        nums = "<br>".join(esc(format_metric(m["name"], m["value"], m.get("unit", ""))) for m in r.metrics[:4])
        cls, word = ("ok", "passed") if r.ok else ("fail", "failed")
        rows.append(f"<tr><td><a href='#{esc(r.name)}'>{esc(r.title)}</a><br><small>{esc(r.name)}</small></td>"
                    f"<td class='{cls}'>{word}</td><td>{r.seconds:.1f} s</td><td>{len(r.figures)}</td><td>{nums}</td></tr>")
    sections = []
    for r in results:
        parts = [f"<section id='{esc(r.name)}'><h2>{esc(r.title)}</h2>",
                 "<p class='meta'>" + (f"<a href='{esc(r.html.name)}'>executed notebook</a> · " if r.html else "")
                 + f"<a href='{esc(r.name)}'>.ipynb</a> · {r.seconds:.1f} s</p>"]
        if r.error:
            parts.append(f"<pre>{esc(r.error[-6000:])}</pre>")
        if r.claims:
            parts.append("<ul class='claims'>" + "".join(
                f"<li><span class='{'ok' if c['holds'] else 'fail'}'>{'✔' if c['holds'] else '✘ not in this run:'}</span> "
                f"{esc(c['statement'])} <span class='meta'>({esc(c['reading'])})</span></li>" for c in r.claims) + "</ul>")
        if r.metrics:
            parts.append("<table class='metrics'>" + "".join(
                f"<tr><td>{esc(m['name'])}</td><td>{esc(format_metric('', m['value'], m.get('unit', ''))[2:])}</td>"
                f"<td>{esc(m.get('note', ''))}</td></tr>" for m in r.metrics) + "</table>")
        parts += [f"<img alt='figure {i + 1} of {esc(r.name)}' src='data:image/png;base64,{fig}'>"
                  for i, fig in enumerate(r.figures)]
        parts.append("</section>")
        sections.append("\n".join(parts))
    n_ok = sum(r.ok for r in results)
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>labkit report</title><style>{_CSS}</style></head><body>
<h1>labkit report</h1>
<p class="meta">{time.strftime('%Y-%m-%d %H:%M')} · profile <b>{esc(profile)}</b> ·
{n_ok}/{len(results)} notebooks passed in {seconds:.0f} s ·
labkit {__version__} · Python {info['python']}, NumPy {info['numpy']}, {esc(str(info.get('blas', '?')))} · {info['cpus']} CPUs<br>
data: {esc(data_status()[0])}</p>
<table><tr><th>lab</th><th>status</th><th>time</th><th>figures</th><th>key numbers</th></tr>{''.join(rows)}</table>
{''.join(sections)}
</body></html>"""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path
