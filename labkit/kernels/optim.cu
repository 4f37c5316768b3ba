// SGD with momentum, in place, as labkit.mlp.SGD: v = mu v - lr (g + l2 w); w += v.
// With mu = 0 this is w -= lr (g + l2 w), and v is only written.
extern "C" __global__ void sgd_momentum(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ v,
                                        int n, float lr, float mu, float l2)
{
    for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x) {
        float step = mu * v[k] - lr * (g[k] + l2 * w[k]);
        v[k] = step;
        w[k] += step;
    }
}
