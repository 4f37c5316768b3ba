// labkit's CPU emulator for CUDA C: force-included (g++ -include) before an unchanged .cu file.
//
// How a launch runs:
//  * blocks are handed out to a few OS threads (one per core), so blocks run in parallel;
//  * the threads of one block run on that OS thread, one after the other. A kernel that calls
//    __syncthreads() runs each CUDA thread as a fiber (its own small stack): at the barrier a fiber
//    switches back to the block's scheduler, which resumes the next one; when every thread of the
//    block waits at the barrier, all go on. __shared__ is `static thread_local`, so all fibers of a
//    block see the same shared memory and different blocks (on different OS threads) do not.
//  * the threads of a block form warps of 32 (thread i is lane i % 32 of warp i / 32), and the scheduler runs a
//    block warp by warp. A warp intrinsic (__shfl_*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp,
//    __activemask) parks the calling fiber; when every lane its mask names has arrived at the same intrinsic, the
//    warp's values are exchanged at once and those lanes go on. A lane the mask names that cannot arrive (it
//    returned, waits at __syncthreads, or waits at another warp operation), a shuffle from a lane outside the
//    mask and a mask naming lanes the block does not have are reported with the kernel, warp and line.
//  * a kernel without __syncthreads() or warp intrinsics runs each thread as a plain function call (no fibers).
//  * checked mode (LABKIT_EMU_CHECKED, set by the loader, which also rewrites pointer parameters and
//    __shared__ arrays into the checked types below) stops at the first out-of-bounds access and
//    names the kernel, block, thread and source line.
// The loader (labkit/kernels/emulator.py) appends the extern "C" launch entry points.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <csignal>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__) || defined(LABKIT_EMU_UCONTEXT)
#define LABKIT_EMU_USE_UCONTEXT 1
#ifndef LABKIT_EMU_STACK_KB
#define LABKIT_EMU_STACK_KB 64
#endif
#ifndef _XOPEN_SOURCE
#define _XOPEN_SOURCE 700
#endif
#include <ucontext.h>
#endif

// ---- CUDA keywords ------------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __constant__
#define __shared__ static thread_local
#define __syncthreads() ::labkit::syncthreads(__LINE__)
#define __shfl_sync ::labkit::shfl_call<::labkit::SHFL_IDX>{__LINE__}
#define __shfl_up_sync ::labkit::shfl_call<::labkit::SHFL_UP>{__LINE__}
#define __shfl_down_sync ::labkit::shfl_call<::labkit::SHFL_DOWN>{__LINE__}
#define __shfl_xor_sync ::labkit::shfl_call<::labkit::SHFL_XOR>{__LINE__}
#define __ballot_sync ::labkit::vote_call<::labkit::BALLOT>{__LINE__}
#define __any_sync ::labkit::vote_call<::labkit::ANY>{__LINE__}
#define __all_sync ::labkit::vote_call<::labkit::ALL>{__LINE__}
#define __syncwarp ::labkit::syncwarp_call{__LINE__}
#define __activemask ::labkit::activemask_call{__LINE__}
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define __threadfence_block() __atomic_thread_fence(__ATOMIC_SEQ_CST)

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct int2 { int x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// The built-in indices: per OS thread, set by the scheduler before it runs (or resumes) a CUDA thread.
static thread_local uint3 threadIdx;
static thread_local uint3 blockIdx;
static thread_local dim3 blockDim;
static thread_local dim3 gridDim;
static constexpr int warpSize = 32;

// ---- maths ---------------------------------------------------------------------------------------

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
inline unsigned int min(int a, unsigned int b) { return min((unsigned int)a, b); }
inline unsigned int max(int a, unsigned int b) { return max((unsigned int)a, b); }
inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned int)b); }
inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned int)b); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int2float_rn(int x) { return (float)x; }
inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; std::memcpy(&x, &f, 4); return x; }
template <class T> inline T __ldg(const T* p) { return *p; }

// ---- atomics (real ones: blocks run on different OS threads) -------------------------------------
// Counting mode (LABKIT_EMU_COUNT) counts every atomic with its address: the most on one address is where they queue.
#ifdef LABKIT_EMU_COUNT
namespace labkit { inline void count_atomic(const void* p); }
#define LABKIT_ATOMIC(p) ::labkit::count_atomic(p)
#else
#define LABKIT_ATOMIC(p) ((void)0)
#endif

inline int atomicAdd(int* p, int v) { LABKIT_ATOMIC(p); return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    LABKIT_ATOMIC(p); return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    LABKIT_ATOMIC(p); return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
// GCC's __atomic_fetch_add takes no floating point: a compare-exchange loop on the bits does it.
template <class F, class I> inline F labkit_atomic_float_add(F* p, F v) {
    static_assert(sizeof(F) == sizeof(I), "size");
    I* ip = reinterpret_cast<I*>(p);
    I old = __atomic_load_n(ip, __ATOMIC_RELAXED);
    for (;;) {
        F f; std::memcpy(&f, &old, sizeof f);
        F g = f + v; I want; std::memcpy(&want, &g, sizeof want);
        if (__atomic_compare_exchange_n(ip, &old, want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return f;
    }
}
inline float atomicAdd(float* p, float v) { LABKIT_ATOMIC(p); return labkit_atomic_float_add<float, uint32_t>(p, v); }
inline double atomicAdd(double* p, double v) { LABKIT_ATOMIC(p); return labkit_atomic_float_add<double, uint64_t>(p, v); }
inline int atomicSub(int* p, int v) { LABKIT_ATOMIC(p); return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
inline int atomicExch(int* p, int v) { LABKIT_ATOMIC(p); return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
inline float atomicExch(float* p, float v) { LABKIT_ATOMIC(p);
    uint32_t w; std::memcpy(&w, &v, 4);
    uint32_t o = __atomic_exchange_n(reinterpret_cast<uint32_t*>(p), w, __ATOMIC_RELAXED);
    float f; std::memcpy(&f, &o, 4); return f;
}
inline int atomicCAS(int* p, int cmp, int v) { LABKIT_ATOMIC(p);
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return cmp;
}
inline unsigned int atomicCAS(unsigned int* p, unsigned int cmp, unsigned int v) { LABKIT_ATOMIC(p);
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return cmp;
}
inline int atomicMax(int* p, int v) { LABKIT_ATOMIC(p);
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
inline int atomicMin(int* p, int v) { LABKIT_ATOMIC(p);
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}

// ---- the runtime ---------------------------------------------------------------------------------

namespace labkit {

// The launch request, filled in by ctypes (labkit/kernels/emulator.py mirrors this layout).
struct LaunchArgs {
    unsigned int grid[3];
    unsigned int block[3];
    void** args;              // args[i] points at argument i's value (a pointer's value is the data address)
    const uint64_t* nbytes;   // for pointer arguments: the size of the array behind it
    int nargs;
    int nworkers;             // OS threads to spread blocks over
    uint64_t dyn_shared;      // bytes of `extern __shared__` memory per block
    double timeout_s;         // checked mode: give up after this long (an endless loop?)
    char* err;                // the first error's message goes here
    uint64_t errlen;
    int reversed;             // run each block's threads last to first (a check's second order)
};

struct Fault {};  // thrown after the message is recorded; caught where the CUDA thread began

enum FiberState { READY = 0, AT_BARRIER = 1, DONE = 2, FAULTED = 3, AT_WARP = 4 };

// The warp operations a fiber can wait at (the order of WARP_OP_NAMES).
enum WarpOp { SHFL_IDX = 0, SHFL_UP, SHFL_DOWN, SHFL_XOR, BALLOT, ANY, ALL, SYNCWARP, ACTIVEMASK };
static const char* const WARP_OP_NAMES[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                            "__ballot_sync", "__any_sync", "__all_sync", "__syncwarp", "__activemask"};

struct Fiber {
    void* sp = nullptr;
#ifdef LABKIT_EMU_USE_UCONTEXT
    ucontext_t ctx;
#endif
    int state = READY;
    int line = 0;
    // at a warp operation: which, the mask, the value offered, the lane argument and width; then the result
    int op = 0;
    unsigned mask = 0;
    uint64_t value = 0;
    int arg = 0;
    int width = 32;
    uint64_t result = 0;
};

struct Launch;

// What the OS thread running a block knows.
struct Worker {
    Launch* launch = nullptr;
    Fiber* fibers = nullptr;
    int nthreads = 0;
    int current = 0;
    void* sched_sp = nullptr;
#ifdef LABKIT_EMU_USE_UCONTEXT
    ucontext_t sched_ctx;
#endif
    bool fibered = false;
    char* dyn_shared = nullptr;
    uint64_t countdown = 0;
    struct CountState* counts = nullptr;  // counting mode: this block's accesses so far
    struct RaceState* races = nullptr;    // checked mode: who touched what since the block's last barrier
    bool reversed = false;
};

static thread_local Worker* t_worker = nullptr;

// Checked mode: the loader rewrites `A[i]` into `A[::labkit::at(__LINE__, i)]` for pointer parameters
// and __shared__ arrays, so that a bad index can be reported with the line it was written on.
static thread_local int t_line = 0;
template <class I> inline I at(int line, I i) { t_line = line; return i; }

// The loader writes each subscript as at(__LINE__, i, site, kind): which subscript of the source it is (counting) and
// whether it loads, stores or both (counting, and race tracking).
enum AccessKind { LOAD = 0, STORE = 1, LOAD_STORE = 2, ADDRESS = 3 };
static const int MAX_SITES = 256;  // the last one collects what no subscript names (*p, p->x)
static thread_local int t_site = MAX_SITES - 1;
static thread_local int t_kind = LOAD;

template <class I> inline I at(int line, I i, int site, int kind) {
    t_line = line;
    t_site = site < MAX_SITES - 1 ? site : MAX_SITES - 1;
    t_kind = kind;
    return i;
}

struct Launch {
    const char* kernel;
    const LaunchArgs* L;
    void (*invoke)(void*);
    void* closure;
    bool fibered;
    std::atomic<uint64_t> next_block{0};
    std::atomic<bool> failed{false};
    std::mutex err_mutex;
    std::chrono::steady_clock::time_point start;
};

inline void where(char* buf, size_t n) {
    Worker* w = t_worker;
    std::snprintf(buf, n, "kernel '%s', block (%u,%u,%u), thread (%u,%u,%u)", w && w->launch ? w->launch->kernel : "?",
                  blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
}

// ---- crash reports: only in the child process the loader forks for one launch of a user's kernel ----
// A fault there (a wild pointer, a stack overflow, an abort) ends the child; before it does, the handler writes
// which kernel, block and thread were running into the buffer the parent reads. Each worker thread gets an
// alternate signal stack, since a fiber's overflowing stack cannot run the handler.
static char* g_crash_buf = nullptr;
static uint64_t g_crash_len = 0;

inline void crash_handler(int sig) {
    if (g_crash_buf && t_worker) {
        char w[256];
        where(w, sizeof w);
        std::snprintf(g_crash_buf, g_crash_len, "%s", w);
    }
    std::signal(sig, SIG_DFL);
    std::raise(sig);
}

inline void crash_stack_for_this_thread() {
    if (!g_crash_buf) return;
    static thread_local std::vector<char> alt(256 * 1024);
    stack_t ss{};
    ss.ss_sp = alt.data();
    ss.ss_size = alt.size();
    sigaltstack(&ss, nullptr);
}

// Record the first error of a launch (later ones are dropped).
inline void record(const char* msg) {
    Worker* w = t_worker;
    if (!w || !w->launch) { std::fprintf(stderr, "labkit emulator: %s\n", msg); std::abort(); }
    Launch* l = w->launch;
    std::lock_guard<std::mutex> g(l->err_mutex);
    if (!l->failed.load()) {
        std::snprintf(l->L->err, l->L->errlen, "%s", msg);
        l->failed.store(true);
    }
}

[[noreturn]] inline void fault(int line, const char* fmt, ...) {
    char where_[160], what[400], msg[640];
    where(where_, sizeof where_);
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (line > 0) std::snprintf(msg, sizeof msg, "%s, line %d: %s", where_, line, what);
    else std::snprintf(msg, sizeof msg, "%s: %s", where_, what);
    record(msg);
    throw Fault{};
}

// Checked mode calls this on every checked access: now and then, look at the clock.
inline void tick(int line) {
    Worker* w = t_worker;
    if (++w->countdown % 65536 == 0) {
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - w->launch->start).count();
        if (w->launch->L->timeout_s > 0 && s > w->launch->L->timeout_s)
            fault(line, "still running after %.1f s (an endless loop?); stopped", s);
        if (w->launch->failed.load(std::memory_order_relaxed)) throw Fault{};  // another block failed
    }
}


#ifdef LABKIT_EMU_COUNT
// ---- counting memory traffic (LABKIT_EMU_COUNT; labkit/kernels/counts.py) -----------------------------------------
// Every counted access is kept with its warp, its site and how many times this thread has
// passed that site before: the k-th pass of one site by the lanes of a warp is one request, as a GPU issues it. At
// the end of each block the requests are summed per warp: 32-byte sectors for global memory, and for shared memory
// the wavefronts (the most distinct 4-byte words any of the 32 banks must serve; a broadcast of one word is free).
enum WarpCount { W_LOAD_REQ = 0, W_LOAD_SECTORS, W_STORE_REQ, W_STORE_SECTORS, W_SHARED_REQ, W_SHARED_WAVES, W_FIELDS };
struct Access { uint64_t key; uint64_t addr; uint32_t size; uint8_t shared; uint8_t kind; };
// Per block: the passes of each site; per OS thread, until the launch ends: barriers passed, atomics per address.
struct CountState {
    std::vector<uint32_t> passes;
    std::vector<Access> acc;
    uint64_t barriers = 0;
    std::unordered_map<uint64_t, uint64_t> atomics;         // on global memory, per address
    std::unordered_map<uint64_t, uint64_t> shared_atomics;  // on this block's shared memory, per address
    uint64_t shared_total = 0, shared_most = 0;             // of the blocks done
};
// The launch's totals (g_counts.launch, in this order; counts.py's LAUNCH_FIELDS)
enum LaunchCount { L_ATOMICS = 0, L_ATOMICS_MAX_PER_ADDRESS, L_BARRIERS, L_FIELDS };
struct CountBuffers {
    uint32_t* thread_loads; uint32_t* thread_stores; uint64_t* warps; uint64_t nthreads; uint64_t nwarps; uint64_t* launch;
};
static CountBuffers g_counts{};
static std::mutex g_count_mutex;
static std::unordered_map<uint64_t, uint64_t> g_atomics;  // atomics per address, this launch's OS threads merged
static uint64_t g_barriers = 0, g_shared_atomics = 0, g_shared_most = 0;
inline uint64_t block_linear() {
    return ((uint64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
}

inline void count_access(const void* addr, uint32_t size, bool shared, int kind, int site) {
    Worker* w = t_worker;
    CountState* cs = w ? w->counts : nullptr;
    if (!cs || kind == ADDRESS) return;
    const int i = w->current;
    const uint32_t pass = cs->passes[(size_t)i * MAX_SITES + site]++;
    const uint64_t key = ((uint64_t)(i >> 5) << 40) | ((uint64_t)site << 32) | pass;
    cs->acc.push_back({key, (uint64_t)(uintptr_t)addr, size, (uint8_t)shared, (uint8_t)kind});
    if (!shared && g_counts.thread_loads) {
        const uint64_t tid = block_linear() * (uint64_t)w->nthreads + i;
        if (tid < g_counts.nthreads) {
            if (kind != STORE) g_counts.thread_loads[tid]++;
            if (kind != LOAD) g_counts.thread_stores[tid]++;
        }
    }
}

// Whether p lies in one of the launch's arrays (global memory); else it is in a block's shared memory.
inline bool in_launch_array(const void* p) {
    const LaunchArgs* L = t_worker->launch->L;
    const char* c = (const char*)p;
    for (int i = 0; i < L->nargs; i++) {
        if (!L->nbytes[i]) continue;
        const char* a = *static_cast<char* const*>(L->args[i]);
        if (c >= a && c < a + L->nbytes[i]) return true;
    }
    return false;
}

// Every block has its own shared memory, at one address here (a thread_local static): a block's atomics on it are
// summed at the block's end, those on global memory at the launch's.
inline void count_atomic(const void* p) {
    Worker* w = t_worker;
    if (!w || !w->counts) return;
    (in_launch_array(p) ? w->counts->atomics : w->counts->shared_atomics)[(uint64_t)(uintptr_t)p]++;
}

// At the end of an OS thread's share of a launch: its barriers and atomics into the launch's.
inline void merge_launch_counts(CountState* cs) {
    std::lock_guard<std::mutex> g(g_count_mutex);
    g_barriers += cs->barriers;
    for (const auto& kv : cs->atomics) g_atomics[kv.first] += kv.second;
    g_shared_atomics += cs->shared_total;
    g_shared_most = std::max(g_shared_most, cs->shared_most);
}

// At the end of a launch: the totals into the caller's buffer (a second launch adds its own; the maximum is each one's).
inline void finish_launch_counts() {
    std::lock_guard<std::mutex> g(g_count_mutex);
    if (g_counts.launch) {
        uint64_t total = g_shared_atomics, most = g_shared_most;
        for (const auto& kv : g_atomics) { total += kv.second; most = std::max(most, kv.second); }
        g_counts.launch[L_ATOMICS] += total;
        g_counts.launch[L_ATOMICS_MAX_PER_ADDRESS] = std::max(g_counts.launch[L_ATOMICS_MAX_PER_ADDRESS], most);
        g_counts.launch[L_BARRIERS] += g_barriers;
    }
    g_atomics.clear();
    g_barriers = g_shared_atomics = g_shared_most = 0;
}


// Sum this block's requests into the per-warp counts, then forget them.
inline void finish_block_counts(Worker* w) {
    CountState* cs = w->counts;
    auto& a = cs->acc;
    std::sort(a.begin(), a.end(), [](const Access& x, const Access& y) { return x.key < y.key; });
    const uint64_t block = block_linear();
    const uint64_t warps_per_block = ((uint64_t)w->nthreads + 31) / 32;
    std::vector<uint64_t> units;
    for (size_t s = 0; s < a.size();) {
        size_t e = s;
        while (e < a.size() && a[e].key == a[s].key) e++;
        const uint64_t warp = a[s].key >> 40;
        const uint64_t slot = block * warps_per_block + warp;
        if (g_counts.warps && slot < g_counts.nwarps) {
            uint64_t* out = g_counts.warps + slot * W_FIELDS;
            units.clear();
            const bool shared = a[s].shared;
            const uint64_t unit = shared ? 4 : 32;  // a bank's word, or a sector
            for (size_t k = s; k < e; k++)
                for (uint64_t u = a[k].addr / unit; u <= (a[k].addr + a[k].size - 1) / unit; u++) units.push_back(u);
            std::sort(units.begin(), units.end());
            units.erase(std::unique(units.begin(), units.end()), units.end());
            const int kind = a[s].kind;
            const int times = kind == LOAD_STORE ? 2 : 1;
            if (shared) {
                int per_bank[32] = {0};
                int waves = 0;
                for (uint64_t u : units) waves = std::max(waves, ++per_bank[u % 32]);
                out[W_SHARED_REQ] += times;
                out[W_SHARED_WAVES] += (uint64_t)waves * times;
            } else {
                if (kind != STORE) { out[W_LOAD_REQ] += 1; out[W_LOAD_SECTORS] += units.size(); }
                if (kind != LOAD) { out[W_STORE_REQ] += 1; out[W_STORE_SECTORS] += units.size(); }
            }
        }
        s = e;
    }
    a.clear();
    std::fill(cs->passes.begin(), cs->passes.end(), 0u);
    for (const auto& kv : cs->shared_atomics) {
        cs->shared_total += kv.second;
        cs->shared_most = std::max(cs->shared_most, kv.second);
    }
    cs->shared_atomics.clear();
}
#endif

inline bool in_dynamic_shared(const void* p) {
    Worker* w = t_worker;
    const char* c = (const char*)p;
    return w && w->dyn_shared && c >= w->dyn_shared && c < w->dyn_shared + w->launch->L->dyn_shared;
}

#ifdef LABKIT_EMU_CHECKED
// ---- race tracking (checked mode; compute-sanitizer's racecheck, without a GPU) ----------------------------------------
// Between two barriers a block's threads may run in any order on a GPU. For every element a block touches (shared
// memory or global) the epoch since the last barrier keeps its writer and up to two readers: a second thread that reads
// what one wrote, or writes what another read or wrote, is a race, whichever of the two the emulator ran first. Two
// lanes of one warp that have met at a warp operation (__syncwarp, a shuffle, a vote) since are ordered; atomics and
// addresses only taken (&A[i]) are not tracked.
struct RaceCell {
    uint64_t addr = 0;
    uint32_t epoch = 0;
    int32_t who[3];     // the writer, two readers (thread indices in the block; -1: none)
    int32_t line[3];
    uint32_t gen[3];    // their warp's count of warp operations at the access
};
struct SharedName { const char* base; uint64_t bytes; uint32_t elem; int ndims; long long dims[4]; const char* name; };
// Two threads' stores to one element: a race only if they stored different values (racecheck calls the same value
// a benign hazard), which the element shows at the next barrier.
struct PendingStores {
    const void* addr; uint32_t size; uint64_t first_value; int first, first_line, second, second_line;
    const char* name; const void* base; uint32_t elem;
};
struct RaceState {
    std::vector<RaceCell> cells = std::vector<RaceCell>(1024);
    size_t used = 0;
    uint32_t epoch = 0;
    std::vector<uint32_t> warp_gen;
    std::vector<SharedName> shared;
    std::vector<PendingStores> pending;
};

// A __shared__ array's name, for a race report (the loader writes a call after each declaration).
template <class T, long long... D> struct sarr;
template <class T, long long... D> inline void name_shared(sarr<T, D...>* a, const char* name) {
    Worker* w = t_worker;
    if (!w || !w->races) return;
    for (const SharedName& s : w->races->shared) if (s.base == (const char*)a) return;
    SharedName s{(const char*)a, sizeof(*a), sizeof(T), (int)sizeof...(D), {D...}, name};
    w->races->shared.push_back(s);
}

inline void new_epoch(Worker* w) { if (w->races) w->races->epoch++; }

inline void warp_met(Worker* w, int warp) { if (w->races) w->races->warp_gen[warp]++; }

inline RaceCell& race_cell(RaceState* rs, uint64_t addr) {
    size_t mask = rs->cells.size() - 1, h = (size_t)((addr >> 2) * 0x9e3779b97f4a7c15ull >> 20) & mask;
    while (rs->cells[h].addr != addr && rs->cells[h].addr != 0) h = (h + 1) & mask;
    if (rs->cells[h].addr == addr) return rs->cells[h];
    if (2 * (rs->used + 1) > rs->cells.size()) {  // keep this epoch's cells, in a table twice as large if need be
        std::vector<RaceCell> old;
        old.swap(rs->cells);
        size_t live = 0;
        for (const RaceCell& c : old) live += c.addr && c.epoch == rs->epoch;
        rs->cells.assign(4 * live + 4 > old.size() ? 2 * old.size() : old.size(), RaceCell{});
        rs->used = 0;
        for (const RaceCell& c : old)
            if (c.addr && c.epoch == rs->epoch) { race_cell(rs, c.addr) = c; }
        return race_cell(rs, addr);
    }
    rs->used++;
    rs->cells[h].addr = addr;
    return rs->cells[h];
}

inline void thread_name(int i, char* buf, size_t n) {
    const unsigned bx = blockDim.x, by = blockDim.y, x = i % bx, y = (i / bx) % by, z = i / (bx * by);
    if (blockDim.z > 1) std::snprintf(buf, n, "thread (%u,%u,%u)", x, y, z);
    else if (by > 1) std::snprintf(buf, n, "thread (%u,%u)", x, y);
    else std::snprintf(buf, n, "thread %u", x);
}

// `As[3][5]` for a __shared__ array (found by address), `x[1029]` for an element of a pointer's array.
inline void element_name(RaceState* rs, const void* addr, const char* name, const void* base, uint32_t elem, char* buf,
                         size_t n) {
    const char* a = (const char*)addr;
    if (name) { std::snprintf(buf, n, "%s[%lld]", name, (long long)((a - (const char*)base) / elem)); return; }
    for (const SharedName& s : rs->shared) {
        if (a < s.base || a >= s.base + s.bytes) continue;
        long long k = (a - s.base) / s.elem;
        long long idx[4];
        for (int d = s.ndims - 1; d >= 0; d--) { idx[d] = k % s.dims[d]; k /= s.dims[d]; }
        int m = std::snprintf(buf, n, "%s", s.name);
        if (s.ndims == 1 && s.dims[0] == 1) return;  // a __shared__ scalar (the loader made it an array of one)
        for (int d = 0; d < s.ndims && m < (int)n; d++) m += std::snprintf(buf + m, n - m, "[%lld]", idx[d]);
        return;
    }
    std::snprintf(buf, n, "a __shared__ element");
}

inline void race_record(RaceState* rs, const void* addr, const char* name, const void* base, uint32_t elem,
                        int writer, int wline, int other, int oline, bool other_writes) {
    Worker* w = t_worker;
    char what[96], a[48], b[48], msg[900];
    element_name(rs, addr, name, base, elem, what, sizeof what);
    thread_name(writer, a, sizeof a);
    thread_name(other, b, sizeof b);
    std::snprintf(msg, sizeof msg, "kernel '%s', block (%u,%u,%u): race on `%s`: %s wrote it at line %d, %s %s it at line "
                  "%d with no `__syncthreads()` between. On a GPU the threads of a block run in any order between two "
                  "barriers, so either access may come first", w->launch->kernel, blockIdx.x, blockIdx.y, blockIdx.z,
                  what, a, wline, b, other_writes ? "wrote a different value to" : "read", oline);
    record(msg);
}

[[noreturn]] inline void race_fault(RaceState* rs, const void* addr, const char* name, const void* base, uint32_t elem,
                                    int writer, int wline, int other, int oline, bool other_writes) {
    race_record(rs, addr, name, base, elem, writer, wline, other, oline, other_writes);
    throw Fault{};
}

// At a barrier or the block's end: two stores of different values to one element since the last barrier are a race
// (recorded; false returned).
inline bool stores_agree(Worker* w) {
    RaceState* rs = w->races;
    if (!rs || rs->pending.empty()) return true;
    for (const PendingStores& p : rs->pending) {
        uint64_t now = 0;
        std::memcpy(&now, p.addr, p.size);
        if (now != p.first_value) {
            race_record(rs, p.addr, p.name, p.base, p.elem, p.first, p.first_line, p.second, p.second_line, true);
            rs->pending.clear();
            return false;
        }
    }
    rs->pending.clear();
    return true;
}

inline void race_access(const void* addr, const char* name, const void* base, uint32_t elem, int kind) {
    Worker* w = t_worker;
    RaceState* rs = w ? w->races : nullptr;
    if (!rs) return;
    RaceCell& c = race_cell(rs, (uint64_t)(uintptr_t)addr);
    if (c.epoch != rs->epoch) {
        c.epoch = rs->epoch;
        c.who[0] = c.who[1] = c.who[2] = -1;
    }
    const int me = w->current, line = t_line;
    const uint32_t gen = rs->warp_gen[me / 32];
    auto apart = [&](int k) {  // slot k holds another thread, not ordered with this one by a warp operation
        return c.who[k] >= 0 && c.who[k] != me && !(c.who[k] / 32 == me / 32 && c.gen[k] != gen);
    };
    if (apart(0)) {
        if (kind != STORE || elem > 8) race_fault(rs, addr, name, base, elem, c.who[0], c.line[0], me, line, kind != LOAD);
        PendingStores p{addr, elem, 0, c.who[0], c.line[0], me, line, name, base, elem};
        std::memcpy(&p.first_value, addr, elem);  // what the first store left; the second has not happened yet
        rs->pending.push_back(p);
    }
    if (kind != STORE) {  // a read: into a free reader slot, or over this thread's own
        int k = c.who[1] < 0 || c.who[1] == me ? 1 : (c.who[2] < 0 || c.who[2] == me ? 2 : 0);
        if (k) { c.who[k] = me; c.line[k] = line; c.gen[k] = gen; }
    }
    if (kind != LOAD) {
        for (int k = 1; k <= 2; k++)
            if (apart(k)) race_fault(rs, addr, name, base, elem, me, line, c.who[k], c.line[k], false);
        c.who[0] = me; c.line[0] = line; c.gen[0] = gen;
    }
}
#endif

// Every checked access: counted (counting mode) and tracked for races (checked mode). `name` and `base` name a
// pointer's array; a __shared__ array (name null) is found by its address.
inline void on_access(const void* addr, uint32_t size, bool shared, const char* name, const void* base, uint32_t elem) {
    const int kind = t_kind, site = t_site;
    t_kind = LOAD;
    t_site = MAX_SITES - 1;
#ifdef LABKIT_EMU_COUNT
    count_access(addr, size, shared, kind, site);
#endif
#if defined(LABKIT_EMU_CHECKED) && !defined(LABKIT_EMU_NO_RACES)
    if (kind != ADDRESS) race_access(addr, name, base, elem, kind);
#endif
}

// A pointer parameter in checked mode: it knows the array it points into.
template <class T> struct cptr {
    T* p = nullptr;
    T* base = nullptr;
    long long n = 0;  // elements in the array
    const char* name = "?";
    cptr() = default;
    cptr(T* p_, T* base_, long long n_, const char* name_) : p(p_), base(base_), n(n_), name(name_) {}
    T* check(long long i, int line) const {
        tick(line);
        long long k = (p - base) + i;
        if (p == nullptr) fault(line, "'%s' is a null pointer", name);
        if (k < 0 || k >= n)
            fault(line, "out-of-bounds access %s[%lld]: '%s' has %lld elements", name, k, name, n);
        on_access(p + i, sizeof(T), in_dynamic_shared(p + i), name, base, sizeof(T));
        return p + i;
    }
    T& operator[](long long i) const { return *check(i, t_line); }
    T& operator*() const { return *check(0, 0); }
    T* operator->() const { return check(0, 0); }
    cptr operator+(long long i) const { return cptr(p + i, base, n, name); }
    cptr operator-(long long i) const { return cptr(p - i, base, n, name); }
    long long operator-(const cptr& o) const { return p - o.p; }
    cptr& operator+=(long long i) { p += i; return *this; }
    cptr& operator-=(long long i) { p -= i; return *this; }
    cptr& operator++() { ++p; return *this; }
    cptr operator++(int) { cptr c = *this; ++p; return c; }
    operator T*() const { return p; }  // handing it to a __device__ function that takes T* (unchecked there)
    template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
    explicit operator I() const { return (I)(uintptr_t)p; }  // (long long)x, as a kernel may cast a pointer
};

// Checked mode: `T* q = expr;` in a kernel becomes `auto q = derive<T>(expr);`, so a pointer made from an argument
// (q = x, q = x + off) keeps the argument's bounds and its accesses are checked; any other pointer stays as it is.
template <class T> inline cptr<T> derive(const cptr<T>& c) { return c; }
template <class T, std::enable_if_t<std::is_const_v<T>, int> = 0>
inline cptr<T> derive(const cptr<std::remove_const_t<T>>& c) {  // a const view of a writable argument
    return cptr<T>(c.p, c.base, c.n, c.name);
}
template <class T, class X> inline T* derive(X x) { return (T*)x; }

// A __shared__ array in checked mode: indices are checked against its extents.
template <class T, long long... D> struct sarr;
template <class T, long long N> struct sarr<T, N> {
    T d[N];
    T& operator[](long long i) {
        tick(t_line);
        if (i < 0 || i >= N) fault(t_line, "__shared__ array index %lld out of range [0, %lld)", i, N);
        on_access(&d[i], sizeof(T), true, nullptr, nullptr, sizeof(T));
        return d[i];
    }
    operator T*() { return d; }
};
template <class T, long long N, long long M, long long... R> struct sarr<T, N, M, R...> {
    sarr<T, M, R...> d[N];
    sarr<T, M, R...>& operator[](long long i) {
        if (i < 0 || i >= N) fault(t_line, "__shared__ array index %lld out of range [0, %lld)", i, N);
        return d[i];
    }
};

// ---- fibers --------------------------------------------------------------------------------------

#ifndef LABKIT_EMU_USE_UCONTEXT
// x86-64 System V: save the callee-saved registers and the FP control words on the old stack,
// switch stacks, restore from the new one. A new fiber's stack is laid out as if it had switched
// away just before labkit_fiber_start, which calls rbx(r12).
extern "C" void labkit_ctx_switch(void** save_sp, void* new_sp);
extern "C" void labkit_fiber_start();
asm(R"(
    .text
    .p2align 4
    .globl labkit_ctx_switch
    .hidden labkit_ctx_switch
labkit_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .globl labkit_fiber_start
    .hidden labkit_fiber_start
labkit_fiber_start:
    movq %r12, %rdi
    callq *%rbx
    ud2
)");
#endif

void fiber_main(void*);

// Fiber stacks, kept between launches (mapping and protecting them costs more than a small kernel).
struct StackPool {
    std::mutex m;
    std::vector<std::pair<char*, size_t>> free_;
    static size_t stack_size() {
        static size_t s = [] {
            long kb = LABKIT_EMU_STACK_KB;  // set by the loader from the LABKIT_EMU_STACK_KB setting
            return (size_t)(kb < 16 ? 16 : kb) * 1024;
        }();
        return s;
    }
    // A region holding n stacks, each with a guard page below it (an overflow faults instead of
    // silently writing into the neighbour's stack).
    std::pair<char*, size_t> get(int n) {
        size_t need = (size_t)n * (stack_size() + 4096);
        {
            std::lock_guard<std::mutex> g(m);
            for (size_t i = 0; i < free_.size(); i++)
                if (free_[i].second >= need) { auto r = free_[i]; free_.erase(free_.begin() + i); return r; }
        }
        void* p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return {nullptr, 0};
        for (int i = 0; i < n; i++) mprotect((char*)p + (size_t)i * (stack_size() + 4096), 4096, PROT_NONE);
        return {(char*)p, need};
    }
    void put(std::pair<char*, size_t> r) { std::lock_guard<std::mutex> g(m); free_.push_back(r); }
};
static StackPool stack_pool;

inline void set_thread(int i) {
    unsigned bx = blockDim.x, by = blockDim.y;
    threadIdx.x = i % bx;
    threadIdx.y = (i / bx) % by;
    threadIdx.z = i / (bx * by);
}

inline void switch_to_scheduler(Worker* w) {
    Fiber& f = w->fibers[w->current];
#ifdef LABKIT_EMU_USE_UCONTEXT
    swapcontext(&f.ctx, &w->sched_ctx);
#else
    labkit_ctx_switch(&f.sp, w->sched_sp);
#endif
}

// The calling thread's fiber, about to wait at `what` on `line` (a barrier or a warp operation).
inline Fiber& waiting_fiber(int line, const char* what) {
    Worker* w = t_worker;
#ifdef LABKIT_EMU_CHECKED
    tick(line);
#endif
    if (!w->fibered) {
        char msg[160];
        std::snprintf(msg, sizeof msg, "internal error: %s in a kernel run without fibers", what);
        record(msg);
        throw Fault{};
    }
    Fiber& f = w->fibers[w->current];
    f.line = line;
    return f;
}

// Park the fiber in `state` until the scheduler resumes it; a launch that failed meanwhile ends it there.
inline void wait_as(Fiber& f, int state) {
    Worker* w = t_worker;
    f.state = state;
    switch_to_scheduler(w);
    if (w->launch->failed.load(std::memory_order_relaxed)) throw Fault{};
}

inline void syncthreads(int line) { wait_as(waiting_fiber(line, "__syncthreads()"), AT_BARRIER); }

// A warp intrinsic: park this fiber at it until the lanes of its mask have all arrived (see resolve_warp).
inline uint64_t warp_wait(int line, int op, unsigned mask, uint64_t value, int arg, int width) {
    Fiber& f = waiting_fiber(line, WARP_OP_NAMES[op]);
    f.op = op;
    f.mask = mask;
    f.value = value;
    f.arg = arg;
    f.width = width;
    wait_as(f, AT_WARP);
    return f.result;
}

template <class T> inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "a warp shuffle moves values of at most 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}
template <class T> inline T from_bits(uint64_t b) { T v; std::memcpy(&v, &b, sizeof(T)); return v; }

// __shfl_sync(mask, var, srcLane[, width]) and its up/down/xor forms: `__shfl_sync` expands to shfl_call<SHFL_IDX>{__LINE__}
template <int OP> struct shfl_call {
    int line;
    template <class T> T operator()(unsigned mask, T var, int lane_arg, int width = 32) const {
        return from_bits<T>(warp_wait(line, OP, mask, bits_of(var), lane_arg, width));
    }
};
// __ballot_sync(mask, predicate), __any_sync, __all_sync
template <int OP> struct vote_call {
    int line;
    template <class P> auto operator()(unsigned mask, P predicate) const {
        unsigned r = (unsigned)warp_wait(line, OP, mask, predicate ? 1u : 0u, 0, 32);
        if constexpr (OP == BALLOT) return r; else return (int)r;
    }
};
struct syncwarp_call {
    int line;
    void operator()(unsigned mask = 0xffffffffu) const { warp_wait(line, SYNCWARP, mask, 0, 0, 32); }
};
struct activemask_call {
    int line;
    unsigned operator()() const { return (unsigned)warp_wait(line, ACTIVEMASK, 0, 0, 0, 32); }
};

inline void warp_where(Worker* w, int first, int warp, int line, char* buf, size_t n) {
    set_thread(first);
    std::snprintf(buf, n, "kernel '%s', block (%u,%u,%u), warp %d (threads %d-%d), line %d", w->launch->kernel,
                  blockIdx.x, blockIdx.y, blockIdx.z, warp, warp * 32, std::min(w->nthreads, warp * 32 + 32) - 1, line);
}

[[gnu::format(printf, 5, 6)]] inline void warp_fault(Worker* w, int first, int line, int lo, const char* fmt, ...) {
    char where_[200], what[560], msg[800];
    warp_where(w, first, lo / 32, line, where_, sizeof where_);
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    std::snprintf(msg, sizeof msg, "%s: %s", where_, what);
    record(msg);
}

// Where lane j of the warp starting at thread lo is, in words (for a lane that did not arrive).
inline void lane_whereabouts(Worker* w, int lo, int j, char* buf, size_t n) {
    const Fiber& g = w->fibers[lo + j];
    if (g.state == DONE) std::snprintf(buf, n, "it returned from the kernel");
    else if (g.state == AT_BARRIER) std::snprintf(buf, n, "it waits at __syncthreads() on line %d", g.line);
    else if (g.state == AT_WARP)
        std::snprintf(buf, n, "it waits at %s on line %d with mask 0x%08x", WARP_OP_NAMES[g.op], g.line, g.mask);
    else std::snprintf(buf, n, "it stopped");
}

// Release the lanes of one group (they all arrived at `op` with `mask`): compute each lane's result.
inline bool release_group(Worker* w, int lo, int nlanes, unsigned members, int op) {
    Fiber* f = w->fibers + lo;
    unsigned votes = 0;
    for (int j = 0; j < nlanes; j++)
        if ((members >> j & 1u) && f[j].value) votes |= 1u << j;
    for (int j = 0; j < nlanes; j++) {
        if (!(members >> j & 1u)) continue;
        Fiber& me = f[j];
        if (op <= SHFL_XOR) {
            const int wd = me.width;
            if (wd < 1 || wd > 32 || (wd & (wd - 1))) {
                warp_fault(w, lo + j, me.line, lo, "%s: width %d must be a power of 2 from 1 to 32 (warpSize)",
                           WARP_OP_NAMES[op], wd);
                return false;
            }
            const int seg = j & ~(wd - 1);  // the first lane of this lane's segment of `width` lanes
            const unsigned a = (unsigned)me.arg;
            int src = j;
            if (op == SHFL_IDX) src = seg + (int)(a & (unsigned)(wd - 1));
            else if (op == SHFL_UP) src = (unsigned)(j - seg) >= a ? j - (int)a : j;
            else if (op == SHFL_DOWN) src = (unsigned)(j - seg) + a < (unsigned)wd ? j + (int)a : j;
            else { unsigned x = (unsigned)j ^ a; src = x < (unsigned)(seg + wd) ? (int)x : j; }
            if (src != j && !(members >> src & 1u)) {
                set_thread(lo + j);
                uint3 t = threadIdx;
                warp_fault(w, lo + j, me.line, lo, "%s: lane %d (thread (%u,%u,%u)) reads lane %d, which is not in the "
                           "mask 0x%08x: a shuffle may only read lanes that take part (the value would be undefined)",
                           WARP_OP_NAMES[op], j, t.x, t.y, t.z, src, me.mask);
                return false;
            }
            me.result = f[src].value;
        } else if (op == BALLOT) me.result = votes;
        else if (op == ANY) me.result = votes != 0;
        else if (op == ALL) me.result = votes == members;
        else if (op == ACTIVEMASK) me.result = members;
        else me.result = 0;
    }
    for (int j = 0; j < nlanes; j++)
        if (members >> j & 1u) f[j].state = READY;
#ifdef LABKIT_EMU_CHECKED
    warp_met(w, lo / 32);
#endif
    return true;
}

// After every lane of the warp at threads [lo, lo + nlanes) ran as far as it can: release each group of lanes that
// all arrived at one warp operation with one mask. Returns the lanes released, or -1 after recording an error.
inline int resolve_warp(Worker* w, int lo, int nlanes) {
    Fiber* f = w->fibers + lo;
    const unsigned present = nlanes == 32 ? 0xffffffffu : ((1u << nlanes) - 1);
    int released = 0;
    unsigned seen = 0;
    for (int j = 0; j < nlanes; j++) {
        if (f[j].state != AT_WARP || f[j].op == ACTIVEMASK || (seen >> j & 1u)) continue;
        const unsigned mask = f[j].mask;
        const int op = f[j].op;
        if (!(mask >> j & 1u)) {
            warp_fault(w, lo + j, f[j].line, lo, "%s with mask 0x%08x called by lane %d, which is not in its own mask",
                       WARP_OP_NAMES[op], mask, j);
            return -1;
        }
        if (mask & ~present) {
            warp_fault(w, lo + j, f[j].line, lo, "%s: mask 0x%08x names lanes this warp does not have (the block's "
                       "%d threads leave it %d lanes: mask 0x%08x)", WARP_OP_NAMES[op], mask, w->nthreads, nlanes, present);
            return -1;
        }
        unsigned members = 0;
        bool complete = true;
        for (int k = 0; k < nlanes; k++) {
            if (!(mask >> k & 1u)) continue;
            if (f[k].state == AT_WARP && f[k].mask == mask && f[k].op != ACTIVEMASK) {
                members |= 1u << k;
                if (f[k].op != op) {
                    warp_fault(w, lo + j, f[j].line, lo, "lanes of mask 0x%08x meet at different warp operations: lane %d "
                               "at %s (line %d), lane %d at %s (line %d)", mask, j, WARP_OP_NAMES[op], f[j].line, k,
                               WARP_OP_NAMES[f[k].op], f[k].line);
                    return -1;
                }
            } else {
                complete = false;
            }
        }
        seen |= members;
        if (!complete) continue;
        if (!release_group(w, lo, nlanes, members, op)) return -1;
        released += __builtin_popcount(members);
    }
    if (released) return released;
    // nothing else can move in this warp: lanes at the same __activemask() are the lanes active there
    for (int j = 0; j < nlanes; j++) {
        if (f[j].state != AT_WARP || f[j].op != ACTIVEMASK) continue;
        unsigned members = 0;
        for (int k = j; k < nlanes; k++)
            if (f[k].state == AT_WARP && f[k].op == ACTIVEMASK && f[k].line == f[j].line) members |= 1u << k;
        release_group(w, lo, nlanes, members, ACTIVEMASK);
        return __builtin_popcount(members);
    }
    for (int j = 0; j < nlanes; j++) {  // a lane waits for one that cannot come
        if (f[j].state != AT_WARP) continue;
        for (int k = 0; k < nlanes; k++) {
            if (!(f[j].mask >> k & 1u)) continue;
            if (f[k].state == AT_WARP && f[k].mask == f[j].mask && f[k].op != ACTIVEMASK) continue;
            char there[160];
            lane_whereabouts(w, lo, k, there, sizeof there);
            set_thread(lo + k);
            uint3 t = threadIdx;
            warp_fault(w, lo + j, f[j].line, lo, "%s with mask 0x%08x waits for lane %d (thread (%u,%u,%u)), which "
                       "never arrives: %s. Every lane a mask names must reach the same warp operation; pass the mask of "
                       "the lanes that get there (__ballot_sync or __activemask before the branch)",
                       WARP_OP_NAMES[f[j].op], f[j].mask, k, t.x, t.y, t.z, there);
            return -1;
        }
    }
    return 0;
}

inline void fiber_main(void*) {
    Worker* w = t_worker;
    Launch* l = w->launch;
    int state = DONE;
    try {
        l->invoke(l->closure);
    } catch (const Fault&) {
        state = FAULTED;
    } catch (...) {
        char where_[160], msg[256];
        where(where_, sizeof where_);
        std::snprintf(msg, sizeof msg, "%s: a C++ exception escaped the kernel", where_);
        record(msg);
        state = FAULTED;
    }
    w->fibers[w->current].state = state;
    switch_to_scheduler(w);
    std::abort();  // never resumed
}

#ifdef LABKIT_EMU_USE_UCONTEXT
inline void fiber_trampoline() { fiber_main(nullptr); }
#endif

// Run every thread of the current block as fibers, round by round between barriers.
inline void run_block_fibered(Worker* w, char* stacks) {
    const int n = w->nthreads;
    const size_t ss = StackPool::stack_size();
    for (int i = 0; i < n; i++) {
        Fiber& f = w->fibers[i];
        f.state = READY;
        f.line = 0;
        char* lo = stacks + (size_t)i * (ss + 4096) + 4096;
#ifdef LABKIT_EMU_USE_UCONTEXT
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = lo;
        f.ctx.uc_stack.ss_size = ss;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, (void (*)())fiber_trampoline, 0);
#else
        uintptr_t top = ((uintptr_t)(lo + ss)) & ~(uintptr_t)15;
        uint64_t* sp = (uint64_t*)top - 8;
        uint32_t csr[2];
        asm volatile("stmxcsr %0" : "=m"(csr[0]));
        asm volatile("fnstcw %0" : "=m"(csr[1]));
        std::memcpy(&sp[0], csr, 8);
        sp[1] = 0;                              // r15
        sp[2] = 0;                              // r14
        sp[3] = 0;                              // r13
        sp[4] = 0;                              // r12: fiber_main's argument
        sp[5] = (uint64_t)(void*)&fiber_main;   // rbx: called by labkit_fiber_start
        sp[6] = 0;                              // rbp
        sp[7] = (uint64_t)(void*)&labkit_fiber_start;
        f.sp = sp;
#endif
    }
    for (;;) {
        int waiting = 0, done = 0, first_wait = -1, first_done = -1;
#ifdef LABKIT_EMU_NO_WARPS
        const int group = n;  // the scheduler before warps, kept to measure what warps cost (no warp operations)
#else
        const int group = 32;
#endif
        const int ngroups = (n + group - 1) / group;
        for (int g = 0; g < ngroups; g++) {  // warp by warp: its lanes run until each waits, a warp operation releases
            const int lo = (w->reversed ? ngroups - 1 - g : g) * group;  // its lanes, they run on, ...
            const int nlanes = std::min(group, n - lo);
            for (;;) {
                bool parked = false;
                for (int k = 0; k < nlanes; k++) {
                    const int i = w->reversed ? lo + nlanes - 1 - k : lo + k;
                    Fiber& f = w->fibers[i];
                    if (f.state == READY) {
                        w->current = i;
                        set_thread(i);
#ifdef LABKIT_EMU_USE_UCONTEXT
                        swapcontext(&w->sched_ctx, &f.ctx);
#else
                        labkit_ctx_switch(&w->sched_sp, f.sp);
#endif
                        if (f.state == FAULTED) return;
                    }
                    parked |= f.state == AT_WARP;
                }
                if (!parked) break;
#ifdef LABKIT_EMU_NO_WARPS
                record("a warp intrinsic in a build without warps (LABKIT_EMU_NO_WARPS)");
                return;
#endif
                const int released = resolve_warp(w, lo, nlanes);
                if (released < 0) return;
                if (released == 0) break;
            }
        }
        for (int i = 0; i < n; i++) {
            const Fiber& f = w->fibers[i];
            if (f.state == AT_BARRIER) { waiting++; if (first_wait < 0) first_wait = i; }
            else if (f.state == DONE) { done++; if (first_done < 0) first_done = i; }
        }
        if (done == n) return;
        if (w->launch->failed.load()) return;
        // Some threads wait at a barrier that others have left the kernel without reaching:
        // on a GPU this is undefined (it may hang); here it is reported.
        if (done > 0) {
            set_thread(first_done);
            uint3 gone = threadIdx;
            set_thread(first_wait);
            char where_[160], msg[480];
            where(where_, sizeof where_);
            std::snprintf(msg, sizeof msg,
                          "%s waits at __syncthreads() (line %d), but %d of the block's %d threads returned without "
                          "reaching it, thread (%u,%u,%u) first. Every thread of a block must reach every "
                          "__syncthreads(): move early returns after the last barrier, or guard the work instead.",
                          where_, w->fibers[first_wait].line, done, n, gone.x, gone.y, gone.z);
            record(msg);
            return;
        }
#ifdef LABKIT_EMU_CHECKED
        for (int i = 0; i < n; i++) {
            if (w->fibers[i].line != w->fibers[first_wait].line) {
                set_thread(i);
                char where_[160], msg[400];
                where(where_, sizeof where_);
                std::snprintf(msg, sizeof msg,
                              "%s waits at the __syncthreads() on line %d while thread 0 of its block waits at the one "
                              "on line %d: threads of a block must meet at the same barrier",
                              where_, w->fibers[i].line, w->fibers[first_wait].line);
                record(msg);
                return;
            }
        }
#endif
#ifdef LABKIT_EMU_COUNT
        w->counts->barriers++;  // every thread of the block is at this barrier: the block passes it once
#endif
#ifdef LABKIT_EMU_CHECKED
        if (!stores_agree(w)) return;
        new_epoch(w);
#endif
        for (int i = 0; i < n; i++) w->fibers[i].state = READY;
    }
}

inline void run_block_plain(Worker* w) {
    const int n = w->nthreads;
    Launch* l = w->launch;
    try {
        for (int k = 0; k < n; k++) {
            const int i = w->reversed ? n - 1 - k : k;
            w->current = i;
            set_thread(i);
            l->invoke(l->closure);
        }
    } catch (const Fault&) {
    }
}

inline void worker_loop(Launch* l) {
    const LaunchArgs* L = l->L;
    crash_stack_for_this_thread();
    Worker w;
    w.launch = l;
    w.fibered = l->fibered;
    w.nthreads = (int)(L->block[0] * L->block[1] * L->block[2]);
    w.reversed = L->reversed != 0;
    t_worker = &w;
    blockDim = dim3(L->block[0], L->block[1], L->block[2]);
    gridDim = dim3(L->grid[0], L->grid[1], L->grid[2]);
    std::vector<char> dyn(L->dyn_shared + 128);
    w.dyn_shared = (char*)(((uintptr_t)dyn.data() + 127) & ~(uintptr_t)127);  // bank 0 at its start, as on a GPU
#ifdef LABKIT_EMU_COUNT
    CountState counts;
    counts.passes.assign((size_t)w.nthreads * MAX_SITES, 0u);
    w.counts = &counts;
#endif
#if defined(LABKIT_EMU_CHECKED) && !defined(LABKIT_EMU_NO_RACES)
    RaceState races;
    races.warp_gen.assign((w.nthreads + 31) / 32, 0u);
    w.races = &races;
#endif
    std::vector<Fiber> fibers;
    std::pair<char*, size_t> stacks{nullptr, 0};
    if (w.fibered) {
        fibers.resize(w.nthreads);
        w.fibers = fibers.data();
        stacks = stack_pool.get(w.nthreads);
        if (!stacks.first) {
            record("could not map memory for the fiber stacks");
            t_worker = nullptr;
            return;
        }
    }
    const uint64_t nblocks = (uint64_t)L->grid[0] * L->grid[1] * L->grid[2];
    for (;;) {
        uint64_t b = l->next_block.fetch_add(1);
        if (b >= nblocks || l->failed.load(std::memory_order_relaxed)) break;
        blockIdx.x = (unsigned)(b % L->grid[0]);
        blockIdx.y = (unsigned)((b / L->grid[0]) % L->grid[1]);
        blockIdx.z = (unsigned)(b / ((uint64_t)L->grid[0] * L->grid[1]));
#ifdef LABKIT_EMU_CHECKED
        new_epoch(&w);
#endif
        if (w.fibered) run_block_fibered(&w, stacks.first);
        else run_block_plain(&w);
#ifdef LABKIT_EMU_CHECKED
        if (!l->failed.load()) stores_agree(&w);
        if (w.races) w.races->pending.clear();
#endif
#ifdef LABKIT_EMU_COUNT
        finish_block_counts(&w);
#endif
    }
    if (stacks.first) stack_pool.put(stacks);
#ifdef LABKIT_EMU_COUNT
    merge_launch_counts(&counts);
#endif
    t_worker = nullptr;
}

inline int run(const char* kernel, const LaunchArgs* L, void (*invoke)(void*), void* closure, bool fibered) {
    Launch l;
    l.kernel = kernel;
    l.L = L;
    l.invoke = invoke;
    l.closure = closure;
    l.fibered = fibered;
    l.start = std::chrono::steady_clock::now();
    const uint64_t nblocks = (uint64_t)L->grid[0] * L->grid[1] * L->grid[2];
    int nw = (int)std::min<uint64_t>(nblocks, (uint64_t)std::max(1, L->nworkers));
    if (nw <= 1) {
        worker_loop(&l);
    } else {
        std::vector<std::thread> ts;
        for (int i = 0; i < nw; i++) ts.emplace_back(worker_loop, &l);
        for (auto& t : ts) t.join();
    }
#ifdef LABKIT_EMU_COUNT
    finish_launch_counts();
#endif
    return l.failed.load() ? 1 : 0;
}

// `extern __shared__ T name[];` becomes a pointer to this block's dynamic shared memory.
template <class T> inline T* dynamic_shared() { return reinterpret_cast<T*>(t_worker->dyn_shared); }
template <class T> inline cptr<T> dynamic_shared_checked(const char* name) {
    T* p = dynamic_shared<T>();
    return cptr<T>(p, p, (long long)(t_worker->launch->L->dyn_shared / sizeof(T)), name);
}

// ---- turning the launch request into the kernel's arguments ---------------------------------------

template <class T> struct arg_of {
    static T get(void* p, uint64_t, const char*) { T v; std::memcpy(&v, p, sizeof(T)); return v; }
};
template <class T> struct arg_of<T*> {
    static T* get(void* p, uint64_t, const char*) { return *static_cast<T**>(p); }
};
template <class T> struct arg_of<cptr<T>> {
    static cptr<T> get(void* p, uint64_t nbytes, const char* name) {
        T* d = *static_cast<T**>(p);
        return cptr<T>(d, d, (long long)(nbytes / sizeof(T)), name);
    }
};

template <class... A, size_t... I>
std::tuple<std::decay_t<A>...> unpack(const LaunchArgs* L, const char* const* names, std::index_sequence<I...>) {
    return std::tuple<std::decay_t<A>...>(arg_of<std::decay_t<A>>::get(L->args[I], L->nbytes[I], names[I])...);
}

template <class... A> struct Closure {
    void (*fn)(A...);
    std::tuple<std::decay_t<A>...> vals;
};

template <class... A> void invoke_closure(void* p) {
    auto* c = static_cast<Closure<A...>*>(p);
    std::apply(c->fn, c->vals);
}

template <class... A>
int launch(const char* kernel, void (*fn)(A...), const char* const* names, const LaunchArgs* L, bool fibered) {
    if (L->nargs != (int)sizeof...(A)) {
        std::snprintf(L->err, L->errlen, "kernel '%s' takes %d arguments, got %d", kernel, (int)sizeof...(A), L->nargs);
        return 1;
    }
    Closure<A...> c{fn, unpack<A...>(L, names, std::index_sequence_for<A...>{})};
    return run(kernel, L, &invoke_closure<A...>, &c, fibered);
}

}  // namespace labkit

#ifdef LABKIT_EMU_COUNT
// Counting mode: where the next launches add their counts (zeroed by the caller; sizes in elements).
extern "C" __attribute__((visibility("default"))) void labkit_count_into(unsigned int* thread_loads,
        unsigned int* thread_stores, unsigned long long nthreads, unsigned long long* warps, unsigned long long nwarps,
        unsigned long long* launch) {
    ::labkit::g_counts = {thread_loads, thread_stores, (uint64_t*)warps, nthreads, nwarps, (uint64_t*)launch};
}
#endif

// Called by the loader in the forked child before the launch: report a fatal signal's whereabouts into `buf`.
extern "C" __attribute__((visibility("default"))) void labkit_crash_reports(char* buf, unsigned long long len) {
    ::labkit::g_crash_buf = buf;
    ::labkit::g_crash_len = len;
    struct sigaction sa {};
    sa.sa_handler = ::labkit::crash_handler;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGABRT}) sigaction(sig, &sa, nullptr);
}
