/* Matrix kernels over weight tensors, using the target's dot products. */
#include "kernels.h"

void cb_matmul_rows(const cb_tensor *W, int row_begin, int row_end, const float *X, int x_stride,
                    const cb_block_q8_0 *Xq, int xq_stride, int n_tok, float *Y, int y_stride) {
    const int cols = (int)W->cols;
    const size_t row_bytes = cb_row_bytes(W->dtype, W->cols);
    const uint8_t *w = W->data;
    for (int r = row_begin; r < row_end; r++) {
        const void *row = w + (size_t)r * row_bytes;
        float *y = Y + r;
        switch (W->dtype) {
        case CB_F32:
            for (int t = 0; t < n_tok; t++) y[(size_t)t * y_stride] = cb_dot_f32(row, X + (size_t)t * x_stride, cols);
            break;
        case CB_F16:
            for (int t = 0; t < n_tok; t++) y[(size_t)t * y_stride] = cb_dot_f16(row, X + (size_t)t * x_stride, cols);
            break;
        case CB_BF16:
            for (int t = 0; t < n_tok; t++) y[(size_t)t * y_stride] = cb_dot_bf16(row, X + (size_t)t * x_stride, cols);
            break;
        case CB_Q8_0:
            for (int t = 0; t < n_tok; t++) y[(size_t)t * y_stride] = cb_dot_q8_0(row, Xq + (size_t)t * xq_stride, cols);
            break;
        case CB_Q4_0:
            for (int t = 0; t < n_tok; t++) y[(size_t)t * y_stride] = cb_dot_q4_0(row, Xq + (size_t)t * xq_stride, cols);
            break;
        }
    }
}
