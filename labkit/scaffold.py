"""``labkit labs new NN slug "Title"``: the skeleton of a new lab, declared in labkit/labs.py as a draft, which passes
the fast tests as written.

It writes the notebook ``notebooks/NN_slug.ipynb`` (goals, the ``parameters`` cell, a section calling the lesson, one
claim, one exercise with its check, one question to explain, the take-aways), the lesson ``labkit/<slug>.py``, its
check family ``labkit/check/<slug>.py`` declaring that one exercise, and ``tests/test_exercises_<slug>.py``: the
lesson against its NumPy reference and the exercise's ``CONTRACT`` and ``MISTAKES`` (its tests carry the marker
``labNN``). It adds the lab to ``LABS`` with ``draft=True``, and its rows to CONTRIBUTING.md's "Where each lab
lives" and "The lessons": six files. A draft is for its authors: the README's table of labs and docs/labs.md gain it
when the draft flag goes (``labs.table()`` lists finished labs). The lesson, the check family and the
tests are named after the slug; the example they hold (a batch's mean from its shards' means) is there to be
replaced: :data:`FILL_IN` lists what is left to write, as CONTRIBUTING.md's "Adding a lab" does.

It refuses, writing nothing, a number that is not the next free one or not two digits, a number or slug the registry
has, a slug that is not snake_case, a root that is not a labkit checkout, and any file it would write that exists.

Run: ``python -m labkit.scaffold 13 mixed_precision "Mixed precision: float16 gradients"``
"""

from __future__ import annotations

import argparse
import ast
import json
import keyword
import re
import sys
from pathlib import Path

from . import labs
from .errors import LabkitError

CHECKOUT = Path(__file__).resolve().parent.parent
SLUG = re.compile(r"[a-z]+(_[a-z]+)*")  # letters only: the labNN markers find a notebook by its name (tests/bylab.py)
EXERCISE = "combined_mean"  # the example exercise, and the lesson function it is checked against
CLAIM = "the combined mean of the shards is the batch's mean"
MAX_LINE = 130  # ruff's line length, for the registry's new entry

# what the skeleton leaves to write, in order (CONTRIBUTING.md's "Adding a lab" lists each, tests/test_scaffold.py
# holds the two together)
FILL_IN = (
    ("The lesson", "labkit/<slug>.py: what the lab teaches, in place of the example, each function tested against a "
                   "NumPy reference in tests/test_exercises_<slug>.py"),
    ("The notebook's text", "the goals, the sections and the take-aways, as \"Writing a lab\" says, in place of the "
                            "example and of the draft's note under the heading"),
    ("Exercises", "at least 3, easy to hard, as \"Adding an exercise\" says, in place of the example; then "
                  "labs.where_table() into CONTRIBUTING.md's \"Where each lab lives\" again"),
    ("Claims", "what the text says its run shows, each checked with `claims.claim` and listed in the lab's entry in "
               "labkit/labs.py"),
    ("Questions", "at least 3, some to predict (each listed in tests/test_predictions.py), some to explain"),
    ("The docs", "its lesson's row in CONTRIBUTING.md's \"The lessons\", in place of the scaffold's, and the lab's "
                 "section in docs/labs.md"),
    ("The draft flag", "deleted from the lab's entry in labkit/labs.py, last: tests/test_lessons.py then holds the "
                       "lab to every count, and tests/test_labs.py asks for its row in README.md's table of labs "
                       "(labs.table())"),
)


class ScaffoldError(LabkitError, ValueError):
    """A lab the scaffold will not write: it says why, and nothing was written."""


# ---- what it writes ------------------------------------------------------------------------------------------------

LESSON = '''"""Lab {{number}}'s lesson: {{title}}.

Written by ``labkit labs new`` as the lab's start: :func:`combined_mean` is an example, to be replaced by what the lab
teaches, each function tested against a NumPy reference in tests/test_exercises_{{slug}}.py. A lesson imports neither
``labkit.check`` nor ``labkit.grading`` (tests/test_layering.py).
"""

from __future__ import annotations

import numpy as np


def combined_mean(means, counts) -> float:
    """The mean of a batch from the means of its shards and their numbers of rows (``counts``): each shard's rows add
    up to its mean times its count, and the batch's mean is the sum of those over all the rows."""
    means, counts = np.asarray(means, dtype=float), np.asarray(counts, dtype=float)
    return float((means * counts).sum() / counts.sum())
'''

CHECK = '''"""The checks of lab {{number}}'s exercises ({{title}}): ``combined_mean``, a batch's mean from its shards' means.

Written by ``labkit labs new`` as the lab's start: replace the example with the lab's own exercises, each declared in
``EXERCISES`` below and given its answers in tests/test_exercises_{{slug}}.py (CONTRIBUTING.md, "Adding an exercise").
"""

from __future__ import annotations

import numpy as np

from .. import {{slug}}
from . import capture
from .common import call, each_case, fail, one_number, passed, recorded
from .exercises import Exercise


def _cases() -> list:
    """(name, means, counts) of every case: four fixed, and one drawn afresh whenever a notebook is graded."""
    rng = np.random.default_rng(capture.seed({{seed}}))
    k = int(rng.integers(2, 9))
    return [("equal shards", [0.5, 1.5, 2.0], [4, 4, 4]), ("one shard", [2.5], [10]),
            ("uneven shards", [1.0, 4.0], [1, 99]), ("means of both signs", [-2.0, 0.5, 3.0], [10, 3, 1]),
            ("drawn at random", np.round(rng.normal(size=k), 3).tolist(), rng.integers(1, 50, k).tolist())]


@recorded
def combined_mean(fn) -> None:
    """Exercise (lab {{number}}): ``fn(means, counts)``, the mean of a batch from each shard's mean and its number of
    rows, to 1e-9 (relative), on equal and uneven shards, one shard, means of both signs and one set drawn afresh."""
    ex = "combined mean"
    fn = capture.student(fn, "fn", ex)
    cases = _cases()
    for name, means, counts in each_case(cases):
        where = f"{name}, means = {means}, counts = {counts}"
        got = one_number(ex, where, call(ex, fn, np.array(means), np.array(counts), where=where, hint=""),
                         "expected one number", "return the batch's mean as one float")
        want = {{slug}}.combined_mean(means, counts)
        if not np.isclose(got, want, rtol=1e-9, atol=1e-12):
            _wrong(ex, where, got, want, np.array(means, dtype=float), np.array(counts, dtype=float))
    passed(ex, len(cases))


def _wrong(ex: str, where: str, got: float, want: float, means, counts) -> None:
    """Fail a wrong answer, naming its mistake where it is a known one (its own hint, no step spent)."""
    mistakes = [(means.mean(), "that is the plain mean of the means: a shard with more rows holds more of the batch, "
                               "so weight each mean by its rows"),
                ((means * counts).sum() / means.size, "you divided by the number of shards: the batch's mean divides "
                                                      "the sum of its rows by the number of its rows")]
    hint = next((why for value, why in mistakes if np.isclose(got, value, rtol=1e-9, atol=1e-12)), "")
    fail(ex, f"{where}: yours is {got:.6g}, expected {want:.6g}", hint)


EXERCISES = (
    Exercise("combined_mean", "{{number}}", references=("labkit.{{slug}}:combined_mean",), hints=(
        "The batch's mean is the sum of all its rows divided by the number of its rows. What is the sum of one "
        "shard's rows, given its mean and its number of rows?",
        "Add those sums over the shards: that is the sum of the whole batch. How many rows does the batch have?",
        "A small case by hand: a shard of 1 row with mean 1.0 and one of 3 rows with mean 5.0. Their rows add up to "
        "1 and 15, so the batch's mean is 16 / 4 = 4.0, not the mean of the two means, 3.0. Does your function give "
        "4.0?",
    )),
)
'''

TESTS = '''"""Lab {{number}} ({{title}}): the lesson against its NumPy reference, and the exercise's answers for the contract
every exercise keeps (``CONTRACT``, tests/test_contract.py) and its typical mistakes (``MISTAKES``)."""

import numpy as np
import pytest
from conftest import Answers, Mistake, Reference

from labkit import {{slug}}


def test_combined_mean_is_numpys_weighted_average():
    rng = np.random.default_rng(0)
    for k in (1, 2, 7):
        means, counts = rng.normal(size=k), rng.integers(1, 50, k)
        assert {{slug}}.combined_mean(means, counts) == pytest.approx(np.average(means, weights=counts))


def test_the_combined_mean_of_a_batchs_shards_is_its_mean():
    batch = np.random.default_rng(1).normal(size=100)
    shards = np.split(batch, [3, 40, 41])
    assert {{slug}}.combined_mean([s.mean() for s in shards], [s.size for s in shards]) == pytest.approx(batch.mean())


def right_combined_mean(means, counts):
    return float(np.dot(means, counts) / np.sum(counts))


CONTRACT = {
    "combined_mean": Answers(
        right_combined_mean, lambda means, counts: float(np.median(means)),
        passes="✔ combined mean: all 5 checks passed",
        references=(Reference({{slug}}.combined_mean, "labkit.{{slug}}.combined_mean"),)),
}
MISTAKES = {  # each named by its own diagnosis, with a hint about it and no step (tests/test_contract.py)
    "combined_mean": (
        Mistake(lambda means, counts: float(np.mean(means)), says="uneven shards", hint="plain mean of the means"),
        Mistake(lambda means, counts: float(np.dot(means, counts) / len(means)), says="equal shards",
                hint="number of shards"),
    ),
}
'''

HIDDEN = {"jupyter": {"source_hidden": True}}

# the notebook's cells: (cell type, id, source, metadata)
CELLS = [
    ("markdown", "goals", """# Lab {{number}} — {{title}}

_A draft, written by `labkit labs new`: its example, a batch's mean from its shards' means, stands in for the lab
until the lab is written._

A worker of a data-parallel step sees one shard of the batch and reports the mean over its rows. You will:

1. combine the workers' means into the mean of the whole batch (the exercise);
2. see that the combination is the batch's mean, on shards of very different sizes;
3. explain why the plain mean of the means is not.""", {}),
    ("code", "parameters", 'PROFILE = "quick"  # "quick": 1,000 rows in 5 shards; "full": 100,000 rows in 16',
     {"tags": ["parameters"]}),
    ("code", "setup", """import numpy as np

from labkit import check, {{slug}}
from labkit.claims import claim

SETTINGS = {"quick": dict(rows=1_000, shards=5), "full": dict(rows=100_000, shards=16)}[PROFILE]""", HIDDEN),
    ("markdown", "lesson", """## 1. A batch's mean from its shards

A shard's rows add up to its mean times its number of rows. So the batch's mean follows from the shards' means and
sizes alone: `{{slug}}.combined_mean(means, counts)` adds up those sums and divides by all the rows. Below, a batch
is split at random places into shards of very different sizes.""", {}),
    ("code", "lesson-run", """rng = np.random.default_rng(0)
batch = rng.normal(size=SETTINGS["rows"])
cuts = np.sort(rng.choice(np.arange(1, batch.size), SETTINGS["shards"] - 1, replace=False))
shards = np.split(batch, cuts)
means, counts = np.array([s.mean() for s in shards]), np.array([s.size for s in shards])
combined = {{slug}}.combined_mean(means, counts)
print(f"{len(shards)} shards of {counts.min()} to {counts.max()} rows")
print(f"combined: {combined:.6f}; the batch's mean: {batch.mean():.6f}")
print(f"the plain mean of the shards' means: {means.mean():.6f}")""", {}),
    ("code", "lesson-claim", f"""claim("{CLAIM}", np.isclose(combined, batch.mean()),
      f"{{combined:.6f}} against {{batch.mean():.6f}}")""", HIDDEN),
    ("markdown", "ex1-goal", """## 2. Exercise: combine the means yourself

Write `combined_mean(means, counts)`: the mean of the whole batch, from each shard's mean and its number of rows
(NumPy arrays, one entry per shard). Return one number.""", {}),
    ("markdown", "ex1-check", """**The check** runs your function on 5 sets of shards: equal sizes, one shard, very uneven
sizes (1 row and 99), means of both signs, and one set drawn at random. Each answer must match to 1e-9 (relative).""",
     {}),
    ("code", "ex1-code", '''def combined_mean(means, counts):
    """The mean of the whole batch, from each shard's mean and its number of rows."""
    ### BEGIN SOLUTION
    means = np.asarray(means, dtype=float)
    counts = np.asarray(counts, dtype=float)
    total = np.sum(means * counts)  # the sum of every row of the batch
    return float(total / np.sum(counts))
    ### END SOLUTION''', {}),
    ("code", "ex1-run", "check.combined_mean(combined_mean)", {}),
    ("markdown", "q1", """**Question (explain).** The shards above differ in size. Why is the plain mean of their means
not the batch's mean? For which shards would it be?""", {}),
    ("markdown", "a-q1", """The plain mean gives every shard the same weight, whatever its size, while the batch's mean
gives every row the same weight. A shard of 1 row then counts as much as one of 99, and its mean pulls the result
away from the batch's. Only when every shard has as many rows do the two weightings agree: then the plain mean of the
means is the batch's mean.""", {"labkit": {"answer": "{{number}}-mean-of-means", "kind": "explain", "points": 2}}),
    ("markdown", "takeaways", """## What to take away

* A shard's rows add up to its mean times its number of rows: from the means and the sizes alone, the batch's mean is
  the sum of those over all the rows.
* The plain mean of the means is the batch's mean only when the shards are of equal size.""", {}),
]

def _fill(text: str, values: dict[str, str]) -> str:
    """``text`` with each ``{{key}}`` replaced by its value."""
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def notebook(values: dict[str, str]) -> str:
    """The lab's notebook, as committed: its cells filled in with ``values``, no outputs."""
    import nbformat

    cells = []
    for kind, cid, source, meta in CELLS:
        meta = json.loads(_fill(json.dumps(meta), values))
        new = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cells.append(new(_fill(source, values), id=cid, metadata=meta))
    nb = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


# ---- what it edits -------------------------------------------------------------------------------------------------

def _registry(source: str) -> tuple[ast.Tuple, dict[str, str]]:
    """labkit/labs.py's ``LABS`` tuple and its labs, number -> slug, read from the source."""
    for node in ast.parse(source).body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "LABS" and isinstance(node.value, ast.Tuple):
            found = {}
            for call in node.value.elts:
                if isinstance(call, ast.Call) and len(call.args) >= 2 and all(isinstance(a, ast.Constant) for a in call.args[:2]):
                    found[call.args[0].value] = call.args[1].value
            return node.value, found
    raise ScaffoldError("labkit/labs.py has no LABS tuple to add the lab to")


def _entry(lab: labs.Lab) -> str:
    """The lab's entry in ``LABS``, laid out as its neighbours are."""
    head = f'    Lab("{lab.number}", "{lab.slug}", "{lab.title}",'
    if len(head) > MAX_LINE:
        head = f'    Lab("{lab.number}", "{lab.slug}",\n        "{lab.title}",'
    claims = "".join(f'            "{c}",\n' for c in lab.claims)
    return f'{head}\n        ("{lab.slug}",), ("{lab.slug}",), (\n{claims}        ), draft=True),\n'


def _declared(source: str, lab: labs.Lab) -> str:
    """labkit/labs.py with the lab appended to ``LABS``."""
    tup, _ = _registry(source)
    lines = source.splitlines(keepends=True)
    close = lines[tup.end_lineno - 1]
    if close[:tup.end_col_offset - 1].strip():
        raise ScaffoldError("labkit/labs.py's LABS does not end with its ')' on a line of its own: add the lab by hand")
    return "".join(lines[:tup.end_lineno - 1]) + _entry(lab) + "".join(lines[tup.end_lineno - 1:])


def _table_end(text: str, header: str, name: str) -> int:
    """The index of the last line of the Markdown table under ``header`` (a line of its own) in ``text``'s lines."""
    lines = text.splitlines()
    if header not in lines:
        raise ScaffoldError(f"{name} has no table headed {header!r} to add the lab's row to")
    end = lines.index(header)
    while end + 1 < len(lines) and lines[end + 1].startswith("|"):
        end += 1
    return end


def _with_row(text: str, header: str, row: str, name: str) -> str:
    """``text`` with ``row`` added at the end of the Markdown table under ``header``."""
    lines = text.splitlines(keepends=True)
    end = _table_end(text, header, name)
    return "".join(lines[:end + 1]) + row + "\n" + "".join(lines[end + 1:])


# ---- the checks before writing -------------------------------------------------------------------------------------

def _number(number: str | int) -> str:
    number = f"{number:02d}" if isinstance(number, int) else str(number)
    if not re.fullmatch(r"\d\d", number):
        raise ScaffoldError(f"the lab's number is two digits, as its notebook's name begins (07), not {number!r}")
    return number


def _slug(slug: str) -> str:
    if not SLUG.fullmatch(slug) or keyword.iskeyword(slug):
        raise ScaffoldError(f"the slug {slug!r} is not snake_case: lowercase words of letters joined by '_' "
                            "(ring_allreduce), and no Python keyword; it names the notebook, the lesson and its checks")
    return slug


def _title(title: str) -> str:
    if not title.strip() or title != title.strip() or any(ch in title for ch in '"\\|') or not title.isprintable():
        raise ScaffoldError(f"the title {title!r} is one line of plain text, without '\"', '\\' or '|' (it goes into "
                            "labkit/labs.py and the Markdown tables)")
    return title


def _refusal(root: Path, number: str, slug: str) -> str | None:
    """Why the registry of ``root`` has no room for lab ``number`` named ``slug``, or None."""
    _, known = _registry((root / "labkit" / "labs.py").read_text(encoding="utf-8"))
    after = f"{max((int(n) for n in known), default=0) + 1:02d}"
    if after == "100":
        return "the labs are numbered 01-99: there is no two-digit number left"
    if number in known:
        return f"lab {number} exists ({number}_{known[number]}.ipynb); the next free number is {after}"
    if number != after:
        return f"lab {number} is not the next free number, {after}: the labs are numbered without gaps"
    taken = {s: n for n, s in known.items()}
    if slug in taken:
        return f"the slug {slug!r} is lab {taken[slug]}'s ({taken[slug]}_{slug}.ipynb)"
    return None


def _exercise_taken(root: Path) -> str | None:
    """The check module of ``root`` that declares the example exercise already, or None."""
    declares = re.compile(rf"\bExercise\(\s*[\"']{EXERCISE}[\"']")
    return next((p.name for p in sorted((root / "labkit" / "check").glob("*.py")) if declares.search(p.read_text())), None)


# ---- the scaffold --------------------------------------------------------------------------------------------------

def _read(root: Path, name: str) -> str:
    if not (root / name).is_file():
        raise ScaffoldError(f"{root} has no {name}, where the lab's rows go: is it a labkit checkout?")
    return (root / name).read_text(encoding="utf-8")


def plan(number: str | int, slug: str, title: str, root: Path | str = CHECKOUT) -> dict[Path, str]:
    """Every file the new lab writes or changes, path -> its new text, after every check (raises ScaffoldError)."""
    root = Path(root)
    if not (root / "labkit" / "labs.py").is_file():
        raise ScaffoldError(f"{root} is not a labkit checkout: it has no labkit/labs.py")
    number, slug, title = _number(number), _slug(slug), _title(title)
    why = _refusal(root, number, slug)
    if why:
        raise ScaffoldError(why)
    new = {root / "notebooks" / f"{number}_{slug}.ipynb", root / "labkit" / f"{slug}.py",
           root / "labkit" / "check" / f"{slug}.py", root / "tests" / f"test_exercises_{slug}.py", root / "labkit" / slug}
    there = sorted(str(p.relative_to(root)) for p in new if p.exists())
    if there:
        raise ScaffoldError(f"{', '.join(there)} exist{'s' if len(there) == 1 else ''} already, and labkit labs new never "
                            "overwrites: pick another slug")
    taken = _exercise_taken(root)
    if taken:
        raise ScaffoldError(f"labkit/check/{taken} declares the example exercise {EXERCISE!r} already: rename that one "
                            "first (a lab being written still holds it)")
    lab = labs.Lab(number, slug, title, (slug,), (slug,), (CLAIM,), draft=True)
    values = {"number": number, "slug": slug, "title": title, "seed": str(int(number) * 10)}
    contributing = _with_row(_read(root, "CONTRIBUTING.md"), labs.WHERE_HEAD, labs.where_row(lab, [EXERCISE]), "CONTRIBUTING.md")
    contributing = _with_row(contributing, "| module | what it holds |", f"| `{slug}` | lab {number}'s lessons: {title} |",
                             "CONTRIBUTING.md")
    return {
        root / "notebooks" / f"{number}_{slug}.ipynb": notebook(values),
        root / "labkit" / f"{slug}.py": _fill(LESSON, values),
        root / "labkit" / "check" / f"{slug}.py": _fill(CHECK, values),
        root / "tests" / f"test_exercises_{slug}.py": _fill(TESTS, values),
        root / "labkit" / "labs.py": _declared((root / "labkit" / "labs.py").read_text(encoding="utf-8"), lab),
        root / "CONTRIBUTING.md": contributing,
    }


def new_lab(number: str | int, slug: str, title: str, root: Path | str = CHECKOUT) -> list[Path]:
    """Write lab ``number``'s skeleton into the checkout ``root`` (see the module's docstring) and return the files
    written or changed. Raises ScaffoldError, having written nothing, where it refuses."""
    files = plan(number, slug, title, root)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return list(files)


def to_fill_in(slug: str) -> list[str]:
    """What the skeleton of the lab ``slug`` leaves to write, one line each (:data:`FILL_IN`)."""
    return [f"{name}: {what.replace('<slug>', slug)}" for name, what in FILL_IN]


def arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The command's arguments, added to ``parser`` (``labkit labs new`` shares them)."""
    parser.add_argument("number", help="the lab's number, two digits: the next free one (13)")
    parser.add_argument("slug", help="snake_case, the notebook's name after the number: it names the lesson and its checks")
    parser.add_argument("title", help="the notebook's heading after 'Lab NN — '")
    parser.add_argument("--root", default=str(CHECKOUT), help="the labkit checkout to write into (default: this one)")
    return parser


def run(a: argparse.Namespace) -> int:
    """Write the lab the parsed arguments ``a`` name; say what was written and what is left to fill in."""
    try:
        written = new_lab(a.number, a.slug, a.title, a.root)
    except ScaffoldError as e:
        print(f"labkit labs new: {e}", file=sys.stderr)
        return 2
    root = Path(a.root).resolve()
    print(f"Lab {written[0].name[:2]} written, as a draft:")
    print("\n".join(f"  {p.resolve().relative_to(root)}" for p in written))
    print("To fill in (CONTRIBUTING.md, \"Adding a lab\"):")
    print("\n".join(f"  - {line}" for line in to_fill_in(a.slug)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.scaffold NN slug "Title"``."""
    parser = argparse.ArgumentParser(prog="labkit labs new", description="Write the skeleton of a new lab, as a draft.")
    return run(arguments(parser).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
