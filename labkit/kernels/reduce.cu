// Reductions to one number: each block sums its share in a shared-memory tree, and one thread per
// block adds the block's result to the total with atomicAdd (the course's global-error reduction).
// Launch with REDUCE_THREADS threads per block; *out must be zeroed first.
#ifndef REDUCE_THREADS
#define REDUCE_THREADS 256
#endif

// Tree-sum the block's values in s[]; thread 0 gets the result. Every thread of the block must call it.
__device__ float block_sum(float* s, float v)
{
    int t = threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (int half = REDUCE_THREADS / 2; half > 0; half /= 2) {
        if (t < half) s[t] += s[t + half];
        __syncthreads();
    }
    return s[0];
}

// *out += sum(x)
extern "C" __global__ void sum_reduce(const float* __restrict__ x, float* __restrict__ out, int n)
{
    __shared__ float s[REDUCE_THREADS];
    float v = 0.0f;
    for (int k = blockIdx.x * REDUCE_THREADS + threadIdx.x; k < n; k += gridDim.x * REDUCE_THREADS) v += x[k];
    float total = block_sum(s, v);
    if (threadIdx.x == 0) atomicAdd(out, total);
}

// *out += sum(x), each warp summing its 32 lanes' values with shuffles (no shared memory), one atomicAdd per warp.
// Launch with a multiple of 32 threads per block.
extern "C" __global__ void warp_sum(const float* __restrict__ x, float* __restrict__ out, int n)
{
    float v = 0.0f;
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) v += x[k];
    for (int offset = warpSize / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffff, v, offset);
    if ((threadIdx.x & (warpSize - 1)) == 0) atomicAdd(out, v);
}

// *out += sum((a - b)^2): the squared error of outputs a against targets b.
extern "C" __global__ void sse_reduce(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int n)
{
    __shared__ float s[REDUCE_THREADS];
    float v = 0.0f;
    for (int k = blockIdx.x * REDUCE_THREADS + threadIdx.x; k < n; k += gridDim.x * REDUCE_THREADS) {
        float d = a[k] - b[k];
        v += d * d;
    }
    float total = block_sum(s, v);
    if (threadIdx.x == 0) atomicAdd(out, total);
}

// *correct += the number of rows of scores (rows, cols) whose arg-max equals the label.
extern "C" __global__ void accuracy_count(const float* __restrict__ scores, const int* __restrict__ labels,
                                          int* __restrict__ correct, int rows, int cols)
{
    __shared__ int s[REDUCE_THREADS];
    int t = threadIdx.x;
    int hits = 0;
    for (int r = blockIdx.x * REDUCE_THREADS + t; r < rows; r += gridDim.x * REDUCE_THREADS) {
        const float* z = scores + (long long)r * cols;
        int best = 0;
        for (int c = 1; c < cols; ++c)
            if (z[c] > z[best]) best = c;
        hits += best == labels[r];
    }
    s[t] = hits;
    __syncthreads();
    for (int half = REDUCE_THREADS / 2; half > 0; half /= 2) {
        if (t < half) s[t] += s[t + half];
        __syncthreads();
    }
    if (t == 0) atomicAdd(correct, s[0]);
}
