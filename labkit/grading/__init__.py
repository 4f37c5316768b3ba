"""The grader: the students' versions of the labs and their verdicts.

:mod:`.assign` writes the student versions and the release record; :mod:`.grade` grades a class of submissions;
:mod:`.notebook` runs one notebook and turns its records into verdicts; :mod:`.replay` replays a check on a record in
a process of the grader's; :mod:`.sandbox` isolates each notebook; :mod:`.workers` starts and stops the workers of
``--jobs``; :mod:`.selfcheck` is a student's run of the grader on their own notebook. The exercises themselves are
declared once, in :mod:`labkit.check.exercises`. Lesson code never imports this package.
"""


def __getattr__(name):
    """``labkit.grading.check_submission``: a student's self-check by the grader's rules (:mod:`.selfcheck`), loaded
    when first used."""
    if name in ("check_submission", "SelfCheck"):
        from . import selfcheck

        return getattr(selfcheck, name)
    raise AttributeError(f"module 'labkit.grading' has no attribute {name!r}")
