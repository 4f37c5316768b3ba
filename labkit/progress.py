"""Progress bars that follow tqdm's conventions: a widget in Jupyter, a bar in a terminal, nothing in a pipe.

Who decides, first to last: the caller's ``enable=`` argument; ``LABKIT_PROGRESS=1`` or ``0``; ``TQDM_DISABLE``
(tqdm's own variable, read by tqdm); otherwise bars are drawn in a notebook and on a terminal, and left out
where the output is a pipe or a CI log.
"""

from __future__ import annotations

from . import settings


def enabled(enable: bool | None = None) -> bool | None:
    """True or False when the caller or ``LABKIT_PROGRESS`` decided, else None (tqdm's default applies)."""
    if enable is not None:
        return bool(enable)
    return settings.progress()


def progress_bar(iterable=None, enable: bool | None = None, **kwargs):
    """A tqdm bar (the notebook widget inside Jupyter), or a silent one where bars are off."""
    from tqdm.auto import tqdm

    kwargs.setdefault("dynamic_ncols", True)
    choice = enabled(enable)
    if choice is not None:
        kwargs["disable"] = not choice
    elif not tqdm.__module__.startswith("tqdm.notebook"):
        kwargs["disable"] = None  # tqdm's convention: off when the output is not a terminal
    # in a notebook the output is never a terminal, so leave disable to tqdm (TQDM_DISABLE, else shown)
    return tqdm(iterable, **kwargs)
