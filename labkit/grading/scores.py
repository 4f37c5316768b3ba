"""Points: what each exercise row and written answer is worth, the late penalty, and each student's total per lab.

The release sets the points (:mod:`.assign` writes the defaults into release.json for the instructor to edit): each
exercise's ``points`` (1 by default) and each question's ``points``. A hidden part (``labkit grade --hidden-part``) is
``hidden_share`` of its exercise's points (0.5 by default), taken from the exercise's own, so that a lab's points
possible never change with ``--hidden-part``. With partial credit (the release's ``partial_credit``, for a lab's
exercises or one exercise's own), a failed row scores the share of its check's cases that the answer passed before
the first failure, as the grader's replay counted them (:func:`labkit.check.common.each_case`); a check that counts
no cases, and a row that never reached its check, score 0. A blank written answer scores 0 and says so; a
non-blank one counts once the instructor has scored it in answers.csv (``labkit grade --rescore OUT`` merges the
scores without running a notebook again). The late penalty (:mod:`.late`) is a percent of the lab's score.

An open exercise's check also scores a passing answer (its ``performance``: a modelled time, say), which earns no
points: :func:`leaderboards` ranks the class's passing answers by it, for grades.csv and the feedback pages.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from .answers import ANSWERS_CSV, hand_score
from .assign import HIDDEN_SHARE
from .notebook import ExerciseResult, rows_of

BLANK_NOTE = "blank answer: 0 points"


def set_points(results: list[ExerciseResult], record: dict | None, hidden_parts) -> None:
    """Give every row its points: the exercise's points from the release (1 without one), shared with its hidden part
    where it has one; and its score."""
    for r in results:
        entry = (record or {}).get("notebooks", {}).get(r.notebook, {})
        base = r.exercise.split("~")[0]
        declared = next((ex for ex in entry.get("exercises", []) if ex["name"] == base), {})
        points = float(declared.get("points", 1))
        if len(rows_of(base, hidden_parts)) > 1:
            share = float(entry.get("hidden_share", HIDDEN_SHARE))
            points *= share if r.exercise != base else 1 - share
        r.points = points
        partial = bool(declared.get("partial_credit", entry.get("partial_credit", False)))
        r.score = row_score(r.passed, points, r.cases if partial else None)


def row_score(passed: bool, points: float, cases) -> float:
    """A row's score: its points when passed; with ``cases`` (passed, of them), the share passed; else 0."""
    if passed:
        return points
    if cases and int(cases[1]) > 0:
        return round(points * min(int(cases[0]), int(cases[1]) - 1) / int(cases[1]), 4)
    return 0.0


def scored(row: dict) -> float:
    """What a grades.json row scores (one written before partial credit: its points when passed)."""
    if row.get("score") is not None:
        return float(row["score"])
    return float(row.get("points", 1)) if row["passed"] else 0.0


def performance(row: dict) -> dict | None:
    """What a grades.json row scored for its exercise's leaderboard (``value``, ``unit``, ``label``,
    ``lower_is_better``): a passed row's finite score only, else None."""
    perf = row.get("performance")
    value = (perf or {}).get("value")
    if not row.get("passed") or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return perf


@dataclass(frozen=True)
class Leaderboard:
    """One open exercise's ranking in the class: what its score measures, in which unit, which way is better, and
    each passing answer's (rank, value, student), best first."""
    label: str
    unit: str
    lower_is_better: bool
    places: list[tuple[int, float, str]]

    def rank_of(self, student: str) -> int | None:
        """The student's rank (1 the best; tied scores share one), None where their answer is not on the board."""
        return next((rank for rank, _, who in self.places if who == student), None)


def leaderboards(data: dict) -> dict[tuple[str, str], Leaderboard]:
    """Per (notebook, row) of an open exercise, its leaderboard over the class of ``data`` (a grades.json): every
    passing answer's score, best first, tied scores sharing a rank (1, 2, 2, 4). A failed answer is not ranked."""
    found: dict[tuple[str, str], list[tuple[dict, str]]] = {}
    for student, per in data["students"].items():
        for nb, entry in per.items():
            for r in entry.get("results", []):
                if (perf := performance(r)) is not None:
                    found.setdefault((nb, r["exercise"]), []).append((perf, student))
    return {key: _ranked(rows) for key, rows in found.items()}


def _ranked(rows: list[tuple[dict, str]]) -> Leaderboard:
    """The leaderboard of one exercise's scores, told which way is better by the first."""
    first = rows[0][0]
    sign = 1.0 if first.get("lower_is_better", True) else -1.0
    order = sorted((sign * float(perf["value"]), student) for perf, student in rows)
    places: list[tuple[int, float, str]] = []
    for i, (key, student) in enumerate(order):
        rank = places[-1][0] if i and key == order[i - 1][0] else i + 1
        places.append((rank, sign * key, student))
    return Leaderboard(str(first.get("label", "score")), str(first.get("unit", "")), sign > 0, places)


def answers_into(entry: dict, answers: list[dict]) -> None:
    """A lab's written answers into its grades.json entry: a blank answer is 0 and says so."""
    for a in answers:
        if a.get("blank"):
            a["score"] = 0.0 if a.get("score") is None else a["score"]
            a["note"] = a.get("note") or BLANK_NOTE
    entry["answers"] = answers
    entry["answer_points"] = sum(float(a["points"]) for a in answers)
    entry["answer_score"] = sum(float(a["score"] or 0) for a in answers)
    entry["answers_unscored"] = sum(a["score"] is None and not a["blank"] for a in answers)


def total(entry: dict) -> None:
    """A lab's points: its exercises', its answers', what the late penalty takes, and what is left (``total``)."""
    rows = entry.get("results", [])
    entry["exercise_points"] = round(sum(float(r.get("points", 1)) for r in rows), 4)
    entry["exercise_score"] = round(sum(scored(r) for r in rows), 4)
    entry["points_possible"] = round(entry["exercise_points"] + float(entry.get("answer_points") or 0), 4)
    before = entry["exercise_score"] + float(entry.get("answer_score") or 0)
    percent = float((entry.get("late") or {}).get("percent", 0))
    entry["score_before_penalty"] = round(before, 4)
    entry["total"] = round(before * (1 - percent / 100), 4)


def unscored(data: dict) -> list[str]:
    """'student, lab: question' for every non-blank written answer the instructor has not scored yet."""
    return [f"{student}, {nb}: {a['question']}" for student, per in sorted(data["students"].items())
            for nb, entry in sorted(per.items()) for a in entry.get("answers", [])
            if a.get("score") is None and not a.get("blank")]


def read_hand_scores(path: Path, rubrics: dict | None = None) -> tuple[dict[tuple[str, str, str], dict], list[str]]:
    """answers.csv as the instructor left it: per (student, notebook, question) the score (None when unscored), the
    rubric items earned and the comment a student reads (:func:`.answers.hand_score`: a ``score``, else the points
    of the ``items`` in ``rubrics``, the release's); and a warning per row whose score or items cannot count."""
    found, warnings = {}, []
    if not Path(path).is_file():
        return found, warnings
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            key = (row.get("student", ""), row.get("notebook", ""), row.get("question", ""))
            rubric = (rubrics or {}).get(key[1], {}).get(key[2])
            score, comment, warning = hand_score(row, rubric, _number(row.get("points")))
            if warning:
                warnings.append(f"{key[0]} / {key[2]}: {warning}")
            found[key] = {"score": score, "comment": comment, "items": (row.get("items") or "").strip()}
    return found, warnings


def _number(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return 0.0


def rescore(data: dict, out: Path, rubrics: dict | None = None) -> list[str]:
    """Take the hand scores, rubric items and comments of ``out``/answers.csv into ``data`` (a grades.json) and total
    every lab again: no notebook runs. Returns the warnings (a score out of range, an item not in the rubric, an
    answer with no row in answers.csv)."""
    if not (Path(out) / ANSWERS_CSV).is_file():
        raise FileNotFoundError(f"no {ANSWERS_CSV} in {out}: --rescore takes the --out folder of a labkit grade run "
                                "whose answers you have scored")
    hand, warnings = read_hand_scores(Path(out) / ANSWERS_CSV, rubrics)
    for student, per in data["students"].items():
        for nb, entry in per.items():
            for a in entry.get("answers", []):
                mine = hand.get((student, nb, a["question"]))
                if mine is None:
                    warnings.append(f"{student} / {a['question']}: no row in {ANSWERS_CSV}; left as it was")
                    continue
                a["score"] = mine["score"] if mine["score"] is not None else (0.0 if a.get("blank") else None)
                for key in ("items", "comment"):
                    if mine[key]:
                        a[key] = mine[key]
                    else:
                        a.pop(key, None)
            if "answers" in entry:
                answers_into(entry, entry["answers"])
            total(entry)
    return warnings


__all__ = ["BLANK_NOTE", "Leaderboard", "answers_into", "leaderboards", "performance", "read_hand_scores", "rescore",
           "row_score", "scored", "set_points", "total", "unscored"]
