"""The student version of a lab notebook (the handout): every solution region stubbed, every model answer blanked,
outputs cleared. Standard library only, so that building labkit's wheel can load this file by its path and ship the
handout alone: a graded notebook reads the installed package, so the wheel must hold no solution.

A solution region is the lines from ``### BEGIN SOLUTION`` to ``### END SOLUTION``. In Python code the region becomes
``raise NotImplementedError`` at the region's indentation; in CUDA C (a kernel's source inside a Python string, marked
``// ### BEGIN SOLUTION``) it becomes ``// YOUR CODE HERE``. An answer cell (cell metadata ``labkit.answer``) keeps a
prediction's names with ``...`` for their values, and an explanation becomes :data:`PLACEHOLDER`.

    python labkit/handout.py NOTEBOOKS_DIR OUT_DIR     (what the wheel's build runs)
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
SOLUTION = re.compile(r"^([ \t]*)(//[ \t]*)?### BEGIN SOLUTION[ \t]*\n.*?^[ \t]*(?://[ \t]*)?### END SOLUTION[ \t]*$",
                      re.S | re.M)
KERNEL_TODO = "YOUR CODE HERE"  # a kernel's stub, which the checks report as "not written yet"
PY_STUB = "raise NotImplementedError"
C_STUB = f"// {KERNEL_TODO}"
PLACEHOLDER = "_Your answer here._"
HANDOUT = "handout"  # the notebook metadata labkit.handout: true marks a student version that ships in the package


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source


def stub_solutions(source: str) -> str:
    """One cell's source with each solution region replaced by its stub.

    Raises ValueError where the markers do not pair up (a BEGIN without its END, or the reverse), so that no
    solution can leak into a student version.
    """
    inside = False
    for line_no, line in enumerate(source.splitlines(), 1):
        if BEGIN in line or END in line:
            if (BEGIN in line) == inside or (BEGIN in line and END in line):
                raise ValueError(f"unpaired solution marker on line {line_no} of the cell: each {BEGIN!r} needs its own "
                                 f"{END!r} after it, each on a line of its own")
            inside = not inside
    if inside:
        raise ValueError(f"unpaired solution marker: the cell ends inside a solution region (no {END!r})")
    out = SOLUTION.sub(lambda m: m.group(1) + (C_STUB if m.group(2) else PY_STUB), source)
    if BEGIN in out or END in out:  # a marker the pattern did not take (text before it on its line, say)
        raise ValueError(f"unpaired solution marker: put {BEGIN!r} and {END!r} on lines of their own")
    return out


def answer_meta(cell) -> dict | None:
    """The answer cell's labkit metadata, or None for any other cell."""
    m = cell.get("metadata", {}).get("labkit", {})
    return m if isinstance(m, dict) and "answer" in m else None


def assignments(source: str, where: str = "the cell") -> list[ast.Assign]:
    """The statements of a predict cell, which holds only assignments of names; ValueError otherwise."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{where}: not valid Python ({e.msg}, line {e.lineno})") from None
    if not tree.body or not all(isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) for t in s.targets)
                                for s in tree.body):
        raise ValueError(f"{where}: a predict cell holds only assignments of names, `predicted_x = 3.5  # comment`")
    return tree.body


def blank_answer(cell) -> str:
    """The answer cell as handed out: a predict cell's values replaced by ``...`` (its names and comments kept), an
    explain cell's text by :data:`PLACEHOLDER`."""
    m, source = answer_meta(cell), _text(cell["source"])
    if m is None:
        return source
    if m.get("kind") == "explain":
        return PLACEHOLDER
    lines = source.splitlines()
    for stmt in reversed(assignments(source)):
        first, last = stmt.lineno - 1, stmt.end_lineno - 1
        head = lines[first][:stmt.targets[-1].end_col_offset]  # the names, up to the last "="
        tail = lines[last][stmt.end_col_offset:]  # a comment after the value (its brackets go with it)
        lines[first:last + 1] = [head + " = ..." + tail]
    return "\n".join(lines)


def blank_cells(cells) -> None:
    """Each cell of ``cells`` (nbformat v4 dicts, changed in place) as handed out: answers blanked, solutions stubbed,
    outputs and execution counts cleared. ValueError names the cell of an unpaired marker."""
    for i, cell in enumerate(cells):
        cell["source"] = _text(cell["source"])
        if answer_meta(cell):
            cell["source"] = blank_answer(cell)
        if cell["cell_type"] == "code":
            try:
                cell["source"] = stub_solutions(_text(cell["source"]))
            except ValueError as e:
                raise ValueError(f"cell {i} (id {cell.get('id', '?')}): {e}") from None
            cell["outputs"] = []
            cell["execution_count"] = None
        elif BEGIN in _text(cell["source"]):
            raise ValueError(f"cell {i} (id {cell.get('id', '?')}) is {cell['cell_type']}, "
                             "but solution markers belong in code cells")


def lock_given_cells(cells) -> None:
    """Mark every code cell without a solution region (the checks and the given code) read-only and not deletable,
    through the cell metadata JupyterLab honours; the parameters cell (PROFILE) and the answer cells stay editable."""
    for cell in cells:
        md = cell.setdefault("metadata", {})
        if answer_meta(cell):
            md["editable"], md["deletable"] = True, False
            continue
        if cell["cell_type"] != "code" or "parameters" in md.get("tags", []):
            continue
        if C_STUB in cell["source"] or PY_STUB in cell["source"]:
            continue  # an exercise: the student writes here
        md["editable"], md["deletable"] = False, False


def is_handout(nb) -> bool:
    """Whether a notebook is a student version that labkit's package ships (metadata ``labkit.handout``)."""
    return bool(nb.get("metadata", {}).get("labkit", {}).get(HANDOUT))


def write_handouts(notebooks: Path | str, out: Path | str) -> list[Path]:
    """The handout of every lab notebook (``NN_*.ipynb``) in ``notebooks``, written into ``out``, marked as one."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(Path(notebooks).glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        try:
            blank_cells(nb["cells"])
        except ValueError as e:
            raise ValueError(f"{path.name}: {e}") from None
        lock_given_cells(nb["cells"])
        nb.setdefault("metadata", {}).setdefault("labkit", {})[HANDOUT] = True
        target = out / path.name
        target.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(target)
    if not written:
        raise FileNotFoundError(f"no lab notebook (NN_*.ipynb) in {notebooks}")
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.rsplit("\n\n", 1)[-1].strip())
    print(f"{len(write_handouts(sys.argv[1], sys.argv[2]))} handouts in {sys.argv[2]}")
