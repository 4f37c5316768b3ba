extern "C" __global__ void softmax_rows(const float* x, float* y, int rows, int cols)
{
    __shared__ float s[256];
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    int t = threadIdx.x;
    float m = xr[0];
    for (int c = t; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
    s[t] = m;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (t < h) s[t] = fmaxf(s[t], s[t + h]);
        __syncthreads();
    }
    m = s[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = t; c < cols; c += blockDim.x) sum += expf(xr[c] - m);
    s[t] = sum;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (t < h) s[t] += s[t + h];
        __syncthreads();
    }
    sum = s[0];
    for (int c = t; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / sum;
}
