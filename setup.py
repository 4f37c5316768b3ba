"""labkit's build: setuptools as pyproject.toml configures it, and one step of its own. The wheel's lab notebooks
(``labkit/notebooks/``) are the handouts, every solution region stubbed and every model answer blanked
(:mod:`labkit.handout`): a graded notebook can read the installed package, so the package holds no solution. The
instructor's notebooks stay in the checkout's ``notebooks/``, which an editable install reads where they are."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _handout():
    """labkit/handout.py loaded by its path: it needs nothing but the standard library, which is all a build has."""
    spec = importlib.util.spec_from_file_location("labkit_handout", ROOT / "labkit" / "handout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPy(build_py):
    """build_py, then the handouts into the built package (not in an editable install, which reads notebooks/)."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            _handout().write_handouts(ROOT / "notebooks", Path(self.build_lib) / "labkit" / "notebooks")


setup(cmdclass={"build_py": BuildPy})
