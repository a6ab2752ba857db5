/* Attention of each row's queries over each row's own KV slot, bfloat16 (AVX-512 BF16).
 *
 * generation/model/attention.py compiles and calls it; see its docstring for why it exists. Row b
 * reads slot slots[b] of the store layer (keys and values [num_slots, kv_heads, capacity,
 * head_dim]); its query j sees positions 0 .. min(starts[b] + j, capacity - 1), so no row reads
 * another's length (no padding) and no mask exists. Scores and softmax are float32 (products of
 * bfloat16 are exact in float32); the softmax weights are rounded to bfloat16 for the weighted
 * sum of the values, which is float32, as SDPA's bf16 kernels do; the output is rounded to
 * bfloat16 once.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define GROUP 4 /* queries whose weighted sums share one pass over the values */
#define BLOCK 16 /* queries whose scores are computed together (one scratch of scores) */

static inline __m512 exp_ps(__m512 x) { /* Cephes expf, for x <= 0 */
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* One (row, head) and at most BLOCK of its queries: q [n, dim] -> out rows j at out + j *
 * out_stride; scores: scratch for n rows of scores and n rows of bfloat16 weights. */
static void one_head(const uint16_t *q, int64_t q_step, const uint16_t *k, const uint16_t *v,
                     int64_t n, int64_t dim, int64_t start, int64_t capacity, float scale, uint16_t *out,
                     int64_t out_stride, float *scores) {
    int64_t last = start + n - 1 < capacity - 1 ? start + n - 1 : capacity - 1;
    int64_t len = last + 1; /* positions any query of the row sees */
    int64_t stride = (len + 15) & ~(int64_t)15;
    int64_t chunks = dim / 32;
    /* scores[j][p] = q_j . k_p * scale: 16 positions at a time, their 16 partial sums
     * reduced together (a transpose-add tree), the rest one by one */
    int64_t full = len & ~(int64_t)15;
    __m512 sc = _mm512_set1_ps(scale);
    for (int64_t p0 = 0; p0 < full; p0 += 16) {
        for (int64_t j = 0; j < n; j++) {
            const uint16_t *qj = q + j * q_step;
            __m512 acc[16];
            for (int64_t i = 0; i < 16; i++) {
                const uint16_t *kp = k + (p0 + i) * dim;
                __m512 a = _mm512_setzero_ps();
                for (int64_t c = 0; c < chunks; c++)
                    a = _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512((const void *)(qj + 32 * c)),
                                         (__m512bh)_mm512_loadu_si512((const void *)(kp + 32 * c)));
                acc[i] = a;
            }
            __m512 r1[8], r2[4];
            for (int i = 0; i < 8; i++)
                r1[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                                      _mm512_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
            for (int i = 0; i < 4; i++) {
                __m512d a = _mm512_castps_pd(r1[2 * i]), b = _mm512_castps_pd(r1[2 * i + 1]);
                r2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                                      _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
            }
            __m512 c0 = _mm512_add_ps(_mm512_shuffle_f32x4(r2[0], r2[1], 0x88),
                                      _mm512_shuffle_f32x4(r2[0], r2[1], 0xDD));
            __m512 c1 = _mm512_add_ps(_mm512_shuffle_f32x4(r2[2], r2[3], 0x88),
                                      _mm512_shuffle_f32x4(r2[2], r2[3], 0xDD));
            __m512 d = _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88),
                                     _mm512_shuffle_f32x4(c0, c1, 0xDD));
            _mm512_storeu_ps(scores + j * stride + p0, _mm512_mul_ps(d, sc));
        }
    }
    for (int64_t p = full; p < len; p++) {
        const uint16_t *kp = k + p * dim;
        for (int64_t j = 0; j < n; j++) {
            const uint16_t *qj = q + j * q_step;
            __m512 acc = _mm512_setzero_ps();
            for (int64_t c = 0; c < chunks; c++) {
                __m512i a = _mm512_loadu_si512((const void *)(qj + 32 * c));
                __m512i b = _mm512_loadu_si512((const void *)(kp + 32 * c));
                acc = _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
            }
            scores[j * stride + p] = _mm512_reduce_add_ps(acc) * scale;
        }
    }
    /* softmax numerators, rounded to bfloat16 for the weighted sum (as SDPA's bf16 kernels
     * round them; the normaliser sums them in float32); positions past a query's own weigh 0 */
    float sums[BLOCK];
    uint16_t *weights = (uint16_t *)(scores + n * stride); /* [n, stride] */
    for (int64_t j = 0; j < n; j++) {
        float *s = scores + j * stride;
        uint16_t *wj = weights + j * stride;
        int64_t own = start + j < capacity - 1 ? start + j + 1 : capacity;
        for (int64_t p = own; p < stride; p++) s[p] = -INFINITY;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t p = 0; p < stride; p += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + p));
        __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t p = 0; p < stride; p += 16) {
            __m512 x = _mm512_loadu_ps(s + p);
            __m512 e = exp_ps(_mm512_sub_ps(x, m));
            __mmask16 seen = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
            e = _mm512_maskz_mov_ps(seen, e);
            _mm256_storeu_si256((__m256i *)(wj + p), (__m256i)_mm512_cvtneps_pbh(e));
            sum = _mm512_add_ps(sum, e);
        }
        sums[j] = _mm512_reduce_add_ps(sum);
    }
    /* out_j = sum_p w_jp v_p / sum_j: two positions a VDPBF16PS (their values interleaved dim by
     * dim, their weights a broadcast pair), GROUP queries a pass over the values, 64 dims at a
     * time. Interleaving 128-bit lane by lane puts dims 8k..8k+3 in the low result's lanes
     * 4k..4k+3 and dims 8k+4..8k+7 in the high one's; the store puts them back in order. */
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29,
                                             30, 31);
    int64_t loads = dim / 32; /* 32 dims a load */
    for (int64_t j0 = 0; j0 < n; j0 += GROUP) {
        int64_t g = n - j0 < GROUP ? n - j0 : GROUP;
        for (int64_t c = 0; c < loads; c += 2) {
            int64_t w = loads - c < 2 ? loads - c : 2;
            __m512 acc[GROUP][4];
            for (int64_t a = 0; a < GROUP; a++)
                for (int64_t e = 0; e < 4; e++) acc[a][e] = _mm512_setzero_ps();
            for (int64_t p = 0; p < len; p += 2) {
                __m512i pairs[4];
                for (int64_t e = 0; e < w; e++) {
                    __m512i x = _mm512_loadu_si512((const void *)(v + p * dim + 32 * (c + e)));
                    __m512i y = _mm512_setzero_si512(); /* an odd length's last pair */
                    if (p + 1 < len)
                        y = _mm512_loadu_si512((const void *)(v + (p + 1) * dim + 32 * (c + e)));
                    pairs[2 * e] = _mm512_unpacklo_epi16(x, y);
                    pairs[2 * e + 1] = _mm512_unpackhi_epi16(x, y);
                }
                for (int64_t a = 0; a < g; a++) {
                    int32_t pair;
                    memcpy(&pair, weights + (j0 + a) * stride + p, sizeof pair);
                    __m512bh wt = (__m512bh)_mm512_set1_epi32(pair);
                    for (int64_t e = 0; e < 2 * w; e++)
                        acc[a][e] = _mm512_dpbf16_ps(acc[a][e], (__m512bh)pairs[e], wt);
                }
            }
            for (int64_t a = 0; a < g; a++) {
                __m512 inv = _mm512_set1_ps(1.0f / sums[j0 + a]);
                uint16_t *o = out + (j0 + a) * out_stride + 32 * c;
                for (int64_t e = 0; e < w; e++) {
                    __m512 lo = _mm512_mul_ps(acc[a][2 * e], inv);
                    __m512 hi = _mm512_mul_ps(acc[a][2 * e + 1], inv);
                    __m256bh r0 = _mm512_cvtneps_pbh(_mm512_permutex2var_ps(lo, first, hi));
                    __m256bh r1 = _mm512_cvtneps_pbh(_mm512_permutex2var_ps(lo, second, hi));
                    _mm256_storeu_si256((__m256i *)(o + 32 * e), (__m256i)r0);
                    _mm256_storeu_si256((__m256i *)(o + 32 * e + 16), (__m256i)r1);
                }
            }
        }
    }
}

/* q [B, heads, n, dim] at element strides q_strides (b, head, j; dim contiguous); keys, values
 * [num_slots, kv_heads, capacity, dim] contiguous; out [B, n, heads, dim]; scratch:
 * 2 * min(n, BLOCK) * (capacity + 16) floats (scores, then their bfloat16 weights); dim a
 * multiple of 32. A row's queries run BLOCK at a time, each block over the positions its last
 * query sees: a prompt chunk reads the causal triangle, not the square. */
void slot_attention_bf16(const uint16_t *q, const int64_t *q_strides, const uint16_t *keys,
                         const uint16_t *values, const int64_t *slots, const int64_t *starts,
                         int64_t batch, int64_t heads, int64_t kv_heads, int64_t n, int64_t dim,
                         int64_t capacity, float scale, uint16_t *out, float *scratch) {
    int64_t groups = heads / kv_heads;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < heads; h++) {
            int64_t kv = (slots[b] * kv_heads + h / groups) * capacity * dim;
            const uint16_t *qh = q + b * q_strides[0] + h * q_strides[1];
            for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
                int64_t m = n - j0 < BLOCK ? n - j0 : BLOCK;
                one_head(qh + j0 * q_strides[2], q_strides[2], keys + kv, values + kv, m, dim,
                         starts[b] + j0, capacity, scale, out + ((b * n + j0) * heads + h) * dim,
                         heads * dim, scratch);
            }
        }
    }
}
