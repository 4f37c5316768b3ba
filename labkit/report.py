"""Run the lab notebooks headlessly and collect their figures and key numbers into one HTML page.

Run: ``labkit report [--profile quick|full] [--out DIR]``

Each notebook is executed with nbclient in a fresh kernel, with ``PROFILE`` injected after its
cell tagged ``parameters`` (as papermill does) and a timeout per cell. A notebook that fails is
shown with its error and the others still run. Notebooks publish key numbers with :func:`record`.

The report is what instructors publish, so the executed notebooks it writes (``.ipynb`` and ``.html``) show each
exercise as students get it, its solution region a stub and each written answer blank, above the outputs of the
instructor's run; ``solutions=True`` (``labkit report --solutions``) keeps the solution code and model answers.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from .labs import NOTEBOOKS
from .progress import progress_bar

METRIC_MIME = "application/vnd.labkit.metric+json"
CLAIM_MIME = "application/vnd.labkit.claim+json"
ANSI_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def record(name: str, value, unit: str = "", note: str = "") -> None:
    """Show a key number in the notebook and mark it for the report (e.g. ``record("test accuracy", 0.953, "%")``)."""
    from IPython.display import display

    text = _format_metric(name, value, unit)
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


def _format_metric(name: str, value, unit: str) -> str:
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


@dataclass
class NotebookResult:
    """What running one notebook gave."""

    name: str
    title: str
    ok: bool = False
    seconds: float = 0.0
    error: str | None = None
    figures: list[str] = field(default_factory=list)  # base64 PNGs
    metrics: list[dict] = field(default_factory=list)
    claims: list[dict] = field(default_factory=list)  # {"statement", "holds", "reading"} from report.claim
    executed: Path | None = None
    html: Path | None = None  # the executed notebook exported to HTML, for a browser


def find_notebooks(folder: Path | str = NOTEBOOKS, only: str | None = None) -> list[Path]:
    """The numbered lab notebooks (``NN_name.ipynb``) in order, optionally only those whose name contains ``only``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no notebooks folder at {folder}; pass --notebooks DIR")
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if only:
        found = [p for p in found if only in p.name]
    if not found:
        raise FileNotFoundError(f"no lab notebooks (NN_name.ipynb) in {folder}" + (f" matching {only!r}" if only else ""))
    return found


def inject_parameters(nb, params: dict) -> None:
    """Insert a cell assigning ``params`` right after the cell tagged "parameters" (or first)."""
    import nbformat

    src = "# Parameters injected by labkit report\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]})
    idx = next((i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), -1)
    nb.cells.insert(idx + 1, cell)


def _title(nb, fallback: str) -> str:
    for c in nb.cells:
        if c.cell_type == "markdown":
            for line in c.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def collect(nb, result: NotebookResult) -> None:
    """Gather figures and recorded metrics from an executed notebook."""
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        for out in c.get("outputs", []):
            data = out.get("data", {})
            if METRIC_MIME in data:
                m = data[METRIC_MIME]
                result.metrics.append(json.loads(m) if isinstance(m, str) else dict(m))
            elif CLAIM_MIME in data:
                m = data[CLAIM_MIME]
                result.claims.append(json.loads(m) if isinstance(m, str) else dict(m))
            elif "image/png" in data:
                result.figures.append(data["image/png"].replace("\n", ""))


def execute(path: Path, out_dir: Path, params: dict, timeout: int = 600, progress: bool | None = None,
            env: dict[str, str | None] | None = None, allow_errors: bool = False,
            solutions: bool = True) -> NotebookResult:
    """Execute one notebook into ``out_dir`` and return what it produced (never raises for notebook errors).

    ``env`` changes the kernel's environment: a value of None removes the variable (e.g. ``{"LABKIT_DATA": None}``
    runs the lab on the default data). With ``allow_errors`` every cell runs whatever the cells above it raised
    (a student's version, as a student would run it to the end); the errors are in ``result.executed``. Without
    ``solutions`` the files written show the exercises as handed out (:func:`published`), the run's outputs kept."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    result = NotebookResult(name=path.name, title=_title(nb, path.stem))
    inject_parameters(nb, params)
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    bar = progress_bar(total=n_code, enable=progress, desc=f"  {path.name}", unit="cell", leave=False)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=allow_errors,
                            # the kernel listens on 127.0.0.1 only; its warning about plain TCP is noise here
                            extra_arguments=["--IPKernelApp.log_level=ERROR"],
                            resources={"metadata": {"path": str(path.parent)}},
                            on_cell_executed=lambda **kw: bar.update(1) if kw["cell"].cell_type == "code" else None)
    # the kernel's environment: inline figures, no progress widgets in the saved notebooks
    changes = {"MPLBACKEND": "module://matplotlib_inline.backend_inline", "LABKIT_PROGRESS": "0", **(env or {})}
    env = {k: v for k, v in {**os.environ, **changes}.items() if v is not None}
    t0 = time.perf_counter()
    try:
        client.execute(env=env)
        result.ok = True
    except CellTimeoutError as e:
        result.error = f"a cell ran longer than the {timeout} s limit and was stopped:\n{ANSI_ESCAPES.sub('', str(e))}"
    except CellExecutionError as e:
        result.error = ANSI_ESCAPES.sub("", str(e))
    except DeadKernelError as e:
        result.error = f"the kernel died (out of memory, or a crash in compiled code): {e}"
    except Exception as e:  # a missing kernel, a broken notebook file: report it, run the others
        result.error = f"{type(e).__name__}: {e}"
    finally:
        bar.close()
    result.seconds = time.perf_counter() - t0
    out_dir.mkdir(parents=True, exist_ok=True)
    collect(nb, result)
    if not solutions:
        try:
            nb = published(nb)
        except ValueError as e:  # unpaired solution markers: publish nothing of this notebook rather than leak
            result.ok, result.error = False, f"not published, its solutions could not be taken out: {e}"
            return result
    result.executed = out_dir / path.name
    nbformat.write(nb, result.executed)
    result.html = export_html(nb, out_dir / f"{path.stem}.html")
    return result


def published(nb):
    """A copy of an executed notebook as it may be published: each solution region replaced by its stub and each
    answer cell as handed out (:mod:`labkit.grading.assign`), the outputs of the run kept. Raises ValueError for
    solution markers that do not pair up."""
    import nbformat

    from .grading import answers, assign

    nb = nbformat.from_dict(nb)
    for i, cell in enumerate(nb.cells):
        if answers.meta(cell):
            cell.source = answers.student_source(cell)
        elif cell.cell_type == "code":
            try:
                cell.source = assign.student_source(cell.source)
            except ValueError as e:
                raise ValueError(f"{nb.metadata.get('name', 'the notebook')}, cell {i}: {e}") from None
    return nb


MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"


def local_mathjax(folder: Path) -> str | None:
    """MathJax copied into ``folder``/mathjax from the installed jupyter-server-mathjax (once), so that a page there
    renders its math with no network (lab machines, air-gapped clusters); the URL a page in ``folder`` loads it by,
    or None where the package is missing (the page then falls back to nbconvert's CDN)."""
    import shutil

    try:
        import jupyter_server_mathjax
    except ImportError:
        return None
    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    target = Path(folder) / "mathjax"
    if not (target / "MathJax.js").is_file():
        shutil.copytree(source, target, dirs_exist_ok=True)
    return f"mathjax/MathJax.js?config={MATHJAX_CONFIG}"


# nbconvert's lab page, less what it would fetch from a CDN and these pages never need: require.js (for widgets,
# which the executed labs do not save) and mermaid (for diagrams, which they do not draw)
_OFFLINE_PAGE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def offline_exporter(html_exporter, mathjax_url: str):
    import jinja2

    return html_exporter(mathjax_url=mathjax_url, template_file="labkit_offline.html.j2",
                         extra_loaders=[jinja2.DictLoader({"labkit_offline.html.j2": _OFFLINE_PAGE})])


# MathML Core, as browsers render it without a script (Chromium 109+, Firefox, Safari), and the attributes a
# converted formula needs: anything else (an href, an event handler, a tag in \text{...}) is dropped
MATHML_ELEMENTS = frozenset("math semantics annotation mrow mi mn mo ms mtext mspace msub msup msubsup mfrac msqrt mroot "
                            "mstyle merror mpadded mphantom menclose munder mover munderover mtable mtr mtd mmultiscripts "
                            "mprescripts none".split())
MATHML_ATTRIBUTES = frozenset("display stretchy mathvariant fence separator lspace rspace form largeop movablelimits "
                              "symmetric minsize maxsize accent accentunder linethickness columnalign rowalign "
                              "columnspacing rowspacing columnlines rowlines displaystyle scriptlevel width height "
                              "depth notation encoding".split())
_MATHML_NS = "{http://www.w3.org/1998/Math/MathML}"


def tex_to_mathml(tex: str, display: bool = False) -> str:
    """TeX math as MathML that a browser renders with no script and no network; the TeX shown as code where it
    cannot be converted. Only MathML elements and layout attributes are kept, whatever the TeX held."""
    import xml.etree.ElementTree as ET

    from latex2mathml.converter import convert

    tex = tex.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")  # as escaped by the markdown parser
    try:
        root = ET.fromstring(convert(tex, display="block" if display else "inline"))
    except Exception:  # noqa: BLE001 - TeX the converter cannot read, or output that is not well formed
        return f"<code>{html.escape(tex)}</code>"
    for el in root.iter():
        tag = el.tag.removeprefix(_MATHML_NS)
        el.tag = tag if tag in MATHML_ELEMENTS else "mrow"
        for name in [a for a in el.attrib if a not in MATHML_ATTRIBUTES]:
            del el.attrib[name]
    root.set("xmlns", "http://www.w3.org/1998/Math/MathML")
    text = ET.tostring(root, encoding="unicode", short_empty_elements=False)
    return f"<span class='labkit-math'>{text}</span>" if display else text


# a page that travels alone: nbconvert's lab page with its math as MathML, and nothing loaded from anywhere
_STANDALONE_PAGE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js_mathjax -%}
<style>.labkit-math{display:block;margin:1em 0;text-align:center;overflow-x:auto}</style>
{%- endblock html_head_js_mathjax -%}
"""


def standalone_exporter():
    """An nbconvert HTML exporter whose pages need no file beside them and no network: math converted to MathML
    (:func:`tex_to_mathml`) when the page is written, figures embedded, no script loaded."""
    import jinja2
    from nbconvert import HTMLExporter
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    class MathMLRenderer(IPythonRenderer):
        def block_math(self, body: str) -> str:
            return tex_to_mathml(body, display=True)

        def inline_math(self, body: str) -> str:
            return tex_to_mathml(body)

        def latex_environment(self, name: str, body: str) -> str:
            return tex_to_mathml(f"\\begin{{{name}}}{body}\\end{{{name}}}", display=True)

    class StandaloneExporter(HTMLExporter):
        def markdown2html(self, context, source):
            cell = context.get("cell", {})
            renderer = MathMLRenderer(escape=False, attachments=cell.get("attachments", {}),
                                      anchor_link_text=self.anchor_link_text, exclude_anchor_links=True)
            return MarkdownWithMath(renderer=renderer).render(source)

    StandaloneExporter.markdown2html = jinja2.pass_context(StandaloneExporter.markdown2html)
    return StandaloneExporter(template_file="labkit_standalone.html.j2",
                              extra_loaders=[jinja2.DictLoader({"labkit_standalone.html.j2": _STANDALONE_PAGE})])


def without_injected(nb):
    """A copy of ``nb`` without the cell that :func:`inject_parameters` added: machinery no reader needs to see."""
    import nbformat

    nb = nbformat.from_dict(nb)
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    return nb


def export_html(nb, path: Path) -> Path | None:
    """The executed notebook as one HTML page (nbconvert, figures embedded, MathJax beside it: no network needed);
    None if nbconvert cannot do it."""
    try:
        from nbconvert import HTMLExporter

        url = local_mathjax(path.parent)
        body, _ = (offline_exporter(HTMLExporter, url) if url else HTMLExporter()).from_notebook_node(nb)
    except Exception as e:  # noqa: BLE001 - the report is still useful without this page
        print(f"labkit report: could not export {path.name} to HTML ({type(e).__name__}: {e})")
        return None
    path.write_text(body, encoding="utf-8")
    return path


def try_fetch_once(progress: bool | None = None, timeout: float = 10.0) -> bool:
    """Without the full MNIST, try ``labkit data fetch`` once, giving each mirror ``timeout`` seconds: the labs then
    run on MNIST where there is a network, and on the shipped subset, after a line saying so, where there is none."""
    from . import data

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
    """Execute every lab notebook and write ``out/index.html``; return the results and the page's path.

    ``fetch``: without the full MNIST, first try to download it once (:func:`try_fetch_once`). ``solutions``: the
    executed notebooks keep their solution code (for instructors); without it they are safe to publish."""
    if profile not in ("quick", "full"):
        raise ValueError(f"profile must be 'quick' or 'full', got {profile!r}")
    out = Path(out)
    paths = find_notebooks(notebooks, only)
    if fetch:
        try_fetch_once(progress)
    results = []
    t0 = time.perf_counter()
    for path in progress_bar(paths, enable=progress, desc="notebooks", unit="nb"):
        results.append(execute(path, out, {"PROFILE": profile}, timeout, progress, solutions=solutions))
    page = write_html(results, out, profile, time.perf_counter() - t0)
    return results, page


def summary(results: list[NotebookResult], page: Path) -> str:
    """A one-screen summary: each notebook's status, time and first few key numbers."""
    lines = []
    for r in results:
        status = "ok  " if r.ok else "FAIL"
        nums = "; ".join(_format_metric(m["name"], m["value"], m.get("unit", "")) for m in r.metrics[:3])
        lines.append(f"{status} {r.name:<32} {r.seconds:6.1f} s  {len(r.figures):2d} fig  {nums}")
        if not r.ok:
            last = [ln for ln in (r.error or "").strip().splitlines() if ln.strip()][-1:] or ["(no message)"]
            lines.append(f"     {last[0][:150]}")
    n_ok = sum(r.ok for r in results)
    from .data import status as data_status

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
    from . import __version__
    from .bench import machine_info
    from .data import status as data_status

    esc = html.escape
    info = machine_info()
    rows = []
    for r in results:
        nums = "<br>".join(esc(_format_metric(m["name"], m["value"], m.get("unit", ""))) for m in r.metrics[:4])
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
                f"<tr><td>{esc(m['name'])}</td><td>{esc(_format_metric('', m['value'], m.get('unit', ''))[2:])}</td>"
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

