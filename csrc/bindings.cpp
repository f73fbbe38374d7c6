// bindings.cpp - the thin pybind11 layer over miita_core.h.
// It only converts arguments (numpy arrays without copies where the core reads
// them in place) and turns negative return codes into Python exceptions.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <vector>
#include <stdexcept>
#include <string>

#include "miita_core.h"

namespace py = pybind11;

namespace {

using f32_in = py::array_t<float, py::array::c_style | py::array::forcecast>;
using i32_in = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

void check(int rc) {
    if (rc != 0) throw std::runtime_error(miita_last_error());
}

// A read-only byte buffer (e.g. np.memmap of the GGUF slice) holding the LM head.
const void * buffer_ptr(const py::buffer & W, int64_t n_rows, int64_t row_bytes) {
    py::buffer_info info = W.request();
    if (info.ndim != 1 || info.itemsize != 1)
        throw std::invalid_argument("W must be a 1-D byte buffer (e.g. a uint8 memmap of the tensor)");
    if (info.size < n_rows * row_bytes)
        throw std::invalid_argument("W buffer is shorter than n_rows * row_bytes");
    return info.ptr;
}

class State {
  public:
    explicit State(int64_t n_embd) : n_embd_(n_embd), st_(miita_state_new(n_embd)) {
        if (!st_) throw std::runtime_error(miita_last_error());
    }
    ~State() { miita_state_free(st_); }
    State(const State &) = delete;
    State & operator=(const State &) = delete;

    uintptr_t user_data() const { return reinterpret_cast<uintptr_t>(st_); }
    int64_t n_embd() const { return n_embd_; }

    void set_key_tensor(const std::string & name) { check(miita_state_set_key_tensor(st_, name.c_str())); }
    void set_key_tensors(const std::vector<std::string> & names) {
        std::vector<const char *> ptrs;
        for (const auto & n : names) ptrs.push_back(n.c_str());
        check(miita_state_set_key_tensors(st_, ptrs.data(), (int64_t) ptrs.size()));
    }
    int64_t key_count() const { return miita_state_key_count(st_); }
    void key_reset() { miita_state_key_reset(st_); }
    void set_key_marks(py::object rows) {
        auto r = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(rows);
        if (!r || r.ndim() != 1) throw std::invalid_argument("marks must be a 1-D array");
        check(miita_state_set_key_marks(st_, r.data(), r.size()));
    }
    // The snapshots of the last marks: sums (n_marks, n_keys*H) float64, pooled (n_marks, n_keys), rows (n_marks,)
    py::tuple key_marks() const {
        const int64_t nm = miita_state_key_mark_count(st_), nk = miita_state_key_count(st_);
        py::array_t<double> sums({nm, nk * n_embd_});
        py::array_t<int64_t> pooled({nm, nk});
        py::array_t<int64_t> rows(nm);
        check(miita_state_key_marks_get(st_, sums.mutable_data(), pooled.mutable_data(), rows.mutable_data()));
        return py::make_tuple(sums, pooled, rows);
    }
    void key_set(py::array_t<double, py::array::c_style | py::array::forcecast> sums,
                 py::array_t<int64_t, py::array::c_style | py::array::forcecast> pooled, int64_t rows) {
        const int64_t nk = miita_state_key_count(st_);
        if (sums.size() != nk * n_embd_ || pooled.size() != nk) throw std::invalid_argument("key state of the wrong size");
        check(miita_state_key_set(st_, sums.data(), pooled.data(), rows));
    }
    void begin_batch(py::object mask) {
        if (mask.is_none()) {
            check(miita_state_begin_batch(st_, nullptr, 0));
            return;
        }
        auto m = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(mask);
        if (!m || m.ndim() != 1) throw std::invalid_argument("mask must be a 1-D array");
        check(miita_state_begin_batch(st_, m.data(), m.size()));
    }
    void begin_groups(py::object group, int64_t n_groups) {
        auto g = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(group);
        if (!g || g.ndim() != 1) throw std::invalid_argument("group must be a 1-D array");
        check(miita_state_begin_groups(st_, g.data(), g.size(), n_groups));
        n_groups_ = n_groups;
    }
    void end_groups() {
        check(miita_state_begin_groups(st_, nullptr, 0, 0));
        n_groups_ = 0;
    }
    py::tuple group_keys() const {
        const int64_t nk = miita_state_key_count(st_);
        py::array_t<float> sums({n_groups_, nk, n_embd_});
        py::array_t<int64_t> rows(n_groups_);
        check(miita_state_group_keys(st_, sums.mutable_data(), rows.mutable_data(), n_groups_));
        if (nk == 1) return py::make_tuple(sums.reshape({n_groups_, n_embd_}), rows);
        return py::make_tuple(sums, rows);
    }
    void set_key_outputs(const std::vector<bool> & out) {
        std::vector<uint8_t> flags(out.begin(), out.end());
        check(miita_state_set_key_outputs(st_, flags.data(), (int64_t) flags.size()));
    }
    void set_output_rows(py::object rows) {
        auto r = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(rows);
        if (!r || r.ndim() != 1) throw std::invalid_argument("output rows must be a 1-D array of integers");
        check(miita_state_set_output_rows(st_, r.data(), r.size()));
    }
    void set_key_pooling(const std::vector<bool> & last) {
        std::vector<uint8_t> flags(last.begin(), last.end());
        check(miita_state_set_key_pooling(st_, flags.data(), (int64_t) flags.size()));
    }
    // Each key's divisor (n_keys,): rows summed (mean pooling), 0 or 1 (last row).
    py::array_t<int64_t> key_rows() const {
        py::array_t<int64_t> out(miita_state_key_count(st_));
        check(miita_state_key_rows(st_, out.mutable_data()));
        return out;
    }
    py::array_t<int64_t> group_key_rows() const {
        const int64_t nk = miita_state_key_count(st_);
        py::array_t<int64_t> out({n_groups_, nk});
        check(miita_state_group_key_rows(st_, out.mutable_data(), n_groups_));
        return out;
    }
    // All key sums (n_keys, H) and the rows summed.
    py::tuple keys() const {
        const int64_t nk = miita_state_key_count(st_);
        py::array_t<float> out({nk, n_embd_});
        int64_t n = 0;
        check(miita_state_key_get(st_, out.mutable_data(), &n));
        return py::make_tuple(out, n);
    }
    // The first key's sum (H,) and the rows summed: the single-layer key.
    py::tuple key() const {
        py::tuple all = keys();
        py::array_t<float> sums = all[0].cast<py::array_t<float>>();
        py::array_t<float> first(n_embd_);
        std::memcpy(first.mutable_data(), sums.data(), sizeof(float) * n_embd_);
        return py::make_tuple(first, all[1]);
    }
    void set_capture(bool enabled, int64_t max_rows) { check(miita_state_set_capture(st_, enabled, max_rows)); }
    void set_stop_after_norm(bool enabled) { check(miita_state_set_stop_after_norm(st_, enabled)); }
    void set_stop_after_keys(bool enabled) { check(miita_state_set_stop_after_keys(st_, enabled)); }
    py::array_t<float> captured() const {
        const int64_t n = miita_state_captured_rows(st_);
        py::array_t<float> out({n, n_embd_});
        check(miita_state_captured_get(st_, out.mutable_data(), n));
        return out;
    }
    void capture_clear() { miita_state_capture_clear(st_); }
    // dir: (n_embd,) for every row, or (R, n_embd): row r of the next result_norm adds dir[r].
    void set_steer(py::object dir, py::object h_q, float eta, int mode) {
        f32_in d, h;
        const float * dp = nullptr;
        const float * hp = nullptr;
        int64_t rows = 1;
        if (!dir.is_none()) {
            d = f32_in::ensure(dir);
            if (d && d.ndim() == 2 && d.shape(1) == n_embd_ && d.shape(0) >= 1) rows = d.shape(0);
            else if (!d || d.ndim() != 1 || d.size() != n_embd_)
                throw std::invalid_argument("dir must be (n_embd,) or (rows, n_embd) with rows >= 1");
            dp = d.data();
        }
        if (!h_q.is_none()) {
            h = f32_in::ensure(h_q);
            if (!h || h.size() != n_embd_) throw std::invalid_argument("h_q must have n_embd values");
            hp = h.data();
        }
        check(miita_state_set_steer_rows(st_, dp, rows, hp, eta, mode));
    }
    py::array_t<float> alphas() const {
        const int64_t n = miita_state_alpha_count(st_);
        py::array_t<float> out(n);
        check(miita_state_alpha_get(st_, out.mutable_data(), n));
        return out;
    }
    void alpha_clear() { miita_state_alpha_clear(st_); }
    py::object error() const {
        char buf[512];
        if (miita_state_error(st_, buf, sizeof buf) == 0) return py::none();
        return py::str(buf);
    }
    void error_clear() { miita_state_error_clear(st_); }
    int64_t hits(int which) const { return miita_state_hits(st_, which); }

  private:
    int64_t n_embd_;
    int64_t n_groups_ = 0;
    miita_state * st_;
};

py::array_t<float> lm_gather(const py::buffer & W, int type, int64_t n_rows, int64_t n_embd, int64_t row_bytes,
                             const i32_in & ids, int n_threads) {
    const void * w = buffer_ptr(W, n_rows, row_bytes);
    py::array_t<float> out({(int64_t) ids.size(), n_embd});
    {
        py::gil_scoped_release nogil;
        check(miita_lm_gather(w, type, n_rows, n_embd, ids.data(), ids.size(), out.mutable_data(), n_threads));
    }
    return out;
}

py::tuple restricted_uncertainty(const py::buffer & W, int type, int64_t n_rows, int64_t n_embd, int64_t row_bytes,
                                 const f32_in & logits, int64_t K) {
    if (logits.ndim() != 1) throw std::invalid_argument("logits must be 1-D float32");
    const void * w = buffer_ptr(W, n_rows, row_bytes);
    py::array_t<int32_t> ids(K);
    py::array_t<double> p(K), g(K), r(n_embd);
    double H = 0.0;
    int rc;
    {
        py::gil_scoped_release nogil;
        rc = miita_restricted_uncertainty(w, type, n_rows, n_embd, logits.data(), logits.size(), K, ids.mutable_data(),
                                          p.mutable_data(), g.mutable_data(), &H, r.mutable_data());
    }
    check(rc);
    return py::make_tuple(ids, p, g, H, r);
}

py::array_t<float> lm_weighted_sum(const py::buffer & W, int type, int64_t n_rows, int64_t n_embd,
                                   int64_t row_bytes, const i32_in & ids, const f32_in & weights, int n_threads) {
    if (ids.size() != weights.size()) throw std::invalid_argument("ids and weights differ in length");
    const void * w = buffer_ptr(W, n_rows, row_bytes);
    py::array_t<float> out(n_embd);
    {
        py::gil_scoped_release nogil;
        check(miita_lm_weighted_sum(w, type, n_rows, n_embd, ids.data(), weights.data(), ids.size(),
                                    out.mutable_data(), n_threads));
    }
    return out;
}

py::array_t<float> lm_correction(const py::buffer & W, int type, int64_t n_rows, int64_t n_embd, int64_t row_bytes,
                                 const f32_in & logits, const i32_in & targets, int64_t top_k, bool per_position,
                                 int n_threads) {
    const int64_t T = targets.size();
    if (logits.ndim() != 2 || logits.shape(0) != T || logits.shape(1) != n_rows)
        throw std::invalid_argument("logits must be (len(targets), n_vocab)");
    const void * w = buffer_ptr(W, n_rows, row_bytes);
    py::array_t<float> out = per_position ? py::array_t<float>({T, n_embd}) : py::array_t<float>(n_embd);
    {
        py::gil_scoped_release nogil;
        check(miita_lm_correction(w, type, n_rows, n_embd, logits.data(), targets.data(), T, top_k,
                                  per_position ? 1 : 0, out.mutable_data(), n_threads));
    }
    return out;
}

py::array_t<float> lm_correction_hidden(const py::buffer & W, int type, int64_t n_rows, int64_t n_embd,
                                        int64_t row_bytes, const f32_in & hidden, const i32_in & targets,
                                        bool per_position, int n_threads) {
    const int64_t T = targets.size();
    if (hidden.ndim() != 2 || hidden.shape(0) != T || hidden.shape(1) != n_embd)
        throw std::invalid_argument("hidden must be (len(targets), n_embd)");
    const void * w = buffer_ptr(W, n_rows, row_bytes);
    py::array_t<float> out = per_position ? py::array_t<float>({T, n_embd}) : py::array_t<float>(n_embd);
    {
        py::gil_scoped_release nogil;
        check(miita_lm_correction_hidden(w, type, n_rows, n_embd, hidden.data(), targets.data(), T,
                                         per_position ? 1 : 0, out.mutable_data(), n_threads));
    }
    return out;
}

py::array_t<float> bit_scores(const py::array_t<uint8_t, py::array::c_style | py::array::forcecast> & bits,
                              const f32_in & q) {
    if (bits.ndim() != 2) throw std::invalid_argument("bits must be (n, ceil(H/8)) uint8");
    const int64_t H = q.size();
    if (bits.shape(1) != (H + 7) / 8) throw std::invalid_argument("bits has the wrong number of bytes per row for q");
    py::array_t<float> out(bits.shape(0));
    check(miita_bit_scores(bits.data(), bits.shape(0), H, q.data(), out.mutable_data()));
    return out;
}

py::array_t<float> i8_scores(const py::array_t<int8_t, py::array::c_style | py::array::forcecast> & rows,
                             const f32_in & scales, const f32_in & q) {
    if (rows.ndim() != 2) throw std::invalid_argument("rows must be (n, H) int8");
    const int64_t n = rows.shape(0), H = rows.shape(1);
    if (q.size() != H) throw std::invalid_argument("q must have H values");
    if (scales.size() != n) throw std::invalid_argument("scales must have one value per row");
    py::array_t<float> out(n);
    check(miita_i8_scores(rows.data(), scales.data(), n, H, q.data(), out.mutable_data()));
    return out;
}

py::array_t<int64_t> i8_recall(const py::array_t<int8_t, py::array::c_style | py::array::forcecast> & rows,
                               const f32_in & scales, const f32_in & errs,
                               const py::array_t<int64_t, py::array::c_style | py::array::forcecast> & seg_start,
                               const f32_in & q, int64_t R) {
    if (rows.ndim() != 2) throw std::invalid_argument("rows must be (n, H) int8");
    const int64_t n = rows.shape(0), H = rows.shape(1);
    if (q.size() != H) throw std::invalid_argument("q must have H values");
    if (scales.size() != n || errs.size() != n) throw std::invalid_argument("scales and errs need one value per row");
    const bool segs = seg_start.size() > 0;
    const int64_t n_seg = segs ? seg_start.size() : n;
    py::array_t<int64_t> out(n_seg);
    int64_t m;
    {
        py::gil_scoped_release nogil;  // retrieval runs the anchor and direction scans on two threads
        m = miita_i8_recall(rows.data(), scales.data(), errs.data(), n, H, segs ? seg_start.data() : nullptr,
                            n_seg, q.data(), R, out.mutable_data());
    }
    if (m < 0) check(-1);
    return py::array_t<int64_t>(m, out.data());
}

using i8_rows = py::array_t<int8_t, py::array::c_style | py::array::forcecast>;
using i64_in = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

py::tuple i8_recall_pair(const i8_rows & rows_a, const f32_in & scales_a, const f32_in & errs_a,
                         const i64_in & seg_a, const f32_in & q_a, int64_t R_a,
                         const i8_rows & rows_b, const f32_in & scales_b, const f32_in & errs_b,
                         const i64_in & seg_b, const f32_in & q_b, int64_t R_b) {
    if (rows_a.ndim() != 2 || rows_b.ndim() != 2) throw std::invalid_argument("rows must be (n, H) int8");
    const int64_t H = rows_a.shape(1), n_a = rows_a.shape(0), n_b = rows_b.shape(0);
    if (rows_b.shape(1) != H) throw std::invalid_argument("both row sets need the same H");
    if (q_a.size() != H || q_b.size() != H) throw std::invalid_argument("q must have H values");
    if (scales_a.size() != n_a || errs_a.size() != n_a || scales_b.size() != n_b || errs_b.size() != n_b)
        throw std::invalid_argument("scales and errs need one value per row");
    const int64_t ns_a = seg_a.size() > 0 ? seg_a.size() : n_a, ns_b = seg_b.size() > 0 ? seg_b.size() : n_b;
    py::array_t<int64_t> out_a(ns_a), out_b(ns_b);
    int64_t m_a = 0, m_b = 0;
    int rc;
    {
        py::gil_scoped_release nogil;
        rc = miita_i8_recall_pair(rows_a.data(), scales_a.data(), errs_a.data(), n_a,
                                  seg_a.size() > 0 ? seg_a.data() : nullptr, ns_a, q_a.data(), R_a,
                                  out_a.mutable_data(), &m_a, rows_b.data(), scales_b.data(), errs_b.data(), n_b,
                                  seg_b.size() > 0 ? seg_b.data() : nullptr, ns_b, q_b.data(), R_b,
                                  out_b.mutable_data(), &m_b, H);
    }
    check(rc);
    return py::make_tuple(py::array_t<int64_t>(m_a, out_a.data()), py::array_t<int64_t>(m_b, out_b.data()));
}

using u8_rows = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>;

py::array_t<int32_t> hamming_nearest(const u8_rows & rows, const u8_rows & cents, int n_threads) {
    if (rows.ndim() != 2 || cents.ndim() != 2 || rows.shape(1) != cents.shape(1))
        throw std::invalid_argument("rows and cents must be (n, B) and (m, B) uint8");
    if (cents.shape(0) == 0) throw std::invalid_argument("cents must hold at least one row");
    py::array_t<int32_t> out(rows.shape(0));
    int rc;
    {
        py::gil_scoped_release nogil;
        rc = miita_hamming_nearest(rows.data(), rows.shape(0), cents.data(), cents.shape(0), rows.shape(1),
                                   out.mutable_data(), n_threads);
    }
    check(rc);
    return out;
}

py::array_t<int64_t> masked_hamming_top(const u8_rows & rows, const i64_in & starts, const i64_in & ends,
                                         const u8_rows & q, const u8_rows & mask, int64_t k, int n_threads) {
    if (rows.ndim() != 2) throw std::invalid_argument("rows must be (n, B) uint8");
    const int64_t B = rows.shape(1), n = rows.shape(0);
    if (q.size() != B || mask.size() != B) throw std::invalid_argument("q and mask must have B bytes");
    if (starts.size() != ends.size()) throw std::invalid_argument("starts and ends must have the same length");
    for (int64_t i = 0; i < starts.size(); ++i)
        if (starts.data()[i] < 0 || ends.data()[i] > n || ends.data()[i] < starts.data()[i])
            throw std::invalid_argument("a range lies outside rows");
    if (k < 0) throw std::invalid_argument("k must be >= 0");
    py::array_t<int64_t> out(k);
    int64_t m;
    {
        py::gil_scoped_release nogil;
        m = miita_masked_hamming_top(rows.data(), B, starts.data(), ends.data(), starts.size(), q.data(), mask.data(),
                                     k, out.mutable_data(), n_threads);
    }
    if (m < 0) check(-1);
    return py::array_t<int64_t>(m, out.data());
}

py::array_t<int64_t> range_min_hamming(const u8_rows & rows, const i64_in & starts, const i64_in & ends,
                                       const u8_rows & q) {
    if (rows.ndim() != 2) throw std::invalid_argument("rows must be (n, B) uint8");
    const int64_t B = rows.shape(1), n = rows.shape(0);
    if (q.size() != B) throw std::invalid_argument("q must have B bytes");
    if (starts.size() != ends.size()) throw std::invalid_argument("starts and ends must have the same length");
    for (int64_t i = 0; i < starts.size(); ++i)
        if (starts.data()[i] < 0 || ends.data()[i] > n || ends.data()[i] < starts.data()[i])
            throw std::invalid_argument("a range lies outside rows");
    py::array_t<int64_t> out(starts.size());
    check(miita_range_min_hamming(rows.data(), B, starts.data(), ends.data(), starts.size(), q.data(),
                                  out.mutable_data()));
    return out;
}

py::array_t<float> prepare_query(const f32_in & key, int64_t parts, const py::object & mean, const py::object & order,
                                 int64_t key_dim, const py::object & rows) {
    if (key.ndim() != 1 || parts <= 0 || key.size() % parts != 0)
        throw std::invalid_argument("key must be 1-D float32 of parts blocks");
    const int64_t full = key.size();
    f32_in m;
    i64_in o;
    if (!mean.is_none()) {
        m = mean.cast<f32_in>();
        if (m.size() != full) throw std::invalid_argument("mean must have the key's length");
    }
    if (!order.is_none()) {
        o = order.cast<i64_in>();
        if (o.size() != full) throw std::invalid_argument("order must have the key's length");
    }
    if (key_dim <= 0 || key_dim > full) throw std::invalid_argument("key_dim must be in 1..len(key)");
    std::vector<float> r;
    if (!rows.is_none()) {  // key_pooling.key_mean's divisors: 0 counts as 1; one count for every block
        const auto c = rows.cast<i64_in>();
        if (c.size() != parts && c.size() != 1) throw std::invalid_argument("rows must hold one count per block, or one");
        for (int64_t p = 0; p < parts; ++p) r.push_back((float) std::max<int64_t>(1, c.data()[c.size() == 1 ? 0 : p]));
    }
    py::array_t<float> out(key_dim);
    check(miita_prepare_query(key.data(), rows.is_none() ? nullptr : r.data(), parts, full / parts,
                              mean.is_none() ? nullptr : m.data(),
                              order.is_none() ? nullptr : o.data(), key_dim, out.mutable_data()));
    return out;
}

py::tuple sign_code(const f32_in & q) {
    if (q.ndim() != 1 || q.size() == 0) throw std::invalid_argument("q must be a non-empty 1-D float32 array");
    const int64_t nb = (q.size() + 7) / 8;
    py::array_t<uint8_t> code(nb), mask(nb);
    check(miita_sign_code(q.data(), q.size(), code.mutable_data(), mask.mutable_data()));
    return py::make_tuple(code, mask);
}

using i32_in = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// An inverted file's arrays, checked once and kept alive, with the miita_ivf view the kernel reads:
// a search passes only the query (converting and checking ten arrays on every call cost more than
// the probe's own bookkeeping right after a prompt pass).
class IvfSearch {
public:
    IvfSearch(u8_rows cent, i64_in starts, u8_rows lists, i64_in order, i32_in twin_group, i32_in twin_count,
              i64_in group_start, i64_in members)
        : cent_(std::move(cent)), lists_(std::move(lists)), starts_(std::move(starts)), order_(std::move(order)),
          group_start_(std::move(group_start)), members_(std::move(members)), twin_group_(std::move(twin_group)),
          twin_count_(std::move(twin_count)) {
        if (cent_.ndim() != 2 || lists_.ndim() != 2 || cent_.shape(1) != lists_.shape(1) || cent_.shape(1) == 0)
            throw std::invalid_argument("cent and lists must be (m, B) and (n, B) uint8");
        const int64_t nlist = cent_.shape(0), n = lists_.shape(0);
        const int64_t * st = starts_.data();
        if (starts_.size() != nlist + 1 || st[0] != 0 || st[nlist] != n)
            throw std::invalid_argument("starts must bound the lists: nlist + 1 values from 0 to len(lists)");
        for (int64_t i = 0; i < nlist; ++i)
            if (st[i + 1] < st[i]) throw std::invalid_argument("starts must not decrease");
        if (order_.size() != n || twin_group_.size() != n || twin_count_.size() != n)
            throw std::invalid_argument("order, twin_group and twin_count need one value per listed row");
        const int64_t n_groups = std::max<int64_t>(0, group_start_.size() - 1);
        for (int64_t i = 0; i < n; ++i) {
            const int32_t g = twin_group_.data()[i];
            const int32_t c = twin_count_.data()[i];
            if (g >= 0 && (g >= n_groups || c < 0 || group_start_.data()[g] < 0 ||
                           group_start_.data()[g] + c > members_.size()))
                throw std::invalid_argument("a twin group lies outside members");
        }
        ivf_ = miita_ivf{cent_.data(), nlist, st, lists_.data(), order_.data(), lists_.shape(1), twin_group_.data(),
                         twin_count_.data(), group_start_.data(), n_groups, members_.data(), members_.size()};
    }

    py::tuple search(const f32_in & q, double root, int64_t nprobe, int64_t count, int64_t k, int n_threads) const {
        if (q.ndim() != 1 || (q.size() + 7) / 8 != ivf_.nbytes)
            throw std::invalid_argument("q must have one float per key bit");
        int64_t cap = std::max<int64_t>(4 * k, 16), m;
        std::vector<int64_t> rows;
        std::vector<double> scores;
        for (;;) {
            rows.resize((size_t) cap);
            scores.resize((size_t) cap);
            {
                py::gil_scoped_release nogil;
                m = miita_ivf_search(&ivf_, q.data(), q.size(), root, nprobe, count, k, n_threads, rows.data(),
                                     scores.data(), cap);
            }
            if (m < 0) check(-1);
            if (m <= cap) break;
            cap = m;  // rare: many ties or large twin groups at the k-th score
        }
        return py::make_tuple(py::array_t<int64_t>(m, rows.data()), py::array_t<double>(m, scores.data()));
    }

private:
    u8_rows cent_, lists_;
    i64_in starts_, order_, group_start_, members_;
    i32_in twin_group_, twin_count_;
    miita_ivf ivf_{};
};

py::array_t<int32_t> top_k(const f32_in & x, int64_t k) {
    if (x.ndim() != 1) throw std::invalid_argument("x must be 1-D float32");
    if (k < 0 || k > x.size()) throw std::invalid_argument("k must be in 0..len(x)");
    py::array_t<int32_t> out(k);
    int rc;
    {
        py::gil_scoped_release nogil;
        rc = miita_top_k(x.data(), x.size(), k, out.mutable_data());
    }
    check(rc);
    return out;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "miita-edge native core: llama.cpp eval callback and LM-head row kernels";
    m.attr("STEER_OFF") = (int) MIITA_STEER_OFF;
    m.attr("STEER_UNGATED") = (int) MIITA_STEER_UNGATED;
    m.attr("STEER_GATED") = (int) MIITA_STEER_GATED;
    m.def("callback_address", [] { return reinterpret_cast<uintptr_t>(&miita_eval_callback); },
          "Address of the C eval callback, to put into llama_context_params.cb_eval.");
    m.def("compiled_tensor_size", &miita_compiled_tensor_size);
    m.def("bit_scores", &bit_scores, py::arg("bits"), py::arg("q"),
          "q · s for every packed sign vector s (rows of np.packbits output), float32.");
    m.def("hamming_nearest", &hamming_nearest, py::arg("rows"), py::arg("cents"), py::arg("n_threads") = 0,
          "For each packed row, the index of the nearest packed centroid by Hamming distance (ties: lower).");
    m.def("masked_hamming_top", &masked_hamming_top, py::arg("rows"), py::arg("starts"), py::arg("ends"),
          py::arg("q"), py::arg("mask"), py::arg("k"), py::arg("n_threads") = 1,
          "The k rows of the ranges [starts[i], ends[i]) nearest to q by popcount((row ^ q) & mask), "
          "in (distance, row) order.");
    m.def("range_min_hamming", &range_min_hamming, py::arg("rows"), py::arg("starts"), py::arg("ends"), py::arg("q"),
          "For each range [starts[i], ends[i]) of packed rows, the smallest Hamming distance to q (-1: empty).");
    m.def("prepare_query", &prepare_query, py::arg("key"), py::arg("parts"), py::arg("mean"), py::arg("order"),
          py::arg("key_dim"), py::arg("rows") = py::none(),
          "A raw pooled key (rows: each block's row count, still to divide by) centred (mean), each of its parts blocks at unit norm, gathered by order, "
          "cut to key_dim and at unit norm: MemoryBank.prepare_key in one call (float32).");
    m.def("sign_code", &sign_code, py::arg("q"),
          "(packed q >= 0, packed |q| >= median |q|): the recall fronts' code of a query.");
    py::class_<IvfSearch>(m, "IvfSearch",
                          "An inverted file's arrays, checked once, for miita_ivf_search (method/ivf_index.py).")
        .def(py::init<u8_rows, i64_in, u8_rows, i64_in, i32_in, i32_in, i64_in, i64_in>(), py::arg("cent"),
             py::arg("starts"), py::arg("lists"), py::arg("order"), py::arg("twin_group"), py::arg("twin_count"),
             py::arg("group_start"), py::arg("members"))
        .def("search", &IvfSearch::search, py::arg("q"), py::arg("root"), py::arg("nprobe"), py::arg("count"),
             py::arg("k"), py::arg("n_threads") = 1,
             "Probe, exact re-score and top-k cut with twins in one call: (rows ascending, scores).");
    m.def("top_k", &top_k, py::arg("x"), py::arg("k"),
          "Indices of the k largest values, by value descending then index ascending (int32).");
    m.def("i8_recall_pair", &i8_recall_pair, py::arg("rows_a"), py::arg("scales_a"), py::arg("errs_a"),
          py::arg("seg_start_a"), py::arg("q_a"), py::arg("R_a"), py::arg("rows_b"), py::arg("scales_b"),
          py::arg("errs_b"), py::arg("seg_start_b"), py::arg("q_b"), py::arg("R_b"),
          "Two i8_recall scans at once (one thread each): (segments_a, segments_b).");
    m.def("i8_recall", &i8_recall, py::arg("rows"), py::arg("scales"), py::arg("errs"), py::arg("seg_start"),
          py::arg("q"), py::arg("R"),
          "Segments (empty seg_start: rows) that may be in the exact Top_R of their max score, from int8 "
          "rows with residual-norm bounds (int64 indices, ascending).");
    m.def("i8_scores", &i8_scores, py::arg("rows"), py::arg("scales"), py::arg("q"),
          "scales[a] * (q · rows[a]) for int8 rows, float32.");

    py::class_<State>(m, "State", "Eval-callback state owned by one llama context.")
        .def(py::init<int64_t>(), py::arg("n_embd"))
        .def_property_readonly("user_data", &State::user_data)
        .def_property_readonly("n_embd", &State::n_embd)
        .def("set_key_tensor", &State::set_key_tensor)
        .def("key_reset", &State::key_reset)
        .def("set_key_marks", &State::set_key_marks, py::arg("rows"))
        .def("key_marks", &State::key_marks)
        .def("key_set", &State::key_set, py::arg("sums"), py::arg("pooled"), py::arg("rows"))
        .def("begin_batch", &State::begin_batch, py::arg("mask") = py::none())
        .def("begin_groups", &State::begin_groups, py::arg("group"), py::arg("n_groups"),
             "per-sequence keys for the next llama_decode: group[i] (-1 = none) of each batch row")
        .def("end_groups", &State::end_groups)
        .def("group_keys", &State::group_keys, "(sums (n_groups, H) float32, rows selected (n_groups,) int64)")
        .def("key", &State::key, "(the first key tensor's row sum (H,) float32, rows summed)")
        .def("keys", &State::keys, "(every key tensor's row sum (n_keys, H) float32, rows summed)")
        .def("set_key_tensors", &State::set_key_tensors,
             "several key tensors, one sum each (e.g. ['l_out-6', 'l_out-12']); [] stops collecting")
        .def("key_count", &State::key_count)
        .def("set_key_outputs", &State::set_key_outputs, py::arg("outputs"),
             "per key tensor: whether it holds only the batch's output rows (a cut model's last layer)")
        .def("set_output_rows", &State::set_output_rows, py::arg("rows"),
             "the batch rows llama.cpp outputs in the next decode, increasing ([] for none)")
        .def("set_key_pooling", &State::set_key_pooling, py::arg("last"),
             "per key tensor: True keeps only its last selected row, False sums every selected row")
        .def("key_rows", &State::key_rows, "each key's divisor (n_keys,) int64: rows summed, or 0/1 for last-row keys")
        .def("group_key_rows", &State::group_key_rows, "(n_groups, n_keys) int64: each group's key divisors")
        .def("set_capture", &State::set_capture, py::arg("enabled"), py::arg("max_rows"))
        .def("set_stop_after_norm", &State::set_stop_after_norm, py::arg("enabled"))
        .def("set_stop_after_keys", &State::set_stop_after_keys, py::arg("enabled"))
        .def("captured", &State::captured)
        .def("capture_clear", &State::capture_clear)
        .def("set_steer", &State::set_steer, py::arg("dir"), py::arg("h_q"), py::arg("eta"), py::arg("mode"))
        .def("alphas", &State::alphas)
        .def("alpha_clear", &State::alpha_clear)
        .def("error", &State::error)
        .def("error_clear", &State::error_clear)
        .def("hits", &State::hits);

    m.def("lm_gather", &lm_gather, py::arg("W"), py::arg("type"), py::arg("n_rows"), py::arg("n_embd"),
          py::arg("row_bytes"), py::arg("ids"), py::arg("n_threads") = 0);
    m.def("restricted_uncertainty", &restricted_uncertainty, py::arg("W"), py::arg("type"), py::arg("n_rows"),
          py::arg("n_embd"), py::arg("row_bytes"), py::arg("logits"), py::arg("K"),
          "Eqs. 6-7 in one call: (ids, p_hat, g, H_hat, r).");
    m.def("lm_weighted_sum", &lm_weighted_sum, py::arg("W"), py::arg("type"), py::arg("n_rows"), py::arg("n_embd"),
          py::arg("row_bytes"), py::arg("ids"), py::arg("weights"), py::arg("n_threads") = 0);
    m.def("lm_correction", &lm_correction, py::arg("W"), py::arg("type"), py::arg("n_rows"), py::arg("n_embd"),
          py::arg("row_bytes"), py::arg("logits"), py::arg("targets"), py::arg("top_k") = 0,
          py::arg("per_position") = false, py::arg("n_threads") = 0);
    m.def("lm_correction_hidden", &lm_correction_hidden, py::arg("W"), py::arg("type"), py::arg("n_rows"),
          py::arg("n_embd"), py::arg("row_bytes"), py::arg("hidden"), py::arg("targets"),
          py::arg("per_position") = false, py::arg("n_threads") = 0,
          "Eq. 2 from final hidden states (p_t = softmax(W h_t)) in one online-softmax pass over W.");
}
