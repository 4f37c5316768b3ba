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
