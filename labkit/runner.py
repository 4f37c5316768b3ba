"""Running a lab notebook headlessly and writing it as a page: what the report and the grader share.

Each notebook is executed with nbclient in a fresh kernel, with ``PROFILE`` injected after its cell tagged
``parameters`` (as papermill does) and a time limit per cell; what it recorded and claimed (:mod:`labkit.claims`)
and its figures are collected into a :class:`NotebookResult`. Its HTML page needs no network: MathJax beside it
(:func:`export_html`), or its math as MathML for a page that travels alone (:func:`standalone_exporter`).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .claims import CLAIM_MIME, METRIC_MIME
from .errors import LabkitError
from .handout import is_handout
from .labs import NOTEBOOKS
from .progress import progress_bar

ANSI_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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
    claims: list[dict] = field(default_factory=list)  # {"statement", "holds", "reading"} from claims.claim
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


class NoSolutions(LabkitError, FileNotFoundError):
    """The notebooks given are the handouts an installed labkit ships, where the worked solutions are needed."""


def with_solutions(paths: list[Path], what: str, elsewhere: str = ", or give --notebooks DIR with the instructor's "
                   "notebooks") -> list[Path]:
    """``paths``, the instructor's notebooks; :class:`NoSolutions`, naming ``what`` needs them and where they are,
    where any is a handout (an installed labkit ships the student versions alone, so no graded notebook reads a
    solution from it)."""
    handouts = [p.name for p in paths if is_handout(json.loads(p.read_text(encoding="utf-8")))]
    if handouts:
        raise NoSolutions(f"{what} needs the instructor's notebooks, with the worked solutions; {handouts[0]} in "
                          f"{paths[0].parent} is the student version an installed labkit ships. Run it from the "
                          f"course's checkout (its notebooks/ folder){elsewhere}.")
    return paths


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
            publish=None) -> NotebookResult:
    """Execute one notebook into ``out_dir`` and return what it produced (never raises for notebook errors).

    ``env`` changes the kernel's environment: a value of None removes the variable (e.g. ``{"LABKIT_DATA": None}``
    runs the lab on the default data). With ``allow_errors`` every cell runs whatever the cells above it raised
    (a student's version, as a student would run it to the end); the errors are in ``result.executed``. ``publish``
    turns the executed notebook into the one written (:func:`labkit.report.published`: the exercises as handed out,
    the run's outputs kept); None writes it as it ran."""
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
    if publish is not None:
        try:
            nb = publish(nb)
        except ValueError as e:  # unpaired solution markers: publish nothing of this notebook rather than leak
            result.ok, result.error = False, f"not published, its solutions could not be taken out: {e}"
            return result
    result.executed = out_dir / path.name
    nbformat.write(nb, result.executed)
    result.html = export_html(nb, out_dir / f"{path.stem}.html")
    return result


MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"


def local_mathjax(folder: Path) -> str | None:
    """MathJax copied into ``folder``/mathjax from the installed jupyter-server-mathjax (once), so that a page there
    renders its math with no network (lab machines, air-gapped clusters); the URL a page in ``folder`` loads it by,
    or None where the package is missing (the page then falls back to nbconvert's CDN)."""
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
