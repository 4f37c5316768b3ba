"""labkit.questions: a prediction beside its measurement, and a cell that runs before the exercise it uses is
written."""

import pytest

from labkit import questions


def stub(x):
    '''Handed out: the docstring, then the stub.'''
    raise NotImplementedError


def stub_called(x):
    raise NotImplementedError()


def mine(x):
    '''Written.'''
    if x is None:
        raise NotImplementedError
    return x


def test_a_stub_is_not_written_and_labkits_own_runs_in_its_place(capsys):
    assert not questions.written(stub) and not questions.written(stub_called)
    assert questions.written(mine) and questions.written(len) and questions.written(lambda x: x)
    assert questions.yours_or_labkits(stub, mine, what="step") is mine
    assert "(step is not written yet: labkit's own runs in its place here)" in capsys.readouterr().out
    assert questions.yours_or_labkits(mine, stub, what="step") is mine and not capsys.readouterr().out


@pytest.mark.parametrize("predicted, measured, says", [
    (..., 240.0, "no prediction"), (None, 2, "no prediction"), ("  ", "ring", "no prediction"),
    (250, 240.0, "within 10 %"), (100, 240.0, "2.4x your prediction"), (1000, 240.0, "4.2x smaller"),
    ("Ring ", "ring", "right"), ("tree", "ring", "it was 'ring'."), ("240", 240.0, "write a number"),
    (0, 3.0, "you predicted 0"), (True, 1.0, "write a number"),
])
def test_compare_says_how_far_the_prediction_was_and_never_raises(predicted, measured, says, capsys):
    assert questions.compare(predicted, measured, "kB") is None  # a cell ending in it shows the line once
    assert says in capsys.readouterr().out


def test_a_count_is_right_only_when_exact_and_a_known_slip_is_named(capsys):
    """32 bank conflicts predicted for 31 is "within 10 %" as a ratio, and hides counting the wavefronts."""
    slip = {32: "that counts the wavefronts; the conflicts are the wavefronts after the first"}
    questions.compare(32, 31, "conflicts", "W = 32", exact=True, mistakes=slip)
    out = capsys.readouterr().out
    assert "off by 1, and a count is right only when exact: that counts the wavefronts" in out
    assert "within 10 %" not in out
    questions.compare(31, 31, "conflicts", exact=True, mistakes=slip)
    assert "31 conflicts: right." in capsys.readouterr().out
    questions.compare(2, 31, "conflicts", exact=True, mistakes=slip)
    assert capsys.readouterr().out.rstrip().endswith("off by 29, and a count is right only when exact.")


@pytest.fixture
def in_a_notebook(monkeypatch):
    """compare as a kernel runs it: what it displays, each a mime bundle."""
    import IPython.display

    shown = []
    monkeypatch.setattr(questions, "_shell", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw=False: shown.append(bundle))
    return shown


@pytest.mark.parametrize("predicted, measured, line, published", [
    (240, 237.0, "sent: you predicted 240 kB; measured 237 kB: within 10 %.",
     "sent: your prediction: (yours to make); measured 237 kB."),
    ("ring", "naive", "sent: you predicted 'ring'; it was 'naive'.", "sent: your prediction: (yours to make); it was 'naive'."),
    ("240", 237.0, "write a number", "sent: your prediction: (yours to make); the measurement was 237 kB."),
])
def test_in_a_notebook_the_line_is_marked_with_the_same_line_without_the_prediction(predicted, measured, line,
                                                                                     published, in_a_notebook, capsys):
    questions.compare(predicted, measured, "kB", "sent")
    (bundle,) = in_a_notebook
    assert line in bundle["text/plain"] and bundle[questions.PREDICTION_MIME]["published"] == published
    assert str(predicted) not in bundle[questions.PREDICTION_MIME]["published"] and not capsys.readouterr().out


def test_a_blank_prediction_is_a_plain_line_in_a_notebook_too(in_a_notebook, capsys):
    questions.compare(..., 237.0, "kB")  # nothing to keep from a published copy; nbgrader's tests read it as text
    assert not in_a_notebook and "no prediction" in capsys.readouterr().out
