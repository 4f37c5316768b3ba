import numpy as np
import pytest

from labkit import check, mlp
from labkit.check import ExerciseError


def reference_backprop(params, x, Y):
    return mlp.backprop(params, x, Y, "sigmoid", "quadratic")


def test_backprop_check_passes_reference(capsys):
    check.backprop(reference_backprop)
    assert "✔ vectorised backprop: all 3 checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong,match",
    [
        (lambda p, x, Y: [(gW * len(x), gb * len(x)) for gW, gb in reference_backprop(p, x, Y)], "batch size"),
        (lambda p, x, Y: [(gW.T, gb) for gW, gb in reference_backprop(p, x, Y)], "transposed"),
        (lambda p, x, Y: reference_backprop(p, x, Y)[:-1], "expected a list of 2"),
        (lambda p, x, Y: [(gW, gb) if i == len(p) - 1 else (gW * 1.5, gb)
                          for i, (gW, gb) in enumerate(reference_backprop(p, x, Y))],
         "(?s)layer 0: dW differs.*output layer is right"),
        (lambda p, x, Y: [(gW + 0.1, gb) for gW, gb in reference_backprop(p, x, Y)], "(?s)layer 1.*output layer's delta"),
        (lambda p, x, Y: (_ for _ in ()).throw(NotImplementedError), "not written yet"),
        (lambda p, x, Y: 1 / 0, "ZeroDivisionError"),
    ],
)
def test_backprop_check_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.backprop(wrong)


def test_backprop_check_catches_modified_params():
    def sneaky(params, x, Y):
        params[0][0][0, 0] += 1
        return reference_backprop(params, x, Y)

    with pytest.raises(ExerciseError, match="changed params"):
        check.backprop(sneaky)


def right_accumulate(params, x, Y, acc):
    total = 0.0
    for k in range(len(x)):
        loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        total += loss
        for (aW, ab), (gW, gb) in zip(acc, g):
            aW += gW
            ab += gb
    return total


def test_accumulate_check_passes_reference(capsys):
    check.accumulate(right_accumulate)
    assert "✔ per-thread accumulator" in capsys.readouterr().out


def overwrite(params, x, Y, acc):
    total = 0.0
    for k in range(len(x)):
        loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        total += loss
        for (aW, ab), (gW, gb) in zip(acc, g):
            aW[...] = gW
            ab[...] = gb
    return total


def rebinds(params, x, Y, acc):
    for k in range(len(x)):
        _, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        for (aW, _), (gW, _) in zip(acc, g):
            aW = aW + gW  # noqa: F841 - the mistake under test: a new array, acc untouched
    return 0.0


def mean_not_sum(params, x, Y, acc):
    loss, g = mlp.loss_and_grads_per_sample(params, x, Y)
    for (aW, ab), (gW, gb) in zip(acc, g):
        aW += gW
        ab += gb
    return loss * len(x)


@pytest.mark.parametrize("wrong,match", [(overwrite, "only the last sample"), (rebinds, "all zeros"),
                                         (mean_not_sum, "the mean, not the sum")])
def test_accumulate_check_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.accumulate(wrong)


def test_accumulate_check_wrong_loss():
    def bad_loss(params, x, Y, acc):
        right_accumulate(params, x, Y, acc)
        return 0.0

    with pytest.raises(ExerciseError, match="summed loss"):
        check.accumulate(bad_loss)


def test_exercise_error_is_assertion():
    assert issubclass(ExerciseError, AssertionError)
    np.testing.assert_equal(True, True)


def _topk(g, residual, ratio, by=np.abs, use_residual=True, reset=True, k_of=None):
    c = g + residual if use_residual else g.copy()
    k = k_of(g.size, ratio) if k_of else min(g.size, max(1, int(np.ceil(ratio * g.size))))
    idx = np.argpartition(by(c), g.size - k)[g.size - k:] if k else np.zeros(0, dtype=int)
    left = (g + residual).copy()
    if reset:
        left[idx] = 0
    return idx, c[idx], left


def test_topk_feedback_check_passes_reference(capsys):
    check.topk_feedback(_topk)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("kw, match", [
    ({"by": lambda c: c}, "by magnitude"),
    ({"use_residual": False}, r"g \+ residual"),
    ({"reset": False}, "with the sent entries set to 0"),
    ({"k_of": lambda n, r: int(r * n)}, "at least one entry"),
])
def test_topk_feedback_check_names_the_mistake(kw, match):
    with pytest.raises(ExerciseError, match=match):
        check.topk_feedback(lambda g, res, ratio: _topk(g, res, ratio, **kw))


def test_topk_feedback_check_not_written():
    def stub(g, residual, ratio):
        raise NotImplementedError
    with pytest.raises(ExerciseError, match="not written yet"):
        check.topk_feedback(stub)
