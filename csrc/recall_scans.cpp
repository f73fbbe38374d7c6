// recall_scans.cpp - the retrieval scans behind the C ABI: 1-bit anchor scores (popcount), int8
// shadow scores and the exact-recall scans with their error bounds, and the top-k pass.
#include "kernels_common.h"

using namespace miita_internal;

namespace {

inline uint64_t load_u64(const uint8_t * p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

// Per byte of the packed rows, the sum of +-q over each of its two nibbles' 4 dimensions (16
// values a nibble): 32 floats a byte, 20 KB for 1,280 bits. A byte's score is the sum of its two
// nibbles' entries, always added in that order, and a row's score four running sums of those
// (bytes b = 0, 1, 2, 3 mod 4, so consecutive adds do not wait on each other): every caller
// (full scan, re-score, the inverted file's search) gets bitwise the same score for the same
// row. A full table of 256 byte values (160 KB for 1,280 bits) is faster per row, but building
// it, and the allocation itself (past malloc's mmap threshold: 40 fresh pages a call), costs more
// than the few hundred rows a re-score reads right after a prompt pass; the full scan still
// builds it (bit_byte_lut), from these same nibble sums.
struct BitNibbles {
    std::vector<float> t;  // (nb, 2, 16)
    int64_t nb;
};

BitNibbles bit_nibbles(const float * q, int64_t H) {
    const int64_t nb = (H + 7) / 8;
    BitNibbles out{std::vector<float>((size_t) (nb * 32)), nb};
    for (int64_t b = 0; b < nb; ++b)
        for (int h = 0; h < 2; ++h)
            for (int v = 0; v < 16; ++v) {
                float acc = 0.0f;
                for (int j = 0; j < 4; ++j) {
                    const int64_t dim = 8 * b + 4 * h + j;
                    if (dim >= H) break;
                    acc += ((v >> (3 - j)) & 1) ? q[dim] : -q[dim];
                }
                out.t[(size_t) (b * 32 + h * 16 + v)] = acc;
            }
    return out;
}

inline float nib(const float * t, int64_t b, uint8_t v) { return t[b * 32 + (v >> 4)] + t[b * 32 + 16 + (v & 15)]; }

// q . s for one packed row: byte b contributes byte_sum(b, row[b]), added into four running sums
// (bytes b = 0, 1, 2, 3 mod 4, so consecutive adds do not wait on each other). Both lookups below
// go through this one order of additions, which is what makes their scores bitwise equal.
template <class ByteSum>
inline float four_sums(const uint8_t * row, int64_t nb, ByteSum byte_sum) {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        acc[0] += byte_sum(b, row[b]);
        acc[1] += byte_sum(b + 1, row[b + 1]);
        acc[2] += byte_sum(b + 2, row[b + 2]);
        acc[3] += byte_sum(b + 3, row[b + 3]);
    }
    for (; b < nb; ++b) acc[b & 3] += byte_sum(b, row[b]);
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Through the nibble sums: two loads and an add a byte.
inline float bit_row_score(const BitNibbles & n, const uint8_t * row) {
    const float * t = n.t.data();
    return four_sums(row, n.nb, [t](int64_t b, uint8_t v) { return nib(t, b, v); });
}

// The same score through a table of every byte value (entry = the two nibble sums added, the
// same float add): one load a byte, for scans of many rows.
std::vector<float> bit_byte_lut(const BitNibbles & n) {
    std::vector<float> lut((size_t) (n.nb * 256));
    for (int64_t b = 0; b < n.nb; ++b)
        for (int v = 0; v < 256; ++v) lut[(size_t) (b * 256 + v)] = nib(n.t.data(), b, (uint8_t) v);
    return lut;
}

inline float bit_row_score_lut(const float * lut, const uint8_t * row, int64_t nb) {
    return four_sums(row, nb, [lut](int64_t b, uint8_t v) { return lut[b * 256 + v]; });
}

// Hamming distance of two packed rows of nbytes, restricted to the set bits of mask (NULL: all).
inline int64_t hamming(const uint8_t * a, const uint8_t * b, const uint8_t * mask, int64_t nbytes) {
    const int64_t nw = nbytes / 8;
    int64_t d = 0;
    if (mask) {
        for (int64_t w = 0; w < nw; ++w)
            d += __builtin_popcountll((load_u64(a + 8 * w) ^ load_u64(b + 8 * w)) & load_u64(mask + 8 * w));
        for (int64_t j = 8 * nw; j < nbytes; ++j) d += __builtin_popcount((unsigned) ((a[j] ^ b[j]) & mask[j]));
    } else {
        for (int64_t w = 0; w < nw; ++w) d += __builtin_popcountll(load_u64(a + 8 * w) ^ load_u64(b + 8 * w));
        for (int64_t j = 8 * nw; j < nbytes; ++j) d += __builtin_popcount((unsigned) (a[j] ^ b[j]));
    }
    return d;
}

// Threads for a scan of n int8 rows of H, which runs right after a prompt pass: with OpenMP the
// scan goes to the pool whose workers are still spinning from llama.cpp's last parallel region,
// one thread per 512 KiB of rows. Without OpenMP a std::thread of ours would compete with those
// spinning workers instead, which makes a split scan slower than one thread, so the scan stays on
// the calling thread.
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

// The k rows of the ranges nearest to q by popcount((row ^ q) & mask), in (distance, row)
// order (miita_masked_hamming_top without the argument checks).
int64_t masked_top(const uint8_t * rows, int64_t nbytes, const int64_t * starts, const int64_t * ends,
                   int64_t n_ranges, const uint8_t * q, const uint8_t * mask, int64_t k, int64_t * out,
                   int n_threads) {
    int64_t total = 0;
    for (int64_t i = 0; i < n_ranges; ++i) total += ends[i] - starts[i];
    const int64_t max_d = 8 * nbytes;
    std::vector<uint16_t> dist((size_t) total);
    std::vector<int64_t> first((size_t) n_ranges + 1, 0);  // where each range's distances go in dist
    for (int64_t i = 0; i < n_ranges; ++i) first[(size_t) i + 1] = first[(size_t) i] + ends[i] - starts[i];
    // The distance pass reads every row of the ranges (1.3 MB at 100,000 prototypes, from memory a
    // prompt pass has just evicted): split by ranges over n_threads; each thread writes its own
    // slots of dist, so the result does not depend on the split.
    const int nt = (int) std::max<int64_t>(1, std::min<int64_t>(n_threads, total / 2048));
    parallel_for(nt, n_ranges, [&](int, int64_t ib, int64_t ie) {
        for (int64_t i = ib; i < ie; ++i) {
            int64_t at = first[(size_t) i];
            for (int64_t a = starts[i]; a < ends[i]; ++a, ++at)
                dist[(size_t) at] = (uint16_t) hamming(rows + a * nbytes, q, mask, nbytes);
        }
    });
    std::vector<uint32_t> hist((size_t) max_d + 1, 0);
    for (const uint16_t d : dist) ++hist[d];
    int64_t at = 0;
    const int64_t want = std::min(k, total);
    if (want == 0) return 0;
    // the distance below which every row is kept, and how many rows at exactly that distance fit
    int64_t cut = 0, below = 0;
    while (below + (int64_t) hist[(size_t) cut] < want) below += hist[(size_t) cut++];
    int64_t room_at_cut = want - below;
    // rows in (distance, row) order: those below the cut, then the lowest-numbered rows at the cut
    std::vector<std::pair<uint32_t, int64_t>> kept;
    kept.reserve((size_t) want);
    std::vector<int64_t> at_cut;
    for (int64_t i = 0; i < n_ranges; ++i)
        for (int64_t a = starts[i]; a < ends[i]; ++a, ++at) {
            const int64_t d = dist[(size_t) at];
            if (d < cut) kept.emplace_back((uint32_t) d, a);
            else if (d == cut) at_cut.push_back(a);
        }
    std::sort(at_cut.begin(), at_cut.end());
    for (int64_t i = 0; i < room_at_cut; ++i) kept.emplace_back((uint32_t) cut, at_cut[(size_t) i]);
    std::sort(kept.begin(), kept.end());
    for (int64_t i = 0; i < want; ++i) out[i] = kept[(size_t) i].second;
    return want;
}

}  // namespace

extern "C" {

int miita_bit_scores(const uint8_t * bits, int64_t n, int64_t H, const float * q, float * out) {
    if (n < 0 || H <= 0 || (n > 0 && (!bits || !q || !out))) return fail("bad bit_scores arguments");
    const BitNibbles nibs = bit_nibbles(q, H);
    if (n < 1024) {  // a re-score of a few hundred rows: the byte table would cost more than it saves
        for (int64_t a = 0; a < n; ++a) out[a] = bit_row_score(nibs, bits + a * nibs.nb);
        return 0;
    }
    const std::vector<float> lut = bit_byte_lut(nibs);
    for (int64_t a = 0; a < n; ++a) out[a] = bit_row_score_lut(lut.data(), bits + a * nibs.nb, nibs.nb);
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
int miita_hamming_nearest(const uint8_t * rows, int64_t n, const uint8_t * cents, int64_t m, int64_t nbytes,
                          int32_t * out, int n_threads) {
    if (n < 0 || m <= 0 || nbytes <= 0 || (n > 0 && (!rows || !cents || !out))) return fail("bad hamming_nearest arguments");
    parallel_for(clamp_threads(n_threads, n / 256 + 1), n, [&](int, int64_t b, int64_t e) {
        for (int64_t a = b; a < e; ++a) {
            const uint8_t * r = rows + a * nbytes;
            int64_t best = INT64_MAX;
            int32_t arg = 0;
            for (int64_t c = 0; c < m; ++c) {
                const int64_t d = hamming(r, cents + c * nbytes, nullptr, nbytes);
                if (d < best) {
                    best = d;
                    arg = (int32_t) c;
                }
            }
            out[a] = arg;
        }
    });
    return 0;
}

int64_t miita_masked_hamming_top(const uint8_t * rows, int64_t nbytes, const int64_t * starts, const int64_t * ends,
                                 int64_t n_ranges, const uint8_t * q, const uint8_t * mask, int64_t k, int64_t * out,
                                 int n_threads) {
    if (nbytes <= 0 || n_ranges < 0 || k < 0 || (n_ranges > 0 && (!rows || !starts || !ends || !q || !mask)) ||
        (k > 0 && !out))
        return fail("bad masked_hamming_top arguments"), -1;
    for (int64_t i = 0; i < n_ranges; ++i)
        if (ends[i] < starts[i] || starts[i] < 0) return fail("bad masked_hamming_top range"), -1;
    return masked_top(rows, nbytes, starts, ends, n_ranges, q, mask, k, out, n_threads);
}

int miita_prepare_query(const float * key, const float * rows, int64_t parts, int64_t n_embd, const float * mean,
                        const int64_t * order, int64_t key_dim, float * out) {
    const int64_t full = parts * n_embd;
    if (parts <= 0 || n_embd <= 0 || key_dim <= 0 || key_dim > full || !key || !out)
        return fail("bad prepare_query arguments");
    if (order)
        for (int64_t i = 0; i < key_dim; ++i)
            if (order[i] < 0 || order[i] >= full) return fail("prepare_query: order out of range");
    // Divided and centred in float32, as numpy divides (key_pooling.key_mean) and subtracts (so
    // every sign, and a coordinate that is exactly 0, is the one bank.prepare_key gives: signs are
    // what 1-bit keys store); norms in double.
    std::vector<float> c((size_t) full);
    std::vector<double> inv((size_t) parts);
    for (int64_t p = 0; p < parts; ++p) {
        double ss = 0.0;
        const float r = rows ? rows[p] : 1.0f;
        for (int64_t h = p * n_embd; h < (p + 1) * n_embd; ++h) {
            const float v = rows ? key[h] / r : key[h];
            c[(size_t) h] = mean ? v - mean[h] : v;
            ss += (double) c[(size_t) h] * (double) c[(size_t) h];
        }
        inv[(size_t) p] = parts > 1 ? 1.0 / std::max(std::sqrt(ss), 1e-12) : 1.0;
    }
    std::vector<double> x((size_t) key_dim);
    double ss = 0.0;
    for (int64_t i = 0; i < key_dim; ++i) {
        const int64_t src = order ? order[i] : i;
        x[(size_t) i] = (double) c[(size_t) src] * inv[(size_t) (src / n_embd)];
        ss += x[(size_t) i] * x[(size_t) i];
    }
    const double n = std::sqrt(ss);
    for (int64_t i = 0; i < key_dim; ++i) out[i] = n > 0.0 ? (float) (x[(size_t) i] / n) : (float) x[(size_t) i];
    return 0;
}

int miita_sign_code(const float * q, int64_t n, uint8_t * code, uint8_t * mask) {
    if (n <= 0 || !q || !code || !mask) return fail("bad sign_code arguments");
    // The median of |q| as numpy takes it from one partition: the middle value, or for an even
    // count the float32 mean of the two middle values.
    std::vector<float> a((size_t) n);
    for (int64_t i = 0; i < n; ++i) a[(size_t) i] = std::fabs(q[i]);
    const int64_t h = n / 2;
    std::nth_element(a.begin(), a.begin() + h, a.end());
    float med = a[(size_t) h];
    if (n % 2 == 0) {
        const float lo = *std::max_element(a.begin(), a.begin() + h);
        med = (lo + med) / 2.0f;
    }
    const int64_t nb = (n + 7) / 8;
    std::fill(code, code + nb, (uint8_t) 0);
    std::fill(mask, mask + nb, (uint8_t) 0);
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t bit = (uint8_t) (0x80u >> (i & 7));
        if (q[i] >= 0.0f) code[i >> 3] |= bit;
        if (std::fabs(q[i]) >= med) mask[i >> 3] |= bit;
    }
    return 0;
}
int64_t miita_ivf_search(const miita_ivf * ivf, const float * q, int64_t key_dim, double root, int64_t nprobe,
                         int64_t count, int64_t k, int n_threads, int64_t * out_rows, double * out_scores, int64_t cap) {
    if (!ivf || !q || key_dim <= 0 || ivf->nbytes != (key_dim + 7) / 8 || ivf->nlist < 0 || nprobe < 0 ||
        count < 0 || k < 0 || cap < 0 || !(root > 0.0) || (cap > 0 && (!out_rows || !out_scores)) ||
        (ivf->nlist > 0 && (!ivf->cent || !ivf->starts || !ivf->lists || !ivf->order || !ivf->twin_group ||
                            !ivf->twin_count)))
        return fail("bad ivf_search arguments"), -1;
    const int64_t nb = ivf->nbytes;
    if (ivf->nlist == 0 || ivf->starts[ivf->nlist] == 0 || k == 0 || count == 0) return 0;
    // 1. the query's code (miita_sign_code), 2. the nearest lists, 3. their nearest rows, as
    // index_files/ivf_index do it in Python with the two kernels above
    std::vector<uint8_t> code((size_t) nb), mask((size_t) nb);
    miita_sign_code(q, key_dim, code.data(), mask.data());
    const int64_t zero = 0, np_ = std::min(nprobe, ivf->nlist);
    std::vector<int64_t> best((size_t) np_);
    const int64_t nbest = masked_top(ivf->cent, nb, &zero, &ivf->nlist, 1, code.data(), mask.data(), np_, best.data(), 1);
    std::vector<int64_t> lo((size_t) nbest), hi((size_t) nbest);
    for (int64_t i = 0; i < nbest; ++i) {
        lo[(size_t) i] = ivf->starts[best[(size_t) i]];
        hi[(size_t) i] = ivf->starts[best[(size_t) i] + 1];
    }
    std::vector<int64_t> pos((size_t) count);
    const int64_t m = masked_top(ivf->lists, nb, lo.data(), hi.data(), nbest, code.data(), mask.data(), count,
                                 pos.data(), n_threads);
    // 4. exact scores of the distinct rows, by miita_bit_scores' table and sum (bitwise the exact
    // scan's), read from the lists just scanned (the same bytes as the memory's rows)
    const BitNibbles nibs = bit_nibbles(q, key_dim);
    std::vector<double> sc((size_t) m);
    for (int64_t i = 0; i < m; ++i) sc[(size_t) i] = (double) bit_row_score(nibs, ivf->lists + pos[(size_t) i] * nb) / root;
    // 5. the k-th best score of the set with every twin counted (a twin scores as its row), and
    // every row at or above it, twins included, by row ascending (DuplicateGroups.top_rows)
    std::vector<int64_t> by((size_t) m);
    for (int64_t i = 0; i < m; ++i) by[(size_t) i] = i;
    std::stable_sort(by.begin(), by.end(), [&](int64_t a, int64_t b) { return sc[(size_t) a] > sc[(size_t) b]; });
    int64_t reach = 0, at = 0;
    for (; at < m; ++at) {
        reach += 1 + ivf->twin_count[pos[(size_t) by[(size_t) at]]];
        if (reach >= k) break;
    }
    const double kth = sc[(size_t) by[(size_t) std::min(at, m - 1)]];
    std::vector<std::pair<int64_t, double>> rows;
    for (int64_t i = 0; i < m; ++i) {
        if (!(sc[(size_t) i] >= kth)) continue;
        const int64_t p = pos[(size_t) i];
        rows.emplace_back(ivf->order[p], sc[(size_t) i]);
        const int32_t g = ivf->twin_group[p];
        if (g >= 0 && (g >= ivf->n_groups || ivf->twin_count[p] < 0 ||
                       ivf->group_start[g] < 0 || ivf->group_start[g] + ivf->twin_count[p] > ivf->n_members))
            return fail("ivf_search: a twin group lies outside members"), -1;
        if (g >= 0)
            for (int64_t j = 0; j < ivf->twin_count[p]; ++j)
                rows.emplace_back(ivf->members[ivf->group_start[g] + j], sc[(size_t) i]);
    }
    std::sort(rows.begin(), rows.end(), [](const auto & a, const auto & b) { return a.first < b.first; });
    const int64_t n_out = (int64_t) rows.size();
    for (int64_t i = 0; i < std::min(n_out, cap); ++i) {
        out_rows[i] = rows[(size_t) i].first;
        out_scores[i] = rows[(size_t) i].second;
    }
    return n_out;
}
int miita_range_min_hamming(const uint8_t * rows, int64_t nbytes, const int64_t * starts, const int64_t * ends,
                            int64_t n_ranges, const uint8_t * q, int64_t * out) {
    if (nbytes <= 0 || n_ranges < 0 || (n_ranges > 0 && (!rows || !starts || !ends || !q || !out)))
        return fail("bad range_min_hamming arguments");
    for (int64_t i = 0; i < n_ranges; ++i) {
        if (ends[i] < starts[i] || starts[i] < 0) return fail("bad range_min_hamming range");
        int64_t best = -1;
        for (int64_t a = starts[i]; a < ends[i]; ++a) {
            const int64_t d = hamming(rows + a * nbytes, q, nullptr, nbytes);
            if (best < 0 || d < best) best = d;
        }
        out[i] = best;
    }
    return 0;
}
}  // extern "C"
