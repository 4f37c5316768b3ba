extern "C" __global__ void transpose_tiled(const float* in, float* out, int rows, int cols)
{
    __shared__ float tile[32][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int r = blockIdx.y * 32 + ty, c = blockIdx.x * 32 + tx;
    if (r < rows && c < cols) tile[ty][tx] = in[r * cols + c];
    __syncthreads();
    int orow = blockIdx.x * 32 + ty, ocol = blockIdx.y * 32 + tx;
    if (orow < cols && ocol < rows) out[orow * rows + ocol] = tile[tx][ty];
}
