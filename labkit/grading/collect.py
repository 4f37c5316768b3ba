"""Collecting: an LMS's bulk download of submissions sorted into the folder ``labkit grade`` reads.

    labkit collect submissions.zip --release release/ --out submissions/ [--from canvas|moodle|gradescope|auto]

What each LMS's download looks like (a zip, or the folder it unpacks to):

* **Canvas** ("Download Submissions"): flat files ``<name>_<user id>_<submission id>_<file>``, ``<name>_LATE_...`` for
  a late one, and ``<file>-1.ipynb``, ``-2`` ... where a student handed in a file of the same name again. No times:
  each file's own is taken.
* **Moodle** ("Download all submissions"): a folder per student, ``<Full Name>_<participant id>_assignsubmission_file_/``
  holding their files (or, without folders, files named ``<Full Name>_<id>_assignsubmission_file_<file>``). No times
  either.
* **Gradescope** ("Export Submissions"): ``submission_<id>/`` folders beside ``submission_metadata.yml``, which names
  each submission's submitters (``:name:``, ``:sid:``, ``:email:``) and its time (``:created_at:``).

Each notebook's lab is found by its content (its check cells and answer cells, :func:`.assign.lab_of`), never by its
file name; of a student's submissions of one lab only the latest is kept (by time, then resubmission number), so no
lab is ever graded in two halves. ``SUBMISSIONS/<student>/<lab notebook>`` and ``SUBMISSIONS/submissions.csv``
(:data:`.late.SUBMISSIONS_FIELDS`) are written; a notebook that cannot be placed is listed with why.
"""

from __future__ import annotations

import csv
import os
import re
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .assign import lab_number, lab_of
from .late import SUBMISSIONS_FIELDS

LMS = ("canvas", "moodle", "gradescope")
CANVAS_NAME = re.compile(r"^(?P<name>[^_/]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$")
MOODLE_PART = re.compile(r"^(?P<name>.+?)_(?P<id>\d+)_assignsubmission_(?P<plugin>[a-z]+)_(?P<file>.*)$")
RESUBMITTED = re.compile(r"-(\d+)$")  # Canvas's lab01-1.ipynb: the same file name handed in again
GRADESCOPE_METADATA = "submission_metadata.yml"


@dataclass
class File:
    """One file of the download: its path inside it, its bytes and its time."""
    path: str
    data: bytes
    mtime: datetime


@dataclass
class Submission:
    """A notebook of the download, placed: whose, which lab, when, and the LMS's ids."""
    student: str
    lab: str
    file: File
    submitted_at: datetime
    lms: str
    user_id: str = ""
    submission_id: str = ""
    attempt: int = 0
    notebook: str = ""

    def order(self) -> tuple:
        return (self.submitted_at, self.attempt, int(self.submission_id or 0), self.file.path)


@dataclass
class Collected:
    """What collect wrote, and what it could not place (with why) or left aside."""
    kept: list[Submission] = field(default_factory=list)
    unplaced: list[tuple[str, str]] = field(default_factory=list)
    aside: list[tuple[str, str]] = field(default_factory=list)


def read_download(download: Path | str) -> list[File]:
    """Every file of a download, a zip (its entries' times, taken as this machine's local time) or a folder."""
    download = Path(download)
    if download.is_file() and zipfile.is_zipfile(download):
        with zipfile.ZipFile(download) as z:
            return [File(i.filename, z.read(i), datetime(*i.date_time).astimezone())
                    for i in z.infolist() if not i.is_dir() and not _hidden(i.filename)]
    if download.is_dir():
        return [File(p.relative_to(download).as_posix(), p.read_bytes(),
                     datetime.fromtimestamp(p.stat().st_mtime, timezone.utc).astimezone())
                for p in sorted(download.rglob("*")) if p.is_file() and not _hidden(p.relative_to(download).as_posix())]
    raise FileNotFoundError(f"no download at {download}: give the zip the LMS made, or the folder it unpacks to")


def _hidden(path: str) -> bool:
    """macOS's and Jupyter's leftovers in a download: __MACOSX/, ._files, .ipynb_checkpoints/."""
    parts = path.split("/")
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


def which_lms(files: list[File]) -> str:
    """The LMS that made a download, told by its names."""
    names = [f.path for f in files]
    if any(n.rsplit("/", 1)[-1] == GRADESCOPE_METADATA for n in names):
        return "gradescope"
    if any(MOODLE_PART.match(part) for n in names for part in n.split("/")):
        return "moodle"
    if any(CANVAS_NAME.match(n.rsplit("/", 1)[-1]) for n in names):
        return "canvas"
    raise ValueError("could not tell which LMS made this download (no Canvas file names, no Moodle folders, no "
                     f"Gradescope {GRADESCOPE_METADATA}): give --from canvas, moodle or gradescope")


def _slug(name: str) -> str:
    """A person's name as a folder name: lower case, letters and digits, words joined by '_'."""
    return "_".join(re.findall(r"[^\W_]+", name.lower())) or "_"


def _canvas(files: list[File], out: Collected) -> list[Submission]:
    found, names = [], {}
    for f in files:
        m = CANVAS_NAME.match(f.path.rsplit("/", 1)[-1])
        if m is None:
            out.unplaced.append((f.path, "not named as Canvas names a submission (name_userid_submissionid_file)"))
            continue
        names.setdefault(m["name"], set()).add(m["uid"])
        stem = m["file"].rsplit(".", 1)[0]
        again = RESUBMITTED.search(stem)
        found.append((m, Submission(m["name"], "", f, f.mtime, "canvas", m["uid"], m["sid"],
                                    int(again.group(1)) if again else 0)))
    for m, s in found:  # two students of one name in Canvas's name part: their ids tell them apart
        if len(names[m["name"]]) > 1:
            s.student = f"{m['name']}_{m['uid']}"
    return [s for _, s in found]


def _moodle(files: list[File], out: Collected) -> list[Submission]:
    found = []
    for f in files:
        parts = f.path.split("/")
        hit = next(((k, m) for k, p in enumerate(parts) if (m := MOODLE_PART.match(p))), None)
        if hit is None:
            out.unplaced.append((f.path, "not in a Moodle submission folder (Full Name_id_assignsubmission_file_)"))
            continue
        _, m = hit
        found.append(Submission(_slug(m["name"]), "", f, f.mtime, "moodle", m["id"]))
    return found


def _gradescope(files: list[File], out: Collected) -> list[Submission]:
    import yaml

    meta_file = next(f for f in files if f.path.rsplit("/", 1)[-1] == GRADESCOPE_METADATA)
    root = meta_file.path[: -len(GRADESCOPE_METADATA)]
    try:
        meta = yaml.safe_load(meta_file.data.decode("utf-8")) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{meta_file.path} could not be read as YAML ({e})") from None
    found = []
    for f in files:
        if f is meta_file:
            continue
        folder = f.path[len(root):].split("/", 1)[0] if f.path.startswith(root) else ""
        info = meta.get(folder) if isinstance(meta, dict) else None
        if not info:
            out.unplaced.append((f.path, f"its folder {folder!r} is not in {GRADESCOPE_METADATA}"))
            continue
        when = _gradescope_time(info.get(":created_at"), f.mtime)
        if not info.get(":submitters"):
            out.unplaced.append((f.path, f"{GRADESCOPE_METADATA} names no submitter of {folder}"))
        for person in info.get(":submitters") or []:  # a group's submission goes to each of its members
            who = str(person.get(":sid") or "").strip() or str(person.get(":email") or "").split("@")[0]
            found.append(Submission(_slug(who or str(person.get(":name", ""))), "", f, when, "gradescope",
                                    str(person.get(":sid") or person.get(":email") or ""),
                                    folder.removeprefix("submission_")))
    return found


def _gradescope_time(value, fallback: datetime) -> datetime:
    """Gradescope's :created_at: (YAML reads it as a time, or a string): aware, else the file's time."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    try:
        text = re.sub(r"(\.\d{6})\d+", r"\1", str(value)).replace(" ", "T", 1).replace(" ", "")
        when = datetime.fromisoformat(text)
        return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    except ValueError:
        return fallback


def _place(found: list[Submission], record: dict | None, labs: set[str], out: Collected) -> list[Submission]:
    """Each notebook's lab by its content; what is no notebook, no lab, or not a lab asked for is set aside."""
    import nbformat

    from .grade import lab_notebook

    released = {(e.get("lab") or lab_number(n)): n for n, e in record["notebooks"].items()} if record else None
    placed = []
    for s in found:
        if not s.file.path.endswith(".ipynb"):
            out.aside.append((s.file.path, "not a notebook (.ipynb)"))
            continue
        try:
            lab = lab_of(nbformat.reads(s.file.data.decode("utf-8"), as_version=4))
        except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, it is listed with why
            out.unplaced.append((s.file.path, f"{s.student}: not a notebook that can be read ({type(e).__name__})"))
            continue
        if lab is None:
            out.unplaced.append((s.file.path, f"{s.student}: no check or answer cell of any lab in it"))
        elif labs and lab not in labs:
            out.aside.append((s.file.path, f"lab {lab}, not one collected (--lab)"))
        elif released is not None and lab not in released:
            out.unplaced.append((s.file.path, f"{s.student}: lab {lab}, which the release does not hold"))
        else:
            s.lab, s.notebook = lab, released[lab] if released is not None else lab_notebook(lab)
            placed.append(s)
    return placed


def collect(download: Path | str, release: Path | str | None, out: Path | str, lms: str = "auto",
            labs: set[str] | None = None) -> Collected:
    """Sort a download into ``out``/<student>/<lab notebook> and ``out``/submissions.csv (see the module)."""
    from .grade import load_release, wanted_labs

    if lms not in (*LMS, "auto"):
        raise ValueError(f"--from {lms}: one of {', '.join(LMS)} or auto")
    files = read_download(download)
    if not files:
        raise FileNotFoundError(f"{download} holds no files")
    lms = which_lms(files) if lms == "auto" else lms
    if lms == "gradescope" and not any(f.path.rsplit("/", 1)[-1] == GRADESCOPE_METADATA for f in files):
        raise ValueError(f"{download} has no {GRADESCOPE_METADATA}: export the submissions from Gradescope whole")
    record, _ = load_release(release)
    result = Collected()
    found = {"canvas": _canvas, "moodle": _moodle, "gradescope": _gradescope}[lms](files, result)
    latest: dict[tuple[str, str], Submission] = {}
    for s in _place(found, record, wanted_labs(labs), result):
        other = latest.get((s.student, s.lab))
        if other is not None:
            old, s = sorted([other, s], key=Submission.order)
            result.aside.append((old.file.path, f"{s.student}: an earlier submission of lab {s.lab}, replaced by "
                                                f"{s.file.path}"))
        latest[(s.student, s.lab)] = s
    result.kept = sorted(latest.values(), key=lambda s: (s.student, s.lab))
    _write(result.kept, Path(out))
    return result


def _write(kept: list[Submission], out: Path) -> None:
    """The notebooks, each with its submission time as its file's time, and submissions.csv."""
    out.mkdir(parents=True, exist_ok=True)
    for s in kept:
        target = out / s.student / s.notebook
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s.file.data)
        os.utime(target, (s.submitted_at.timestamp(), s.submitted_at.timestamp()))
    with open(out / "submissions.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(SUBMISSIONS_FIELDS)
        for s in kept:
            w.writerow([s.student, s.lab, s.file.path, s.submitted_at.isoformat(timespec="seconds"), s.lms, s.user_id,
                        s.submission_id])


def describe(result: Collected, out: Path | str) -> str:
    """What collect did, for the terminal: the count kept, what was set aside, and every file it could not place."""
    students = len({s.student for s in result.kept})
    lines = [f"collected {len(result.kept)} notebook(s) of {students} student(s) into {out} "
             f"(with {Path(out) / 'submissions.csv'})"]
    lines += [f"  set aside {path}: {why}" for path, why in result.aside]
    if result.unplaced:
        lines.append(f"NOT placed, {len(result.unplaced)} file(s): look at them and place them by hand, or ask the "
                     "student:")
        lines += [f"  {path}: {why}" for path, why in result.unplaced]
    return "\n".join(lines)
