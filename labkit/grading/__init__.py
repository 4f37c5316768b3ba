"""The grader: the students' versions of the labs and their verdicts.

:mod:`.assign` writes the student versions and the release record; :mod:`.grade` grades a class of submissions;
:mod:`.notebook` runs one notebook and turns its records into verdicts; :mod:`.replay` replays a check on a record in
a process of the grader's; :mod:`.sandbox` isolates each notebook. The exercises themselves are declared once, in
:mod:`labkit.check.exercises`. Lesson code never imports this package.
"""
