"""The ``labkit`` command: report, lab, data, doctor, assign, grade, bench.

Run: ``labkit --help``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from . import settings


def _cmd_report(a) -> int:
    from . import report

    results, page = report.run(profile=a.profile, out=a.out, notebooks=a.notebooks or report.NOTEBOOKS,
                                only=a.only, timeout=a.timeout)
    print(report.summary(results, page))
    return 0 if all(r.ok for r in results) else 1


def _cmd_lab(a) -> int:
    from .report import NOTEBOOKS

    folder = Path(a.notebooks or NOTEBOOKS)
    cmd = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={folder}", *a.extra]
    print("starting:", " ".join(cmd))
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

    findings = doctor.run_all()
    print(doctor.render(findings))
    return 1 if any(f.status == doctor.FAIL for f in findings) else 0


def _cmd_assign(a) -> int:
    from . import assign, report

    notebooks = report.find_notebooks(a.notebooks or report.NOTEBOOKS, only=a.only)
    written = assign.write_student_versions(notebooks, a.out)
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} student notebook(s) in {Path(a.out).resolve()}: solutions replaced by stubs, outputs cleared, "
          "checks kept")
    return 0


def _cmd_grade(a) -> int:
    from . import grade

    results, csv_path, json_path = grade.grade(a.folder, a.out, timeout=a.timeout, profile=a.profile)
    print(grade.summary(results))
    print(f"\nwrote {csv_path} and {json_path}; the executed notebooks are in {Path(a.out) / 'executed'}")
    return 0


def _cmd_bench(a) -> int:
    from . import benchmarks

    mod = benchmarks.get(a.name)
    result = mod.run(quick=a.quick, progress=None if not a.json else False)
    text = json.dumps(result, indent=2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    if a.json:
        print(text)
    else:
        print(mod.report(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit", description="Course labs for parallel and distributed neural-network training.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="run every lab notebook headlessly and write an HTML report")
    r.add_argument("--profile", choices=["quick", "full"], default="quick",
                   help="quick: small settings (default); full: the real runs")
    r.add_argument("--out", default="report", help="output folder (default: report/)")
    r.add_argument("--notebooks", default=None, help="folder of NN_*.ipynb notebooks (default: the repository's notebooks/)")
    r.add_argument("--only", default=None, help="run only notebooks whose file name contains this")
    r.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell (default 600)")
    r.set_defaults(fn=_cmd_report)

    lab = sub.add_parser("lab", help="start JupyterLab on notebooks/ (other options go to JupyterLab, e.g. --no-browser)")
    lab.add_argument("--notebooks", default=None, help="folder to open (default: the repository's notebooks/)")
    lab.set_defaults(fn=_cmd_lab)

    d = sub.add_parser("data", help="where the data comes from; fetch or verify MNIST")
    d.add_argument("action", choices=["status", "fetch", "verify"])
    d.add_argument("--dataset", choices=["mnist", "fashion-mnist", "all"], default="mnist")
    d.add_argument("--root", default=None, help="data folder (default: $LABKIT_DATA, else data/)")
    d.set_defaults(fn=_cmd_data)

    doc = sub.add_parser("doctor", help="check Python, BLAS, GPU, MPI, tools and data")
    doc.set_defaults(fn=_cmd_doctor)

    asg = sub.add_parser("assign", help="write the student versions of the notebooks (solutions stubbed, outputs cleared)")
    asg.add_argument("--out", default="student", help="output folder (default: student/)")
    asg.add_argument("--notebooks", default=None, help="folder of NN_*.ipynb notebooks (default: the repository's notebooks/)")
    asg.add_argument("--only", default=None, help="only notebooks whose file name contains this")
    asg.set_defaults(fn=_cmd_assign)

    g = sub.add_parser("grade", help="run students' notebooks and score every check (CSV and JSON)")
    g.add_argument("folder", help="one folder per student holding their notebooks, or the notebooks themselves")
    g.add_argument("--out", default="grades", help="output folder (default: grades/)")
    g.add_argument("--timeout", type=int, default=60, help="seconds allowed per cell before it is stopped (default 60)")
    g.add_argument("--profile", choices=["quick", "full"], default="quick", help="the labs' PROFILE (default quick)")
    g.set_defaults(fn=_cmd_grade)

    from .benchmarks import BENCHMARKS

    b = sub.add_parser("bench", help="run a benchmark: " + ", ".join(BENCHMARKS))
    b.add_argument("name", choices=list(BENCHMARKS))
    b.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    b.add_argument("--json", action="store_true", help="print the results as JSON")
    b.add_argument("--out", default=None, help="also write the JSON to this file")
    b.set_defaults(fn=_cmd_bench)
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
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"labkit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
