// callback.cpp - the llama.cpp eval callback: which tensors it watches, the dispatch of each to the
// key sums (callback_keys.cpp) or to result_norm's capture and addition (callback_steer.cpp), and
// the early stops after result_norm or after the last key tensor (EarlyStop); the state's life,
// its diagnostics and the thread's last error. The roles are in callback_state.h, the contract in
// miita_core.h.
#include "callback_state.h"

namespace miita_internal {

thread_local std::string g_last_error;

int fail(const std::string & msg) {
    g_last_error = msg;
    return -1;
}

}  // namespace miita_internal

using namespace miita_internal;

namespace {

const char * const k_result_norm = "result_norm";

// After the last key tensor of a graph: whether to end the graph there. Nothing after it is needed
// when only keys are wanted (no capture, no steering). The layers below the deepest key layer are
// computed exactly as in a full pass, so the key is bitwise the same; the KV cache of the deeper
// layers is left unwritten, which is why the engine clears the sequence after such a pass.
bool stop_after_last_key(miita_state * st) {
    if (st->stop.after_keys && !st->capture.on && !st->steer.on()) {
        st->stop.count++;
        return true;
    }
    return false;
}

}  // namespace

extern "C" {

const char * miita_last_error(void) { return g_last_error.c_str(); }

miita_state * miita_state_new(int64_t n_embd) {
    if (n_embd <= 0) {
        fail("n_embd must be positive");
        return nullptr;
    }
    return new miita_state(n_embd);
}

void miita_state_free(miita_state * st) { delete st; }

bool miita_eval_callback(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * st = static_cast<miita_state *>(user_data);
    if (st == nullptr || t == nullptr) return true;
    const bool is_norm = std::strcmp(t->name, k_result_norm) == 0;
    const int64_t key = is_norm ? -1 : st->keys.index(t->name);
    if (ask) {
        if (is_norm) return st->capture.on || st->steer.on() || st->stop.after_norm;
        return key >= 0;
    }
    if (key >= 0) {
        on_key_tensor(st, t, (size_t) key);
        if (++st->stop.keys_in_graph >= st->keys.names.size()) {  // the last key tensor of this graph
            st->stop.keys_in_graph = 0;
            if (stop_after_last_key(st)) return false;
        }
    } else if (is_norm) {
        on_result_norm(st, t);
        // false makes the scheduler leave the rest of this graph split uncomputed and still report
        // success (ggml-backend.cpp, ggml_backend_sched_compute_splits); after result_norm that is
        // only the LM-head product, whose logits the caller then must not read.
        if (st->stop.after_norm) {
            st->stop.count++;
            return false;
        }
    }
    return true;  // otherwise never false: it would silently skip the rest of the split
}

int miita_state_set_stop_after_norm(miita_state * st, bool enabled) {
    if (!st) return fail("null state");
    st->stop.after_norm = enabled;
    return 0;
}

int miita_state_set_stop_after_keys(miita_state * st, bool enabled) {
    if (!st) return fail("null state");
    st->stop.after_keys = enabled;
    st->stop.keys_in_graph = 0;
    return 0;
}

int miita_state_error(const miita_state * st, char * err_out, size_t cap) {
    if (!st) return fail("null state");
    if (st->diag.error.empty()) return 0;
    if (err_out && cap) std::snprintf(err_out, cap, "%s", st->diag.error.c_str());
    return -1;
}

void miita_state_error_clear(miita_state * st) {
    if (st) st->diag.error.clear();
}

int64_t miita_state_hits(const miita_state * st, int which) {
    if (!st) return 0;
    return which == 0 ? st->diag.hits_key : which == 1 ? st->diag.hits_norm : st->stop.count;
}

size_t miita_compiled_tensor_size(void) { return sizeof(struct ggml_tensor); }

}  // extern "C"
