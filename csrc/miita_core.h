/*
 * miita_core — the native core of miita-edge: a small C ABI on the hot path of a llama.cpp model.
 *
 * Structure (sections of this header, in order, and the files that implement them):
 *
 *  1. Conventions: every function that can fail returns 0 (or a count) on success and a negative
 *     value on error; the text of the thread's last error is miita_last_error() (callback.cpp).
 *
 *  2. The eval callback and its state (miita_state, opaque; one per llama_context). Inside
 *     llama_decode the callback (ggml_backend_sched_eval_callback) watches two kinds of tensors:
 *       - key tensors ("l_out-<k>", one or more per-layer tensors): it pools the rows that a
 *         per-batch row mask (or per-sequence groups) selects, across ubatches and decode calls,
 *         into one double sum per key tensor (the semantic key, eq. 1);
 *       - "result_norm" (the final hidden state, right before the LM head): it copies the rows
 *         into a capture buffer, then adds eta * alpha * dir to every row (or row r's own dir), with
 *         alpha = max(0, cos(h, h_q)) (gated), alpha = 1 (ungated) or no addition (off). Writing
 *         t->data there changes every later node, so the LM head sees the steered state.
 *     It returns true, except where asked to end a graph computation early: after result_norm
 *     (the rest of the split is only llama.cpp's LM-head product), or after the last key tensor of
 *     a key-only pass (the layers above the deepest key layer).
 *     The state is a composition of roles (csrc/callback_state.h), and its functions below are
 *     grouped by them:
 *       2a. life and the callback                               callback.cpp
 *       2b. key tensors, pooling and sums                       callback_keys.cpp
 *       2c. batch rows: mask, per-sequence groups, output rows  callback_keys.cpp
 *       2d. key marks: snapshots for prefix continuation        callback_keys.cpp
 *       2e. capture of result_norm rows                         callback_steer.cpp
 *       2f. steering: the gated pre-LM-head addition            callback_steer.cpp
 *       2g. early stops                                         callback.cpp
 *       2h. diagnostics: the callback's sticky error and hits   callback.cpp
 *
 *  3. LM-head row kernels (head_kernels.cpp) that read a (possibly quantized) LM-head matrix in
 *     place - e.g. a memory-mapped GGUF tensor - and dequantize only the rows they touch with
 *     ggml's own type traits. No dense float copy of W.
 *
 *  4. Retrieval's scans (recall_scans.cpp): 1-bit sign codes and their Hamming searches, the
 *     inverted file's probe, the query's preparation, int8 shadow scans with exact-recall bounds,
 *     and top-k.
 *
 *  5. ABI facts of the ggml this file was compiled against (callback.cpp).
 *
 * Threading: the callback state is owned by one llama_context and used from the thread that
 * calls llama_decode; setters must not race with a decode. The kernels are reentrant and run on
 * their own worker threads (OpenMP's pool where the build has it).
 */
#ifndef MIITA_CORE_H
#define MIITA_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;

typedef struct miita_state miita_state;

enum miita_steer_mode {
    MIITA_STEER_OFF = 0,     /* no addition */
    MIITA_STEER_UNGATED = 1, /* h += eta * dir */
    MIITA_STEER_GATED = 2,   /* h += eta * max(0, cos(h, h_q)) * dir */
};

/* --- 1. conventions ------------------------------------------------------ */
const char * miita_last_error(void);

/* --- 2a. eval callback state: life and the callback ---------------------- */
miita_state * miita_state_new(int64_t n_embd);
void miita_state_free(miita_state * st);

/* The callback itself; pass it as cb_eval with the state as cb_eval_user_data. */
bool miita_eval_callback(struct ggml_tensor * t, bool ask, void * user_data);

/* --- 2b. key tensors, pooling and sums ----------------------------------- */
/* Name of the tensor whose rows form the semantic key (e.g. "l_out-9"); "" disables.
 * The same as miita_state_set_key_tensors with one name (or none). */
int miita_state_set_key_tensor(miita_state * st, const char * name);
/* Several key tensors at once (e.g. "l_out-6", "l_out-12"): each gets its own sum of the same
 * selected rows, so one prompt pass yields the pooled rows of every listed layer. n = 0 disables
 * collection (the sums are kept, for a decode that needs no key). A non-empty list of another
 * length than the list collecting now resets the sums (switching collection off and on does too);
 * the same length set again while collecting keeps accumulating. At most MIITA_MAX_KEY_TENSORS
 * names, no name twice. */
#define MIITA_MAX_KEY_TENSORS 64
int miita_state_set_key_tensors(miita_state * st, const char * const * names, int64_t n);
/* Number of key sums kept (the length of the last non-empty list; 1 initially). */
int64_t miita_state_key_count(const miita_state * st);
/* Pooling of each key tensor (n = miita_state_key_count entries): last[k] = 0 sums every selected
 * row (the mean's numerator), != 0 keeps only the last selected row (in batch-row order, across
 * ubatches and decode calls; in group mode per group). A list of another length resets every
 * entry to 0; switching collection off and on with a list of the same length keeps them. */
int miita_state_set_key_pooling(miita_state * st, const uint8_t * last, int64_t n);
/* Zero the key sums and row count (call per prompt); also drops the key marks and ends group mode. */
void miita_state_key_reset(miita_state * st);
/* Copy the key sums (n_keys x n_embd floats, n_keys = miita_state_key_count) and the number of
 * rows the mask selected. */
int miita_state_key_get(const miita_state * st, float * sum_out, int64_t * n_rows_out);
/* What each key's value stands for, its divisor for eq. 1's pooled key (n_keys int64): the rows
 * summed for mean pooling, 0 or 1 for last pooling. */
int miita_state_key_rows(const miita_state * st, int64_t * pooled_out);

/* --- 2c. batch rows: mask, per-sequence groups, output rows -------------- */
/* Row mask for the next llama_decode: mask[i] != 0 includes batch row i in the key.
 * n = 0 (mask NULL) includes every row. Also resets the batch row counter. */
int miita_state_begin_batch(miita_state * st, const uint8_t * mask, int64_t n);
/* Per-sequence keys for the next llama_decode (several prompts decoded as separate sequences):
 * group[i] in [0, n_groups) adds batch row i to that group's own sum, -1 leaves it out. While
 * groups are set the single key sum is not touched. Zeroes the group sums and the batch row
 * counter. n_groups = 0 ends group mode (as does miita_state_key_reset). */
int miita_state_begin_groups(miita_state * st, const int32_t * group, int64_t n, int64_t n_groups);
/* The group sums (n_groups x n_keys x n_embd, float, summed in double in batch-row order as the
 * single key is) and each group's count of selected rows. */
int miita_state_group_keys(const miita_state * st, float * sums_out, int64_t * rows_out, int64_t n_groups);
/* The divisors per group and key (n_groups x n_keys int64) for the group sums, as
 * miita_state_key_rows. */
int miita_state_group_key_rows(const miita_state * st, int64_t * pooled_out, int64_t n_groups);
/* Key tensors that hold only the batch's output rows (flags[k] != 0; n = the key list's length,
 * or 0 for none): the deepest key layer of a model cut after it (runtime/key_twin.py), where
 * llama.cpp keeps only the rows whose logits were asked for. Row r of such a tensor is batch row
 * rows[r] of miita_state_set_output_rows (increasing; numbered as begin_batch's mask or
 * begin_groups' ids number them, across the ubatches of one decode); the mask or groups then
 * apply to that batch row. Such tensors refuse key marks. */
int miita_state_set_key_outputs(miita_state * st, const uint8_t * flags, int64_t n);
int miita_state_set_output_rows(miita_state * st, const int64_t * rows, int64_t n);

/* --- 2d. key marks: snapshots for prefix continuation -------------------- */
/* Key snapshots, for a cache of prompt prefixes: before batch row rows[m] (increasing, numbered
 * as the next miita_state_begin_batch's mask numbers them) each key accumulator (double), its
 * pooled count and the key row count are copied aside. Marks stay until set again, until a key
 * list of another length than the current one is set (switching collection off too), or until
 * miita_state_key_reset. miita_state_key_marks_get fails unless every mark was reached; it writes
 * n_marks * n_keys * n_embd sums, n_marks * n_keys pooled counts and n_marks row counts.
 * miita_state_key_set writes one snapshot back (n_keys * n_embd sums, n_keys counts): continuing
 * a decode from it adds the remaining rows in the order a whole pass adds them. */
int miita_state_set_key_marks(miita_state * st, const int64_t * rows, int64_t n);
int64_t miita_state_key_mark_count(const miita_state * st);
int miita_state_key_marks_get(const miita_state * st, double * sums_out, int64_t * pooled_out, int64_t * rows_out);
int miita_state_key_set(miita_state * st, const double * sums, const int64_t * pooled, int64_t rows);

/* --- 2e. capture of result_norm rows ------------------------------------- */
/* Capture result_norm rows (pre-steer) into an internal buffer of at most max_rows rows. */
int miita_state_set_capture(miita_state * st, bool enabled, int64_t max_rows);
int64_t miita_state_captured_rows(const miita_state * st);
int miita_state_captured_get(const miita_state * st, float * out, int64_t max_rows);
void miita_state_capture_clear(miita_state * st);

/* --- 2f. steering: the gated pre-LM-head addition ------------------------ */
/* dir and h_q are n_embd floats (copied); either may be NULL to keep the current one. A refused
 * call (unknown mode, eta not finite, no direction or no h_q for the mode) changes nothing. */
int miita_state_set_steer(miita_state * st, const float * dir, const float * h_q, float eta, int mode);
/* The same with dir_rows directions (dir_rows * n_embd floats): row r of the next result_norm adds
 * direction r, and a result_norm of any other row count is the callback's error (dir_rows = 1: one
 * direction for every row, as above). A row whose direction is zero is left as it is, its alpha
 * still logged. */
int miita_state_set_steer_rows(miita_state * st, const float * dir, int64_t dir_rows, const float * h_q, float eta,
                               int mode);
/* alpha of every steered row since the last clear (mode OFF logs nothing). */
int64_t miita_state_alpha_count(const miita_state * st);
int miita_state_alpha_get(const miita_state * st, float * out, int64_t max_n);
void miita_state_alpha_clear(miita_state * st);

/* --- 2g. early stops ----------------------------------------------------- */
/* Stop each graph computation right after result_norm (callback returns false there), so that
 * llama.cpp does not compute the logits: for callers that take the captured hidden rows to
 * miita_lm_correction_hidden. The logits buffer then holds stale values and must not be read. */
int miita_state_set_stop_after_norm(miita_state * st, bool enabled);
/* Stop each graph computation right after the last key tensor of that graph has been summed, when
 * neither capture nor steering is on: a pass that wants only the key then skips every layer above
 * the deepest key layer. Keys are bitwise those of a full pass. The KV cache of the skipped layers
 * is not written for these positions, so the caller must clear the sequence before decoding on
 * top of it, and the logits buffer must not be read. */
int miita_state_set_stop_after_keys(miita_state * st, bool enabled);

/* --- 2h. diagnostics ----------------------------------------------------- */
/* Sticky error flag set inside the callback (e.g. a tensor that is not contiguous f32,
 * more rows than the mask covers). 0 if none; the message is in err_out (>= 256 bytes). */
int miita_state_error(const miita_state * st, char * err_out, size_t cap);
void miita_state_error_clear(miita_state * st);
/* Number of callback invocations with ask=false on a watched tensor (for tests). */
int64_t miita_state_hits(const miita_state * st, int which /* 0 key, 1 result_norm, 2 graphs stopped early */);

/* --- 3. LM-head row kernels --------------------------------------------- */
/* W: row-major matrix of n_rows rows, each n_embd values of ggml type `type`
 * (row stride = ggml_row_size(type, n_embd) bytes), e.g. a mapped GGUF tensor. */

/* out[i] = W[ids[i]] as float (n x n_embd). */
int miita_lm_gather(const void * W, int type, int64_t n_rows, int64_t n_embd,
                    const int32_t * ids, int64_t n, float * out, int n_threads);

/* Eqs. 6-7 in one call, from the (unsteered) answer-start logits: ids = the K most probable
 * tokens (miita_top_k's order), p_hat = their renormalised softmax, H_hat = its entropy (nats),
 * g = dH_hat/dz over the restricted logits, r = sum_i g_i W[ids_i] (the gradient wrt the hidden
 * state), all in double. Fails on NaN or +inf logits, when every logit is -inf, or on a K outside
 * 1..n_logits. */
int miita_restricted_uncertainty(const void * W, int type, int64_t n_rows, int64_t n_embd, const float * logits,
                                 int64_t n_logits, int64_t K, int32_t * ids, double * p_hat, double * g,
                                 double * H_hat, double * r);

/* out = sum_i weights[i] * W[ids[i]] (n_embd floats). Eq. 7: r_q = W_V^T g. */
int miita_lm_weighted_sum(const void * W, int type, int64_t n_rows, int64_t n_embd,
                          const int32_t * ids, const float * weights, int64_t n,
                          float * out, int n_threads);

/* Correction vectors from logits rows (eq. 2):
 *   R_t = W[y_t] - sum_v p_t(v) W[v],  p_t = softmax(logits_t) over all n_rows.
 * top_k <= 0 or >= n_rows: exact (every row of W).
 * top_k  > 0: only the top_k most probable rows of each position, with p_t from
 *   the exact softmax normaliser (no renormalisation over the top-k set).
 * per_position != 0: out is T x n_embd (one R_t per target position);
 * per_position == 0: out is n_embd, the mean over t (the paper's R_m).
 * logits: T x n_rows floats (row stride n_rows); targets: T token ids. */
int miita_lm_correction(const void * W, int type, int64_t n_rows, int64_t n_embd,
                        const float * logits, const int32_t * targets, int64_t T,
                        int64_t top_k, int per_position, float * out, int n_threads);

/* The same corrections from the final hidden states instead of logits (eq. 2 with
 * p_t = softmax(W h_t)): ONE pass over W computes each row's T logits and accumulates
 * sum_v exp(z_t(v) - m_t) W[v] with a running maximum m_t (an online softmax), so the head is
 * read once instead of twice (logits, then W^T p). Terms below e^-32 of the running maximum are
 * skipped (together < V e^-32 of the mass). hidden: T x n_embd floats (the result_norm rows at
 * the positions that predict targets[t]). out as for miita_lm_correction (top_k is not offered). */
int miita_lm_correction_hidden(const void * W, int type, int64_t n_rows, int64_t n_embd,
                               const float * hidden, const int32_t * targets, int64_t T,
                               int per_position, float * out, int n_threads);

/* --- 4. retrieval's scans ---------------------------------------------- */
/* Dot products of one float query with sign vectors stored as packed bits
 * (np.packbits order: bit 7 of byte 0 is dimension 0): out[a] = sum_i q_i * s_{a,i},
 * s = +1 for a set bit, -1 otherwise. Tables of per-nibble sums make it 1-2 adds per
 * 8 dimensions, reading n * ceil(H/8) bytes instead of n * H floats; the sum order is fixed, so
 * a row's score is bitwise the same whatever n is (and in miita_ivf_search). */
int miita_bit_scores(const uint8_t * bits, int64_t n, int64_t H, const float * q, float * out);

/* For each of n packed rows (nbytes each), the index of the nearest of m packed centroids by
 * Hamming distance (ties: the lower centroid): the assignment step of an inverted file over 1-bit
 * keys. Runs on up to n_threads threads (0: all cores). */
int miita_hamming_nearest(const uint8_t * rows, int64_t n, const uint8_t * cents, int64_t m, int64_t nbytes,
                          int32_t * out, int n_threads);

/* The k rows nearest to the packed query q among the rows of [starts[i], ends[i]) (i < n_ranges),
 * by the Hamming distance restricted to the set bits of mask: popcount((row ^ q) & mask). Writes
 * the row numbers to out in (distance, row) order, min(k, rows in the ranges) of them, and
 * returns that count (-1 on bad arguments). The probe of an inverted file's lists. The distance
 * pass runs on up to n_threads threads (one per 2,048 rows at most); the result does not depend
 * on it. */
int64_t miita_masked_hamming_top(const uint8_t * rows, int64_t nbytes, const int64_t * starts, const int64_t * ends,
                                 int64_t n_ranges, const uint8_t * q, const uint8_t * mask, int64_t k, int64_t * out,
                                 int n_threads);

/* For each range [starts[i], ends[i]) of packed rows (nbytes each), the smallest Hamming distance
 * of its rows to the packed q (-1 for an empty range): the relevance gate's nearest anchor of each
 * retrieved prototype, whose sign cosine is (K - 2 d) / K. Returns 0, -1 on bad arguments. */
int miita_range_min_hamming(const uint8_t * rows, int64_t nbytes, const int64_t * starts, const int64_t * ends,
                            int64_t n_ranges, const uint8_t * q, int64_t * out);

/* A raw pooled key (parts blocks of n_embd floats; rows != NULL: block p still to be divided by
 * rows[p], in float32, as key_pooling.key_mean divides the callback's sums) as a 1-bit memory
 * compares it: minus mean (NULL: none; in float32, so signs and zeros are those of numpy's
 * subtraction), each block at unit
 * norm when parts > 1, coordinates gathered by order (NULL: as they are), the first key_dim kept,
 * the whole at unit norm (norms in double). MemoryBank.prepare_key's arithmetic in one call
 * instead of eight numpy steps right after a prompt pass. */
int miita_prepare_query(const float * key, const float * rows, int64_t parts, int64_t n_embd, const float * mean,
                        const int64_t * order, int64_t key_dim, float * out);

/* The recall fronts' code of a float query of n coordinates, np.packbits order: code bit i is
 * q_i >= 0, mask bit i is |q_i| >= the median of |q| (the mean of the two middle values for an even
 * n, in float32), i.e. index_files.strong_half. ceil(n/8) bytes each. */
int miita_sign_code(const float * q, int64_t n, uint8_t * code, uint8_t * mask);

/* An inverted file over packed 1-bit rows (method/ivf_index.py), as the Python side holds it:
 * nlist centroids (nlist x nbytes), list bounds starts (nlist + 1), the distinct rows in list
 * order (lists, starts[nlist] x nbytes) with their row ids (order), and for each list position the
 * group of rows identical to it (twin_group, -1: none) and how many they are (twin_count); a
 * group g's rows are members[group_start[g] .. group_start[g] + twin_count). */
typedef struct miita_ivf {
    const uint8_t * cent;
    int64_t nlist;
    const int64_t * starts;
    const uint8_t * lists;
    const int64_t * order;
    int64_t nbytes;
    const int32_t * twin_group;
    const int32_t * twin_count;
    const int64_t * group_start;  /* n_groups + 1 values */
    int64_t n_groups;
    const int64_t * members;      /* n_members values */
    int64_t n_members;
} miita_ivf;

/* Retrieval's recall through the inverted file in one call (the default preset's vote):
 * codes the float query q (key_dim coordinates, unit) as miita_sign_code does, takes the nprobe
 * nearest centroids and the count nearest distinct rows of their lists (miita_masked_hamming_top,
 * the list pass on up to n_threads threads), scores those exactly as miita_bit_scores does (the
 * same table and sum, so bitwise the exact scan's score) divided by root, and keeps every row,
 * twins included, whose score reaches the k-th best of that set with twins counted. Writes up to
 * cap of them by row ascending (rows, scores) and returns how many there are (more than cap: call
 * again with room), -1 on bad arguments (a twin group the kernel reads is checked against
 * n_groups and n_members; the rest of the arrays are trusted as their shapes say). One call
 * instead of each step from Python, since right after a prompt pass the caches hold the model,
 * not the interpreter. */
int64_t miita_ivf_search(const miita_ivf * ivf, const float * q, int64_t key_dim, double root, int64_t nprobe,
                         int64_t count, int64_t k, int n_threads, int64_t * out_rows, double * out_scores, int64_t cap);

/* The indices of the k largest of n floats, ordered by value descending then index ascending
 * (the first k of a stable descending sort). Fails (-1, "values contain NaN") when any of the n
 * values is NaN, whatever k is: the pass tests every value on the way. */
int miita_top_k(const float * x, int64_t n, int64_t k, int32_t * out);

/* Exact recall support for eq. 8 over int8 shadow rows: scores every row approximately
 * (scales[a] * q . rows[a]), bounds each segment's max score by the rows' residual norms errs[a]
 * (Cauchy-Schwarz, q a unit vector), and writes to out the indices of the segments whose upper
 * bound reaches the R-th largest lower bound: a superset of the exact Top_R, to be re-scored in
 * float. seg_start = NULL: every row is its own segment. Returns the count, or -1 on error.
 * out must hold n_seg (or n) values. */
int64_t miita_i8_recall(const int8_t * rows, const float * scales, const float * errs, int64_t n, int64_t H,
                        const int64_t * seg_start, int64_t n_seg, const float * q, int64_t R, int64_t * out);

/* Two miita_i8_recall scans of rows with the same H, run concurrently (one thread each) when each
 * would otherwise be split over the pool; the segments of each go to out_a / out_b (room for
 * n_seg each) and their counts to *m_a / *m_b. Returns 0, or -1 with the first argument error. */
int miita_i8_recall_pair(const int8_t * rows_a, const float * scales_a, const float * errs_a, int64_t n_a,
                         const int64_t * seg_start_a, int64_t n_seg_a, const float * q_a, int64_t R_a,
                         int64_t * out_a, int64_t * m_a,
                         const int8_t * rows_b, const float * scales_b, const float * errs_b, int64_t n_b,
                         const int64_t * seg_start_b, int64_t n_seg_b, const float * q_b, int64_t R_b,
                         int64_t * out_b, int64_t * m_b, int64_t H);

/* out[a] = scales[a] * sum_h q[h] * rows[a*H + h] for n int8 rows of H values: the scan of
 * int8 shadow copies of float memory matrices (4x fewer bytes than float32); the caller bounds
 * the error and re-ranks exactly. */
int miita_i8_scores(const int8_t * rows, const float * scales, int64_t n, int64_t H, const float * q,
                    float * out);

/* --- 5. ABI facts of the ggml this file was compiled against, for the import-time check --- */
/* sizeof(struct ggml_tensor) in the headers this file was compiled against; the
 * loaded library's ggml_tensor_overhead() must equal it plus sizeof(ggml_object). */
size_t miita_compiled_tensor_size(void);

#ifdef __cplusplus
}
#endif
#endif /* MIITA_CORE_H */
