// kernel_check - the native core's kernels against scalar references, on any CPU.
//
// Built and run by tools/aarch64_kernels.sh (cross-compiled, under qemu-aarch64) and by
// tests/test_portable_build.py (on the build machine, portable and -march=native). It uses only the
// C ABI (miita_core.h) and ggml: the LM heads are quantised by ggml's own quantisers, the graph test
// runs on ggml's CPU backend through ggml_backend_sched with miita_eval_callback installed.
//
// Checks (each prints one line, "ok" or "FAIL", with its error; exit status 1 on any failure):
//   rows      miita_lm_gather vs ggml's to_float and a scalar Q8_0 decoder, for F32 F16 BF16 Q8_0 Q4_K Q6_K
//             (the rows and the quantised bytes are also written to OUTDIR for a check against gguf-py)
//   exact-R   miita_lm_correction_hidden / miita_lm_correction (exact, mean, top-k) vs eq. 2 in double
//   uncert    miita_restricted_uncertainty and miita_lm_weighted_sum vs double
//   top-k     miita_top_k vs a stable sort, ties included, and its NaN refusal
//   i8        miita_i8_scores, miita_i8_recall (rows and segments), miita_i8_recall_pair, miita_bit_scores
//   hamming   miita_hamming_nearest, miita_masked_hamming_top (the inverted file) vs bit-by-bit counts
//   query     miita_sign_code, miita_range_min_hamming, miita_prepare_query, miita_ivf_search (retrieval's query
//             side) vs plain references and the kernels the search is made of
//   callback  a small graph (l_out-0 -> result_norm -> result_output) on the CPU backend: key sum, captured
//             rows, ungated and gated additions, the logits after the addition, vs scalar references
//
// usage: kernel_check [OUTDIR]   (MIITA_KERNEL_CHECK_FAULT=1 corrupts one Q8_0 row: the run must fail)
#include "miita_core.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace {

int g_failures = 0;
std::string g_outdir;  // where the results go for comparisons across builds ("" = nowhere)

void report(const char * name, bool ok, const std::string & detail) {
    std::printf("%-4s %-28s %s\n", ok ? "ok" : "FAIL", name, detail.c_str());
    if (!ok) ++g_failures;
}

std::string fmt(const char * f, double a, double b = 0.0) {
    char buf[256];
    std::snprintf(buf, sizeof buf, f, a, b);
    return buf;
}

struct Rng {  // xorshift64*, fixed seeds: every platform draws the same numbers
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 2685821657736338717ull + 1) {}
    uint64_t next() {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        return s * 2685821657736338717ull;
    }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
    double normal() {
        const double u = uniform() + 1e-300, v = uniform();
        return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
    }
};

// max |a - b| / max |b|
double rel_err(const float * a, const double * b, size_t n) {
    double e = 0.0, m = 0.0;
    for (size_t i = 0; i < n; ++i) {
        e = std::max(e, std::fabs((double) a[i] - b[i]));
        m = std::max(m, std::fabs(b[i]));
    }
    return m > 0 ? e / m : e;
}

const int kH = 256, kV = 1024, kT = 3;

struct Head {
    ggml_type type;
    std::vector<uint8_t> bytes;  // kV rows of ggml_row_size(type, kH)
    std::vector<double> ref;     // kV x kH, the rows as ggml's to_float gives them, in double
};

Head make_head(ggml_type type, const std::vector<float> & W) {
    Head h;
    h.type = type;
    const size_t rb = ggml_row_size(type, kH);
    h.bytes.resize(rb * kV);
    if (type == GGML_TYPE_F32) std::memcpy(h.bytes.data(), W.data(), rb * kV);
    else ggml_quantize_chunk(type, W.data(), h.bytes.data(), 0, kV, kH, nullptr);
    std::vector<float> row(kH);
    h.ref.resize((size_t) kV * kH);
    const auto * tr = ggml_get_type_traits(type);
    for (int v = 0; v < kV; ++v) {
        const uint8_t * src = h.bytes.data() + rb * v;
        if (type == GGML_TYPE_F32) std::memcpy(row.data(), src, sizeof(float) * kH);
        else tr->to_float(src, row.data(), kH);
        for (int k = 0; k < kH; ++k) h.ref[(size_t) v * kH + k] = row[k];
    }
    return h;
}

bool write_file(const std::string & name, const void * data, size_t n) {
    if (g_outdir.empty()) return true;
    FILE * f = std::fopen((g_outdir + "/" + name).c_str(), "wb");
    if (!f) return false;
    const bool ok = std::fwrite(data, 1, n, f) == n;
    return std::fclose(f) == 0 && ok;
}

// Q8_0 decoded by hand (the kernel has its own vectorised decoder for this type)
double q8_0_scalar_err(const Head & h, const std::vector<float> & got) {
    double e = 0.0, m = 0.0;
    const size_t rb = ggml_row_size(GGML_TYPE_Q8_0, kH);
    for (int v = 0; v < kV; ++v)
        for (int b = 0; b < kH / 32; ++b) {
            const uint8_t * bp = h.bytes.data() + rb * v + 34 * b;
            uint16_t d16;
            std::memcpy(&d16, bp, 2);
            const double d = ggml_fp16_to_fp32(d16);
            for (int j = 0; j < 32; ++j) {
                const double x = d * (double) (int8_t) bp[2 + j];
                e = std::max(e, std::fabs(x - got[(size_t) v * kH + 32 * b + j]));
                m = std::max(m, std::fabs(x));
            }
        }
    return e / m;
}

void check_rows(const Head & h) {
    std::vector<int32_t> ids(kV);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<float> got((size_t) kV * kH);
    const int rc = miita_lm_gather(h.bytes.data(), h.type, kV, kH, ids.data(), kV, got.data(), 2);
    if (std::getenv("MIITA_KERNEL_CHECK_FAULT") && h.type == GGML_TYPE_Q8_0) got[5 * kH + 7] += 1e-3f;  // must FAIL
    double e = rc ? 1e9 : rel_err(got.data(), h.ref.data(), got.size());
    std::string name = std::string("rows ") + ggml_type_name(h.type);
    std::string detail = std::to_string(kV) + fmt(" rows vs ggml to_float: max rel err %.1e", e);
    if (h.type == GGML_TYPE_Q8_0) {
        const double e2 = q8_0_scalar_err(h, got);
        detail += fmt("; vs a scalar Q8_0 decoder %.1e", e2);
        e = std::max(e, e2);
    }
    report(name.c_str(), rc == 0 && e <= 1e-6, detail);
    const std::string t = ggml_type_name(h.type);
    write_file("W_" + t + ".bin", h.bytes.data(), h.bytes.size());
    write_file("rows_" + t + ".f32", got.data(), got.size() * sizeof(float));
}

// eq. 2 in double: R_t = W[y_t] - sum_v softmax(z_t)(v) W[v], z_t = W h_t (hidden) or given logits
void ref_corrections(const Head & h, const std::vector<double> & z, const int32_t * y, int T, const std::vector<int> * only,
                     std::vector<double> & R) {
    R.assign((size_t) T * kH, 0.0);
    for (int t = 0; t < T; ++t) {
        const double * zt = z.data() + (size_t) t * kV;
        const double m = *std::max_element(zt, zt + kV);
        double Z = 0.0;
        for (int v = 0; v < kV; ++v) Z += std::exp(zt[v] - m);
        std::vector<double> E(kH, 0.0);
        auto add = [&](int v) {
            const double p = std::exp(zt[v] - m) / Z;
            for (int k = 0; k < kH; ++k) E[k] += p * h.ref[(size_t) v * kH + k];
        };
        if (only) for (int v : only[t]) add(v);
        else for (int v = 0; v < kV; ++v) add(v);
        for (int k = 0; k < kH; ++k) R[(size_t) t * kH + k] = h.ref[(size_t) y[t] * kH + k] - E[k];
    }
}

void check_corrections(const Head & h, Rng & rng) {
    std::vector<float> hid((size_t) kT * kH);
    for (auto & x : hid) x = (float) (0.5 * rng.normal());
    const int32_t y[kT] = {7, 300, kV - 1};
    std::vector<double> z((size_t) kT * kV);
    for (int t = 0; t < kT; ++t)
        for (int v = 0; v < kV; ++v) {
            double s = 0.0;
            for (int k = 0; k < kH; ++k) s += h.ref[(size_t) v * kH + k] * hid[(size_t) t * kH + k];
            z[(size_t) t * kV + v] = s;
        }
    std::vector<double> R, Rm(kH, 0.0);
    ref_corrections(h, z, y, kT, nullptr, R);
    for (int t = 0; t < kT; ++t)
        for (int k = 0; k < kH; ++k) Rm[k] += R[(size_t) t * kH + k] / kT;
    std::vector<float> out((size_t) kT * kH), outm(kH);
    const std::string tn = ggml_type_name(h.type);

    int rc = miita_lm_correction_hidden(h.bytes.data(), h.type, kV, kH, hid.data(), y, kT, 1, out.data(), 2);
    double e = rc ? 1e9 : rel_err(out.data(), R.data(), out.size());
    report(("exact-R hidden " + tn).c_str(), rc == 0 && e <= 1e-4, fmt("per position, one online-softmax pass: max rel err %.1e", e));
    write_file("R_hidden_" + tn + ".f32", out.data(), out.size() * sizeof(float));
    rc = miita_lm_correction_hidden(h.bytes.data(), h.type, kV, kH, hid.data(), y, kT, 0, outm.data(), 2);
    e = rc ? 1e9 : rel_err(outm.data(), Rm.data(), kH);
    report(("exact-R hidden mean " + tn).c_str(), rc == 0 && e <= 1e-4, "mean over " + std::to_string(kT) + fmt(" positions: max rel err %.1e", e));

    std::vector<float> logits(z.size());
    for (size_t i = 0; i < z.size(); ++i) logits[i] = (float) z[i];
    std::vector<double> zf(z.size());
    for (size_t i = 0; i < z.size(); ++i) zf[i] = logits[i];
    ref_corrections(h, zf, y, kT, nullptr, R);
    std::fill(Rm.begin(), Rm.end(), 0.0);
    for (int t = 0; t < kT; ++t)
        for (int k = 0; k < kH; ++k) Rm[k] += R[(size_t) t * kH + k] / kT;
    rc = miita_lm_correction(h.bytes.data(), h.type, kV, kH, logits.data(), y, kT, 0, 1, out.data(), 2);
    e = rc ? 1e9 : rel_err(out.data(), R.data(), out.size());
    report(("exact-R logits " + tn).c_str(), rc == 0 && e <= 1e-4, fmt("from logits, per position: max rel err %.1e", e));
    rc = miita_lm_correction(h.bytes.data(), h.type, kV, kH, logits.data(), y, kT, 0, 0, outm.data(), 2);
    e = rc ? 1e9 : rel_err(outm.data(), Rm.data(), kH);
    report(("exact-R logits mean " + tn).c_str(), rc == 0 && e <= 1e-4, fmt("from logits, mean (one pass by linearity): max rel err %.1e", e));
    write_file("R_mean_" + tn + ".f32", outm.data(), outm.size() * sizeof(float));
    // top-k: only the k most probable rows, with the exact normaliser
    const int K = 64;
    std::vector<std::vector<int>> only(kT);
    for (int t = 0; t < kT; ++t) {
        std::vector<int> idx(kV);
        std::iota(idx.begin(), idx.end(), 0);
        const float * l = logits.data() + (size_t) t * kV;
        std::stable_sort(idx.begin(), idx.end(), [l](int a, int b) { return l[a] > l[b]; });
        only[t].assign(idx.begin(), idx.begin() + K);
    }
    ref_corrections(h, zf, y, kT, only.data(), R);
    rc = miita_lm_correction(h.bytes.data(), h.type, kV, kH, logits.data(), y, kT, K, 1, out.data(), 2);
    e = rc ? 1e9 : rel_err(out.data(), R.data(), out.size());
    report(("top-k R " + tn).c_str(), rc == 0 && e <= 1e-4, fmt("k = 64 rows per position: max rel err %.1e", e));
}

void check_uncertainty(const Head & h, Rng & rng) {
    std::vector<float> logits(kV);
    for (auto & x : logits) x = (float) (3.0 * rng.normal());
    const int K = 16;
    std::vector<int32_t> ids(K);
    std::vector<double> p(K), g(K), r(kH);
    double Hh = 0.0;
    const int rc = miita_restricted_uncertainty(h.bytes.data(), h.type, kV, kH, logits.data(), kV, K, ids.data(),
                                                p.data(), g.data(), &Hh, r.data());
    std::vector<int> idx(kV);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    double s = 0.0;
    std::vector<double> pr(K), gr(K), rr(kH, 0.0);
    for (int i = 0; i < K; ++i) s += (pr[i] = std::exp((double) logits[idx[i]] - logits[idx[0]]));
    double Hr = 0.0;
    for (int i = 0; i < K; ++i) {
        pr[i] /= s;
        Hr -= pr[i] * std::log(pr[i]);
    }
    for (int i = 0; i < K; ++i) {
        gr[i] = -pr[i] * (std::log(pr[i]) + Hr);
        for (int k = 0; k < kH; ++k) rr[k] += gr[i] * h.ref[(size_t) idx[i] * kH + k];
    }
    bool same_ids = rc == 0;
    for (int i = 0; i < K && same_ids; ++i) same_ids = ids[i] == idx[i];
    double er = 0.0, mr = 0.0;
    for (int k = 0; k < kH; ++k) {
        er = std::max(er, std::fabs(r[k] - rr[k]));
        mr = std::max(mr, std::fabs(rr[k]));
    }
    report(("uncertainty " + std::string(ggml_type_name(h.type))).c_str(),
           same_ids && std::fabs(Hh - Hr) <= 1e-9 && er <= 1e-9 * std::max(1.0, mr) + 1e-6 * mr,
           std::string("eqs. 6-7, K = 16: ids ") + (same_ids ? "equal" : "DIFFER") + fmt("; |dH| %.1e", std::fabs(Hh - Hr)) +
               fmt("; r max rel err %.1e", mr > 0 ? er / mr : er));
    std::vector<float> w(K), out(kH);
    std::vector<double> ref(kH, 0.0);
    for (int i = 0; i < K; ++i) {
        w[i] = (float) rng.normal();
        for (int k = 0; k < kH; ++k) ref[k] += (double) w[i] * h.ref[(size_t) idx[i] * kH + k];
    }
    std::vector<int32_t> ids2(idx.begin(), idx.begin() + K);
    const int rc2 = miita_lm_weighted_sum(h.bytes.data(), h.type, kV, kH, ids2.data(), w.data(), K, out.data(), 2);
    const double e = rc2 ? 1e9 : rel_err(out.data(), ref.data(), kH);
    report(("weighted sum " + std::string(ggml_type_name(h.type))).c_str(), rc2 == 0 && e <= 1e-5, fmt("16 rows: max rel err %.1e", e));
}

void check_top_k(Rng & rng) {
    const int64_t n = 300000;  // above the size where the pass is split over threads
    std::vector<float> x(n);
    for (auto & v : x) v = (float) std::floor(rng.normal() * 8.0) / 8.0f;  // many ties
    for (int64_t k : {1, 10, 100, 1000}) {
        std::vector<int32_t> out(k);
        const int rc = miita_top_k(x.data(), n, k, out.data());
        std::vector<int32_t> idx(n);
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
        const bool ok = rc == 0 && std::equal(out.begin(), out.end(), idx.begin());
        report(("top-k k=" + std::to_string(k)).c_str(), ok, "vs a stable descending sort of 300000 values with ties");
        write_file("topk_" + std::to_string(k) + ".i32", out.data(), out.size() * sizeof(int32_t));
    }
    x[n / 3] = NAN;
    std::vector<int32_t> out(10);
    const int rc = miita_top_k(x.data(), n, 10, out.data());
    report("top-k NaN", rc != 0 && std::string(miita_last_error()).find("NaN") != std::string::npos,
           std::string("refused with: ") + miita_last_error());
}

void check_i8(Rng & rng) {
    const int64_t n = 4000, H = kH;
    std::vector<float> X((size_t) n * H);
    for (int64_t a = 0; a < n; ++a) {
        const double base = rng.normal();
        for (int64_t h = 0; h < H; ++h) X[(size_t) a * H + h] = (float) (0.3 * base + rng.normal());
    }
    std::vector<int8_t> Q((size_t) n * H);
    std::vector<float> scales(n), errs(n);
    for (int64_t a = 0; a < n; ++a) {
        float m = 0.0f;
        for (int64_t h = 0; h < H; ++h) m = std::max(m, std::fabs(X[(size_t) a * H + h]));
        scales[a] = m / 127.0f;
        double e2 = 0.0;
        for (int64_t h = 0; h < H; ++h) {
            const float x = X[(size_t) a * H + h];
            const int q = (int) std::lrint(x / scales[a]);
            Q[(size_t) a * H + h] = (int8_t) std::max(-127, std::min(127, q));
            const double d = x - (double) scales[a] * Q[(size_t) a * H + h];
            e2 += d * d;
        }
        errs[a] = (float) std::sqrt(e2);
    }
    std::vector<float> q(H);
    double qn = 0.0;
    for (auto & v : q) {
        v = (float) rng.normal();
        qn += (double) v * v;
    }
    for (auto & v : q) v = (float) (v / std::sqrt(qn));
    // scores of the int8 rows
    std::vector<float> got(n);
    std::vector<double> ref(n), exact(n);
    const int rc = miita_i8_scores(Q.data(), scales.data(), n, H, q.data(), got.data());
    for (int64_t a = 0; a < n; ++a) {
        double s = 0.0, t = 0.0;
        for (int64_t h = 0; h < H; ++h) {
            s += (double) q[h] * Q[(size_t) a * H + h];
            t += (double) q[h] * X[(size_t) a * H + h];
        }
        ref[a] = scales[a] * s;
        exact[a] = t;
    }
    const double e = rc ? 1e9 : rel_err(got.data(), ref.data(), n);
    report("i8 scores", rc == 0 && e <= 1e-5, fmt("4000 int8 rows: max rel err %.1e", e));
    // recall, every row its own segment: the exact top-R of the float rows must be among the returned
    auto top = [](const std::vector<double> & s, int64_t R) {
        std::vector<int64_t> idx(s.size());
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + R, idx.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
        return std::vector<int64_t>(idx.begin(), idx.begin() + R);
    };
    const int64_t R = 10;
    std::vector<int64_t> out(n);
    const int64_t m = miita_i8_recall(Q.data(), scales.data(), errs.data(), n, H, nullptr, 0, q.data(), R, out.data());
    std::set<int64_t> got_set(out.begin(), out.begin() + std::max<int64_t>(m, 0));
    bool ok = m >= R && m < n / 2;
    for (int64_t a : top(exact, R)) ok &= got_set.count(a) > 0;
    write_file("i8_scores.f32", got.data(), got.size() * sizeof(float));
    write_file("i8_recall.i64", out.data(), std::max<int64_t>(m, 0) * sizeof(int64_t));
    report("i8 recall rows", ok, fmt("exact top-10 of 4000 inside the %.0f returned", (double) m));
    // segments of 1-4 rows: the segment's score is its best row
    std::vector<int64_t> seg;
    for (int64_t a = 0; a < n; a += 1 + (int64_t) (rng.uniform() * 4)) seg.push_back(a);
    const int64_t ns = (int64_t) seg.size();
    std::vector<double> seg_exact(ns, -1e300);
    for (int64_t g = 0; g < ns; ++g)
        for (int64_t a = seg[g]; a < (g + 1 < ns ? seg[g + 1] : n); ++a) seg_exact[g] = std::max(seg_exact[g], exact[a]);
    std::vector<int64_t> outs(ns);
    const int64_t ms = miita_i8_recall(Q.data(), scales.data(), errs.data(), n, H, seg.data(), ns, q.data(), R, outs.data());
    std::set<int64_t> seg_set(outs.begin(), outs.begin() + std::max<int64_t>(ms, 0));
    ok = ms >= R && ms < ns / 2;
    for (int64_t g : top(seg_exact, R)) ok &= seg_set.count(g) > 0;
    report("i8 recall segments", ok, fmt("exact top-10 of %.0f segments inside the %.0f returned", (double) ns, (double) ms));
    // the pair: the same answers as two single scans
    std::vector<int64_t> oa(n), ob(ns);
    int64_t ma = -1, mb = -1;
    const int rcp = miita_i8_recall_pair(Q.data(), scales.data(), errs.data(), n, nullptr, 0, q.data(), R, oa.data(), &ma,
                                         Q.data(), scales.data(), errs.data(), n, seg.data(), ns, q.data(), R, ob.data(), &mb, H);
    ok = rcp == 0 && ma == m && mb == ms && std::equal(oa.begin(), oa.begin() + ma, out.begin()) &&
         std::equal(ob.begin(), ob.begin() + mb, outs.begin());
    report("i8 recall pair", ok, "two scans at once = the two single scans");
    // 1-bit keys
    const int64_t nb = (H + 7) / 8;
    std::vector<uint8_t> bits((size_t) n * nb, 0);
    std::vector<double> bref(n, 0.0);
    for (int64_t a = 0; a < n; ++a)
        for (int64_t h = 0; h < H; ++h) {
            const bool s = X[(size_t) a * H + h] > 0;
            if (s) bits[(size_t) a * nb + h / 8] |= (uint8_t) (0x80 >> (h % 8));
            bref[a] += s ? q[h] : -q[h];
        }
    std::vector<float> bs(n);
    const int rcb = miita_bit_scores(bits.data(), n, H, q.data(), bs.data());
    const double eb = rcb ? 1e9 : rel_err(bs.data(), bref.data(), n);
    report("bit scores", rcb == 0 && eb <= 1e-5, fmt("4000 packed sign rows: max rel err %.1e", eb));
}

// The inverted file's two kernels against a plain bit-by-bit count: nearest centroid (ties to the
// lower) and the masked top-k over ranges (ties at the cut to the lower row); 13-byte rows take the
// byte tail, duplicated rows put ties at the cut.
void check_hamming(Rng & rng) {
    for (int64_t nb : {160, 13}) {
        const int64_t n = 900, m = 37, n_top = 6000;  // top-k ranges over 4,096 rows: two threads
        std::vector<uint8_t> rows((size_t) (n_top * nb)), cents((size_t) (m * nb)), q(nb), mask(nb);
        for (auto & v : rows) v = (uint8_t) (rng.next() >> 56);
        for (int64_t a = 600; a < 700; ++a) std::copy_n(rows.begin(), nb, rows.begin() + a * nb);
        for (auto & v : cents) v = (uint8_t) (rng.next() >> 56);
        std::copy_n(rows.begin() + 5 * nb, nb, cents.begin() + 3 * nb);
        std::copy_n(rows.begin() + 5 * nb, nb, cents.begin() + 9 * nb);  // an exact tie
        for (auto & v : q) v = (uint8_t) (rng.next() >> 56);
        for (auto & v : mask) v = (uint8_t) (rng.next() >> 56);
        auto dist = [nb](const uint8_t * a, const uint8_t * b, const uint8_t * mk) {
            int d = 0;
            for (int64_t k = 0; k < nb; ++k)
                for (int j = 0; j < 8; ++j) d += (((a[k] ^ b[k]) & (mk ? mk[k] : 0xff)) >> j) & 1;
            return d;
        };
        std::vector<int32_t> near(n);
        const int rc = miita_hamming_nearest(rows.data(), n, cents.data(), m, nb, near.data(), 2);
        bool ok = rc == 0;
        for (int64_t a = 0; a < n && ok; ++a) {
            int best = 1 << 30, arg = 0;
            for (int64_t c = 0; c < m; ++c) {
                const int d = dist(rows.data() + a * nb, cents.data() + c * nb, nullptr);
                if (d < best) best = d, arg = (int) c;
            }
            ok = near[a] == arg;
        }
        report(("hamming nearest, " + std::to_string(nb) + " B").c_str(), ok, "900 rows, 37 centroids, bit by bit");
        const int64_t starts[3] = {3650, 0, 300}, ends[3] = {5900, 2120, 300};
        std::vector<std::pair<int, int64_t>> ref;
        for (int i = 0; i < 3; ++i)
            for (int64_t a = starts[i]; a < ends[i]; ++a) ref.emplace_back(dist(rows.data() + a * nb, q.data(), mask.data()), a);
        std::sort(ref.begin(), ref.end());
        bool okt = true;
        for (int threads : {1, 2})
            for (int64_t k : {1, 40, 200, 400, 5000}) {
                std::vector<int64_t> out(k);
                const int64_t got = miita_masked_hamming_top(rows.data(), nb, starts, ends, 3, q.data(), mask.data(), k,
                                                             out.data(), threads);
                const int64_t want = std::min<int64_t>(k, (int64_t) ref.size());
                okt = okt && got == want;
                for (int64_t i = 0; i < want && okt; ++i) okt = out[i] == ref[(size_t) i].second;
            }
        report(("masked hamming top-k, " + std::to_string(nb) + " B").c_str(), okt,
               "3 ranges (4,370 rows), k = 1/40/200/400/5000, ties, 1 and 2 threads");
    }
}

// The query side of retrieval: miita_sign_code (signs, |q| at or above the median), miita_range_min_hamming,
// miita_prepare_query (vs double), and miita_ivf_search against the kernels it is made of
// (miita_masked_hamming_top and miita_bit_scores, checked above) and a plain cut with twins.
void check_query(Rng & rng) {
    const int64_t H = 1280, nb = H / 8;
    std::vector<float> q(H);
    for (auto & v : q) v = (float) rng.normal();
    q[5] = 0.0f;
    q[6] = -0.0f;
    std::vector<uint8_t> code(nb), mask(nb);
    bool ok = miita_sign_code(q.data(), H, code.data(), mask.data()) == 0;
    std::vector<float> a(H);
    for (int64_t i = 0; i < H; ++i) a[i] = std::fabs(q[i]);
    std::sort(a.begin(), a.end());
    const float med = (a[H / 2 - 1] + a[H / 2]) / 2.0f;
    for (int64_t i = 0; i < H && ok; ++i) {
        const int bit = 7 - (int) (i & 7);
        ok = ((code[i >> 3] >> bit) & 1) == (q[i] >= 0.0f) && ((mask[i >> 3] >> bit) & 1) == (std::fabs(q[i]) >= med);
    }
    report("sign code", ok, "1280 coordinates, zeros, median of |q|");

    const int64_t n = 3000;
    std::vector<uint8_t> rows((size_t) (n * nb));
    for (auto & v : rows) v = (uint8_t) (rng.next() >> 56);
    for (int64_t r = 2000; r < 2400; ++r) std::copy_n(rows.begin() + (r - 2000) * nb, nb, rows.begin() + r * nb);
    auto ham = [&](int64_t r, const uint8_t * c) {
        int d = 0;
        for (int64_t k = 0; k < nb; ++k) d += __builtin_popcount((unsigned) (rows[r * nb + k] ^ c[k]));
        return d;
    };
    const int64_t rs[3] = {10, 500, 700}, re[3] = {40, 500, 1300};
    int64_t mins[3];
    ok = miita_range_min_hamming(rows.data(), nb, rs, re, 3, code.data(), mins) == 0;
    for (int i = 0; i < 3 && ok; ++i) {
        int64_t best = -1;
        for (int64_t r = rs[i]; r < re[i]; ++r) best = best < 0 ? ham(r, code.data()) : std::min<int64_t>(best, ham(r, code.data()));
        ok = mins[i] == best;
    }
    report("range min hamming", ok, "3 ranges, one empty");

    const int64_t parts = 2, E = 640;
    std::vector<float> raw(parts * E), mean(parts * E), out(1000);
    std::vector<int64_t> order(parts * E);
    for (auto & v : raw) v = (float) rng.normal();
    for (auto & v : mean) v = (float) (0.3 * rng.normal());
    for (int64_t i = 0; i < parts * E; ++i) order[i] = (i * 397) % (parts * E);
    const float cnt[2] = {3.0f, 1.0f};
    ok = miita_prepare_query(raw.data(), cnt, parts, E, mean.data(), order.data(), 1000, out.data()) == 0;
    std::vector<double> c(parts * E), x(1000);
    double ss = 0.0;
    for (int64_t p = 0; p < parts; ++p) {
        double bs = 0.0;
        for (int64_t h = p * E; h < (p + 1) * E; ++h) {
            c[h] = (double) (raw[h] / cnt[p] - mean[h]);
            bs += c[h] * c[h];
        }
        for (int64_t h = p * E; h < (p + 1) * E; ++h) c[h] /= std::sqrt(bs);
    }
    for (int64_t i = 0; i < 1000; ++i) ss += (x[i] = c[order[i]]) * c[order[i]];
    double err = 0.0;
    for (int64_t i = 0; i < 1000 && ok; ++i) {
        err = std::max(err, std::fabs(out[i] - x[i] / std::sqrt(ss)));
        ok = (out[i] >= 0.0f) == (x[i] >= 0.0);
    }
    ok = ok && err < 1e-6;
    report("prepare query", ok, "2 blocks, divided, centred, ordered, cut; max error " + std::to_string(err));

    // an inverted file by hand: 16 lists of 120 rows, the rows 2000-2399 as twins of 0-399
    const int64_t nlist = 16, per = 120, m = nlist * per;
    std::vector<uint8_t> cent((size_t) (nlist * nb));
    for (auto & v : cent) v = (uint8_t) (rng.next() >> 56);
    std::vector<int64_t> starts(nlist + 1), ord(m), gstart, members;
    std::vector<int32_t> tg(m, -1), tc(m, 0);
    std::vector<uint8_t> lists((size_t) (m * nb));
    for (int64_t i = 0; i <= nlist; ++i) starts[i] = i * per;
    gstart.push_back(0);
    for (int64_t p = 0; p < m; ++p) {
        ord[p] = p < 400 ? p : p + 600;  // listed rows 0-399 and 1000-2519 (2000-2399 are twins, not listed)
        if (ord[p] >= 2000 && ord[p] < 2400) ord[p] += 400;
        std::copy_n(rows.begin() + (ord[p] % n) * nb, nb, lists.begin() + p * nb);
        if (ord[p] < 400) {
            tg[p] = (int32_t) (gstart.size() - 1);
            tc[p] = 1;
            members.push_back(ord[p] + 2000);
            gstart.push_back((int64_t) members.size());
        }
    }
    for (int64_t p = 0; p < m; ++p) ord[p] %= n;
    const miita_ivf ivf{cent.data(), nlist, starts.data(), lists.data(), ord.data(), nb, tg.data(), tc.data(),
                        gstart.data(), (int64_t) gstart.size() - 1, members.data(), (int64_t) members.size()};
    bool oki = true;
    for (int64_t k : {1, 8, 60}) {
        std::vector<int64_t> got_rows(4096);
        std::vector<double> got_sc(4096);
        const double root = std::sqrt((double) H);
        const int64_t got = miita_ivf_search(&ivf, q.data(), H, root, 5, 100, k, 2, got_rows.data(), got_sc.data(), 4096);
        // the same steps through the checked kernels
        std::vector<int64_t> best(5), pos(100);
        const int64_t zero = 0;
        miita_masked_hamming_top(cent.data(), nb, &zero, &nlist, 1, code.data(), mask.data(), 5, best.data(), 1);
        std::vector<int64_t> lo(5), hi(5);
        for (int i = 0; i < 5; ++i) lo[i] = starts[best[i]], hi[i] = starts[best[i] + 1];
        const int64_t np_ = miita_masked_hamming_top(lists.data(), nb, lo.data(), hi.data(), 5, code.data(), mask.data(), 100, pos.data(), 1);
        std::vector<float> sc(np_);
        std::vector<uint8_t> sel((size_t) (np_ * nb));
        for (int64_t i = 0; i < np_; ++i) std::copy_n(lists.begin() + pos[i] * nb, nb, sel.begin() + i * nb);
        miita_bit_scores(sel.data(), np_, H, q.data(), sc.data());
        std::vector<std::pair<double, int64_t>> all;  // (score, row), twins expanded
        for (int64_t i = 0; i < np_; ++i) {
            all.emplace_back((double) sc[i] / root, ord[pos[i]]);
            for (int32_t t = 0; t < tc[pos[i]]; ++t) all.emplace_back((double) sc[i] / root, members[gstart[tg[pos[i]]] + t]);
        }
        std::vector<double> desc;
        for (auto & e : all) desc.push_back(e.first);
        std::sort(desc.begin(), desc.end(), std::greater<double>());
        const double kth = desc[std::min<size_t>(k, desc.size()) - 1];
        std::vector<std::pair<int64_t, double>> want;
        for (auto & e : all) if (e.first >= kth) want.emplace_back(e.second, e.first);
        std::sort(want.begin(), want.end());
        oki = oki && got == (int64_t) want.size();
        for (int64_t i = 0; i < got && oki; ++i) oki = got_rows[i] == want[i].first && got_sc[i] == want[i].second;
    }
    report("ivf search", oki, "16 lists, twins, k = 1/8/60, vs the kernels it is made of");
}

// A small graph on ggml's CPU backend with the eval callback installed, as llama.cpp runs it.
void check_callback(Rng & rng) {
    const int H = 64, V = 96, R = 5;
    std::vector<float> x((size_t) R * H), W((size_t) V * H), dir(H), hq(H);
    for (auto & v : x) v = (float) rng.normal();
    for (auto & v : W) v = (float) (rng.normal() / 8.0);
    for (auto & v : dir) v = (float) rng.normal();
    for (auto & v : hq) v = (float) rng.normal();

    ggml_init_params wp = {ggml_tensor_overhead() * 4, nullptr, true};
    ggml_context * cw = ggml_init(wp);
    ggml_tensor * tx = ggml_new_tensor_2d(cw, GGML_TYPE_F32, H, R);
    ggml_tensor * tw = ggml_new_tensor_2d(cw, GGML_TYPE_F32, H, V);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, 2);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(cw, cpu);
    ggml_backend_tensor_set(tx, x.data(), 0, sizeof(float) * x.size());
    ggml_backend_tensor_set(tw, W.data(), 0, sizeof(float) * W.size());

    ggml_init_params gp = {ggml_tensor_overhead() * 16 + ggml_graph_overhead(), nullptr, true};
    ggml_context * cg = ggml_init(gp);
    ggml_tensor * l = ggml_scale(cg, tx, 2.0f);
    ggml_set_name(l, "l_out-0");
    ggml_tensor * nrm = ggml_rms_norm(cg, l, 1e-6f);
    ggml_set_name(nrm, "result_norm");
    ggml_tensor * o = ggml_mul_mat(cg, tw, nrm);
    ggml_set_name(o, "result_output");
    ggml_set_output(o);
    ggml_cgraph * gf = ggml_new_graph(cg);
    ggml_build_forward_expand(gf, o);

    ggml_backend_sched_t sched = ggml_backend_sched_new(&cpu, nullptr, 1, 64, false, false);
    miita_state * st = miita_state_new(H);
    ggml_backend_sched_set_eval_callback(sched, miita_eval_callback, st);

    // scalar reference: n = rms_norm(2x) per row
    std::vector<double> nref((size_t) R * H);
    for (int r = 0; r < R; ++r) {
        double ss = 0.0;
        for (int k = 0; k < H; ++k) ss += 4.0 * x[r * H + k] * x[r * H + k];
        const double sc = 1.0 / std::sqrt(ss / H + 1e-6);
        for (int k = 0; k < H; ++k) nref[(size_t) r * H + k] = 2.0 * x[r * H + k] * sc;
    }
    double hqn = 0.0;
    for (int k = 0; k < H; ++k) hqn += (double) hq[k] * hq[k];
    hqn = std::sqrt(hqn);
    const float eta = 0.75f;
    std::vector<float> outv((size_t) R * V);
    for (int mode : {MIITA_STEER_OFF, MIITA_STEER_UNGATED, MIITA_STEER_GATED}) {
        const uint8_t mask[R] = {0, 1, 1, 0, 1};
        miita_state_set_key_tensor(st, "l_out-0");
        miita_state_key_reset(st);
        miita_state_begin_batch(st, mask, R);
        miita_state_set_capture(st, true, R);
        miita_state_alpha_clear(st);
        miita_state_set_steer(st, dir.data(), hq.data(), eta, mode);
        ggml_backend_sched_reset(sched);
        const bool ok_run = ggml_backend_sched_graph_compute(sched, gf) == GGML_STATUS_SUCCESS;
        ggml_backend_tensor_get(o, outv.data(), 0, sizeof(float) * outv.size());
        // key = sum of the masked rows of l_out-0
        std::vector<float> ks(H);
        int64_t kr = 0;
        miita_state_key_get(st, ks.data(), &kr);
        std::vector<double> kref(H, 0.0);
        for (int r = 0; r < R; ++r)
            if (mask[r])
                for (int k = 0; k < H; ++k) kref[k] += 2.0 * x[r * H + k];
        const double ek = rel_err(ks.data(), kref.data(), H);
        // captured rows = result_norm before the addition
        std::vector<float> cap((size_t) R * H);
        miita_state_captured_get(st, cap.data(), R);
        const double ec = rel_err(cap.data(), nref.data(), cap.size());
        // logits = W (n + eta alpha dir)
        std::vector<double> oref((size_t) R * V), alpha_ref(R, mode == MIITA_STEER_OFF ? 0.0 : 1.0);
        for (int r = 0; r < R; ++r) {
            if (mode == MIITA_STEER_GATED) {
                double dot = 0.0, nn = 0.0;
                for (int k = 0; k < H; ++k) {
                    dot += nref[(size_t) r * H + k] * hq[k];
                    nn += nref[(size_t) r * H + k] * nref[(size_t) r * H + k];
                }
                alpha_ref[r] = std::max(0.0, dot / (std::sqrt(nn) * hqn));
            }
            for (int v = 0; v < V; ++v) {
                double s = 0.0;
                for (int k = 0; k < H; ++k)
                    s += (double) W[(size_t) v * H + k] * (nref[(size_t) r * H + k] + eta * alpha_ref[r] * dir[k]);
                oref[(size_t) r * V + v] = s;
            }
        }
        const double eo = rel_err(outv.data(), oref.data(), outv.size());
        std::vector<float> al(R, -1.0f);
        const int64_t na = miita_state_alpha_count(st);
        miita_state_alpha_get(st, al.data(), R);
        double ea = 0.0;
        for (int r = 0; r < R && mode != MIITA_STEER_OFF; ++r) ea = std::max(ea, std::fabs(al[r] - alpha_ref[r]));
        char err[256] = "";
        const bool st_ok = miita_state_error(st, err, sizeof err) == 0;
        const bool ok = ok_run && st_ok && kr == 3 && ek <= 1e-6 && ec <= 1e-6 && eo <= 1e-5 && ea <= 1e-6 &&
                        na == (mode == MIITA_STEER_OFF ? 0 : R) && miita_state_hits(st, 0) > 0 && miita_state_hits(st, 1) > 0;
        const char * names[] = {"callback off", "callback ungated", "callback gated"};
        write_file(std::string("callback_logits_") + std::to_string(mode) + ".f32", outv.data(), outv.size() * sizeof(float));
        report(names[mode], ok, fmt("key %.1e, captured rows %.1e", ek, ec) + fmt(", logits after the add %.1e, alpha %.1e", eo, ea) +
                                    (st_ok ? "" : std::string(", state error: ") + err));
    }
    miita_state_free(st);
    ggml_backend_sched_free(sched);
    ggml_free(cg);
    ggml_backend_buffer_free(buf);
    ggml_free(cw);
    ggml_backend_free(cpu);
}

}  // namespace

int main(int argc, char ** argv) {
    g_outdir = argc > 1 ? argv[1] : "";
    const auto t0 = std::chrono::steady_clock::now();
    Rng rng(13);
    std::vector<float> W((size_t) kV * kH);
    for (auto & v : W) v = (float) (rng.normal() / 16.0);
    for (ggml_type t : {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) {
        const Head h = make_head(t, W);
        check_rows(h);
        check_corrections(h, rng);
        check_uncertainty(h, rng);
    }
    check_top_k(rng);
    check_i8(rng);
    check_hamming(rng);
    check_query(rng);
    check_callback(rng);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %d failure(s), %.1f s\n", g_failures ? "FAILED" : "passed", g_failures, s);
    return g_failures ? 1 : 0;
}
