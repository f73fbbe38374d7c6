// callback_keys.cpp - the semantic key: the key tensors and their sums (KeyTensors), the batch-row
// mapping of their rows (BatchRows), snapshots for prefix continuation (KeyMarks) and per-sequence
// sums (KeyGroups); the callback's work on a key tensor and the ABI functions that set and read
// them. The contract is in miita_core.h.
#include "callback_state.h"

using namespace miita_internal;

namespace miita_internal {

void KeyTensors::zero() {
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(pooled.begin(), pooled.end(), 0);
    rows = 0;
}

void KeyMarks::take(size_t m, size_t k, const KeyTensors & keys, int64_t H) {
    const size_t mk = m * keys.names.size() + k;
    std::copy(keys.sum.begin() + (int64_t) k * H, keys.sum.begin() + (int64_t) (k + 1) * H,
              sum.begin() + (int64_t) mk * H);
    pooled[mk] = keys.pooled[k];
    if (k == 0) key_rows[m] = keys.rows;
    taken[mk] = 1;
}

void KeyMarks::clear() {
    rows.clear();
    sum.clear();
    pooled.clear();
    key_rows.clear();
    taken.clear();
}

}  // namespace miita_internal

namespace {

// Batch-row lists (key marks, output rows): each row >= 0 and after the one before.
bool increasing_rows(const int64_t * rows, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (rows[i] < 0 || (i > 0 && rows[i] <= rows[i - 1])) return false;
    }
    return true;
}

// Rows [seen, seen + n) of key tensor k into the sums of their rows' groups.
void pool_groups(miita_state * st, size_t k, bool outputs, int64_t seen, const float * data, int64_t n) {
    const int64_t H = st->n_embd;
    const int64_t n_keys = (int64_t) st->keys.names.size();
    const bool last = st->keys.last[k] != 0;
    KeyGroups & groups = st->groups;
    for (int64_t r = 0; r < n; ++r) {
        const int64_t batch_row = st->batch.batch_row(outputs, seen + r);
        if (batch_row >= (int64_t) groups.of_row.size()) {
            st->diag.set_error("key tensor has more rows than the batch's groups cover");
            break;
        }
        const int32_t g = groups.of_row[batch_row];
        if (g < 0) continue;
        const int64_t gk = (int64_t) g * n_keys + (int64_t) k;
        pool_row(groups.sum.data() + gk * H, data + r * H, H, last, groups.pooled[gk]);
        if (k == 0) groups.rows[g]++;
    }
}

// Rows [seen, seen + n) of key tensor k into its single sum: the marks reached are taken first,
// then the rows the mask selects are pooled.
void pool_single(miita_state * st, size_t k, bool outputs, int64_t seen, const float * data, int64_t n) {
    const int64_t H = st->n_embd;
    const bool last = st->keys.last[k] != 0;
    const std::vector<uint8_t> & mask = st->batch.mask;
    KeyMarks & marks = st->marks;
    size_t & mi = marks.next[k];
    for (int64_t r = 0; r < n; ++r) {
        const int64_t batch_row = st->batch.batch_row(outputs, seen + r);
        while (mi < marks.rows.size() && marks.rows[mi] == batch_row) marks.take(mi++, k, st->keys, H);
        if (!mask.empty()) {
            if (batch_row >= (int64_t) mask.size()) {
                st->diag.set_error("key tensor has more rows than the batch mask covers");
                break;
            }
            if (!mask[batch_row]) continue;
        }
        pool_row(st->keys.sum.data() + (int64_t) k * H, data + r * H, H, last, st->keys.pooled[k]);
        if (k == 0) st->keys.rows++;
    }
}

}  // namespace

namespace miita_internal {

void on_key_tensor(miita_state * st, const ggml_tensor * t, size_t k) {
    st->diag.hits_key++;
    if (!is_dense_f32(t) || t->ne[0] != st->n_embd) {
        st->diag.set_error(std::string("key tensor ") + t->name + " is not a contiguous f32 [n_embd, rows] tensor");
        return;
    }
    const int64_t rows = ggml_nrows(t);
    const float * data = static_cast<const float *>(t->data);
    int64_t & seen = st->batch.seen[k];
    const bool outputs = st->batch.outputs_only(k);
    if (outputs && seen + rows > (int64_t) st->batch.out_rows.size()) {
        st->diag.set_error(std::string("key tensor ") + t->name + " has more rows than the batch's output rows");
        return;
    }
    if (outputs && !st->marks.rows.empty()) {
        st->diag.set_error("key marks need key tensors that hold every batch row");
        return;
    }
    if (st->groups.n > 0) {
        pool_groups(st, k, outputs, seen, data, rows);
    } else {
        pool_single(st, k, outputs, seen, data, rows);
    }
    seen += rows;
}

}  // namespace miita_internal

extern "C" {

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
    KeyTensors & keys = st->keys;
    // A non-empty list of another length than the list collecting now starts the sums again, and
    // so does switching collection off and on (the list is then compared with the empty one); a
    // list of the same length set again while collecting keeps accumulating (a prompt decoded in
    // several llama_decode calls).
    if (list.size() != keys.names.size() && !list.empty()) {
        keys.sum.assign(list.size() * (size_t) st->n_embd, 0.0);
        keys.rows = 0;
        st->batch.seen.assign(list.size(), 0);
        keys.pooled.assign(list.size(), 0);
        // the pooling belongs to the list's length: a list switched off and on keeps it, a list of
        // another length pools by the mean until told otherwise
        if ((int64_t) list.size() != keys.n_alloc) keys.last.assign(list.size(), 0);
    }
    if (!list.empty()) keys.n_alloc = (int64_t) list.size();
    if (list.size() != keys.names.size()) st->marks.clear();  // snapshots are shaped by the list
    keys.names = std::move(list);
    st->marks.next.assign(keys.names.size(), 0);
    st->stop.keys_in_graph = 0;
    return 0;
}

int64_t miita_state_key_count(const miita_state * st) { return st ? st->keys.n_alloc : 0; }

int miita_state_set_key_pooling(miita_state * st, const uint8_t * last, int64_t n) {
    if (!st) return fail("null state");
    if (n != st->keys.n_alloc || (n > 0 && last == nullptr)) return fail("key pooling list must have one entry per key tensor");
    for (int64_t k = 0; k < n; ++k) st->keys.last[(size_t) k] = last[k] ? 1 : 0;
    return 0;
}

int miita_state_set_key_outputs(miita_state * st, const uint8_t * flags, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && flags == nullptr)) return fail("bad key output flags");
    st->batch.key_out.assign(flags, flags + n);
    return 0;
}

int miita_state_set_output_rows(miita_state * st, const int64_t * rows, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && rows == nullptr)) return fail("bad output rows");
    if (!increasing_rows(rows, n)) return fail("output rows must be increasing and >= 0");
    st->batch.out_rows.assign(rows, rows + n);
    return 0;
}

void miita_state_key_reset(miita_state * st) {
    if (!st) return;
    st->keys.zero();
    st->batch.rewind();
    st->marks.clear();
    st->marks.next.assign(st->keys.names.size(), 0);
    st->groups.n = 0;
    st->groups.of_row.clear();
    st->stop.keys_in_graph = 0;
}

int miita_state_begin_batch(miita_state * st, const uint8_t * mask, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && mask == nullptr)) return fail("bad mask");
    st->batch.mask.assign(mask, mask + n);
    st->batch.rewind();
    st->marks.next.assign(st->keys.names.size(), 0);
    st->stop.keys_in_graph = 0;
    return 0;
}

int miita_state_key_get(const miita_state * st, float * sum_out, int64_t * n_rows_out) {
    if (!st) return fail("null state");
    for (int64_t i = 0; i < st->keys.n_alloc * st->n_embd; ++i) sum_out[i] = (float) st->keys.sum[i];
    *n_rows_out = st->keys.rows;
    return 0;
}

int miita_state_key_rows(const miita_state * st, int64_t * pooled_out) {
    if (!st) return fail("null state");
    for (int64_t k = 0; k < st->keys.n_alloc; ++k) pooled_out[k] = st->keys.pooled[(size_t) k];
    return 0;
}

int miita_state_key_set(miita_state * st, const double * sums, const int64_t * pooled, int64_t rows) {
    if (!st) return fail("null state");
    if (sums == nullptr || pooled == nullptr || rows < 0) return fail("bad key state");
    std::copy(sums, sums + st->keys.n_alloc * st->n_embd, st->keys.sum.begin());
    std::copy(pooled, pooled + st->keys.n_alloc, st->keys.pooled.begin());
    st->keys.rows = rows;
    return 0;
}

int miita_state_begin_groups(miita_state * st, const int32_t * group, int64_t n, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups < 0 || n < 0 || (n > 0 && group == nullptr)) return fail("bad groups");
    for (int64_t i = 0; i < n; ++i) {
        if (group[i] < -1 || group[i] >= n_groups) return fail("group id out of range");
    }
    KeyGroups & groups = st->groups;
    const int64_t nk = st->keys.n_alloc;
    groups.n = n_groups;
    groups.of_row.assign(group, group + n);
    groups.sum.assign((size_t) (n_groups * nk * st->n_embd), 0.0);
    groups.rows.assign((size_t) n_groups, 0);
    groups.pooled.assign((size_t) (n_groups * nk), 0);
    st->batch.rewind();
    st->stop.keys_in_graph = 0;
    return 0;
}

int miita_state_group_keys(const miita_state * st, float * sums_out, int64_t * rows_out, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups != st->groups.n) return fail("n_groups differs from the groups set");
    for (int64_t k = 0; k < n_groups * st->keys.n_alloc * st->n_embd; ++k) sums_out[k] = (float) st->groups.sum[k];
    for (int64_t g = 0; g < n_groups; ++g) rows_out[g] = st->groups.rows[g];
    return 0;
}

int miita_state_group_key_rows(const miita_state * st, int64_t * pooled_out, int64_t n_groups) {
    if (!st) return fail("null state");
    if (n_groups != st->groups.n) return fail("n_groups differs from the groups set");
    for (int64_t k = 0; k < n_groups * st->keys.n_alloc; ++k) pooled_out[k] = st->groups.pooled[(size_t) k];
    return 0;
}

int miita_state_set_key_marks(miita_state * st, const int64_t * rows, int64_t n) {
    if (!st) return fail("null state");
    if (n < 0 || (n > 0 && rows == nullptr)) return fail("bad marks");
    if (st->keys.names.empty() && n > 0) return fail("marks need key tensors");
    if (!increasing_rows(rows, n)) return fail("marks must be increasing rows >= 0");
    const size_t nk = st->keys.names.size();
    KeyMarks & marks = st->marks;
    marks.rows.assign(rows, rows + n);
    marks.next.assign(nk, 0);
    marks.sum.assign((size_t) n * nk * (size_t) st->n_embd, 0.0);
    marks.pooled.assign((size_t) n * nk, 0);
    marks.key_rows.assign((size_t) n, 0);
    marks.taken.assign((size_t) n * nk, 0);
    return 0;
}

int64_t miita_state_key_mark_count(const miita_state * st) { return st ? (int64_t) st->marks.rows.size() : 0; }

int miita_state_key_marks_get(const miita_state * st, double * sums_out, int64_t * pooled_out, int64_t * rows_out) {
    if (!st) return fail("null state");
    const KeyMarks & marks = st->marks;
    for (uint8_t taken : marks.taken) {
        if (!taken) return fail("a key mark was not reached by the decode");
    }
    std::copy(marks.sum.begin(), marks.sum.end(), sums_out);
    std::copy(marks.pooled.begin(), marks.pooled.end(), pooled_out);
    std::copy(marks.key_rows.begin(), marks.key_rows.end(), rows_out);
    return 0;
}

}  // extern "C"
