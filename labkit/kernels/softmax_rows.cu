// Softmax of each row of x (rows, cols), one block of SOFTMAX_THREADS threads per row (grid = rows): labkit's answer
// to lab 05's exercise 6 (labkit.check.row_softmax), which the lab runs while a student's kernel is not written.
// The threads of a block stride over the row's columns; a shared-memory tree gives the row's max, then its sum of
// exps. Subtracting the max keeps every exponent at most 0, so expf never overflows, whatever the scores.
#ifndef SOFTMAX_THREADS
#define SOFTMAX_THREADS 256
#endif

// The block's max (is_max) or sum of v, returned to every thread. Every thread of the block must call it.
__device__ float softmax_block_reduce(float* s, float v, bool is_max)
{
    int t = threadIdx.x;
    __syncthreads();  // the previous reduction's result may still be read from s[0]
    s[t] = v;
    __syncthreads();
    for (int half = SOFTMAX_THREADS / 2; half > 0; half /= 2) {
        if (t < half) s[t] = is_max ? fmaxf(s[t], s[t + half]) : s[t] + s[t + half];
        __syncthreads();
    }
    return s[0];
}

// y[r][c] = exp(x[r][c] - max_r) / sum_c exp(x[r][c] - max_r), row-major float32.
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float s[SOFTMAX_THREADS];
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    float m = -3.402823466e38f;  // -FLT_MAX, which a GPU's compiler knows only from a header
    for (int c = threadIdx.x; c < cols; c += SOFTMAX_THREADS) m = fmaxf(m, xr[c]);
    m = softmax_block_reduce(s, m, true);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += SOFTMAX_THREADS) sum += expf(xr[c] - m);
    float inv = 1.0f / softmax_block_reduce(s, sum, false);
    for (int c = threadIdx.x; c < cols; c += SOFTMAX_THREADS) yr[c] = expf(xr[c] - m) * inv;
}
