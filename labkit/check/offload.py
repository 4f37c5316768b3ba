"""Checks of lab 04: the two products of per-sample backprop written on an array module, the modelled time of one
offloaded product, the crossover width read from noisy timing tables, and the modelled time of batches whose copies
run beside kernels on one stream or two."""

from __future__ import annotations

import dis
import numbers
import sys

import numpy as np

from .. import mlp
from ..errors import LabkitError
from ..kernels import offload, streams
from . import capture
from .common import call, each_case, fail, one_number, passed, recorded
from .exercises import Exercise

# ---- 1. the backward pass on xp --------------------------------------------------------------------------------------

# (layer sizes, dtype): every layer 4 wide first, so that no mistake can hide behind a shape error; then every width
# different, one layer (nothing to send back), single neurons, and lab 04's sizes in float32
_BACKWARD_CASES = (([4, 4, 4, 4], np.float64), ([7, 6, 5, 3], np.float64), ([3, 2], np.float64),
                   ([1, 1, 1], np.float64), ([784, 100, 10], np.float32))

# the typical mistakes, as variants of the backward pass: (keyword arguments of _variant, what the check says)
_BACKWARD_MISTAKES = (
    (dict(outer="transposed"), "nabla_W is transposed: delta a^T has the shape of W, (n_out, n_in)"),
    (dict(outer="output"), "nabla_W pairs delta with the activation that came OUT of the layer; the weights multiplied "
                           "the one that went in"),
    (dict(back="W"), "delta went back through W, not W^T: W maps the layer's input to its output, W^T sends the error "
                     "from the output back to the input"),
    (dict(back="none"), "delta was not sent back: every layer below the output needs the error sent back through the "
                        "layers above it"),
    (dict(prime="next"), "you multiplied by sigma'(z) of the wrong layer: the error sent back to acts[{up}] passes "
                         "through the sigmoid that produced acts[{up}], not through the one above it"),
    (dict(prime="none"), "the error sent back lost sigma'(z): it must pass back through the sigmoid as well as "
                         "through W^T"),
    (dict(prime="sigma_of_a"), "sigma'(z) from the output a is a (1 - a): a is sigma(z) already, do not apply the "
                               "sigmoid to it again"),
)


def _forward(rng, sizes, dtype):
    """Weights, the sigmoid activations of one sample's forward pass, and an output error, as column vectors."""
    Ws = [(rng.standard_normal((n_out, n_in)) * 2 / np.sqrt(n_in)).astype(dtype) for n_in, n_out in zip(sizes, sizes[1:])]
    acts = [rng.random((sizes[0], 1)).astype(dtype)]
    for W in Ws:
        acts.append(mlp.sigmoid(W @ acts[-1] + rng.standard_normal((W.shape[0], 1))).astype(dtype))
    delta = (rng.standard_normal((sizes[-1], 1)) * acts[-1] * (1 - acts[-1])).astype(dtype)
    return Ws, acts, delta


def _variant(Ws, acts, delta, outer="right", back="right", prime="right"):
    """The backward pass with one mistake (or none): the layers it gets to before a shape stops it."""
    nabla = [None] * len(Ws)
    try:
        for i in range(len(Ws) - 1, -1, -1):
            g = delta @ (acts[i + 1] if outer == "output" else acts[i]).T
            nabla[i] = g.T if outer == "transposed" else g
            if i:
                sent = Ws[i] @ delta if back == "W" else delta if back == "none" else Ws[i].T @ delta
                a = acts[i + 1] if prime == "next" else mlp.sigmoid(acts[i]) if prime == "sigma_of_a" else acts[i]
                delta = sent if prime == "none" else sent * (a * (1 - a))
                if delta.shape != (Ws[i].shape[1], 1):
                    break
    except ValueError:  # shapes that do not fit: this mistake cannot be made on these sizes
        pass
    return nabla


def _close(a, b, dtype) -> bool:
    rtol, atol = (1e-4, 1e-6) if dtype == np.float32 else (1e-7, 1e-12)
    return a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol)


# ---- an array module that is not NumPy ---------------------------------------------------------------------------------

class NumPyOnXP(LabkitError):
    """NumPy was handed an array of :data:`FOREIGN_XP`, as CuPy's arrays on a GPU refuse to be."""


class XPArray:
    """An array of :data:`FOREIGN_XP`: a NumPy array inside, reached only through the module's functions, the array's
    own methods and Python's operators. Like a CuPy array it refuses NumPy's functions (np.dot, np.outer,
    np.zeros_like), NumPy's conversion (np.asarray) and arithmetic with NumPy's arrays, each with :class:`NumPyOnXP`."""

    __slots__ = ("a",)
    __hash__ = None

    def __init__(self, a: np.ndarray):
        self.a = a

    def __array__(self, *args, **kwargs):
        raise NumPyOnXP("NumPy tried to turn an array of xp into one of its own (np.asarray or np.array, or an xp "
                        "array stored into a NumPy array)")

    def __array_function__(self, func, types, args, kwargs):
        raise NumPyOnXP(f"np.{func.__name__} was called on xp's arrays")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(isinstance(v, np.ndarray) for v in inputs):
            raise NumPyOnXP(f"a NumPy array met an array of xp in np.{ufunc.__name__} (was it made by np.zeros, "
                            "np.empty or np.array?)")
        if method != "__call__" or kwargs or not any(isinstance(v, np.generic) for v in inputs) or not _by_operator():
            raise NumPyOnXP(f"np.{ufunc.__name__} was called on xp's arrays")
        return _xp_wrap(ufunc(*(_xp_plain(v, ufunc.__name__) for v in inputs)))  # a NumPy scalar's operator

    def __getattr__(self, name):
        if name.startswith("__"):  # NumPy looks for __array_interface__ and the like: the data stays out of its reach
            raise AttributeError(name)
        value = getattr(self.a, name)
        if callable(value):
            return lambda *args, **kwargs: _xp_wrap(value(*_xp_plain(args, name), **_xp_plain(kwargs, name)))
        return _xp_wrap(value)

    def __setitem__(self, key, value):
        self.a[_xp_plain(key, "[]")] = value.a if isinstance(value, XPArray) else value  # a host array is copied in

    def __repr__(self) -> str:
        return f"xp.array({self.a!r})"


def _by_operator() -> bool:
    """Whether the ufunc that reached :meth:`XPArray.__array_ufunc__` came from one of Python's operators on a NumPy
    scalar (``np.float64(1) - a``: xp's, as on CuPy) rather than from a call of NumPy's (``np.subtract(one, a)``): the
    instruction that the calling code is at."""
    frame = sys._getframe(2)  # the code that used the operator or called the ufunc
    at = next((i for i in dis.get_instructions(frame.f_code) if i.offset == frame.f_lasti), None)
    return at is not None and at.opname.startswith(("BINARY_", "INPLACE_", "COMPARE_OP"))


_OPS = [0]  # array operations done on FOREIGN_XP: a loop over the samples makes more of them for a larger batch


def _xp_operator(name: str):
    def op(self, *others):
        _OPS[0] += 1
        result = getattr(self.a, name)(*_xp_plain(others, name))
        return self if result is self.a else _xp_wrap(result)  # an in-place operator returns the array itself

    op.__name__ = name
    return op


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "matmul", "rmatmul", "truediv", "rtruediv", "pow", "rpow",
              "neg", "pos", "abs", "iadd", "isub", "imul", "imatmul", "itruediv", "ipow", "getitem", "len", "iter",
              "lt", "le", "gt", "ge", "eq", "ne", "float", "int", "bool"):
    setattr(XPArray, f"__{_name}__", _xp_operator(f"__{_name}__"))


def _xp_plain(v, where: str):
    """The NumPy arrays inside ``v`` (an array of xp, or lists, tuples and dicts of them); a NumPy array refused."""
    if isinstance(v, XPArray):
        return v.a
    if isinstance(v, np.ndarray):
        raise NumPyOnXP(f"a NumPy array was given to xp's {where.strip('_')} beside xp's arrays (was it made by "
                        "np.zeros, np.empty or np.array?)")
    if isinstance(v, (list, tuple)):
        return type(v)(_xp_plain(x, where) for x in v)
    if isinstance(v, dict):
        return {k: _xp_plain(x, where) for k, x in v.items()}
    return v


def _xp_wrap(v):
    if isinstance(v, np.ndarray):
        return XPArray(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_xp_wrap(x) for x in v)
    return v if not hasattr(v, "__next__") else (_xp_wrap(x) for x in v)


class _ForeignModule:
    """An array module that is not NumPy: NumPy's functions under their names, taking and giving :class:`XPArray`;
    ``asarray`` and ``array`` also take NumPy's arrays, as a copy to the device does."""

    __name__ = "labkit.check.offload.FOREIGN_XP"

    def __getattr__(self, name):
        value = getattr(np, name)
        if isinstance(value, type) or not callable(value):
            return value  # dtypes (xp.float32), constants (xp.newaxis, xp.pi)
        _OPS[0] += 1
        if name in ("asarray", "array", "ascontiguousarray"):
            return lambda a, *args, **kwargs: XPArray(value(a.a if isinstance(a, XPArray) else a, *args, **kwargs))
        return lambda *args, **kwargs: _xp_wrap(value(*_xp_plain(args, name), **_xp_plain(kwargs, name)))


FOREIGN_XP = _ForeignModule()


def _on_foreign_xp(fn, Ws, acts, delta) -> dict:
    """``fn`` run on :data:`FOREIGN_XP` with copies of the arrays: plain data for the record, what it raised or what
    it returned (each entry an array of xp, brought back; a NumPy array, marked; anything else, its type's name)."""
    try:
        got = fn(FOREIGN_XP, [XPArray(W.copy()) for W in Ws], [XPArray(a.copy()) for a in acts], XPArray(delta.copy()))
    except Exception as e:  # noqa: BLE001 - the student's code: what it raised is judged by the check
        return {"raised": type(e).__name__, "message": str(e)}
    if not isinstance(got, (list, tuple)):
        return {"returned": type(got).__name__}
    kinds = ["xp" if isinstance(g, XPArray) else "numpy" if isinstance(g, np.ndarray) else type(g).__name__ for g in got]
    return {"kinds": kinds, "arrays": [g.a if isinstance(g, XPArray) else None for g in got]}


def _judge_foreign_xp(ex: str, where: str, seen: dict, Ws, acts, delta, dtype) -> None:
    """Fail where the run on an array module that is not NumPy reached for NumPy, or came out otherwise than on
    NumPy."""
    why = _foreign_raised(ex, where, seen)
    kinds = seen.get("kinds", [])
    numpy = [i for i, k in enumerate(kinds) if k == "numpy"]
    if numpy:
        fail(ex, f"{where}, with xp an array module that is not NumPy: nabla_W of layer {numpy[0]} came back as a "
                 f"NumPy array, not one of xp's: it was made by np.* (np.zeros? np.outer?); {why}")
    other = [f"layer {i}: {k}" for i, k in enumerate(kinds) if k != "xp"]
    if "returned" in seen or other:
        fail(ex, f"{where}, with xp an array module that is not NumPy: expected a list of xp's arrays, got "
                 f"{seen.get('returned') or ', '.join(other)}")
    _compare_backward(ex, f"{where}, with xp an array module that is not NumPy", seen["arrays"], Ws, acts, delta, dtype)


def _foreign_raised(ex: str, where: str, seen: dict) -> str:
    """Fail where the run on :data:`FOREIGN_XP` raised: NumPy called on xp's arrays, or anything else; else the why."""
    why = "a module like CuPy, whose arrays live on a GPU, cannot take them: use xp for every product and every new array"
    if seen.get("raised") == NumPyOnXP.__name__:
        sigmoid = " (labkit's mlp.sigmoid, too, calls NumPy on arrays it does not know)" if "np.tanh" in seen["message"] else ""
        fail(ex, f"{where}, with xp an array module that is not NumPy: {seen['message']}: your function calls NumPy "
                 f"directly where it should call xp{sigmoid}; {why}")
    if "raised" in seen:
        fail(ex, f"{where}: your function passed with xp = numpy but raised {seen['raised']}: {seen['message']} with xp "
                 "an array module that is not NumPy (NumPy's functions under the same names)",
             "use only what NumPy and CuPy both have: xp's functions, the arrays' methods and operators")
    return why


@recorded
def device_backward(fn) -> None:
    """Exercise (lab 04): ``fn(xp, Ws, acts, delta) -> [nabla_W_0, ..., nabla_W_{L-1}]``, one sample's weight gradients
    from the output layer back, written on the array module ``xp``; checked with xp = numpy against
    :func:`labkit.offload.backward` on five networks (square layers, all widths different, one layer, single neurons,
    [784, 100, 10] in float32), relative tolerance 1e-7 (float64) and 1e-4 (float32); then once more on the first with
    xp an array module that is not NumPy (:data:`FOREIGN_XP`), whose arrays NumPy's functions refuse, as on CuPy."""
    ex = "backward on xp"
    student, fn = fn, capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(40))
    first = None
    for sizes, dtype in each_case(_BACKWARD_CASES, more=1):
        Ws, acts, delta = _forward(rng, sizes, dtype)
        first = first or (sizes, dtype, Ws, acts, delta)
        kept = [a.copy() for a in (*Ws, *acts, delta)]
        where = f"sizes {sizes} ({np.dtype(dtype)})"
        got = call(ex, fn, np, Ws, acts, delta)
        if any(not np.array_equal(a, b) for a, b in zip((*Ws, *acts, delta), kept)):
            fail(ex, f"{where}: your function changed its inputs (Ws, acts or delta)",
                 "compute new arrays (delta = ... makes a new one; delta *= ... changes the caller's)")
        _compare_backward(ex, where, got, Ws, acts, delta, dtype)
    sizes, dtype, Ws, acts, delta = first  # once more, on an array module that is not NumPy
    seen = capture.step("foreign xp", lambda: _on_foreign_xp(student, Ws, acts, delta),
                        key=capture.digest((Ws, acts, delta), {}))
    _judge_foreign_xp(ex, f"sizes {sizes} ({np.dtype(dtype)})", seen, Ws, acts, delta, dtype)
    passed(ex, len(_BACKWARD_CASES) + 1)


def _compare_backward(ex, where, got, Ws, acts, delta, dtype) -> None:
    """From the output layer back (as the error flows): the first wrong layer, and the mistake that explains it."""
    L = len(Ws)
    if not isinstance(got, (list, tuple)) or len(got) != L:
        fail(ex, f"{where}: expected a list of {L} arrays, one nabla_W per layer, got {type(got).__name__}"
             + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""),
             "make a list of len(Ws) entries and fill it from the last layer to the first")
    want = offload.backward(np, Ws, acts, delta)
    for i in range(L - 1, -1, -1):
        layer = f"{where}, layer {i} " + ("(the output layer)" if i == L - 1 else "(counting from 0 at the input)")
        try:
            g = np.asarray(got[i], dtype=float)
        except (TypeError, ValueError):
            fail(ex, f"{layer}: nabla_W is a {type(got[i]).__name__}, not an array")
        if _close(g, want[i], dtype):
            continue
        for kw, why in _BACKWARD_MISTAKES:
            wrong = _variant(Ws, acts, delta, **kw)[i]
            if wrong is not None and not _close(wrong, want[i], dtype) and _close(g, wrong, dtype):
                fail(ex, f"{layer}: {why.format(up=i + 1)}")
        if g.shape != want[i].shape:
            fail(ex, f"{layer}: nabla_W has shape {g.shape}, expected {want[i].shape}, the shape of Ws[{i}]")
        err = float(np.abs(g - want[i]).max())
        fail(ex, f"{layer}: nabla_W differs from the reference by up to {err:.3g}"
             + (", and the layers above it are right" if i < L - 1 else ""))


# ---- 2. the time of one offloaded product ----------------------------------------------------------------------------

_GPU = {"launch": 5e-6, "copy": 10e-6, "bandwidth": 25e9, "throughput": 1.5e12}   # an assumed GPU over PCIe
_EMULATOR = {"launch": 3e-4, "copy": 2e-6, "bandwidth": 20e9, "throughput": 2e9}  # about labkit's CPU emulator
_HUGE = 1e30  # a bandwidth or a throughput that makes its term vanish


def _mode(resident: bool) -> str:
    return "resident" if resident else "copy mode"


@recorded
def offload_time(fn) -> None:
    """Exercise (lab 04): ``fn(n_out, n_in, costs, resident) -> seconds`` of one offloaded W^T delta. Each term alone
    first (the other costs made zero or negligible): the bytes copied, the flops, the fixed costs of the copies and
    the launch; then the whole time on shapes from 1 x 1 to 80,000 x 784, both modes, three sets of costs, relative
    tolerance 1e-9."""
    ex = "offload time"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(41))
    drawn = (int(rng.integers(2, 400)), int(rng.integers(2, 400)))
    shapes = (drawn, (30, 784), (100, 100), (1, 1), (80_000, 784))
    n = 0
    costs = (_GPU, _EMULATOR, {k: v * float(rng.uniform(0.5, 2.0)) for k, v in _GPU.items()})
    for resident in each_case((False, True), more=len(costs)):  # each term alone, then the whole time per costs
        _copy_term(ex, fn, shapes[:3], resident)
        _kernel_term(ex, fn, shapes[:3], resident)
        _fixed_costs(ex, fn, drawn, resident)
        n += 3
    for c in each_case(costs):
        for shape in shapes:
            for resident in (False, True):
                got = _seconds(ex, fn, shape, c, resident)
                want = offload.offload_time(*shape, c, resident)
                if not np.isclose(got, want, rtol=1e-9, atol=0):
                    fail(ex, f"W of {shape[0]} x {shape[1]}, {_mode(resident)}, costs {c}: your time is {got:.6g} s, "
                         f"expected {want:.6g} s (each term alone was right)",
                         "the phases run one after another, each waiting for the one before: their times add")
        n += 1
    passed(ex, n)


def _seconds(ex, fn, shape, costs, resident) -> float:
    got = call(ex, fn, shape[0], shape[1], dict(costs), resident)
    return one_number(ex, "", got, "expected a number of seconds")


def _copy_term(ex, fn, shapes, resident) -> None:
    """Copies alone (no fixed costs, an instant kernel, 1 byte/s): the time is the bytes copied."""
    costs = {"launch": 0.0, "copy": 0.0, "bandwidth": 1.0, "throughput": _HUGE}
    got = {s: _seconds(ex, fn, s, costs, resident) for s in shapes}
    for (n_out, n_in), b in got.items():
        want = offload.FLOAT_BYTES * (n_out + n_in + (0 if resident else n_out * n_in))
        if np.isclose(b, want, rtol=1e-9):
            continue
        where = f"the copies alone, W of {n_out} x {n_in}, {_mode(resident)}"
        with_W = offload.FLOAT_BYTES * (n_out + n_in + n_out * n_in)
        if resident and any(np.isclose(b, x, rtol=1e-9) for x in (with_W, with_W / 4)):
            fail(ex, f"{where}: you copy W, but resident means W is already on the device: only the vectors delta and "
                 "the result travel, so the copies grow with n, not n^2")
        if np.isclose(b, want / offload.FLOAT_BYTES, rtol=1e-9):
            fail(ex, f"{where}: you count {b:,.0f} floats as bytes: the bandwidth is in bytes per second, and a "
                 f"float32 is {offload.FLOAT_BYTES} bytes")
        if not resident and _grows_linearly(got):
            fail(ex, f"{where}: the copy time must grow with the bytes copied: W alone is {n_out} x {n_in} floats, "
                 "so the copies grow with n_out x n_in (n^2 for a square layer), not with n_out + n_in")
        if np.isclose(b, want + offload.FLOAT_BYTES * (n_out - n_in), rtol=1e-9) and n_out != n_in:
            fail(ex, f"{where}: the result copied back is W^T delta, one value per input: {n_in} floats, not {n_out}")
        fail(ex, f"{where}: your copies take {b:,.6g} s at 1 byte/s, so they move {b:,.6g} bytes; expected {want:,} bytes")


def _grows_linearly(got: dict) -> bool:
    """Whether the (square) 100 x 100 case moved far less than 100 x 100 floats: a copy term without n_out x n_in."""
    return got[(100, 100)] < offload.FLOAT_BYTES * 100 * 100


def _kernel_term(ex, fn, shapes, resident) -> None:
    """The kernel alone (no fixed costs, instant copies, 1 flop/s): the time is the kernel's flops."""
    costs = {"launch": 0.0, "copy": 0.0, "bandwidth": _HUGE, "throughput": 1.0}
    got = {s: _seconds(ex, fn, s, costs, resident) for s in shapes}
    for (n_out, n_in), f in got.items():
        want = 2 * n_out * n_in
        if np.isclose(f, want, rtol=1e-9):
            continue
        where = f"the kernel alone, W of {n_out} x {n_in}, {_mode(resident)}"
        if np.isclose(f, want / 2, rtol=1e-9):
            fail(ex, f"{where}: you count {f:,.0f} flops: each entry of W is multiplied AND added, two flops")
        if got[(100, 100)] < 100 * 100:
            fail(ex, f"{where}: the kernel's work must grow with the entries of W, n_out x n_in, not with n_out + n_in")
        fail(ex, f"{where}: your kernel takes {f:,.6g} s at 1 flop/s, so it does {f:,.6g} flops; expected {want:,}")


def _fixed_costs(ex, fn, shape, resident) -> None:
    """The fixed costs alone (instant bytes and flops): one launch, and one fixed cost per copy."""
    huge = {"bandwidth": _HUGE, "throughput": _HUGE}
    launches = _seconds(ex, fn, shape, {"launch": 1.0, "copy": 0.0, **huge}, resident)
    if not np.isclose(launches, 1.0, rtol=1e-9):
        yours = "has no launch in it" if abs(launches) < 1e-6 else f"is {launches:g} s"
        fail(ex, f"the launch alone (launch = 1 s, nothing else costs), {_mode(resident)}: your time {yours}, "
             "expected 1 s: one product is one kernel launch, and it pays costs['launch'] once")
    copies = _seconds(ex, fn, shape, {"launch": 0.0, "copy": 1.0, **huge}, resident)
    want = 2 if resident else 3
    if not np.isclose(copies, want, rtol=1e-9):
        why = ("resident: W is already on the device, so only delta goes in and the result comes out" if resident and
               np.isclose(copies, 3) else "every array that crosses the link is one copy, and pays costs['copy'] once"
               + (" (in copy mode: W and delta in, the result out)" if not resident else ""))
        fail(ex, f"the fixed cost of the copies alone (copy = 1 s, nothing else costs), {_mode(resident)}: your time is "
             f"{copies:g} s, so your copies pay costs['copy'] {copies:g} times; expected {want}: {why}")


# ---- 3. the crossover width ------------------------------------------------------------------------------------------

_WIDTHS = [100, 300, 1000, 3000, 10_000, 30_000]
_SPREAD = np.array([0.97, 0.985, 1.0, 1.015, 1.03])  # 5 repetitions around each median, shuffled per width

# (what the case is, offloaded time / host time of each width, the flukes: (repetition, width index, factor on the
# offloaded time)); the widths and the timings are scaled by the check's draw
_CROSSOVER_CASES = (
    ("a clean crossover", [3, 2, 1.5, 0.7, 0.4, 0.2], ()),
    ("no crossover", [5, 4, 3, 2, 1.5, 1.2], ()),
    ("offloading wins at every width", [0.9, 0.8, 0.5, 0.3, 0.2, 0.1], ()),
    ("offloading wins at the widest width only", [4, 3, 2, 1.5, 1.1, 0.9], ()),
    ("a win by noise before the crossover", [2, 0.95, 1.3, 1.2, 0.8, 0.5], ()),
    ("one slow repetition (a hiccup)", [3, 2, 1.4, 0.8, 0.6, 0.4], ((1, 3, 20.0),)),
    ("one fast repetition (a fluke)", [3, 2, 1.5, 1.3, 0.7, 0.5], ((2, 3, 0.5),)),
    ("a single width", [0.5], ()),
)
_COPY_SHARE = 0.6  # of the offloaded time: the kernel alone would win where the ratio is below 1 / (1 - 0.6)


def _crossover_table(rng, widths, ratios, flukes):
    """(host, copy, kernel), each (repetitions, widths), whose medians are host and ratio x host at each width."""
    host_median = np.asarray(widths, dtype=float) * 784 * 2 / float(rng.uniform(5e9, 2e10))
    shuffled = np.stack([rng.permutation(_SPREAD) for _ in widths], axis=1)
    host = host_median * np.stack([rng.permutation(_SPREAD) for _ in widths], axis=1)
    offloaded = np.asarray(ratios, dtype=float) * host_median * shuffled
    for r, j, factor in flukes:
        offloaded[r, j] *= factor
    return host, _COPY_SHARE * offloaded, (1 - _COPY_SHARE) * offloaded


def _crossover_mistakes(widths, host, copy, kernel):
    """(answer, what the check says) of the typical mistakes on one table."""
    med = lambda t: np.median(t, axis=0)  # noqa: E731
    wins = med(copy + kernel) < med(host)
    first_win = widths[int(np.argmax(wins))] if wins.any() else None
    return (
        (offload.winning_from(widths, med(kernel) < med(host)),
         "offloading costs the copies too: compare copy + kernel with the host, not the kernel alone"),
        (first_win, "offloading won at that width but lost again at a wider one: a win that does not last is noise; "
                    "the crossover is the width from which it keeps winning"),
        (offload.winning_from(widths, (copy + kernel).mean(0) < host.mean(0)),
         "one slow repetition (a hiccup) moved your average: judge each width by a typical time that one fluke "
         "cannot move"),
        (offload.winning_from(widths, (copy + kernel).min(0) < host.min(0)),
         "the fastest repetition can be a fluke as much as the slowest can be a hiccup: judge each width by a typical "
         "time that one fluke cannot move"),
    )


@recorded
def offload_crossover(fn) -> None:
    """Exercise (lab 04): ``fn(widths, host, copy, kernel) -> width or None``, the smallest width from which offloading
    (copy + kernel) beats the host at that width and every wider one, from tables of (repetitions, widths) seconds.
    Checked on synthetic tables: a clean crossover, none, at the first and at the last width, a win by noise, one
    slow and one fast repetition, a single width, and one drawn afresh; the answer must be exactly the width, or None."""
    ex = "offload crossover"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(42))
    scale = int(rng.integers(1, 4))
    ratios = np.sort(rng.uniform(0.2, 3.0, 6))[::-1]
    drawn = ("a table drawn afresh", list(ratios), ())
    for k, (what, ratio, flukes) in enumerate(each_case((*_CROSSOVER_CASES, drawn))):
        widths = [w * scale for w in _WIDTHS[len(_WIDTHS) - len(ratio):]]
        host, copy, kernel = _crossover_table(rng, widths, ratio, flukes)
        want = offload.offload_crossover(widths, host, copy, kernel)
        got = call(ex, fn, list(widths), host.copy(), copy.copy(), kernel.copy())
        _judge_crossover(ex, f"case {k + 1}, {what} (widths {widths}, {host.shape[0]} repetitions)", got, want,
                         widths, host, copy, kernel)
    passed(ex, len(_CROSSOVER_CASES) + 1)


def _same(got, want) -> bool:
    if want is None or got is None:
        return got is None and want is None
    return isinstance(got, numbers.Real) and not isinstance(got, (bool, np.bool_)) and float(got) == float(want)


def _judge_crossover(ex, where, got, want, widths, host, copy, kernel) -> None:
    if _same(got, want):
        return
    if got is not None and (np.ndim(got) != 0 or not isinstance(got, numbers.Real) or isinstance(got, (bool, np.bool_))):
        fail(ex, f"{where}: expected one width (a number) or None, got {type(got).__name__} {got!r}"[:300])
    if got is not None and not any(_same(got, w) for w in widths) and any(_same(got, i) for i in range(len(widths))):
        fail(ex, f"{where}: you returned {got!r}, an index; return the width itself ({want} here)")
    for answer, why in _crossover_mistakes(widths, host, copy, kernel):
        if not _same(answer, want) and _same(got, answer):
            fail(ex, f"{where}: you returned {got}, expected {want}: {why}")
    if want is None:
        if _same(got, widths[-1]):
            fail(ex, f"{where}: no crossover should give None, not the last width: offloading loses even at "
                 f"{widths[-1]}")
        fail(ex, f"{where}: offloading does not win at the widest width, so there is no crossover: return None, "
             f"not {got!r}")
    if got is None:
        why = ""
        if want == widths[-1]:
            why = ": it wins at the widest width, and that is a crossover even with nothing wider to confirm it"
        elif want == widths[0]:
            why = f": it wins at every width, so the crossover is the first one, {widths[0]}"
        fail(ex, f"{where}: offloading wins from width {want} on, but you returned None{why}")
    if want == widths[0] and len(widths) > 1 and _same(got, widths[1]):
        fail(ex, f"{where}: you returned {got}, expected {want}: offloading wins at every width, the first one included "
             "(does your search start at index 1?)")
    fail(ex, f"{where}: you returned {got!r}, expected {want}")


# ---- 4. copies beside kernels, modelled ------------------------------------------------------------------------------

# (what the case is, copy times, kernel times), in units the check draws: equal batches as section 7's question asks,
# copies faster and slower than kernels, one batch, two (all these the same for every batch), then times that differ
# per batch, with a long copy (batch 2's) beside a short kernel (batch 1's), where the copy must first wait for its
# buffer: only there do the uniform formula and copies that never wait for a buffer go wrong
_STREAM_CASES = (
    ("equal batches, c = k", [1.0] * 8, [1.0] * 8),
    ("copies faster than kernels, c < k", [1.0] * 6, [3.0] * 6),
    ("copies slower than kernels, c > k", [3.0] * 6, [1.0] * 6),
    ("one batch", [2.0], [3.0]),
    ("two batches", [2.0, 2.0], [1.0, 1.0]),
    ("times that differ per batch", [1.0, 1.0, 6.0, 1.0, 1.0, 5.0], [4.0, 1.0, 2.0, 3.0, 1.0, 2.0]),
)


def _free_copies(copy, kernel) -> float:
    """Copies back to back, never waiting for a buffer; each kernel after its copy and the previous kernel."""
    copy_end = kernel_end = 0.0
    for c, k in zip(copy, kernel):
        copy_end += c
        kernel_end = max(copy_end, kernel_end) + k
    return kernel_end


def _stream_mistakes(copy, kernel, n_streams):
    """(the time of a typical mistake, what the check says) for one case and number of streams."""
    c, k, n = copy.mean(), kernel.mean(), len(copy)
    if n_streams == 1:
        why = ("your copies run beside the kernels, but one stream runs its work in order: each copy waits until the "
               "previous batch's kernel has ended, so nothing overlaps")
        return ((streams.stream_time(copy, kernel, 2), why), (_free_copies(copy, kernel), why))
    return (
        (float(copy.sum() + kernel.sum()), "your time is the sum of every copy and every kernel, as if nothing "
         "overlapped: on two streams the copy of one batch runs while the previous batch's kernel computes"),
        (float(max(copy.sum(), kernel.sum())), "your time is max(sum of the copies, sum of the kernels), a perfect "
         "overlap from start to end: but the first kernel waits for the first copy, and the last kernel runs after "
         "the last copy (the pipeline fills and drains)"),
        (float(c + k + (n - 1) * max(c, k)), "your time is c + k + (n - 1) max(c, k) with the mean copy and kernel "
         "times: that holds only when every batch takes the same times; here they differ, so follow the batches one "
         "by one"),
        (_free_copies(copy, kernel), "your copies run ahead of the kernels freely, but there are only two buffers: "
         "batch i's copy overwrites the buffer of batch i - 2, so it must wait until that batch's kernel has ended"),
    )


@recorded
def stream_time(fn) -> None:
    """Exercise (lab 04): ``fn(copy, kernel, streams) -> seconds`` from the first copy's start to the last kernel's
    end, batch i copying for ``copy[i]`` and computing for ``kernel[i]`` seconds, on 1 stream or 2 (two buffers).
    Checked against :func:`labkit.kernels.streams.stream_time` on 1 and 2 streams: 8 equal batches (c = k), c < k,
    c > k, one batch, two, times that differ per batch, and a case drawn afresh; relative tolerance 1e-9."""
    ex = "stream time"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(43))
    unit = int(rng.integers(1, 10)) * 1e-3
    n = int(rng.integers(3, 10))
    drawn = ("times drawn afresh", list(rng.uniform(0.2, 4.0, n)), list(rng.uniform(0.2, 4.0, n)))
    for j, (what, copy, kernel) in enumerate(each_case((*_STREAM_CASES, drawn)), 1):
        copy, kernel = np.array(copy) * unit, np.array(kernel) * unit
        for n_streams in (1, 2):
            where = (f"case {j}, {what}, {n_streams} stream{'s' if n_streams == 2 else ''} ({len(copy)} batches, copy "
                     f"{_ms(copy)} ms, kernel {_ms(kernel)} ms)")
            got = _stream_seconds(ex, where, call(ex, fn, copy.copy(), kernel.copy(), n_streams, where=where))
            want = streams.stream_time(copy, kernel, n_streams)
            if np.isclose(got, want, rtol=1e-9, atol=0):
                continue
            for wrong, why in _stream_mistakes(copy, kernel, n_streams):
                if not np.isclose(wrong, want, rtol=1e-9, atol=0) and np.isclose(got, wrong, rtol=1e-9, atol=0):
                    fail(ex, f"{where}: {why}")
            fail(ex, f"{where}: your time is {got * 1e3:.6g} ms, expected {want * 1e3:.6g} ms")
    passed(ex, 2 * (len(_STREAM_CASES) + 1))


def _ms(t) -> str:
    return "[" + ", ".join(f"{v * 1e3:.4g}" for v in t) + "]"


def _stream_seconds(ex, where, got) -> float:
    if np.ndim(got) > 0:
        fail(ex, f"{where}: expected one number, the seconds to the last kernel's end; got {type(got).__name__} of "
             f"{np.size(got)} values: return the last kernel's end, not every batch's")
    return one_number(ex, where, got, "expected a number of seconds")


# ---- 4. one step on a whole batch, on xp -----------------------------------------------------------------------------

# (layer sizes, batch, dtype): everything 4 wide and a batch of 4 first, so that no transposed product or summed axis
# can hide behind a shape error; then every size different, one layer and one sample, and lab 04's sizes in float32
_STEP_CASES = (([4, 4, 4], 4, np.float64), ([7, 6, 5, 3], 8, np.float64), ([3, 2], 1, np.float64),
               ([784, 100, 10], 16, np.float32))
_STEP_LR = 0.5

_STEP_MISTAKES = (
    (dict(outer="transposed"), "dW is transposed: with one sample per row, the B outer products delta_k a_k^T summed "
                               "are delta^T A_in, of W's shape (n_out, n_in)"),
    (dict(mean="sum"), "your gradients are B times too large: the B outer products summed are the gradient of the "
                       "batch's total cost; the cost is its mean, so divide by B once"),
    (dict(mean="twice"), "your gradients are B times too small: you divided by B twice (once in delta, once more in "
                         "dW or db); the mean's 1/B belongs in once"),
    (dict(bias="neurons"), "db summed delta over the neurons (axis 1), not over the batch: one value per neuron, the sum "
                           "of delta's rows (axis 0)"),
    (dict(bias="none"), "b was not updated: db is the sum of delta's rows, divided by B, and b -= lr db"),
    (dict(back="WT"), "delta went back as delta W^T: with one sample per row, each row delta_k^T becomes "
                      "(W^T delta_k)^T = delta_k^T W, so the batch's error goes back as delta @ W"),
    (dict(prime="none"), "the error sent back lost sigma'(z): it must pass back through the sigmoid as well as "
                         "through the weights"),
    (dict(prime="next"), "you multiplied by sigma'(z) of the wrong layer: the error sent back to acts[{i}] passes "
                         "through the sigmoid that produced acts[{i}], not through the one above it"),
    (dict(early=True), "you updated layer {up}'s weights before sending delta back through them: the error goes back "
                       "through the weights the forward pass used, so update once every gradient is computed"),
)


def _step_variant(params, x, Y, outer="right", mean="right", bias="right", back="right", prime="right", early=False):
    """The gradients of one step with one mistake (or none), from copies of ``params``: None where a shape stops it."""
    params = [(W.copy(), b.copy()) for W, b in params]
    acts = [x]
    for W, b in params:
        acts.append(mlp.sigmoid(acts[-1] @ W.T + b))
    n, a = x.shape[0], acts[-1]
    delta = (a - Y) * a * (1 - a) / {"right": n, "sum": 1, "twice": n * n}[mean]
    grads = [None] * len(params)
    try:
        for i in range(len(params) - 1, -1, -1):
            W = params[i][0]
            gW = acts[i].T @ delta if outer == "transposed" else delta.T @ acts[i]
            gb = 0 * params[i][1] if bias == "none" else delta.sum(axis=1 if bias == "neurons" else 0)
            grads[i] = (gW, gb)
            if early:
                W -= _STEP_LR * gW
            if i:
                sent = delta @ W.T if back == "WT" else delta @ W
                p = acts[i + 1] if prime == "next" else acts[i]
                delta = sent if prime == "none" else sent * p * (1 - p)
    except ValueError:  # shapes that do not fit: this mistake cannot be made on these sizes
        pass
    return grads


def _step_inputs(rng, sizes, n, dtype):
    """Weights and biases, a batch (n, n_in) and its one-hot targets, of ``dtype``."""
    params = [((rng.standard_normal((n_out, n_in)) * 2 / np.sqrt(n_in)).astype(dtype),
               rng.standard_normal(n_out).astype(dtype)) for n_in, n_out in zip(sizes, sizes[1:])]
    x = rng.random((n, sizes[0])).astype(dtype)
    Y = np.eye(sizes[-1], dtype=dtype)[rng.integers(0, sizes[-1], n)]
    return params, x, Y


def _on_foreign_step(fn, params, x, Y) -> dict:
    """``fn`` run on :data:`FOREIGN_XP` with copies of the arrays: what it raised, or its loss, the weights after the
    step and the array operations it made."""
    d_params = [(XPArray(W.copy()), XPArray(b.copy())) for W, b in params]
    _OPS[0] = 0
    try:
        loss = fn(FOREIGN_XP, d_params, XPArray(x.copy()), XPArray(Y.copy()), _STEP_LR)
    except Exception as e:  # noqa: BLE001 - the student's code: what it raised is judged by the check
        return {"raised": type(e).__name__, "message": str(e)}
    if isinstance(loss, XPArray) and loss.a.ndim == 0:
        loss = loss.a[()]
    return {"ops": _OPS[0], "loss": float(loss) if isinstance(loss, numbers.Real) else type(loss).__name__,
            "params": [[p.a if isinstance(p, XPArray) else None for p in layer] for layer in d_params]}


@recorded
def batch_step(fn) -> None:
    """Exercise (lab 04): ``fn(xp, params, x, Y, lr) -> loss``, one SGD step of the mean quadratic cost on a batch
    (one sample per row, sigmoid layers) on the array module ``xp``, updating ``params`` in place. Checked with
    xp = numpy against :func:`labkit.kernels.offload.batch_step` on five networks and batches (all sizes 4, all
    different, one layer and one sample, [784, 100, 10] with 16 samples in float32, one drawn afresh), relative 1e-7
    (1e-4 in float32); then on an array module that is not NumPy, at two batch sizes, whose operations must not grow
    with the batch (no loop over the samples)."""
    ex = "batch step on xp"
    student, fn = fn, capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(44))
    drawn = ([int(v) for v in rng.integers(2, 9, int(rng.integers(2, 5)))], int(rng.integers(2, 12)), np.float64)
    for sizes, n, dtype in each_case((*_STEP_CASES, drawn), more=2):  # then twice on another array module
        params, x, Y = _step_inputs(rng, sizes, n, dtype)
        where = f"sizes {sizes}, a batch of {n} ({np.dtype(dtype)})"
        kept, data = list(params), (x.copy(), Y.copy())
        before = [a.copy() for layer in params for a in layer]
        loss = call(ex, fn, np, params, x, Y, _STEP_LR, where=where)
        if not (np.array_equal(x, data[0]) and np.array_equal(Y, data[1])):
            fail(ex, f"{where}: your function changed x or Y", "compute new arrays from x and Y; change only params")
        same = len(params) == len(kept) and all(p is q for p, q in zip(params, kept))
        _judge_step(ex, where, loss, [a for layer in kept for a in layer] if same else None, before, x, Y, dtype)
    sizes, dtype = _STEP_CASES[1][0], np.float64  # once more, on an array module that is not NumPy, at two batch sizes
    runs = {}
    for n in each_case((2, 8)):
        params, x, Y = _step_inputs(np.random.default_rng(capture.seed(45) + n), sizes, n, dtype)
        seen = capture.step("foreign xp", lambda p=params, x=x, Y=Y: _on_foreign_step(student, p, x, Y),
                            key=capture.digest((params, x, Y), {}))
        where = f"sizes {sizes}, a batch of {n} ({np.dtype(dtype)})"
        why = _foreign_raised(ex, where, seen)
        got = [a for layer in seen["params"] for a in layer]
        if any(a is None for a in got):
            fail(ex, f"{where}, with xp an array module that is not NumPy: your function put arrays into params that are "
                 f"not xp's; {why}")
        _judge_step(ex, f"{where}, with xp an array module that is not NumPy", seen["loss"], got,
                    [a for layer in params for a in layer], x, Y, dtype)
        runs[n] = seen["ops"]
    if runs[8] > runs[2]:
        fail(ex, f"sizes {sizes}: your function made {runs[2]} array operations for a batch of 2 and {runs[8]} for a "
             "batch of 8: a loop over the samples. The point of the batch is one matrix product per layer for all of "
             "them: a loop launches B small kernels where one large one would do", "")
    passed(ex, len(_STEP_CASES) + 3)


def _judge_step(ex, where, loss, after, before, x, Y, dtype) -> None:
    """The loss, then each layer's update from the output back: the first wrong one and the mistake it matches."""
    start = [(before[2 * i], before[2 * i + 1]) for i in range(len(before) // 2)]
    want_loss = offload.batch_step(np, [(W.copy(), b.copy()) for W, b in start], x, Y, _STEP_LR)
    if isinstance(loss, np.ndarray) and loss.ndim == 0:
        loss = loss[()]
    if not isinstance(loss, numbers.Real) or isinstance(loss, bool):
        fail(ex, f"{where}: expected the batch's mean cost before the step, a number; got {type(loss).__name__}"
             + (f" {loss!r}"[:80] if isinstance(loss, str) else ""))
    if not np.isclose(loss, want_loss, rtol=1e-4 if dtype == np.float32 else 1e-7, atol=0):
        ratio, n = loss / want_loss, x.shape[0]
        fail(ex, f"{where}: your loss is {loss:.6g}, expected {want_loss:.6g}"
             + (": twice it; a sample's cost is 1/2 |a - y|^2" if np.isclose(ratio, 2) else "")
             + (f": {n} times it; the cost is the mean over the batch, not the sum" if n > 1 and np.isclose(ratio, n)
                else ""))
    if after is None:
        fail(ex, f"{where}: you replaced the entries of params with new arrays: the caller's weights stay as they were. "
             "Update the arrays themselves, in place (W -= lr * dW), so the weights stay on the device")
    if all(np.array_equal(a, b) for a, b in zip(after, before)):
        fail(ex, f"{where}: the weights did not change: W = W - lr * dW makes a new array and leaves the caller's as it "
             "was; update in place (W -= lr * dW)")
    L, want = len(start), _step_variant(start, x, Y)
    got = [((start[i][0] - after[2 * i]) / _STEP_LR, (start[i][1] - after[2 * i + 1]) / _STEP_LR) for i in range(L)]
    for i in range(L - 1, -1, -1):
        layer = f"{where}, layer {i} " + ("(the output layer)" if i == L - 1 else "(counting from 0 at the input)")
        for k, part in enumerate(("W", "b")):
            g = np.asarray(got[i][k], dtype=float)
            if _close(g, want[i][k], dtype):
                continue
            for kw, why in _STEP_MISTAKES:
                wrong = _step_variant(start, x, Y, **kw)[i]
                if wrong is not None and np.shape(wrong[k]) == g.shape and not _close(wrong[k], want[i][k], dtype) \
                        and _close(g, wrong[k], dtype):
                    fail(ex, f"{layer}, d{part}: {why.format(i=i + 1, up=i + 1)}")
            err = float(np.abs(g - want[i][k]).max())
            fail(ex, f"{layer}: the step changed {part} by lr times a gradient that differs from the reference by up to "
                 f"{err:.3g}" + (", and the layers above it are right" if i < L - 1 else ""))


EXERCISES = (
    Exercise("device_backward", "04",
             references=("labkit.kernels.offload:backward", "labkit.mlp:backprop_one", "labkit.mlp:_sample_backward"),
             hints=(
                 "Go from the last layer to the first. Layer i's weights Ws[i] take acts[i] (n_in values) to the layer's "
                 "output (n_out values); nabla_W for layer i has the shape of Ws[i], (n_out, n_in).",
                 "nabla_W is the outer product of two column vectors: the layer's error delta (n_out, 1) and the "
                 "activation that went into the layer. Which order of the two gives (n_out, n_in)?",
                 "To send delta back through layer i, multiply it by the transpose of Ws[i]: (n_in, n_out) times "
                 "(n_out, 1) gives one value per input of the layer.",
                 "The error arriving at acts[i] must also pass back through the sigmoid that made acts[i]: multiply it, "
                 "entry by entry, by that sigmoid's derivative, which you can compute from its output a as a (1 - a).",
                 "Layer 0 needs no error sent back (its input is the data). Write the products with xp.dot or @, and "
                 "make any new array with xp, so the same lines run on CuPy arrays.",
             )),
    Exercise("batch_step", "04",
             references=("labkit.kernels.offload:batch_step", "labkit.mlp:loss_and_grads",
                         "labkit.mlp:loss_and_grads_unchecked", "labkit.mlp:backprop", "labkit.mlp:layer_backward"),
             hints=(
                 "Stack the batch: row k of acts[i] is sample k's activation a_k^T, row k of delta its error delta_k^T. "
                 "The forward pass is then one product per layer for every sample: Z = A_in W^T + b, A = sigmoid(Z).",
                 "The mean cost's gradient is the mean of the samples' gradients: (1/B) times the sum over k of "
                 "exercise 1's delta_k a_k^T. Write that sum of B outer products as one product of delta and acts[i]: "
                 "which one must be transposed to give (n_out, n_in)?",
                 "The bias gradient is the sum of the samples' delta_k: a sum over the batch's axis. Put the 1/B in "
                 "once, in the output layer's delta, and every layer below inherits it.",
                 "Sending the error back: sample k needs W^T delta_k, a column; as a row that is delta_k^T W, so the "
                 "whole batch goes back as one product of delta and W. Then multiply by a (1 - a) of acts[i].",
                 "Update only when every layer's gradients are computed (the error goes back through the weights the "
                 "forward pass used), and in place: W -= lr * dW changes the caller's array, W = W - ... does not.",
             )),
    Exercise("offload_time", "04", references=("labkit.kernels.offload:offload_time",), hints=(
        "List what crosses the link in one offloaded W^T delta: which arrays go to the device, which comes back. "
        "With resident=True, which of them is there already?",
        "Each copy pays costs['copy'] once, plus its bytes over costs['bandwidth']. A float32 is 4 bytes: count the "
        "floats of each array you copy from n_out and n_in.",
        "The kernel pays costs['launch'] once, plus its flops over costs['throughput']. It multiplies each entry of W by "
        "an entry of delta and adds the product to a sum.",
        "The phases run one after another: add their times. Then look at your sum: which terms grow with n_out x n_in "
        "(n^2 for a square layer), and which only with n_out + n_in?",
    )),
    Exercise("offload_crossover", "04", references=("labkit.kernels.offload:offload_crossover",), hints=(
        "Each row of a table is one repetition, each column one width. Reduce the repetitions of each width to one "
        "typical time that a single fluke, too slow or too fast, cannot move: the median over axis 0.",
        "The offloaded time of a repetition is its copy time plus its kernel time. Offloading wins at a width where its "
        "typical time is strictly below the host's: a boolean array, one entry per width.",
        "A win followed by a loss at a wider width is noise. The crossover is the first width of the unbroken run of "
        "wins that reaches the widest width: walk back from the widest width while offloading wins.",
        "If offloading loses at the widest width there is no such run: return None. If it wins everywhere, the run "
        "starts at widths[0]. Return the width, not its index.",
    )),
    Exercise("stream_time", "04", references=("labkit.kernels.streams:stream_time",), hints=(
        "No single formula fits batches whose times differ: simulate. Walk the batches in order and keep two times for "
        "each, when its copy ends and when its kernel ends. The clock starts at 0; return the last kernel's end.",
        "Whatever waits for several things starts at the latest of them: a max. The copy of batch i waits for the copy "
        "engine, which is free once the copy of batch i - 1 has ended; it then ends copy[i] later.",
        "The kernel of batch i waits for two things: its own data (the end of its batch's copy) and the compute unit "
        "(the end of the previous batch's kernel). It then ends kernel[i] later.",
        "The copy also waits for its buffer to be free. One stream runs everything in order: each copy waits for the "
        "previous batch's kernel. With two streams and two buffers the last reader of batch i's buffer is batch i - 2.",
        "Before the first batch nothing has ended: count a missing earlier end as 0. Test by hand: 8 batches with "
        "copy = kernel = 1 take 16 on one stream and 9 on two.",
    )),
)
