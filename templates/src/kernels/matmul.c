/* Matrix kernels over weight tensors, using the target's dot products. */
#include "kernels.h"

static inline void store(float *y, enum cb_store mode, const float *scale, int t, float d) {
    if (mode == CB_SET) *y = d;
    else if (mode == CB_ADD) *y += d;
    else *y += scale[t] * d;
}

void cb_matmul_tile(const cb_tensor *W, int r0, int r1, const cb_act *A, const int32_t *in, int n_tok,
                    float *Y, int y_stride, const int32_t *out, enum cb_store mode, const float *scale) {
    const int cols = (int)W->cols;
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    const uint8_t *w = W->data;
    for (int r = r0; r < r1; r++) {
        const void *row = w + (size_t)r * row_bytes;
        for (int t = 0; t < n_tok; t++) {
            const int ti = in ? in[t] : t;
#define X_ROW (A->x + (size_t)ti * A->x_stride)
#define Q_ROW (A->q + (size_t)ti * A->q_stride)
            float d = 0;
            switch (W->dtype) {
            case CB_F32: d = cb_dot_f32(row, X_ROW, cols); break;
            case CB_F16: d = cb_dot_f16(row, X_ROW, cols); break;
            case CB_BF16: d = cb_dot_bf16(row, X_ROW, cols); break;
            case CB_Q8_0: d = cb_dot_q8_0(row, Q_ROW, cols); break;
            case CB_Q4_0: d = cb_dot_q4_0(row, Q_ROW, cols); break;
            }
#undef X_ROW
#undef Q_ROW
            store(Y + (size_t)(out ? out[t] : t) * y_stride + r, mode, scale, t, d);
        }
    }
}
