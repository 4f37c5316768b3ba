// Matrix products C = op(A) op(B) in float32, row-major, three ways (labkit/kernels/matmul.py launches them).
//   op(A) is (M, K): A itself (M, K) when ta == 0, or the transpose of A stored as (K, M) when ta == 1.
//   op(B) is (K, N): B itself (K, N) when tb == 0, or the transpose of B stored as (N, K) when tb == 1.
// Every kernel handles sizes that are not multiples of its tile.

#define A_AT(i, k) (ta ? A[(long long)(k) * M + (i)] : A[(long long)(i) * K + (k)])
#define B_AT(k, j) (tb ? B[(long long)(j) * K + (k)] : B[(long long)(k) * N + (j)])

// 1. naive: one thread per element of C, every operand read from global memory.
//    grid (ceil(N/16), ceil(M/16)), block (16, 16)
extern "C" __global__ void matmul_naive(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                        int M, int N, int K, int ta, int tb)
{
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M || j >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A_AT(i, k) * B_AT(k, j);
    C[(long long)i * N + j] = acc;
}

// 2. tiled: a block stages TILE x TILE tiles of op(A) and op(B) in shared memory, so each value read
//    from global memory is used TILE times. grid (ceil(N/TILE), ceil(M/TILE)), block (TILE, TILE)
#ifndef TILE
#define TILE 16
#endif
extern "C" __global__ void matmul_tiled(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                                        int M, int N, int K, int ta, int tb)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];  // +1: the transposed load would otherwise hit one bank
    int ty = threadIdx.y, tx = threadIdx.x;
    int i = blockIdx.y * TILE + ty;
    int j = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (i < M && k0 + tx < K) ? A_AT(i, k0 + tx) : 0.0f;
        Bs[ty][tx] = (j < N && k0 + ty < K) ? B_AT(k0 + ty, j) : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (i < M && j < N) C[(long long)i * N + j] = acc;
}

// 3. register-blocked: a block computes a BM x BN tile of C with 256 threads; each thread keeps a
//    TM x TN sub-tile in registers, so every value loaded from shared memory feeds TM or TN
//    multiply-adds. op(A)'s tile is stored transposed (k-major). A thread's TN columns are spread
//    BN/TN apart, so at each step the 16 threads of a half-warp read 16 consecutive floats of Bs
//    (no bank conflicts) and write 16 consecutive floats of C (coalesced).
//    grid (ceil(N/BN), ceil(M/BM)), block (256)
#define BM 128
#define BN 128
#define BK 8
#define TM 8
#define TN 8
extern "C" __global__ void __launch_bounds__(256) matmul_regblock(const float* __restrict__ A, const float* __restrict__ B,
                                                                  float* __restrict__ C, int M, int N, int K, int ta, int tb)
{
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    const int tid = threadIdx.x;
    const int tr = tid / (BN / TN);          // 0..15: which TM rows of the tile
    const int tc = tid % (BN / TN);          // 0..15: the first of its TN columns
    const int i0 = blockIdx.y * BM, j0 = blockIdx.x * BN;
    float acc[TM][TN];
    for (int a = 0; a < TM; ++a)
        for (int b = 0; b < TN; ++b) acc[a][b] = 0.0f;
    float ra[TM], rb[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        // 256 threads load BM*BK = 1024 values of op(A) and BK*BN of op(B): four each.
        for (int l = tid; l < BM * BK; l += 256) {
            int r, c;
            if (ta) { r = l % BM; c = l / BM; }  // consecutive threads read consecutive i (A^T is (K, M))
            else    { r = l / BK; c = l % BK; }  // consecutive threads read consecutive k
            int gi = i0 + r, gk = k0 + c;
            As[c][r] = (gi < M && gk < K) ? A_AT(gi, gk) : 0.0f;
        }
        for (int l = tid; l < BK * BN; l += 256) {
            int r, c;
            if (tb) { r = l % BK; c = l / BK; }
            else    { r = l / BN; c = l % BN; }
            int gk = k0 + r, gj = j0 + c;
            Bs[r][c] = (gk < K && gj < N) ? B_AT(gk, gj) : 0.0f;
        }
        __syncthreads();
        for (int k = 0; k < BK; ++k) {
            for (int a = 0; a < TM; ++a) ra[a] = As[k][tr * TM + a];
            for (int b = 0; b < TN; ++b) rb[b] = Bs[k][tc + b * (BN / TN)];
            for (int a = 0; a < TM; ++a)
                for (int b = 0; b < TN; ++b) acc[a][b] += ra[a] * rb[b];
        }
        __syncthreads();
    }
    for (int a = 0; a < TM; ++a) {
        int i = i0 + tr * TM + a;
        if (i >= M) break;
        for (int b = 0; b < TN; ++b) {
            int j = j0 + tc + b * (BN / TN);
            if (j < N) C[(long long)i * N + j] = acc[a][b];
        }
    }
}
