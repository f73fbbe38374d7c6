// callback_steer.cpp - the callback's work on result_norm, the final hidden state right before the
// LM head: a copy of its rows (HiddenCapture), then the gated addition of eta * alpha * dir
// (Steering), which every later node and so the logits see. dir is one direction for every row, or
// one per row (a batch that verifies several answer steps at once, each with its step's
// direction). The ABI functions that set and read them. The contract is in miita_core.h.
#include "callback_state.h"

using namespace miita_internal;

namespace miita_internal {

void HiddenCapture::take(const float * data, int64_t n, int64_t H) {
    const int64_t count = std::min(n, max - rows);
    if (count > 0) {
        std::memcpy(buf.data() + rows * H, data, sizeof(float) * count * H);
        rows += count;
    }
}

void Steering::apply(float * data, int64_t n, int64_t H) {
    for (int64_t r = 0; r < n; ++r) {
        float * h = data + r * H;
        const float * d = dir.data() + (dir_rows > 1 ? r * H : 0);
        float alpha = 1.0f;
        if (mode == MIITA_STEER_GATED) {
            double dot = 0.0, nn = 0.0;
            for (int64_t i = 0; i < H; ++i) {
                dot += (double) h[i] * h_q[i];
                nn += (double) h[i] * h[i];
            }
            const double denom = std::sqrt(nn) * h_q_norm;
            const double c = denom > 0.0 ? dot / denom : 0.0;
            alpha = (float) std::max(0.0, c);
        }
        alphas.push_back(alpha);
        const float scale = eta * alpha;
        if (scale != 0.0f) {
            for (int64_t i = 0; i < H; ++i) h[i] += scale * d[i];
        }
    }
}

void on_result_norm(miita_state * st, ggml_tensor * t) {
    st->diag.hits_norm++;
    if (!is_dense_f32(t) || t->ne[0] != st->n_embd) {
        st->diag.set_error("result_norm is not a contiguous f32 [n_embd, rows] tensor");
        return;
    }
    const int64_t rows = ggml_nrows(t);
    float * data = static_cast<float *>(t->data);
    if (st->capture.on) st->capture.take(data, rows, st->n_embd);  // before the addition
    if (!st->steer.on() || st->steer.dir.empty()) return;
    if (st->steer.dir_rows > 1 && rows != st->steer.dir_rows) {
        st->diag.set_error("steering holds " + std::to_string(st->steer.dir_rows) +
                           " row directions but result_norm has " + std::to_string(rows) + " rows");
        return;
    }
    st->steer.apply(data, rows, st->n_embd);
}

}  // namespace miita_internal

extern "C" {

int miita_state_set_capture(miita_state * st, bool enabled, int64_t max_rows) {
    if (!st) return fail("null state");
    if (max_rows < 0) return fail("max_rows must be >= 0");
    HiddenCapture & cap = st->capture;
    cap.on = enabled;
    cap.max = max_rows;
    cap.buf.assign(max_rows * st->n_embd, 0.0f);
    cap.rows = 0;
    return 0;
}

int64_t miita_state_captured_rows(const miita_state * st) { return st ? st->capture.rows : 0; }

int miita_state_captured_get(const miita_state * st, float * out, int64_t max_rows) {
    if (!st) return fail("null state");
    const int64_t n = std::min(max_rows, st->capture.rows);
    std::memcpy(out, st->capture.buf.data(), sizeof(float) * n * st->n_embd);
    return 0;
}

void miita_state_capture_clear(miita_state * st) {
    if (st) st->capture.rows = 0;
}

int miita_state_set_steer(miita_state * st, const float * dir, const float * h_q, float eta, int mode) {
    return miita_state_set_steer_rows(st, dir, 1, h_q, eta, mode);
}

int miita_state_set_steer_rows(miita_state * st, const float * dir, int64_t dir_rows, const float * h_q, float eta,
                               int mode) {
    if (!st) return fail("null state");
    if (dir_rows < 1) return fail("dir_rows must be >= 1");
    if (mode < MIITA_STEER_OFF || mode > MIITA_STEER_GATED) return fail("unknown steer mode");
    if (!std::isfinite(eta)) return fail("eta must be finite");
    Steering & s = st->steer;
    // checked before anything is copied, so that a refused call leaves the steering as it was
    if (mode != MIITA_STEER_OFF && dir == nullptr && s.dir.empty()) return fail("steering needs a direction");
    if (mode == MIITA_STEER_GATED && h_q == nullptr && s.h_q.empty()) return fail("gated steering needs h_q");
    const int64_t H = st->n_embd;
    if (dir) {
        s.dir.assign(dir, dir + dir_rows * H);
        s.dir_rows = dir_rows;
    }
    if (h_q) {
        s.h_q.assign(h_q, h_q + H);
        double nn = 0.0;
        for (int64_t i = 0; i < H; ++i) nn += (double) h_q[i] * h_q[i];
        s.h_q_norm = (float) std::sqrt(nn);
    }
    s.eta = eta;
    s.mode = mode;
    return 0;
}

int64_t miita_state_alpha_count(const miita_state * st) { return st ? (int64_t) st->steer.alphas.size() : 0; }

int miita_state_alpha_get(const miita_state * st, float * out, int64_t max_n) {
    if (!st) return fail("null state");
    const int64_t n = std::min<int64_t>(max_n, st->steer.alphas.size());
    std::memcpy(out, st->steer.alphas.data(), sizeof(float) * n);
    return 0;
}

void miita_state_alpha_clear(miita_state * st) {
    if (st) st->steer.alphas.clear();
}

}  // extern "C"
