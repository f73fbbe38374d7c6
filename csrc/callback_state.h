// callback_state.h - the eval callback's state, one struct per role, and the opaque miita_state of
// the C ABI as their composition. Internal: the ABI (miita_core.h) sees only miita_state *.
//
//   KeyTensors   which per-layer tensors form the key, how each pools, and the key sums     callback_keys.cpp
//   BatchRows    which batch row each row of a key tensor is (mask, output rows, cursors)    callback_keys.cpp
//   KeyMarks     snapshots of the key sums before given batch rows (prefix continuation)     callback_keys.cpp
//   KeyGroups    per-sequence key sums of a batch of several prompts                         callback_keys.cpp
//   HiddenCapture  copies of the result_norm rows (before the addition)                       callback_steer.cpp
//   Steering     the gated pre-LM-head addition and the alpha of every row it touched        callback_steer.cpp
//   EarlyStop    ending a graph computation after result_norm or after the last key tensor   callback.cpp
//   Diagnostics  the sticky error set inside the callback and the hit counters               callback.cpp
//
// The callback itself (callback.cpp) dispatches each watched tensor to on_key_tensor or
// on_result_norm and decides the early stops; every setter of the ABI touches the roles it names.
#pragma once

#include "kernels_common.h"

namespace miita_internal {

// The key tensors and the sums they feed outside group mode. Each key tensor k has an
// accumulator of n_embd doubles (prompts of thousands of rows, norms ~1e4) and a pooled count:
// what its value stands for, i.e. the mean's divisor (selected rows for mean pooling, 0 or 1 for
// last pooling).
struct KeyTensors {
    std::vector<std::string> names;  // collected now; empty = collection off (the sums are kept)
    int64_t n_alloc = 1;             // sums kept (the last non-empty list's length)
    std::vector<uint8_t> last;       // per key: 0 mean pooling, 1 last selected row
    std::vector<double> sum;         // n_alloc * n_embd
    std::vector<int64_t> pooled;     // n_alloc
    int64_t rows = 0;                // rows selected (counted on key 0; every key sees the same rows)

    explicit KeyTensors(int64_t n_embd) : last(1, 0), sum((size_t) n_embd, 0.0), pooled(1, 0) {}

    // Index of name among the key tensors, or -1. Called for every graph node (hundreds per
    // decode); the list holds at most MIITA_MAX_KEY_TENSORS names and each comparison stops at the
    // first differing character.
    int64_t index(const char * name) const {
        for (size_t k = 0; k < names.size(); ++k) {
            if (names[k] == name) return (int64_t) k;
        }
        return -1;
    }
    void zero();
};

// Which batch row each row of a key tensor is. Most key tensors hold every batch row of the
// decode, across its ubatches in order; those flagged in key_out hold only the batch's output
// rows (a model's last layer, where llama.cpp keeps the rows asked for), row r being batch row
// out_rows[r]. The mask (empty = every row) selects the rows the single key sums.
struct BatchRows {
    std::vector<uint8_t> mask;       // per batch row
    std::vector<uint8_t> key_out;    // per key tensor
    std::vector<int64_t> out_rows;   // increasing batch rows
    std::vector<int64_t> seen;       // per key tensor: its rows seen in the current llama_decode

    bool outputs_only(size_t k) const { return k < key_out.size() && key_out[k] != 0; }
    // Batch row of the i-th row key tensor k has seen in this decode.
    int64_t batch_row(bool outputs, int64_t i) const { return outputs ? out_rows[(size_t) i] : i; }
    void rewind() { std::fill(seen.begin(), seen.end(), 0); }
};

// Key snapshots for a cache of prompt prefixes: before batch row rows[m] of the batch that
// begin_batch described, each key's accumulator, pooled count and the key row count.
struct KeyMarks {
    std::vector<int64_t> rows;
    std::vector<size_t> next;        // per key tensor: the next mark to take
    std::vector<double> sum;         // n_marks * n_keys * n_embd
    std::vector<int64_t> pooled;     // n_marks * n_keys
    std::vector<int64_t> key_rows;   // n_marks
    std::vector<uint8_t> taken;      // n_marks * n_keys

    KeyMarks() : next(1, 0) {}
    // Snapshot key k's accumulator as it stands before mark m's row.
    void take(size_t m, size_t k, const KeyTensors & keys, int64_t n_embd);
    // Drop every snapshot (they are shaped by the key list).
    void clear();
};

// Per-sequence keys (begin_groups): each batch row's group, -1 = none, and one set of key sums
// per group, pooled as KeyTensors pools.
struct KeyGroups {
    std::vector<int32_t> of_row;
    int64_t n = 0;                   // 0: group mode off
    std::vector<double> sum;         // n * n_keys * n_embd
    std::vector<int64_t> rows;       // rows selected per group
    std::vector<int64_t> pooled;     // n * n_keys
};

// Copies of result_norm rows, before the addition, up to max rows.
struct HiddenCapture {
    bool on = false;
    int64_t max = 0;
    std::vector<float> buf;          // max * n_embd
    int64_t rows = 0;

    void take(const float * data, int64_t n, int64_t n_embd);
};

// The pre-LM-head addition h += eta * alpha * dir on every result_norm row, alpha = 1 (ungated)
// or max(0, cos(h, h_q)) (gated), and the alpha of every row it touched. dir holds one direction
// (dir_rows = 1, every row) or one per result_norm row (row r adds dir's row r).
struct Steering {
    int mode = MIITA_STEER_OFF;
    float eta = 0.0f;
    std::vector<float> dir;          // dir_rows * n_embd
    int64_t dir_rows = 1;
    std::vector<float> h_q;
    float h_q_norm = 0.0f;
    std::vector<float> alphas;

    bool on() const { return mode != MIITA_STEER_OFF; }
    void apply(float * data, int64_t n, int64_t n_embd);
};

// Ending a graph computation early: returning false from the callback makes the scheduler leave
// the rest of that graph split uncomputed (and still report success).
struct EarlyStop {
    bool after_norm = false;         // skip llama.cpp's LM-head product
    bool after_keys = false;         // skip the layers above the deepest key layer
    size_t keys_in_graph = 0;        // key tensors seen in the current graph computation
    int64_t count = 0;               // graph computations ended early
};

// What the callback reports back: its first error (sticky until cleared) and the tensors it saw.
struct Diagnostics {
    std::string error;
    int64_t hits_key = 0;
    int64_t hits_norm = 0;

    void set_error(const std::string & msg) {
        if (error.empty()) error = msg;
    }
};

// One selected row into a key accumulator: added (mean pooling), or kept in place of what was
// there (last pooling: the row of the template's answer cue, where the model has gathered what it
// is about to say). pooled counts what the accumulator stands for, the mean's divisor.
inline void pool_row(double * acc, const float * row, int64_t H, bool last, int64_t & pooled) {
    if (last) {
        for (int64_t i = 0; i < H; ++i) acc[i] = row[i];
        pooled = 1;
    } else {
        for (int64_t i = 0; i < H; ++i) acc[i] += row[i];
        pooled++;
    }
}

inline bool is_dense_f32(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F32 && t->data != nullptr && ggml_is_contiguous(t);
}

}  // namespace miita_internal

struct miita_state {
    int64_t n_embd;
    miita_internal::KeyTensors keys;
    miita_internal::BatchRows batch;
    miita_internal::KeyMarks marks;
    miita_internal::KeyGroups groups;
    miita_internal::HiddenCapture capture;
    miita_internal::Steering steer;
    miita_internal::EarlyStop stop;
    miita_internal::Diagnostics diag;

    explicit miita_state(int64_t H) : n_embd(H), keys(H) { batch.seen.assign(1, 0); }
};

namespace miita_internal {

// The callback's work on a watched tensor (ask = false): key tensor k (callback_keys.cpp) and
// result_norm (callback_steer.cpp). Errors go to st->diag.
void on_key_tensor(miita_state * st, const ggml_tensor * t, size_t k);
void on_result_norm(miita_state * st, ggml_tensor * t);

}  // namespace miita_internal
