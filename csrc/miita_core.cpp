// miita_core.cpp - see miita_core.h for the contract.
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

namespace {

thread_local std::string g_last_error;

// 8 floats as a GCC/Clang vector: one ymm register on AVX2, half a zmm on AVX-512, two q
// registers on NEON. Loads go through an unaligned, may_alias twin of the type (one vmovups;
// a memcpy into the vector went through the stack and stalled on store forwarding, 10x slower).
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

int fail(const std::string & msg) {
    g_last_error = msg;
    return -1;
}

}  // namespace

struct miita_state {
    int64_t n_embd = 0;

    // key: sum of selected rows of one per-layer tensor
    std::string key_name;
    std::vector<double> key_sum;   // double: prompts of thousands of rows, norms ~1e4
    int64_t key_rows = 0;
    std::vector<uint8_t> mask;     // per batch row; empty = all rows
    int64_t batch_rows_seen = 0;   // rows of the key tensor seen in the current llama_decode
    // per-sequence keys (miita_state_begin_groups): group of each batch row, -1 = none
    std::vector<int32_t> group;
    int64_t n_groups = 0;
    std::vector<double> group_sum;  // n_groups * n_embd
    std::vector<int64_t> group_rows;

    // capture of result_norm rows (pre-steer)
    bool capture = false;
    int64_t capture_max = 0;
    std::vector<float> captured;   // rows * n_embd
    int64_t captured_rows = 0;

    // steering
    int mode = MIITA_STEER_OFF;
    float eta = 0.0f;
    std::vector<float> dir;
    std::vector<float> h_q;
    float h_q_norm = 0.0f;
    std::vector<float> alphas;

    // stop the graph after result_norm (skip llama.cpp's LM-head product)
    bool stop_after_norm = false;

    // diagnostics
    std::string error;
    int64_t hits_key = 0;
    int64_t hits_norm = 0;
};

static const char * const k_result_norm = "result_norm";

static bool is_dense_f32(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F32 && t->data != nullptr && ggml_is_contiguous(t);
}

static void set_state_error(miita_state * st, const std::string & msg) {
    if (st->error.empty()) st->error = msg;
}

static void on_key_tensor(miita_state * st, const ggml_tensor * t) {
    st->hits_key++;
    if (!is_dense_f32(t) || t->ne[0] != st->n_embd) {
        set_state_error(st, std::string("key tensor ") + t->name + " is not a contiguous f32 [n_embd, rows] tensor");
        return;
    }
    const int64_t rows = ggml_nrows(t);
    const float * data = static_cast<const float *>(t->data);
    const int64_t H = st->n_embd;
    if (st->n_groups > 0) {
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t batch_row = st->batch_rows_seen + r;
            if (batch_row >= (int64_t) st->group.size()) {
                set_state_error(st, "key tensor has more rows than the batch's groups cover");
                break;
            }
            const int32_t g = st->group[batch_row];
            if (g < 0) continue;
            const float * row = data + r * H;
            double * acc = st->group_sum.data() + (int64_t) g * H;
            for (int64_t i = 0; i < H; ++i) acc[i] += row[i];
            st->group_rows[g]++;
        }
        st->batch_rows_seen += rows;
        return;
    }
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t batch_row = st->batch_rows_seen + r;
        if (!st->mask.empty()) {
            if (batch_row >= (int64_t) st->mask.size()) {
                set_state_error(st, "key tensor has more rows than the batch mask covers");
                break;
            }
            if (!st->mask[batch_row]) continue;
        }
        const float * row = data + r * H;
        double * acc = st->key_sum.data();
        for (int64_t i = 0; i < H; ++i) acc[i] += row[i];
        st->key_rows++;
    }
    st->batch_rows_seen += rows;
}

static void on_result_norm(miita_state * st, ggml_tensor * t) {
    st->hits_norm++;
    if (!is_dense_f32(t) || t->ne[0] != st->n_embd) {
        set_state_error(st, "result_norm is not a contiguous f32 [n_embd, rows] tensor");
        return;
    }
    const int64_t rows = ggml_nrows(t);
    const int64_t H = st->n_embd;
    float * data = static_cast<float *>(t->data);

    if (st->capture) {
        const int64_t take = std::min(rows, st->capture_max - st->captured_rows);
        if (take > 0) {
            std::memcpy(st->captured.data() + st->captured_rows * H, data, sizeof(float) * take * H);
            st->captured_rows += take;
        }
    }
    if (st->mode == MIITA_STEER_OFF || st->dir.empty()) return;

    const float * d = st->dir.data();
    for (int64_t r = 0; r < rows; ++r) {
        float * h = data + r * H;
        float alpha = 1.0f;
        if (st->mode == MIITA_STEER_GATED) {
            double dot = 0.0, nn = 0.0;
            for (int64_t i = 0; i < H; ++i) {
                dot += (double) h[i] * st->h_q[i];
                nn += (double) h[i] * h[i];
            }
            const double denom = std::sqrt(nn) * st->h_q_norm;
            const double c = denom > 0.0 ? dot / denom : 0.0;
            alpha = (float) std::max(0.0, c);
        }
        st->alphas.push_back(alpha);
        const float scale = st->eta * alpha;
        if (scale != 0.0f) {
            for (int64_t i = 0; i < H; ++i) h[i] += scale * d[i];
        }
    }
}

extern "C" {

const char * miita_last_error(void) { return g_last_error.c_str(); }

miita_state * miita_state_new(int64_t n_embd) {
    if (n_embd <= 0) {
        fail("n_embd must be positive");
        return nullptr;
    }
    auto * st = new miita_state();
    st->n_embd = n_embd;
    st->key_sum.assign(n_embd, 0.0);
    return st;
}

void miita_state_free(miita_state * st) { delete st; }

bool miita_eval_callback(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * st = static_cast<miita_state *>(user_data);
    if (st == nullptr || t == nullptr) return true;
    const bool is_norm = std::strcmp(t->name, k_result_norm) == 0;
    const bool is_key = !is_norm && !st->key_name.empty() && st->key_name == t->name;
    if (ask) {
        if (is_norm) return st->capture || st->mode != MIITA_STEER_OFF || st->stop_after_norm;
        return is_key;
    }
    if (is_key) on_key_tensor(st, t);
    else if (is_norm) {
        on_result_norm(st, t);
        // false makes the scheduler leave the rest of this graph split uncomputed and still report
        // success (ggml-backend.cpp, ggml_backend_sched_compute_splits); after result_norm that is
        // only the LM-head product, whose logits the caller then must not read.
        if (st->stop_after_norm) return false;
    }
    return true;  // otherwise never false: it would silently skip the rest of the split
}

int miita_state_set_stop_after_norm(miita_state * st, bool enabled) {
    if (!st) return fail("null state");
    st->stop_after_norm = enabled;
    return 0;
}

int miita_state_set_key_tensor(miita_state * st, const char * name) {
    if (!st) return fail("null state");
    st->key_name = name ? name : "";
    return 0;
}

void miita_state_key_reset(miita_state * st) {
    std::fill(st->key_sum.begin(), st->key_sum.end(), 0.0);
    st->key_rows = 0;
    st->batch_rows_seen = 0;
    st->n_groups = 0;
    st->group.clear();
}

int miita_state_begin_groups(miita_state * st, const int32_t * group, int64_t n, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups < 0 || n < 0 || (n > 0 && group == nullptr)) return fail("bad groups");
    for (int64_t i = 0; i < n; ++i) {
        if (group[i] < -1 || group[i] >= n_groups) return fail("group id out of range");
    }
    st->n_groups = n_groups;
    st->group.assign(group, group + n);
    st->group_sum.assign((size_t) (n_groups * st->n_embd), 0.0);
    st->group_rows.assign((size_t) n_groups, 0);
    st->batch_rows_seen = 0;
    return 0;
}

int miita_state_group_keys(const miita_state * st, float * sums_out, int64_t * rows_out, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups != st->n_groups) return fail("n_groups differs from the groups set");
    for (int64_t k = 0; k < n_groups * st->n_embd; ++k) sums_out[k] = (float) st->group_sum[k];
    for (int64_t g = 0; g < n_groups; ++g) rows_out[g] = st->group_rows[g];
    return 0;
}

int miita_state_begin_batch(miita_state * st, const uint8_t * mask, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && mask == nullptr)) return fail("bad mask");
    st->mask.assign(mask, mask + n);
    st->batch_rows_seen = 0;
    return 0;
}

int miita_state_key_get(const miita_state * st, float * sum_out, int64_t * n_rows_out) {
    if (!st) return fail("null state");
    for (int64_t i = 0; i < st->n_embd; ++i) sum_out[i] = (float) st->key_sum[i];
    *n_rows_out = st->key_rows;
    return 0;
}

int miita_state_set_capture(miita_state * st, bool enabled, int64_t max_rows) {
    if (!st) return fail("null state");
    if (max_rows < 0) return fail("max_rows must be >= 0");
    st->capture = enabled;
    st->capture_max = max_rows;
    st->captured.assign(max_rows * st->n_embd, 0.0f);
    st->captured_rows = 0;
    return 0;
}

int64_t miita_state_captured_rows(const miita_state * st) { return st->captured_rows; }

int miita_state_captured_get(const miita_state * st, float * out, int64_t max_rows) {
    const int64_t n = std::min(max_rows, st->captured_rows);
    std::memcpy(out, st->captured.data(), sizeof(float) * n * st->n_embd);
    return 0;
}

void miita_state_capture_clear(miita_state * st) { st->captured_rows = 0; }

int miita_state_set_steer(miita_state * st, const float * dir, const float * h_q, float eta, int mode) {
    if (!st) return fail("null state");
    if (mode < MIITA_STEER_OFF || mode > MIITA_STEER_GATED) return fail("unknown steer mode");
    if (!std::isfinite(eta)) return fail("eta must be finite");
    const int64_t H = st->n_embd;
    if (dir) st->dir.assign(dir, dir + H);
    if (h_q) {
        st->h_q.assign(h_q, h_q + H);
        double nn = 0.0;
        for (int64_t i = 0; i < H; ++i) nn += (double) h_q[i] * h_q[i];
        st->h_q_norm = (float) std::sqrt(nn);
    }
    if (mode != MIITA_STEER_OFF && st->dir.empty()) return fail("steering needs a direction");
    if (mode == MIITA_STEER_GATED && st->h_q.empty()) return fail("gated steering needs h_q");
    st->eta = eta;
    st->mode = mode;
    return 0;
}

int64_t miita_state_alpha_count(const miita_state * st) { return (int64_t) st->alphas.size(); }

int miita_state_alpha_get(const miita_state * st, float * out, int64_t max_n) {
    const int64_t n = std::min<int64_t>(max_n, st->alphas.size());
    std::memcpy(out, st->alphas.data(), sizeof(float) * n);
    return 0;
}

void miita_state_alpha_clear(miita_state * st) { st->alphas.clear(); }

int miita_state_error(const miita_state * st, char * err_out, size_t cap) {
    if (st->error.empty()) return 0;
    if (err_out && cap) std::snprintf(err_out, cap, "%s", st->error.c_str());
    return -1;
}

void miita_state_error_clear(miita_state * st) { st->error.clear(); }

int64_t miita_state_hits(const miita_state * st, int which) { return which == 0 ? st->hits_key : st->hits_norm; }

size_t miita_compiled_tensor_size(void) { return sizeof(struct ggml_tensor); }

int miita_bit_scores(const uint8_t * bits, int64_t n, int64_t H, const float * q, float * out) {
    if (n < 0 || H <= 0 || (n > 0 && (!bits || !q || !out))) return fail("bad bit_scores arguments");
    const int64_t nb = (H + 7) / 8;
    std::vector<float> lut(nb * 256);
    for (int64_t b = 0; b < nb; ++b) {
        for (int v = 0; v < 256; ++v) {
            float acc = 0.0f;
            for (int j = 0; j < 8; ++j) {
                const int64_t dim = 8 * b + j;
                if (dim >= H) break;
                acc += ((v >> (7 - j)) & 1) ? q[dim] : -q[dim];
            }
            lut[b * 256 + v] = acc;
        }
    }
    for (int64_t a = 0; a < n; ++a) {
        const uint8_t * row = bits + a * nb;
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) acc += lut[b * 256 + row[b]];
        out[a] = acc;
    }
    return 0;
}

}  // extern "C"

// ---------------------------------------------------------------------------
// LM-head kernels
// ---------------------------------------------------------------------------
namespace {

struct RowReader {
    const uint8_t * base = nullptr;
    size_t stride = 0;
    int64_t n_embd = 0;
    ggml_type type = GGML_TYPE_F32;
    ggml_to_float_t to_float = nullptr;

    // Q8_0 as ggml lays it out: blocks of {fp16 scale, 32 int8}; checked against the type traits
    bool is_q8_0() const { return type == GGML_TYPE_Q8_0 && q8_layout; }
    bool q8_layout = false;

    void read(int64_t row, float * out) const {
        const void * src = base + (size_t) row * stride;
        if (type == GGML_TYPE_F32) std::memcpy(out, src, sizeof(float) * n_embd);
        else to_float(src, out, n_embd);
    }
};

int make_reader(const void * W, int type, int64_t n_rows, int64_t n_embd, RowReader & rr) {
    if (!W) return fail("null LM-head pointer");
    if (type < 0 || type >= GGML_TYPE_COUNT) return fail("unknown ggml type " + std::to_string(type));
    if (n_rows <= 0 || n_embd <= 0) return fail("LM-head shape must be positive");
    const auto gt = (ggml_type) type;
    const auto * tr = ggml_get_type_traits(gt);
    if (tr == nullptr || tr->blck_size <= 0 || tr->type_size == 0)
        return fail(std::string("ggml type ") + std::to_string(type) + " has no row layout");
    if (n_embd % tr->blck_size != 0)
        return fail("n_embd is not a multiple of the block size of " + std::string(tr->type_name));
    if (gt != GGML_TYPE_F32 && tr->to_float == nullptr)
        return fail(std::string("ggml type ") + tr->type_name + " cannot be dequantized");
    rr.base = static_cast<const uint8_t *>(W);
    rr.stride = ggml_row_size(gt, n_embd);
    rr.n_embd = n_embd;
    rr.type = gt;
    rr.to_float = tr->to_float;
    rr.q8_layout = gt == GGML_TYPE_Q8_0 && tr->blck_size == 32 && tr->type_size == 34 && n_embd % 32 == 0;
    return 0;
}

// fp16 -> fp32 for all 65,536 bit patterns, from ggml's own conversion (256 KiB, built once)
const float * fp16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; ++i) t[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
        return t;
    }();
    return table.data();
}

int clamp_threads(int n_threads, int64_t work) {
    int n = n_threads > 0 ? n_threads : (int) std::max(1u, std::thread::hardware_concurrency());
    return (int) std::max<int64_t>(1, std::min<int64_t>(n, work));
}

template <typename F>
void parallel_for(int n_threads, int64_t n, F && fn) {
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

// Threads for a scan of n int8 rows of H, which runs right after a prompt pass: with OpenMP the
// scan goes to the pool whose workers are still spinning from llama.cpp's last parallel region,
// one thread per 512 KiB of rows. Without OpenMP a std::thread of ours would compete with those
// spinning workers instead (measured before OpenMP was used here: 2.9 ms with two threads vs
// 0.75 ms with one, 10,000 x 640 rows), so the scan stays on the calling thread.
int scan_threads(int64_t n, int64_t H) {
#if defined(_OPENMP)
    return clamp_threads(0, (n * H) >> 19);
#else
    (void) n;
    (void) H;
    return 1;
#endif
}

// The best k of x[b, e) under (value desc, index asc), in that order, into out.
// Returns whether x[b, n) holds a NaN (the vector passes test every value for it on the way).
bool top_k_range(const float * x, int64_t b, int64_t n, int64_t k, int32_t * out) {
    bool nan = false;
    if (k <= 0) {
        for (int64_t i = b; i < n; ++i) nan |= std::isnan(x[i]);
        return nan;
    }
    // a min-heap of the best k under the order (value desc, index asc): exactly the first k of a
    // stable descending sort; one pass, most elements rejected by one comparison with the root.
    // Every element already in the heap has a lower index than the one scanned, so an element
    // equal to the root's value loses the tie: only x[v] > root can enter.
    auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    std::vector<int32_t> heap;
    heap.reserve(k);
    auto offer = [&](int64_t i) {
        const int32_t v = (int32_t) i;
        if ((int64_t) heap.size() < k) {
            heap.push_back(v);
            std::push_heap(heap.begin(), heap.end(), better);
        } else if (better(v, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = v;
            std::push_heap(heap.begin(), heap.end(), better);
        }
    };
    int64_t i = b;
    for (; i < n && (int64_t) heap.size() < k; ++i) {
        nan |= std::isnan(x[i]);
        offer(i);
    }
#if defined(__AVX512F__)
    // 16 values per compare against the root; only the lanes above it take the scalar path
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0;
        __mmask16 m = _mm512_cmp_ps_mask(v, _mm512_set1_ps(x[heap.front()]), _CMP_GT_OQ);
        while (m) {
            const int lane = __builtin_ctz(m);
            m &= m - 1;
            offer(i + lane);
        }
    }
#else
    // 64 values per test (vector maxima, one horizontal max): only a block whose maximum beats
    // the root goes through offer(), which almost none do once the heap is full
    i32x8 bad = i32x8{};
    for (; i + 64 <= n; i += 64) {
        f32x8 m = load8(x + i);
        bad |= m != m;
        for (int j = 8; j < 64; j += 8) {
            const f32x8 v = load8(x + i + j);
            bad |= v != v;
            m = m > v ? m : v;
        }
        if (hmax8(m) > x[heap.front()])
            for (int64_t j = i; j < i + 64; ++j) offer(j);
    }
    for (int j = 0; j < 8; ++j) nan |= bad[j] != 0;
#endif
    for (; i < n; ++i) {
        nan |= std::isnan(x[i]);
        offer(i);
    }
    std::sort_heap(heap.begin(), heap.end(), better);
    std::copy(heap.begin(), heap.end(), out);
    return nan;
}

int check_ids(const int32_t * ids, int64_t n, int64_t n_rows) {
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= n_rows)
            return fail("token id " + std::to_string(ids[i]) + " is outside the vocabulary (" + std::to_string(n_rows) + ")");
    return 0;
}

// sum_h q[h] * r[h] over int8 r
inline float dot_f32_i8(const float * q, const int8_t * r, int64_t H) {
    int64_t h = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    for (; h + 32 <= H; h += 32) {
        const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(r + h));
        const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(r + h + 16));
        a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b0)), _mm512_loadu_ps(q + h), a0);
        a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b1)), _mm512_loadu_ps(q + h + 16), a1);
    }
    s = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
#else
    // a fixed-width loop over 32 independent lanes: GCC vectorises it (4 FMA chains with
    // sign-extending int8 -> float conversion); __builtin_convertvector(int8 -> float) did not
    float acc[32] = {};
    for (; h + 32 <= H; h += 32)
        for (int j = 0; j < 32; ++j) acc[j] += q[h + j] * (float) r[h + j];
    // pairwise over the lanes (vector adds); a running s += acc[j] is a 32-add latency chain per row
    for (int w = 16; w >= 1; w /= 2)
        for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    s = acc[0];
#endif
    for (; h < H; ++h) s += q[h] * (float) r[h];
    return s;
}

// sum_h r[h] * k[h] in int32 (the caller keeps it from overflowing): integers may be
// reassociated, so this plain loop vectorises (vpmovsxbw + vpmaddwd on AVX2).
inline int32_t dot_i8_i16(const int8_t * r, const int16_t * k, int64_t H) {
    int32_t s = 0;
    for (int64_t h = 0; h < H; ++h) s += (int32_t) r[h] * (int32_t) k[h];
    return s;
}

// The argument checks of miita_i8_recall (on the calling thread: fail() keeps its message per thread).
int i8_recall_check(const int8_t * rows, const float * scales, const float * errs, int64_t n, int64_t H,
                    const int64_t * seg_start, int64_t & n_seg, const float * q, int64_t R, int64_t * out) {
    if (n < 0 || H <= 0 || R < 0 || (n > 0 && (!rows || !scales || !errs || !q || !out)))
        return fail("bad i8_recall arguments");
    if (!seg_start) n_seg = n;
    if (n_seg < 0 || n_seg > n || (n > 0 && n_seg == 0)) return fail("bad i8_recall segments");
    for (int64_t g = 0; seg_start && g < n_seg; ++g)
        if (seg_start[g] < 0 || seg_start[g] >= n || (g > 0 && seg_start[g] <= seg_start[g - 1]) ||
            (g == 0 && seg_start[0] != 0))
            return fail("i8_recall: segment starts must rise strictly from 0 and stay below the row count");
    return 0;
}

// The scan of miita_i8_recall on n_threads threads, after i8_recall_check.
int64_t i8_recall_scan(const int8_t * rows, const float * scales, const float * errs, int64_t n, int64_t H,
                       const int64_t * seg_start, int64_t n_seg, const float * q, int64_t R, int64_t * out,
                       int n_threads) {
    if (n_seg == 0 || R == 0) return 0;
    // The query is rounded to int16, u_hat = sigma * k, so that each row's dot product is an
    // integer sum (int8 x int16 -> int32: pmaddwd on x86, smlal on Arm; a float dot spends most
    // of its time converting int8 to float). L keeps |sum| <= 127 L H < 2^31.
    const int64_t L = std::max<int64_t>(1, std::min<int64_t>(16383, INT32_MAX / (127 * H)));
    double umax = 0.0;
    for (int64_t h = 0; h < H; ++h) umax = std::max(umax, (double) std::fabs(q[h]));
    const double sigma = umax > 0.0 ? umax / (double) L : 0.0;
    std::vector<int16_t> kq(H);
    double e2 = 0.0;
    for (int64_t h = 0; h < H; ++h) {
        kq[h] = sigma > 0.0 ? (int16_t) std::lrint(q[h] / sigma) : 0;
        const double d = (double) q[h] - sigma * kq[h];
        e2 += d * d;
    }
    // |s (u . q_a) - s (u_hat . q_a)| <= s ||q_a|| ||u - u_hat|| <= s * 127 sqrt(H) * ||u - u_hat||
    const double qerr = 127.0 * std::sqrt((double) H) * std::sqrt(e2) * (1.0 + 1e-6);
    // Per segment (a prototype's anchors, or one row), the bounds of its max score:
    // [max(approx - slack), max(approx + slack)], slack = the row's residual norm (Cauchy-Schwarz
    // for the int8 row) + the query-rounding term above + 1e-5 (float32 rounding of the exact
    // re-score, a blocked 640-term sum, and of these bounds).
    std::vector<float> lo(n_seg), hi(n_seg);
    parallel_for(n_threads, n_seg, [&](int, int64_t gb, int64_t ge) {
        for (int64_t g = gb; g < ge; ++g) {
            const int64_t b = seg_start ? seg_start[g] : g;
            const int64_t e = seg_start ? (g + 1 < n_seg ? seg_start[g + 1] : n) : g + 1;
            float l = -INFINITY, h = -INFINITY;
            for (int64_t a = b; a < e; ++a) {
                const float s = (float) ((double) scales[a] * sigma * (double) dot_i8_i16(rows + a * H, kq.data(), H));
                const float slack = errs[a] + (float) (scales[a] * qerr) + 1e-5f;
                l = std::max(l, s - slack);
                h = std::max(h, s + slack);
            }
            lo[g] = l;
            hi[g] = h;
        }
    });
    float theta = -INFINITY;
    if (n_seg >= R) {  // the R-th largest lower bound: no segment below it can be in Top_R
        std::vector<float> tmp(lo);
        std::nth_element(tmp.begin(), tmp.begin() + (R - 1), tmp.end(), std::greater<float>());
        theta = tmp[R - 1];
    }
    int64_t m = 0;
    for (int64_t g = 0; g < n_seg; ++g)
        if (hi[g] >= theta) out[m++] = g;
    return m;
}

// a[j] += s * qs[j] for one Q8_0 block of 32
inline void axpy_q8_block(float * a, float s, const int8_t * qs) {
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(s);
    const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
    const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs + 16));
    _mm512_storeu_ps(a, _mm512_fmadd_ps(vs, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b0)), _mm512_loadu_ps(a)));
    _mm512_storeu_ps(a + 16, _mm512_fmadd_ps(vs, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b1)), _mm512_loadu_ps(a + 16)));
#else
    for (int j = 0; j < 32; ++j) a[j] += s * (float) qs[j];
#endif
}

#if defined(__AVX512F__) && defined(__F16C__)
// exp(x) for a vector of x <= 0 (softmax terms after the max is subtracted): Cody-Waite range
// reduction x = n ln2 + r, |r| <= ln2/2, a degree-7 Taylor polynomial for e^r (truncation error
// < 3e-9, below float32 rounding) and 2^n by scalef. Relative error ~1-2 ulp against std::exp;
// arguments below -87.3 give (denormal or) zero terms, as std::exp's float result does.
inline __m512 exp_ps_nonpos(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// Exact R_m = mean_t W[y_t] - W^T pbar for a Q8_0 LM head (the paper preset's `mean` payload).
// Why a kernel of its own: this pass reads the whole 262,144-row head once per ingested example,
// and the generic loop spent most of its time elsewhere than reading it: two scalar exp passes
// (normaliser, then p) over T x V logits, and a load + store of the accumulator per 32-value
// block. Here the exps are one vectorised pass that writes e_t(v) = exp(z_t(v) - max_t) and sums
// Z_t, and the weight pbar(v) = sum_t e_t(v) / (T Z_t) is formed per row inside the head pass,
// which walks the rows in order (a tiled walk that kept accumulators in registers was 3x slower:
// it defeats the prefetcher, docs/benchmarks.md). E_out = W^T pbar; same sum as the generic path
// up to float reassociation.
int correction_mean_q8(const RowReader & rr, int64_t V, int64_t H, const float * logits, int64_t T,
                       float * E_out, int n_threads) {
    const int nt = clamp_threads(n_threads, V / 8192 + 1);
    std::vector<float> lmax(T, -INFINITY);
    std::vector<float> e((size_t) T * V);
    std::vector<double> Z(T, 0.0);
    {
        std::vector<float> pm((size_t) nt * T, -INFINITY);
        parallel_for(nt, V, [&](int ti, int64_t b, int64_t en) {
            for (int64_t t = 0; t < T; ++t) {
                const float * l = logits + t * V;
                __m512 m = _mm512_set1_ps(-INFINITY);
                int64_t v = b;
                for (; v + 16 <= en; v += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(l + v));
                float mm = _mm512_reduce_max_ps(m);
                for (; v < en; ++v) mm = std::max(mm, l[v]);
                pm[ti * T + t] = mm;
            }
        });
        for (int64_t t = 0; t < T; ++t)
            for (int i = 0; i < nt; ++i) lmax[t] = std::max(lmax[t], pm[i * T + t]);
        for (int64_t t = 0; t < T; ++t)
            if (!std::isfinite(lmax[t])) return fail("logits contain non-finite values");
        std::vector<double> ps((size_t) nt * T, 0.0);
        parallel_for(nt, V, [&](int ti, int64_t b, int64_t en) {
            for (int64_t t = 0; t < T; ++t) {
                const float * l = logits + t * V;
                float * et = e.data() + t * V;
                const __m512 vm = _mm512_set1_ps(lmax[t]);
                double s = 0.0;
                int64_t v = b;
                while (v + 16 <= en) {  // float partial sums of <= 1024 terms, then double
                    __m512 acc = _mm512_setzero_ps();
                    const int64_t stop = std::min(en, v + 1024);
                    for (; v + 16 <= stop; v += 16) {
                        const __m512 x = exp_ps_nonpos(_mm512_sub_ps(_mm512_loadu_ps(l + v), vm));
                        _mm512_storeu_ps(et + v, x);
                        acc = _mm512_add_ps(acc, x);
                    }
                    s += (double) _mm512_reduce_add_ps(acc);
                }
                for (; v < en; ++v) {
                    et[v] = std::exp(l[v] - lmax[t]);
                    s += et[v];
                }
                ps[ti * T + t] = s;
            }
        });
        for (int64_t t = 0; t < T; ++t)
            for (int i = 0; i < nt; ++i) Z[t] += ps[i * T + t];
        for (int64_t t = 0; t < T; ++t)
            if (!(Z[t] > 0.0) || !std::isfinite(Z[t])) return fail("logits contain non-finite values");
    }
    std::vector<float> c(T);
    for (int64_t t = 0; t < T; ++t) c[t] = (float) (1.0 / ((double) T * Z[t]));

    const int64_t NB = H / 32;
    std::vector<std::vector<float>> acc(nt, std::vector<float>(H, 0.0f));
    parallel_for(nt, V, [&](int ti, int64_t b, int64_t en) {
        float * a = acc[ti].data();
        for (int64_t v = b; v < en; ++v) {
            float w = 0.0f;
            for (int64_t t = 0; t < T; ++t) w += c[t] * e[t * V + v];
            const uint8_t * src = rr.base + (size_t) v * rr.stride;
            for (int64_t blk = 0; blk < NB; ++blk) {
                const uint8_t * bp = src + blk * 34;
                uint16_t hb;
                std::memcpy(&hb, bp, 2);
                axpy_q8_block(a + blk * 32, _cvtsh_ss(hb) * w, reinterpret_cast<const int8_t *>(bp + 2));
            }
        }
    });
    std::fill(E_out, E_out + H, 0.0f);
    for (int ti = 0; ti < nt; ++ti)
        for (int64_t k = 0; k < H; ++k) E_out[k] += acc[ti][k];
    return 0;
}
#endif


// ---------------------------------------------------------------------------
// Eq. 2 from final hidden states: one pass over the head with an online softmax
// ---------------------------------------------------------------------------
// Why: computing R_t = W[y_t] - W^T softmax(W h_t) from llama.cpp's logits reads the 178 MB head
// twice per example (llama.cpp's LM-head product at the T answer positions, then the W^T p pass),
// and the second read comes from DRAM. From the captured h_t, one pass suffices: each row w_v is
// read once, its T logits z_t(v) = w_v . h_t are formed, and sum_v exp(z_t(v) - m_t) w_v is
// accumulated with a running maximum m_t (rescaling the sums when m_t rises, as flash attention
// does). The caller stops llama.cpp's graph after result_norm, so the head is read once in all.
//
// Terms with z_t(v) < m_t - kDropLogit (m_t the running maximum, never above the final one) are
// skipped: each has p_t(v) < e^-32 / 1 and all V of them together < V e^-32 = 3.3e-9 of the
// probability mass for V = 262,144, below float32's resolution of the result (6e-8).
constexpr float kDropLogit = 32.0f;

struct OnlineSoftmaxAcc {
    std::vector<float> m;     // T running maxima
    std::vector<double> Z;    // T sums of exp(z - m)
    std::vector<float> acc;   // T x H sums of exp(z - m) w
    void init(int64_t T, int64_t H) {
        m.assign(T, -INFINITY);
        Z.assign(T, 0.0);
        acc.assign((size_t) T * H, 0.0f);
    }
};

// Portable SIMD: fixed-width loops over independent lanes, which GCC/Clang at -O3 turn into
// AVX2, AVX-512 or NEON code alike (a plain `s += a[k] * b[k]` stays scalar: reassociating a
// float sum is not allowed without -ffast-math). The kernels below are on the ingest path of
// every CPU the product targets, so they must not depend on one instruction set.

inline void scale_f32(float * y, float s, int64_t H) {
    for (int64_t k = 0; k < H; ++k) y[k] *= s;
}

// fp16 -> fp32: one instruction with F16C; the table is an L2 load per block
inline float fp16_to_f32(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return fp16_table()[h];
#endif
}

// 8 int8 as 8 floats: two instructions with AVX2 (vpmovsxbd from memory, vcvtdq2ps)
inline f32x8 cvt8_i8(const int8_t * q) {
#if defined(__AVX2__)
    return (f32x8) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(q))));
#else
    f32x8 r;
    for (int j = 0; j < 8; ++j) r[j] = (float) q[j];
    return r;
#endif
}

// One Q8_0 row as float, times `scale` (folded into each block's scale). With AVX2 each 8 int8
// become 8 floats in two instructions (cvt8_i8); GCC's own vectorisation of the plain loop widens
// through int16 with extracts (25 instructions a block instead of 16), which made the
// dequantisation the largest item of the head pass.
inline void dequant_q8_row(const uint8_t * src, int64_t NB, float * out, float scale = 1.0f) {
    for (int64_t blk = 0; blk < NB; ++blk) {
        const uint8_t * bp = src + blk * 34;
        uint16_t hb;
        std::memcpy(&hb, bp, 2);
        const f32x8 d = f32x8{} + scale * fp16_to_f32(hb);
        const int8_t * qs = reinterpret_cast<const int8_t *>(bp + 2);
        for (int j = 0; j < 32; j += 8) store8(out + blk * 32 + j, d * cvt8_i8(qs + j));
    }
}

// One row of the head as float: Q8_0 by dequant_q8_row, else ggml's to_float.
inline void read_row_f32(const RowReader & rr, int64_t v, float * out) {
    if (rr.is_q8_0()) {
        dequant_q8_row(rr.base + (size_t) v * rr.stride, rr.n_embd / 32, out);
        return;
    }
    rr.read(v, out);
}

// e^x for 8 lanes of x <= 0 (softmax terms after the maximum is subtracted), in portable vector
// code: Cody-Waite reduction x = n ln2 + r with |r| <= ln2/2, a degree-7 Taylor polynomial for e^r
// (truncation error < 3e-9, below float32 rounding) and 2^n built in the exponent bits. Relative
// error 1-2 ulp against std::exp (tests/test_native_types.py compares both passes with float64).
// Arguments below -87.3 are clamped there (the caller zeroes terms below -kDropLogit anyway).
inline f32x8 exp8_nonpos(f32x8 x) {
    x = x < -87.3f ? f32x8{} - 87.3f : x;
    const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const f32x8 n = (x * 1.44269504088896341f + magic) - magic;
    f32x8 r = x - n * 0.693145751953125f;
    r = r - n * 1.428606765330187e-06f;
    f32x8 p = f32x8{} + 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const i32x8 bits = (__builtin_convertvector(n, i32x8) + 127) << 23;
    return p * reinterpret_cast<const f32x8 &>(bits);
}

// z[t][r] = w_r . h_t for R consecutive float rows (stride H) and TC hidden rows: R*TC independent
// accumulators (<= 8) keep both FMA units busy whatever T is, each row and hidden vector is
// loaded once per 8 lanes.
template <int R, int TC>
inline void dots_block(const float * w, const float * h, int64_t H, float * z, int zstride) {
    f32x8 a[TC][R];
    for (int t = 0; t < TC; ++t)
        for (int r = 0; r < R; ++r) a[t][r] = f32x8{};
    int64_t k = 0;
    for (; k + 8 <= H; k += 8) {
        f32x8 x[R];
        for (int r = 0; r < R; ++r) x[r] = load8(w + r * H + k);
        for (int t = 0; t < TC; ++t) {
            const f32x8 ht = load8(h + t * H + k);
            for (int r = 0; r < R; ++r) a[t][r] += x[r] * ht;
        }
    }
    for (int t = 0; t < TC; ++t)
        for (int r = 0; r < R; ++r) {
            float s = hsum8(a[t][r]);
            for (int64_t kk = k; kk < H; ++kk) s += w[r * H + kk] * h[t * H + kk];
            z[t * zstride + r] = s;
        }
}

// acc_t += sum_g e_t(g) w_g for TC accumulator rows and G float rows. C 8-lane slices of the TC
// accumulators stay in registers over the G rows (loaded and stored once per G rows); each e_t(g)
// is broadcast once and used for the C slices. Loads per row and slice step: C + TC for C * TC
// FMAs, so the FMA units, not the load ports, set the pace once C * TC >= 4.
template <int G, int TC, int C>
inline void axpy_block(float * acc, const float * e, const float * w, int64_t H) {
    int64_t k = 0;
    for (; k + 8 * C <= H; k += 8 * C) {
        f32x8 a[TC][C];
        for (int t = 0; t < TC; ++t)
            for (int c = 0; c < C; ++c) a[t][c] = load8(acc + t * H + k + 8 * c);
        for (int g = 0; g < G; ++g) {
            f32x8 x[C];
            for (int c = 0; c < C; ++c) x[c] = load8(w + g * H + k + 8 * c);
            for (int t = 0; t < TC; ++t) {
                const f32x8 b = f32x8{} + e[t * G + g];
                for (int c = 0; c < C; ++c) a[t][c] += x[c] * b;
            }
        }
        for (int t = 0; t < TC; ++t)
            for (int c = 0; c < C; ++c) store8(acc + t * H + k + 8 * c, a[t][c]);
    }
    for (; k < H; ++k)
        for (int t = 0; t < TC; ++t)
            for (int g = 0; g < G; ++g) acc[t * H + k] += e[t * G + g] * w[g * H + k];
}

constexpr int kGroup = 8;  // head rows per step of the online softmax (8 float rows: 20 KiB for H = 640)

// The T positions in chunks of at most 4 (accumulator registers), G rows per dots_block call so
// that R * TC <= 8.
template <int TC>
void dots_group(const float * buf, const float * h, int64_t H, float * z) {
    constexpr int R = TC == 1 ? 8 : TC == 2 ? 4 : 2;
    for (int r0 = 0; r0 < kGroup; r0 += R) dots_block<R, TC>(buf + r0 * H, h, H, z + r0, kGroup);
}

void dots_all(const float * buf, const float * hidden, int64_t T, int64_t H, float * z) {
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
        const float * h = hidden + t0 * H;
        float * zt = z + t0 * kGroup;
        switch (std::min<int64_t>(4, T - t0)) {
            case 1: dots_group<1>(buf, h, H, zt); break;
            case 2: dots_group<2>(buf, h, H, zt); break;
            case 3: dots_group<3>(buf, h, H, zt); break;
            default: dots_group<4>(buf, h, H, zt); break;
        }
    }
}

void axpy_all(float * acc, const float * ez, const float * buf, int64_t T, int64_t H) {
    for (int64_t t0 = 0; t0 < T; t0 += 4) {
        float * a = acc + t0 * H;
        const float * e = ez + t0 * kGroup;
        switch (std::min<int64_t>(4, T - t0)) {
            case 1: axpy_block<kGroup, 1, 4>(a, e, buf, H); break;
            case 2: axpy_block<kGroup, 2, 4>(a, e, buf, H); break;
            case 3: axpy_block<kGroup, 3, 2>(a, e, buf, H); break;
            default: axpy_block<kGroup, 4, 2>(a, e, buf, H); break;
        }
    }
}

// Rows [b, e) of the head into one thread's online-softmax sums for the T hidden rows. Rows are
// taken kGroup at a time and in order, so the walk over the head stays sequential (a strided walk
// defeats the prefetcher: docs/benchmarks.md): dequantise the group into an L1-resident buffer,
// form its T x kGroup logits, update each running maximum once per group (rescaling the sums
// when it rises), exponentiate 8 logits at once, then add the group into the T sums.
void online_softmax_rows(const RowReader & rr, const float * hidden, int64_t T, int64_t b, int64_t e,
                         OnlineSoftmaxAcc & st) {
    const int64_t H = rr.n_embd;
    std::vector<float> buf((size_t) kGroup * H, 0.0f);
    std::vector<float> z((size_t) T * kGroup);
    std::vector<float> eb((size_t) T * kGroup);
    for (int64_t v = b; v < e; v += kGroup) {
        const int n = (int) std::min<int64_t>(kGroup, e - v);
        for (int g = 0; g < n; ++g) read_row_f32(rr, v + g, buf.data() + g * H);
        if (n < kGroup) std::fill(buf.begin() + (size_t) n * H, buf.end(), 0.0f);
        dots_all(buf.data(), hidden, T, H, z.data());
        for (int64_t t = 0; t < T; ++t) {
            float * zt = z.data() + t * kGroup;
            for (int g = n; g < kGroup; ++g) zt[g] = -INFINITY;  // rows past e: no term
            const f32x8 zv = load8(zt);
            const float zmax = hmax8(zv);
            float & m = st.m[t];
            if (zmax > m) {  // a new maximum: rescale what was summed under the old one
                if (m != -INFINITY) {
                    const float r = std::exp(m - zmax);
                    st.Z[t] *= r;
                    scale_f32(st.acc.data() + t * H, r, H);
                }
                m = zmax;
            }
            const f32x8 dz = zv - m;
            f32x8 ev = exp8_nonpos(dz);
            ev = dz < -kDropLogit ? f32x8{} : ev;
            st.Z[t] += (double) hsum8(ev);
            store8(eb.data() + t * kGroup, ev);
        }
        axpy_all(st.acc.data(), eb.data(), buf.data(), T, H);
    }
}


// a += sum of 8 rows (stride H) as a tree: the adds of one 8-lane slice do not wait on each other
inline void sum8_rows_into(float * a, const float * r, int64_t H) {
    int64_t k = 0;
    for (; k + 8 <= H; k += 8) {
        const f32x8 s0 = load8(r + k) + load8(r + H + k), s1 = load8(r + 2 * H + k) + load8(r + 3 * H + k);
        const f32x8 s2 = load8(r + 4 * H + k) + load8(r + 5 * H + k), s3 = load8(r + 6 * H + k) + load8(r + 7 * H + k);
        store8(a + k, load8(a + k) + ((s0 + s1) + (s2 + s3)));
    }
    for (; k < H; ++k) {
        float s = 0.0f;
        for (int g = 0; g < 8; ++g) s += r[g * H + k];
        a[k] += s;
    }
}

// E = W^T pbar, pbar(v) = (1/T) sum_t softmax(l_t)(v), from T rows of logits (the mean payload's
// R_m by linearity: one weighted sum of the rows, not T). Portable vector code throughout.
// Why a kernel of its own: the generic loop spent most of its time elsewhere than reading the
// head: two scalar exp passes over T x V logits and a load + store of the accumulator per row
// block. Here the exps are one vectorised pass (e_t(v) = exp(l_t(v) - max_t), Z_t summed), and
// the head pass takes 8 rows at a time: their weights pbar(v) come from the e_t in one vector,
// and each 32-float slice of the accumulator is loaded and stored once per 8 rows.
int correction_mean_rows(const RowReader & rr, int64_t V, int64_t H, const float * logits, int64_t T,
                         float * E_out, int n_threads) {
    const int nt = clamp_threads(n_threads, V / 8192 + 1);
    std::vector<float> lmax(T, -INFINITY);
    std::vector<float> pm((size_t) nt * T, -INFINITY);
    parallel_for(nt, V, [&](int ti, int64_t b, int64_t e) {
        for (int64_t t = 0; t < T; ++t) {
            const float * l = logits + t * V;
            f32x8 m = f32x8{} - INFINITY;
            int64_t v = b;
            for (; v + 8 <= e; v += 8) {
                const f32x8 x = load8(l + v);
                m = x > m ? x : m;
            }
            float mm = hmax8(m);
            for (; v < e; ++v) mm = std::max(mm, l[v]);
            pm[ti * T + t] = mm;
        }
    });
    for (int64_t t = 0; t < T; ++t) {
        for (int i = 0; i < nt; ++i) lmax[t] = std::max(lmax[t], pm[i * T + t]);
        if (!std::isfinite(lmax[t])) return fail("logits contain non-finite values");
    }
    std::vector<float> ev((size_t) T * V);
    std::vector<double> ps((size_t) nt * T, 0.0);
    parallel_for(nt, V, [&](int ti, int64_t b, int64_t e) {
        for (int64_t t = 0; t < T; ++t) {
            const float * l = logits + t * V;
            float * et = ev.data() + t * V;
            double s = 0.0;
            int64_t v = b;
            while (v + 8 <= e) {  // float partial sums of <= 1024 terms, then double
                f32x8 acc = f32x8{};
                const int64_t stop = std::min(e, v + 1024);
                for (; v + 8 <= stop; v += 8) {
                    const f32x8 x = exp8_nonpos(load8(l + v) - lmax[t]);
                    store8(et + v, x);
                    acc += x;
                }
                s += (double) hsum8(acc);
            }
            for (; v < e; ++v) {
                et[v] = std::exp(l[v] - lmax[t]);
                s += et[v];
            }
            if (!std::isfinite(s)) s = NAN;
            ps[ti * T + t] = s;
        }
    });
    std::vector<float> c(T);
    for (int64_t t = 0; t < T; ++t) {
        double Z = 0.0;
        for (int i = 0; i < nt; ++i) Z += ps[i * T + t];
        if (!(Z > 0.0) || !std::isfinite(Z)) return fail("logits contain non-finite values");
        c[t] = (float) (1.0 / ((double) T * Z));
    }
    std::vector<std::vector<float>> acc(nt, std::vector<float>(H, 0.0f));
    parallel_for(nt, V, [&](int ti, int64_t b, int64_t e) {
        float * a = acc[ti].data();
        int64_t v = b;
        if (rr.is_q8_0()) {
            const int64_t NB = H / 32;
            std::vector<float> buf((size_t) 8 * H);
            for (; v + 8 <= e; v += 8) {
                f32x8 w = f32x8{};
                for (int64_t t = 0; t < T; ++t) w += c[t] * load8(ev.data() + t * V + v);
                // each row dequantised with its weight folded into the block scale, in order (the
                // walk the prefetcher follows), into an L1 buffer; then the 8 rows summed as a tree
                // into the accumulator. Visiting the 8 rows block by block with the sums in
                // registers was 2-3x slower (bench/extract.py, docs/benchmarks.md), and so was a
                // load-FMA-store of the accumulator per row.
                for (int g = 0; g < 8; ++g)
                    dequant_q8_row(rr.base + (size_t) (v + g) * rr.stride, NB, buf.data() + g * H, w[g]);
                sum8_rows_into(a, buf.data(), H);
            }
        }
        std::vector<float> row(H);
        for (; v < e; ++v) {
            float w = 0.0f;
            for (int64_t t = 0; t < T; ++t) w += c[t] * ev[t * V + v];
            read_row_f32(rr, v, row.data());
            for (int64_t k = 0; k < H; ++k) a[k] += w * row[k];
        }
    });
    std::fill(E_out, E_out + H, 0.0f);
    for (int ti = 0; ti < nt; ++ti)
        for (int64_t k = 0; k < H; ++k) E_out[k] += acc[ti][k];
    return 0;
}

// out = W[y_t] - E[t] per position (T x H), or their mean (H): the last step of eq. 2 for
// both routes, from E[t] = sum_v p_t(v) W[v] (T x H).
void corrections_from_expectations(const RowReader & rr, const int32_t * targets, int64_t T, const float * E,
                                   int per_position, float * out) {
    const int64_t H = rr.n_embd;
    std::vector<float> wy(H);
    if (!per_position) std::fill(out, out + H, 0.0f);
    for (int64_t t = 0; t < T; ++t) {
        rr.read(targets[t], wy.data());
        for (int64_t k = 0; k < H; ++k) {
            const float r = wy[k] - E[t * H + k];
            if (per_position) out[t * H + k] = r;
            else out[k] += r / (float) T;
        }
    }
}

}  // namespace

extern "C" {

int miita_lm_correction_hidden(const void * W, int type, int64_t n_rows, int64_t n_embd, const float * hidden,
                               const int32_t * targets, int64_t T, int per_position, float * out, int n_threads) {
    RowReader rr;
    if (T <= 0) return fail("correction needs at least one target position");
    if (!hidden || !out) return fail("null hidden or output pointer");
    if (make_reader(W, type, n_rows, n_embd, rr) || check_ids(targets, T, n_rows)) return -1;
    const int64_t V = n_rows, H = n_embd;
    for (int64_t i = 0; i < T * H; ++i)
        if (!std::isfinite(hidden[i])) return fail("hidden states contain non-finite values");
    const int nt = clamp_threads(n_threads, V / 8192 + 1);
    std::vector<OnlineSoftmaxAcc> parts(nt);
    for (auto & p : parts) p.init(T, H);
    parallel_for(nt, V, [&](int ti, int64_t b, int64_t e) { online_softmax_rows(rr, hidden, T, b, e, parts[ti]); });
    // merge the threads' sums onto the global maximum: E_t = sum_i acc_i e^(m_i - m) / sum_i Z_i e^(m_i - m)
    std::vector<float> E((size_t) T * H, 0.0f);
    for (int64_t t = 0; t < T; ++t) {
        float m = -INFINITY;
        for (const auto & p : parts) m = std::max(m, p.m[t]);
        if (!std::isfinite(m)) return fail("logits contain non-finite values");
        double Z = 0.0;
        std::vector<double> e(H, 0.0);
        for (const auto & p : parts) {
            if (p.m[t] == -INFINITY) continue;
            const double r = std::exp((double) p.m[t] - m);
            Z += p.Z[t] * r;
            const float * a = p.acc.data() + t * H;
            for (int64_t k = 0; k < H; ++k) e[k] += r * a[k];
        }
        if (!(Z > 0.0) || !std::isfinite(Z)) return fail("logits contain non-finite values");
        for (int64_t k = 0; k < H; ++k) E[t * H + k] = (float) (e[k] / Z);
    }
    corrections_from_expectations(rr, targets, T, E.data(), per_position, out);
    return 0;
}

int miita_i8_scores(const int8_t * rows, const float * scales, int64_t n, int64_t H, const float * q,
                    float * out) {
    if (n < 0 || H <= 0 || (n > 0 && (!rows || !scales || !q || !out))) return fail("bad i8_scores arguments");
    parallel_for(scan_threads(n, H), n, [&](int, int64_t b, int64_t e) {
        for (int64_t a = b; a < e; ++a) out[a] = scales[a] * dot_f32_i8(q, rows + a * H, H);
    });
    return 0;
}

int miita_top_k(const float * x, int64_t n, int64_t k, int32_t * out) {
    if (n < 0 || k < 0 || k > n || (k > 0 && (!x || !out))) return fail("bad top_k arguments");
    // Split over the scan threads (the logits are 1 MiB for a 262,144-token vocabulary): each
    // keeps the best k of its range, then the nt * k candidates are ordered by the same total
    // order, so the result is the single-pass one exactly.
    const int nt = (int) std::min<int64_t>(scan_threads(n, 4), n / std::max<int64_t>(k, 1));
    if (nt <= 1) return top_k_range(x, 0, n, k, out) ? fail("values contain NaN") : 0;
    std::vector<int32_t> cand((size_t) nt * k, -1);
    std::vector<char> nan(nt, 0);
    parallel_for(nt, n, [&](int ti, int64_t b, int64_t e) {
        nan[ti] = top_k_range(x, b, e, std::min<int64_t>(k, e - b), cand.data() + (size_t) ti * k);
    });
    if (std::find(nan.begin(), nan.end(), 1) != nan.end()) return fail("values contain NaN");
    cand.erase(std::remove(cand.begin(), cand.end(), -1), cand.end());
    auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), better);
    std::copy(cand.begin(), cand.begin() + k, out);
    return 0;
}

int64_t miita_i8_recall(const int8_t * rows, const float * scales, const float * errs, int64_t n, int64_t H,
                        const int64_t * seg_start, int64_t n_seg, const float * q, int64_t R, int64_t * out) {
    if (i8_recall_check(rows, scales, errs, n, H, seg_start, n_seg, q, R, out)) return -1;
    return i8_recall_scan(rows, scales, errs, n, H, seg_start, n_seg, q, R, out, scan_threads(n, H));
}

int miita_i8_recall_pair(const int8_t * rows_a, const float * scales_a, const float * errs_a, int64_t n_a,
                         const int64_t * seg_start_a, int64_t n_seg_a, const float * q_a, int64_t R_a,
                         int64_t * out_a, int64_t * m_a,
                         const int8_t * rows_b, const float * scales_b, const float * errs_b, int64_t n_b,
                         const int64_t * seg_start_b, int64_t n_seg_b, const float * q_b, int64_t R_b,
                         int64_t * out_b, int64_t * m_b, int64_t H) {
    if (!m_a || !m_b) return fail("null i8_recall_pair count pointer");
    if (i8_recall_check(rows_a, scales_a, errs_a, n_a, H, seg_start_a, n_seg_a, q_a, R_a, out_a) ||
        i8_recall_check(rows_b, scales_b, errs_b, n_b, H, seg_start_b, n_seg_b, q_b, R_b, out_b))
        return -1;
    // Each scan on a thread of its own: after a prompt pass both read their rows from DRAM, and two
    // concurrent streams move more bytes per second than one scan split in two after the other.
    // Only where the pool would split each scan anyway (OpenMP, enough rows).
    if (scan_threads(n_a, H) > 1 && scan_threads(n_b, H) > 1) {
        parallel_for(2, 2, [&](int, int64_t b, int64_t) {
            if (b == 0) *m_a = i8_recall_scan(rows_a, scales_a, errs_a, n_a, H, seg_start_a, n_seg_a, q_a, R_a, out_a, 1);
            else *m_b = i8_recall_scan(rows_b, scales_b, errs_b, n_b, H, seg_start_b, n_seg_b, q_b, R_b, out_b, 1);
        });
    } else {
        *m_a = i8_recall_scan(rows_a, scales_a, errs_a, n_a, H, seg_start_a, n_seg_a, q_a, R_a, out_a, scan_threads(n_a, H));
        *m_b = i8_recall_scan(rows_b, scales_b, errs_b, n_b, H, seg_start_b, n_seg_b, q_b, R_b, out_b, scan_threads(n_b, H));
    }
    return 0;
}

int miita_lm_gather(const void * W, int type, int64_t n_rows, int64_t n_embd, const int32_t * ids, int64_t n,
                    float * out, int n_threads) {
    RowReader rr;
    if (make_reader(W, type, n_rows, n_embd, rr) || check_ids(ids, n, n_rows)) return -1;
    // a thread costs more to start than dequantising a thousand rows (K_v = 64 rows per query)
    parallel_for(clamp_threads(n_threads, n / 1024 + 1), n, [&](int, int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) rr.read(ids[i], out + i * n_embd);
    });
    return 0;
}

int miita_restricted_uncertainty(const void * W, int type, int64_t n_rows, int64_t n_embd, const float * logits,
                                 int64_t n_logits, int64_t K, int32_t * ids, double * p_hat, double * g,
                                 double * H_hat, double * r) {
    RowReader rr;
    if (!logits || !ids || !p_hat || !g || !H_hat || !r) return fail("null restricted_uncertainty pointer");
    if (n_logits <= 0) return fail("empty logits");
    if (K < 1 || K > n_logits) return fail("K must be in 1..len(logits)");
    if (make_reader(W, type, n_rows, n_embd, rr)) return -1;
    if (miita_top_k(logits, n_logits, K, ids)) return -1;  // fails on NaN
    if (check_ids(ids, K, n_rows)) return -1;
    // eq. 6 on the K chosen logits, in double: p_hat = softmax(z_V), H_hat, g = dH/dz_V
    const double z0 = logits[ids[0]];  // the largest
    if (std::isinf(z0) && z0 > 0) return fail("logits contain +inf");
    if (!std::isfinite(z0)) return fail("every logit is -inf");
    double sum = 0.0;
    for (int64_t i = 0; i < K; ++i) sum += (p_hat[i] = std::exp((double) logits[ids[i]] - z0));
    double H = 0.0;
    for (int64_t i = 0; i < K; ++i) {
        p_hat[i] /= sum;
        if (p_hat[i] > 0.0) H -= p_hat[i] * std::log(p_hat[i]);
    }
    for (int64_t i = 0; i < K; ++i) g[i] = p_hat[i] > 0.0 ? -p_hat[i] * (std::log(p_hat[i]) + H) : 0.0;
    *H_hat = H;
    // eq. 7: r = W_V^T g, the rows read as the model stores them
    std::vector<float> row(n_embd);
    std::fill(r, r + n_embd, 0.0);
    for (int64_t i = 0; i < K; ++i) {
        rr.read(ids[i], row.data());
        for (int64_t k = 0; k < n_embd; ++k) r[k] += g[i] * (double) row[k];
    }
    return 0;
}

int miita_lm_weighted_sum(const void * W, int type, int64_t n_rows, int64_t n_embd, const int32_t * ids,
                          const float * weights, int64_t n, float * out, int n_threads) {
    RowReader rr;
    if (make_reader(W, type, n_rows, n_embd, rr) || check_ids(ids, n, n_rows)) return -1;
    const int nt = clamp_threads(n_threads, n / 256 + 1);
    std::vector<std::vector<float>> acc(nt, std::vector<float>(n_embd, 0.0f));
    parallel_for(nt, n, [&](int ti, int64_t b, int64_t e) {
        std::vector<float> row(n_embd);
        float * a = acc[ti].data();
        for (int64_t i = b; i < e; ++i) {
            rr.read(ids[i], row.data());
            const float w = weights[i];
            for (int64_t k = 0; k < n_embd; ++k) a[k] += w * row[k];
        }
    });
    for (int64_t k = 0; k < n_embd; ++k) {
        float s = 0.0f;
        for (int ti = 0; ti < nt; ++ti) s += acc[ti][k];
        out[k] = s;
    }
    return 0;
}

int miita_lm_correction(const void * W, int type, int64_t n_rows, int64_t n_embd, const float * logits,
                        const int32_t * targets, int64_t T, int64_t top_k, int per_position, float * out,
                        int n_threads) {
    RowReader rr;
    if (T <= 0) return fail("correction needs at least one target position");
    if (make_reader(W, type, n_rows, n_embd, rr) || check_ids(targets, T, n_rows)) return -1;
    const int64_t V = n_rows, H = n_embd;
    const bool exact = top_k <= 0 || top_k >= V;
    // E[t] = sum_v p_t(v) W[v]; for the mean (per_position == 0) only mean_t E[t] is needed, and
    // by linearity that is one weighted sum with the averaged distribution: 1 row pass, not T.
    const int64_t TP = (exact && !per_position) ? 1 : T;
    std::vector<float> E(TP * H, 0.0f);
    const bool fast_mean = TP == 1 && exact;
#if defined(__AVX512F__) && defined(__F16C__)
    if (fast_mean && rr.is_q8_0()) {
        if (correction_mean_q8(rr, V, H, logits, T, E.data(), n_threads)) return -1;
    } else
#endif
    if (fast_mean && correction_mean_rows(rr, V, H, logits, T, E.data(), n_threads)) return -1;
    if (!fast_mean) {

    // Softmax normaliser per position (exact over all V in both modes), V split across threads.
    std::vector<float> lmax(T), lse(T);
    {
        const int nt = clamp_threads(n_threads, V / 65536 + 1);
        std::vector<float> pm(nt);
        std::vector<double> ps(nt);
        for (int64_t t = 0; t < T; ++t) {
            const float * l = logits + t * V;
            std::fill(pm.begin(), pm.end(), -INFINITY);
            std::fill(ps.begin(), ps.end(), 0.0);
            parallel_for(nt, V, [&](int ti, int64_t b, int64_t e) {
                float m = -INFINITY;
                for (int64_t v = b; v < e; ++v) m = std::max(m, l[v]);
                float s = 0.0f, s_block = 0.0f;
                for (int64_t v = b; v < e; ++v) {
                    s_block += std::exp(l[v] - m);
                    if (((v - b) & 1023) == 1023) { s += s_block; s_block = 0.0f; }  // bounded float error
                }
                pm[ti] = m;
                ps[ti] = (double) s + s_block;
            });
            float m = -INFINITY;
            for (int i = 0; i < nt; ++i) m = std::max(m, pm[i]);
            double s = 0.0;
            for (int i = 0; i < nt; ++i)
                if (ps[i] > 0.0) s += ps[i] * std::exp((double) pm[i] - m);
            if (!std::isfinite(m) || !(s > 0.0)) return fail("logits contain non-finite values");
            lmax[t] = m;
            lse[t] = (float) std::log(s);
        }
    }

    if (exact) {
        // One pass over W for all positions: read a row once, use it TP times.
        std::vector<float> P(TP * V, 0.0f);
        const int nt = clamp_threads(n_threads, V / 4096 + 1);
        parallel_for(nt, V, [&](int, int64_t b, int64_t e) {  // T x V exps: split like the row pass
            for (int64_t t = 0; t < T; ++t) {
                const float * l = logits + t * V;
                float * p = P.data() + (TP == 1 ? 0 : t * V);
                const float off = lmax[t] + lse[t];
                const float sc = TP == 1 ? 1.0f / (float) T : 1.0f;
                for (int64_t v = b; v < e; ++v) p[v] += sc * std::exp(l[v] - off);
            }
        });
        std::vector<std::vector<float>> acc(nt, std::vector<float>(TP * H, 0.0f));
        const bool q8 = rr.is_q8_0();
        parallel_for(nt, V, [&](int ti, int64_t b, int64_t e) {
            std::vector<float> row(H);
            float * a = acc[ti].data();
            for (int64_t v = b; v < e; ++v) {
                if (q8) {  // fused dequantise + accumulate, no row buffer
                    const uint8_t * src = rr.base + (size_t) v * rr.stride;
                    for (int64_t blk = 0; blk < H / 32; ++blk) {
                        const uint8_t * bp = src + blk * 34;
                        uint16_t hb;
                        std::memcpy(&hb, bp, 2);
                        const float d = fp16_to_f32(hb);
                        const int8_t * qs = reinterpret_cast<const int8_t *>(bp + 2);
                        for (int64_t t = 0; t < TP; ++t) axpy_q8_block(a + t * H + blk * 32, P[t * V + v] * d, qs);
                    }
                    continue;
                }
                rr.read(v, row.data());
                for (int64_t t = 0; t < TP; ++t) {
                    const float w = P[t * V + v];
                    float * at = a + t * H;
                    for (int64_t k = 0; k < H; ++k) at[k] += w * row[k];
                }
            }
        });
        for (int ti = 0; ti < nt; ++ti)
            for (int64_t i = 0; i < TP * H; ++i) E[i] += acc[ti][i];
    } else {
        // Per position, split V across threads: each finds its local top_k by
        // selecting on plain float values (cheaper than sorting indices), then
        // the candidates are merged. The normaliser lse[t] is the exact one.
        const int nt = clamp_threads(n_threads, V / 65536 + 1);
        std::vector<std::vector<float>> scratch(nt, std::vector<float>((V + nt - 1) / nt));
        std::vector<std::vector<int32_t>> cand(nt);
        std::vector<float> row(H);
        for (int64_t t = 0; t < T; ++t) {
            const float * l = logits + t * V;
            parallel_for(nt, V, [&](int ti, int64_t b, int64_t e) {
                auto & buf = scratch[ti];
                auto & c = cand[ti];
                c.clear();
                const int64_t n = e - b;
                const int64_t kk = std::min<int64_t>(top_k, n);
                std::copy(l + b, l + e, buf.begin());
                std::nth_element(buf.begin(), buf.begin() + (kk - 1), buf.begin() + n, std::greater<float>());
                const float theta = buf[kk - 1];
                for (int64_t v = b; v < e; ++v)
                    if (l[v] >= theta) c.push_back((int32_t) v);
            });
            std::vector<int32_t> all;
            for (auto & c : cand) all.insert(all.end(), c.begin(), c.end());
            const int64_t kk = std::min<int64_t>(top_k, (int64_t) all.size());
            std::nth_element(all.begin(), all.begin() + kk, all.end(),
                             [l](int32_t a, int32_t c) { return l[a] > l[c] || (l[a] == l[c] && a < c); });
            const float off = lmax[t] + lse[t];
            float * et = E.data() + t * H;
            for (int64_t i = 0; i < kk; ++i) {
                const int32_t v = all[i];
                const float w = std::exp(l[v] - off);
                rr.read(v, row.data());
                for (int64_t k = 0; k < H; ++k) et[k] += w * row[k];
            }
        }
    }

    }  // !fast_mean

    if (TP == 1 && !per_position) {  // exact mean: mean_t W[y_t] - W^T pbar
        std::vector<float> wy(H);
        std::fill(out, out + H, 0.0f);
        for (int64_t t = 0; t < T; ++t) {
            rr.read(targets[t], wy.data());
            for (int64_t k = 0; k < H; ++k) out[k] += wy[k] / (float) T;
        }
        for (int64_t k = 0; k < H; ++k) out[k] -= E[k];
    } else {
        corrections_from_expectations(rr, targets, T, E.data(), per_position, out);
    }
    return 0;
}

}  // extern "C"
