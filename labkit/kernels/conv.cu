// Fused Conv2d + ReLU, stride 1, zero padding `pad`, NCHW float32 (labkit/kernels/conv.py launches them).
//   x (N, C, H, W), w (K, C, R, S), b (K,), y = relu(conv(x, w) + b) of shape (N, K, OH, OW),
//   OH = H + 2 pad - R + 1, OW = W + 2 pad - S + 1.
// The backward kernels take the forward output y and apply the ReLU mask (y > 0) on the fly, so the
// masked gradient dz = dy [y > 0] is never stored.
#ifndef CONV_THREADS
#define CONV_THREADS 256
#endif

// One thread per output element.
extern "C" __global__ void conv2d_relu_forward(const float* __restrict__ x, const float* __restrict__ w,
                                               const float* __restrict__ b, float* __restrict__ y,
                                               int N, int C, int H, int W, int K, int R, int S, int pad)
{
    const int OH = H + 2 * pad - R + 1, OW = W + 2 * pad - S + 1;
    long long total = (long long)N * K * OH * OW;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total; idx += (long long)gridDim.x * blockDim.x) {
        int ow = idx % OW, oh = (idx / OW) % OH, k = (idx / ((long long)OW * OH)) % K, n = idx / ((long long)OW * OH * K);
        float acc = b[k];
        for (int c = 0; c < C; ++c)
            for (int r = 0; r < R; ++r) {
                int ih = oh - pad + r;
                if (ih < 0 || ih >= H) continue;
                for (int s = 0; s < S; ++s) {
                    int iw = ow - pad + s;
                    if (iw < 0 || iw >= W) continue;
                    acc += x[(((long long)n * C + c) * H + ih) * W + iw] * w[(((long long)k * C + c) * R + r) * S + s];
                }
            }
        y[idx] = acc > 0.0f ? acc : 0.0f;
    }
}

// dx: one thread per input element, gathering from every output position it contributed to.
extern "C" __global__ void conv2d_relu_backward_input(const float* __restrict__ dy, const float* __restrict__ y,
                                                      const float* __restrict__ w, float* __restrict__ dx,
                                                      int N, int C, int H, int W, int K, int R, int S, int pad)
{
    const int OH = H + 2 * pad - R + 1, OW = W + 2 * pad - S + 1;
    long long total = (long long)N * C * H * W;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total; idx += (long long)gridDim.x * blockDim.x) {
        int iw = idx % W, ih = (idx / W) % H, c = (idx / ((long long)W * H)) % C, n = idx / ((long long)W * H * C);
        float acc = 0.0f;
        for (int k = 0; k < K; ++k)
            for (int r = 0; r < R; ++r) {
                int oh = ih + pad - r;
                if (oh < 0 || oh >= OH) continue;
                for (int s = 0; s < S; ++s) {
                    int ow = iw + pad - s;
                    if (ow < 0 || ow >= OW) continue;
                    long long o = (((long long)n * K + k) * OH + oh) * OW + ow;
                    if (y[o] > 0.0f) acc += dy[o] * w[(((long long)k * C + c) * R + r) * S + s];
                }
            }
        dx[idx] = acc;
    }
}

// Tree-sum over the block; thread 0 gets the result.
__device__ float conv_block_sum(float* s, float v)
{
    int t = threadIdx.x;
    s[t] = v;
    __syncthreads();
    for (int half = CONV_THREADS / 2; half > 0; half /= 2) {
        if (t < half) s[t] += s[t + half];
        __syncthreads();
    }
    return s[0];
}

// dw: one block per weight (k, c, r, s), its threads sharing the sum over n, oh, ow.
// grid (K*C*R*S), block (CONV_THREADS)
extern "C" __global__ void conv2d_relu_backward_weight(const float* __restrict__ dy, const float* __restrict__ y,
                                                       const float* __restrict__ x, float* __restrict__ dw,
                                                       int N, int C, int H, int W, int K, int R, int S, int pad)
{
    __shared__ float sbuf[CONV_THREADS];
    const int OH = H + 2 * pad - R + 1, OW = W + 2 * pad - S + 1;
    int q = blockIdx.x;
    int s = q % S, r = (q / S) % R, c = (q / (S * R)) % C, k = q / (S * R * C);
    long long total = (long long)N * OH * OW;
    float acc = 0.0f;
    for (long long m = threadIdx.x; m < total; m += CONV_THREADS) {
        int ow = m % OW, oh = (m / OW) % OH, n = m / ((long long)OW * OH);
        int ih = oh - pad + r, iw = ow - pad + s;
        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
        long long o = (((long long)n * K + k) * OH + oh) * OW + ow;
        if (y[o] > 0.0f) acc += dy[o] * x[(((long long)n * C + c) * H + ih) * W + iw];
    }
    float sum = conv_block_sum(sbuf, acc);
    if (threadIdx.x == 0) dw[q] = sum;
}

// db: one block per output channel k, summing the masked gradient over n, oh, ow. grid (K), block (CONV_THREADS)
extern "C" __global__ void conv2d_relu_backward_bias(const float* __restrict__ dy, const float* __restrict__ y,
                                                     float* __restrict__ db, int N, int K, int OH, int OW)
{
    __shared__ float sbuf[CONV_THREADS];
    int k = blockIdx.x;
    long long total = (long long)N * OH * OW;
    float acc = 0.0f;
    for (long long m = threadIdx.x; m < total; m += CONV_THREADS) {
        int p = m % ((long long)OH * OW), n = m / ((long long)OH * OW);
        long long o = ((long long)n * K + k) * OH * OW + p;
        if (y[o] > 0.0f) acc += dy[o];
    }
    float sum = conv_block_sum(sbuf, acc);
    if (threadIdx.x == 0) db[k] = sum;
}
