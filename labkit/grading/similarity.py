"""Similarity between the students' submissions of one class: a MOSS-like report of pairs to read.

    labkit similarity submissions/ --release release/ --out similarity/

Every code cell a student handed in is reduced to a stream of normalised tokens: comments, blank lines and
docstrings go, every name a student chooses becomes ``V``, every number ``N``, every string ``S``; keywords,
operators and the names after a dot (``np.asarray``, ``comm.Sendrecv``: the library's, not the student's) stay.
Renaming variables, adding comments or blank lines, or re-wrapping lines therefore changes nothing. A kernel's or
C function's source inside a multi-line string is tokenised too (roughly, by :func:`rough_tokens`), so the C and
CUDA labs are compared on their code rather than as one string each.

Fingerprints are chosen by winnowing (Schleimer, Wilkerson and Aiken, "Winnowing: local algorithms for document
fingerprinting", SIGMOD 2003): every run of :data:`K` consecutive tokens is hashed (a Karp-Rabin rolling hash over
stable token hashes, the same on every machine and run), and of every :data:`W` consecutive hashes the smallest is
kept (the rightmost of equal ones, once). Any stretch of at least ``W + K - 1`` tokens two students share is sure to
give them a fingerprint in common; stretches shorter than ``K`` never do. Reordering independent statements breaks
only the few k-grams that span the moved statement's edges, so most fingerprints of a reordered copy survive.

The handed-out code is taken out first: a k-gram that occurs anywhere in the notebook as handed out (the given
cells, each exercise's header and stub) is never chosen, so two students who wrote nothing share nothing. It comes
from the release record (``given_code``, written by ``labkit assign --release``), else (an older record, or none)
from the student versions rebuilt from the instructor's notebooks, said on stderr. A fingerprint that more than
``common`` students of a lab share is an idiom of the exercise (MOSS's ``-m``) and is dropped too.

Every pair of students who handed in the same lab is scored by the fingerprints they share over the smaller of the
two sets (``score``: 1.0 when one student's code is all found in the other's), with each side's share and the
Jaccard index beside it. The report, ``similarity.html`` (ranked pairs, the matching lines side by side) and
``similarity.csv``, is a lead for a person to read, never a verdict: short exercises have few ways to be written.

Written answers are prose, not code: :mod:`.prose` measures them.
"""

from __future__ import annotations

import bisect
import csv
import html
import io
import json
import keyword
import re
import sys
import time
import tokenize
import zlib
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

from .. import runner

# K: tokens per k-gram. A normalised statement of these labs is 5 to 30 tokens (`V = V . asarray ( V , V = V )` is
# 10); at 12 a k-gram spans a longer statement or two short ones, longer than the idioms every student writes alike
# (`for V in range ( len ( V ) ) :` is 11 tokens), yet short enough that a copy whose statements were reordered or
# lightly edited still keeps whole k-grams inside each statement.
K = 12
# W: the winnowing window. Every shared stretch of W + K - 1 = 17 tokens (about two statements) is found, and about
# 2 / (W + 1) of all k-grams become fingerprints: a 60-token exercise gives some 20, enough to score a short answer.
W = 6
COMMON = 10  # a fingerprint in more than this many students' code of one lab is an idiom, not a copy (MOSS's -m)
MIN_FINGERPRINTS = 8  # the score's denominator is never below this: 2 shared of 2 is not "all of it"
SIMILARITY_HTML, SIMILARITY_CSV = "similarity.html", "similarity.csv"
CSV_FIELDS = ("lab", "student_a", "student_b", "score", "matched_lines_a", "matched_lines_b", "share_a", "share_b",
              "jaccard", "shared_fingerprints", "fingerprints_a", "fingerprints_b")

# the rough tokeniser's words kept as they are: Python's keywords, C's and CUDA's (the kernels' sources)
ROUGH_KEYWORDS = frozenset(keyword.kwlist) | frozenset(
    "auto break case char const continue default do double else enum extern float for goto if inline int long "
    "register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "size_t bool true false __global__ __device__ __host__ __shared__ __restrict__ __syncthreads threadIdx "
    "blockIdx blockDim gridDim atomicAdd".split())
_ROUGH = re.compile(r"""
    (?P<skip>\s+|//[^\n]*|/\*.*?\*/|\#(?!\s*(?:pragma|include|define|if|ifdef|ifndef|else|endif)\b)[^\n]*)
  | (?P<directive>\#\s*\w+[^\n]*)
  | (?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\w*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>->|\+\+|--|<<=|>>=|\*\*=?|//=?|[-+*/%&|^<>=!:]=|<<|>>|&&|\|\||::|\S)
""", re.S | re.X)
_MAGIC = re.compile(r"^[ \t]*[%!]")
_QUOTE = re.compile(r"[rRbBuUfF]*('''|\"\"\"|'|\")")
_MOD = (1 << 61) - 1  # the rolling hash's modulus (a Mersenne prime) and base
_BASE = 1_000_003


@dataclass
class Submission:
    """One student's notebook of one lab: its code cells (index -> source) and its fingerprints, each hash with
    where it came from, (cell index, first line, last line) with lines counted from 1 in the cell."""
    student: str
    lab: str
    path: Path
    cells: dict[int, str]
    prints: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)


@dataclass
class Region:
    """A stretch of matching code: lines first..last of a cell in each student's notebook."""
    cell_a: int
    first_a: int
    last_a: int
    cell_b: int
    first_b: int
    last_b: int
    fingerprints: int


@dataclass
class Pair:
    """Two students' submissions of one lab and how much they share."""
    lab: str
    student_a: str
    student_b: str
    score: float  # shared / the smaller set (at least MIN_FINGERPRINTS)
    share_a: float  # shared / a's fingerprints: how much of a is found in b
    share_b: float
    jaccard: float
    shared: int
    fingerprints_a: int
    fingerprints_b: int
    matched_lines_a: int = 0
    matched_lines_b: int = 0
    regions: list[Region] = field(default_factory=list)
    lines_a: dict[int, set[int]] = field(default_factory=dict)  # cell -> matched lines
    lines_b: dict[int, set[int]] = field(default_factory=dict)


@dataclass
class Result:
    """What :func:`run` found and wrote."""
    pairs: list[Pair]  # every pair of students who both wrote something, highest score first
    skipped: list[str]  # one line per file left out, and why
    nothing_written: dict[str, list[str]]  # lab -> students with no code of their own in it
    notes: list[str]
    html: Path
    csv: Path
    seconds: float = 0.0


# ---- tokens -------------------------------------------------------------------------------------------------


def _strip_magics(source: str) -> str:
    """The cell with IPython's magics (``%%px``, ``%time``...) and shell lines (``!ls``) blanked, line count kept."""
    return "\n".join("" if _MAGIC.match(line) else line for line in source.split("\n"))


def rough_tokens(text: str, first_line: int = 1) -> list[tuple[str, int]]:
    """(normalised token, line) of any code, by a regular expression rather than a parser: for a cell Python cannot
    tokenise (a student's syntax error) and the C or CUDA source inside a string. Comments (``#``, ``//``, ``/* */``)
    go; a preprocessor line (``#pragma omp simd``...) is kept word for word; names become V unless a keyword of
    Python, C or CUDA, or after ``.`` or ``->``; numbers N; string literals S."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    out: list[tuple[str, int]] = []
    for m in _ROUGH.finditer(text):
        kind = m.lastgroup
        if kind == "skip":
            continue
        line = first_line + bisect.bisect_right(starts, m.start()) - 1
        value = m.group()
        if kind == "directive":
            out += [(word, line) for word in re.findall(r"\w+|[^\w\s]", value)]
        elif kind == "string":
            out.append(("S", line))
        elif kind == "number":
            out.append(("N", line))
        elif kind == "name":
            after_dot = bool(out) and out[-1][0] in (".", "->")
            out.append((value if value in ROUGH_KEYWORDS or after_dot else "V", line))
        else:
            out.append((value, line))
    return out


_STATEMENT_START = {None, ";", "{", "}"}
_DROPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
_FSTRING_START, _FSTRING_END = getattr(tokenize, "FSTRING_START", -1), getattr(tokenize, "FSTRING_END", -1)
_KEYWORDS = frozenset(keyword.kwlist)


def normalise(source: str) -> list[tuple[str, int]]:
    """(normalised token, line in the cell) of one code cell: Python's own tokeniser, names V, numbers N, strings S
    (a docstring dropped, a multi-line string of code tokenised by :func:`rough_tokens`), comments and blank lines
    gone; NEWLINE and ``;`` are ``;``, INDENT and DEDENT ``{`` and ``}``. A cell Python cannot tokenise falls back
    on :func:`rough_tokens` as a whole."""
    text = _strip_magics(source)
    try:
        raw = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return rough_tokens(text)
    significant = [t for t in raw if t.type not in _DROPPED]
    out: list[tuple[str, int]] = []
    add = out.append
    fstring_depth = 0
    for i, (kind, value, (line, _), _, _) in enumerate(significant):
        if kind == _FSTRING_START:  # Python 3.12+: an f-string is many tokens; it is one string here
            if fstring_depth == 0:
                add(("S", line))
            fstring_depth += 1
        elif kind == _FSTRING_END:
            fstring_depth -= 1
        elif fstring_depth:
            continue
        elif kind == tokenize.NAME:
            add((value if value in _KEYWORDS or (out and out[-1][0] == ".") else "V", line))
        elif kind == tokenize.OP:
            if value != ";":
                add((value, line))
            elif out and out[-1][0] not in _STATEMENT_START:
                add((";", line))
        elif kind == tokenize.NEWLINE:
            if out and out[-1][0] not in _STATEMENT_START:  # one statement end, whatever came before it
                add((";", line))
        elif kind == tokenize.NUMBER:
            add(("N", line))
        elif kind == tokenize.INDENT:
            add(("{", line))
        elif kind == tokenize.DEDENT:
            add(("}", line))
        elif kind == tokenize.STRING:
            previous = out[-1][0] if out else None
            following = significant[i + 1].type if i + 1 < len(significant) else tokenize.NEWLINE
            if previous in _STATEMENT_START and following == tokenize.NEWLINE:
                continue  # a docstring, or a string standing alone: words, not code
            add(("S", line))
            if "\n" in value:  # a kernel's source, say: its code, roughly
                quote = _QUOTE.match(value)
                out += rough_tokens(value[quote.end():len(value) - len(quote.group(1))] if quote else value, line)
        elif value.strip():
            add((value, line))
    return out


# ---- fingerprints -------------------------------------------------------------------------------------------

_TOKEN_HASH: dict[str, int] = {}


def kgram_hashes(tokens: list[tuple[str, int]], k: int = K) -> list[int]:
    """The hash of every run of ``k`` consecutive tokens, in order: Karp-Rabin rolling over crc32 of each token, so
    the same code gives the same hashes on every machine and run (Python's own hash() is salted per process)."""
    if len(tokens) < k:
        return []
    values = []
    for text, _ in tokens:
        v = _TOKEN_HASH.get(text)
        if v is None:
            v = _TOKEN_HASH[text] = zlib.crc32(text.encode()) + 1
        values.append(v)
    top = pow(_BASE, k - 1, _MOD)
    h = 0
    for v in values[:k]:
        h = (h * _BASE + v) % _MOD
    out = [h]
    for i in range(k, len(values)):
        h = ((h - values[i - k] * top) * _BASE + values[i]) % _MOD
        out.append(h)
    return out


def winnow(hashes: list[int], w: int = W, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """The positions winnowing keeps: in every window of ``w`` consecutive hashes the smallest (the rightmost of
    equal ones), each position once. A hash in ``exclude`` (the handed-out code's) is never kept, and a window of
    nothing else keeps nothing. Fewer hashes than ``w`` are one window."""
    INF = _MOD + 1
    values = [INF if h in exclude else h for h in hashes]
    last_window = min(w, len(values)) - 1  # the index at which the first window is complete
    chosen: list[int] = []
    window: deque[int] = deque()  # positions, their values increasing: window[0] is the window's minimum
    for i, v in enumerate(values):
        while window and values[window[-1]] >= v:
            window.pop()
        window.append(i)
        if window[0] <= i - w:
            window.popleft()
        if i >= last_window:
            best = window[0]
            if values[best] != INF and (not chosen or chosen[-1] != best):
                chosen.append(best)
    return chosen


def fingerprint_cells(cells: dict[int, str], exclude: set[int] | frozenset[int] = frozenset(), k: int = K,
                      w: int = W, cache: dict | None = None) -> dict[int, list[tuple[int, int, int]]]:
    """Winnowed fingerprints of a notebook's code cells: hash -> [(cell, first line, last line)], the lines of the
    k-gram's own tokens (a k-gram that starts in the handed-out header of an exercise and ends in the student's code
    spans only the student's lines). ``exclude`` holds the handed-out code's k-gram hashes; ``cache`` (source -> its
    tokens and hashes) spares tokenising a cell that many students left alike."""
    prints: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for index, source in cells.items():
        hit = cache.get(source) if cache is not None else None
        if hit is None:
            tokens = normalise(source)
            hit = (tokens, kgram_hashes(tokens, k))
            if cache is not None:
                cache[source] = hit
        tokens, hashes = hit
        chosen = winnow(hashes, w, exclude)
        if not chosen:
            continue
        given = [0] * (len(tokens) + 1)  # how many handed-out k-grams cover each token (a difference array first)
        for pos, h in enumerate(hashes):
            if h in exclude:
                given[pos] += 1
                given[pos + k] -= 1
        for i in range(1, len(tokens)):
            given[i] += given[i - 1]
        for pos in chosen:
            own = [tokens[i][1] for i in range(pos, pos + k) if not given[i]] or [tokens[pos][1], tokens[pos + k - 1][1]]
            prints[hashes[pos]].append((index, own[0], own[-1]))
    return dict(prints)


def handout_hashes(sources: list[str], k: int = K) -> set[int]:
    """Every k-gram hash of the handed-out code cells (not only the winnowed ones: no part of it may count)."""
    found: set[int] = set()
    for source in sources:
        found.update(kgram_hashes(normalise(source), k))
    return found


# ---- comparing ----------------------------------------------------------------------------------------------


def compare(a: Submission, b: Submission, drop: set[int] | frozenset[int] = frozenset(),
            floor: int = MIN_FINGERPRINTS) -> Pair:
    """Score two submissions of one lab by the fingerprints they share (``drop``: the lab's idioms, left out), and
    find the matching regions: runs of shared fingerprints in a's order, each with the lines it covers in both."""
    mine = a.prints.keys() - drop
    theirs = b.prints.keys() - drop
    shared = mine & theirs
    n_a, n_b, n = len(mine), len(theirs), len(shared)
    pair = Pair(a.lab, a.student, b.student, score=n / max(min(n_a, n_b), floor, 1) if n else 0.0,
                share_a=n / n_a if n_a else 0.0, share_b=n / n_b if n_b else 0.0,
                jaccard=n / len(mine | theirs) if n else 0.0, shared=n, fingerprints_a=n_a, fingerprints_b=n_b)
    if not n:
        return pair
    for h in shared:
        for cell, first, last in a.prints[h]:
            pair.lines_a.setdefault(cell, set()).update(range(first, last + 1))
        for cell, first, last in b.prints[h]:
            pair.lines_b.setdefault(cell, set()).update(range(first, last + 1))
    pair.matched_lines_a = sum(map(len, pair.lines_a.values()))
    pair.matched_lines_b = sum(map(len, pair.lines_b.values()))
    pair.regions = _regions(a, b, shared)
    return pair


def _regions(a: Submission, b: Submission, shared: set[int]) -> list[Region]:
    """Shared fingerprints in a's order, merged while they stay in one cell of a and of b and their lines in a touch
    or overlap; each run's lines in b are the span of its fingerprints there (reordered code keeps one region)."""
    spots = sorted((where, h) for h in shared for where in a.prints[h][:1])
    regions: list[Region] = []
    for (cell, first, last), h in spots:
        cell_b, first_b, last_b = b.prints[h][0]
        r = regions[-1] if regions else None
        if r and r.cell_a == cell and first <= r.last_a + 1 and r.cell_b == cell_b:
            r.last_a = max(r.last_a, last)
            r.first_b, r.last_b = min(r.first_b, first_b), max(r.last_b, last_b)
            r.fingerprints += 1
        else:
            regions.append(Region(cell, first, last, cell_b, first_b, last_b, 1))
    return regions


# ---- reading the class --------------------------------------------------------------------------------------


def _read_notebook(path: Path) -> list[dict]:
    """The cells of a notebook file (plain JSON, nbformat 4; an older format through nbformat). Raises ValueError
    saying why for anything that is not a notebook."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(data, dict) and "worksheets" in data:  # nbformat 3
        import nbformat

        try:
            data = nbformat.reads(json.dumps(data), as_version=4)
        except Exception as e:  # noqa: BLE001 - any failure means: not a notebook we can read
            raise ValueError(f"an old notebook format nbformat cannot convert ({type(e).__name__})") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise ValueError("JSON, but not a Jupyter notebook (no list of cells)")
    return cells


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _code_cells(cells: list[dict]) -> dict[int, str]:
    return {i: _source(c) for i, c in enumerate(cells) if c.get("cell_type") == "code"}


def _which_lab(path: Path, cells: list[dict], record: dict) -> str | None:
    """The released notebook a submission is: by file name, else the one most of whose check cells it holds (by cell
    id and the check called, as :func:`labkit.grading.grade` matches them)."""
    if path.name in record["notebooks"]:
        return path.name
    by_id = {c.get("id"): _source(c) for c in cells}

    def holds(ex: dict) -> bool:
        source = by_id.get(ex.get("check_cell_id"))
        return source is not None and f"check.{ex.get('name', '').split('#')[0]}(" in source

    score = {name: sum(holds(ex) for ex in entry.get("exercises", [])) for name, entry in record["notebooks"].items()}
    best = max(score, key=score.get, default=None)
    return best if best is not None and score[best] > 0 else None


def _rebuilt(names: list[str] | None, notebooks: Path | str | None) -> dict[str, dict]:
    """Release entries (with given_code) of the repository's instructor notebooks, rebuilt as labkit assign would:
    all of them, or those named. A notebook that cannot be rebuilt is left out and named on stderr."""
    import nbformat

    from . import assign

    folder = Path(notebooks) if notebooks else runner.NOTEBOOKS
    try:
        found = runner.find_notebooks(folder)
    except FileNotFoundError:
        return {}
    entries = {}
    for path in found:
        if names is not None and path.name not in names:
            continue
        try:
            entries[path.name] = assign.release_entry(assign.student_notebook(nbformat.read(path, as_version=4)))
        except Exception as e:  # noqa: BLE001 - one notebook the assigner refuses must not stop the report
            print(f"labkit similarity: cannot rebuild the handed-out version of {path.name} ({e})", file=sys.stderr)
    return entries


def _handout(release: Path | str | None, notebooks: Path | str | None) -> tuple[dict, list[str]]:
    """The release record to match submissions against, every entry with its ``given_code``, and notes on where
    the handed-out code came from (also said on stderr when it was rebuilt)."""
    from .grade import load_release

    record, _ = load_release(release)
    notes = []
    if record is None:
        record = {"notebooks": _rebuilt(None, notebooks)}
        notes.append("no release record: the handed-out code was rebuilt from the instructor's notebooks (if they "
                     "changed since the release, give --release)" if record["notebooks"] else
                     "no release record and no instructor's notebooks to rebuild the handout from: the given code "
                     "counts as the students' own (give --release)")
    else:
        old = [name for name, entry in record["notebooks"].items() if "given_code" not in entry]
        if old:
            rebuilt = _rebuilt(old, notebooks)
            for name in old:
                if name in rebuilt:
                    record["notebooks"][name]["given_code"] = rebuilt[name]["given_code"]
            notes.append(f"the release record predates given_code: the handed-out code of {len(rebuilt)} notebook(s) "
                         "was rebuilt from the instructor's notebooks (run labkit assign --release again to record it)")
            if missing := [name for name in old if name not in rebuilt]:
                notes.append(f"no handed-out code for {', '.join(missing)}: its given code counts as the students' own "
                             "(and is dropped only where more than the --common limit of students share it)")
    for note in notes:
        print(f"labkit similarity: {note}", file=sys.stderr)
    return record, notes


def collect(folder: Path | str, record: dict, lab: str | None = None, k: int = K, w: int = W
            ) -> tuple[list[Submission], list[str]]:
    """Every readable submission under ``folder`` with its fingerprints, the handed-out code of its lab left out;
    and a line for each file skipped (not a notebook, no lab found, a second notebook of one lab)."""
    from .grade import submissions

    skipped: list[str] = []
    excluded: dict[str, set[int]] = {}
    given_cells: dict[str, set[str]] = {}
    cache: dict = {}
    seen: set[tuple[str, str]] = set()
    found: list[Submission] = []
    root = Path(folder)
    for student, path in submissions(root):
        try:
            cells = _read_notebook(path)
        except (OSError, ValueError) as e:
            skipped.append(f"{path.relative_to(root)}: skipped, {e}")
            continue
        name = _which_lab(path, cells, record) if record["notebooks"] else None
        if name is None:
            if len(path.relative_to(root).parts) == 1:
                skipped.append(f"{path.relative_to(root)}: skipped, it matches no released notebook (name the file "
                               "as the lab, or put it in the student's folder)")
                continue
            name = path.name  # a notebook nobody handed out: compared with the others of that name as it is
        if lab and lab not in name:
            continue
        if (student, name) in seen:
            skipped.append(f"{path.relative_to(root)}: skipped, {student} already handed in {name}")
            continue
        seen.add((student, name))
        if name not in excluded:
            given = record["notebooks"].get(name, {}).get("given_code", [])
            excluded[name] = handout_hashes(given, k)
            given_cells[name] = set(given)
        code = {i: s for i, s in _code_cells(cells).items() if s.strip()}
        mine = {i: s for i, s in code.items() if s not in given_cells[name]}  # a cell as handed out adds nothing
        sub = Submission(student, name, path, code)
        sub.prints = fingerprint_cells(mine, excluded[name], k, w, cache)
        found.append(sub)
    return found, skipped


def rank(found: list[Submission], common: int = COMMON, floor: int = MIN_FINGERPRINTS
         ) -> tuple[list[Pair], dict[str, list[str]], list[str]]:
    """Every pair of students per lab, highest score first; per lab the students with nothing of their own (left
    out of the pairs: two untouched handouts are not alike in any way that matters); and a note per lab where
    fingerprints were dropped as idioms, naming the students all of whose code is among them."""
    by_lab: dict[str, list[Submission]] = defaultdict(list)
    for sub in found:
        by_lab[sub.lab].append(sub)
    pairs: list[Pair] = []
    nothing: dict[str, list[str]] = {}
    notes: list[str] = []
    for name, subs in sorted(by_lab.items()):
        counts: dict[int, int] = defaultdict(int)
        for sub in subs:
            for h in sub.prints:
                counts[h] += 1
        drop = {h for h, n in counts.items() if n > common}
        wrote = [s for s in subs if s.prints.keys() - drop]
        if idle := sorted(s.student for s in subs if not s.prints):
            nothing[name] = idle
        if drop:
            hidden = sorted(s.student for s in subs if s.prints and not s.prints.keys() - drop)
            notes.append(f"{name}: {len(drop)} fingerprint(s) found in more than {common} students' code were left "
                         "out as idioms of the exercise" + (f"; all the code of {', '.join(hidden)} is among them (a "
                         "solution many share? a higher --common compares it)" if hidden else ""))
        wrote.sort(key=lambda s: s.student)
        for i, a in enumerate(wrote):
            for b in wrote[i + 1:]:
                pairs.append(compare(a, b, drop, floor))
    pairs.sort(key=lambda p: (-p.score, -p.shared, p.lab, p.student_a, p.student_b))
    return pairs, nothing, notes


def run(submissions: Path | str, release: Path | str | None = None, out: Path | str = "similarity",
        top: int = 50, lab: str | None = None, common: int = COMMON, notebooks: Path | str | None = None,
        k: int = K, w: int = W) -> Result:
    """Compare every pair of students' submissions per lab and write ``out``/similarity.html (the ``top`` pairs,
    their matching lines side by side) and ``out``/similarity.csv (every pair). ``release`` is the release record
    (release.json or its folder; default ./release/ when it is there); ``notebooks`` the instructor's notebooks the
    handed-out code is rebuilt from when the record lacks it (default: the repository's); ``lab`` keeps only the
    labs whose file name contains it."""
    if k < 2 or w < 1:
        raise ValueError(f"k must be at least 2 and w at least 1, got k={k}, w={w}")
    if top < 0:
        raise ValueError(f"top must be 0 or more pairs, got {top}")
    from .grade import submissions as listed

    t0 = time.perf_counter()
    listed(Path(submissions))  # no folder, or no notebooks in it: said before anything else is read
    record, notes = _handout(release, notebooks)
    found, skipped = collect(submissions, record, lab, k, w)
    pairs, nothing, idioms = rank(found, common)
    notes += idioms
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = Result(pairs, skipped, nothing, notes, out / SIMILARITY_HTML, out / SIMILARITY_CSV)
    _write_csv(result.csv, pairs)
    subs = {(s.student, s.lab): s for s in found}
    result.seconds = time.perf_counter() - t0
    result.html.write_text(_page(result, subs, top, k, w, common, len(found)), encoding="utf-8")
    return result


def summary(result: Result, top: int = 10) -> str:
    """The ``top`` pairs, one line each, and where the report is."""
    shown = [p for p in result.pairs if p.shared][:top]
    lines = [f"{len(result.pairs)} pair(s) compared in {result.seconds:.1f} s; the {len(shown)} most alike:"
             if shown else f"{len(result.pairs)} pair(s) compared: no two students share code of their own"]
    width = max((len(p.student_a) + len(p.student_b) for p in shown), default=0) + 3
    for i, p in enumerate(shown, 1):
        lines.append(f"{i:3d}. {p.score:4.0%}  {p.lab}  {(p.student_a + ' ~ ' + p.student_b):<{width}}  "
                     f"lines {p.matched_lines_a} / {p.matched_lines_b}")
    lines += [f"skipped: {line}" for line in result.skipped]
    lines.append(f"report: {result.html.resolve()} (every pair in {result.csv.name}); a lead for a person to read, "
                 "not a verdict")
    return "\n".join(lines)


# ---- writing ------------------------------------------------------------------------------------------------


def _write_csv(path: Path, pairs: list[Pair]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS)
        for p in pairs:
            writer.writerow([p.lab, p.student_a, p.student_b, f"{p.score:.3f}", p.matched_lines_a, p.matched_lines_b,
                             f"{p.share_a:.3f}", f"{p.share_b:.3f}", f"{p.jaccard:.3f}", p.shared, p.fingerprints_a,
                             p.fingerprints_b])


_STYLE = ("body{font-family:sans-serif;max-width:90em;margin:auto;padding:0 1em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:.3em .5em;vertical-align:top;text-align:left}"
          ".code{font-family:monospace;white-space:pre;font-size:90%;margin:0}.hit{background:#ffe08a}"
          ".side{width:50%}.n{color:#999;user-select:none}.note{color:#555}td.num{text-align:right}")


def _code(source: str, first: int, last: int, hits: set[int], context: int = 2) -> str:
    """Lines first..last of a cell (with ``context`` lines around), numbered, the matching ones highlighted; every
    character escaped, as the students' code is theirs and untrusted."""
    lines = source.split("\n")
    lo, hi = max(1, first - context), min(len(lines), last + context)
    rows = []
    for n in range(lo, hi + 1):
        text = html.escape(lines[n - 1], quote=True)
        row = f"<span class='n'>{n:4d} </span>{text}"
        rows.append(f"<span class='hit'>{row}</span>" if n in hits else row)
    return "<pre class='code'>" + "\n".join(rows) + "</pre>"


def _page(result: Result, subs: dict, top: int, k: int, w: int, common: int, n_found: int) -> str:
    esc = html.escape
    parts = ["<!doctype html><meta charset='utf-8'><title>Similarity between submissions</title>",
             f"<style>{_STYLE}</style><h1>Similarity between submissions</h1>",
             f"<p>{n_found} notebook(s), {len(result.pairs)} pair(s) of students per lab. Comments, blank lines, "
             "docstrings, names, numbers and strings are normalised away, and the code handed out is removed before "
             f"comparing (winnowed fingerprints of {k}-token runs, window {w}; a fingerprint in more than {common} "
             "students' code of a lab counts as an idiom). The <b>score</b> is the share of the smaller submission's "
             "fingerprints found in the other's: 100% when all of one student's own code appears in the other's.</p>"
             "<p><b>A lead for a person to read, not a verdict</b>: short exercises have few ways to be written, and "
             "students may have worked together as allowed. Read the matching code before drawing any conclusion.</p>"]
    if result.notes or result.skipped:
        parts.append("<ul class='note'>" + "".join(f"<li>{esc(line)}</li>" for line in result.notes + result.skipped)
                     + "</ul>")
    for lab_name, students in sorted(result.nothing_written.items()):
        parts.append(f"<p class='note'>{esc(lab_name)}: nothing written of their own (the handout as given), not "
                     f"compared: {esc(', '.join(students))}</p>")
    shown = [p for p in result.pairs if p.shared][:top]
    parts.append(f"<h2>The {len(shown)} pair(s) most alike</h2>" if shown else "<h2>No pair shares code of its own</h2>")
    if shown:
        parts.append("<table><tr><th>#</th><th>lab</th><th>student A</th><th>student B</th><th>score</th>"
                     "<th>of A</th><th>of B</th><th>Jaccard</th><th>lines A</th><th>lines B</th></tr>")
        for i, p in enumerate(shown, 1):
            parts.append(f"<tr><td><a href='#pair-{i}'>{i}</a></td><td>{esc(p.lab)}</td><td>{esc(p.student_a)}</td>"
                         f"<td>{esc(p.student_b)}</td><td class='num'>{p.score:.0%}</td><td class='num'>{p.share_a:.0%}"
                         f"</td><td class='num'>{p.share_b:.0%}</td><td class='num'>{p.jaccard:.0%}</td>"
                         f"<td class='num'>{p.matched_lines_a}</td><td class='num'>{p.matched_lines_b}</td></tr>")
        parts.append("</table>")
    for i, p in enumerate(shown, 1):
        a, b = subs[(p.student_a, p.lab)], subs[(p.student_b, p.lab)]
        parts.append(f"<h3 id='pair-{i}'>{i}. {esc(p.lab)}: {esc(p.student_a)} and {esc(p.student_b)}, {p.score:.0%} "
                     f"({p.shared} fingerprint(s) shared of {p.fingerprints_a} and {p.fingerprints_b})</h3>")
        parts.append(f"<table><tr><th class='side'>{esc(p.student_a)} ({esc(str(a.path.name))})</th>"
                     f"<th class='side'>{esc(p.student_b)} ({esc(str(b.path.name))})</th></tr>")
        for r in p.regions[:30]:
            left = _code(a.cells.get(r.cell_a, ""), r.first_a, r.last_a, p.lines_a.get(r.cell_a, set()))
            right = _code(b.cells.get(r.cell_b, ""), r.first_b, r.last_b, p.lines_b.get(r.cell_b, set()))
            parts.append(f"<tr><td>cell {r.cell_a}, lines {r.first_a}-{r.last_a}{left}</td>"
                         f"<td>cell {r.cell_b}, lines {r.first_b}-{r.last_b}{right}</td></tr>")
        if len(p.regions) > 30:
            parts.append(f"<tr><td colspan='2' class='note'>and {len(p.regions) - 30} more region(s)</td></tr>")
        parts.append("</table>")
    return "\n".join(parts) + "\n"


__all__ = ["K", "W", "COMMON", "MIN_FINGERPRINTS", "SIMILARITY_HTML", "SIMILARITY_CSV", "CSV_FIELDS", "Submission",
           "Region", "Pair", "Result", "normalise", "rough_tokens", "kgram_hashes", "winnow", "fingerprint_cells",
           "handout_hashes", "compare", "collect", "rank", "run", "summary"]
