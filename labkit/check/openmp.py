"""Checks of the C exercises (lab 03): the student's C is compiled with the sanitizers and run in a child process
first (an access out of bounds is a message with the line, never a crashed notebook), then built optimised and run
many times at 1 to 2x-cores threads against the NumPy reference, which names a race or a missing reduction."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from .. import hostc, mlp, openmp
from ..bench import interleaved, measure
from ..machine import usable_cores
from ..native.csource import matching_bracket, strip_comments
from . import capture
from .common import ExerciseError, each_case, fail, passed, recorded
from .exercises import Exercise
from .kernels import KERNEL_TODO

# the loop order of the formula g_ij = sum_s d_si x_sj: the inner loop strides through memory and is a dependent sum
NAIVE_OUTER = r"""
void outer_acc(const float* d, const float* x, float* g, int B, int n_out, int n_in)
{
    for (int i = 0; i < n_out; ++i)
        for (int j = 0; j < n_in; ++j)
            for (int s = 0; s < B; ++s) g[(size_t)i * n_in + j] += d[(size_t)s * n_out + i] * x[(size_t)s * n_in + j];
}
"""


def _compile(ex: str, source: str, name: str, helpers: bool, label: str, **options):
    if not isinstance(source, str):
        fail(ex, f"expected the C source as a string, got {type(source).__name__}")
    if KERNEL_TODO in source:
        raise ExerciseError(f"{ex}: not written yet (the function still says {KERNEL_TODO})\nHint: write the code in "
                            "place of the comment, run the cell, then run this check again")
    text = openmp.with_helpers(source, "yours.c") if helpers else source

    def compile_():
        try:
            module = hostc.CModule(text, "yours.c", **options)
        except hostc.CompilerMissing as e:
            raise ExerciseError(f"{ex}: {e}") from None
        except hostc.CCompileError as e:
            fail(ex, f"your code does not compile:\n{e}", "the first error is usually the one to fix; the line numbers "
                  "are lines of your source")
        if name not in module.functions:
            fail(ex, f"no function called {name!r} in your source (found {', '.join(module.functions) or 'none'})",
                  "keep the name and the signature given in the exercise")
        return module.get_function(name)

    return capture.build(label, compile_, ex)


def _call(ex: str, fn, args, hint: str, where: str = "", **kw):
    try:
        return fn(*args, **kw)
    except hostc.CError as e:
        fail(ex, f"{where}{e}", hint)
    except (TypeError, ValueError) as e:
        fail(ex, f"your function's parameters do not fit: {e}", "keep the signature given in the exercise")


def _simd_loops(code: str):
    """(pragma line, loop body) of every loop under ``#pragma omp simd`` (or ``omp for simd``, ``parallel for simd``)
    in comment-free C: the body is the braced block, or the one statement, after the loop's header."""
    for m in re.finditer(r"#\s*pragma\s+omp\s+(?:[\w\s]*\s)?simd\b[^\n]*", code):
        loop = re.compile(r"\bfor\s*\(").search(code, m.end())
        if loop is None:
            continue
        close = matching_bracket(code, loop.end() - 1, "(", ")")
        rest = code[close + 1:]
        start = len(rest) - len(rest.lstrip())
        if rest[start:start + 1] == "{":
            end = matching_bracket(rest, start, "{", "}")
            body = rest[start:end + 1]
        else:
            body = rest[start:rest.find(";", start) + 1]
        yield m.group(0), body


def _simd_races(code: str) -> list[str]:
    """The variables a simd loop sums into (``v += ...`` or ``v = v + ...``) that are declared outside the loop and
    not named in a reduction clause of its pragma: every vector lane adds into the one variable at once."""
    races = []
    for pragma, body in _simd_loops(code):
        reduced = set()
        for clause in re.findall(r"reduction\s*\(\s*[^:]*:([^)]*)\)", pragma):
            reduced |= {v.strip().split("[")[0] for v in clause.split(",")}
        declared = set(re.findall(r"\b(?:float|double|int|long)\s+(\w+)\s*[=;]", body))
        sums = re.findall(r"(?<![\w\].>])(\w+)\s*[+\-]=", body) + re.findall(r"(?<![\w\].>])(\w+)\s*=\s*\1\s*[+\-]", body)
        races += [v for v in dict.fromkeys(sums) if v not in reduced and v not in declared]
    return races


_DECL = r"\b(?:float|double|int|long|short|char|unsigned|size_t|ptrdiff_t|int64_t|int32_t|uint64_t|uint32_t|bool)\b"
_LOOP_HEAD = re.compile(r"(for|while|if|switch)\s*\(")
_OMP = re.compile(r"#\s*pragma\s+omp\s+([^\n]*)")


def _statement_end(code: str, pos: int) -> int:
    """Where the statement that starts at ``pos`` (after spaces and pragma lines) ends, in comment-free C."""
    n = len(code)
    while pos < n and code[pos].isspace():
        pos += 1
    if pos >= n:
        return n
    if code[pos] == "#":
        line_end = code.find("\n", pos)
        return n if line_end < 0 else _statement_end(code, line_end)
    if code[pos] == "{":
        return matching_bracket(code, pos, "{", "}") + 1
    m = _LOOP_HEAD.match(code, pos)
    if m:
        end = _statement_end(code, matching_bracket(code, m.end() - 1) + 1)
        other = re.compile(r"\s*else\b").match(code, end) if m.group(1) == "if" else None
        return _statement_end(code, other.end()) if other else end
    depth = 0
    for j in range(pos, n):
        if code[j] in "([{":
            depth += 1
        elif code[j] in ")]}":
            depth -= 1
            if depth < 0:
                return j
        elif code[j] == ";" and depth == 0:
            return j + 1
    return n


def _constructs(code: str) -> list[tuple[str, int, int]]:
    """(directive, start, end) of every #pragma omp in comment-free C: from the pragma to the end of the statement it
    applies to (a standalone directive such as barrier takes the next statement too: harmless where it is used)."""
    found = []
    for m in _OMP.finditer(code):
        try:
            found.append((m.group(1), m.start(), _statement_end(code, m.end())))
        except Exception:  # an unbalanced bracket: the compiler says what is wrong
            found.append((m.group(1), m.start(), len(code)))
    return found


def _clause_names(directive: str, kinds: str = "private|firstprivate|lastprivate|linear|reduction") -> set[str]:
    """The variables named in a directive's clauses of the ``kinds`` given (a reduction's without its operator, a
    linear's without its step, an array section by its array's name)."""
    names = set()
    for m in re.finditer(rf"\b({kinds})\s*\(", directive):
        try:
            inside = directive[m.end():matching_bracket(directive, m.end() - 1)]
        except Exception:
            continue
        if m.group(1) == "reduction":
            inside = inside.split(":", 1)[-1]
        elif m.group(1) == "linear":
            inside = inside.split(":", 1)[0]
        names |= {v.strip().split("[")[0].strip() for v in inside.split(",")}
    return names


def _private_names(directive: str, code: str, after: int) -> set[str]:
    """The variables a directive makes each thread's own: those its clauses name, and the loop variable of a loop it
    shares out (``code[after:]`` starts with that loop)."""
    names = _clause_names(directive)
    if re.search(r"\bfor\b", directive):
        loop = re.compile(r"\s*for\s*\(\s*(?:[\w\s*]*?\s)?(\w+)\s*=").match(code, after)
        if loop:
            names.add(loop.group(1))
    return names


_SUM_INTO = re.compile(r"(?<![\w.\]>*&])\b([A-Za-z_]\w*)\s*(?:[+\-*/]=(?!=)|=\s*\1\s*[+\-](?![+\-=]))")
_ONE_AT_A_TIME = re.compile(r"(?:atomic|critical|single|master|masked|ordered)\b")


def _shared_sums(code: str) -> list[tuple[str, str]]:
    """(variable, its line) for each variable declared before a parallel region that the region's threads all add
    into (``v += ...``, ``v = v + ...``) with nothing to keep them apart: no clause makes it private, it is not
    declared inside the region, and no atomic, critical, single or master construct encloses the addition."""
    constructs = _constructs(code)
    found: dict[str, str] = {}
    for directive, start, end in constructs:
        if not re.match(r"parallel\b", directive):
            continue
        for m in _SUM_INTO.finditer(code, start, end):
            v, pos = m.group(1), m.start(1)
            if v in found or code[pos - 1:pos] == "#":
                continue
            if any(s <= pos < e and _ONE_AT_A_TIME.match(d) for d, s, e in constructs):
                continue
            private = set()
            for d, s, e in constructs:
                if s <= pos < e:
                    private |= _private_names(d, code, code.find("\n", s) + 1 if "\n" in code[s:e] else e)
            declared = re.compile(rf"{_DECL}[^;{{}}]*?\b{v}\b\s*[=;,\[)]")
            if v in private or declared.search(code, start, pos) or not declared.search(code, 0, start):
                continue
            line = code[code.rfind("\n", 0, pos) + 1:code.find("\n", pos) if "\n" in code[pos:] else len(code)]
            found[v] = " ".join(line.split())
    return list(found.items())


def _shared_sum_fail(ex: str, code: str, hint: str) -> None:
    """Fail code whose threads add into one shared variable unprotected (named by the code: the race loses an update
    only now and then, so a run may well come out right)."""
    races = _shared_sums(code)
    if races:
        v, line = races[0]
        fail(ex, f"a race on {v}: {v} is declared before the parallel region, so the whole team shares it, and every "
                 f"thread adds into it ({line}) with no reduction, atomic or critical to keep the additions apart. Two "
                 "threads adding at the same moment lose one of the two additions, only now and then, so a run may "
                 "still come out right", hint.format(v=v))


def _function_body(code: str, name: str) -> tuple[list[str], str] | None:
    """(parameter names, body text) of the function ``name`` defined in comment-free C, or None."""
    decl = next((d for d in hostc.find_functions(code) if d.name == name), None)
    for m in re.finditer(rf"\b{name}\s*\(", code) if decl else ():
        close = matching_bracket(code, m.end() - 1)
        opening = re.compile(r"\s*\{").match(code, close + 1)
        if opening:
            start = opening.end() - 1
            return [p.name for p in decl.params], code[start + 1:matching_bracket(code, start, "{", "}")]
    return None


def _passes(code: str, name: str) -> int:
    """How many loops at the top of the function ``name`` write or read its fourth parameter (the layer's output)."""
    try:
        found = _function_body(code, name)
    except Exception:
        return 0
    if not found or len(found[0]) < 4:
        return 0
    params, body = found
    out = re.compile(rf"\b{re.escape(params[3])}\s*\[")
    pos, count = 0, 0
    while pos < len(body):
        try:
            end = _statement_end(body, pos)
        except Exception:
            return count
        statement = body[pos:end]
        if re.match(r"\s*(?:#[^\n]*\n\s*)*(?:for|while|do)\b", statement) and out.search(statement):
            count += 1
        pos = max(end, pos + 1)
    return count


def _evaluate(expr: str, known: dict[str, int]) -> int | None:
    """An integer C expression of names ``known`` (casts dropped), or None where it holds anything else."""
    expr = re.sub(r"\(\s*(?:const\s+)?(?:size_t|int|long|long long|unsigned|unsigned long|int64_t|ptrdiff_t)\s*\)", "",
                  expr).strip()
    if not expr or not re.fullmatch(r"[\w\s+\-*/()]+", expr):
        return None
    names = set(re.findall(r"[A-Za-z_]\w*", expr))
    if names - set(known) or re.search(r"\b\d+[A-Za-z_]", expr):
        return None
    try:
        value = eval(re.sub(r"/", "//", expr), {"__builtins__": {}}, dict(known))  # digits, names, + - * / only
    except Exception:
        return None
    return int(value) if isinstance(value, int) else None


def _bad_sections(code: str, name: str, sizes: tuple[int, int, int, int]) -> list[str]:
    """The array sections of a reduction clause in the function ``name`` (``my_bp_omp``'s parameters) that do not
    cover their gradient array from its first entry to its last, at the sizes (B, n_in, n_hid, n_out): each said
    with the floats it covers and the floats its array holds."""
    try:
        found = _function_body(code, name)
    except Exception:
        return []
    if not found or len(found[0]) != 14:
        return []
    params, body = found
    B, n_in, n_hid, n_out = params[6:10]
    known = dict(zip((B, n_in, n_hid, n_out), sizes))
    for decl in re.finditer(rf"(?:const\s+)?{_DECL}(?:\s+{_DECL})*\s+([^;{{}}]*);", body):
        for item in decl.group(1).split(","):
            if "=" in item and re.fullmatch(r"\s*\w+\s*=[^=].*", item, re.S):
                var, expr = item.split("=", 1)
                value = _evaluate(expr, known)
                assigned = re.findall(rf"(?<![\w.>])\b{re.escape(var.strip())}\s*(?:[-+*/%]?=(?!=)|\+\+|--)", body)
                if value is not None and len(assigned) == 1:  # set once, where declared: its value is known
                    known[var.strip()] = value
    holds = {params[10]: (sizes[2] * sizes[1], f"{n_hid} x {n_in}"), params[11]: (sizes[2], n_hid),
             params[12]: (sizes[3] * sizes[2], f"{n_out} x {n_hid}"), params[13]: (sizes[3], n_out)}
    bad = []
    for directive in _OMP.findall(body):
        if re.match(r"simd\b", directive):
            continue
        for r in re.finditer(r"\breduction\s*\(", directive):
            try:
                clause = directive[r.end():matching_bracket(directive, r.end() - 1)].split(":", 1)[-1]
            except Exception:
                continue
            for m in re.finditer(r"\b(\w+)\s*\[([^:\]]*):([^\]]*)\]", clause):
                array, start, length = m.group(1), m.group(2).strip(), m.group(3).strip()
                if array not in holds:
                    continue
                first = _evaluate(start, known) if start else 0
                floats = _evaluate(length, known) if length else None
                want, formula = holds[array]
                if first is None or floats is None or (first, floats) == (0, want):
                    continue
                bad.append(f"{m.group(0).replace(' ', '')} covers {floats:,} floats"
                           + (f" from entry {first:,}" if first else "")
                           + f", but {array} holds {formula} = {want:,}")
    return bad


@recorded
def simd_forward(source: str, name: str = "layer_forward") -> None:
    """Lab 03: ``layer_forward(W, b, x, a, n_out, n_in)`` computes a = sigmoid(W x + b) for one sample in one fused
    pass per row, its dot product vectorised with ``omp simd`` and a reduction. Checked for values (with the
    sanitizers) on awkward sizes against NumPy in float64; the pragma and its reduction are read from the source."""
    ex = "simd forward"
    source = capture.source(source)
    if isinstance(source, str) and KERNEL_TODO not in source:
        code = strip_comments(source)
        if not re.search(r"#\s*pragma\s+omp\s+(?:[\w\s]*\s)?simd\b", code):
            fail(ex, "your code has no #pragma omp simd: without it the compiler must add the products one after the "
                 "other, in the order written (reordering a float sum changes its last bits), so the loop runs on one "
                 "vector lane", "put #pragma omp simd on the line before the loop over j")
        races = _simd_races(code)
        if races:
            fail(ex, f"a race between vector lanes: the simd loop adds into {', '.join(races)} from every lane at once, "
                 "and the pragma has no reduction for it; the compiler may then give a wrong sum", "each lane needs a "
                 "partial sum of its own, added up after the loop: that is what a reduction clause on the pragma asks")
    checked = _compile(ex, source, name, helpers=True, label="checked", opt="-O1", openmp=True, checked=True)
    code = strip_comments(source) if isinstance(source, str) else ""
    rng = np.random.default_rng(capture.seed(4))
    n = 0
    for n_out, n_in in each_case(((1, 1), (5, 5), (3, 7), (30, 784), (10, 1001), (7, 33))):
        W = rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in).astype(np.float32)
        b = rng.standard_normal(n_out, dtype=np.float32)
        x = rng.random(n_in, dtype=np.float32)
        a = np.full(n_out, np.nan, np.float32)
        _call(ex, checked, (W, b, x, a, np.int32(n_out), np.int32(n_in)),
              "W holds n_out rows of n_in floats, row after row; a and b hold n_out floats, x n_in")
        z = W.astype(np.float64) @ x + b
        want = 1 / (1 + np.exp(-z))
        where = f"n_out={n_out}, n_in={n_in}"
        if np.allclose(a, want, rtol=1e-5, atol=1e-6):
            n += 1
            continue
        wrong = [(np.isnan(a).all(), "a is never written", "store each row's result in a[i]"),
                 (np.allclose(a, z, rtol=1e-4, atol=1e-5), "a holds z = W x + b: the sigmoid is missing",
                  "each row's sum goes through the sigmoid before it is stored: sigmoid(float) is compiled in front "
                  "of your code"),
                 (np.allclose(a, 1 / (1 + np.exp(-(W.astype(np.float64) @ x))), rtol=1e-5, atol=1e-6),
                  "the bias b is missing", "start each row's sum at b[i], or add it before the sigmoid"),
                 (n_out == n_in and np.allclose(a, 1 / (1 + np.exp(-(W.T.astype(np.float64) @ x + b))), rtol=1e-5,
                                                atol=1e-6),
                  "W is read by columns: you computed sigmoid(W^T x + b)", "W is stored row after row: W[i][j] and "
                  "W[i][j + 1] are neighbours, and W[i + 1][j] is a whole row of n_in floats further on")]
        for found, what, hint in wrong:
            if found:
                fail(ex, f"{where}: {what}", hint)
        k = int(np.argmax(~np.isclose(a, want, rtol=1e-5, atol=1e-6)))
        fail(ex, f"{where}: a[{k}] is {a[k]:.6g} (yours) but should be {want[k]:.6g} (spec)")  # the steps: no cause named
    passes = _passes(code, name) if isinstance(source, str) else 0
    if passes > 1:
        fail(ex, f"the values are right, but your {name} walks the output a in {passes} loops one after the other: a "
                 "second pass reads back every value the first one stored, where the exercise asks for one pass per "
                 "row", "a second loop over a is what fusing removes: each row's sum is still in a register when its "
                 "loop ends, so what the second loop does to a[i] can be done there, before a[i] is stored once")
    passed(ex, n + 1)


def _access_counts(source: str, name: str) -> dict | None:
    """cachegrind's counts of one call of the naive order, the row order and the student's (None without Valgrind)."""
    found = {k: openmp.outer_counts(src, n) for k, src, n in (("naive", NAIVE_OUTER, "outer_acc"),
                                                              ("rows", openmp.ROW_OUTER, "outer_acc"),
                                                              ("yours", source, name))}
    return None if None in found.values() else found


def _judge_counts(ex: str, counts: dict, times: tuple[float, float]) -> None:
    """Pass a loop order whose memory instructions are within 1.5x the row order's; print the counts, then the time."""
    mine, rows, naive = (counts[k]["Dr"] + counts[k]["Dw"] for k in ("yours", "rows", "naive"))
    misses = {k: counts[k]["D1mr"] + counts[k]["D1mw"] for k in counts}
    print(f"one call on 32 samples into g (100 x 784), counted by cachegrind (exact, the same in every run): memory "
          f"instructions: naive order {naive:,}, yours {mine:,}, the row order {rows:,}; first-level cache misses "
          f"{misses['naive']:,}, {misses['yours']:,} and {misses['rows']:,}. Timed beside it (medians, this machine "
          f"as busy as it is): naive {times[0] * 1e3:.2f} ms, yours {times[1] * 1e3:.2f} ms")
    if mine > 1.5 * rows:
        fail(ex, f"your loop order runs {mine / rows:.1f}x the memory instructions of the row order ({mine:,} against "
                 f"{rows:,}; the naive order's {naive:,}): its inner loop does not walk along a row, so the compiler "
                 "cannot load and store 4 to 8 neighbouring floats with one instruction",
             "make j (along a row of g and of x) the inner loop; the other two may come in either order")


def _innermost_bound(source: str) -> str | None:
    """The size the source's innermost for loop runs to ("n_in", "n_out" or "B"), or None where it cannot tell."""
    code = strip_comments(source) if isinstance(source, str) else ""
    innermost = None
    for m in re.finditer(r"\bfor\s*\(", code):
        close = matching_bracket(code, m.end() - 1, "(", ")")
        if close < 0:
            return None
        header, rest = code[m.end():close], code[close + 1:]
        body = rest[:matching_bracket(rest, rest.index("{"), "{", "}") + 1] if rest.lstrip().startswith("{") else \
            rest.split(";", 1)[0]
        if not re.search(r"\bfor\s*\(", body):
            innermost = header
    parts = innermost.split(";") if innermost else []
    bounds = [b for b in ("n_in", "n_out", "B") if len(parts) == 3 and re.search(rf"\b{b}\b", parts[1])]
    return bounds[0] if len(bounds) == 1 else None


@recorded
def loop_interchange(source: str, name: str = "outer_acc", repeat: int = 7) -> None:
    """Lab 03: ``outer_acc(d, x, g, B, n_out, n_in)`` adds sum_s d_s x_s^T into g (n_out, n_in), with loops in an order
    whose inner loop walks along a row. Checked for values (with the sanitizers) and for speed against the naive order."""
    ex = "loop interchange"
    source = capture.source(source)
    checked = _compile(ex, source, name, helpers=False, label="checked", opt="-O1", checked=True)
    rng = np.random.default_rng(capture.seed(0))
    n = 0
    for B, n_out, n_in in each_case(((1, 1, 1), (3, 5, 7), (10, 30, 784)), more=1):  # then its speed
        d, x = rng.standard_normal((B, n_out), dtype=np.float32), rng.standard_normal((B, n_in), dtype=np.float32)
        g0 = rng.standard_normal((n_out, n_in), dtype=np.float32)
        g = g0.copy()
        _call(ex, checked, (d, x, g, np.int32(B), np.int32(n_out), np.int32(n_in)),
              "the loops run i < n_out, j < n_in, s < B; g is n_out rows of n_in")
        want = g0 + d.T @ x
        if np.allclose(g, g0 + 0 * want) and B:
            fail(ex, f"B={B}, n_out={n_out}, n_in={n_in}: g is unchanged", "add into g: g[i][j] += d[s][i] * x[s][j]")
        if not np.allclose(g, want, rtol=1e-4, atol=1e-4):
            bad = np.argwhere(~np.isclose(g, want, rtol=1e-4, atol=1e-4))[0]
            what = f"B={B}, n_out={n_out}, n_in={n_in}: g[{bad[0]}][{bad[1]}] is {g[tuple(bad)]:.5g}, expected " \
                   f"{want[tuple(bad)]:.5g}"
            if np.allclose(g, np.outer(d[-1], x[-1]), rtol=1e-4, atol=1e-4):
                fail(ex, f"{what}: g holds the last sample's product alone, so each sample overwrote g",
                     "g arrives holding a sum already, and every sample adds its product to it: store into g "
                     "nothing that drops what was there")
            fail(ex, what)  # no cause named: the derivation's next step
        n += 1
    # timed at -O3: -O2's cheap vectoriser leaves the row loop scalar, and the two orders then differ by 0.95-2.2x from
    # round to round; at -O3 the row order measured 3.5-6.8x faster in every round, the formula's order 1.0x
    yours = _compile(ex, source, name, helpers=False, label="O3", opt="-O3")
    # the verdict: cachegrind's exact count of memory instructions, the same in every run however busy the machine;
    # without Valgrind, the loop the source puts innermost, and the time
    counts = capture.step("counts", lambda: _access_counts(source, name))
    attempts = 1 if counts else 3

    def timed():  # the student's process measures; the grader reads the two medians
        naive = hostc.load(NAIVE_OUTER, opt="-O3").get_function("outer_acc")
        mine = getattr(yours, "unrecorded", yours)  # timing calls are not recorded one by one
        B, n_out, n_in = 32, 100, 784
        d, x = rng.standard_normal((B, n_out), dtype=np.float32), rng.standard_normal((B, n_in), dtype=np.float32)
        g = np.zeros((n_out, n_in), np.float32)
        args = (d, x, g, np.int32(B), np.int32(n_out), np.int32(n_in))
        best = None
        for _attempt in range(attempts):  # a busy moment (a neighbour's vector work on the other core) can slow the
            # row order alone for a whole measurement (seen: 0.74 ms against its usual 0.23); measured again, the best
            # kept. The naive order stays about 1.0x in every attempt, so a wrong order does not pass by luck.
            t = interleaved({k: (lambda f=f: measure(lambda: f(*args), repeat=repeat).median)
                             for k, f in (("naive", naive), ("yours", mine))}, rounds=3)
            pair = float(t["naive"].median), float(t["yours"].median)
            if best is None or pair[0] / pair[1] > best[0] / best[1]:
                best = pair
            if best[0] / best[1] >= 1.5:
                break
        return best

    t_naive, t_yours = capture.step("timing", timed)
    speedup = t_naive / t_yours
    if counts:
        _judge_counts(ex, counts, (t_naive, t_yours))
        passed(f"{ex} ({counts['yours']['Dr'] + counts['yours']['Dw']:,} memory instructions, "
               f"{speedup:.1f}x faster than the naive order)", n + 1)
        return
    print(f"naive order {t_naive * 1e3:.2f} ms, yours {t_yours * 1e3:.2f} ms: {speedup:.2f}x")
    inner = _innermost_bound(source)
    if inner in ("n_out", "B"):
        fail(ex, f"your innermost loop runs to {inner}, not along a row: each step of it jumps a whole row of "
                 f"{'g' if inner == 'n_out' else 'x'} (n_in floats) ahead, so no two of its accesses share a cache "
                 "line and the compiler cannot load 8 floats at once", "make j (along a row of g and of x) the inner "
                 "loop; the other two may come in either order")
    if speedup < 1.5:  # clearly faster
        fail(ex, f"your loop order is not clearly faster than the naive one ({speedup:.2f}x; at least 1.5x expected)",
             "make j (along a row of g and of x) the inner loop, and keep d[s][i] and the row pointers in local "
             "variables outside it, so the compiler can vectorise the inner loop")
    passed(f"{ex} ({speedup:.1f}x faster than the naive order)", n + 1)


def _reduced(code: str) -> set[str]:
    """The variables named in the reduction clauses (between threads: a simd loop's aside) of comment-free C."""
    names = set()
    for directive, _, _ in _constructs(code):
        if not re.match(r"simd\b", directive):
            names |= _clause_names(directive, "reduction")
    return names


BATCH = 601  # the samples of omp_reduction's runs


@recorded
def omp_reduction(source: str, name: str = "my_bp_omp", runs: int = 6) -> None:
    """Lab 03: ``my_bp_omp`` (the signature of labkit's bp_* functions) parallelises network.py's per-sample backprop
    over the samples with OpenMP, combining the gradients without a race. Run with the sanitizers first, then at 1 to
    2x-cores threads, ``runs`` times each, against the NumPy reference."""
    ex = "OpenMP reduction"
    source = capture.source(source)
    if isinstance(source, str) and KERNEL_TODO not in source and "#pragma omp" not in source:
        fail(ex, "your code has no OpenMP directive", "parallelise the loop over the samples with #pragma omp parallel "
              "(and omp for), and combine the gradients with a reduction")
    checked = _compile(ex, source, name, helpers=True, label="checked", opt="-O1", openmp=True, checked=True)
    fast = _compile(ex, source, name, helpers=True, label="O2", opt="-O2", openmp=True)
    code = strip_comments(source) if isinstance(source, str) else ""
    _shared_sum_fail(ex, code, "a variable declared before the region is the team's one copy. Which of yours do all "
                     "the threads add into? Each thread needs a sum of its own, added up once at the end: the "
                     "reduction clause does that for every variable it names")
    rng = np.random.default_rng(capture.seed(1))
    params = mlp.init_params([784, 30, 10], seed=3)
    # enough samples per thread that a race loses updates in some run: at 37, one CI run in about ten saw none; at
    # 151, a run with three test workers on 2 cores saw none (each thread's share fitted in one time slice, so the
    # threads took turns); BATCH lasts several slices
    B = BATCH
    x = rng.random((B, 784), dtype=np.float32)
    Y = mlp.targets(rng.integers(0, 10, B), 10, np.float32)
    loss, grads = mlp.loss_and_grads_per_sample(params, x, Y)
    want = [g * B for pair in grads for g in pair]
    (W1, b1), (W2, b2) = params

    sections = _bad_sections(code, name, (B, 784, 30, 10))
    hint, where = ("every index must stay inside its array: is each thread's work array 2 * n_hid floats, and is "
                   "every array your code writes as long as what it writes into it?"), ""
    if sections:  # the private copies a reduction makes are its sections: too short a one, add_sample writes past it
        hint = ("OpenMP gives each thread a private copy of exactly the section the clause names, and adds it back "
                "into those entries only: each section must run over its whole array, from its first entry to its "
                "last. How many floats do gW1, gb1, gW2 and gb2 hold?")
        where = f"your reduction's array section {sections[0]}: "

    def call(fn, threads):
        out = [np.full_like(w, np.nan) for w in want]  # nothing carried over: the function must zero or overwrite
        cost = _call(ex, fn, (W1, b1, W2, b2, x, Y, np.int32(B), np.int32(784), np.int32(30), np.int32(10), *out),
                     hint, where, threads=threads)
        return cost, out

    call(checked, 2)  # an access out of bounds or undefined behaviour stops here, with the line
    if sections:
        fail(ex, f"{where}the sums outside it are not combined", hint)
    threads = capture.step("threads", lambda: sorted({1, 2, usable_cores(), 2 * usable_cores()}))
    seen = _watch(ex, source, name, (W1, b1, W2, b2, x, Y), threads, race="give every thread accumulators of its "
                  "own, added up once at the end: a reduction clause on the parallel region that names every gradient "
                  "array, each as an array section as long as the array")
    n = 2
    for p in each_case(threads):
        results = [call(fast, p) for _ in range(runs)]
        n += runs
        wrong = [i for i, (c, out) in enumerate(results)
                 if not (np.isclose(c, loss * B, rtol=1e-4) and all(np.allclose(o, w, rtol=1e-3, atol=1e-5)
                                                                   for o, w in zip(out, want)))]
        if not wrong:
            continue
        first = results[0][1][0].ravel()
        differ = any(not np.array_equal(first, out[0].ravel()) for _, out in results[1:])
        ratio = float(np.sum(results[wrong[0]][1][0]) / np.sum(want[0])) if np.sum(want[0]) else float("nan")
        where = f"with {p} thread{'s' if p > 1 else ''}, {len(wrong)} of {runs} runs gave a wrong gradient or cost"
        if p == 1:
            fail(ex, f"{where} even with one thread")  # no cause named: the derivation's next step
        found = _function_body(code, name) if code else None
        sums = (found[0][10:14] if found and len(found[0]) == 14 else []) + re.findall(r"\bcost\b", code)[:1]
        unreduced = [v for v in sums if v not in _reduced(code)]
        if differ:
            fail(ex, f"{where}, and the runs differ from each other: a race", (
                "two threads add into the same entries at the same time and lose updates: give every thread "
                f"accumulators of its own, added up once at the end, a reduction clause that names {', '.join(unreduced)}"
                if unreduced else "two threads write the same memory at the same time and lose updates, though your "
                "reduction names every gradient array and the cost: which other array or variable do all your threads "
                "write into?"))
        if unreduced:
            fail(ex, f"{where} (the first layer's gradient sums to {ratio:.2f} of the reference): your reduction "
                     f"clause leaves out {', '.join(unreduced)}",
                 "what a reduction clause does not name is not combined: each thread's share of it is lost or "
                 "added over the others'. Name every gradient array, as a section as long as the array, and the cost")
        fail(ex, f"{where} (the first layer's gradient sums to {ratio:.2f} of the reference)")  # the steps
    _not_one_at_a_time(ex, seen, "omp critical (or atomic, ordered, a lock) around each sample's work lets one "
                       "thread in at a time. Let every thread add into gradients of its own, and combine them once at "
                       "the end" if _takes_turns(source) else "share the loop over the samples out among the threads: "
                       "#pragma omp parallel for (or omp for inside a parallel region)")
    passed(f"{ex} at {', '.join(map(str, threads))} threads", n + 1)


_TURNS = re.compile(r"#\s*pragma\s+omp\s+(?:critical|atomic|ordered)\b|\bomp_set_lock\s*\(")


def _takes_turns(source: str) -> bool:
    """Whether the source lets one thread at a time into some region (critical, atomic, ordered or a lock)."""
    return bool(_TURNS.search(strip_comments(source)))


# Compiled before sample.h in the checks' watched build: inside add_sample, how many threads were there at once, and
# whether two of them added into the same gradient arrays then, or used the same work array; and a rendezvous, which
# makes a team's threads meet there instead of hoping a busy scheduler runs them at the same moment. Once armed, the
# first thread in waits until a second is inside too, or labkit_wait_ seconds pass: code whose threads run side by side
# meets within microseconds, and code that lets one thread in at a time (critical, a lock, one thread doing every
# sample) never does.
OVERLAP = r"""#line 1 "labkit-overlap.h"
#include <sched.h>
#include <time.h>
#define WATCH_SLOTS 512
static int labkit_inside_, labkit_most_, labkit_shared_, labkit_scratch_shared_, labkit_armed_;
static const void* labkit_acc_[WATCH_SLOTS];
static const void* labkit_scratch_[WATCH_SLOTS];
static double labkit_wait_ = 2.0;
static double labkit_now_(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int labkit_in_(const void* acc, const void* scratch)
{
    const int now = __atomic_add_fetch(&labkit_inside_, 1, __ATOMIC_SEQ_CST);
    int most = __atomic_load_n(&labkit_most_, __ATOMIC_SEQ_CST), slot = -1;
    while (now > most && !__atomic_compare_exchange_n(&labkit_most_, &most, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    for (int i = 0; i < WATCH_SLOTS && slot < 0; ++i) {
        const void* none = 0;
        if (__atomic_compare_exchange_n(&labkit_acc_[i], &none, acc, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) slot = i;
    }
    if (slot >= 0) __atomic_store_n(&labkit_scratch_[slot], scratch, __ATOMIC_SEQ_CST);
    for (int i = 0; i < WATCH_SLOTS; ++i) {  /* each sees the other: both stored before they load (sequential order) */
        if (i != slot && __atomic_load_n(&labkit_acc_[i], __ATOMIC_SEQ_CST) == acc)
            __atomic_store_n(&labkit_shared_, 1, __ATOMIC_SEQ_CST);
        if (i != slot && scratch && __atomic_load_n(&labkit_scratch_[i], __ATOMIC_SEQ_CST) == scratch)
            __atomic_store_n(&labkit_scratch_shared_, 1, __ATOMIC_SEQ_CST);
    }
    if (__atomic_exchange_n(&labkit_armed_, 0, __ATOMIC_SEQ_CST)) {
        const double end = labkit_now_() + labkit_wait_;
        while (__atomic_load_n(&labkit_inside_, __ATOMIC_SEQ_CST) < 2 && labkit_now_() < end) sched_yield();
    }
    return slot;
}
static void labkit_out_(int slot)
{
    if (slot >= 0) {
        __atomic_store_n(&labkit_scratch_[slot], (const void*)0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&labkit_acc_[slot], (const void*)0, __ATOMIC_SEQ_CST);
    }
    __atomic_sub_fetch(&labkit_inside_, 1, __ATOMIC_SEQ_CST);
}
#define SAMPLE_WATCH_IN(accumulators, scratch) labkit_in_(accumulators, scratch)
#define SAMPLE_WATCH_OUT(slot) labkit_out_(slot)
/* the most threads inside at once, (times 1000) whether two of them shared gradient arrays and (times 10000) whether
   two shared a work array, since the last call; arm > 0: the next thread in waits up to arm seconds for a second one */
int labkit_watched(double arm)
{
    const int seen = __atomic_exchange_n(&labkit_most_, 0, __ATOMIC_SEQ_CST)
                     + 1000 * __atomic_exchange_n(&labkit_shared_, 0, __ATOMIC_SEQ_CST)
                     + 10000 * __atomic_exchange_n(&labkit_scratch_shared_, 0, __ATOMIC_SEQ_CST);
    if (arm > 0) { labkit_wait_ = arm; __atomic_store_n(&labkit_armed_, 1, __ATOMIC_SEQ_CST); }
    return seen;
}
"""
RENDEZVOUS_S = 2.0  # how long a thread waits inside add_sample for a second one: ample beside a busy neighbour


def _inside_at_once(ex: str, source: str, name: str, arrays, threads: list[int], runs: int) -> tuple[int, bool, bool]:
    """(the most threads inside labkit's add_sample at the same moment, whether two of them added into the same
    gradient arrays then, whether two of them used the same work array then) over ``runs`` calls at each of
    ``threads``, the student's code built with :data:`OVERLAP`, whose rendezvous makes the threads of a team that run
    side by side meet there."""
    module = hostc.CModule(OVERLAP + openmp.with_helpers(source, "yours.c"), "yours.c", opt="-O2", openmp=True)
    fn, watched = module.get_function(name), module.get_function("labkit_watched")
    W1, b1, W2, b2, x, Y = arrays
    B, n_hid, n_out = len(x), len(b1), len(b2)
    most, shared, scratch = 0, False, False
    watched(np.float64(0))
    for p in threads:
        for k in range(runs):
            if k == 0:
                watched(np.float64(RENDEZVOUS_S))  # once per team size: a team that takes turns waits it out once
            out = [np.zeros_like(w) for w in (W1, b1, W2, b2)]
            _call(ex, fn, (W1, b1, W2, b2, x, Y, np.int32(B), np.int32(x.shape[1]), np.int32(n_hid), np.int32(n_out),
                           *out), "each thread needs its own work array, and every index must stay inside its array",
                  f"with {p} threads: ", threads=p)
            seen = int(watched(np.float64(0)))
            most, shared, scratch = max(most, seen % 1000), shared or seen % 10000 >= 1000, scratch or seen >= 10000
    return most, shared, scratch


def _watch(ex: str, source: str, name: str, arrays, threads: list[int], race: str) -> tuple[int, str]:
    """Fail a race (two threads inside add_sample at once, with the same work array, or adding into the same gradient
    arrays: a verdict no scheduler can flip; the latter with the hint ``race``); else (the most threads seen inside
    at once, the runs it watched)."""
    many, runs = [p for p in threads if p > 1], 2
    most, shared, scratch = capture.step("overlap", lambda: _inside_at_once(ex, source, name, arrays, many, runs))
    watched = f"{runs * len(many)} runs at {', '.join(map(str, many))} threads"
    if scratch:
        fail(ex, f"a race on the work array: in {watched}, two threads were inside add_sample at the same moment with "
                 "the same work array" + (", and adding into the same gradient arrays" if shared else "") + ". "
                 "add_sample keeps one sample's activations and errors there, so each thread overwrote the other's "
                 "halfway through a sample", "work is scratch space for one sample at a time, so each thread needs one "
                 "of its own. Where is yours allocated: before the parallel region (one array for the whole team) or "
                 "inside it (one per thread)?")
    if shared:
        fail(ex, f"a race: in {watched}, two threads were inside add_sample at the same moment, adding into the "
                 "same gradient arrays. It loses an update only when both write one entry at once, so a run may "
                 "still come out right", race)
    return most, watched


def _not_one_at_a_time(ex: str, seen: tuple[int, str], alone: str) -> None:
    """Fail samples run one at a time: never two threads inside add_sample, though the check waited for a second."""
    most, watched = seen
    if most <= 1:
        fail(ex, f"in {watched} no two threads were ever inside add_sample at the same time, though the check held "
                 f"the first one there for {RENDEZVOUS_S:g} s to wait for a second: the samples ran one at a time",
             alone)


# Compiled between sample.h and the student's code in the reduction-by-hand check. The memory their malloc returns is
# NaN bytes: malloc's memory holds whatever was there (zeros on a fresh page, an earlier call's sums when reused), so a
# block never zeroed is wrong every time here, not only now and then. Every allocation of theirs is kept with its line
# until it is freed (labkit_leaked), and add_sample notes the size of the team it ran in (labkit_team).
DIRTY_MALLOC = r"""#line 1 "labkit-check.h"
#define TRACKED_MAX 8192
static struct { void* p; int line; } labkit_live_[TRACKED_MAX];
static int labkit_live_lock_, labkit_team_most_, labkit_team_least_ = 1 << 30;
static void labkit_note_(void* p, void* gone, int line)
{
    while (__atomic_test_and_set(&labkit_live_lock_, __ATOMIC_ACQUIRE)) {}
    for (int i = 0; gone && i < TRACKED_MAX; ++i)
        if (labkit_live_[i].p == gone) { labkit_live_[i].p = 0; break; }
    for (int i = 0; p && i < TRACKED_MAX; ++i)
        if (!labkit_live_[i].p) { labkit_live_[i].p = p; labkit_live_[i].line = line; break; }
    __atomic_clear(&labkit_live_lock_, __ATOMIC_RELEASE);
}
int labkit_leaked(int* lines, int room)
{
    int n = 0;
    for (int i = 0; i < TRACKED_MAX; ++i)
        if (labkit_live_[i].p) { if (n < room) lines[n] = labkit_live_[i].line; ++n; labkit_live_[i].p = 0; }
    return n;
}
int labkit_team(int* least)
{
    const int most = labkit_team_most_;
    *least = labkit_team_most_ ? labkit_team_least_ : 0;
    labkit_team_most_ = 0;
    labkit_team_least_ = 1 << 30;
    return most;
}
__attribute__((unused)) static void* labkit_dirty_malloc(size_t n, int line)
{ void* p = malloc(n); if (p) memset(p, 0xff, n); labkit_note_(p, 0, line); return p; }
__attribute__((unused)) static void* labkit_dirty_aligned_alloc(size_t a, size_t n, int line)
{ void* p = aligned_alloc(a, n); if (p) memset(p, 0xff, n); labkit_note_(p, 0, line); return p; }
__attribute__((unused)) static void* labkit_calloc(size_t k, size_t n, int line)
{ void* p = calloc(k, n); labkit_note_(p, 0, line); return p; }
__attribute__((unused)) static void* labkit_realloc(void* q, size_t n, int line)
{ void* p = realloc(q, n); if (p || !n) labkit_note_(p, q, line); return p; }
__attribute__((unused)) static void labkit_free(void* p) { labkit_note_(0, p, 0); free(p); }
__attribute__((unused)) static double labkit_sample(const float* W1, const float* b1, const float* W2, const float* b2,
    const float* xs, const float* ys, int n_in, int n_hid, int n_out, float* work, float* gW1, float* gb1, float* gW2,
    float* gb2)
{
    const int team = omp_get_num_threads();
    int most = __atomic_load_n(&labkit_team_most_, __ATOMIC_RELAXED);
    while (team > most && !__atomic_compare_exchange_n(&labkit_team_most_, &most, team, 1, __ATOMIC_RELAXED,
                                                       __ATOMIC_RELAXED)) {}
    int least = __atomic_load_n(&labkit_team_least_, __ATOMIC_RELAXED);
    while (team < least && !__atomic_compare_exchange_n(&labkit_team_least_, &least, team, 1, __ATOMIC_RELAXED,
                                                        __ATOMIC_RELAXED)) {}
    return add_sample(W1, b1, W2, b2, xs, ys, n_in, n_hid, n_out, work, gW1, gb1, gW2, gb2);
}
#define malloc(n) labkit_dirty_malloc(n, __LINE__)
#define aligned_alloc(a, n) labkit_dirty_aligned_alloc(a, n, __LINE__)
#define calloc(k, n) labkit_calloc(k, n, __LINE__)
#define realloc(q, n) labkit_realloc(q, n, __LINE__)
#define free(p) labkit_free(p)
#define add_sample(...) labkit_sample(__VA_ARGS__)
#line 1 "yours.c"
"""
# Appended after the student's code: their function called where no parallel region may be active (as inside
# another region, once nesting is used up). A region in it then gets one thread, while omp_get_max_threads() still
# says the run's count.
NESTED = r"""
#line 1 "labkit-check-nested.c"
double labkit_nested(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                     int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    const int levels = omp_get_max_active_levels();
    omp_set_max_active_levels(0);
    const double cost = NAME(W1, b1, W2, b2, x, y, B, n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    omp_set_max_active_levels(levels);
    return cost;
}
"""
LARGE_TEAM = 100  # above the 8, 16 or 64 threads a buffer of fixed size is made for
# what a reduction by hand may not use: OpenMP's own reduction (a simd loop's is allowed: it is not between threads)
# and anything that lets one thread at a time add into a shared sum
_BUILT_IN = ((re.compile(r"#\s*pragma\s+omp\s+(?!simd\b)[^\n]*\breduction\s*\("), "a reduction clause"),
             (re.compile(r"#\s*pragma\s+omp\s+atomic\b"), "omp atomic"),
             (re.compile(r"#\s*pragma\s+omp\s+critical\b"), "omp critical"),
             (re.compile(r"#\s*pragma\s+omp\s+(?:[\w\s]*\s)?ordered\b"), "omp ordered"),
             (re.compile(r"\bomp_(?:init|set|unset|test|destroy)_(?:nest_)?lock\s*\(|\bomp_(?:nest_)?lock_t\b"),
              "an OpenMP lock"))
_WORKSHARED_LOOP = re.compile(r"#\s*pragma\s+omp\s+(?:parallel\s+)?for\b")
_COST_RACE = re.compile(r"(?<![\w.\]>])cost\s*(?:\+=|=\s*cost\s*\+)\s*add_sample\s*\(")
_SAMPLES_NOWAIT = re.compile(r"#\s*pragma\s+omp\s+for\b[^\n]*\bnowait\b[^#]*\badd_sample\s*\(")  # no barrier
_COST_DECLARED = re.compile(r"\bdouble\b[^;(){}]*\bcost\b")
_SAMPLES_SHARED = re.compile(r"#\s*pragma\s+omp\s+(?:parallel\s+)?for\b[^#]*\badd_sample\s*\(")


def _cost_race(code: str) -> bool:
    """Whether the samples' costs are added into the function's one shared ``cost`` (declared once: no private
    ``cost`` of a thread's own shadows it), a race that loses an update only now and then."""
    return bool(_COST_RACE.search(code)) and len(_COST_DECLARED.findall(code)) <= 1



def _teams_and_leaks(fast, run, counts: list[int]) -> list[list]:
    """[threads asked, the largest and the smallest team add_sample ran in, the lines of the allocations left] for
    one call at each of ``counts`` threads: the counters DIRTY_MALLOC compiles in, read after each call."""
    module = getattr(fast, "unrecorded", fast).module
    team, leaked = module.get_function("labkit_team"), module.get_function("labkit_leaked")
    least, lines = np.zeros(1, np.int32), np.zeros(256, np.int32)
    team(least), leaked(lines, np.int32(len(lines)))  # what the earlier calls left
    rows = []
    for p in counts:
        run(p)
        most = int(team(least))
        left = int(leaked(lines, np.int32(len(lines))))
        rows.append([p, most, int(least[0]), [int(v) for v in lines[:min(left, len(lines))]]])
    return rows


def _team_as_asked(ex: str, rows) -> None:
    """Fail code whose samples ran in a team of another size than the threads asked for (the count ignored)."""
    asked = [p for p, most, _, _ in rows if most]  # add_sample not called: nothing to say
    ran = [f"{most}" if most == least else f"{least}-{most}" for p, most, least, _ in rows if most]
    if all(most == least == p for p, most, least, _ in rows if most):
        return
    where = (f"asked for {', '.join(map(str, asked))} threads (as any caller does: omp_set_num_threads, or "
             f"OMP_NUM_THREADS), your samples ran in teams of {', '.join(ran)}")
    if all(most == 1 for _, most, _, _ in rows if most):
        fail(ex, f"the values are right, but {where}: your code runs on one thread",
             "omp for shares out a loop only among the threads of a team: outside a #pragma omp parallel region "
             "there is a team of one. Open the team with #pragma omp parallel")
    fail(ex, f"the values are right, but {where}: your code sets the size of its team itself, and ignores the count "
             "it is asked for", "leave the team's size to the caller: num_threads(...) with a number of your own, "
         "omp_set_num_threads() or omp_get_num_procs() in your function override it")


def _freed(ex: str, rows) -> None:
    """Fail code that leaves memory allocated after a call, naming the lines of the allocations."""
    for p, _, _, lines in rows:
        if lines:
            at = ", ".join(f"{k} from line {line}" for line, k in sorted(Counter(lines).items()))
            fail(ex, f"the values are right, but after one call with {p} thread{'s' if p > 1 else ''} {len(lines)} "
                 f"allocation{'s' if len(lines) > 1 else ''} of your code {'were' if len(lines) > 1 else 'was'} never "
                 f"freed ({at}): memory not freed, lost again at every call (a training run calls this once per "
                 "batch)", "every malloc or calloc needs its free once the memory is no longer used: a thread's own "
                 "arrays before it leaves the parallel region, the shared ones after it")


def _smaller_team(ex: str, result, cost: float, asked: int, right) -> None:
    """Fail code that is wrong when its parallel region gets fewer threads than omp_get_max_threads() said."""
    c, out = result
    if np.isclose(c, cost, rtol=1e-4) and right(out):
        return
    got = "NaN in the gradients" if any(np.isnan(o).any() for o in out) else (
        "a wrong cost" if right(out) else "wrong gradients")
    fail(ex, f"{got} when the team is smaller than asked for: the check called your function as if from inside "
             "another parallel region (no more levels of teams allowed), where the region in your function gets 1 "
             f"thread while omp_get_max_threads() still says {asked}. Your code counts on every thread it asked for "
             "having run: the blocks or the costs of threads that never ran hold whatever malloc left there",
         "a parallel region may get fewer threads than asked for (inside another region, under OMP_THREAD_LIMIT or "
         "OMP_DYNAMIC): size the buffer by the team that did start, omp_get_num_threads() inside the region, or zero "
         "every block and cost before the region")


@recorded
def reduction_by_hand(source: str, name: str = "my_bp_private", runs: int = 6) -> None:
    """Lab 03: ``my_bp_private`` (``my_bp_omp``'s signature) is what ``reduction(+ : ...)`` does inside, written out:
    each thread adds its samples into a zeroed private block of one shared buffer, and after the samples the threads
    combine the blocks into gW1, gb1, gW2, gb2, split over the entries; the cost likewise. No reduction clause,
    atomic, critical, ordered or lock. Run with the sanitizers first, in a team of LARGE_TEAM threads (larger than a
    buffer of fixed size holds), then at 1 to 2x-cores threads, ``runs`` times each, and once where its region gets
    fewer threads than omp_get_max_threads() says, against the NumPy reference, with the memory malloc returns filled
    with NaN; then the team its samples ran in must be the size asked for, and all it allocated freed."""
    ex = "reduction by hand"
    source = capture.source(source)
    code = strip_comments(source) if isinstance(source, str) and KERNEL_TODO not in source else None
    if code is not None:
        if not re.search(r"#\s*pragma\s+omp\b", code):
            fail(ex, "your code has no OpenMP directive", "open a team of threads with #pragma omp parallel, and "
                 "share out the samples among them with #pragma omp for")
        used = [what for pattern, what in _BUILT_IN if pattern.search(code)]
        if used:
            fail(ex, f"your code uses {' and '.join(used)}: this exercise builds the reduction itself, so OpenMP's "
                 "reduction clause, atomic, critical, ordered and locks are out", "give every thread a block of its "
                 "own to add into, and combine the blocks after the samples, each entry by one thread")
    dirty = source
    if isinstance(source, str):
        dirty = DIRTY_MALLOC + source + (NESTED.replace("NAME", name) if code and re.search(rf"\b{name}\s*\(", code)
                                         else "")
    checked = _compile(ex, dirty, name, helpers=True, label="checked", opt="-O1", openmp=True, checked=True)
    fast = _compile(ex, dirty, name, helpers=True, label="O2", opt="-O2", openmp=True)
    rng = np.random.default_rng(capture.seed(2))
    params = mlp.init_params([784, 30, 10], seed=3)
    B = 151  # enough samples per thread that a race loses updates in some run
    x = rng.random((B, 784), dtype=np.float32)
    Y = mlp.targets(rng.integers(0, 10, B), 10, np.float32)
    loss, grads = mlp.loss_and_grads_per_sample(params, x, Y)
    want = [g * B for pair in grads for g in pair]
    names = ("gW1", "gb1", "gW2", "gb2")
    (W1, b1), (W2, b2) = params
    threads = capture.step("threads", lambda: sorted({1, 2, usable_cores(), 2 * usable_cores()}))
    print(f"{ex}: gW1..gb2 and the cost of a [784, 30, 10] network on {B} samples against NumPy, once under the "
          f"sanitizers with {LARGE_TEAM} threads, {runs} times at each of {', '.join(map(str, threads))} threads and "
          "once in a team smaller than asked for; then the size of the team your samples ran in, and the memory your "
          "code left allocated")

    def call(fn, threads, fill=np.nan, hint="thread t's block starts t whole blocks into the buffer, and the buffer must "
             "hold one block per thread of the team", where=""):
        out = [np.full_like(w, fill) for w in want]  # NaN: nothing carried over, the function must overwrite
        cost = _call(ex, fn, (W1, b1, W2, b2, x, Y, np.int32(B), np.int32(784), np.int32(30), np.int32(10), *out),
                     hint, where, threads=threads)
        return cost, out

    def right(out):
        return all(np.allclose(o, w, rtol=1e-3, atol=1e-5) for o, w in zip(out, want))

    # an access out of bounds or undefined behaviour stops here, with the line; a team larger than any fixed size
    call(checked, LARGE_TEAM, hint=f"the check ran your code with a team of {LARGE_TEAM} threads: thread t's block starts "
         "t whole blocks into the buffer, and every buffer must hold one block (and one cost) per thread of the team, "
         "however many that is. A buffer of a fixed size (blocks[8], costs[64]) or one sized by the cores overflows "
         "in a larger team", where=f"with a team of {LARGE_TEAM} threads: ")
    n = 1
    if code is not None and _cost_race(code):  # before any run: a race named by the code, not by a lost update
        fail(ex, "every thread adds its samples' cost into the one shared cost (cost += add_sample(...)): a race on "
                 "the cost, which loses an update only now and then", "sum the cost per thread, as the gradients: one "
                 "double per thread, all of them added into cost after the samples")
    if code is not None:
        _shared_sum_fail(ex, code, "keep {v} apart per thread, as the gradients: each thread's sum in a place of its "
                         "own, and all of them added into {v} by one thread once the team is done")
    seen = _watch(ex, source, name, (W1, b1, W2, b2, x, Y), threads, race="two threads add into the same block: does "
                  "every thread add only into its own block, t whole blocks into the buffer, t its omp_get_thread_num()?")
    n += 1
    for p in each_case(threads):
        results = [call(fast, p) for _ in range(runs)]
        n += runs
        wrong = [i for i, (c, out) in enumerate(results) if not (np.isclose(c, loss * B, rtol=1e-4) and right(out))]
        if wrong:
            _name_the_mistake(ex, code or "", p, runs, results, wrong, want, loss * B, names,
                              lambda p=p: call(fast, p, fill=0.0), right)
    if "labkit_nested" in (dirty if isinstance(dirty, str) else ""):
        nested = _compile(ex, dirty, "labkit_nested", helpers=True, label="O2 nested", opt="-O2", openmp=True)
        _smaller_team(ex, call(nested, threads[-1]), loss * B, threads[-1], right)
        n += 1
    rows = capture.step("team", lambda: _teams_and_leaks(fast, lambda p: call(getattr(fast, "unrecorded", fast), p),
                                                         [*threads, LARGE_TEAM]))
    _team_as_asked(ex, rows)
    _freed(ex, rows)
    _not_one_at_a_time(ex, seen, "omp single or master lets one thread do the work its block holds; put the loop over "
                       "the samples under #pragma omp for, so the threads share it out")
    n += 3
    if code is not None:
        if len(_WORKSHARED_LOOP.findall(code)) < 2:
            fail(ex, "the values are right, but your source has one loop shared out with omp for: the combine of "
                     "the blocks runs on one thread (or every thread does all of it)",
                 "the combine is a loop over the gradient entries: put it under #pragma omp for too, each entry "
                 "summed over the threads' blocks by one thread")
        n += 2
    passed(f"{ex} at {', '.join(map(str, threads))} threads", n)


def _name_the_mistake(ex, code, p, runs, results, wrong, want, cost, names, rerun_zeroed, right) -> None:
    """Fail reduction_by_hand with what the wrong runs at ``p`` threads show: NaN left in the gradients (arrays
    never written, added into, or blocks never zeroed, told apart by a run on zeroed arrays), a lost cost, every
    thread running every sample, a race, or a missing barrier before the combine."""
    c, out = results[wrong[0]]
    where = f"with {p} thread{'s' if p > 1 else ''}, {len(wrong)} of {runs} runs gave a wrong gradient or cost"
    if any(np.isnan(o).any() for o in out):
        c0, out0 = rerun_zeroed()  # the same call on gradients that arrive as zeros instead of NaN
        if right(out0):
            fail(ex, f"{where}: NaN in the gradients, which are right when gW1..gb2 arrive holding zeros: your code "
                     "adds into them", "gW1, gb1, gW2 and gb2 arrive holding anything (here NaN): the combine must "
                     "write each entry (=), or zero the arrays first")
        never = [k for k, (o, o0) in enumerate(zip(out, out0)) if np.isnan(o).all() and not o0.any()]
        if never:
            fail(ex, f"{where}: {', '.join(names[k] for k in never)} never written (still the NaN the check filled "
                     "them with): the private blocks were not combined into them",
                 "after the samples, every entry of gW1, gb1, gW2 and gb2 is the sum of that entry over the threads' "
                 "blocks: the combine writes all four arrays")
        fail(ex, f"{where}: NaN in the gradients. The check fills the memory malloc gives your code with NaN: "
                 "malloc's memory holds whatever was there before, so a block never zeroed adds onto garbage",
             "zero the blocks before the samples are added into them: calloc zeroes what it allocates, or memset")
    if right(out):
        if len({float(r[0]) for r in results}) > 1 or _cost_race(code):
            fail(ex, f"{where}: the gradients are right, but the cost changes from run to run: a race on the cost",
                 "every thread adds its samples' cost into the one shared cost and loses updates. Sum the cost per "
                 "thread, as the gradients: one double per thread, all of them added into cost after the samples")
        fail(ex, f"{where}: the gradients are right, but the cost is " + (
            "0: the threads' costs were never added into it" if c == 0 else
            f"{c / cost:.3g} of the reference: not every thread's cost was added, once"),
             "sum the cost per thread, as the gradients: one double per thread, all of them added into cost after "
             "the samples")
    if p > 1 and not _SAMPLES_SHARED.search(code):
        fail(ex, f"{where}: your loop over the samples is not under omp for, so every thread runs every sample, and "
                 "nothing makes the combine wait until all the threads have finished theirs",
             "#pragma omp for on the loop over the samples shares them out among the threads, and the end of omp for "
             "is a barrier: after it, every block is complete")
    if p == 1:
        fail(ex, f"{where} even with one thread")  # no cause named: the derivation's next step
    if _SAMPLES_NOWAIT.search(code):
        fail(ex, f"{where}: the combine starts before every thread has finished its samples",
             "nowait takes away the barrier at the end of omp for: without it a thread combines entries of blocks "
             "that other threads are still adding into. The combine must wait for all the samples")
    first = results[0][1][0].ravel()
    if any(not np.array_equal(first, o[0].ravel()) for _, o in results[1:]):
        fail(ex, f"{where}, and the runs differ from each other: a race",
             "two threads add into the same entries at the same time and lose updates: does every thread add only "
             "into its own block, thread t's t whole blocks into the buffer? And does the combine start only after the "
             "samples?")
    ratio = float(np.sum(out[0]) / np.sum(want[0])) if np.sum(want[0]) else float("nan")
    fail(ex, f"{where} (the first layer's gradient sums to {ratio:.2f} of the reference)")  # the steps


EXERCISES = (
    Exercise("simd_forward", "03", hints=(
        "Start from the maths of one row: z_i is b[i] plus the dot product of row i of W with x, and a[i] is the "
        "sigmoid of z_i. W is row-major: row i's n_in floats lie side by side. How many floats of W come before "
        "row i?",
        "One pass per row: for each row keep one running sum, started so that no separate addition of the bias is "
        "needed, add the row's products in a loop over j, and store the sigmoid of the sum right after that loop. "
        "Then a is written once per row and never read back.",
        "Vector lanes run several j at once. A smaller case: 4 lanes and n_in = 8. Lane 0 adds the products of j = 0 "
        "and 4, lane 1 those of j = 1 and 5, and so on; the 4 partial sums are added at the end. If all 4 lanes "
        "added into your one running sum instead, what would become of it? Which clause of the simd directive gives "
        "each lane a partial sum of its own, and which variable must it name?",
    )),
    Exercise("loop_interchange", "03", hints=(
        "Write down what each index walks through in memory. g (n_out, n_in), d (B, n_out) and x (B, n_in) are "
        "row-major: in each array, which index steps to the neighbouring float, and which jumps a whole row?",
        "The three loops may run in any order: every (i, j, s) adds one product into one entry of g, and additions "
        "commute. So choose the order by memory alone: which index must the innermost loop run over, so that its "
        "steps touch neighbouring floats of g and of x?",
        "A smaller case: n_out = 1, B = 2, n_in = 4, so g is one row of 4 floats. With the row index innermost, "
        "sample 0 adds d[0][0] times x's row 0 to g's row, 4 neighbouring floats, then sample 1 adds d[1][0] times "
        "x's row 1. In that inner loop, which values change from step to step, and which stay the same and could be "
        "read once, into local variables, before it starts?",
    )),
    Exercise("omp_reduction", "03", sources=(("c/backprop.c", "bp_omp_reduction"),), hints=(
        "The samples are independent: #pragma omp parallel opens a team of threads, and #pragma omp for shares the "
        "loop over s out among them. add_sample writes into its work array in the middle of every sample: where must "
        "that array be allocated so that no two threads ever write into the same one?",
        "Every thread adds into the same gW1, gb1, gW2, gb2 and cost: a race, which loses updates. A reduction "
        "clause on the parallel region gives each thread private copies, zeroed, and adds them into the originals "
        "once at the end. Which variables must it name?",
        "A smaller case: an array in a reduction clause is named as a section, name[start:length], and OpenMP copies "
        "exactly that many floats per thread. For a [4, 3, 2] network, how many floats do gW1, gb1, gW2 and gb2 "
        "hold? Write each length for any n_in, n_hid and n_out the same way.",
    )),
    Exercise("reduction_by_hand", "03", hints=(
        "What does a reduction clause do? Every thread gets private copies of the sums, zeroed, and adds into them; "
        "at the end the copies are added up into the originals. Build the copies as one buffer of p blocks, one per "
        "thread, each holding a gW1, gb1, gW2 and gb2 one after the other. Where in the buffer does thread t's block "
        "begin?",
        "p is the size of the team. OpenMP can say, before a region, how many threads the next one will get, and you "
        "can ask for exactly that many. Or, inside the region, one thread can allocate for all under #pragma omp "
        "single, after omp_get_num_threads(): the end of single is a barrier. Either way, the blocks must start at "
        "zero: does your allocation zero them?",
        "Inside the region each thread knows its number t. In the loop over the samples, shared out with omp for, "
        "give add_sample the four parts of the thread's own block, and a work array of the thread's own. Keep each "
        "thread's cost apart in the same way.",
        "The end of omp for waits for every thread: after it, every block is complete. The combine is a second loop "
        "shared out with omp for, over the entries of one block: each entry, summed over the p blocks, then has one "
        "writer, so no race. After the region, add up the p costs and free what you allocated.",
        "A smaller case: p = 2 threads and a network whose block holds 5 floats, gW1 2, gb1 1, gW2 1 and gb2 1. The "
        "buffer is 10 floats: thread 0's block is floats 0 to 4, thread 1's 5 to 9. Which two floats of the buffer "
        "add up to gW2[0], and which to gb1[0]? Write the rule for entry e of a block in the same way.",
    )),
)
