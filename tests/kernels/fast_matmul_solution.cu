#define THREADS 256
#define BM 64
#define BN 64
// C = A B: A (M, K), B (K, N), C (M, N), row-major float32; M, N and K multiples of the tile.
// Launched with block (THREADS) and grid (N / BN, M / BM): a block computes a BM x BN tile of C.
extern "C" __global__ void matmul_fast(const float* A, const float* B, float* C, int M, int N, int K)
{
    // each thread keeps a 4 x 4 sub-tile of C in registers, its 4 columns BN / 4 apart
    __shared__ float As[16][BM];  // a step of 16 values of k, A's tile stored k-major
    __shared__ float Bs[16][BN];
    int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
    int i0 = blockIdx.y * BM, j0 = blockIdx.x * BN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int l = tid; l < BM * 16; l += THREADS)
            As[l % 16][l / 16] = A[(i0 + l / 16) * K + k0 + l % 16];
        for (int l = tid; l < 16 * BN; l += THREADS)
            Bs[l / BN][l % BN] = B[(k0 + l / BN) * N + j0 + l % BN];
        __syncthreads();
        for (int k = 0; k < 16; ++k) {
            float ra[4], rb[4];
            for (int a = 0; a < 4; ++a) ra[a] = As[k][tr * 4 + a];
            for (int b = 0; b < 4; ++b) rb[b] = Bs[k][tc + 16 * b];
            for (int a = 0; a < 4; ++a)
                for (int b = 0; b < 4; ++b) acc[a][b] += ra[a] * rb[b];
        }
        __syncthreads();
    }
    for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) C[(i0 + tr * 4 + a) * N + j0 + tc + 16 * b] = acc[a][b];
}
