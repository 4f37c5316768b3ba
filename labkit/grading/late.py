"""Late work: each lab's deadline and late policy (from the release), extensions per student, and the penalty of one
submission from the time it was handed in.

    labkit grade SUBMISSIONS --release R --lab 01 --submissions SUBMISSIONS/submissions.csv --extensions ext.csv

A release's notebook entry holds ``"deadline"`` (ISO 8601 with its timezone, ``2026-10-02T23:59:00+02:00``; null: no
deadline) and ``"late": {"percent_per_day": 10, "max_days": 5}``: each day late, or part of one, costs that percent of
the lab's points; work more than ``max_days`` late scores 0. The submission times come from ``submissions.csv``, the
file ``labkit collect`` writes (:data:`SUBMISSIONS_FIELDS`); an extension CSV has the columns ``student,lab,deadline``
(a new deadline) or ``student,lab,days`` (days added), ``lab`` blank for every lab. A group (the students whose rows
name one LMS submission, :func:`groups`) has its most generous member's deadline, whatever order the LMS lists them in.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

from .assign import lab_number

SUBMISSIONS_FIELDS = ("student", "lab", "file", "submitted_at", "lms", "lms_user_id", "lms_submission_id")
DAY = timedelta(days=1)


def parse_time(text: str, what: str) -> datetime:
    """An ISO 8601 time that names its timezone; ValueError saying what is wrong otherwise."""
    try:
        when = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not an ISO 8601 time (write 2026-10-02T23:59:00+02:00)") from None
    if when.tzinfo is None:
        raise ValueError(f"{what}: {text!r} names no timezone; add it, as in 2026-10-02T23:59:00+02:00")
    return when


def read_submissions(path: Path | str) -> dict[tuple[str, str], dict]:
    """The rows of a submissions.csv written by ``labkit collect``, by (student, lab); of two rows of one (student, lab)
    the later, as collect appends a newer download's after those it keeps."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no submissions file at {path}: `labkit collect` writes SUBMISSIONS/submissions.csv")
    rows = {}
    for k, row in enumerate(submission_rows(path, "as labkit collect writes them"), 2):
        lab = lab_number(row["lab"])
        if lab is None:
            raise ValueError(f"{path}, line {k}: lab {row['lab']!r} is no lab number (01 ... 12)")
        if row["submitted_at"].strip():
            parse_time(row["submitted_at"], f"{path}, line {k}, submitted_at")
        rows[(row["student"], lab)] = row
    return rows


def submission_rows(path: Path, fix: str) -> list[dict]:
    """A submissions.csv's rows as written, its columns :data:`SUBMISSIONS_FIELDS` alone; ValueError naming the
    columns it lacks and ``fix``."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in SUBMISSIONS_FIELDS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} lacks the column(s) {', '.join(missing)} of a submissions.csv "
                             f"({','.join(SUBMISSIONS_FIELDS)}): {fix}")
        return [{c: row[c] for c in SUBMISSIONS_FIELDS} for row in reader]


def read_extensions(path: Path | str) -> dict[tuple[str, str], datetime | timedelta]:
    """Extensions by (student, lab), lab "" for every lab: a new deadline, or days added to the lab's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no extensions file at {path}")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        fields = set(reader.fieldnames or [])
        if "student" not in fields or not fields & {"deadline", "days"}:
            raise ValueError(f"{path}: an extensions CSV has the columns student,lab,deadline (a new deadline) or "
                             "student,lab,days (days added); lab blank for every lab")
        found: dict[tuple[str, str], datetime | timedelta] = {}
        for k, row in enumerate(reader, 2):
            lab = lab_number(row.get("lab") or "") or ""
            if (row.get("deadline") or "").strip():
                found[(row["student"].strip(), lab)] = parse_time(row["deadline"], f"{path}, line {k}, deadline")
            else:
                try:
                    found[(row["student"].strip(), lab)] = timedelta(days=float(row.get("days") or ""))
                except ValueError:
                    raise ValueError(f"{path}, line {k}: give a deadline or a number of days") from None
    return found


def groups(submitted: dict[tuple[str, str], dict]) -> dict[tuple[str, str], frozenset[str]]:
    """Each (student, lab)'s group: the students whose rows name the same LMS submission (a group hands in once, and
    collect gives each member the work)."""
    members: dict[tuple[str, str, str], set[str]] = {}
    for (student, lab), row in submitted.items():
        if (row.get("lms_submission_id") or "").strip():
            members.setdefault((row.get("lms") or "", row["lms_submission_id"].strip(), lab), set()).add(student)
    return {(student, lab): frozenset(m) for (_, _, lab), m in members.items() for student in m}


def deadline_for(entry: dict, student: str, lab: str, extensions: dict,
                 group: Iterable[str] = ()) -> datetime | None:
    """The deadline of one student's lab: the release's, moved by their extension (for this lab, else for all); with
    ``group``, the most generous of its members' (one hand-in, one deadline, in whatever order they are listed)."""
    return most_generous(_own_deadline(entry, s, lab, extensions) for s in sorted({student, *group}))


def most_generous(deadlines: Iterable[datetime | None]) -> datetime | None:
    """The latest of some deadlines; None (no deadline at all) when one of them is None, or there are none."""
    found = list(deadlines)
    return None if not found or any(d is None for d in found) else max(found)


def _own_deadline(entry: dict, student: str, lab: str, extensions: dict) -> datetime | None:
    """One student's own deadline: their extension's (a new deadline, or days added), else the release's."""
    given = extensions.get((student, lab), extensions.get((student, "")))
    if isinstance(given, datetime):
        return given
    if not entry.get("deadline"):
        return None
    deadline = parse_time(entry["deadline"], f"the release's deadline of lab {lab}")
    return deadline + given if isinstance(given, timedelta) else deadline


def penalty(submitted: datetime | None, deadline: datetime | None, policy: dict | None) -> dict:
    """How late a submission is and what it costs: days late (each started day counts), the percent taken off, and
    why, for grades.csv, the feedback and the exports."""
    if deadline is None or submitted is None:
        return {"deadline": deadline.isoformat() if deadline else None, "days_late": 0, "percent": 0.0,
                "note": "no deadline" if deadline is None else "no submission time known: no penalty applied"}
    policy = policy or {}
    per_day, max_days = float(policy.get("percent_per_day", 0)), policy.get("max_days")
    days = max(0, math.ceil((submitted - deadline) / DAY))
    if days == 0:
        return {"deadline": deadline.isoformat(), "days_late": 0, "percent": 0.0, "note": "on time"}
    if max_days is not None and days > int(max_days):
        return {"deadline": deadline.isoformat(), "days_late": days, "percent": 100.0,
                "note": f"{days} days late, past the {int(max_days)} days accepted: 0 points"}
    percent = min(100.0, days * per_day)
    return {"deadline": deadline.isoformat(), "days_late": days, "percent": percent,
            "note": f"{days} day{'s' if days != 1 else ''} late: -{percent:g} %"}
