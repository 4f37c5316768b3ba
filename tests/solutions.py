"""What a graded notebook must not find: the lines of the course's worked solutions and model answers, and a search
for them that a notebook can run over everything it can read.

A solution line is a line of a solution region of an instructor's notebook, or of a model answer (an explain cell's
text, a predict cell's assignment with its value), at least :data:`LONG` characters long once stripped. Left out:
the lines the handout itself holds (given code around a region), and the lines of labkit's own sources, which hold the
references the checks compare with by design (a student's use or copy of one is named by the grader:
:mod:`labkit.check.capture`). The search is given the lines' SHA-256 digests, not the lines.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from labkit import handout, runner

ROOT = Path(__file__).resolve().parent.parent
LONG = 20
REGION = re.compile(r"### BEGIN SOLUTION[ \t]*\n(.*?)^[ \t]*(?://[ \t]*)?### END SOLUTION", re.S | re.M)
SOURCES = (".py", ".cu", ".h", ".c")


def _lines(text: str) -> set[str]:
    return {s for line in text.splitlines() if len(s := line.strip()) >= LONG}


def solution_lines() -> dict[str, str]:
    """{line: where} of every solution line of the course's notebooks (see the module's docstring)."""
    found: dict[str, str] = {}
    given: set[str] = set()
    for path in runner.find_notebooks():
        nb = json.loads(path.read_text(encoding="utf-8"))
        for i, cell in enumerate(nb["cells"]):
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            where = f"{path.name}, cell {i}"
            if handout.answer_meta(cell):
                found.update(dict.fromkeys(_lines(text) - _lines(handout.blank_answer(cell)), where + " (model answer)"))
            for m in REGION.finditer(text):
                found.update(dict.fromkeys(_lines(m.group(1)), where))
        copy = json.loads(path.read_text(encoding="utf-8"))
        handout.blank_cells(copy["cells"])
        given |= {s for c in copy["cells"] for s in _lines(c["source"])}
    ours = set().union(*(_lines(p.read_text(errors="replace")) for p in (ROOT / "labkit").rglob("*")
                         if p.suffix in SOURCES and p.is_file()))
    return {line: where for line, where in found.items() if line not in given and line not in ours}


def digests() -> list[str]:
    return sorted(hashlib.sha256(line.encode()).hexdigest() for line in solution_lines())


SEARCH = '''
import hashlib, json, os, zipfile
def _labkit_search(roots, wanted, skip=("/proc", "/sys", "/dev", "/usr/share", "/usr/lib", "/usr/include",
                                          "/usr/bin", "/usr/sbin", "/etc")):
    """Every readable text file and zip member under roots, line by line: the files holding a wanted digest."""
    suffixes = (".ipynb", ".py", ".json", ".md", ".txt", ".cu", ".h", ".c", ".html", ".csv", ".cfg", ".toml")
    found, files = {}, 0
    def strings(x):
        if isinstance(x, str):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from strings(v)
        elif isinstance(x, list):
            for v in x:
                yield from strings(v)
    def scan(name, data):
        nonlocal files
        files += 1
        text = data.decode("utf-8", "replace")
        if name.endswith((".ipynb", ".json")):
            try:
                text = "\\n".join([text, *strings(json.loads(text))])
            except ValueError:
                pass
        for line in text.splitlines():
            if len(line.strip()) >= LONG and hashlib.sha256(line.strip().encode()).hexdigest() in wanted:
                found[name] = found.get(name, 0) + 1
    for root in roots:
        for folder, dirs, names in os.walk(root):
            if folder.startswith(skip):
                dirs[:] = []
                continue
            for n in names:
                p = os.path.join(folder, n)
                try:
                    if n.endswith((".whl", ".zip")):
                        with zipfile.ZipFile(p) as z:
                            for m in z.namelist():
                                if m.endswith(suffixes):
                                    scan(p + "!" + m, z.read(m))
                    elif n.endswith(suffixes) and os.path.getsize(p) < 4 << 20:
                        with open(p, "rb") as f:
                            scan(p, f.read())
                except (OSError, zipfile.BadZipFile, RuntimeError):
                    pass
    return found, files
'''


def search_cell(roots: list[str]) -> str:
    """A notebook cell that searches ``roots`` for the solution lines and prints ``SOLUTION-SEARCH {found, files}``."""
    return (SEARCH.replace("LONG", str(LONG)) + f"_found, _files = _labkit_search({roots!r}, set({digests()!r}))\n"
            "print('SOLUTION-SEARCH', json.dumps({'found': _found, 'files': _files}))")


def searched(executed_nb) -> dict:
    """What a search cell printed, from the executed notebook (nbformat)."""
    text = "".join(o.get("text", "") for c in executed_nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "SOLUTION-SEARCH " in text, f"the search printed nothing: {text[-2000:]}"
    return json.loads(text.split("SOLUTION-SEARCH ", 1)[1].splitlines()[0])


def search(roots: list[str]) -> tuple[dict, int]:
    """The search a graded notebook runs, run here: ({file: lines found}, files read)."""
    space: dict = {}
    exec(SEARCH.replace("LONG", str(LONG)), space)  # noqa: S102 - the same code the notebook's cell runs
    return space["_labkit_search"](roots, set(digests()))
