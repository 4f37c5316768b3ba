/* network.py's backpropagation in C: a [n_in, n_hid, n_out] network of sigmoid layers and the quadratic cost,
 * one sample at a time, the gradients summed over a mini-batch (network.py's update_mini_batch sums them too).
 *
 * Every version has the same arguments:
 *   W1 (n_hid, n_in), b1 (n_hid), W2 (n_out, n_hid), b2 (n_out): the weights, row-major float32;
 *   x (B, n_in), y (B, n_out): the batch and its one-hot targets;
 *   gW1, gb1, gW2, gb2: the summed gradients, overwritten;
 * and returns the summed cost, 0.5 ||a - y||^2 over the batch.
 *
 * The single-thread versions show the optimisations of the course's C program one at a time:
 *   bp_naive        the first program: column by column through the weights (the inner loop strides by a row),
 *                   every temporary allocated per sample, one loop per formula;
 *   bp_interchanged the loops swapped so the inner loop walks along a row (row-major, contiguous);
 *   bp_hoisted      work arrays allocated once per call, loop invariants and the running sum in locals;
 *   bp_fused        loops that walk the same data fused: bias, dot product and sigmoid in one pass; the output
 *                   error, its gradients and the error sent back in another;
 *   bp_simd         bp_fused with `omp simd` on the inner loops (vectorised; needs -fopenmp or -fopenmp-simd).
 * And three OpenMP versions over the samples, combining the per-sample gradients by
 *   bp_omp_atomic    `omp atomic` on every addition into the shared gradient;
 *   bp_omp_critical  a private per-sample gradient, added to the shared one inside `omp critical`;
 *   bp_omp_reduction per-thread accumulators, summed by OpenMP at the end (`reduction(+: ...)` on array sections).
 * epoch_simd runs a whole epoch of mini-batch SGD in C (bp_simd and the update), as the course's program did.
 * Compiled after sample.h (zero_grads, add_sample). labkit.openmp calls them; tests compare every one with labkit's NumPy per-sample backprop. */

double bp_naive(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    double cost = 0.0;
    for (int s = 0; s < B; ++s) {
        const float* xs = x + (size_t)s * n_in;
        const float* ys = y + (size_t)s * n_out;
        float* a1 = malloc(sizeof(float) * n_hid);
        float* a2 = malloc(sizeof(float) * n_out);
        float* d1 = malloc(sizeof(float) * n_hid);
        float* d2 = malloc(sizeof(float) * n_out);
        for (int i = 0; i < n_hid; ++i) a1[i] = b1[i];
        for (int j = 0; j < n_in; ++j)                 /* column by column: W1[i][j] for i = 0, 1, ... */
            for (int i = 0; i < n_hid; ++i) a1[i] += W1[(size_t)i * n_in + j] * xs[j];
        for (int i = 0; i < n_hid; ++i) a1[i] = sigmoid(a1[i]);
        for (int k = 0; k < n_out; ++k) a2[k] = b2[k];
        for (int i = 0; i < n_hid; ++i)
            for (int k = 0; k < n_out; ++k) a2[k] += W2[(size_t)k * n_hid + i] * a1[i];
        for (int k = 0; k < n_out; ++k) a2[k] = sigmoid(a2[k]);
        for (int k = 0; k < n_out; ++k) cost += 0.5 * (a2[k] - ys[k]) * (a2[k] - ys[k]);
        for (int k = 0; k < n_out; ++k) d2[k] = (a2[k] - ys[k]) * a2[k] * (1.0f - a2[k]);
        for (int i = 0; i < n_hid; ++i)
            for (int k = 0; k < n_out; ++k) gW2[(size_t)k * n_hid + i] += d2[k] * a1[i];
        for (int k = 0; k < n_out; ++k) gb2[k] += d2[k];
        for (int i = 0; i < n_hid; ++i) d1[i] = 0.0f;
        for (int i = 0; i < n_hid; ++i)
            for (int k = 0; k < n_out; ++k) d1[i] += W2[(size_t)k * n_hid + i] * d2[k];
        for (int i = 0; i < n_hid; ++i) d1[i] *= a1[i] * (1.0f - a1[i]);
        for (int j = 0; j < n_in; ++j)
            for (int i = 0; i < n_hid; ++i) gW1[(size_t)i * n_in + j] += d1[i] * xs[j];
        for (int i = 0; i < n_hid; ++i) gb1[i] += d1[i];
        free(a1); free(a2); free(d1); free(d2);
    }
    return cost;
}

double bp_interchanged(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    double cost = 0.0;
    for (int s = 0; s < B; ++s) {
        const float* xs = x + (size_t)s * n_in;
        const float* ys = y + (size_t)s * n_out;
        float* a1 = malloc(sizeof(float) * n_hid);
        float* a2 = malloc(sizeof(float) * n_out);
        float* d1 = malloc(sizeof(float) * n_hid);
        float* d2 = malloc(sizeof(float) * n_out);
        for (int i = 0; i < n_hid; ++i) a1[i] = b1[i];
        for (int i = 0; i < n_hid; ++i)                /* row by row: W1[i][j] for j = 0, 1, ... is contiguous */
            for (int j = 0; j < n_in; ++j) a1[i] += W1[(size_t)i * n_in + j] * xs[j];
        for (int i = 0; i < n_hid; ++i) a1[i] = sigmoid(a1[i]);
        for (int k = 0; k < n_out; ++k) a2[k] = b2[k];
        for (int k = 0; k < n_out; ++k)
            for (int i = 0; i < n_hid; ++i) a2[k] += W2[(size_t)k * n_hid + i] * a1[i];
        for (int k = 0; k < n_out; ++k) a2[k] = sigmoid(a2[k]);
        for (int k = 0; k < n_out; ++k) cost += 0.5 * (a2[k] - ys[k]) * (a2[k] - ys[k]);
        for (int k = 0; k < n_out; ++k) d2[k] = (a2[k] - ys[k]) * a2[k] * (1.0f - a2[k]);
        for (int k = 0; k < n_out; ++k)
            for (int i = 0; i < n_hid; ++i) gW2[(size_t)k * n_hid + i] += d2[k] * a1[i];
        for (int k = 0; k < n_out; ++k) gb2[k] += d2[k];
        for (int i = 0; i < n_hid; ++i) d1[i] = 0.0f;
        for (int k = 0; k < n_out; ++k)
            for (int i = 0; i < n_hid; ++i) d1[i] += W2[(size_t)k * n_hid + i] * d2[k];
        for (int i = 0; i < n_hid; ++i) d1[i] *= a1[i] * (1.0f - a1[i]);
        for (int i = 0; i < n_hid; ++i)
            for (int j = 0; j < n_in; ++j) gW1[(size_t)i * n_in + j] += d1[i] * xs[j];
        for (int i = 0; i < n_hid; ++i) gb1[i] += d1[i];
        free(a1); free(a2); free(d1); free(d2);
    }
    return cost;
}

double bp_hoisted(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    float* work = malloc(sizeof(float) * (size_t)(2 * n_hid + 2 * n_out));  /* once per call, not per sample */
    float *a1 = work, *d1 = work + n_hid, *a2 = work + 2 * n_hid, *d2 = a2 + n_out;
    double cost = 0.0;
    for (int s = 0; s < B; ++s) {
        const float* xs = x + (size_t)s * n_in;
        const float* ys = y + (size_t)s * n_out;
        for (int i = 0; i < n_hid; ++i) {
            const float* w = W1 + (size_t)i * n_in;    /* the row, found once */
            float acc = b1[i];                         /* the running sum in a register, not in a1[i] */
            for (int j = 0; j < n_in; ++j) acc += w[j] * xs[j];
            a1[i] = acc;
        }
        for (int i = 0; i < n_hid; ++i) a1[i] = sigmoid(a1[i]);
        for (int k = 0; k < n_out; ++k) {
            const float* w = W2 + (size_t)k * n_hid;
            float acc = b2[k];
            for (int i = 0; i < n_hid; ++i) acc += w[i] * a1[i];
            a2[k] = acc;
        }
        for (int k = 0; k < n_out; ++k) a2[k] = sigmoid(a2[k]);
        for (int k = 0; k < n_out; ++k) {
            float e = a2[k] - ys[k];
            cost += 0.5 * e * e;
            d2[k] = e * a2[k] * (1.0f - a2[k]);
        }
        for (int k = 0; k < n_out; ++k) {
            float* g = gW2 + (size_t)k * n_hid;
            const float dk = d2[k];
            for (int i = 0; i < n_hid; ++i) g[i] += dk * a1[i];
            gb2[k] += dk;
        }
        for (int i = 0; i < n_hid; ++i) d1[i] = 0.0f;
        for (int k = 0; k < n_out; ++k) {
            const float* w = W2 + (size_t)k * n_hid;
            const float dk = d2[k];
            for (int i = 0; i < n_hid; ++i) d1[i] += w[i] * dk;
        }
        for (int i = 0; i < n_hid; ++i) d1[i] *= a1[i] * (1.0f - a1[i]);
        for (int i = 0; i < n_hid; ++i) {
            float* g = gW1 + (size_t)i * n_in;
            const float di = d1[i];
            for (int j = 0; j < n_in; ++j) g[j] += di * xs[j];
            gb1[i] += di;
        }
    }
    free(work);
    return cost;
}

double bp_fused(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    float* work = malloc(sizeof(float) * (size_t)(2 * n_hid));
    double cost = 0.0;
    for (int s = 0; s < B; ++s)
        cost += add_sample_plain(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, work,
                                 gW1, gb1, gW2, gb2);
    free(work);
    return cost;
}

double bp_simd(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    float* work = malloc(sizeof(float) * (size_t)(2 * n_hid));
    double cost = 0.0;
    for (int s = 0; s < B; ++s)
        cost += add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, work,
                           gW1, gb1, gW2, gb2);
    free(work);
    return cost;
}

/* The OpenMP versions' loop schedule: schedule(runtime), set here (kind 1 static, 2 dynamic, 3 guided; chunk 0 =
 * the default), so one build measures them all. */
void set_schedule(int kind, int chunk)
{
#ifdef _OPENMP
    omp_set_schedule((omp_sched_t)kind, chunk);
#else
    (void)kind; (void)chunk;
#endif
}

double bp_omp_reduction(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    const size_t nW1 = (size_t)n_hid * n_in, nW2 = (size_t)n_out * n_hid;
    double cost = 0.0;
    /* every thread sums into private copies of the four gradients; OpenMP adds them up after the loop */
    #pragma omp parallel reduction(+ : cost, gW1[:nW1], gb1[:n_hid], gW2[:nW2], gb2[:n_out])
    {
        float* work = malloc(sizeof(float) * (size_t)(2 * n_hid));
        #pragma omp for schedule(runtime)
        for (int s = 0; s < B; ++s)
            cost += add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, work,
                               gW1, gb1, gW2, gb2);
        free(work);
    }
    return cost;
}

double bp_omp_critical(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    const size_t nW1 = (size_t)n_hid * n_in, nW2 = (size_t)n_out * n_hid, n = nW1 + nW2 + (size_t)(n_hid + n_out);
    double total = 0.0;
    #pragma omp parallel
    {
        /* one sample's gradient, private to the thread, added to the shared one under a lock */
        float* mine = malloc(sizeof(float) * (n + (size_t)(2 * n_hid)));
        float *pW1 = mine, *pW2 = mine + nW1, *pb1 = pW2 + nW2, *pb2 = pb1 + n_hid, *work = pb2 + n_out;
        #pragma omp for schedule(runtime)
        for (int s = 0; s < B; ++s) {
            memset(mine, 0, sizeof(float) * n);
            const double cost = add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid,
                                           n_out, work, pW1, pb1, pW2, pb2);
            #pragma omp critical
            {
                for (size_t t = 0; t < nW1; ++t) gW1[t] += pW1[t];
                for (size_t t = 0; t < nW2; ++t) gW2[t] += pW2[t];
                for (int t = 0; t < n_hid; ++t) gb1[t] += pb1[t];
                for (int t = 0; t < n_out; ++t) gb2[t] += pb2[t];
                total += cost;
            }
        }
        free(mine);
    }
    return total;
}

double bp_omp_atomic(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    double total = 0.0;
    #pragma omp parallel
    {
        float* work = malloc(sizeof(float) * (size_t)(2 * n_hid + n_out));
        float *a1 = work, *d1 = work + n_hid, *d2 = d1 + n_hid;
        #pragma omp for schedule(runtime)
        for (int s = 0; s < B; ++s) {
            const float* xs = x + (size_t)s * n_in;
            const float* ys = y + (size_t)s * n_out;
            double cost = 0.0;
            for (int i = 0; i < n_hid; ++i) {
                const float* w = W1 + (size_t)i * n_in;
                float acc = 0.0f;
                for (int j = 0; j < n_in; ++j) acc += w[j] * xs[j];
                a1[i] = sigmoid(acc + b1[i]);
                d1[i] = 0.0f;
            }
            for (int k = 0; k < n_out; ++k) {
                const float* w = W2 + (size_t)k * n_hid;
                float acc = 0.0f;
                for (int i = 0; i < n_hid; ++i) acc += w[i] * a1[i];
                const float a = sigmoid(acc + b2[k]), e = a - ys[k];
                cost += 0.5 * e * e;
                d2[k] = e * a * (1.0f - a);
                for (int i = 0; i < n_hid; ++i) d1[i] += w[i] * d2[k];
            }
            /* every addition into the shared gradient is one atomic read-modify-write */
            for (int k = 0; k < n_out; ++k) {
                for (int i = 0; i < n_hid; ++i) {
                    #pragma omp atomic
                    gW2[(size_t)k * n_hid + i] += d2[k] * a1[i];
                }
                #pragma omp atomic
                gb2[k] += d2[k];
            }
            for (int i = 0; i < n_hid; ++i) {
                const float di = d1[i] * a1[i] * (1.0f - a1[i]);
                for (int j = 0; j < n_in; ++j) {
                    #pragma omp atomic
                    gW1[(size_t)i * n_in + j] += di * xs[j];
                }
                #pragma omp atomic
                gb1[i] += di;
            }
            #pragma omp atomic
            total += cost;
        }
        free(work);
    }
    return total;
}

/* One epoch of network.py's training entirely in C, as the course's C program ran it: mini-batches in order,
 * bp_simd's summed gradients, then the SGD step W -= (lr / B) gW in place. Returns the summed cost. */
double epoch_simd(float* W1, float* b1, float* W2, float* b2, const float* x, const float* y, int N, int n_in, int n_hid,
                  int n_out, int batch, float lr, float* gW1, float* gb1, float* gW2, float* gb2)
{
    const size_t nW1 = (size_t)n_hid * n_in, nW2 = (size_t)n_out * n_hid;
    double cost = 0.0;
    for (int lo = 0; lo < N; lo += batch) {
        const int B = N - lo < batch ? N - lo : batch;
        cost += bp_simd(W1, b1, W2, b2, x + (size_t)lo * n_in, y + (size_t)lo * n_out, B, n_in, n_hid, n_out,
                        gW1, gb1, gW2, gb2);
        const float step = lr / (float)B;
        #pragma omp simd
        for (size_t t = 0; t < nW1; ++t) W1[t] -= step * gW1[t];
        #pragma omp simd
        for (size_t t = 0; t < nW2; ++t) W2[t] -= step * gW2[t];
        for (int t = 0; t < n_hid; ++t) b1[t] -= step * gb1[t];
        for (int t = 0; t < n_out; ++t) b2[t] -= step * gb2[t];
    }
    return cost;
}
