"""Progress bars that behave in a terminal, in JupyterLab and in headless runs.

``LABKIT_PROGRESS=0`` turns every bar off (the test suite does this).
"""

from __future__ import annotations

import os


def enabled(enable: bool | None = None) -> bool:
    """Whether to draw bars: an explicit choice wins, then $LABKIT_PROGRESS (default on)."""
    if enable is not None:
        return bool(enable)
    return os.environ.get("LABKIT_PROGRESS", "1").lower() not in ("0", "false", "no", "off")


def progress_bar(iterable=None, enable: bool | None = None, **kwargs):
    """A tqdm bar (the notebook widget inside Jupyter), or a silent one when disabled."""
    from tqdm.auto import tqdm

    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, disable=not enabled(enable), **kwargs)
