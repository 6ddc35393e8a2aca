/* Row dot products for free-shape matrix products on x86-64 with AVX2 and FMA (cloud/invariance/rowdot.py).

   out[r][j] = sum_i x[r][i] * w[j][i]: every row of x against every row of w, both row-major and
   contiguous, h a multiple of 8. Blocks of four rows of w against three rows of x keep twelve running
   sums in registers, so w, the large operand, is read from memory once for all rows of x; the next
   block of w is prefetched while this one is summed (a prefetch past its end is a hint: it never
   faults). Every output's sum runs in one order (eight lanes over i in steps of 8, then the lanes
   folded) whatever k and the row's place in x: a row's result does not depend on the rows beside it. */
#include <immintrin.h>
#include <stddef.h>

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define KERNEL(WB, RB)                                                                                  \
    static inline void k_##WB##x##RB(const float *restrict w, const float *restrict x, long h,         \
                                     float *restrict out, long ldo) {                                  \
        __m256 acc[WB][RB];                                                                             \
        _Pragma("GCC unroll 4") for (int a = 0; a < WB; a++)                                          \
            _Pragma("GCC unroll 4") for (int b = 0; b < RB; b++) acc[a][b] = _mm256_setzero_ps();     \
        for (long i = 0; i < h; i += 8) {                                                               \
            __m256 xv[RB];                                                                              \
            _Pragma("GCC unroll 4") for (int b = 0; b < RB; b++) xv[b] = _mm256_loadu_ps(x + b * h + i); \
            _Pragma("GCC unroll 4") for (int a = 0; a < WB; a++) {                                    \
                _mm_prefetch((const char *)(w + (WB + a) * h + i), _MM_HINT_T0); /* the next block */   \
                __m256 wv = _mm256_loadu_ps(w + a * h + i);                                             \
                _Pragma("GCC unroll 4") for (int b = 0; b < RB; b++)                                  \
                    acc[a][b] = _mm256_fmadd_ps(wv, xv[b], acc[a][b]);                                  \
            }                                                                                           \
        }                                                                                               \
        _Pragma("GCC unroll 4") for (int a = 0; a < WB; a++)                                          \
            _Pragma("GCC unroll 4") for (int b = 0; b < RB; b++) out[b * ldo + a] = hsum(acc[a][b]);  \
    }

KERNEL(4, 3)
KERNEL(4, 2)
KERNEL(4, 1)
KERNEL(1, 1)

/* out[r * v + j] = sum_i x[r * h + i] * w[j * h + i] for r < k, j < v; h a multiple of 8. Every output's
   sum runs in the same order (eight lanes over i, then the lanes folded), whatever k and the row's place. */
void rowdot(const float *x, const float *w, float *out, long k, long v, long h) {
    long j = 0;
    for (; j + 4 <= v; j += 4) {
        const float *wj = w + j * h;
        long r = 0;
        for (; r + 3 <= k; r += 3) k_4x3(wj, x + r * h, h, out + r * v + j, v);
        if (k - r == 2) k_4x2(wj, x + r * h, h, out + r * v + j, v);
        else if (k - r == 1) k_4x1(wj, x + r * h, h, out + r * v + j, v);
    }
    for (; j < v; j++)
        for (long r = 0; r < k; r++) k_1x1(w + j * h, x + r * h, h, out + r * v + j, v);
}
