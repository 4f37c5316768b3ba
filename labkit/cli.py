"""The ``labkit`` command: report, lab, data, doctor, assign, grade, check-submission, similarity, bench, cluster,
gpu-check.

Run: ``labkit --help``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from . import settings

NO_WARM = ("do not compile labkit's own kernels first (by default they are compiled in parallel into the cache, "
           "once, so that no lab waits for them)")
CELL_LIMIT = ("CPU-seconds of work allowed per cell, over all its processes (default 60); a cell that waits is stopped "
              "after 3x that + 30 s")


def _warm(a) -> None:
    """Compile labkit's own kernels into the cache before the labs need them (``--no-warm`` skips it); a failure is
    said in one line, and the labs compile what they need as they run."""
    if not a.warm:
        return
    from .kernels import warm

    try:
        warm.warm_cache()
    except Exception as e:  # an unwritable cache folder, a worker that could not start
        print(f"the compile cache was not warmed ({type(e).__name__}: {e}); the labs compile labkit's kernels as they "
              "run", flush=True)


def _cmd_report(a) -> int:
    from . import report
    from .labs import NOTEBOOKS

    _warm(a)
    results, page = report.run(profile=a.profile, out=a.out, notebooks=a.notebooks or NOTEBOOKS,
                                only=a.only, timeout=a.timeout, fetch=a.fetch, solutions=a.solutions)
    print(report.summary(results, page))
    unheld = [c for r in results for c in r.claims if not c["holds"]]
    if unheld and not a.allow_unheld_claims:
        print(f"exit 1: {len(unheld)} claim{'s' if len(unheld) > 1 else ''} of the labs' text did not hold (listed above); "
              "a report that contradicts its own text is not one to publish. For an exploratory run, "
              "--allow-unheld-claims exits 0 when every notebook ran.")
        return 1
    return 0 if all(r.ok for r in results) else 1


SOLUTIONS = "labkit-solutions"  # `labkit lab --solutions` copies the worked solutions here, beside the work folder


def _course_version(src: Path, solutions: bool) -> bytes:
    """The file ``labkit lab`` copies for one lab: the course's notebook itself with ``solutions``, else its student
    version as ``labkit assign`` hands it out."""
    from .grading import assign

    return src.read_bytes() if solutions else assign.handed_out(src)[1].encode("utf-8")


def _kept(dest: Path, solutions: bool) -> str:
    """Why a copy already in the folder stays as it is, and how to get the course's version again."""
    if solutions:
        return f"kept {dest} (it differs from the course's solution: delete it to copy the solution again)"
    if "### BEGIN SOLUTION" in dest.read_text(encoding="utf-8", errors="replace"):
        # copied before `labkit lab` handed out student versions: it holds the course's worked solutions
        return (f"kept your {dest.name}, an older copy that holds the worked solutions (rename it and run labkit lab "
                "again for the version with exercises to do)")
    return f"kept your {dest.name} (delete or rename it to start again from a fresh copy)"


def work_copies(notebooks: Path, work: Path, solutions: bool = False) -> list[str]:
    """Copy the lab notebooks into ``work`` for ``labkit lab``: their student versions (exercises as stubs, answer
    cells blank), or with ``solutions`` the course's notebooks. A notebook already there is never overwritten.
    Returns one line per notebook copied or kept."""
    from .labs import is_draft
    from .runner import find_notebooks, with_solutions

    found = [p for p in find_notebooks(notebooks) if not is_draft(p.name)]  # a lab still being written stays out
    if solutions:  # an installed labkit holds the handouts alone: no solution for a graded notebook to read
        with_solutions(found, "labkit lab --solutions", elsewhere="")
    work.mkdir(parents=True, exist_ok=True)
    lines = []
    for src in found:
        want, dest = _course_version(src, solutions), work / src.name
        try:
            with open(dest, "xb") as f:  # "x": a file that is there, even one made a moment ago, is never replaced
                f.write(want)
            lines.append(f"copied {src.name}")
        except FileExistsError:
            if dest.read_bytes() != want:
                lines.append(_kept(dest, solutions))
    return lines


def _lab_folder(a) -> Path:
    """The folder ``labkit lab`` opens: the one given with --notebooks, else the work folder (or, with --solutions,
    the solutions folder beside it) after copying into it the labs it lacks."""
    from .labs import NOTEBOOKS

    if a.notebooks:  # an instructor editing the course's notebooks themselves
        if a.solutions:
            raise ValueError("--notebooks opens a folder as it is; --solutions copies the course's solutions: give one")
        return Path(a.notebooks)
    # everyone else works on copies: autosave never touches the course's notebooks
    work = Path(a.work).resolve()
    folder = work.parent / SOLUTIONS if a.solutions else work
    if a.solutions and folder == work:
        raise ValueError(f"--solutions copies into {folder}, which is your work folder: choose another --work")
    for line in work_copies(NOTEBOOKS, folder, solutions=a.solutions):
        print(line)
    if a.solutions:
        print(f"the worked solutions are in {folder}, apart from your own copies in {work}")
    else:
        print(f"working on your copies in {folder}: exercises to write, answer cells blank (the worked solutions: "
              "labkit lab --solutions)")
    return folder


def _cmd_lab(a) -> int:
    folder = _lab_folder(a)
    _warm(a)
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={folder}", *a.extra]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in cmd:
        cmd.append("--allow-root")  # containers and lab machines run as root; JupyterLab refuses that unless told
    print("starting:", " ".join(cmd), flush=True)
    if hasattr(os, "execv") and sys.platform != "win32":
        # labkit becomes JupyterLab: Ctrl-C and SIGTERM reach the server itself, and nothing is left behind
        os.execv(sys.executable, cmd)
    return subprocess.call(cmd)


def _cmd_data(a) -> int:
    from . import data

    if a.action == "status":
        for line in data.status(a.root):
            print(line)
        return 0
    sets = data.DATASETS if a.dataset == "all" else (a.dataset,)
    for ds in sets:
        if a.action == "verify":
            print(f"{ds}: all four files verified in {data.verify(ds, a.root)}")
        else:
            print(f"{ds}: downloaded and verified into {data.fetch(ds, dest=a.root)}")
    return 0


def _cmd_doctor(a) -> int:
    from . import doctor

    if a.hosts:
        findings = doctor.check_hosts(a.hosts.split(","), timeout=a.timeout)
        print(doctor.render(findings))
        return 1 if any(f.status == doctor.FAIL for f in findings) else 0
    findings = doctor.run_all()
    print(doctor.render(findings))
    return 1 if any(f.status == doctor.FAIL for f in findings) else 0


def _cmd_labs(a) -> int:
    from . import labs

    if a.number == "new":
        from . import scaffold

        return scaffold.main(a.rest)
    if a.rest:
        raise ValueError(f"labkit labs takes one lab's number, or new NN slug TITLE; got {' '.join([a.number, *a.rest])}")
    if a.number:
        lab = labs.get(a.number)
        print(f"Lab {lab.number} — {lab.title}\n  notebook: notebooks/{lab.notebook}\n  lessons:  "
              f"{', '.join(lab.lessons)}\n  checks:   {', '.join('check.' + c for c in lab.checks)}\n  needs:    "
              f"{', '.join(lab.needs) or 'Python'}{''.join(f', {u} (optional)' for u in lab.uses)}\n  tests:    "
              f"pytest -m {lab.marker}\n  claims:")
        print("\n".join(f"    - {c}" for c in lab.claims)
              + "".join(f"\n    - {c} (on some machines)" for c in lab.optional_claims))
        return 0
    print(labs.table(mark_drafts=True))
    return 0


def _cmd_assign(a) -> int:
    from . import runner
    from .grading import assign
    from .labs import NOTEBOOKS, is_draft

    # each --only adds its notebooks; one that matches none is an error, naming it
    found = [p for only in (a.only or [None]) for p in runner.find_notebooks(a.notebooks or NOTEBOOKS, only=only)]
    notebooks = sorted({p for p in found if a.only or not is_draft(p.name)})  # a draft only when --only names it
    if a.format == "nbgrader":
        if a.deadline or a.late or a.partial_credit:
            raise SystemExit("labkit assign: --deadline, --late and --partial-credit go into labkit's release record, "
                             "which --format nbgrader does not write: give the due dates to nbgrader, or leave them out")
        notebooks = [p for p in notebooks if assign.has_exercises(assign.nbformat.read(p, as_version=4))]
        written = assign.write_nbgrader_sources(notebooks, a.out, force=a.force)
        for path in written:
            print(f"wrote {path}")
        print(f"{len(written)} nbgrader source notebook(s) in {Path(a.out).resolve()} (with the solutions: put them in "
              "nbgrader's source/<assignment>/ and run nbgrader generate_assignment)")
        return 0
    written = assign.write_student_versions(notebooks, a.out, force=a.force, release_dir=a.release,
                                            policy=_late_policy(a.deadline, a.late, a.partial_credit))
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} student notebook(s) in {Path(a.out).resolve()}: solutions replaced by stubs, outputs cleared, "
          "checks and given code read-only")
    record, _ = assign.read_release(Path(a.release) / assign.RELEASE_FILE)
    held = sorted(filter(None, (assign.entry_lab(n, e) for n, e in record["notebooks"].items())))
    print(f"release record: {(Path(a.release) / assign.RELEASE_FILE).resolve()}, lab {', '.join(held)} (keep it; "
          "labkit grade uses it)")
    return 0


def _late_policy(deadlines: list[str] | None, rule: str | None, partial: bool = False) -> dict[str, dict]:
    """Per lab, the release's deadline and late policy from ``--deadline NN=WHEN`` and ``--late PERCENT/DAYS``, and
    partial credit per check case for every lab with ``--partial-credit``."""
    from .grading import late
    from .grading.assign import lab_number

    policy: dict[str, dict] = {}
    for item in sorted(_names(deadlines)):
        given, _, when = item.partition("=")
        lab = lab_number(given)
        if lab is None or not when:
            raise SystemExit(f"labkit assign: --deadline takes NN=WHEN (01=2026-10-02T23:59:00+02:00), got {item!r}")
        deadline = late.parse_time(when, f"--deadline {item}").isoformat()
        if policy.get(lab, {}).get("deadline", deadline) != deadline:  # which one won would be chance
            raise SystemExit(f"labkit assign: two deadlines for lab {lab} ({policy[lab]['deadline']} and {deadline}): "
                             "give it one --deadline")
        policy[lab] = {"deadline": deadline}
    if rule:
        percent, _, days = rule.partition("/")
        try:
            late_rule = {"percent_per_day": float(percent), "max_days": int(days) if days else None}
        except ValueError:
            raise SystemExit(f"labkit assign: --late takes PERCENT/DAYS (10/5: 10 % a day, at most 5 days), "
                             f"got {rule!r}") from None
        for lab in policy:
            policy[lab]["late"] = late_rule
        policy.setdefault("*", {})["late"] = late_rule
    if partial:
        policy.setdefault("*", {})["partial_credit"] = True
    return policy


def _names(given: list[str] | None) -> set[str]:
    """The names of an option that may be repeated or hold NAME,NAME."""
    return {name.strip() for names in (given or []) for name in names.split(",") if name.strip()}


def _release(given: str | None) -> str | None:
    """The release record a command uses: the one given, else ./release when it holds one (the command line's
    default only: the library never reads the working directory's)."""
    from .grading.assign import RELEASE_FILE

    return given if given is not None else ("release" if (Path("release") / RELEASE_FILE).is_file() else None)


def _cmd_grade(a) -> int:
    from .grading import workers

    if a.jobs > 1 and not (a.merge or a.rescore):
        workers.start()  # the workers' fork server imports the grader while this process does the same
    from .grading import exports, grade

    gradebook = a.canvas_gradebook or a.roster
    if (gradebook or a.canvas_assignment) and "canvas" not in (a.export or []):
        raise SystemExit("labkit grade: --canvas-gradebook and --canvas-assignment are for --export canvas")
    if a.merge and a.rescore:
        raise SystemExit("labkit grade: --merge or --rescore, not both (merge first, then rescore the merged folder)")
    given_release, a.release = a.release, _release(a.release)
    before = exports.load(a.regrade) if a.regrade else None  # read first: the run may write into the same folder
    if before is not None and not a.regrade_other_release and not (a.merge or a.rescore):
        record, sha = grade.load_release(a.release)
        if differ := grade.release_differs(before, {"release_sha256": sha, "release_notebooks": grade.notebook_hashes(record)}):
            raise SystemExit(f"labkit grade: --regrade {a.regrade}: those grades come from another release than this "
                             f"run's ({grade.release_words(differ)} differs), so their exercises may differ; give grades "
                             "of the same release, or add --regrade-other-release to compare anyway")
    if a.merge:
        results, csv_path, json_path = grade.merge([a.folder, *a.more], a.out)
        _print_grades(results, json_path)
        print(f"\nmerged {1 + len(a.more)} run(s) into {csv_path} and {json_path}")
        return _hand_on(a, json_path, before)
    if a.more:
        raise SystemExit(f"labkit grade: one submissions folder, got {1 + len(a.more)} (several only with --merge)")
    if a.rescore:
        results, csv_path, json_path, warnings = grade.rescore(a.folder, release=given_release)
        for warning in warnings:
            print(f"labkit grade --rescore: {warning}", file=sys.stderr)
        _print_grades(results, json_path)
        print(f"\nrescored {csv_path} and {json_path} from {Path(a.folder) / 'answers.csv'}: no notebook was run")
        a.out = a.folder
        return _hand_on(a, json_path, before)
    return _grade_run(a, before)


def _grade_run(a, before: dict | None) -> int:
    """``labkit grade FOLDER``: run and grade every notebook, then hand the grades on."""
    from .grading import grade
    from .grading.sandbox import Limits

    part = None
    if a.part:
        k, _, n = a.part.partition("/")
        if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
            raise SystemExit(f"labkit grade: --part takes K/N with 0 <= K < N (a SLURM array: "
                             f"--part $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT), got {a.part!r}")
        part = (int(k), int(n))
    limits = Limits(memory_mb=a.memory, processes=a.processes, cpu_seconds=a.cpu_seconds)
    try:
        results, csv_path, json_path = grade.grade(a.folder, a.out, timeout=a.timeout, profile=a.profile,
                                                   release=a.release, jobs=a.jobs,
                                                   isolate=False if a.no_sandbox else None, limits=limits, part=part,
                                                   resume=a.resume, hidden_parts=_names(a.hidden_part),
                                                   labs=_names(a.lab), submitted=a.submissions,
                                                   extensions=a.extensions)
    except KeyboardInterrupt:
        print(f"\nlabkit grade: interrupted. Every notebook it was grading was stopped, with its sandbox, kernel and "
              f"engines; no grades were written. What was graded is kept in {Path(a.out) / grade.PROGRESS}: run the "
              "same command with --resume to go on from there.", file=sys.stderr)
        return 130
    _print_grades(results, json_path)
    print(f"\nwrote {csv_path} and {json_path}; the executed notebooks are in {Path(a.out) / 'executed'}")
    if (Path(a.out) / "answers.csv").is_file():
        print(f"the answers to the questions, to read and score by hand: {Path(a.out) / 'answers.html'} (scores go in "
              f"the score column of {Path(a.out) / 'answers.csv'}; then labkit grade --rescore {a.out} totals them)")
    return _hand_on(a, json_path, before)


def _print_grades(results, json_path: Path) -> None:
    """The console's grades: a line per student and lab, then the students whose sandbox contained escape attempts."""
    from .grading import grade

    data = json.loads(json_path.read_text())
    print(grade.summary(results, data))
    if escapes := grade.escape_summary(data):
        print(f"\n{escapes}")


def _hand_on(a, json_path: Path, before: dict | None) -> int:
    """The feedback pages, gradebook exports and regrade's changes.csv of a grading run, from the grades.json it
    wrote (only the labs of --lab). 1 when an export was refused (answers not scored, students not in Canvas)."""
    from .grading import exports, scores

    data = _only_labs(exports.load(json_path), _names(a.lab))
    hidden = _names(a.hidden)
    if a.feedback:
        from .grading import feedback

        pages = feedback.write(data, a.feedback, Path(json_path).parent, hidden)
        print(f"feedback: {len(pages)} page(s), one per student and lab, in {a.feedback}"
              + (f" ({len(hidden)} hidden check(s): they count, their messages are not shown)" if hidden else ""))
    code = 0
    for kind in dict.fromkeys(a.export or []):
        if kind == "gradescope":  # a file per student: with every lab of --out, or it would drop the labs kept
            every = exports.load(json_path)
            files = exports.gradescope(every, a.out, hidden)
            print(f"Gradescope: {len(files)} results file(s) in {Path(a.out) / exports.GRADESCOPE_DIR}"
                  + (f" and {Path(a.out) / 'results.json'}" if len(every["students"]) == 1 else ""))
        elif kind == "canvas":
            waiting = scores.unscored(data)
            if waiting and not a.allow_unscored:
                print(f"Canvas: NOT written: {len(waiting)} written answer(s) are not scored yet, and would go in as 0:"
                      + "".join(f"\n  {w}" for w in waiting) + f"\nScore them in {Path(a.out) / 'answers.csv'} and run "
                      f"labkit grade --rescore {a.out} --export canvas ..., or pass --allow-unscored", file=sys.stderr)
                code = 1
                continue
            code = max(code, _canvas(a, data))
    if before is not None:
        rows = exports.changes(before, data, allow_other_release=True)  # the releases were compared before grading
        path = exports.write_changes(rows, a.out)
        print(exports.describe_changes(rows) + f"\n(every change, with the new message: {path})")
    return code


def _canvas(a, data: dict) -> int:
    """canvas.csv, into the gradebook's assignment columns when one is given; 1 when students are not in it."""
    from .grading import exports

    gradebook = a.canvas_gradebook or a.roster
    given = {}
    for item in _names(a.canvas_assignment):
        lab, _, number = item.partition("=")
        if not (exports.lab_number_of(lab).isdigit() and number.strip().isdigit()):
            raise SystemExit(f"labkit grade: --canvas-assignment takes NN=ID (lab 01 into assignment 5551: 01=5551), "
                             f"got {item!r}")
        given[exports.lab_number_of(lab)] = number.strip()
    try:
        done = exports.canvas(data, a.out, gradebook, given, allow_unmatched=a.allow_unmatched,
                              zero_missing=a.canvas_missing_zero)
    except ValueError as e:
        print(f"Canvas: NOT written: {e}", file=sys.stderr)
        return 1
    for note in done.notes:
        print(f"Canvas: {note}")
    print(f"Canvas: {done.path} (Grades > Import)" + ("" if gradebook else "; without --canvas-gradebook its columns "
          "carry no assignment ids and the folder names stand for the students: Canvas would make new assignments"))
    if done.unmatched:
        print(f"Canvas: left out, not in {gradebook}: {', '.join(done.unmatched)}", file=sys.stderr)
    return 0


def _only_labs(data: dict, labs: set[str]) -> dict:
    """grades.json with only the notebooks of ``labs`` (all without)."""
    from .grading.assign import lab_number

    if not labs:
        return data
    wanted = {lab_number(x) for x in labs}
    students = {s: {nb: e for nb, e in per.items() if lab_number(nb) in wanted} for s, per in data["students"].items()}
    return {**data, "students": {s: per for s, per in students.items() if per}}


def _cmd_collect(a) -> int:
    from .grading import collect

    result = collect.collect(a.download, _release(a.release), a.out, lms=a.source, labs=_names(a.lab),
                             lms_timezone=a.lms_timezone, submitted_at=a.submitted_at)
    print(collect.describe(result, a.out))
    return 1 if result.unplaced else 0


def _cmd_check_submission(a) -> int:
    from .grading.selfcheck import check_submission

    try:
        result = check_submission(a.notebook, timeout=a.timeout, profile=a.profile, release=a.release)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"labkit check-submission: {e}") from None
    return 0 if result.results and result.passed == len(result.results) else 1


def _cmd_similarity(a) -> int:
    from .grading import similarity

    result = similarity.run(a.folder, release=_release(a.release), out=a.out, top=a.top, lab=a.lab, common=a.common)
    print(similarity.summary(result, top=10))
    return 0


def _cmd_bench(a) -> int:
    from . import benchmarks

    mod = benchmarks.get(a.name)
    extra = {}
    if a.hosts:
        import inspect

        if "hosts" not in inspect.signature(mod.run).parameters:
            raise SystemExit(f"labkit bench {a.name}: --hosts is for the allreduce and training benchmarks")
        if a.hosts < 2:
            raise SystemExit("labkit bench: --hosts takes the number of namespace hosts, at least 2")
        extra["hosts"] = a.hosts
    if a.link:
        if not a.hosts:
            raise SystemExit("labkit bench: --link shapes the cables between namespace hosts: give --hosts N with it")
        from .cluster.hosts import rate_bits_per_second

        try:
            rate_bits_per_second(a.link)
        except ValueError as e:
            raise SystemExit(f"labkit bench: --link: {e}") from None
        extra["link"] = a.link
    result = mod.run(quick=a.quick, progress=None if not a.json else False, **extra)
    text = json.dumps(result, indent=2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    if a.json:
        print(text)
    else:
        print(mod.report(result))
    return 0


def _cmd_cluster(a) -> int:
    from . import cluster

    running = cluster.running_clusters()
    if a.action == "list":
        for c in running:
            engines = sum(getattr(e, "n", 0) or 0 for e in c.engines.values())
            print(f"{c.cluster_id}  {engines} engine(s)  {c.cluster_file}")
        print(f"{len(running)} cluster(s) running" + ("; `labkit cluster stop --all` stops them" if running else ""))
        return 0
    if not a.all and not a.id:
        print("labkit cluster stop: name a cluster id (see `labkit cluster list`) or give --all", file=sys.stderr)
        return 2
    chosen = [c for c in running if a.all or c.cluster_id in a.id]
    missing = set(a.id or ()) - {c.cluster_id for c in running}
    for c in chosen:
        c.stop_cluster_sync()
        print(f"stopped {c.cluster_id}")
    if missing:
        print(f"labkit cluster stop: no running cluster {', '.join(sorted(missing))}", file=sys.stderr)
        return 1
    print(f"{len(chosen)} cluster(s) stopped")
    return 0


def _cmd_gpu_check(a) -> int:
    from . import gpucheck

    steps = gpucheck.plan(Path(a.out).resolve())
    if a.plan:
        from . import wheelhouse

        house = wheelhouse.ROOT / "wheelhouse"
        print(wheelhouse.describe_plan(sys.executable, house if any(house.glob("*.whl")) else None))
        print("then, in order:")
        print(gpucheck.describe(steps))
        return 0
    why = gpucheck.refusal()
    if why:
        print(why, file=sys.stderr)
        return 2
    summary = gpucheck.run(a.out)
    print(f"\nlabkit gpu-check: {'all steps passed' if summary['ok'] else 'some steps FAILED'}; everything is in "
          f"{Path(a.out).resolve()} (summary.json, one log per step)")
    return 0 if summary["ok"] else 1


class _Help(argparse.RawDescriptionHelpFormatter):
    pass


def seconds(text: str) -> int:
    """A time limit in whole seconds: positive (0 or less would switch the limit off, which is never meant here)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the limit must be at least 1 second, got {value}")
    return value


def _sub(sub, name: str, help: str, description: str, fn):
    p = sub.add_parser(name, help=help, description=description, formatter_class=_Help)
    p.set_defaults(fn=fn)
    return p


def _add_report(sub) -> None:
    r = _sub(sub, "report", "run every lab notebook headlessly and write an HTML report",
             "Execute the numbered lab notebooks top to bottom (a time limit per cell, a progress bar per notebook),\n"
             "save them executed, and write DIR/index.html with every figure and the key numbers. A failing notebook\n"
             "is shown with its error and the others still run. The exit code is 1 if any failed, or if a claim of the\n"
             "labs' text (a sentence each notebook checks against its own measurement) did not hold.", _cmd_report)
    r.add_argument("--profile", choices=["quick", "full"], default="quick",
                   help="quick: small settings (default); full: the real runs")
    r.add_argument("--out", default="report", help="output folder (default: report/)")
    r.add_argument("--notebooks", default=None, help="folder of NN_*.ipynb notebooks (default: the repository's notebooks/)")
    r.add_argument("--only", default=None, help="run only notebooks whose file name contains this")
    r.add_argument("--timeout", type=seconds, default=600, help="seconds allowed per cell (default 600)")
    r.add_argument("--no-fetch", dest="fetch", action="store_false",
                   help="without the full MNIST, do not try `labkit data fetch` first: run on the shipped subset")
    r.add_argument("--allow-unheld-claims", action="store_true",
                   help="exit 0 even when a claim of the text did not hold (still listed): for exploratory runs")
    r.add_argument("--solutions", action="store_true",
                   help="keep the solution code and model answers in the executed notebooks (for instructors); "
                        "without it they show the exercises as students get them, safe to publish")
    r.add_argument("--no-warm", dest="warm", action="store_false", help=NO_WARM)


def _add_lab(sub) -> None:
    lab = _sub(sub, "lab", "start JupyterLab on your copies of the labs (other options go to JupyterLab)",
               "Copy the labs into a work folder as students get them (exercises to write, answer cells\n"
               "blank, the checks as they are) and start JupyterLab on it. A notebook already there is yours\n"
               "and is never overwritten; autosave never changes the course's notebooks. --solutions copies\n"
               f"the worked solutions into {SOLUTIONS}/ beside the work folder instead (never into it) and\n"
               "opens that. JupyterLab keeps its token (the URL it prints holds it); as root labkit adds\n"
               "--allow-root. Every option labkit does not know is passed on to JupyterLab unchanged, e.g.\n"
               "`labkit lab --no-browser --port 8899`; `jupyter lab --help-all` lists them.",
               _cmd_lab)
    lab.add_argument("--work", default="labkit-work",
                     help="folder for your copies of the labs, made on first use and never overwritten (default: "
                          "./labkit-work)")
    lab.add_argument("--solutions", action="store_true",
                     help=f"after trying: copy the worked solutions and model answers into {SOLUTIONS}/ beside the "
                          "work folder (never over a file there) and open that folder; your copies stay as they are")
    lab.add_argument("--notebooks", default=None,
                     help="open this folder itself instead of copies (instructors editing the course's notebooks)")
    lab.add_argument("--no-warm", dest="warm", action="store_false", help=NO_WARM)


def _add_data(sub) -> None:
    d = _sub(sub, "data", "where the data comes from; fetch or verify MNIST",
             "status: which data set each lab will use, and from where.\n"
             "fetch:  download the four original files (progress bar, sha256 checked, written atomically).\n"
             "verify: check the sha256 and structure of files you copied.", _cmd_data)
    d.add_argument("action", choices=["status", "fetch", "verify"])
    d.add_argument("--dataset", choices=["mnist", "fashion-mnist", "all"], default="mnist")
    d.add_argument("--root", default=None, help="data folder (default: $LABKIT_DATA, else data/ in a checkout, "
                                                "else ~/.cache/labkit/data)")


def _add_doctor(sub) -> None:
    doc = _sub(sub, "doctor", "check Python, BLAS, GPU, MPI, tools and data",
               "Say what labkit finds on this machine: Python, NumPy and its BLAS, the CUDA device (with a real kernel\n"
               "launch), nvcc and NVRTC (a test compile), the kernel emulator, MPI (a 2-rank job), ipyparallel,\n"
               "JupyterLab, the data each lab will use and the LABKIT_* settings in force. With --hosts, a 2-rank job\n"
               "across those hosts instead, and what stops it. Exit code 1 if something is broken.", _cmd_doctor)
    doc.add_argument("--hosts", default=None, metavar="A,B",
                     help="check MPI across these hosts: names resolve, ssh reaches them, the same MPI, a 2-rank job")
    doc.add_argument("--timeout", type=float, default=60, help="seconds for each step with --hosts (default 60)")


def _add_labs(sub) -> None:
    p = _sub(sub, "labs", "list the labs: notebook, what each needs; one lab's lessons, checks and claims",
             "The course's labs as labkit/labs.py declares them: without an argument, a table of every lab (its\n"
             "notebook, title and what it needs of the machine); with a lab's number, where its pieces live.\n"
             "labkit labs new NN slug TITLE writes a new lab's skeleton, as a draft (CONTRIBUTING.md, 'Adding a lab').",
             _cmd_labs)
    p.add_argument("number", nargs="?", default=None, help="one lab's number (07), or new")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="after new: NN slug TITLE [--root DIR]")


def _add_assign(sub) -> None:
    asg = _sub(sub, "assign", "write the student versions of the notebooks (solutions stubbed, outputs cleared)",
               "Write the student version of every lab: each solution region replaced by a stub, outputs cleared,\n"
               "the checks kept.", _cmd_assign)
    asg.add_argument("--out", default="student", help="output folder (default: student/)")
    asg.add_argument("--notebooks", default=None, help="folder of NN_*.ipynb notebooks (default: the repository's notebooks/)")
    asg.add_argument("--only", action="append", metavar="NAME",
                     help="only notebooks whose file name contains NAME; may be repeated (--only 01_ --only 07_)")
    asg.add_argument("--force", action="store_true", help="overwrite student files that differ (they may hold work)")
    asg.add_argument("--format", choices=["labkit", "nbgrader"], default="labkit",
                     help="labkit: student versions and a release record; nbgrader: source notebooks with nbgrader's "
                          "cell metadata (solutions kept, for nbgrader generate_assignment)")
    asg.add_argument("--deadline", action="append", metavar="NN=WHEN",
                     help="lab NN's deadline in the release record, ISO 8601 with its timezone "
                          "(01=2026-10-02T23:59:00+02:00); may be repeated")
    asg.add_argument("--late", default=None, metavar="PERCENT/DAYS",
                     help="the late policy in the release record: PERCENT off a day late, work more than DAYS late "
                          "scores 0 (default 10/5)")
    asg.add_argument("--partial-credit", action="store_true",
                     help="an exercise whose check fails scores the share of the check's cases it passed before the "
                          "first failure (the release record's partial_credit, per lab or per exercise)")
    asg.add_argument("--release", default="release",
                     help="folder for the release record that labkit grade uses (default: release/; never the students' folder)")


def _add_grade(sub) -> None:
    from .grading import collect, exports

    g = _sub(sub, "grade", "run students' notebooks and score every check (CSV and JSON)",
             "Run every student's notebook top to bottom on the quick profile, each in a sandbox of its own\n"
             "(bubblewrap: only its own files, no network, limits on memory, processes and CPU time). A cell that\n"
             "errs or runs past the limit is stopped and the notebook goes on; one that ignores the interrupt\n"
             "has its kernel killed. Each check cell is one exercise, judged by replaying the check on what the\n"
             "student's function returned. Writes grades.csv, grades.json and the executed notebooks.", _cmd_grade)
    g.add_argument("folder", help="one folder per student holding their notebooks, or the notebooks themselves "
                                  "(with --merge: the output folders of the parts)")
    g.add_argument("more", nargs="*", help=argparse.SUPPRESS)
    g.add_argument("--out", default="grades", help="output folder (default: grades/)")
    g.add_argument("--timeout", type=seconds, default=60, help=CELL_LIMIT)
    g.add_argument("--profile", choices=["quick", "full"], default="quick", help="the labs' PROFILE (default quick)")
    g.add_argument("--jobs", type=int, default=1, help="grade this many submissions at once (default 1; try the core count)")
    g.add_argument("--release", default=None,
                   help="the release record (release.json or its folder) from labkit assign (default: release/ if there)")
    g.add_argument("--memory", type=int, default=4096, metavar="MB", help="memory per notebook, all its processes (default 4096)")
    g.add_argument("--processes", type=int, default=256, help="processes per notebook (default 256)")
    g.add_argument("--cpu-seconds", type=int, default=1800, help="CPU seconds per process (default 1800)")
    g.add_argument("--part", metavar="K/N", help="grade only the K-th of N shares of the students (K = 0..N-1), e.g. "
                                               "one task of a SLURM array")
    g.add_argument("--merge", action="store_true",
                   help="merge the output folders given (the --part runs of a class, or a class then a later run that "
                        "regrades some students: the later grade is kept, with its executed notebook and the hand "
                        "scores of answers unchanged since) into --out")
    g.add_argument("--no-sandbox", action="store_true",
                   help="run the notebooks without isolation (their code gets your rights): for debugging only")
    g.add_argument("--feedback", default=None, metavar="DIR",
                   help="also write one HTML page per student and lab into DIR: their executed notebook with each "
                        "exercise's verdict and message beside its check cell, their score and the limits")
    g.add_argument("--hidden", action="append", metavar="NAME",
                   help="an exercise whose check is hidden (may be repeated, or NAME,NAME): it counts, but the "
                        "feedback and Gradescope show only whether it passed")
    g.add_argument("--hidden-part", action="append", metavar="NAME",
                   help="an exercise (or all) whose check also runs, silently, on a second secret draw of inputs: a "
                        "second row, NAME~hidden, that counts and whose message only you see (may be repeated, or "
                        "NAME,NAME); it doubles the check's time within --timeout")
    g.add_argument("--resume", action="store_true",
                   help="go on with an interrupted run into the same --out, with the same options: the notebooks it "
                        "finished (and that have not changed since) are not graded again")
    g.add_argument("--export", action="append", choices=list(exports.EXPORTS),
                   help="also write the grades for a gradebook: "
                        + collect.either([f"{name} ({what})" for name, what in exports.EXPORT_HELP.items()])
                        + "; may be repeated")
    g.add_argument("--canvas-gradebook", default=None, metavar="CSV",
                   help="with --export canvas: the gradebook exported from Canvas (Grades > Export); each lab goes into "
                        "the column of its assignment there, each student is found by ID, SIS User ID or login")
    g.add_argument("--roster", default=None, help=argparse.SUPPRESS)  # the earlier name of --canvas-gradebook
    g.add_argument("--canvas-assignment", action="append", metavar="NN=ID",
                   help="with --canvas-gradebook: lab NN goes into the assignment of Canvas id ID (default: the one "
                        "whose title holds the lab's number); may be repeated, or NN=ID,NN=ID")
    g.add_argument("--allow-unmatched", action="store_true",
                   help="with --export canvas: leave out (and list) the students the gradebook lacks, instead of failing")
    g.add_argument("--canvas-missing-zero", action="store_true",
                   help="with --export canvas: give 0 to each student of the gradebook with no submission of a lab "
                        "(default: leave the cell blank, which Canvas keeps as it was, and name them: no submission)")
    g.add_argument("--allow-unscored", action="store_true",
                   help="export to Canvas even with written answers not scored yet (they count 0 until scored)")
    g.add_argument("--lab", action="append", metavar="NN",
                   help="grade only these labs (01, or 01,07; may be repeated): the feedback and the Canvas export "
                        "hold no other; the grades of other labs already in --out are kept")
    g.add_argument("--submissions", default=None, metavar="CSV",
                   help="when each lab was handed in: the submissions.csv of labkit collect (default: FOLDER/"
                        "submissions.csv if there); the release's deadlines and late policies apply from it")
    g.add_argument("--extensions", default=None, metavar="CSV",
                   help="extensions: a CSV of student,lab,deadline (ISO 8601) or student,lab,days; lab blank for all")
    g.add_argument("--rescore", action="store_true",
                   help="FOLDER is an earlier --out: merge the scores and comments of its answers.csv into its grades, "
                        "then the feedback and exports asked for, without running any notebook")
    g.add_argument("--regrade", default=None, metavar="PREVIOUS",
                   help="an earlier run's output folder (or grades.json): write changes.csv, every verdict that changed")
    g.add_argument("--regrade-other-release", action="store_true",
                   help="with --regrade: compare even when the earlier grades come from another release")


def _add_collect(sub) -> None:
    from .grading import collect

    titles = [lms.title for lms in collect.LMSES]
    c = _sub(sub, "collect", f"sort an LMS's bulk download ({', '.join(titles)}) into one folder per student",
             "Read the bulk download of an assignment's submissions (the zip, or the folder it unpacks to) from\n"
             f"{collect.either(titles)}; find each notebook's lab by its content; keep each student's latest\n"
             "submission of a lab; and write SUBMISSIONS/<student>/<lab>.ipynb with SUBMISSIONS/submissions.csv\n"
             "(student, lab, file, submitted_at, lms, lms_user_id, lms_submission_id): the times come from the LMS's\n"
             "metadata, else from the files. A file it cannot place is listed with why, and the exit code is 1.",
             _cmd_collect)
    c.add_argument("download", help="the LMS's download: a .zip, or the folder it unpacks to")
    c.add_argument("--release", default=None,
                   help="the release record from labkit assign (default: release/ if there): the labs handed out")
    c.add_argument("--out", required=True, metavar="SUBMISSIONS", help="the folder to write (labkit grade's input)")
    c.add_argument("--from", dest="source", choices=[*collect.LMS, "auto"], default="auto",
                   help="which LMS made the download (default: auto, told by its file names)")
    c.add_argument("--lab", action="append", metavar="NN", help="only these labs (01, or 01,07); others are listed")
    c.add_argument("--lms-timezone", default=None, metavar="ZONE",
                   help="the timezone the LMS wrote its zip's file times in (America/Chicago, UTC, +02:00); zip entries "
                        "name none, and without it they are read in this machine's, which collect says")
    c.add_argument("--submitted-at", default=None, metavar="TIME|CSV",
                   help="the submission times where the LMS's download gives none "
                        f"({', '.join(lms.title for lms in collect.LMSES if not lms.times)}) and the files' are "
                        "wrong (a copy): one ISO 8601 time for all, or a CSV of student,lab,submitted_at (student as "
                        "collect names them or their LMS user id; lab blank for every lab)")


def _add_check_submission(sub) -> None:
    c = _sub(sub, "check-submission", "run the grader on your own notebook before handing it in",
             "Run your saved notebook as `labkit grade` does: top to bottom in a fresh kernel on the quick profile,\n"
             "each cell under the same time limit, each check's verdict replayed by the grader, in a sandbox where\n"
             "one can be made here (otherwise with your own rights, which it says). Prints each exercise's verdict\n"
             "and 'public checks passed: k of n'; the instructor may grade with hidden checks too. Exit code 0\n"
             "when every public check passed. From a notebook cell: labkit.grading.check_submission(PATH).",
             _cmd_check_submission)
    c.add_argument("notebook", help="your notebook (.ipynb), as saved")
    c.add_argument("--timeout", type=seconds, default=60, help=CELL_LIMIT.replace("(default 60)", "as the grader's default (60)"))
    c.add_argument("--profile", choices=["quick", "full"], default="quick", help="the labs' PROFILE (default quick)")
    c.add_argument("--release", default=None, help="the release record, if your instructor gave you one")


def _add_similarity(sub) -> None:
    sim = _sub(sub, "similarity", "rank pairs of students by how much code of their own they share (MOSS-like)",
               "Compare every two students' notebooks of the same lab, MOSS-like: comments, blank lines, docstrings\n"
               "and names are normalised away and the code handed out is removed, then winnowed fingerprints of the\n"
               "rest are matched. Writes DIR/similarity.html (the pairs ranked, the matching lines side by side) and\n"
               "DIR/similarity.csv (every pair). A lead for a person to read, never a verdict.", _cmd_similarity)
    sim.add_argument("folder", help="one folder per student holding their notebooks, or the notebooks themselves")
    sim.add_argument("--release", default=None,
                     help="the release record (release.json or its folder) from labkit assign, whose handed-out code "
                          "is removed (default: release/ if there, else rebuilt from the instructor's notebooks)")
    sim.add_argument("--out", default="similarity", help="output folder (default: similarity/)")
    sim.add_argument("--top", type=int, default=50, help="pairs shown with their code in the HTML (default 50)")
    sim.add_argument("--lab", default=None, metavar="NN", help="only the labs whose file name contains this, e.g. 07")
    sim.add_argument("--common", type=int, default=10, metavar="N",
                     help="code that more than N students of a lab share is an idiom, not a copy (default 10)")


def _add_bench(sub) -> None:
    from .benchmarks import BENCHMARKS

    b = _sub(sub, "bench", "run a benchmark: " + ", ".join(BENCHMARKS),
             "Benchmarks print ratios measured side by side in interleaved rounds (medians, every round kept):\n"
             + "\n".join(f"  {k:<10} {v}" for k, v in BENCHMARKS.items()), _cmd_bench)
    b.add_argument("name", choices=list(BENCHMARKS))
    b.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--out", default=None, help="also write the JSON to this file")
    b.add_argument("--hosts", type=int, default=0, metavar="N",
                   help="allreduce, training: also run one rank on each of N namespace hosts made on this machine (root)")
    b.add_argument("--link", default=None, metavar="RATE",
                   help="with --hosts: shape each host's cable to RATE as tc writes it (100mbit, 1gbit)")


def _add_cluster(sub) -> None:
    cl = _sub(sub, "cluster", "list or stop ipyparallel clusters left running (a notebook killed mid-lab)",
              "list: every ipyparallel cluster whose files say it is running, in every IPython profile.\n"
              "stop ID... or stop --all: stop them as `ipcluster stop` does (controller, mpiexec, engines).",
              _cmd_cluster)
    cl.add_argument("action", choices=["list", "stop"])
    cl.add_argument("id", nargs="*", help="cluster ids to stop (from `labkit cluster list`)")
    cl.add_argument("--all", action="store_true", help="stop every running cluster")


def _add_gpu_check(sub) -> None:
    gc = _sub(sub, "gpu-check", "on a CUDA machine: GPU tests, kernel benchmark, labs 04-05 in full, into one folder",
              "Run every check of the GPU half of the course on this machine's GPU: doctor, the tests marked gpu,\n"
              "`labkit bench kernels --json`, and labs 04 and 05 on the full profile; every log, the JSON and the\n"
              "executed notebooks go into one folder with summary.json. `make gpu-check` installs the GPU extra\n"
              "first. Without a usable GPU it refuses and says why.", _cmd_gpu_check)
    gc.add_argument("--out", default="gpu-check", help="output folder (default: gpu-check/)")
    gc.add_argument("--plan", action="store_true", help="print the steps and their commands, run nothing")

def _cmd_feedback(a) -> int:
    from .grading import exports, feedback

    data = exports.load(Path(a.grades) / "grades.json" if Path(a.grades).is_dir() else a.grades)
    grades_dir = Path(a.grades) if Path(a.grades).is_dir() else Path(a.grades).parent
    hidden = _names(a.hidden)
    if a.zip:
        path = feedback.write_zip(data, a.zip, grades_dir, hidden)
        print(f"feedback: {path}, one self-contained page per student ({len(data['students'])}), to upload")
    if a.out or not a.zip:
        pages = feedback.write(data, a.out or "feedback", grades_dir, hidden)
        print(f"feedback: {len(pages)} page(s), one per student and lab, in {a.out or 'feedback'}")
    return 0


def _add_feedback(sub) -> None:
    f = _sub(sub, "feedback", "write the feedback pages of a grading run, each a file that can be sent alone",
             "From a labkit grade --out folder: one HTML page per student and lab (their executed notebook, each\n"
             "exercise's verdict beside its check cell, the written answers' scores and comments), math as MathML\n"
             "and figures inside the page, nothing loaded from elsewhere. --zip FILE: one page per student, every\n"
             "lab in it, in one zip to upload.", _cmd_feedback)
    f.add_argument("grades", help="the --out folder of a labkit grade run (or its grades.json)")
    f.add_argument("--out", default=None, metavar="DIR", help="the pages' folder (default: feedback/, unless --zip)")
    f.add_argument("--zip", default=None, metavar="FILE", help="also (or only) one zip of one page per student")
    f.add_argument("--hidden", action="append", metavar="NAME",
                   help="an exercise whose check is hidden: only whether it passed shows (may be repeated, NAME,NAME)")


def _cmd_gradescope(a) -> int:
    from .grading import gradescope

    try:
        path = gradescope.build(a.release, a.lab, a.out, wheels=a.wheels, python_version=a.python_version,
                                platforms=a.platform, timeout=a.timeout)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"labkit gradescope: {e}") from None
    print(f"Gradescope autograder: {path} ({path.stat().st_size / 1e6:.0f} MB); upload it as the assignment's "
          "autograder (setup.sh installs from the wheels inside it, no network needed)")
    return 0


def _add_gradescope(sub) -> None:
    g = _sub(sub, "gradescope", "build a Gradescope autograder zip for one lab",
             "The zip's setup.sh installs labkit and its dependencies from wheels inside it (no network); its\n"
             "run_autograder grades /autograder/submission into /autograder/results/results.json, the submission's\n"
             "time read from submission_metadata.json. Building it downloads the wheels (a network is needed here).",
             _cmd_gradescope)
    g.add_argument("--release", required=True, help="the release record (release.json or its folder)")
    g.add_argument("--lab", required=True, metavar="NN", help="the lab to grade, e.g. 01")
    g.add_argument("--out", default="autograder.zip", help="the zip to write (default: autograder.zip)")
    g.add_argument("--timeout", type=seconds, default=60, help=CELL_LIMIT)
    g.add_argument("--python-version", default=None, help="Gradescope's Python, e.g. 3.10 (default: this one)")
    g.add_argument("--platform", action="append", help="its platform tag, e.g. manylinux_2_35_x86_64 (Gradescope's Ubuntu 22.04)")
    g.add_argument("--wheels", default=None, metavar="DIR", help="ship these wheels (labkit's and pip's among them) "
                                                               "instead of downloading them")


def build_parser() -> argparse.ArgumentParser:
    """The ``labkit`` command and its subcommands, each added by its ``_add_<name>``."""
    from . import __version__

    p = argparse.ArgumentParser(prog="labkit", formatter_class=_Help,
                                description="Course labs for parallel and distributed neural-network training.",
                                epilog="Every LABKIT_* environment variable is listed in docs/instructors.md and by "
                                       "`labkit doctor`.")
    p.add_argument("--version", action="version", version=f"labkit {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_report, _add_lab, _add_labs, _add_data, _add_doctor, _add_assign, _add_collect,
                _add_grade, _add_feedback, _add_gradescope, _add_check_submission, _add_similarity, _add_bench,
                _add_cluster, _add_gpu_check):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``labkit`` command."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "lab":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.extra = unknown  # JupyterLab's own options
    if args.command == "data" and args.action == "fetch" and args.root is None and settings.data_dir():
        args.root = settings.data_dir()
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        print(f"labkit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
