// Softmax cross-entropy for logits (rows, cols) and integer labels (rows,).
// One thread per row: the rows of a classifier are short (10 classes), and there are many of them.

// probs = softmax(logits) row by row (shifted by the row maximum); loss[r] = -log probs[r, labels[r]].
extern "C" __global__ void softmax_xent_forward(const float* __restrict__ logits, const int* __restrict__ labels,
                                                float* __restrict__ probs, float* __restrict__ loss, int rows, int cols)
{
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* z = logits + (long long)r * cols;
    float* p = probs + (long long)r * cols;
    float m = z[0];
    for (int c = 1; c < cols; ++c) m = fmaxf(m, z[c]);
    float s = 0.0f;
    for (int c = 0; c < cols; ++c) {
        float e = expf(z[c] - m);
        p[c] = e;
        s += e;
    }
    float inv = 1.0f / s;
    for (int c = 0; c < cols; ++c) p[c] *= inv;
    int y = labels[r];
    loss[r] = (y >= 0 && y < cols) ? -logf(fmaxf(p[y], 1e-30f)) : __int_as_float(0x7fc00000);  // NaN for a bad label
}

// grad = scale * (probs - onehot(labels)): the gradient of the loss with respect to the logits
// (scale = 1/batch for the mean loss).
extern "C" __global__ void softmax_xent_backward(const float* __restrict__ probs, const int* __restrict__ labels,
                                                 float* __restrict__ grad, int rows, int cols, float scale)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= rows * cols) return;
    int r = k / cols, c = k % cols;
    grad[k] = scale * (probs[k] - (labels[r] == c ? 1.0f : 0.0f));
}
