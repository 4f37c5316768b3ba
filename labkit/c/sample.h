/* What every version of labkit's C backprop shares, and what the OpenMP exercise builds on: compiled in front of
 * backprop.c and of the student's code (labkit.openmp.with_helpers).
 *
 * add_sample(...) runs one sample of network.py's backprop ([n_in, n_hid, n_out], sigmoid layers, quadratic cost):
 * forward, backward, and the sample's gradients ADDED into gW1, gb1, gW2, gb2; `work` holds 2 n_hid floats; it
 * returns the sample's cost 0.5 ||a - y||^2. add_sample_plain is the same without `omp simd`. */

#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

static void zero_grads(int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    memset(gW1, 0, sizeof(float) * (size_t)n_hid * n_in);
    memset(gb1, 0, sizeof(float) * (size_t)n_hid);
    memset(gW2, 0, sizeof(float) * (size_t)n_out * n_hid);
    memset(gb2, 0, sizeof(float) * (size_t)n_out);
}

/* One sample of the fused version: forward and backward, the gradients added into gW1.. (the accumulators).
 * SIMD is a compile-time switch so bp_fused and bp_simd share this code. */
#define SAMPLE_BODY(SIMD_REDUCE, SIMD)                                                                           \
    for (int i = 0; i < n_hid; ++i) {              /* bias, dot product and sigmoid in one pass */            \
        const float* w = W1 + (size_t)i * n_in;                                                                  \
        float acc = 0.0f;                                                                                        \
        SIMD_REDUCE                                                                                              \
        for (int j = 0; j < n_in; ++j) acc += w[j] * xs[j];                                                      \
        a1[i] = sigmoid(acc + b1[i]);                                                                            \
        d1[i] = 0.0f;                                                                                            \
    }                                                                                                            \
    for (int k = 0; k < n_out; ++k) {                                                                            \
        const float* w = W2 + (size_t)k * n_hid;                                                                 \
        float acc = 0.0f;                                                                                        \
        SIMD_REDUCE                                                                                              \
        for (int i = 0; i < n_hid; ++i) acc += w[i] * a1[i];                                                     \
        const float a = sigmoid(acc + b2[k]), e = a - ys[k], dk = e * a * (1.0f - a);                            \
        cost += 0.5 * e * e;                       /* output error, its gradients, the error sent back */     \
        float* g = gW2 + (size_t)k * n_hid;                                                                      \
        SIMD                                                                                                     \
        for (int i = 0; i < n_hid; ++i) { g[i] += dk * a1[i]; d1[i] += w[i] * dk; }                             \
        gb2[k] += dk;                                                                                            \
    }                                                                                                            \
    for (int i = 0; i < n_hid; ++i) {                                                                            \
        const float di = d1[i] * a1[i] * (1.0f - a1[i]);                                                         \
        float* g = gW1 + (size_t)i * n_in;                                                                       \
        SIMD                                                                                                     \
        for (int j = 0; j < n_in; ++j) g[j] += di * xs[j];                                                       \
        gb1[i] += di;                                                                                            \
    }

#define PRAGMA(x) _Pragma(#x)


static double add_sample_plain(const float* W1, const float* b1, const float* W2, const float* b2, const float* xs,
                               const float* ys, int n_in, int n_hid, int n_out, float* work,
                               float* gW1, float* gb1, float* gW2, float* gb2)
{
    float *a1 = work, *d1 = work + n_hid;
    double cost = 0.0;
    SAMPLE_BODY(, )
    return cost;
}

/* The check's instruments (labkit.check.openmp) define these to watch the threads inside add_sample (the arrays it
 * adds into, and its work array); here they cost nothing. */
#ifndef SAMPLE_WATCH_IN
#define SAMPLE_WATCH_IN(accumulators, scratch) 0
#define SAMPLE_WATCH_OUT(slot) (void)(slot)
#endif

static double add_sample(const float* W1, const float* b1, const float* W2, const float* b2, const float* xs,
                         const float* ys, int n_in, int n_hid, int n_out, float* work,
                         float* gW1, float* gb1, float* gW2, float* gb2)
{
    const int labkit_slot = SAMPLE_WATCH_IN(gW1, work);
    float *a1 = work, *d1 = work + n_hid;
    double cost = 0.0;
    SAMPLE_BODY(PRAGMA(omp simd reduction(+ : acc)), PRAGMA(omp simd))
    SAMPLE_WATCH_OUT(labkit_slot);
    return cost;
}
