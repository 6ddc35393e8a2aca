/* Row dot products for free-shape matrix products on x86-64 (cloud/invariance/rowdot.py), built once per
   instruction set: AVX2 and FMA (eight floats a vector, sixteen registers), or AVX-512 (sixteen floats,
   thirty-two registers) where the compiler is given -mavx512f.

   out[r][j] = sum_i x[r][i] * w[j][i]: every row of x against every row of w, both row-major and
   contiguous, h a multiple of the vector's floats. Blocks of four rows of w against ROWS rows of x (three
   with AVX2, six with AVX-512: what the registers hold) keep 4 * ROWS running sums in registers, so a
   block of w is read from memory once and summed against every row of x while it sits in cache; the next
   block of w is prefetched while this one is summed (a prefetch past its end is a hint: it never faults).
   Every output's sum runs in one order (the vector's lanes over i in steps of its width, then the lanes
   folded) whatever k and the row's place in x: a row's result does not depend on the rows beside it. */
#include <immintrin.h>
#include <stddef.h>

#if defined(__AVX512F__)
typedef __m512 vec;
#define LANES 16
#define ROWS 6
#define LOAD _mm512_loadu_ps
#define FMADD _mm512_fmadd_ps
#define ZERO _mm512_setzero_ps
static inline __m256 fold_half(__m512 v) {
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return _mm256_add_ps(_mm512_castps512_ps256(v), high);
}
#else
typedef __m256 vec;
#define LANES 8
#define ROWS 3
#define LOAD _mm256_loadu_ps
#define FMADD _mm256_fmadd_ps
#define ZERO _mm256_setzero_ps
static inline __m256 fold_half(__m256 v) { return v; }
#endif

static inline float hsum(vec v) {
    __m256 eight = fold_half(v);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define KERNEL(WB, RB)                                                                                  \
    static void k_##WB##x##RB(const float *restrict w, const float *restrict x, long h,                \
                              float *restrict out, long ldo) {                                          \
        vec acc[WB][RB];                                                                                \
        _Pragma("GCC unroll 8") for (int a = 0; a < WB; a++)                                          \
            _Pragma("GCC unroll 8") for (int b = 0; b < RB; b++) acc[a][b] = ZERO();                  \
        for (long i = 0; i < h; i += LANES) {                                                           \
            vec xv[RB];                                                                                 \
            _Pragma("GCC unroll 8") for (int b = 0; b < RB; b++) xv[b] = LOAD(x + b * h + i);         \
            _Pragma("GCC unroll 8") for (int a = 0; a < WB; a++) {                                    \
                _mm_prefetch((const char *)(w + (WB + a) * h + i), _MM_HINT_T0); /* the next block */   \
                vec wv = LOAD(w + a * h + i);                                                           \
                _Pragma("GCC unroll 8") for (int b = 0; b < RB; b++)                                  \
                    acc[a][b] = FMADD(wv, xv[b], acc[a][b]);                                            \
            }                                                                                           \
        }                                                                                               \
        _Pragma("GCC unroll 8") for (int a = 0; a < WB; a++)                                          \
            _Pragma("GCC unroll 8") for (int b = 0; b < RB; b++) out[b * ldo + a] = hsum(acc[a][b]);  \
    }

typedef void (*block_fn)(const float *restrict, const float *restrict, long, float *restrict, long);

KERNEL(1, 1)
KERNEL(4, 1)
KERNEL(4, 2)
KERNEL(4, 3)
#if ROWS == 6
KERNEL(4, 4)
KERNEL(4, 5)
KERNEL(4, 6)
static const block_fn BLOCK[ROWS + 1] = {NULL, k_4x1, k_4x2, k_4x3, k_4x4, k_4x5, k_4x6};
#else
static const block_fn BLOCK[ROWS + 1] = {NULL, k_4x1, k_4x2, k_4x3};
#endif

/* out[r * v + j] = sum_i x[r * h + i] * w[j * h + i] for r < k, j < v; h a multiple of LANES. */
void rowdot(const float *x, const float *w, float *out, long k, long v, long h) {
    long j = 0;
    for (; j + 4 <= v; j += 4) {
        const float *wj = w + j * h;
        for (long r = 0; r < k; r += ROWS) {
            long rows = k - r < ROWS ? k - r : ROWS;
            BLOCK[rows](wj, x + r * h, h, out + r * v + j, v);
        }
    }
    for (; j < v; j++)
        for (long r = 0; r < k; r++) k_1x1(w + j * h, x + r * h, h, out + r * v + j, v);
}
