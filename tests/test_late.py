"""Late work for groups: a group hands in once, so it has one deadline, its most generous member's, whatever order the
LMS lists its members in (the submissions.csv of a real Gradescope export, collected)."""

from datetime import timedelta

from test_collect import LAB01, _student, release  # noqa: F401 - release is a fixture

from labkit.grading import collect, late

POLICY = {"percent_per_day": 10, "max_days": 5}


def _export(root, members):
    """A Gradescope export of one group's submission, its submitters listed in the order given."""
    (root / "submission_5002").mkdir(parents=True)
    (root / "submission_5002" / "pair.ipynb").write_bytes(_student(LAB01, "pair"))
    people = "".join(f"  - :name: {name}\n    :sid: '{sid}'\n    :email: {sid}@example.edu\n" for name, sid in members)
    (root / "submission_metadata.yml").write_text(
        f"submission_5002:\n  :submitters:\n{people}  :created_at: 2026-10-03 20:00:00.000000000 +02:00\n")
    return root


def test_a_group_has_its_most_generous_members_deadline_in_any_order(tmp_path, release):  # noqa: F811
    entry = {"deadline": "2026-10-02T23:59:00+02:00", "late": POLICY}
    (tmp_path / "ext.csv").write_text("student,lab,days\n1003,01,2\n")  # Cy alone was given two more days
    extensions = late.read_extensions(tmp_path / "ext.csv")
    scores = {}
    for order in ([("Bo Brown", "1002"), ("Cy Chen", "1003")], [("Cy Chen", "1003"), ("Bo Brown", "1002")]):
        out = tmp_path / order[0][1]
        collect.collect(_export(tmp_path / f"export_{order[0][1]}", order), release, out)
        submitted = late.read_submissions(out / "submissions.csv")
        groups = late.groups(submitted)
        assert groups[("1002", "01")] == groups[("1003", "01")] == {"1002", "1003"}
        for student in ("1002", "1003"):
            deadline = late.deadline_for(entry, student, "01", extensions, groups[(student, "01")])
            when = late.parse_time(submitted[(student, "01")]["submitted_at"], "submitted_at")
            scores[(order[0][1], student)] = 3.0 * (1 - late.penalty(when, deadline, POLICY)["percent"] / 100)
    assert set(scores.values()) == {3.0}  # each member, either order: Cy's two days hold for the group
    alone = late.deadline_for(entry, "1002", "01", extensions)  # without the group, Bo's own: a day late, 2.7
    assert alone == late.parse_time(entry["deadline"], "deadline")
    assert late.deadline_for(entry, "1002", "01", extensions, {"1003"}) - alone == timedelta(days=2)


def test_most_generous_is_the_latest_and_no_deadline_beats_any():
    d = late.parse_time("2026-10-02T23:59:00+02:00", "d")
    assert late.most_generous([d, d + timedelta(days=1), d - timedelta(days=3)]) == d + timedelta(days=1)
    assert late.most_generous([d, None]) is None and late.most_generous([]) is None
    assert late.groups({("ana", "01"): {"lms": "moodle", "lms_submission_id": ""}}) == {}  # no id: no group
