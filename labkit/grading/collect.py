"""Collecting: an LMS's bulk download of submissions sorted into the folder ``labkit grade`` reads.

    labkit collect submissions.zip --release release/ --out submissions/ [--from canvas|moodle|gradescope|auto]

What each LMS's download looks like (a zip, or the folder it unpacks to):

* **Canvas** ("Download Submissions"): flat files ``<name>_<user id>_<submission id>_<file>``, ``<name>_LATE_...`` for
  a late one, and ``<file>-1.ipynb``, ``-2`` ... where a student handed in a file of the same name again. No times:
  each file's own is taken, and one Canvas marks late whose time is before the release's deadline is warned about.
* **Moodle** ("Download all submissions"): a folder per student, ``<Full Name>_<participant id>_assignsubmission_file_/``
  holding their files (or, without folders, files named ``<Full Name>_<id>_assignsubmission_file_<file>``). No times
  either.
* **Gradescope** ("Export Submissions"): ``submission_<id>/`` folders beside ``submission_metadata.yml``, which names
  each submission's submitters (``:name:``, ``:sid:``, ``:email:``) and its time (``:created_at:``).

Each notebook's lab is found by its content (its check cells and answer cells, :func:`.assign.lab_of`), never by its
file name; of a student's submissions of one lab only the latest is kept (by time, then resubmission number), so no
lab is ever graded in two halves. ``SUBMISSIONS/<student>/<lab notebook>`` and ``SUBMISSIONS/submissions.csv``
(:data:`.late.SUBMISSIONS_FIELDS`) are written; a notebook that cannot be placed is listed with why. A second download
collected into the same folder adds its rows to submissions.csv: a row of the same student, lab and file is replaced,
and said so; the others stay.

A submission's time is the LMS's own where it gives one (Gradescope's metadata), else the one the instructor gives
(``submitted_at``: one time, or a CSV of ``student,lab,submitted_at``), else its file's. A zip entry's time carries no
timezone unless the zipper added UTC (Info-ZIP's extended timestamp, NTFS's): it is read in ``lms_timezone`` when
given, else in this machine's, which is said. Files whose times all lie within seconds of each other across many
students are a copy's times (``cp -r``), not the hand-ins', and are warned about.
"""

from __future__ import annotations

import csv
import os
import re
import struct
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from pathlib import Path

# the grader's modules (nbformat, the exercises: seconds to load) are imported where used, since the command line reads
# this module's table of LMSs to build its options, for every labkit command

CANVAS_NAME = re.compile(r"^(?P<name>[^_/]+?)(?P<late>_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$")
MOODLE_PART = re.compile(r"^(?P<name>.+?)_(?P<id>\d+)_assignsubmission_(?P<plugin>[a-z]+)_(?P<file>.*)$")
RESUBMITTED = re.compile(r"-(\d+)$")  # Canvas's lab01-1.ipynb: the same file name handed in again
GRADESCOPE_METADATA = "submission_metadata.yml"
# a copy (cp -r, a sync) writes a whole class's files within seconds; students never all hand in within 10 s
COPIED_WITHIN, COPIED_STUDENTS = timedelta(seconds=10), 3


@dataclass
class File:
    """One file of the download: its path inside it, its bytes, its time, and whether that time's zone was assumed."""
    path: str
    data: bytes
    mtime: datetime
    zone_assumed: bool = False


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
    time_from: str = "file"  # "lms" (the LMS's metadata), "given" (--submitted-at) or "file"
    marked_late: bool = False  # Canvas's _LATE_

    def order(self) -> tuple:
        return (self.submitted_at, self.attempt, int(self.submission_id or 0), self.file.path)


@dataclass
class Collected:
    """What collect wrote, what it could not place (with why) or left aside, and what the instructor must know."""
    kept: list[Submission] = field(default_factory=list)
    unplaced: list[tuple[str, str]] = field(default_factory=list)
    aside: list[tuple[str, str]] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_download(download: Path | str, zone: tzinfo | None = None) -> list[File]:
    """Every file of a download, a zip (each entry's time as :func:`entry_time` reads it) or a folder."""
    download = Path(download)
    if download.is_file() and zipfile.is_zipfile(download):
        with zipfile.ZipFile(download) as z:
            return [File(i.filename, z.read(i), *entry_time(i, zone))
                    for i in z.infolist() if not i.is_dir() and not _hidden(i.filename)]
    if download.is_dir():
        return [File(p.relative_to(download).as_posix(), p.read_bytes(),
                     datetime.fromtimestamp(p.stat().st_mtime, timezone.utc).astimezone())
                for p in sorted(download.rglob("*")) if p.is_file() and not _hidden(p.relative_to(download).as_posix())]
    raise FileNotFoundError(f"no download at {download}: give the zip the LMS made, or the folder it unpacks to")


def entry_time(info: zipfile.ZipInfo, zone: tzinfo | None) -> tuple[datetime, bool]:
    """A zip entry's time, and whether its zone was assumed: the UTC time a zipper may add, else its DOS time (which
    names no zone) read in ``zone``, the LMS's, else in this machine's own."""
    utc = _utc_field(info.extra)
    if utc is not None:
        return utc.astimezone(), False
    if zone is not None:
        return datetime(*info.date_time, tzinfo=zone), False
    return datetime(*info.date_time).astimezone(), True


def _utc_field(extra: bytes) -> datetime | None:
    """The UTC modification time in a zip entry's extra fields: Info-ZIP's extended timestamp (0x5455, Unix seconds)
    or NTFS's (0x000a, 100 ns ticks since 1601); None where there is neither."""
    k = 0
    while k + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, k)
        body = extra[k + 4:k + 4 + size]
        if tag == 0x5455 and len(body) >= 5 and body[0] & 1:
            return datetime.fromtimestamp(struct.unpack_from("<i", body, 1)[0], timezone.utc)
        if tag == 0x000A and len(body) >= 16 and struct.unpack_from("<HH", body, 4) == (1, 24):
            ticks = struct.unpack_from("<Q", body, 8)[0]
            return datetime(1601, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=ticks // 10)
        k += 4 + size
    return None


def parse_zone(text: str) -> tzinfo:
    """--lms-timezone: an IANA name (Europe/Berlin), UTC, or an offset from UTC (+02:00, -0700)."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    text = text.strip()
    if text.upper() in ("UTC", "Z", "GMT"):
        return timezone.utc
    try:
        if m := re.fullmatch(r"(?:UTC|GMT)?([+-])(\d{1,2}):?(\d{2})?", text, re.I):
            return timezone(timedelta(hours=int(m[1] + m[2]), minutes=int(m[1] + (m[3] or "0"))))
        return ZoneInfo(text)
    except (ValueError, ZoneInfoNotFoundError):  # an offset of a day or more, an unknown or malformed name
        raise ValueError(f"--lms-timezone {text!r} is no timezone: give the LMS's as an IANA name (America/Chicago, "
                         "Europe/Berlin), UTC, or an offset such as +02:00") from None


def _hidden(path: str) -> bool:
    """macOS's and Jupyter's leftovers in a download: __MACOSX/, ._files, .ipynb_checkpoints/."""
    parts = path.split("/")
    return any(p.startswith(".") or p == "__MACOSX" for p in parts)


def which_lms(files: list[File]) -> str:
    """The LMS that made a download, told by its names: the first of :data:`LMSES` to ask whose sign they carry."""
    names = [f.path for f in files]
    for lms in sorted(LMSES, key=lambda lms: lms.asked):
        if lms.made(names):
            return lms.name
    raise ValueError(f"could not tell which LMS made this download (no {', no '.join(lms.sign for lms in LMSES)}): "
                     f"give --from {either(LMS)}")


def either(words: list[str] | tuple[str, ...]) -> str:
    """'a, b or c': choices as a sentence gives them."""
    return " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


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
                                    int(again.group(1)) if again else 0, marked_late=bool(m["late"]))))
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
        when = _gradescope_time(info.get(":created_at"))
        if not info.get(":submitters"):
            out.unplaced.append((f.path, f"{GRADESCOPE_METADATA} names no submitter of {folder}"))
        for person in info.get(":submitters") or []:  # a group's submission goes to each of its members
            who = str(person.get(":sid") or "").strip() or str(person.get(":email") or "").split("@")[0]
            found.append(Submission(_slug(who or str(person.get(":name", ""))), "", f, when or f.mtime, "gradescope",
                                    str(person.get(":sid") or person.get(":email") or ""),
                                    folder.removeprefix("submission_"), time_from="lms" if when else "file"))
    return found


def _gradescope_time(value) -> datetime | None:
    """Gradescope's :created_at: (YAML reads it as a time, or a string), aware; None where it gives none."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    try:
        text = re.sub(r"(\.\d{6})\d+", r"\1", str(value)).replace(" ", "T", 1).replace(" ", "")
        when = datetime.fromisoformat(text)
        return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    except ValueError:
        return None


@dataclass(frozen=True)
class Lms:
    """One LMS whose download collect reads: its words to the user, how its download is told by its names, how read."""
    name: str  # --from's word, and submissions.csv's lms
    title: str  # as its users know it
    sign: str  # what tells its download, in words
    made: Callable[[list[str]], bool]  # whether a download's paths carry that sign
    read: Callable[[list[File], Collected], list[Submission]]  # its files, placed by student, or unplaced with why
    asked: int  # auto-detection's order: a sign a student's file names cannot make (a file of the LMS's) before one they can
    times: bool = False  # its download says when each was handed in; without, --submitted-at may be needed
    refused: str = ""  # with --from naming it: why a download without its sign cannot be read, and what to do


# the LMSs, in the order their users are shown them; adding one is an entry here, read by which_lms, collect and the cli
LMSES = (
    Lms("canvas", "Canvas", "Canvas file names",
        lambda names: any(CANVAS_NAME.match(n.rsplit("/", 1)[-1]) for n in names), _canvas, asked=2),
    Lms("moodle", "Moodle", "Moodle folders",
        lambda names: any(MOODLE_PART.match(part) for n in names for part in n.split("/")), _moodle, asked=1),
    Lms("gradescope", "Gradescope", f"Gradescope {GRADESCOPE_METADATA}",
        lambda names: any(n.rsplit("/", 1)[-1] == GRADESCOPE_METADATA for n in names), _gradescope, asked=0, times=True,
        refused=f"has no {GRADESCOPE_METADATA}: export the submissions from Gradescope whole"),
)
LMS = tuple(lms.name for lms in LMSES)


def _place(found: list[Submission], record: dict | None, labs: set[str], out: Collected) -> list[Submission]:
    """Each notebook's lab by its content; what is no notebook, no lab, or not a lab asked for is set aside."""
    import nbformat

    from .assign import lab_number, lab_of
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
            labs: set[str] | None = None, lms_timezone: str | None = None,
            submitted_at: str | None = None) -> Collected:
    """Sort a download into ``out``/<student>/<lab notebook> and add its rows to ``out``/submissions.csv (see the
    module). ``lms_timezone`` is the zone the LMS wrote its zip's times in; ``submitted_at`` the times to take where
    the LMS gives none (one ISO 8601 time, or a CSV of student,lab,submitted_at)."""
    from .grade import load_release, wanted_labs

    if lms not in (*LMS, "auto"):
        raise ValueError(f"--from {lms}: one of {', '.join(LMS)} or auto")
    given = read_given_times(submitted_at) if submitted_at else {}
    files = read_download(download, parse_zone(lms_timezone) if lms_timezone else None)
    if not files:
        raise FileNotFoundError(f"{download} holds no files")
    made_by = {entry.name: entry for entry in LMSES}[which_lms(files) if lms == "auto" else lms]
    if made_by.refused and not made_by.made([f.path for f in files]):
        raise ValueError(f"{download} {made_by.refused}")
    record, _ = load_release(release)
    earlier = _earlier_rows(Path(out) / "submissions.csv")  # read first: a foreign file stops collect before it writes
    result = Collected()
    found = made_by.read(files, result)
    latest: dict[tuple[str, str], Submission] = {}
    for s in _place(found, record, wanted_labs(labs), result):
        _take_given_time(s, given)
        other = latest.get((s.student, s.lab))
        if other is not None:
            old, s = sorted([other, s], key=Submission.order)
            result.aside.append((old.file.path, f"{s.student}: an earlier submission of lab {s.lab}, replaced by "
                                                f"{s.file.path}"))
        latest[(s.student, s.lab)] = s
    result.kept = sorted(latest.values(), key=lambda s: (s.student, s.lab))
    result.notes += _zone_notes(result.kept) + _copy_notes(result.kept) + _late_mark_notes(result.kept, record)
    result.replaced = _write(result.kept, earlier, Path(out))
    return result


def read_given_times(value: str | Path) -> dict[tuple[str, str], datetime]:
    """--submitted-at: one time (ISO 8601 with its zone) for every submission, keyed ("", ""), or a CSV of
    student,lab,submitted_at by (student, lab): student as collect names them or their LMS user id, lab blank for all."""
    from .assign import lab_number
    from .late import parse_time

    path = Path(value)
    if not path.is_file():
        try:
            return {("", ""): parse_time(str(value), "--submitted-at")}
        except ValueError as e:
            raise ValueError(f"{e}, or the path of a CSV of student,lab,submitted_at") from None
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not {"student", "submitted_at"} <= set(reader.fieldnames or []):
            raise ValueError(f"{path}: a --submitted-at CSV has the columns student,lab,submitted_at (student as collect "
                             "names them or their LMS user id; lab blank for every lab)")
        return {(row["student"].strip(), lab_number(row.get("lab") or "") or ""):
                parse_time(row["submitted_at"], f"{path}, line {k}, submitted_at") for k, row in enumerate(reader, 2)}


def _take_given_time(s: Submission, given: dict[tuple[str, str], datetime]) -> None:
    """The instructor's time for a submission whose time is its file's; the LMS's own time stays."""
    if s.time_from != "file":
        return
    keys = [(who, lab) for who in (s.student, s.user_id) if who for lab in (s.lab, "")] + [("", "")]
    when = next((given[k] for k in keys if k in given), None)
    if when is not None:
        s.submitted_at, s.time_from = when, "given"


def _zone_notes(kept: list[Submission]) -> list[str]:
    """Say which zone the zip's times were read in, where it had to be assumed: a wrong one shifts every time."""
    assumed = [s for s in kept if s.time_from == "file" and s.file.zone_assumed]
    if not assumed:
        return []
    here = datetime.now().astimezone()
    name = os.environ.get("TZ") or time.tzname[here.timetuple().tm_isdst > 0]
    return [f"NOTE: the zip's times name no timezone: {len(assumed)} submission time(s) were read in this machine's, "
            f"{name} (UTC{here:%z}). If the LMS wrote them in another, collect again naming it: --lms-timezone "
            "America/Chicago (or +02:00)"]


def _copy_notes(kept: list[Submission]) -> list[str]:
    """Warn where the files' times are a copy's: many students' all within seconds of each other."""
    timed = [s for s in kept if s.time_from == "file"]
    students = {s.student for s in timed}
    if len(students) < COPIED_STUDENTS:
        return []
    first, last = min(s.submitted_at for s in timed), max(s.submitted_at for s in timed)
    if last - first > COPIED_WITHIN:
        return []
    return [f"WARNING: the file times of all {len(students)} students lie within {(last - first).total_seconds():g} s "
            f"of {first.isoformat(timespec='seconds')}: they are when the files were copied (cp -r without -p, a "
            "sync, an unzip that drops times), not when they were handed in, and late penalties would rest on them. "
            "Collect the LMS's own download (its zip, or Gradescope's export with its metadata), or give the times: "
            "--submitted-at TIME, or --submitted-at CSV of student,lab,submitted_at"]


def _late_mark_notes(kept: list[Submission], record: dict | None) -> list[str]:
    """Warn of each submission Canvas marks late whose time is before the deadline: Canvas's mark is the LMS's own
    word, and a file's time (a copy's, a clock's) must not make it silently on time."""
    from .late import parse_time

    notes = []
    for s in kept:
        deadline = ((record or {}).get("notebooks", {}).get(s.notebook) or {}).get("deadline")
        if s.marked_late and deadline and s.submitted_at <= parse_time(deadline, f"the deadline of {s.notebook}"):
            source = "the time --submitted-at gave" if s.time_from == "given" else "its file's time"
            notes.append(f"WARNING: Canvas marks {s.student}'s lab {s.lab} late (_LATE_ in {s.file.path}), but "
                         f"{source}, {s.submitted_at.isoformat(timespec='seconds')}, is before the deadline {deadline}: "
                         "it would be graded on time. Give the time Canvas shows for it (SpeedGrader, or the submissions "
                         "API's submitted_at): --submitted-at CSV of student,lab,submitted_at")
    return notes


def _earlier_rows(path: Path) -> list[dict]:
    """The rows an earlier collect wrote into this folder's submissions.csv ([] where there is none)."""
    from . import late

    if not path.is_file():
        return []
    return late.submission_rows(path, "collect adds its rows to the submissions.csv there: move it away, or collect "
                                      "into another --out")


def _row(s: Submission) -> dict:
    return {"student": s.student, "lab": s.lab, "file": s.file.path, "lms": s.lms, "lms_user_id": s.user_id,
            "submitted_at": s.submitted_at.isoformat(timespec="seconds"), "lms_submission_id": s.submission_id}


def _write(kept: list[Submission], earlier: list[dict], out: Path) -> list[str]:
    """The notebooks, each with its submission time as its file's time, and submissions.csv: the earlier rows, less
    those of the same student, lab and file, then this download's (last, so that grade reads them for their lab).
    Returns what was replaced, to be said."""
    from .late import SUBMISSIONS_FIELDS

    out.mkdir(parents=True, exist_ok=True)
    for s in kept:
        target = out / s.student / s.notebook
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(s.file.data)
        os.utime(target, (s.submitted_at.timestamp(), s.submitted_at.timestamp()))
    new = [_row(s) for s in kept]
    same_file = {(r["student"], r["lab"], r["file"]) for r in new}
    same_lab = {(r["student"], r["lab"]): r for r in new}
    said = []
    for r in earlier:
        if (r["student"], r["lab"], r["file"]) in same_file:
            said.append(f"replaced the row of {r['student']}, lab {r['lab']}, {r['file']} (handed in {r['submitted_at']})"
                        f" by this download's (handed in {same_lab[(r['student'], r['lab'])]['submitted_at']})")
        elif (r["student"], r["lab"]) in same_lab:
            said.append(f"{r['student']}'s lab {r['lab']}: the notebook from {r['file']} replaced by this download's "
                        f"{same_lab[(r['student'], r['lab'])]['file']}; the earlier row stays in submissions.csv, "
                        "before the new one")
    rows = [r for r in earlier if (r["student"], r["lab"], r["file"]) not in same_file] + new
    tmp = out / "submissions.csv.part"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=SUBMISSIONS_FIELDS)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(out / "submissions.csv")  # whole or not at all: an interrupted collect leaves the earlier file
    return said


def describe(result: Collected, out: Path | str) -> str:
    """What collect did, for the terminal: the count kept, what was set aside or replaced, what the instructor must
    check (the times' zone, a copy's times, Canvas's late marks), and every file it could not place."""
    students = len({s.student for s in result.kept})
    lines = [f"collected {len(result.kept)} notebook(s) of {students} student(s) into {out} "
             f"(with {Path(out) / 'submissions.csv'})"]
    lines += [f"  set aside {path}: {why}" for path, why in result.aside]
    lines += [f"  {line}" for line in result.replaced] + result.notes
    if result.unplaced:
        lines.append(f"NOT placed, {len(result.unplaced)} file(s): look at them and place them by hand, or ask the "
                     "student:")
        lines += [f"  {path}: {why}" for path, why in result.unplaced]
    return "\n".join(lines)
