/* Half floats and the q8_0 / q4_0 block formats: reference quantizers and
 * dequantization (scalar, every target). */
#include <math.h>
#include <string.h>

#include "kernels.h"

float cb_half_to_float(cb_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13); /* inf / nan */
    } else if (exp) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant) { /* subnormal: normalise */
        int shift = 0;
        while (!(mant & 0x400)) mant <<= 1, shift++;
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mant & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

cb_half cb_float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, abs = x & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) return (cb_half)(sign | 0x7C00 | (abs > 0x7F800000u ? 0x200 : 0));
    if (abs >= 0x477FF000u) return (cb_half)(sign | 0x7C00); /* rounds past the largest half */
    if (abs < 0x38800000u) { /* subnormal half (or zero): round the scaled value */
        float scaled;
        uint32_t a = abs;
        memcpy(&scaled, &a, 4);
        /* 2^24 * value, rounded to nearest even by the FPU */
        return (cb_half)(sign | (uint32_t)nearbyintf(scaled * 16777216.0f));
    }
    uint32_t mant = abs & 0x7FFFFF, exp = (abs >> 23) - 112;
    uint32_t half = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1FFF; /* round to nearest, ties to even */
    if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) half++;
    return (cb_half)(sign | half);
}

/* The activation quantizer (kernels.h: llama.cpp's x86 rounding). */
void cb_quantize_row_q8_0(const float *x, cb_block_q8_0 *y, int n) {
    for (int b = 0; b < n / CB_QK; b++, x += CB_QK) {
        float amax = 0;
        for (int j = 0; j < CB_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float id = cb_q8_0_inv_step(amax);
        y[b].d = cb_float_to_half(amax / 127.0f);
        for (int j = 0; j < CB_QK; j++) y[b].qs[j] = (int8_t)cb_nearest_int(x[j] * id);
    }
}

void cb_quantize_row_q4_0(const float *x, cb_block_q4_0 *y, int n) {
    for (int b = 0; b < n / CB_QK; b++, x += CB_QK) {
        float amax = 0, max = 0; /* the value of largest magnitude, sign kept */
        for (int j = 0; j < CB_QK; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
        const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        y[b].d = cb_float_to_half(d);
        for (int j = 0; j < CB_QK / 2; j++) {
            int lo = (int)(x[j] * id + 8.5f), hi = (int)(x[j + CB_QK / 2] * id + 8.5f);
            lo = lo > 15 ? 15 : lo;
            hi = hi > 15 ? 15 : hi;
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void cb_dequantize_row(uint32_t dtype, const void *row, float *out, int n) {
    switch (dtype) {
    case CB_F32:
        memcpy(out, row, sizeof(float) * (size_t)n);
        break;
    case CB_F16:
        for (int i = 0; i < n; i++) out[i] = cb_half_to_float(((const cb_half *)row)[i]);
        break;
    case CB_BF16:
        for (int i = 0; i < n; i++) out[i] = cb_bf16_to_float(((const uint16_t *)row)[i]);
        break;
    case CB_Q8_0:
        for (int b = 0; b < n / CB_QK; b++) {
            const cb_block_q8_0 *blk = (const cb_block_q8_0 *)row + b;
            const float d = cb_half_to_float(blk->d);
            for (int j = 0; j < CB_QK; j++) out[b * CB_QK + j] = d * blk->qs[j];
        }
        break;
    case CB_Q4_0:
        for (int b = 0; b < n / CB_QK; b++) {
            const cb_block_q4_0 *blk = (const cb_block_q4_0 *)row + b;
            const float d = cb_half_to_float(blk->d);
            for (int j = 0; j < CB_QK / 2; j++) {
                out[b * CB_QK + j] = d * ((blk->qs[j] & 0xF) - 8);
                out[b * CB_QK + j + CB_QK / 2] = d * ((blk->qs[j] >> 4) - 8);
            }
        }
        break;
    default:
        cb_dequantize_block_row(dtype, row, out, n);
        break;
    }
}

void cb_interleave4(const void *rows, size_t row_bytes, uint32_t dtype, int nb, void *group) {
    const uint8_t *r = rows;
    const size_t block_bytes = dtype == CB_Q8_0 ? sizeof(cb_block_q8_0) : sizeof(cb_block_q4_0);
    const size_t quants = block_bytes - 2;
    for (int b = 0; b < nb; b++) {
        uint8_t *g = (uint8_t *)group + (size_t)b * 4 * block_bytes;
        for (int i = 0; i < 4; i++) {
            const uint8_t *blk = r + i * row_bytes + b * block_bytes;
            memcpy(g + 2 * i, blk, 2);
            if (dtype == CB_Q8_0) { /* halves: every row's first 16, then every row's last 16 */
                memcpy(g + 8 + 16 * i, blk + 2, 16);
                memcpy(g + 8 + 64 + 16 * i, blk + 2 + 16, 16);
            } else {
                memcpy(g + 8 + i * quants, blk + 2, quants);
            }
        }
    }
}
