// head_kernels.cpp - the LM-head row kernels behind the C ABI: rows of the mapped GGUF
// dequantised in place (F32, F16, BF16, Q8_0, ...), eq. 2's correction R from logits or, in one
// online-softmax pass, from final hidden states, gathers, weighted sums and eqs. 6-7's restricted
// uncertainty.
#include "kernels_common.h"

using namespace miita_internal;

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

#if !defined(__F16C__)
// fp16 -> fp32 for all 65,536 bit patterns, from ggml's own conversion (256 KiB, built once);
// only where the CPU has no conversion instruction
const float * fp16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; ++i) t[i] = ggml_fp16_to_fp32((ggml_fp16_t) i);
        return t;
    }();
    return table.data();
}
#endif

int check_ids(const int32_t * ids, int64_t n, int64_t n_rows) {
    for (int64_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= n_rows)
            return fail("token id " + std::to_string(ids[i]) + " is outside the vocabulary (" + std::to_string(n_rows) + ")");
    return 0;
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
// which walks the rows in order (a tiled walk that keeps accumulators in registers is slower: it
// defeats the prefetcher). E_out = W^T pbar; same sum as the generic path
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
    return p * (f32x8) bits;  // a vector cast reinterprets the bits (GCC/Clang), no aliasing
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
                // registers is slower (bench/extract.py), and so is a load-FMA-store of the
                // accumulator per row.
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
