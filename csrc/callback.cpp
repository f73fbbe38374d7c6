// callback.cpp - the llama.cpp eval callback and the miita_state API: key capture (one sum, or
// one per sequence of a batch), capture of result_norm rows, the gated pre-LM-head addition,
// the optional stops after result_norm or after the last key tensor, alphas and errors. The contract is in miita_core.h.
#include "kernels_common.h"

namespace miita_internal {

thread_local std::string g_last_error;

int fail(const std::string & msg) {
    g_last_error = msg;
    return -1;
}

}  // namespace miita_internal

using namespace miita_internal;

struct miita_state {
    int64_t n_embd = 0;

    // key: sum of selected rows of one or more per-layer tensors (one sum per tensor)
    std::vector<std::string> key_names;
    std::vector<double> key_sum;   // n_keys * n_embd; double: prompts of thousands of rows, norms ~1e4
    int64_t key_rows = 0;          // rows the mask selected (counted on the first key tensor; all see the same rows)
    // Pooling per key tensor: 0 mean (sum every selected row), 1 last (keep the last selected row,
    // in batch-row order across ubatches and decodes). key_pooled[k]: the rows tensor k's value
    // stands for, i.e. what its sum is divided by (selected rows for mean, 0 or 1 for last).
    std::vector<uint8_t> key_last;
    std::vector<int64_t> key_pooled;
    std::vector<uint8_t> mask;     // per batch row; empty = all rows
    std::vector<int64_t> rows_seen;  // per key tensor: its rows seen in the current llama_decode
    // Key tensors that hold only the batch's output rows (a model's last layer, where llama.cpp
    // keeps the rows asked for): row r of such a tensor is batch row out_rows[r] (across ubatches
    // of one decode, in order); the others hold every batch row.
    std::vector<uint8_t> key_out;
    std::vector<int64_t> out_rows;
    // key snapshots (miita_state_set_key_marks): before batch row marks[m] of the batch that
    // begin_batch described, each key's accumulator, pooled count and the key row count
    std::vector<int64_t> marks;
    std::vector<size_t> mark_next;       // per key tensor: the next mark to take
    std::vector<double> mark_sum;        // n_marks * n_keys * n_embd
    std::vector<int64_t> mark_pooled;    // n_marks * n_keys
    std::vector<int64_t> mark_rows;      // n_marks
    std::vector<uint8_t> mark_taken;     // n_marks * n_keys
    // per-sequence keys (miita_state_begin_groups): group of each batch row, -1 = none
    std::vector<int32_t> group;
    int64_t n_groups = 0;
    std::vector<double> group_sum;  // n_groups * n_keys * n_embd
    std::vector<int64_t> group_rows;    // rows selected per group
    std::vector<int64_t> group_pooled;  // n_groups * n_keys, as key_pooled
    int64_t n_keys_alloc = 1;       // key sums kept (the last non-empty list's length)

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
    // stop the graph once every key tensor has been seen (a key-only pass skips the deeper layers)
    bool stop_after_keys = false;
    size_t keys_in_graph = 0;      // key tensors seen in the current graph computation

    // diagnostics
    std::string error;
    int64_t hits_key = 0;
    int64_t hits_norm = 0;
    int64_t stops = 0;             // graph computations this callback ended early
};

static const char * const k_result_norm = "result_norm";

static bool is_dense_f32(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F32 && t->data != nullptr && ggml_is_contiguous(t);
}

static void set_state_error(miita_state * st, const std::string & msg) {
    if (st->error.empty()) st->error = msg;
}

// One selected row into a key's accumulator: added (mean pooling), or kept in place of what was
// there (last pooling: the row of the template's answer cue, where the model has gathered what it
// is about to say). ``pooled`` counts what the accumulator stands for, the mean's divisor.
static inline void pool_row(double * acc, const float * row, int64_t H, bool last, int64_t & pooled) {
    if (last) {
        for (int64_t i = 0; i < H; ++i) acc[i] = row[i];
        pooled = 1;
    } else {
        for (int64_t i = 0; i < H; ++i) acc[i] += row[i];
        pooled++;
    }
}

// Batch-row lists (key marks, output rows): each row >= 0 and after the one before.
static bool increasing_rows(const int64_t * rows, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (rows[i] < 0 || (i > 0 && rows[i] <= rows[i - 1])) return false;
    }
    return true;
}

// The accumulators of key k as they stand before the mark's row (prefix-cache snapshots).
static void take_mark(miita_state * st, size_t m, size_t k) {
    const int64_t H = st->n_embd;
    const size_t nk = st->key_names.size();
    const size_t mk = m * nk + k;
    std::copy(st->key_sum.begin() + (int64_t) k * H, st->key_sum.begin() + (int64_t) (k + 1) * H,
              st->mark_sum.begin() + (int64_t) mk * H);
    st->mark_pooled[mk] = st->key_pooled[k];
    if (k == 0) st->mark_rows[m] = st->key_rows;
    st->mark_taken[mk] = 1;
}

static void on_key_tensor(miita_state * st, const ggml_tensor * t, size_t k) {
    st->hits_key++;
    if (!is_dense_f32(t) || t->ne[0] != st->n_embd) {
        set_state_error(st, std::string("key tensor ") + t->name + " is not a contiguous f32 [n_embd, rows] tensor");
        return;
    }
    const int64_t rows = ggml_nrows(t);
    const float * data = static_cast<const float *>(t->data);
    const int64_t H = st->n_embd;
    const int64_t n_keys = (int64_t) st->key_names.size();
    int64_t & seen = st->rows_seen[k];
    const bool outputs = k < st->key_out.size() && st->key_out[k] != 0;
    if (outputs && seen + rows > (int64_t) st->out_rows.size()) {
        set_state_error(st, std::string("key tensor ") + t->name + " has more rows than the batch's output rows");
        return;
    }
    if (outputs && !st->marks.empty()) {
        set_state_error(st, "key marks need key tensors that hold every batch row");
        return;
    }
    if (st->n_groups > 0) {
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t batch_row = outputs ? st->out_rows[(size_t) (seen + r)] : seen + r;
            if (batch_row >= (int64_t) st->group.size()) {
                set_state_error(st, "key tensor has more rows than the batch's groups cover");
                break;
            }
            const int32_t g = st->group[batch_row];
            if (g < 0) continue;
            const float * row = data + r * H;
            const int64_t gk = (int64_t) g * n_keys + (int64_t) k;
            pool_row(st->group_sum.data() + gk * H, row, H, st->key_last[k] != 0, st->group_pooled[gk]);
            if (k == 0) st->group_rows[g]++;
        }
        seen += rows;
        return;
    }
    size_t & mi = st->mark_next[k];
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t batch_row = outputs ? st->out_rows[(size_t) (seen + r)] : seen + r;
        while (mi < st->marks.size() && st->marks[mi] == batch_row) take_mark(st, mi++, k);
        if (!st->mask.empty()) {
            if (batch_row >= (int64_t) st->mask.size()) {
                set_state_error(st, "key tensor has more rows than the batch mask covers");
                break;
            }
            if (!st->mask[batch_row]) continue;
        }
        pool_row(st->key_sum.data() + (int64_t) k * H, data + r * H, H, st->key_last[k] != 0, st->key_pooled[k]);
        if (k == 0) st->key_rows++;
    }
    seen += rows;
}

// Index of t's name among the key tensors, or -1. Called for every graph node (hundreds per
// decode): a cheap prefix test first, since every per-layer key tensor shares "l_out-"-like names.
static int64_t key_index(const miita_state * st, const char * name) {
    for (size_t k = 0; k < st->key_names.size(); ++k) {
        if (st->key_names[k] == name) return (int64_t) k;
    }
    return -1;
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
    st->rows_seen.assign(1, 0);
    st->mark_next.assign(1, 0);
    st->key_last.assign(1, 0);
    st->key_pooled.assign(1, 0);
    return st;
}

void miita_state_free(miita_state * st) { delete st; }

bool miita_eval_callback(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * st = static_cast<miita_state *>(user_data);
    if (st == nullptr || t == nullptr) return true;
    const bool is_norm = std::strcmp(t->name, k_result_norm) == 0;
    const int64_t key = is_norm ? -1 : key_index(st, t->name);
    if (ask) {
        if (is_norm) return st->capture || st->mode != MIITA_STEER_OFF || st->stop_after_norm;
        return key >= 0;
    }
    if (key >= 0) {
        on_key_tensor(st, t, (size_t) key);
        if (++st->keys_in_graph >= st->key_names.size()) {  // the last key tensor of this graph
            st->keys_in_graph = 0;
            // Nothing after it is needed when only keys are wanted: no capture, no steering. The
            // layers below the deepest key layer are computed exactly as in a full pass, so the
            // key is bitwise the same; the KV cache of the deeper layers is left unwritten, which
            // is why the engine clears the sequence after such a pass.
            if (st->stop_after_keys && !st->capture && st->mode == MIITA_STEER_OFF) {
                st->stops++;
                return false;
            }
        }
    } else if (is_norm) {
        on_result_norm(st, t);
        // false makes the scheduler leave the rest of this graph split uncomputed and still report
        // success (ggml-backend.cpp, ggml_backend_sched_compute_splits); after result_norm that is
        // only the LM-head product, whose logits the caller then must not read.
        if (st->stop_after_norm) {
            st->stops++;
            return false;
        }
    }
    return true;  // otherwise never false: it would silently skip the rest of the split
}

int miita_state_set_stop_after_norm(miita_state * st, bool enabled) {
    if (!st) return fail("null state");
    st->stop_after_norm = enabled;
    return 0;
}

int miita_state_set_stop_after_keys(miita_state * st, bool enabled) {
    if (!st) return fail("null state");
    st->stop_after_keys = enabled;
    st->keys_in_graph = 0;
    return 0;
}

int miita_state_set_key_tensor(miita_state * st, const char * name) {
    if (!st) return fail("null state");
    if (name == nullptr || name[0] == '\0') return miita_state_set_key_tensors(st, nullptr, 0);
    return miita_state_set_key_tensors(st, &name, 1);
}

int miita_state_set_key_tensors(miita_state * st, const char * const * names, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || n > MIITA_MAX_KEY_TENSORS || (n > 0 && names == nullptr)) return fail("bad key tensor list");
    std::vector<std::string> list;
    for (int64_t k = 0; k < n; ++k) {
        if (names[k] == nullptr || names[k][0] == '\0') return fail("empty key tensor name");
        for (const auto & seen : list) {
            if (seen == names[k]) return fail(std::string("key tensor named twice: ") + names[k]);
        }
        list.emplace_back(names[k]);
    }
    // A different number of tensors changes the sums' shape: start them again. The same count
    // (a decode that switches collection off and on) keeps accumulating, as one tensor always did.
    if (list.size() != st->key_names.size() && !list.empty()) {
        st->key_sum.assign(list.size() * (size_t) st->n_embd, 0.0);
        st->key_rows = 0;
        st->rows_seen.assign(list.size(), 0);
        st->key_pooled.assign(list.size(), 0);
        // the pooling belongs to the list's length: a list switched off and on keeps it, a list of
        // another length pools by the mean until told otherwise
        if ((int64_t) list.size() != st->n_keys_alloc) st->key_last.assign(list.size(), 0);
    }
    if (!list.empty()) st->n_keys_alloc = (int64_t) list.size();
    if (list.size() != st->key_names.size()) {  // snapshots are shaped by the list: drop them
        st->marks.clear();
        st->mark_taken.clear();
    }
    st->key_names = std::move(list);
    st->mark_next.assign(st->key_names.size(), 0);
    st->keys_in_graph = 0;
    return 0;
}

int64_t miita_state_key_count(const miita_state * st) { return st ? st->n_keys_alloc : 0; }

int miita_state_set_key_pooling(miita_state * st, const uint8_t * last, int64_t n) {
    if (!st) return fail("null state");
    if (n != st->n_keys_alloc || (n > 0 && last == nullptr)) return fail("key pooling list must have one entry per key tensor");
    for (int64_t k = 0; k < n; ++k) st->key_last[(size_t) k] = last[k] ? 1 : 0;
    return 0;
}

int miita_state_set_key_outputs(miita_state * st, const uint8_t * flags, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && flags == nullptr)) return fail("bad key output flags");
    st->key_out.assign(flags, flags + n);
    return 0;
}

int miita_state_set_output_rows(miita_state * st, const int64_t * rows, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && rows == nullptr)) return fail("bad output rows");
    if (!increasing_rows(rows, n)) return fail("output rows must be increasing and >= 0");
    st->out_rows.assign(rows, rows + n);
    return 0;
}

int miita_state_key_rows(const miita_state * st, int64_t * pooled_out) {
    if (!st) return fail("null state");
    for (int64_t k = 0; k < st->n_keys_alloc; ++k) pooled_out[k] = st->key_pooled[(size_t) k];
    return 0;
}

int miita_state_group_key_rows(const miita_state * st, int64_t * pooled_out, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups != st->n_groups) return fail("n_groups differs from the groups set");
    for (int64_t k = 0; k < n_groups * st->n_keys_alloc; ++k) pooled_out[k] = st->group_pooled[(size_t) k];
    return 0;
}

void miita_state_key_reset(miita_state * st) {
    std::fill(st->key_sum.begin(), st->key_sum.end(), 0.0);
    std::fill(st->key_pooled.begin(), st->key_pooled.end(), 0);
    st->key_rows = 0;
    std::fill(st->rows_seen.begin(), st->rows_seen.end(), 0);
    st->marks.clear();
    st->mark_next.assign(st->key_names.size(), 0);
    st->n_groups = 0;
    st->group.clear();
    st->keys_in_graph = 0;
}

int miita_state_begin_groups(miita_state * st, const int32_t * group, int64_t n, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups < 0 || n < 0 || (n > 0 && group == nullptr)) return fail("bad groups");
    for (int64_t i = 0; i < n; ++i) {
        if (group[i] < -1 || group[i] >= n_groups) return fail("group id out of range");
    }
    st->n_groups = n_groups;
    st->group.assign(group, group + n);
    st->group_sum.assign((size_t) (n_groups * st->n_keys_alloc * st->n_embd), 0.0);
    st->group_rows.assign((size_t) n_groups, 0);
    st->group_pooled.assign((size_t) (n_groups * st->n_keys_alloc), 0);
    std::fill(st->rows_seen.begin(), st->rows_seen.end(), 0);
    st->keys_in_graph = 0;
    return 0;
}

int miita_state_group_keys(const miita_state * st, float * sums_out, int64_t * rows_out, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups != st->n_groups) return fail("n_groups differs from the groups set");
    for (int64_t k = 0; k < n_groups * st->n_keys_alloc * st->n_embd; ++k) sums_out[k] = (float) st->group_sum[k];
    for (int64_t g = 0; g < n_groups; ++g) rows_out[g] = st->group_rows[g];
    return 0;
}

int miita_state_begin_batch(miita_state * st, const uint8_t * mask, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && mask == nullptr)) return fail("bad mask");
    st->mask.assign(mask, mask + n);
    std::fill(st->rows_seen.begin(), st->rows_seen.end(), 0);
    st->mark_next.assign(st->key_names.size(), 0);
    st->keys_in_graph = 0;
    return 0;
}

int miita_state_key_get(const miita_state * st, float * sum_out, int64_t * n_rows_out) {
    if (!st) return fail("null state");
    for (int64_t i = 0; i < st->n_keys_alloc * st->n_embd; ++i) sum_out[i] = (float) st->key_sum[i];
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

int64_t miita_state_hits(const miita_state * st, int which) {
    return which == 0 ? st->hits_key : which == 1 ? st->hits_norm : st->stops;
}

size_t miita_compiled_tensor_size(void) { return sizeof(struct ggml_tensor); }

}  // extern "C"

int miita_state_set_key_marks(miita_state * st, const int64_t * rows, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && rows == nullptr)) return fail("bad marks");
    if (st->key_names.empty() && n > 0) return fail("marks need key tensors");
    if (!increasing_rows(rows, n)) return fail("marks must be increasing rows >= 0");
    const size_t nk = st->key_names.size();
    st->marks.assign(rows, rows + n);
    st->mark_next.assign(nk, 0);
    st->mark_sum.assign((size_t) n * nk * (size_t) st->n_embd, 0.0);
    st->mark_pooled.assign((size_t) n * nk, 0);
    st->mark_rows.assign((size_t) n, 0);
    st->mark_taken.assign((size_t) n * nk, 0);
    return 0;
}

int64_t miita_state_key_mark_count(const miita_state * st) { return st ? (int64_t) st->marks.size() : 0; }

int miita_state_key_marks_get(const miita_state * st, double * sums_out, int64_t * pooled_out, int64_t * rows_out) {
    if (!st) return fail("null state");
    for (uint8_t taken : st->mark_taken) {
        if (!taken) return fail("a key mark was not reached by the decode");
    }
    std::copy(st->mark_sum.begin(), st->mark_sum.end(), sums_out);
    std::copy(st->mark_pooled.begin(), st->mark_pooled.end(), pooled_out);
    std::copy(st->mark_rows.begin(), st->mark_rows.end(), rows_out);
    return 0;
}

int miita_state_key_set(miita_state * st, const double * sums, const int64_t * pooled, int64_t rows) {
    if (!st) return fail("null state");
    if (sums == nullptr || pooled == nullptr || rows < 0) return fail("bad key state");
    std::copy(sums, sums + st->n_keys_alloc * st->n_embd, st->key_sum.begin());
    std::copy(pooled, pooled + st->n_keys_alloc, st->key_pooled.begin());
    st->key_rows = rows;
    return 0;
}
