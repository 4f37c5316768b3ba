// The pieces of a dense layer's forward and backward pass (labkit/kernels/layers.py launches them).
// Activations: 0 = identity, 1 = sigmoid, 2 = ReLU. All arrays float32, row-major.

__device__ __forceinline__ float activate(float z, int act)
{
    if (act == 1) return 1.0f / (1.0f + expf(-z));
    if (act == 2) return z > 0.0f ? z : 0.0f;
    return z;
}

// The derivative from the activation's output a: sigmoid' = a (1 - a), ReLU' = [a > 0].
__device__ __forceinline__ float activate_prime(float a, int act)
{
    if (act == 1) return a * (1.0f - a);
    if (act == 2) return a > 0.0f ? 1.0f : 0.0f;
    return 1.0f;
}

// out = W^T delta for one sample: W (n_out, n_in), delta (n_out,), out (n_in,).
// One thread per input neuron; neighbouring threads read neighbouring W entries (coalesced).
extern "C" __global__ void wt_delta(const float* __restrict__ W, const float* __restrict__ delta, float* __restrict__ out,
                                    int n_out, int n_in)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_in) return;
    float acc = 0.0f;
    for (int j = 0; j < n_out; ++j) acc += W[(long long)j * n_in + i] * __ldg(&delta[j]);
    out[i] = acc;
}

// out = beta * out + delta a^T (beta = 1 sums the per-sample gradients): delta (n_out,), a (n_in,), out (n_out, n_in).
extern "C" __global__ void outer(const float* __restrict__ delta, const float* __restrict__ a, float* __restrict__ out,
                                 int n_out, int n_in, float beta)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // column: input neuron
    int j = blockIdx.y * blockDim.y + threadIdx.y;  // row: output neuron
    if (i >= n_in || j >= n_out) return;
    long long k = (long long)j * n_in + i;
    float v = delta[j] * a[i];
    out[k] = beta == 0.0f ? v : beta * out[k] + v;
}

// Fused forward: out[r, c] = act(z[r, c] + bias[c]) for z (rows, cols). z and out may be the same array.
extern "C" __global__ void bias_act_forward(const float* z, const float* __restrict__ bias, float* out,
                                            int rows, int cols, int act)
{
    long long n = (long long)rows * cols;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < n; k += (long long)gridDim.x * blockDim.x)
        out[k] = activate(z[k] + __ldg(&bias[k % cols]), act);
}

// Backward through the activation: grad_in = grad_out * act'(a), a the forward output. May run in place.
extern "C" __global__ void act_backward(const float* grad_out, const float* __restrict__ a, float* grad_in,
                                        int n, int act)
{
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x)
        grad_in[k] = grad_out[k] * activate_prime(a[k], act);
}

// Column sums: out[c] = sum_r x[r, c] (the bias gradient: delta summed over the batch).
// One thread per column; at each row the threads of a warp read consecutive floats.
extern "C" __global__ void col_sum(const float* __restrict__ x, float* __restrict__ out, int rows, int cols)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r) acc += x[(long long)r * cols + c];
    out[c] = acc;
}
