"""labkit similarity: disguised copies of real lab solutions rank above every pair of honest, independent ones.

Each lab here (01, 07, 12) has two exercises, each solved four ways as different students would (other loops, other
NumPy and MPI calls). The copiers take one honest student's notebook and disguise it: names changed, independent
statements reordered, comments and blank lines added, or all three at once. Nothing is executed: the tests read and
write files only.
"""

import csv
import json
import re
import textwrap

import nbformat
import pytest

from labkit import cli, runner
from labkit.grading import assign, prose, similarity

# ---- four honest solutions of each exercise (function bodies, as written under the handed-out header) ----------

HONEST = {
    "01_": {
        "my_backprop": [
            """
            acts = [x]
            for W, b in params:
                acts.append(mlp.sigmoid(acts[-1] @ W.T + b))
            delta = (acts[-1] - Y) * acts[-1] * (1 - acts[-1]) / x.shape[0]
            grads = [None] * len(params)
            for i in range(len(params) - 1, -1, -1):
                grads[i] = (delta.T @ acts[i], delta.sum(axis=0))
                if i:
                    delta = (delta @ params[i][0]) * acts[i] * (1 - acts[i])
            return grads
            """,
            """
            a = x
            activations = [a]
            for layer in params:
                weights, bias = layer
                z = np.dot(a, weights.T) + bias
                a = 1.0 / (1.0 + np.exp(-z))
                activations.append(a)
            n = len(x)
            out = activations.pop()
            err = (out - Y) * out * (1.0 - out) / n
            result = []
            while activations:
                prev = activations.pop()
                weights = params[len(activations)][0]
                result.insert(0, (np.matmul(err.T, prev), np.sum(err, axis=0)))
                err = np.matmul(err, weights) * prev * (1.0 - prev)
            return result
            """,
            """
            B = x.shape[0]
            grads = [(np.zeros_like(W), np.zeros_like(b)) for W, b in params]
            for sample, target in zip(x, Y):
                layer_in = [sample]
                for W, b in params:
                    layer_in.append(mlp.sigmoid(W @ layer_in[-1] + b))
                out = layer_in[-1]
                d = (out - target) * out * (1 - out)
                for k in reversed(range(len(params))):
                    gW, gb = grads[k]
                    gW += np.outer(d, layer_in[k]) / B
                    gb += d / B
                    d = params[k][0].T @ d * layer_in[k] * (1 - layer_in[k])
            return grads
            """,
            """
            outputs = []
            h = x
            for (W, b) in params:
                outputs.append(h)
                h = mlp.sigmoid(np.einsum("bi,oi->bo", h, W) + b)
            delta = my_output_error(h, Y) / len(Y)
            backward = []
            for idx in range(len(params)):
                layer = len(params) - 1 - idx
                dW, db, d_in = my_layer_backward(delta, outputs[layer], params[layer][0])
                backward.append((dW, db))
                s = outputs[layer]
                delta = d_in * s * (1 - s)
            backward.reverse()
            return backward
            """,
        ],
        "my_numerical_grad": [
            """
            G = np.zeros(W.shape)
            for idx in np.ndindex(W.shape):
                old = W[idx]
                W[idx] = old + eps
                up = f()
                W[idx] = old - eps
                down = f()
                W[idx] = old
                G[idx] = (up - down) / (2 * eps)
            return G
            """,
            """
            rows, cols = W.shape
            out = np.zeros((rows, cols))

            def at(i, j, value):
                saved = W[i, j]
                W[i, j] = value
                cost = f()
                W[i, j] = saved
                return cost

            for i in range(rows):
                for j in range(cols):
                    w0 = W[i, j]
                    out[i, j] = (at(i, j, w0 + eps) - at(i, j, w0 - eps)) / (2 * eps)
            return out
            """,
            """
            import itertools

            grad = np.zeros_like(W, dtype=float)
            for pos in itertools.product(*[range(n) for n in W.shape]):
                original = W[pos]
                values = []
                for step in (eps, -eps):
                    W[pos] = original + step
                    values.append(f())
                W[pos] = original
                grad[pos] = (values[0] - values[1]) / (2 * eps)
            return grad
            """,
            """
            base = W.copy()
            estimate = np.zeros_like(base)
            it = np.nditer(base, flags=["multi_index"])
            for _ in it:
                where = it.multi_index
                bumped = []
                for sign in (1, -1):
                    W[...] = base
                    W[where] += sign * eps
                    bumped.append(f())
                estimate[where] = (bumped[0] - bumped[1]) / eps / 2
            W[...] = base
            return estimate
            """,
        ],
    },
    "07_": {
        "my_reduce_scatter": [
            """
            combine = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[C.op_name(op)]
            p, r = comm.Get_size(), comm.Get_rank()
            out = x.copy()
            chunks = shard_bounds(out.size, p)
            for s in range(p - 1):
                send, recv = my_ring_chunks(r, s, p)
                (s_lo, s_hi), (r_lo, r_hi) = chunks[send], chunks[recv]
                incoming = np.empty(r_hi - r_lo, dtype=x.dtype)
                comm.Sendrecv(out[s_lo:s_hi], dest=(r + 1) % p, recvbuf=incoming, source=(r - 1) % p)
                combine(out[r_lo:r_hi], incoming, out=out[r_lo:r_hi])
            lo, hi = chunks[my_ring_chunks(r, p - 2, p)[1]]
            return out[lo:hi].copy()
            """,
            """
            size = comm.Get_size()
            rank = comm.Get_rank()
            buf = np.array(x, copy=True)
            bounds = shard_bounds(buf.size, size)
            nxt, prv = (rank + 1) % size, (rank - 1) % size
            for step in range(size - 1):
                send_idx = (rank - step) % size
                recv_idx = (rank - step - 1) % size
                lo, hi = bounds[send_idx]
                req = comm.Isend(np.ascontiguousarray(buf[lo:hi]), dest=nxt)
                lo, hi = bounds[recv_idx]
                tmp = np.empty(hi - lo, dtype=buf.dtype)
                comm.Recv(tmp, source=prv)
                req.Wait()
                op.Reduce_local(tmp, buf[lo:hi])
            lo, hi = bounds[(rank + 1) % size]
            return buf[lo:hi].copy()
            """,
            """
            p = comm.size
            me = comm.rank
            pieces = [piece.copy() for piece in np.array_split(x.copy(), p)]
            ops = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}
            fn = ops[C.op_name(op)]
            for k in range(1, p):
                outgoing = pieces[(me - k + 1) % p]
                target = (me - k) % p
                got = comm.sendrecv(outgoing, dest=(me + 1) % p, source=(me - 1) % p)
                pieces[target] = fn(pieces[target], got)
            return pieces[(me + 1) % p]
            """,
            """
            nranks, myrank = comm.Get_size(), comm.Get_rank()
            data = x.astype(x.dtype, copy=True)
            spans = shard_bounds(len(data), nranks)
            reducer = getattr(np, {"SUM": "add", "PROD": "multiply", "MAX": "maximum", "MIN": "minimum"}[C.op_name(op)])
            step = 0
            while step < nranks - 1:
                a0, a1 = spans[(myrank - step) % nranks]
                b0, b1 = spans[(myrank - step - 1) % nranks]
                recvd = np.zeros(b1 - b0, dtype=data.dtype)
                comm.Sendrecv(sendbuf=data[a0:a1], dest=(myrank + 1) % nranks, recvbuf=recvd, source=(myrank - 1) % nranks)
                data[b0:b1] = reducer(data[b0:b1], recvd)
                step += 1
            b0, b1 = spans[(myrank + 1) % nranks]
            return np.array(data[b0:b1])
            """,
        ],
        "my_ring_allreduce": [
            """
            combine = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[C.op_name(op)]
            p, r = comm.Get_size(), comm.Get_rank()
            out = x.copy()
            flat = out.reshape(-1)
            if p == 1 or flat.size == 0:
                return out
            chunks = shard_bounds(flat.size, p)
            right, left = (r + 1) % p, (r - 1) % p
            for s in range(p - 1):
                s_lo, s_hi = chunks[(r - s) % p]
                r_lo, r_hi = chunks[(r - s - 1) % p]
                incoming = np.empty(r_hi - r_lo, dtype=x.dtype)
                comm.Sendrecv(flat[s_lo:s_hi], dest=right, recvbuf=incoming, source=left)
                combine(flat[r_lo:r_hi], incoming, out=flat[r_lo:r_hi])
            for s in range(p - 1):
                s_lo, s_hi = chunks[(r - s + 1) % p]
                r_lo, r_hi = chunks[(r - s) % p]
                comm.Sendrecv(flat[s_lo:s_hi], dest=right, recvbuf=flat[r_lo:r_hi], source=left)
            return out
            """,
            """
            p, r = comm.Get_size(), comm.Get_rank()
            result = x.copy()
            if p == 1:
                return result
            flat = result.ravel()
            mine = my_reduce_scatter(comm, flat, op)
            bounds = shard_bounds(flat.size, p)
            lo, hi = bounds[(r + 1) % p]
            flat[lo:hi] = mine
            owned = (r + 1) % p
            for _ in range(p - 1):
                s_lo, s_hi = bounds[owned]
                incoming = (owned - 1) % p
                r_lo, r_hi = bounds[incoming]
                comm.Sendrecv(flat[s_lo:s_hi].copy(), dest=(r + 1) % p, recvbuf=flat[r_lo:r_hi], source=(r - 1) % p)
                owned = incoming
            return result
            """,
            """
            size, rank = comm.size, comm.rank
            parts = [q.copy() for q in np.array_split(np.array(x, dtype=x.dtype).ravel(), size)]
            right, left = (rank + 1) % size, (rank - 1) % size
            for k in range(size - 1):
                got = comm.sendrecv(parts[(rank - k) % size], dest=right, source=left)
                j = (rank - k - 1) % size
                op.Reduce_local(got, parts[j])
            for k in range(size - 1):
                got = comm.sendrecv(parts[(rank - k + 1) % size], dest=right, source=left)
                parts[(rank - k) % size] = got
            return np.concatenate(parts).reshape(x.shape)
            """,
            """
            n_ranks = comm.Get_size()
            me = comm.Get_rank()
            vec = np.copy(x).reshape(-1)
            if n_ranks < 2:
                return vec.reshape(x.shape)
            edges = [shard_bounds(vec.size, n_ranks)[i] for i in range(n_ranks)]
            reduce = {"MAX": np.maximum, "MIN": np.minimum, "PROD": np.multiply}.get(C.op_name(op), np.add)
            to, frm = (me + 1) % n_ranks, (me - 1) % n_ranks
            for phase in ("reduce", "gather"):
                for step in range(n_ranks - 1):
                    shift = step if phase == "reduce" else step - 1
                    lo, hi = edges[(me - shift) % n_ranks]
                    rlo, rhi = edges[(me - shift - 1) % n_ranks]
                    buf = np.empty(rhi - rlo, dtype=vec.dtype)
                    reqs = [comm.Irecv(buf, source=frm), comm.Isend(vec[lo:hi].copy(), dest=to)]
                    MPI.Request.Waitall(reqs)
                    vec[rlo:rhi] = reduce(vec[rlo:rhi], buf) if phase == "reduce" else buf
            return vec.reshape(x.shape)
            """,
        ],
    },
    "12_": {
        "karp_flatt": [
            """
            p, s = np.asarray(p, dtype=float), np.asarray(s, dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                e = (1 / s - 1 / p) / (1 - 1 / p)
            return np.where(p > 1, e, np.nan)
            """,
            """
            out = []
            for workers, speedup in zip(p, s):
                if workers == 1:
                    out.append(float("nan"))
                else:
                    out.append((1.0 / speedup - 1.0 / workers) / (1.0 - 1.0 / workers))
            return np.array(out)
            """,
            """
            p = np.array(p, dtype=np.float64)
            s = np.array(s, dtype=np.float64)
            e = np.full(p.shape, np.nan)
            mask = p != 1
            e[mask] = (1 / s[mask] - 1 / p[mask]) / (1 - 1 / p[mask])
            return e
            """,
            """
            result = np.empty(len(p))
            for i in range(len(p)):
                n = float(p[i])
                result[i] = np.nan if n == 1 else (1 / float(s[i]) - 1 / n) / (1 - 1 / n)
            return result
            """,
        ],
        "amdahl_fit": [
            """
            p, t = np.asarray(p, dtype=float), np.asarray(t, dtype=float)
            if np.unique(p).size < 2:
                raise ValueError(f"times of one worker count, p = {p.tolist()}, fix no line")
            slope, intercept = np.polyfit(1 / p, t, 1)
            t1 = intercept + slope
            return intercept / t1, t1
            """,
            """
            x = 1.0 / np.asarray(p, dtype=float)
            y = np.asarray(t, dtype=float)
            if len(set(x.tolist())) < 2:
                raise ValueError("need at least two worker counts to fit a line")
            A = np.vstack([x, np.ones_like(x)]).T
            (a, c), *_ = np.linalg.lstsq(A, y, rcond=None)
            T1 = a + c
            return c / T1, T1
            """,
            """
            inv = [1.0 / q for q in p]
            n = len(inv)
            mx, my = sum(inv) / n, sum(t) / n
            sxx = sum((u - mx) ** 2 for u in inv)
            if sxx == 0:
                raise ValueError("all rows have the same worker count")
            sxy = sum((u - mx) * (v - my) for u, v in zip(inv, t))
            b = sxy / sxx
            a = my - b * mx
            return a / (a + b), a + b
            """,
            """
            P = np.asarray(p, float)
            T = np.asarray(t, float)
            if np.ptp(P) == 0:
                raise ValueError("one worker count only: no fit")
            coeffs = np.polyfit(1.0 / P, T, deg=1)
            serial_time, parallel_time = coeffs[1], coeffs[0]
            total = serial_time + parallel_time
            return serial_time / total, total
            """,
        ],
    },
}

# ---- the same solutions with independent statements reordered (of honest students 2 and 4) ------------------

REORDERED = {
    ("01_", "my_backprop", 2): """
        result = []
        n = len(x)
        a = x
        activations = [a]
        for layer in params:
            weights, bias = layer
            z = np.dot(a, weights.T) + bias
            a = 1.0 / (1.0 + np.exp(-z))
            activations.append(a)
        out = activations.pop()
        err = (out - Y) * out * (1.0 - out) / n
        while activations:
            prev = activations.pop()
            weights = params[len(activations)][0]
            result.insert(0, (np.matmul(err.T, prev), np.sum(err, axis=0)))
            err = np.matmul(err, weights) * prev * (1.0 - prev)
        return result
        """,
    ("01_", "my_backprop", 4): """
        h = x
        outputs = []
        for (W, b) in params:
            outputs.append(h)
            h = mlp.sigmoid(np.einsum("bi,oi->bo", h, W) + b)
        backward = []
        delta = my_output_error(h, Y) / len(Y)
        for idx in range(len(params)):
            layer = len(params) - 1 - idx
            dW, db, d_in = my_layer_backward(delta, outputs[layer], params[layer][0])
            s = outputs[layer]
            backward.append((dW, db))
            delta = d_in * s * (1 - s)
        backward.reverse()
        return backward
        """,
    ("01_", "my_numerical_grad", 2): """
        def at(i, j, value):
            saved = W[i, j]
            W[i, j] = value
            cost = f()
            W[i, j] = saved
            return cost

        rows, cols = W.shape
        out = np.zeros((rows, cols))
        for i in range(rows):
            for j in range(cols):
                w0 = W[i, j]
                out[i, j] = (at(i, j, w0 + eps) - at(i, j, w0 - eps)) / (2 * eps)
        return out
        """,
    ("01_", "my_numerical_grad", 4): """
        base = W.copy()
        it = np.nditer(base, flags=["multi_index"])
        estimate = np.zeros_like(base)
        for _ in it:
            bumped = []
            where = it.multi_index
            for sign in (1, -1):
                W[...] = base
                W[where] += sign * eps
                bumped.append(f())
            estimate[where] = (bumped[0] - bumped[1]) / eps / 2
        W[...] = base
        return estimate
        """,
    ("07_", "my_reduce_scatter", 2): """
        rank = comm.Get_rank()
        size = comm.Get_size()
        buf = np.array(x, copy=True)
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        bounds = shard_bounds(buf.size, size)
        for step in range(size - 1):
            recv_idx = (rank - step - 1) % size
            send_idx = (rank - step) % size
            lo, hi = bounds[send_idx]
            req = comm.Isend(np.ascontiguousarray(buf[lo:hi]), dest=nxt)
            lo, hi = bounds[recv_idx]
            tmp = np.empty(hi - lo, dtype=buf.dtype)
            comm.Recv(tmp, source=prv)
            req.Wait()
            op.Reduce_local(tmp, buf[lo:hi])
        lo, hi = bounds[(rank + 1) % size]
        return buf[lo:hi].copy()
        """,
    ("07_", "my_reduce_scatter", 4): """
        nranks, myrank = comm.Get_size(), comm.Get_rank()
        reducer = getattr(np, {"SUM": "add", "PROD": "multiply", "MAX": "maximum", "MIN": "minimum"}[C.op_name(op)])
        data = x.astype(x.dtype, copy=True)
        spans = shard_bounds(len(data), nranks)
        step = 0
        while step < nranks - 1:
            b0, b1 = spans[(myrank - step - 1) % nranks]
            a0, a1 = spans[(myrank - step) % nranks]
            recvd = np.zeros(b1 - b0, dtype=data.dtype)
            comm.Sendrecv(sendbuf=data[a0:a1], dest=(myrank + 1) % nranks, recvbuf=recvd, source=(myrank - 1) % nranks)
            data[b0:b1] = reducer(data[b0:b1], recvd)
            step += 1
        b0, b1 = spans[(myrank + 1) % nranks]
        return np.array(data[b0:b1])
        """,
    ("07_", "my_ring_allreduce", 2): """
        p, r = comm.Get_size(), comm.Get_rank()
        result = x.copy()
        if p == 1:
            return result
        flat = result.ravel()
        bounds = shard_bounds(flat.size, p)
        mine = my_reduce_scatter(comm, flat, op)
        owned = (r + 1) % p
        lo, hi = bounds[(r + 1) % p]
        flat[lo:hi] = mine
        for _ in range(p - 1):
            incoming = (owned - 1) % p
            s_lo, s_hi = bounds[owned]
            r_lo, r_hi = bounds[incoming]
            comm.Sendrecv(flat[s_lo:s_hi].copy(), dest=(r + 1) % p, recvbuf=flat[r_lo:r_hi], source=(r - 1) % p)
            owned = incoming
        return result
        """,
    ("07_", "my_ring_allreduce", 4): """
        me = comm.Get_rank()
        n_ranks = comm.Get_size()
        vec = np.copy(x).reshape(-1)
        if n_ranks < 2:
            return vec.reshape(x.shape)
        to, frm = (me + 1) % n_ranks, (me - 1) % n_ranks
        reduce = {"MAX": np.maximum, "MIN": np.minimum, "PROD": np.multiply}.get(C.op_name(op), np.add)
        edges = [shard_bounds(vec.size, n_ranks)[i] for i in range(n_ranks)]
        for phase in ("reduce", "gather"):
            for step in range(n_ranks - 1):
                shift = step if phase == "reduce" else step - 1
                rlo, rhi = edges[(me - shift - 1) % n_ranks]
                lo, hi = edges[(me - shift) % n_ranks]
                buf = np.empty(rhi - rlo, dtype=vec.dtype)
                reqs = [comm.Irecv(buf, source=frm), comm.Isend(vec[lo:hi].copy(), dest=to)]
                MPI.Request.Waitall(reqs)
                vec[rlo:rhi] = reduce(vec[rlo:rhi], buf) if phase == "reduce" else buf
        return vec.reshape(x.shape)
        """,
    ("12_", "karp_flatt", 2): """
        out = []
        for workers, speedup in zip(p, s):
            if workers != 1:
                out.append((1.0 / speedup - 1.0 / workers) / (1.0 - 1.0 / workers))
            else:
                out.append(float("nan"))
        return np.array(out)
        """,
    ("12_", "karp_flatt", 4): """
        result = np.empty(len(p))
        for i in range(len(p)):
            n = float(p[i])
            result[i] = np.nan if n == 1 else (1 / float(s[i]) - 1 / n) / (1 - 1 / n)
        return result
        """,
    ("12_", "amdahl_fit", 2): """
        y = np.asarray(t, dtype=float)
        x = 1.0 / np.asarray(p, dtype=float)
        if len(set(x.tolist())) < 2:
            raise ValueError("need at least two worker counts to fit a line")
        A = np.vstack([x, np.ones_like(x)]).T
        (a, c), *_ = np.linalg.lstsq(A, y, rcond=None)
        T1 = a + c
        return c / T1, T1
        """,
    ("12_", "amdahl_fit", 4): """
        T = np.asarray(t, float)
        P = np.asarray(p, float)
        if np.ptp(P) == 0:
            raise ValueError("one worker count only: no fit")
        coeffs = np.polyfit(1.0 / P, T, deg=1)
        parallel_time, serial_time = coeffs[0], coeffs[1]
        total = serial_time + parallel_time
        return serial_time / total, total
        """,
}

# ---- the names a copier changes (of honest student 1 for the renamer, of student 4 for the one who does it all) ---

RENAMES = {
    ("01_", "my_backprop", 1): {"acts": "layer_outputs", "delta": "err", "grads": "gradients", "i": "layer",
                                "W": "weights", "b": "bias"},
    ("01_", "my_backprop", 4): {"outputs": "inputs", "h": "act", "delta": "d", "backward": "grads", "idx": "k",
                                "layer": "l", "dW": "gw", "db": "gb", "d_in": "back", "s": "sig"},
    ("01_", "my_numerical_grad", 1): {"G": "grad", "idx": "ix", "old": "saved", "up": "f_plus", "down": "f_minus"},
    ("01_", "my_numerical_grad", 4): {"base": "w0", "estimate": "g", "it": "iterator", "where": "ij",
                                      "bumped": "costs", "sign": "direction"},
    ("07_", "my_reduce_scatter", 1): {"combine": "reduce_fn", "out": "buf", "chunks": "bounds", "send": "si",
                                      "recv": "ri", "incoming": "tmp", "s_lo": "a", "s_hi": "b", "r_lo": "c",
                                      "r_hi": "d", "lo": "start", "hi": "stop"},
    ("07_", "my_reduce_scatter", 4): {"nranks": "P", "myrank": "R", "data": "work", "spans": "pieces",
                                      "reducer": "fn", "step": "t", "a0": "x0", "a1": "x1", "b0": "y0", "b1": "y1",
                                      "recvd": "got"},
    ("07_", "my_ring_allreduce", 1): {"combine": "apply_op", "out": "res", "flat": "v", "chunks": "ranges",
                                      "right": "nxt", "left": "prv", "incoming": "buf", "s": "step"},
    ("07_", "my_ring_allreduce", 4): {"n_ranks": "world", "me": "rank", "vec": "data", "edges": "bounds",
                                      "reduce": "op_fn", "to": "dst", "frm": "src", "phase": "stage", "shift": "off",
                                      "buf": "incoming", "reqs": "requests"},
    ("12_", "karp_flatt", 1): {"e": "metric"},
    ("12_", "karp_flatt", 4): {"result": "kf", "i": "row", "n": "workers"},
    ("12_", "amdahl_fit", 1): {"slope": "m", "intercept": "c", "t1": "T_one"},
    ("12_", "amdahl_fit", 4): {"P": "procs", "T": "times", "coeffs": "fit", "serial_time": "f_t1",
                               "parallel_time": "par_t1", "total": "T1"},
}

# student -> (the honest solution they start from, what they do to it)
COPIERS = {"renamer": (1, "rename"), "reorderer": (2, "reorder"), "commenter": (3, "comment"), "disguiser": (4, "all")}
HONEST_STUDENTS = {f"honest{i}": i for i in (1, 2, 3, 4)}
ORIGIN = {**HONEST_STUDENTS, **{s: i for s, (i, _) in COPIERS.items()}}


def _rename(code: str, names: dict[str, str]) -> str:
    """Every use of a local name replaced (not an attribute, a longer name or a keyword argument's name)."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b(?!=)")
    return pattern.sub(lambda m: names[m.group(1)], code)


def _comment(code: str) -> str:
    """Comments above every other line, a few at the ends of lines, and blank lines, as a copier pads a copy."""
    out = []
    for n, line in enumerate(code.split("\n")):
        indent = line[: len(line) - len(line.lstrip())]
        if line.strip() and n % 2 == 0:
            out.append(f"{indent}# step {n}: here we work out the next part of the answer")
        if line.strip() and n % 3 == 1 and not line.rstrip().endswith(":"):
            line += "  # see the lecture notes"
        out.append(line)
        if n % 4 == 3:
            out.append("")
    return "\n".join(out)


def body(lab: str, exercise: str, student: str) -> str:
    """The code this student wrote for this exercise (dedented)."""
    source, how = (HONEST_STUDENTS[student], None) if student in HONEST_STUDENTS else COPIERS[student]
    code = textwrap.dedent(HONEST[lab][exercise][source - 1]).strip("\n")
    if how in ("reorder", "all"):
        code = textwrap.dedent(REORDERED[(lab, exercise, source)]).strip("\n")
    if how in ("rename", "all"):
        code = _rename(code, RENAMES[(lab, exercise, source)])
    if how in ("comment", "all"):
        code = _comment(code)
    return code


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """The three labs handed out (student versions and release.json), as labkit assign writes them."""
    root = tmp_path_factory.mktemp("release")
    labs = [runner.find_notebooks(only=lab)[0] for lab in HONEST]
    assign.write_student_versions(labs, root / "handout", release_dir=root / "release")
    return root


def _solve(handout: nbformat.NotebookNode, lab: str, student: str) -> nbformat.NotebookNode:
    """The student version with this student's code in place of each exercise's stub."""
    nb = nbformat.from_dict(handout)
    for exercise in HONEST[lab]:
        cell = next(c for c in nb.cells if c.cell_type == "code" and f"def {exercise}(" in c.source
                    and assign.PY_STUB in c.source)
        stub = re.search(r"^([ \t]+)raise NotImplementedError$", cell.source, re.M)
        cell.source = (cell.source[:stub.start()] + textwrap.indent(body(lab, exercise, student), stub.group(1),
                                                                     lambda line: True) + cell.source[stub.end():])
    return nb


@pytest.fixture(scope="module")
def classroom(released):
    """submissions/<student>/<lab>.ipynb for the honest students, the copiers and two who wrote nothing."""
    subs = released / "submissions"
    for lab in HONEST:
        path = next((released / "handout").glob(f"{lab}*.ipynb"))
        handout = nbformat.read(path, as_version=4)
        for student in ORIGIN:
            (subs / student).mkdir(parents=True, exist_ok=True)
            nbformat.write(_solve(handout, lab, student), subs / student / path.name)
        (subs / "idle_a").mkdir(parents=True, exist_ok=True)
        nbformat.write(handout, subs / "idle_a" / path.name)  # the handout as it was given
        idle = nbformat.from_dict(handout)
        for cell in idle.cells:  # given code touched, but nothing of their own: every k-gram is the handout's
            if cell.cell_type == "code":
                cell.source = cell.source.replace("\n", "\n\n", 1) + "\n# I read this cell"
        (subs / "idle_b").mkdir(parents=True, exist_ok=True)
        nbformat.write(idle, subs / "idle_b" / path.name)
    return subs


def test_normalising_forgets_names_comments_blank_lines_and_magics():
    a = "%%px --local\ndef f(a, b):\n    '''Doc.'''\n    total = a + b  # sum\n\n    return np.sqrt(total)\n"
    b = "def f(x, y):\n    s = x + \\\n        y\n    return np.sqrt(s)\n!ls\n%time f(1, 2)\n"
    assert [t for t, _ in similarity.normalise(a)] == [t for t, _ in similarity.normalise(b)]
    assert "sqrt" in [t for t, _ in similarity.normalise(a)]  # the library's names stay: not the student's to choose
    broken = "def f(:\n    x = 'unterminated\n    return x ** 2  # a syntax error"
    assert [t for t, _ in similarity.normalise(broken)][:4] == ["def", "V", "(", ":"]  # the rough tokeniser
    kernel = 'SRC = r"""\nfor (int i = 0; i < n; ++i) acc += w[i] * x[i];  // mine\n"""'
    tokens = [t for t, _ in similarity.normalise(kernel)]
    assert tokens[:4] == ["V", "=", "S", "for"] and "mine" not in tokens and "++" in tokens


def test_winnowing_keeps_the_minimum_of_every_window_and_hashes_are_stable():
    hashes = [77, 74, 42, 17, 98, 50, 17, 98, 8, 88, 67, 39, 77, 74, 42, 17, 98]  # the paper's example, Figure 2
    assert [hashes[i] for i in similarity.winnow(hashes, 4)] == [17, 17, 8, 39, 17]
    assert similarity.winnow(hashes, 4, exclude={17}) == [2, 5, 8, 11, 14]
    tokens = similarity.normalise("x = [i * 2 for i in range(10) if i % 3]\n")
    assert similarity.kgram_hashes(tokens, 5)[0] == 1537214761997211079  # crc32-based: the same in every process


def test_disguised_copies_rank_above_every_unrelated_pair(classroom, released, tmp_path):
    result = similarity.run(classroom, release=released / "release", out=tmp_path / "out")
    scores = {(p.lab, frozenset((p.student_a, p.student_b))): p.score for p in result.pairs}
    related = {k: v for k, v in scores.items() if len({ORIGIN[s] for s in k[1]}) == 1}
    unrelated = {k: v for k, v in scores.items() if len({ORIGIN[s] for s in k[1]}) == 2}
    assert len(related) == 3 * 4 and len(unrelated) == 3 * (28 - 4)  # 8 students who wrote code: 28 pairs per lab
    lowest = min(related, key=related.get)
    highest = max(unrelated, key=unrelated.get)
    assert related[lowest] > unrelated[highest], (lowest, related[lowest], highest, unrelated[highest])
    ranked = [(p.lab, frozenset((p.student_a, p.student_b))) for p in result.pairs]
    assert set(ranked[:len(related)]) == set(related)
    for name in HONEST:  # the plain copies are (nearly) whole; the two who did nothing are set apart, not paired
        lab = next(n for n in result.nothing_written if n.startswith(name))
        assert result.nothing_written[lab] == ["idle_a", "idle_b"]
        assert scores[(lab, frozenset(("renamer", "honest1")))] == 1.0
        assert scores[(lab, frozenset(("commenter", "honest3")))] == 1.0
    rows = list(csv.DictReader(result.csv.open()))
    assert tuple(rows[0]) == similarity.CSV_FIELDS and len(rows) == len(scores)
    assert float(rows[0]["score"]) >= float(rows[-1]["score"]) and int(rows[0]["matched_lines_a"]) > 0
    page = result.html.read_text()
    assert "not a verdict" in page and "idle_a, idle_b" in page and "class='hit'" in page


def test_the_handout_alone_shares_nothing(classroom, released):
    record = json.loads((released / "release" / assign.RELEASE_FILE).read_text())
    found, skipped = similarity.collect(classroom, record)
    assert not skipped
    idle = [s for s in found if s.student.startswith("idle")]
    assert len(idle) == 6 and all(not s.prints for s in idle)
    a, b = (s for s in idle if s.lab.startswith("01_"))
    assert similarity.compare(a, b).score == 0.0
    for entry in record["notebooks"].values():  # the release record holds every handed-out code cell
        assert entry["given_code"] and any(assign.PY_STUB in source for source in entry["given_code"])


def test_untrusted_code_is_escaped_and_a_broken_file_is_skipped_with_a_line(released, tmp_path):
    lab = next((released / "handout").glob("12_*.ipynb"))
    handout = nbformat.read(lab, as_version=4)
    subs = tmp_path / "subs"
    for student in ("honest1", "renamer"):
        nb = _solve(handout, "12_", student)
        if student == "renamer":
            cell = next(c for c in nb.cells if "def karp_flatt(" in c.source)
            cell.source = cell.source.replace("\n    return", "\n    x = '</pre><script>alert(1)</script>'\n    return")
        (subs / student).mkdir(parents=True)
        nbformat.write(nb, subs / student / lab.name)
    (subs / "mallory").mkdir()
    (subs / "mallory" / lab.name).write_text("{ not json")
    (subs / "trudy.ipynb").write_text('{"just": "json"}')
    result = similarity.run(subs, release=released / "release", out=tmp_path / "out")
    page = result.html.read_text()
    assert "<script>" not in page and "&lt;/pre&gt;&lt;script&gt;" in page
    assert any(line.startswith(f"mallory/{lab.name}: skipped, not valid JSON") for line in result.skipped)
    assert any(line.startswith("trudy.ipynb: skipped, JSON, but not a Jupyter notebook") for line in result.skipped)
    assert "mallory" in page and "trudy.ipynb" in page
    assert [(p.student_a, p.student_b) for p in result.pairs] == [("honest1", "renamer")]


def test_without_the_handed_out_code_in_the_record_it_is_rebuilt_and_said(classroom, released, tmp_path, capsys,
                                                                         monkeypatch):
    record = json.loads((released / "release" / assign.RELEASE_FILE).read_text())
    for entry in record["notebooks"].values():
        del entry["given_code"]  # a release.json of an older labkit
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / assign.RELEASE_FILE).write_text(json.dumps(record))
    old = similarity.run(classroom, release=tmp_path / "old", out=tmp_path / "a", lab="01_")
    assert "predates given_code" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # no release/ here: the handed-out versions come from the instructor's notebooks
    none = similarity.run(classroom, out=tmp_path / "b", lab="01_")
    assert "no release record" in capsys.readouterr().err
    new = similarity.run(classroom, release=released / "release", out=tmp_path / "c", lab="01_")
    assert {p.lab for p in new.pairs} == {next(iter(new.nothing_written))}
    summary = [[(p.student_a, p.student_b, round(p.score, 6)) for p in r.pairs] for r in (old, none, new)]
    assert summary[0] == summary[1] == summary[2]


def test_the_cli_prints_the_ranking_and_writes_the_report(classroom, released, tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["similarity", str(classroom), "--release", str(released / "release"), "--out", str(out),
                     "--top", "5", "--lab", "07"]) == 0
    text = capsys.readouterr().out
    assert "07_ring_allreduce.ipynb" in text and "not a verdict" in text and str(out.resolve()) in text
    assert (out / similarity.SIMILARITY_HTML).is_file() and (out / similarity.SIMILARITY_CSV).is_file()
    assert (out / similarity.SIMILARITY_HTML).read_text().count("<h3 id='pair-") == 5
    assert cli.main(["similarity", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "no submissions folder" in capsys.readouterr().err


def test_a_class_of_forty_takes_seconds(released, tmp_path):
    """40 students x 3 labs, each student's code one of the honest solutions with a line of their own in every cell
    they wrote (so that no cell is tokenised once for several students)."""
    import random
    import time

    rng = random.Random(0)
    subs = tmp_path / "subs"
    for lab in HONEST:
        path = next((released / "handout").glob(f"{lab}*.ipynb"))
        handout = nbformat.read(path, as_version=4)
        for n in range(40):
            nb = _solve(handout, lab, f"honest{rng.randint(1, 4)}")
            for cell in nb.cells:
                if cell.cell_type == "code" and assign.PY_STUB not in cell.source and "def " in cell.source:
                    cell.source = cell.source.replace("result", f"result_{n}") + f"\n# s{n:02d} wrote this"
            (subs / f"s{n:02d}").mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, subs / f"s{n:02d}" / path.name)
    t0 = time.perf_counter()
    result = similarity.run(subs, release=released / "release", out=tmp_path / "out")
    seconds = time.perf_counter() - t0
    print(f"similarity of 40 students x 3 labs: {seconds:.2f} s")
    assert len(result.pairs) + sum(map(len, result.nothing_written.values())) > 0
    assert seconds < 10


# ---- prose: a written answer against the model answer ---------------------------------------------------------


def _longest_common(a: list, b: list) -> int:
    """The textbook dynamic programme, to hold the bit-parallel one to."""
    row = [0] * (len(b) + 1)
    for x in a:
        nxt = [0]
        for j, y in enumerate(b):
            nxt.append(row[j] + 1 if x == y else max(row[j + 1], nxt[j]))
        row = nxt
    return row[-1]


def test_words_in_order_are_the_longest_common_subsequence():
    import random

    draw = random.Random(7)
    for _ in range(300):
        a = [draw.choice("abcd") for _ in range(draw.randint(0, 70))]  # past 64 bits: big integers
        b = [draw.choice("abcd") for _ in range(draw.randint(0, 70))]
        assert prose.in_order(a, b) == _longest_common(a, b), (a, b)


MODEL = ("Each rank sends its chunk to the next rank and receives one from the previous, so after p - 1 steps every "
         "rank holds one fully reduced chunk; the allgather then passes those chunks around the ring once more.")
N = len(prose.words(MODEL))  # 38: "p - 1" is two words


@pytest.mark.parametrize("answer, share", [
    (MODEL, 1.0),
    ("  each RANK sends its chunk to the next rank, and receives one from the previous: so after p-1 steps every "
     "rank holds ONE fully reduced chunk. The allgather then passes those chunks around the ring once more!", 1.0),
    (MODEL.replace("receives", "gets"), (N - 1) / N),  # one word changed
    ("I think: " + MODEL.replace("fully ", "") + " That is why it is fast.", (N - 1) / N),  # one dropped, some added
    ("The ring sends 2(p-1) messages per rank, each of N/p elements, so its bytes stay near 2N whatever p is, while "
     "the naive allreduce sends (p-1)N from rank 0.", 0.0),  # an honest answer, on the same topic
    (MODEL[:len(MODEL) // 2], 0.0),  # half of it: not flagged
    ("", 0.0),
])
def test_a_copied_answer_holds_most_of_the_model_answers_words_in_order(answer, share):
    assert prose.copied_share(MODEL, answer) == pytest.approx(share)


def test_a_short_model_answer_is_flagged_only_when_copied_whole():
    assert prose.copied_share("Each chunk goes around twice.", "each chunk goes around... TWICE") == 1.0
    assert prose.copied_share("Each chunk goes around twice.", "Each chunk goes around once, I think.") == 0.0


def test_no_model_answer_of_the_labs_is_taken_for_a_copy_of_another():
    from labkit.grading import answers

    models = []
    for path in runner.find_notebooks():
        nb = nbformat.read(path, as_version=4)
        models += [nb.cells[i].source for i, m in answers.answer_cells(nb) if m["kind"] == "explain"]
    assert len(models) > 20
    flagged = [(a[:40], b[:40]) for a in models for b in models if a is not b and prose.copied_share(a, b)]
    assert not flagged
    assert all(prose.copied_share(m, m) == 1.0 for m in models)
