/* Matrix kernels over weight tensors, using the target's dot product. */
#include "kernels.h"

void cb_matmul_rows(const cb_tensor *W, int row_begin, int row_end, const float *X, int x_stride,
                    int n_tok, float *Y, int y_stride) {
    const int cols = (int)W->cols;
    const float *w = W->data;
    for (int r = row_begin; r < row_end; r++) {
        const float *row = w + (size_t)r * cols;
        for (int t = 0; t < n_tok; t++)
            Y[(size_t)t * y_stride + r] = cb_dot_f32(row, X + (size_t)t * x_stride, cols);
    }
}
