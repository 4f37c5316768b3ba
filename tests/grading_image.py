"""This machine laid out as a grading image is, for the sandbox's fallback (an unprivileged user of its own): the
folders above Python and labkit open to other users for traversal, the checkout's instructor notebooks closed."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

import labkit
from labkit import labs
from labkit.grading import sandbox

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and sys.platform.startswith("linux")
needs_root = pytest.mark.skipif(not AS_ROOT, reason="the fallback sandbox (a user of its own) needs root on Linux")


@contextmanager
def as_a_grading_machine(*paths: Path):
    """LABKIT_SANDBOX=user, with every folder above Python, labkit and ``paths`` open to other users for traversal
    (o+x; this machine's Python may sit under /root, 0700) and the checkout's instructor notebooks closed to them
    (o-rwx), each mode put back afterwards."""
    changed: list[tuple[Path, int]] = []

    def chmod(path: Path, mode: int) -> None:
        changed.append((path, os.stat(path).st_mode & 0o7777))
        os.chmod(path, mode)

    try:
        for path in (Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix), Path(labkit.__file__),
                     *paths):
            for folder in [*path.parents, *([path] if path.is_dir() else [])]:
                if not os.stat(folder).st_mode & 0o001:
                    chmod(folder, (os.stat(folder).st_mode & 0o7777) | 0o001)
        chmod(labs.NOTEBOOKS, os.stat(labs.NOTEBOOKS).st_mode & 0o7770)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("LABKIT_SANDBOX", "user")
            assert sandbox.kind() == "user", sandbox.available()
            yield
    finally:
        for path, mode in reversed(changed):
            os.chmod(path, mode)
