// kernels_common.h - helpers shared by the native core's translation units (callback*.cpp,
// head_kernels.cpp, recall_scans.cpp). Internal: not part of the C ABI (that is miita_core.h), and
// nothing here is exported from the extension.
#pragma once

#include "miita_core.h"

#include "ggml.h"

#include <algorithm>
#include <functional>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace miita_internal {

// The error of the last failed call on this thread (miita_last_error); set by fail().
extern thread_local std::string g_last_error;

// Record msg as the last error and return -1 (the C ABI's error return).
int fail(const std::string & msg);

// 8 floats as a GCC/Clang vector: one ymm register on AVX2, half a zmm on AVX-512, two q
// registers on NEON. Loads go through an unaligned, may_alias twin of the type (one vmovups;
// a memcpy into the vector goes through the stack and stalls on store forwarding).
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x8_u __attribute__((vector_size(32), aligned(4), may_alias));

typedef int32_t i32x8 __attribute__((vector_size(32)));

inline f32x8 load8(const float * p) { return *reinterpret_cast<const f32x8_u *>(p); }
inline void store8(float * p, f32x8 v) { *reinterpret_cast<f32x8_u *>(p) = v; }

inline float hsum8(f32x8 v) {
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += v[j];
    return s;
}

inline float hmax8(f32x8 v) {
    float m = v[0];
    for (int j = 1; j < 8; ++j) m = std::max(m, v[j]);
    return m;
}

inline int clamp_threads(int n_threads, int64_t work) {
    int n = n_threads > 0 ? n_threads : (int) std::max(1u, std::thread::hardware_concurrency());
    return (int) std::max<int64_t>(1, std::min<int64_t>(n, work));
}

template <typename F>
inline void parallel_for(int n_threads, int64_t n, F && fn) {
    // fn(thread_index, begin, end)
    if (n_threads <= 1 || n < 2) {
        fn(0, 0, n);
        return;
    }
    const int64_t chunk = (n + n_threads - 1) / n_threads;
#if defined(_OPENMP)
    // OpenMP, when llama.cpp's CPU backend uses it too (GGML_OPENMP, the default on Linux): both
    // then share libgomp's one thread pool. Right after a llama_decode its workers still spin,
    // waiting for the next parallel region (libgomp's default wait policy); std::threads of ours
    // would compete with them for the cores, while a parallel region of ours is picked up by them
    // at once (measured: docs/benchmarks.md).
#pragma omp parallel num_threads(n_threads)
    {
        const int i = omp_get_thread_num();
        const int64_t b = i * chunk, e = std::min(n, b + chunk);
        if (b < e) fn(i, b, e);
    }
#else
    std::vector<std::thread> pool;
    for (int i = 0; i < n_threads; ++i) {
        const int64_t b = i * chunk, e = std::min(n, b + chunk);
        if (b >= e) break;
        pool.emplace_back([&fn, i, b, e] { fn(i, b, e); });
    }
    for (auto & th : pool) th.join();
#endif
}

}  // namespace miita_internal
