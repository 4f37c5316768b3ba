"""Shared by the MPI check programs (run as scripts, so this folder is on sys.path)."""


def refused(call, error, *words: str) -> BaseException:
    """``call()`` must raise ``error`` (a class or tuple) whose message holds every one of ``words``; returns it."""
    try:
        call()
    except error as e:
        for w in words:
            assert w in str(e), f"expected {w!r} in: {e}"
        return e
    raise AssertionError(f"expected {error} saying {words!r}")
