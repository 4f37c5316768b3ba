"""JupyterLab in a real browser: lab 01 opened through the web interface, every cell run, the result checked.

Playwright drives the system's Chromium (Debian's ``chromium`` package; ``LABKIT_CHROMIUM`` names another
binary). Without one the test is skipped with the reason, unless ``LABKIT_REQUIRE_BROWSER=1`` (set by CI, which
installs Chromium), where a missing browser fails it. JupyterLab is started as a student starts it, by ``labkit lab``,
here with ``--solutions``: lab 01 with its exercises solved, copied into a temporary folder, so that the run and the
save leave the repository's notebooks untouched. (The student's copies stop at the first exercise's check; their run
headlessly is tests/test_notebooks.py's.)
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from labkit import runner, settings

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "01_serial_backprop.ipynb"
pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.notebooks, pytest.mark.slow]  # JupyterLab runs lab 01


def _missing(reason: str):
    if settings.require_browser():
        pytest.fail(f"{reason}; LABKIT_REQUIRE_BROWSER=1 says this machine must run the browser test")
    pytest.skip(reason)


def _chromium() -> str:
    named = settings.chromium()
    for candidate in [str(named)] if named else ["chromium", "chromium-browser", "google-chrome"]:
        found = shutil.which(candidate)
        if found:
            return found
    _missing("no Chromium installed (Debian: apt-get install chromium; or set LABKIT_CHROMIUM)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab through ``labkit lab --solutions`` on 127.0.0.1 with a random token; yields (url, token, the
    folder it serves)."""
    folder = tmp_path / "labkit-solutions"  # labkit lab --solutions puts them beside the work folder
    settings = tmp_path / "settings" / "@jupyterlab"
    # render every cell (JupyterLab 4 otherwise draws only the cells in view) and ask no news server
    for ext, name, value in (("notebook-extension", "tracker", {"windowingMode": "none"}),
                             ("apputils-extension", "notification", {"fetchNews": "false", "checkForUpdates": False})):
        (settings / ext).mkdir(parents=True)
        (settings / ext / f"{name}.jupyterlab-settings").write_text(json.dumps(value))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces")}
    env.pop("MPLBACKEND", None)  # the test suite's Agg would keep figures out of the page: a user has none set
    cmd = [sys.executable, "-m", "labkit", "lab", "--solutions", f"--work={tmp_path / 'labkit-work'}", "--no-browser",
           "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}"]  # as root, labkit adds --allow-root
    log = tmp_path / "jupyterlab.log"
    with open(log, "w") as out:  # labkit becomes JupyterLab (exec): the same process, in a session of its own
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                  cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited with {server.returncode}:\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer within 90 s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        assert (folder / NOTEBOOK).read_bytes() == (ROOT / "notebooks" / NOTEBOOK).read_bytes()
        assert f"--notebook-dir={folder}" in log.read_text()
        yield f"http://127.0.0.1:{port}", token, folder
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()


def _prompts(page) -> list[str]:
    return page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputPrompt").all_inner_texts()


def _settled_kernel(base: str, token: str, timeout: float = 90) -> str:
    """The id of the notebook's kernel once the server has held one kernel, idle, for two seconds.

    JupyterLab may start a notebook's kernel twice and shut the first down (seen in CI: two kernels 0.2 s apart, the
    first stopped 0.1 s later); Run All clicked in that window ran the first cell and lost the rest with the first
    kernel."""
    deadline, seen, since = time.monotonic() + timeout, None, time.monotonic()
    while True:
        with urllib.request.urlopen(f"{base}/api/kernels?token={token}", timeout=5) as answer:
            kernels = json.loads(answer.read())
        now = [(k["id"], k.get("execution_state")) for k in kernels]
        if now != seen:
            seen, since = now, time.monotonic()
        elif len(now) == 1 and now[0][1] == "idle" and time.monotonic() - since >= 2:
            return now[0][0]
        if time.monotonic() > deadline:
            raise AssertionError(f"the notebook's kernel did not settle within {timeout:.0f} s: {now}")
        time.sleep(0.25)


def _started(page) -> bool:
    """Whether any cell is running or has run (its prompt shows [*] or a number)."""
    return any(p.strip().startswith("[") and (p.strip()[1:-2] == "*" or p.strip()[1:-2].isdigit()) for p in _prompts(page))


def _holds_a_run(path) -> bool:
    """Whether the saved notebook has a code cell that ran; False while a save is still writing it (CI read it empty
    once, under load)."""
    try:
        cells = json.loads(path.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return False
    return any(c.get("execution_count") for c in cells if c["cell_type"] == "code")


def test_lab01_runs_in_jupyterlab_in_chromium(jupyterlab, tmp_path):
    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed (pip install -e '.[test]')")
    base, token, folder = jupyterlab
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])  # root in CI containers
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{base}/lab/tree/{NOTEBOOK}?token={token}")
            page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=90_000)
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']",
                                   timeout=90_000)  # the kernel has started
            kernel = _settled_kernel(base, token)
            n_code = sum(c["cell_type"] == "code" for c in json.loads((folder / NOTEBOOK).read_text())["cells"])
            page.wait_for_function(f"document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell').length >= {n_code}",
                                   timeout=60_000)  # every cell drawn
            for _attempt in range(3):  # Run > Run All Cells from the menu bar, as a student would, until a cell starts
                page.get_by_role("menuitem", name="Run", exact=True).click()
                page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not _started(page):
                    page.wait_for_timeout(500)
                if _started(page):
                    break
                page.keyboard.press("Escape")  # a menu left open must not swallow the next click
            else:
                raise AssertionError(f"Run > Run All Cells started no cell (3 tries): {_prompts(page)}")
            # done: no cell queued or running, the kernel idle, twice in a row a second apart
            deadline, calm = time.monotonic() + 300, 0
            while calm < 2:
                assert time.monotonic() < deadline, f"cells still running after 300 s: {_prompts(page)}"
                page.wait_for_timeout(1000)
                busy = any("*" in p for p in _prompts(page)) or page.locator(
                    ".jp-NotebookPanel .jp-Notebook-ExecutionIndicator[data-status='idle']").count() == 0
                calm = 0 if busy else calm + 1
            prompts = _prompts(page)
            with urllib.request.urlopen(f"{base}/api/kernels?token={token}", timeout=5) as answer:
                kernels = [k["id"] for k in json.loads(answer.read())]
            assert kernels == [kernel], f"the notebook's kernel changed during Run All: {kernel} became {kernels}"
            figures = page.locator(".jp-NotebookPanel .jp-OutputArea-output img").count()
            saved = folder / NOTEBOOK
            for _attempt in range(3):  # File > Save Notebook, then wait for the file to hold the run
                page.get_by_role("menuitem", name="File", exact=True).click()
                page.locator("li[data-command='docmanager:save']").first.click()
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and not _holds_a_run(saved):
                    time.sleep(0.5)
                if time.monotonic() < deadline:
                    break
            else:
                raise AssertionError("File > Save Notebook did not write the executed notebook (3 tries)")
        except BaseException:
            page.screenshot(path=str(tmp_path / "jupyterlab.png"))
            raise
        finally:
            browser.close()
    nb = json.loads(saved.read_text())
    errors = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors, "a cell failed in the browser:\n" + "\n".join(f"{e['ename']}: {e['evalue']}" for e in errors)
    hidden = [bool(c.get("metadata", {}).get("jupyter", {}).get("source_hidden")) for c in nb["cells"]
              if c["cell_type"] == "code"]  # a collapsed input shows no prompt; the saved counts below cover it
    assert len(prompts) == len(hidden) and all(
        h or (p.strip().startswith("[") and p.strip()[1:-2].isdigit()) for p, h in zip(prompts, hidden)), \
        f"not every cell ran (JupyterLab stops at the first error): {prompts}"
    assert figures >= 1, "no figure was rendered in the page"
    counts = [c["execution_count"] for c in nb["cells"] if c["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"cells ran out of order or not at all: {counts}"
    assert any("image/png" in o.get("data", {}) for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"])


def test_an_exported_lab_page_renders_its_math_with_no_network(tmp_path):
    """The report's lab pages load MathJax from beside them: Chromium, with every request off this folder refused,
    turns the page's $...$ into typeset math."""
    import nbformat


    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed (pip install -e '.[test]')")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# Lab 99\n\nThe ring sends $2\\frac{p-1}{p}N$ elements against $(p-1)N$.")])
    page_path = runner.export_html(nb, tmp_path / "99_math.html")
    html = page_path.read_text()
    assert "cdnjs" not in html and 'src="mathjax/MathJax.js?config=' in html
    assert (tmp_path / "mathjax" / "MathJax.js").is_file()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        outside = []

        def offline(route):
            if route.request.url.startswith("file://"):
                return route.continue_()
            outside.append(route.request.url)
            return route.abort()

        page.route("**/*", offline)
        try:
            page.goto(page_path.as_uri())
            page.wait_for_selector(".MathJax, .MathJax_Display, mjx-container", timeout=30_000)
            assert "$(p-1)N$" not in page.inner_text("body"), "the math is still raw TeX"
        finally:
            browser.close()
    assert not outside, f"the page asked the network for {outside}"


def test_a_feedback_page_reads_in_chromium_and_runs_none_of_the_students_script(tmp_path):
    """A student's feedback page, opened in Chromium: the verdicts and the message read as text, the hidden check
    says only that it failed, and nothing the student put in the notebook runs (no alert opens)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_exports import _feedback_class

    from labkit.grading import feedback

    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed (pip install -e '.[test]')")
    (page_path,) = feedback.write(_feedback_class(tmp_path), tmp_path / "fb", tmp_path / "grades", hidden={"karp_flatt"})
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file://") else route.abort())
        try:
            page.goto(page_path.as_uri())
            page.wait_for_timeout(1000)
            body = page.inner_text("body")
            assert "Feedback: 97_quick.ipynb" in body and "Exercises passed: 0 of 2" in body
            assert "✘ failed: exercise speedup_efficiency" in body and "speedup: rank 2 is ```wrong``` <i>x</i>" in body
            assert "a hidden check failed" in body and "0.13" not in body
            assert "<script>alert(1)</script>" in body  # shown as the text the student typed, not run
            page.screenshot(path=str(tmp_path / "feedback.png"), full_page=True)
        finally:
            browser.close()
    assert dialogs == [], f"the student's script ran: {dialogs}"
