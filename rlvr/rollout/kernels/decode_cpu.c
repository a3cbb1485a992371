/* rlvr's fused CPU decode loop for Llama / Qwen2 / Qwen3 (docs/rollout.md).
 *
 * Why it exists: on a CPU, one decode step of a small model is a few hundred PyTorch ops of a few
 * microseconds each, and for the shipped 0.34M-parameter model the dispatch costs more than the
 * arithmetic. This file runs whole decode loops (every layer, the LM head and the sampler, for as
 * many steps as asked) for a slice of rows in one C call: no per-op dispatch, no Python, and the
 * rows of a slice need nothing from other slices, so the engine runs one slice per core with no
 * synchronisation inside a step (ctypes releases the GIL during the call).
 *
 * What it computes is the Hugging Face forward, up to float rounding (tested: every step's logits
 * against the forward, greedy tokens against `generate`): RMSNorm, q/k/v projections (+ biases,
 * as Qwen2 and Llama's attention_bias have; + Qwen3 per-head q/k RMSNorm), RoPE from a table the
 * model's own rotary module built, grouped-query attention, SiLU-gated MLP (+ Llama's mlp_bias),
 * final norm, LM head. Matmuls go through BLAS `sgemm_`
 * (MKL's, taken from the loaded libtorch) with one BLAS thread per slice, straight from the live
 * parameters (q, k and v write side by side into one activation through the output stride, so
 * nothing is copied); without BLAS a portable loop is used. `rlvr_prefill` runs the prompts the
 * same way, all real tokens of a slice of prompts as one batch.
 *
 * Shared-prompt attention: the G completions of a prompt read one copy of its prompt KV
 * ([B, Hkv, P, D], never broadcast); only their own tokens live in per-row caches [N, Hkv, C, D].
 * Rows of one group sit next to each other in a slice, so the prompt's keys stay in cache while
 * its G rows attend to them (the Hydragen / cascade-attention idea, without the batching).
 *
 * Threads: `rlvr_run` splits a job into slices and runs them on a small team of threads kept by
 * this file (the caller runs slice 0). Between jobs the team spins for 2 ms before it sleeps, as
 * OpenMP runtimes do: waking an idle core cost 1-3 ms on the virtual machine this was measured on,
 * the length of a whole tiny-model decode. `rlvr_wake` starts that spin early. Short spins only:
 * on a host whose cores are oversubscribed a spinning thread takes a core from a working one.
 * With few rows a decode job is instead cooperative (JOB_COOP): every thread runs all rows and
 * computes its share of each product's outputs ("cooperative decode" below).
 *
 * bfloat16 weights (`wbf16`): the seven projections of every layer and the LM head may be bfloat16
 * copies packed for the product (bf16_linear), so that the trainer's bf16 mixed precision samples at
 * the precision it trains in. Each product then rounds its input rows to bfloat16 and accumulates in
 * float32 (what a bf16 nn.Linear on a CPU computes, up to summation order and the output's own
 * rounding, which is skipped: the residual stream, norms, attention and the sampler stay float32).
 * Half the bytes per weight, and with AVX512-BF16 two products per lane per instruction
 * (`vdpbf16ps`); without it a portable loop widens each weight (correct, slow: the engine then keeps
 * the float32 weights instead).
 *
 * Layout conventions: row-major, nn.Linear weights [out, in]. Row r belongs to prompt r / n.
 * Step t samples token t of every live row: t = 0 from the prompt's last logits, t >= 1 by
 * feeding token t-1 (position prompt_len + t - 1, cache slot t-1).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef void (*sgemm_fn)(const char *transa, const char *transb, const int *m, const int *n,
                         const int *k, const float *alpha, const float *a, const int *lda,
                         const float *b, const int *ldb, const float *beta, float *c,
                         const int *ldc);
typedef int (*set_threads_fn)(int);

/* Per-layer pointers, in this order, at lw[layer * LW_COUNT + slot]. Biases and q/k norms may be
 * NULL. Weights are nn.Linear's [out, in]. */
enum { LW_NORM1, LW_WQ, LW_WK, LW_WV, LW_BQ, LW_BK, LW_BV, LW_QNORM, LW_KNORM, LW_WO, LW_BO,
       LW_NORM2, LW_WG, LW_WU, LW_WDOWN, LW_BG, LW_BU, LW_BDOWN, LW_KPRE, LW_VPRE, LW_KSUF,
       LW_VSUF, LW_COUNT };

typedef struct {
    int32_t L, E, H, Hkv, D, I, V;
    int32_t B, n, P, C;             /* prompts, rows per prompt, padded prompt length, max new */
    int32_t greedy, n_eos, abi;
    int32_t wbf16;                  /* 1: the projections and the LM head are bfloat16 (below) */
    float eps, scale, inv_temp;
    const float *embed;             /* [V, E] */
    const float *final_norm;        /* [E] */
    const void *lm_head;            /* [V, E], float32 or bfloat16 */
    const float *rope;              /* [P + C, 2D]: cos | sin with its first half negated */
    float *const *lw;               /* [L * LW_COUNT] */
    const int32_t *pad;             /* [B] left pads: prompt b's keys are slots pad[b] .. P-1 */
    const int64_t *prompt_ids;      /* [B, P], left-padded */
    float *first_logits;            /* [B, V]: each prompt's last-position logits (rlvr_prefill) */
    const float *uniforms;          /* [C, N]: the draw of row r at step t is uniforms[t * N + r] */
    const int64_t *eos;             /* [n_eos] */
    int64_t *tokens;                /* [N, C], -1 where a row has no token */
    float *logps;                   /* [N, C] */
    int32_t *alive;                 /* [N]: 1 while a row generates; the caller may clear it */
    sgemm_fn sgemm;                 /* BLAS sgemm_, or NULL for the portable loop */
    set_threads_fn set_threads_local; /* MKL_Set_Num_Threads_Local, or NULL */
    float *all_logits;              /* [N, C, V] or NULL: every step's logits, for the tests */
} Ctx;

#define RLVR_DECODE_ABI 7
int rlvr_decode_abi(void) { return RLVR_DECODE_ABI; }

/* e^x (Cephes' expf: Cody-Waite reduction, degree-5 polynomial, ~1 ulp; inputs clamped to
 * [-87, 88.5], so e^-inf comes out as ~1.6e-38, not 0, which no sum here can tell apart). libm's
 * expf is a scalar call per element: with it SiLU and the softmaxes cost more than the matmuls. */
static inline float exp_approx(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.5f ? 88.5f : x);
    float k = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - k * 0.693359375f + k * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float e = p * r * r + r + 1.0f;
    union { int32_t i; float f; } two_k;
    two_k.i = ((int32_t)k + 127) << 23;
    return e * two_k.f;
}

#ifdef __AVX2__
#include <immintrin.h>
/* exp_approx on 8 lanes (GCC does not vectorise the scalar form: the float -> int bit trick). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.5f));
    __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fmadd_ps(k, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 e = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(e, _mm256_castsi256_ps(two_k));
}
#endif

/* x[j] = e^(x[j] - shift); returns the sum. */
static float exp_shift_sum(float *x, int n, float shift) {
    int j = 0;
    float total = 0.0f;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps(), s = _mm256_set1_ps(shift);
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), s));
        _mm256_storeu_ps(x + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int i = 0; i < 8; ++i) total += lanes[i];
#endif
    for (; j < n; ++j) {
        x[j] = exp_approx(x[j] - shift);
        total += x[j];
    }
    return total;
}

/* a = silu(g) * u = g / (1 + e^-g) * u */
static void silu_mul(const float *g, const float *u, float *a, int n) {
    int j = 0;
#ifdef __AVX2__
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (; j + 8 <= n; j += 8) {
        __m256 gj = _mm256_loadu_ps(g + j);
        __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, gj)));
        _mm256_storeu_ps(a + j, _mm256_mul_ps(_mm256_div_ps(gj, den), _mm256_loadu_ps(u + j)));
    }
#endif
    for (; j < n; ++j) a[j] = g[j] / (1.0f + exp_approx(-g[j])) * u[j];
}

/* ---- skinny products: a few rows against a whole weight matrix -----------------------------
 *
 * A decode step multiplies a slice's few live rows (1-32) by every weight matrix, so its matmuls
 * are bound by streaming the weights from memory, and BLAS's general kernels stream them slowly at
 * these shapes: MKL's sgemm moved 6-10 GB/s of weights at 2-8 rows on one core of the development
 * machine, against the ~24 GB/s a plain read reaches. `skinny_linear` walks the output features in
 * tiles of SKINNY_OUTS weight rows; for each tile it runs every block of SKINNY_ROWS input rows,
 * rows x outputs accumulators in registers, so a weight comes from memory once (the first block,
 * which also prefetches the next tile) and from L1 for the other blocks. Measured on SmolLM2-135M's
 * shapes, one core, AVX-512, GFLOP/s against MKL's sgemm: 35 vs 21 at 8 rows, 52 vs 31 at 16, 67
 * vs 46 at 32 on the LM head (weights from memory); 88-100 vs 59-84 on the layers' matrices. A
 * decode product takes this path up to SKINNY_MAX_M rows, BLAS beyond (prefill). Same sums as a
 * dot product, in another order: float32 rounding only. */
#if defined(__AVX512F__)
#define SKINNY_ROWS 4 /* 4 x 6 accumulators + 6 weight vectors + 1 input of the 32 registers */
#define SKINNY_OUTS 6
#define SKINNY_MAX_M 32
typedef __m512 vfloat;
#define VLEN 16
#define vzero() _mm512_setzero_ps()
#define vload(p) _mm512_loadu_ps(p)
#define vload_tail(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), (p))
#define vfma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define vsum(v) _mm512_reduce_add_ps(v)
#elif defined(__AVX2__) && defined(__FMA__)
#define SKINNY_ROWS 4 /* 4 x 2 accumulators + 2 weight vectors + 1 input of the 16 registers */
#define SKINNY_OUTS 2
#define SKINNY_MAX_M 8
typedef __m256 vfloat;
#define VLEN 8
#define vzero() _mm256_setzero_ps()
#define vload(p) _mm256_loadu_ps(p)
static inline __m256 vload_tail(const float *p, int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
}
#define vfma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
static inline float vsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#ifdef SKINNY_ROWS
/* y[0:RB, 0:SKINNY_OUTS] (+)= x[0:RB] @ wo[0:SKINNY_OUTS]^T for one tile and one block of RB rows;
 * `prefetch`: also ask for the next tile's weights (the first block of a tile reads from memory). */
#define SKINNY_TILE(NAME, RB)                                                                        \
    static void NAME(int k, const float *x, const float *wo, float *y, int ldy, float beta,          \
                     int prefetch) {                                                                 \
        enum { OB = SKINNY_OUTS };                                                                   \
        const int k_full = k - k % VLEN, k_tail = k % VLEN;                                          \
        vfloat acc[OB][RB];                                                                          \
        for (int i = 0; i < OB; ++i)                                                                 \
            for (int r = 0; r < RB; ++r) acc[i][r] = vzero();                                        \
        for (int j = 0; j < k_full; j += VLEN) {                                                     \
            vfloat wv[OB];                                                                           \
            for (int i = 0; i < OB; ++i) {                                                           \
                wv[i] = vload(wo + (size_t)i * k + j);                                               \
                if (prefetch) _mm_prefetch((const char *)(wo + (size_t)(OB + i) * k + j), _MM_HINT_T0); \
            }                                                                                        \
            for (int r = 0; r < RB; ++r) {                                                           \
                const vfloat xv = vload(x + (size_t)r * k + j);                                      \
                for (int i = 0; i < OB; ++i) acc[i][r] = vfma(wv[i], xv, acc[i][r]);                 \
            }                                                                                        \
        }                                                                                            \
        if (k_tail) {                                                                                \
            vfloat wv[OB];                                                                           \
            for (int i = 0; i < OB; ++i) wv[i] = vload_tail(wo + (size_t)i * k + k_full, k_tail);    \
            for (int r = 0; r < RB; ++r) {                                                           \
                const vfloat xv = vload_tail(x + (size_t)r * k + k_full, k_tail);                    \
                for (int i = 0; i < OB; ++i) acc[i][r] = vfma(wv[i], xv, acc[i][r]);                 \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < RB; ++r)                                                                 \
            for (int i = 0; i < OB; ++i) {                                                           \
                float *yo = y + (size_t)r * ldy + i;                                                 \
                const float s = vsum(acc[i][r]);                                                     \
                *yo = beta == 0.0f ? s : *yo * beta + s;                                             \
            }                                                                                        \
    }
SKINNY_TILE(skinny_tile_1, 1)
SKINNY_TILE(skinny_tile_2, 2)
SKINNY_TILE(skinny_tile_3, 3)
SKINNY_TILE(skinny_tile_4, 4)
typedef void (*skinny_tile_fn)(int, const float *, const float *, float *, int, float, int);
static const skinny_tile_fn SKINNY_TILE_BY_ROWS[SKINNY_ROWS + 1] = {
    NULL, skinny_tile_1, skinny_tile_2, skinny_tile_3, skinny_tile_4};

/* y[m, n_out] (row stride ldy) = x[m, k] @ w[n_out, k]^T + beta * y, any m. */
static void skinny_linear(int m, int n_out, int k, const float *x, const float *w, float *y,
                          int ldy, float beta) {
    const int n_tiles = n_out - n_out % SKINNY_OUTS;
    for (int o = 0; o < n_tiles; o += SKINNY_OUTS) {
        const float *wo = w + (size_t)o * k;
        for (int r0 = 0; r0 < m; r0 += SKINNY_ROWS) {
            const int rb = m - r0 < SKINNY_ROWS ? m - r0 : SKINNY_ROWS;
            SKINNY_TILE_BY_ROWS[rb](k, x + (size_t)r0 * k, wo, y + (size_t)r0 * ldy + o, ldy, beta,
                                    r0 == 0);
        }
    }
    for (int r = 0; r < m; ++r) /* the last n_out % SKINNY_OUTS outputs */
        for (int o = n_tiles; o < n_out; ++o) {
            const float *xr = x + (size_t)r * k, *wo = w + (size_t)o * k;
            float s = 0.0f;
            for (int j = 0; j < k; ++j) s += xr[j] * wo[j];
            float *yo = y + (size_t)r * ldy + o;
            *yo = beta == 0.0f ? s : *yo * beta + s;
        }
}
#endif

/* Exported for the tests: the skinny product against torch's at any shape; 1 when this build has
 * no skinny path (no AVX2 + FMA). */
int rlvr_skinny_linear(int m, int n_out, int k, const float *x, const float *w, float *y, int ldy,
                       float beta) {
#ifdef SKINNY_ROWS
    skinny_linear(m, n_out, k, x, w, y, ldy, beta);
    return 0;
#else
    (void)m, (void)n_out, (void)k, (void)x, (void)w, (void)y, (void)ldy, (void)beta;
    return 1;
#endif
}

/* ---- bfloat16 weights ------------------------------------------------------------------------
 *
 * bf16_linear: y[m, n_out] (row stride ldy) = bf16(x)[m, k] @ W[n_out, k]^T + beta * y, float32 sums,
 * from W packed for `vdpbf16ps` (cpu_kernel.pack_bf16): blocks of 16 outputs, each [k2, 16, 2] with
 * k2 = ceil(k / 2) (zeros pad a partial block and an odd k), i.e. element W[o, j] at
 * ((o / 16) * k2 + j / 2) * 32 + (o % 16) * 2 + j % 2. One 64-byte load is then two inputs of 16
 * outputs: `vdpbf16ps` against the row's input pair (one 32-bit broadcast) adds both products into the
 * 16 outputs' lanes, so the sums end in lanes that are stored as they are, with no horizontal
 * reduction (which cost as much as the products in the float32 tile at k = 512). A tile keeps
 * BF16_BLOCKS x BF16_ROWS accumulators in registers, so each weight load serves BF16_ROWS rows.
 * x16 is the caller's scratch for the rounded input rows (m * 2 * k2 values). */
static uint16_t bf16_round(float f) { /* round to nearest even, as torch's .to(torch.bfloat16); NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define HAVE_BF16_DOT 1
#define BF16_ROWS 6   /* 6 x 4 accumulators + 4 weight vectors of the 32 registers */
#define BF16_BLOCKS 4 /* 64 outputs */
/* Rows [0, RB) x output blocks [0, NB) of one tile; `last_mask`: the lanes of the last block that are
 * real outputs (all 16 but in a matrix's final block). */
#define BF16_TILE(NAME, NB, RB)                                                                      \
    static void NAME(int k2, const uint16_t *x, int ldx, const uint16_t *wb, float *y, int ldy,      \
                     float beta, __mmask16 last_mask) {                                              \
        __m512 acc[NB][RB];                                                                          \
        for (int b = 0; b < NB; ++b)                                                                 \
            for (int r = 0; r < RB; ++r) acc[b][r] = _mm512_setzero_ps();                            \
        for (int j = 0; j < k2; ++j) {                                                               \
            __m512bh wv[NB];                                                                         \
            for (int b = 0; b < NB; ++b)                                                             \
                wv[b] = (__m512bh)_mm512_loadu_si512(wb + ((size_t)b * k2 + j) * 32);                \
            for (int r = 0; r < RB; ++r) {                                                           \
                int pair; /* inputs 2j, 2j+1 of row r (memcpy: no aliasing of the uint16 rows) */    \
                memcpy(&pair, x + (size_t)r * ldx + 2 * j, sizeof pair);                             \
                const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);                               \
                for (int b = 0; b < NB; ++b) acc[b][r] = _mm512_dpbf16_ps(acc[b][r], wv[b], xv);     \
            }                                                                                        \
        }                                                                                            \
        for (int r = 0; r < RB; ++r)                                                                 \
            for (int b = 0; b < NB; ++b) {                                                           \
                float *yo = y + (size_t)r * ldy + 16 * b;                                            \
                const __mmask16 mk = b == NB - 1 ? last_mask : (__mmask16)0xffff;                    \
                __m512 v = acc[b][r];                                                                \
                if (beta != 0.0f)                                                                    \
                    v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, yo), _mm512_set1_ps(beta), v);     \
                _mm512_mask_storeu_ps(yo, mk, v);                                                    \
            }                                                                                        \
    }
#define BF16_TILES_FOR_ROWS(RB) \
    BF16_TILE(bf16_tile_4_##RB, 4, RB) BF16_TILE(bf16_tile_1_##RB, 1, RB)
BF16_TILES_FOR_ROWS(1)
BF16_TILES_FOR_ROWS(2)
BF16_TILES_FOR_ROWS(3)
BF16_TILES_FOR_ROWS(4)
BF16_TILES_FOR_ROWS(5)
BF16_TILES_FOR_ROWS(6)
typedef void (*bf16_tile_fn)(int, const uint16_t *, int, const uint16_t *, float *, int, float, __mmask16);
static const bf16_tile_fn BF16_TILE4_BY_ROWS[BF16_ROWS + 1] = {
    NULL, bf16_tile_4_1, bf16_tile_4_2, bf16_tile_4_3, bf16_tile_4_4, bf16_tile_4_5, bf16_tile_4_6};
static const bf16_tile_fn BF16_TILE1_BY_ROWS[BF16_ROWS + 1] = {
    NULL, bf16_tile_1_1, bf16_tile_1_2, bf16_tile_1_3, bf16_tile_1_4, bf16_tile_1_5, bf16_tile_1_6};
#endif

int rlvr_bf16_dot(void) { /* 1 when bf16 weights run on vdpbf16ps; 0: the portable loop */
#ifdef HAVE_BF16_DOT
    return 1;
#else
    return 0;
#endif
}

static void bf16_linear(int m, int n_out, int k, const float *x, uint16_t *x16, const uint16_t *w,
                        float *y, int ldy, float beta) {
    const int k2 = (k + 1) / 2, ldx = 2 * k2; /* x16 rows padded to whole pairs */
    for (int r = 0; r < m; ++r) {
        const float *xr = x + (size_t)r * k;
        uint16_t *xo = x16 + (size_t)r * ldx;
        int j = 0;
#ifdef HAVE_BF16_DOT
        for (; j + 16 <= k; j += 16) /* vcvtneps2bf16: round to nearest even, as bf16_round */
            _mm256_storeu_si256((__m256i *)(xo + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xr + j)));
#endif
        for (; j < k; ++j) xo[j] = bf16_round(xr[j]);
        if (k % 2) xo[k] = 0;
    }
    const int blocks = (n_out + 15) / 16;
#ifdef HAVE_BF16_DOT
    const __mmask16 tail = n_out % 16 ? (__mmask16)((1u << (n_out % 16)) - 1u) : (__mmask16)0xffff;
    for (int b0 = 0; b0 < blocks;) {
        const int nb = blocks - b0 >= BF16_BLOCKS ? BF16_BLOCKS : 1;
        const __mmask16 last = b0 + nb == blocks ? tail : (__mmask16)0xffff;
        const uint16_t *wb = w + (size_t)b0 * k2 * 32;
        for (int r0 = 0; r0 < m; r0 += BF16_ROWS) {
            const int rb = m - r0 < BF16_ROWS ? m - r0 : BF16_ROWS;
            (nb == BF16_BLOCKS ? BF16_TILE4_BY_ROWS : BF16_TILE1_BY_ROWS)[rb](
                k2, x16 + (size_t)r0 * ldx, ldx, wb, y + (size_t)r0 * ldy + 16 * b0, ldy, beta, last);
        }
        b0 += nb;
    }
#else
#define bf16_widen(h) ((union { uint32_t u; float f; }){.u = (uint32_t)(h) << 16}.f)
    for (int r = 0; r < m; ++r)
        for (int o = 0; o < n_out; ++o) {
            const uint16_t *xr = x16 + (size_t)r * ldx, *wb = w + (size_t)(o / 16) * k2 * 32 + (o % 16) * 2;
            float s = 0.0f;
            for (int j = 0; j < k; ++j) s += bf16_widen(xr[j]) * bf16_widen(wb[(j / 2) * 32 + j % 2]);
            float *yo = y + (size_t)r * ldy + o;
            *yo = beta == 0.0f ? s : *yo * beta + s;
        }
    (void)blocks;
#endif
}

/* Exported for the tests: the bfloat16 product at any shape (x16: m * (k + 1) values of scratch; w packed). */
void rlvr_bf16_linear(int m, int n_out, int k, const float *x, uint16_t *x16, const uint16_t *w,
                      float *y, int ldy, float beta) {
    bf16_linear(m, n_out, k, x, x16, w, y, ldy, beta);
}

/* Output `row` of a weight matrix with k inputs onward: float32 [n_out, k], or bfloat16 packed in
 * blocks of 16 outputs (row a multiple of 16 then, as part_cols cuts). */
static inline const void *wrow(const Ctx *c, const void *w, int row, int k) {
    if (c->wbf16) return (const uint16_t *)w + (size_t)(row / 16) * ((k + 1) / 2) * 32;
    return (const float *)w + (size_t)row * k;
}

/* y[m, n_out] (row stride ldy) = x[m, k] @ w[n_out, k]^T + beta * y; w is float32, or bfloat16
 * when c->wbf16 (then x16 is scratch for m * (k + 1) rounded inputs). */
static void linear(const Ctx *c, int m, int n_out, int k, const float *x, uint16_t *x16,
                   const void *wv, float *y, int ldy, float beta) {
    if (c->wbf16) {
        bf16_linear(m, n_out, k, x, x16, (const uint16_t *)wv, y, ldy, beta);
        return;
    }
    const float *w = (const float *)wv;
#ifdef SKINNY_ROWS
    if (m <= SKINNY_MAX_M) {
        skinny_linear(m, n_out, k, x, w, y, ldy, beta);
        return;
    }
#endif
    if (c->sgemm) {
        const char tr = 'T', nt = 'N';
        const float one = 1.0f;
        c->sgemm(&tr, &nt, &n_out, &m, &k, &one, w, &k, x, &k, &beta, y, &ldy);
        return;
    }
    for (int i = 0; i < m; ++i) {
        const float *xi = x + (size_t)i * k;
        float *yi = y + (size_t)i * ldy;
        for (int o = 0; o < n_out; ++o) {
            const float *wo = w + (size_t)o * k;
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int j = 0; j < k; ++j) s += xi[j] * wo[j];
            yi[o] = beta == 0.0f ? s : yi[o] * beta + s;
        }
    }
}

/* transformers' RMSNorm: w * x * rsqrt(mean(x^2) + eps), in float32. */
static void rms_norm(const float *x, const float *w, float *y, int dim, float eps) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int j = 0; j < dim; ++j) ss += x[j] * x[j];
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma omp simd
    for (int j = 0; j < dim; ++j) y[j] = w[j] * (x[j] * inv);
}

/* RoPE with transformers' rotate_half: x * cos + rotate_half(x) * sin. */
static void rope(float *x, const float *cos_d, const float *sin_signed_d, int D, float *tmp) {
    const int half = D / 2;
    for (int j = 0; j < half; ++j) tmp[j] = x[j + half];
    for (int j = half; j < D; ++j) tmp[j] = x[j - half];
#pragma omp simd
    for (int j = 0; j < D; ++j) x[j] = x[j] * cos_d[j] + tmp[j] * sin_signed_d[j];
}

static float dot(const float *a, const float *b, int D) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < D; ++j) s += a[j] * b[j];
    return s;
}

static void axpy(float *y, float a, const float *x, int D) {
#pragma omp simd
    for (int j = 0; j < D; ++j) y[j] += a * x[j];
}

#ifdef __AVX2__
/* scores[j] = scale * q . k[j] for n keys of D = 8 * nv floats (nv <= 16), four keys at a time:
 * four independent FMA chains and one shared horizontal reduction, instead of a reduction per key. */
static void scores_avx2(const float *q, const float *k, int n, int D, float scale, float *out) {
    const int nv = D / 8;
    __m256 qv[16];
    for (int v = 0; v < nv; ++v) qv[v] = _mm256_loadu_ps(q + 8 * v);
    const __m128 sc = _mm_set1_ps(scale);
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + (size_t)j * D;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int v = 0; v < nv; ++v) {
            a0 = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(k0 + 8 * v), a0);
            a1 = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(k0 + D + 8 * v), a1);
            a2 = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(k0 + 2 * D + 8 * v), a2);
            a3 = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(k0 + 3 * D + 8 * v), a3);
        }
        /* [a0..a3] -> four sums: two rounds of hadd, then the 128-bit halves added */
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
        const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(out + j, _mm_mul_ps(r, sc));
    }
    for (; j < n; ++j) {
        __m256 a = _mm256_setzero_ps();
        for (int v = 0; v < nv; ++v) a = _mm256_fmadd_ps(qv[v], _mm256_loadu_ps(k + (size_t)j * D + 8 * v), a);
        const __m128 r = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        const __m128 r2 = _mm_hadd_ps(r, r);
        out[j] = _mm_cvtss_f32(_mm_hadd_ps(r2, r2)) * scale;
    }
}

/* out[c] (+)= sum_j p[j] * v[j][c]: per 8-column chunk, four accumulators over the keys (a chain
 * through memory per key, as a plain axpy loop makes, was half of all non-GEMM time). */
static void weighted_sum_avx2(const float *p, const float *v, int n, int D, float *out, int add) {
    for (int c = 0; c < D; c += 8) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int j = 0;
        for (; j + 4 <= n; j += 4) {
            const float *r = v + (size_t)j * D + c;
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(r), a0);
            a1 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 1]), _mm256_loadu_ps(r + D), a1);
            a2 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 2]), _mm256_loadu_ps(r + 2 * D), a2);
            a3 = _mm256_fmadd_ps(_mm256_set1_ps(p[j + 3]), _mm256_loadu_ps(r + 3 * D), a3);
        }
        for (; j < n; ++j)
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + (size_t)j * D + c), a0);
        __m256 acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        if (add) acc = _mm256_add_ps(acc, _mm256_loadu_ps(out + c));
        _mm256_storeu_ps(out + c, acc);
    }
}
#endif

/* One query head over its prompt keys [kp0, kp1) and its own keys [0, ns); writes out[D]. */
static void attend(const float *q, const float *kp, const float *vp, int kp0, int kp1,
                   const float *ks, const float *vs, int ns, int D, float scale, float *scores,
                   float *out) {
    const int np = kp1 - kp0;
#ifdef __AVX2__
    if (D % 8 == 0 && D <= 128) {
        scores_avx2(q, kp + (size_t)kp0 * D, np, D, scale, scores);
        if (ns) scores_avx2(q, ks, ns, D, scale, scores + np);
        float mx = -INFINITY;
        for (int j = 0; j < np + ns; ++j) mx = scores[j] > mx ? scores[j] : mx;
        const float inv = 1.0f / exp_shift_sum(scores, np + ns, mx);
        weighted_sum_avx2(scores, vp + (size_t)kp0 * D, np, D, out, 0);
        if (ns) weighted_sum_avx2(scores + np, vs, ns, D, out, 1);
        for (int c = 0; c < D; ++c) out[c] *= inv;
        return;
    }
#endif
    float mx = -INFINITY;
    for (int j = 0; j < np; ++j) {
        scores[j] = dot(q, kp + (size_t)(kp0 + j) * D, D) * scale;
        mx = scores[j] > mx ? scores[j] : mx;
    }
    for (int j = 0; j < ns; ++j) {
        scores[np + j] = dot(q, ks + (size_t)j * D, D) * scale;
        mx = scores[np + j] > mx ? scores[np + j] : mx;
    }
    const float total = exp_shift_sum(scores, np + ns, mx);
    const float inv = 1.0f / total;
    memset(out, 0, sizeof(float) * D);
    for (int j = 0; j < np; ++j) axpy(out, scores[j] * inv, vp + (size_t)(kp0 + j) * D, D);
    for (int j = 0; j < ns; ++j) axpy(out, scores[np + j] * inv, vs + (size_t)j * D, D);
}

/* Sample token t of row r from logits[V]; returns the token. Same rule as the engine's torch
 * sampler: log_softmax(logits / T); greedy = first argmax, reported at T = 1; otherwise the first
 * index whose running sum of probabilities exceeds u * total (searchsorted, right=True). */
static int64_t sample(const Ctx *c, const float *logits, float u, float *work, float *logp) {
    const int V = c->V;
    const float it = c->greedy ? 1.0f : c->inv_temp;
    float *z = work, *e = work + V;
    float mx = -INFINITY;
    int64_t arg = 0;
    for (int v = 0; v < V; ++v) {
        z[v] = logits[v] * it;
        if (z[v] > mx) { mx = z[v]; arg = v; }
    }
    memcpy(e, z, sizeof(float) * V);
    const float total = exp_shift_sum(e, V, mx);
    int64_t tok = arg;
    if (!c->greedy) {
        /* If rounding leaves the running sum short of u * total (u within ~1e-7 of 1), take the
         * last token with real mass, never a zero-probability one such as a padded vocab slot. */
        const float target = u * total;
        float cdf = 0.0f;
        int64_t last_real = arg;
        for (int v = 0; v < V; ++v) {
            cdf += e[v];
            if (e[v] > 1e-30f) last_real = v;
            if (cdf > target) { last_real = v; break; }
        }
        tok = last_real;
    }
    *logp = z[tok] - (mx + logf(total));
    return tok;
}

static int is_eos(const Ctx *c, int64_t tok) {
    for (int e = 0; e < c->n_eos; ++e)
        if (c->eos[e] == tok) return 1;
    return 0;
}

/* A row in the work: a prompt token during prefill (prompt b, cache slot `slot` of the prompt
 * cache) or a completion token during decode (row r, slot `slot` of its own cache). */
typedef struct {
    int b, r, slot, pos, prefill;
} Row;

/* Work space for m rows. Shared by the members of a cooperative decode (below): x (the residual
 * stream, [m, E], at the front of the block), qkv, att, gu, act, logits. Each member's own: h
 * (the normalised rows every member computes in full, so a product can start without waiting),
 * scores, tmp and work (the sampler's). */
typedef struct {
    float *x, *qkv, *att, *gu, *act, *logits;
} Shared;
typedef struct {
    float *h, *scores, *tmp, *work;
    uint16_t *x16; /* a product's input rows rounded to bfloat16 (wbf16 only) */
} Own;

static size_t shared_floats(const Ctx *c, int m) {
    const int QKV = (c->H + 2 * c->Hkv) * c->D;
    return (size_t)m * (c->E + QKV + c->H * c->D + 3 * c->I + c->V);
}
static void shared_at(const Ctx *c, int m, float *b, Shared *s) {
    const int QKV = (c->H + 2 * c->Hkv) * c->D;
    s->x = b;
    s->qkv = s->x + (size_t)m * c->E;
    s->att = s->qkv + (size_t)m * QKV;
    s->gu = s->att + (size_t)m * c->H * c->D;
    s->act = s->gu + (size_t)m * 2 * c->I;
    s->logits = s->act + (size_t)m * c->I;
}
/* The widest input of a product: E (q/k/v, gate/up, head), H * D (o_proj) or I (down_proj). */
static int widest_input(const Ctx *c) {
    int k = c->E > c->H * c->D ? c->E : c->H * c->D;
    return k > c->I ? k : c->I;
}
static size_t own_floats(const Ctx *c, int m) {
    const size_t x16 = c->wbf16 ? ((size_t)m * (widest_input(c) + 1) + 1) / 2 : 0;
    return (size_t)m * c->E + (c->P + c->C) + 2 * c->D + 2 * c->V + x16;
}
static void own_at(const Ctx *c, int m, float *b, Own *o) {
    o->h = b;
    o->scores = o->h + (size_t)m * c->E;
    o->tmp = o->scores + (c->P + c->C);
    o->work = o->tmp + 2 * c->D;
    o->x16 = c->wbf16 ? (uint16_t *)(o->work + 2 * c->V) : NULL;
}

/* Work space for one thread alone on m rows: shared and own parts in one block (*mem) and a row list
 * (*rows); free both. 0, or -1 when out of memory (nothing to free then). */
static int solo_alloc(const Ctx *c, int m, Shared *sh, Own *own, Row **rows, float **mem) {
    *rows = (Row *)malloc(sizeof(Row) * m);
    *mem = (float *)malloc(sizeof(float) * (shared_floats(c, m) + own_floats(c, m)));
    if (!*rows || !*mem) {
        free(*rows);
        free(*mem);
        return -1;
    }
    shared_at(c, m, *mem, sh);
    own_at(c, m, *mem + shared_floats(c, m), own);
    return 0;
}

/* ---- cooperative decode: the members of a team share the rows and split every product ------
 *
 * A slice of rows per core (the default) makes every core stream every weight matrix each step.
 * When the rows are few, a step is bound by those reads (SmolLM2-135M: 540 MB of float32 weights
 * per step), so with two cores each reading all of them the step takes twice the memory traffic
 * it needs. In a cooperative decode all members run the same rows: each computes its share of the
 * output features of every product (reading only its share of each matrix), its share of the
 * rows for the per-row work (attention, sampling), and they meet at a barrier where one needs the
 * other's results: five times per layer and three times per step. Same arithmetic per element as one
 * slice: the completions do not depend on the number of members. */
typedef struct {
    int tid, nth;
    int sense; /* the barrier's phase this member waits for */
} Part;

static struct {
    atomic_int count;
    atomic_int sense;
} barrier;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Spin this long, then yield: on a host whose cores are oversubscribed a member that spins while
 * its partner is descheduled would hold the core the partner needs. */
#define BARRIER_SPINS 4000

static inline void part_sync(Part *p) {
    if (p->nth <= 1) return;
    p->sense ^= 1;
    if (atomic_fetch_add(&barrier.count, 1) == p->nth - 1) {
        atomic_store(&barrier.count, 0);
        atomic_store(&barrier.sense, p->sense);
        return;
    }
    for (int spins = 0; atomic_load(&barrier.sense) != p->sense;) {
        if (++spins < BARRIER_SPINS)
            cpu_relax();
        else
            sched_yield();
    }
}

/* This member's share [*lo, *hi) of n columns, cut at multiples of 16 (whole vectors). */
static void part_cols(const Part *p, int n, int *lo, int *hi) {
    const int units = (n + 15) / 16;
    *lo = (int)((long)units * p->tid / p->nth) * 16;
    *hi = (int)((long)units * (p->tid + 1) / p->nth) * 16;
    if (*lo > n) *lo = n;
    if (*hi > n) *hi = n;
}

/* This member's columns of y[m, n_out] = x @ w^T + beta * y (+ bias). */
static void linear_part(const Ctx *c, const Part *p, const Own *own, int m, int n_out, int k,
                        const float *x, const void *w, const float *bias, float *y, int ldy, float beta) {
    int lo, hi;
    part_cols(p, n_out, &lo, &hi);
    if (hi <= lo) return;
    linear(c, m, hi - lo, k, x, own->x16, wrow(c, w, lo, k), y + lo, ldy, beta);
    if (bias)
        for (int i = 0; i < m; ++i) axpy(y + (size_t)i * ldy + lo, 1.0f, bias + lo, hi - lo);
}

/* Every decoder layer over the m rows of sh->x [m, E] (in place). */
static void forward_layers(const Ctx *c, Part *p, int m, const Row *rows, const Shared *sh,
                           const Own *own) {
    const int E = c->E, H = c->H, Hkv = c->Hkv, D = c->D, I = c->I, P = c->P, C = c->C;
    const int Gq = H / Hkv, QKV = (H + 2 * Hkv) * D;
    float *x = sh->x, *h = own->h;
    for (int l = 0; l < c->L; ++l) {
        float *const *w = c->lw + (size_t)l * LW_COUNT;
        for (int i = 0; i < m; ++i) rms_norm(x + (size_t)i * E, w[LW_NORM1], h + (size_t)i * E, E, c->eps);
        /* q | k | v side by side in one [m, QKV] activation: three GEMMs through the stride */
        linear_part(c, p, own, m, H * D, E, h, w[LW_WQ], NULL, sh->qkv, QKV, 0.0f);
        linear_part(c, p, own, m, Hkv * D, E, h, w[LW_WK], NULL, sh->qkv + H * D, QKV, 0.0f);
        linear_part(c, p, own, m, Hkv * D, E, h, w[LW_WV], NULL, sh->qkv + (H + Hkv) * D, QKV, 0.0f);
        part_sync(p);
        for (int i = p->tid; i < m; i += p->nth) {
            const Row *row = rows + i;
            const int b = row->b, pad = c->pad[b];
            float *q = sh->qkv + (size_t)i * QKV, *k = q + H * D, *v = k + Hkv * D;
            if (w[LW_BQ]) axpy(q, 1.0f, w[LW_BQ], H * D);
            if (w[LW_BK]) axpy(k, 1.0f, w[LW_BK], Hkv * D);
            if (w[LW_BV]) axpy(v, 1.0f, w[LW_BV], Hkv * D);
            if (w[LW_QNORM]) {
                for (int hh = 0; hh < H; ++hh) rms_norm(q + hh * D, w[LW_QNORM], q + hh * D, D, c->eps);
                for (int g = 0; g < Hkv; ++g) rms_norm(k + g * D, w[LW_KNORM], k + g * D, D, c->eps);
            }
            const float *cs = c->rope + (size_t)row->pos * 2 * D;
            for (int hh = 0; hh < H; ++hh) rope(q + hh * D, cs, cs + D, D, own->tmp);
            for (int g = 0; g < Hkv; ++g) rope(k + g * D, cs, cs + D, D, own->tmp);
            /* this token's keys/values into its cache; then attend over the prompt's keys (up to
             * itself during prefill) and, during decode, the row's own keys */
            float *kd, *vd;
            size_t head_stride;
            const size_t pre = (size_t)b * Hkv * P * D, suf = (size_t)row->r * Hkv * C * D;
            if (row->prefill) {
                kd = w[LW_KPRE] + pre + (size_t)row->slot * D;
                vd = w[LW_VPRE] + pre + (size_t)row->slot * D;
                head_stride = (size_t)P * D;
            } else {
                kd = w[LW_KSUF] + suf + (size_t)row->slot * D;
                vd = w[LW_VSUF] + suf + (size_t)row->slot * D;
                head_stride = (size_t)C * D;
            }
            for (int g = 0; g < Hkv; ++g) {
                memcpy(kd + g * head_stride, k + g * D, sizeof(float) * D);
                memcpy(vd + g * head_stride, v + g * D, sizeof(float) * D);
            }
            const int kp1 = row->prefill ? row->slot + 1 : P, ns = row->prefill ? 0 : row->slot + 1;
            for (int g = 0; g < Hkv; ++g) {
                const float *kp = w[LW_KPRE] + pre + (size_t)g * P * D,
                            *vp = w[LW_VPRE] + pre + (size_t)g * P * D;
                const float *ks = row->prefill ? NULL : w[LW_KSUF] + suf + (size_t)g * C * D,
                            *vs = row->prefill ? NULL : w[LW_VSUF] + suf + (size_t)g * C * D;
                for (int qh = 0; qh < Gq; ++qh) {
                    const int hh = g * Gq + qh;
                    attend(q + hh * D, kp, vp, pad, kp1, ks, vs, ns, D, c->scale, own->scores,
                           sh->att + (size_t)i * H * D + hh * D);
                }
            }
        }
        part_sync(p);
        linear_part(c, p, own, m, E, H * D, sh->att, w[LW_WO], w[LW_BO], x, E, 1.0f); /* x += o_proj(att) */
        part_sync(p);
        for (int i = 0; i < m; ++i) rms_norm(x + (size_t)i * E, w[LW_NORM2], h + (size_t)i * E, E, c->eps);
        /* gate and up over the same columns of I, so SiLU(g) * u needs no other member's */
        int lo, hi;
        part_cols(p, I, &lo, &hi);
        if (hi > lo) {
            const int n = hi - lo;
            linear(c, m, n, E, h, own->x16, wrow(c, w[LW_WG], lo, E), sh->gu + lo, 2 * I, 0.0f);
            linear(c, m, n, E, h, own->x16, wrow(c, w[LW_WU], lo, E), sh->gu + I + lo, 2 * I, 0.0f);
            for (int i = 0; i < m; ++i) {
                float *g = sh->gu + (size_t)i * 2 * I + lo;
                if (w[LW_BG]) axpy(g, 1.0f, w[LW_BG] + lo, n);
                if (w[LW_BU]) axpy(g + I, 1.0f, w[LW_BU] + lo, n);
                silu_mul(g, g + I, sh->act + (size_t)i * I + lo, n);
            }
        }
        part_sync(p);
        linear_part(c, p, own, m, E, I, sh->act, w[LW_WDOWN], w[LW_BDOWN], x, E, 1.0f); /* x += down_proj(act) */
        part_sync(p);
    }
}

/* logits [m, V] = lm_head(final_norm(x)) for the m rows (this member's columns). */
static void head(const Ctx *c, const Part *p, int m, const float *x, float *logits, const Own *own) {
    for (int i = 0; i < m; ++i)
        rms_norm(x + (size_t)i * c->E, c->final_norm, own->h + (size_t)i * c->E, c->E, c->eps);
    linear_part(c, p, own, m, c->V, c->E, own->h, c->lm_head, NULL, logits, c->V, 0.0f);
}

/* Prefill prompts [b0, b1): their keys/values into the prompt cache and their last-position
 * logits into first_logits. All real tokens of the slice go through the layers as one batch.
 * Returns 0, or -1 when scratch memory is unavailable. */
int rlvr_prefill(const Ctx *c, int b0, int b1) {
    const int E = c->E, P = c->P, V = c->V;
    int m = 0;
    for (int b = b0; b < b1; ++b) m += P - c->pad[b];
    if (m <= 0) return 0;
    Shared sh;
    Own own;
    Row *rows;
    float *mem;
    Part one = {0, 1, 0}; /* this thread is the whole team */
    if (solo_alloc(c, m, &sh, &own, &rows, &mem)) return -1;
    float *x = sh.x;
    const int prev_threads = c->set_threads_local ? c->set_threads_local(1) : 0;
    int i = 0;
    for (int b = b0; b < b1; ++b)
        for (int p = c->pad[b]; p < P; ++p, ++i) {
            rows[i] = (Row){.b = b, .r = 0, .slot = p, .pos = p - c->pad[b], .prefill = 1};
            memcpy(x + (size_t)i * E, c->embed + (size_t)c->prompt_ids[(size_t)b * P + p] * E,
                   sizeof(float) * E);
        }
    forward_layers(c, &one, m, rows, &sh, &own);
    /* the last token of each prompt: move its state to the front rows, then one head GEMM */
    int last = 0;
    for (int b = b0, end = 0; b < b1; ++b) {
        end += P - c->pad[b];
        memmove(x + (size_t)(last++) * E, x + (size_t)(end - 1) * E, sizeof(float) * E);
    }
    head(c, &one, last, x, sh.logits, &own);
    memcpy(c->first_logits + (size_t)b0 * V, sh.logits, sizeof(float) * (size_t)last * V);
    if (c->set_threads_local) c->set_threads_local(prev_threads);
    free(mem);
    free(rows);
    return 0;
}

/* Decode rows [r0, r1) for steps [t0, t1) (after rlvr_prefill of their prompts) as member p of a
 * team sharing `sh` (sized for r1 - r0 rows); `own` is this member's. Cannot fail. */
static void decode_rows(const Ctx *c, Part *p, int r0, int r1, int t0, int t1, const Shared *sh,
                        const Own *own, Row *rows) {
    const int E = c->E, V = c->V, P = c->P, C = c->C, n = c->n, N = c->B * c->n;
    float *x = sh->x, *logits = sh->logits;
    const int prev_threads = c->set_threads_local ? c->set_threads_local(1) : 0;
    for (int t = t0; t < t1; ++t) {
        int m = 0; /* every member builds the same list: alive[] changed only before a barrier */
        for (int r = r0; r < r1; ++r)
            if (c->alive[r]) {
                const int b = r / n;
                rows[m++] = (Row){.b = b, .r = r, .slot = t - 1, .pos = P - c->pad[b] + t - 1, .prefill = 0};
            }
        if (m == 0) break;
        if (t == 0) { /* the first token comes from the prompt's last position */
            for (int i = p->tid; i < m; i += p->nth)
                memcpy(logits + (size_t)i * V, c->first_logits + (size_t)rows[i].b * V,
                       sizeof(float) * V);
        } else {
            for (int i = p->tid; i < m; i += p->nth)
                memcpy(x + (size_t)i * E,
                       c->embed + (size_t)c->tokens[(size_t)rows[i].r * C + t - 1] * E,
                       sizeof(float) * E);
            part_sync(p);
            forward_layers(c, p, m, rows, sh, own);
            head(c, p, m, x, logits, own);
        }
        part_sync(p);
        for (int i = p->tid; i < m; i += p->nth) {
            const int r = rows[i].r;
            if (c->all_logits)
                memcpy(c->all_logits + ((size_t)r * C + t) * V, logits + (size_t)i * V, sizeof(float) * V);
            float lp;
            const int64_t tok = sample(c, logits + (size_t)i * V, c->uniforms[(size_t)t * N + r], own->work, &lp);
            c->tokens[(size_t)r * C + t] = tok;
            c->logps[(size_t)r * C + t] = lp;
            if (is_eos(c, tok)) c->alive[r] = 0;
        }
        part_sync(p);
    }
    if (c->set_threads_local) c->set_threads_local(prev_threads);
}

/* Decode rows [r0, r1) for steps [t0, t1) on this thread alone. Returns 0, or -1 when scratch
 * memory is unavailable. */
int rlvr_decode(const Ctx *c, int r0, int r1, int t0, int t1) {
    const int m_max = r1 - r0;
    if (m_max <= 0) return 0;
    Part one = {0, 1, 0};
    Shared sh;
    Own own;
    Row *rows;
    float *mem;
    if (solo_alloc(c, m_max, &sh, &own, &rows, &mem)) return -1;
    decode_rows(c, &one, r0, r1, t0, t1, &sh, &own, rows);
    free(mem);
    free(rows);
    return 0;
}

/* 0 when `f` computes a small product right (checked once when the library is loaded, so a BLAS
 * with another integer width or argument convention is never used for real work). */
int rlvr_check_sgemm(sgemm_fn f) {
    enum { M = 40, K = 5, NO = 4 }; /* more rows than the skinny path takes (at most 32) */
    float x[M * K], w[NO * K], want[M * NO], got[M * NO];
    for (int i = 0; i < M * K; ++i) x[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < NO * K; ++i) w[i] = (float)(i % 5) * 0.5f - 1.0f;
    Ctx c;
    memset(&c, 0, sizeof c);
    linear(&c, M, NO, K, x, NULL, w, want, NO, 0.0f);
    c.sgemm = f;
    for (int i = 0; i < M * NO; ++i) got[i] = 1.0f;
    linear(&c, M, NO, K, x, NULL, w, got, NO, 0.0f);
    for (int i = 0; i < M * NO; ++i)
        if (fabsf(got[i] - want[i]) > 1e-4f) return 1;
    return 0;
}

/* ---- the thread team ------------------------------------------------------------------------ */

#define MAX_SLICES 64
#define SPIN_NS 2000000L /* how long an idle worker spins before it sleeps */

/* JOB_COOP: every slice decodes the same rows (slice 0's), as member i of a cooperative decode. */
enum { JOB_PREFILL, JOB_DECODE, JOB_BOTH, JOB_COOP };

static struct {
    pthread_mutex_t submit;        /* one job at a time, whoever calls */
    pthread_mutex_t m;             /* with cv: sleeping workers */
    pthread_cond_t cv;
    atomic_long generation;        /* bumped per job */
    atomic_long wake;              /* bumped by rlvr_wake */
    atomic_long spin_until;        /* CLOCK_MONOTONIC ns: workers spin until then */
    atomic_int pending;            /* workers that have not finished the current job */
    int workers;
    pid_t pid;                     /* a forked child has no workers: start again there */
    /* the current job */
    const Ctx *c;
    int kind, n_slices, t0, t1;
    int lo[MAX_SLICES], hi[MAX_SLICES], plo[MAX_SLICES], phi[MAX_SLICES], rc[MAX_SLICES];
    long born[MAX_SLICES];
    /* a JOB_COOP's work space, allocated by the caller before the members start */
    Shared coop_shared;
    Own coop_own[MAX_SLICES];
    Row *coop_rows[MAX_SLICES];
} team = {.submit = PTHREAD_MUTEX_INITIALIZER, .m = PTHREAD_MUTEX_INITIALIZER,
          .cv = PTHREAD_COND_INITIALIZER};

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static int run_slice(int i) {
    int rc = 0;
    if (team.kind == JOB_COOP) {
        Part part = {i, team.n_slices, 0};
        decode_rows(team.c, &part, team.lo[0], team.hi[0], team.t0, team.t1, &team.coop_shared,
                    &team.coop_own[i], team.coop_rows[i]);
        return 0;
    }
    if (team.kind != JOB_DECODE) rc |= rlvr_prefill(team.c, team.plo[i], team.phi[i]);
    if (team.kind != JOB_PREFILL && !rc) rc |= rlvr_decode(team.c, team.lo[i], team.hi[i], team.t0, team.t1);
    return rc;
}

static void *worker(void *arg) {
    const int slice = (int)(intptr_t)arg;
    /* the generation current when this worker was created, not when it first runs: a job
     * published in between is its to run */
    long seen = team.born[slice], woken = atomic_load(&team.wake);
    for (;;) {
        long g;
        while ((g = atomic_load(&team.generation)) == seen) {
            if (now_ns() < atomic_load(&team.spin_until)) {
                for (int k = 0; k < 64; ++k) cpu_relax();
                continue;
            }
            pthread_mutex_lock(&team.m);
            while (atomic_load(&team.generation) == seen && atomic_load(&team.wake) == woken)
                pthread_cond_wait(&team.cv, &team.m);
            woken = atomic_load(&team.wake);
            pthread_mutex_unlock(&team.m);
        }
        seen = g;
        if (slice < team.n_slices) team.rc[slice] = run_slice(slice);
        atomic_fetch_sub(&team.pending, 1);
    }
    return NULL;
}

/* fork(): the parent holds `submit` across it (no job is mid-flight in the copy), and the child
 * starts with no workers and fresh locks; the parent's waiting workers left the condition
 * variable's state behind, which made a broadcast in the child hang. */
static void atfork_prepare(void) { pthread_mutex_lock(&team.submit); }
static void atfork_parent(void) { pthread_mutex_unlock(&team.submit); }
static void atfork_child(void) {
    pthread_mutex_init(&team.submit, NULL);
    pthread_mutex_init(&team.m, NULL);
    pthread_cond_init(&team.cv, NULL);
    team.workers = 0;
    team.pid = getpid();
}
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Make sure `n` workers exist (slices 1..n). Returns how many there are. */
static int grow(int n) {
    if (team.pid != getpid()) { team.workers = 0; team.pid = getpid(); }
    while (team.workers < n && team.workers < MAX_SLICES - 1) {
        pthread_t t;
        team.born[team.workers + 1] = atomic_load(&team.generation);
        if (pthread_create(&t, NULL, worker, (void *)(intptr_t)(team.workers + 1)) != 0) break;
        pthread_detach(t);
        team.workers++;
    }
    return team.workers;
}

static void keep_spinning(long ns) {
    long until = now_ns() + ns;
    if (until > atomic_load(&team.spin_until)) atomic_store(&team.spin_until, until);
}

/* Wake the team now (the job follows shortly): its cores are spinning by the time it arrives. */
void rlvr_wake(int n_workers) {
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&team.submit);
    grow(n_workers);
    keep_spinning(SPIN_NS);
    pthread_mutex_lock(&team.m);
    atomic_fetch_add(&team.wake, 1);
    pthread_cond_broadcast(&team.cv);
    pthread_mutex_unlock(&team.m);
    pthread_mutex_unlock(&team.submit);
}

/* A JOB_COOP's work space for its members (rows [lo, hi) of slice 0), in one block; 0, or -1. */
static int coop_alloc(const Ctx *c, int members, float **mem) {
    const int m = team.hi[0] - team.lo[0];
    const size_t row_floats = (sizeof(Row) * (size_t)m + sizeof(float) - 1) / sizeof(float);
    const size_t each = own_floats(c, m) + row_floats;
    *mem = (float *)malloc(sizeof(float) * (shared_floats(c, m) + (size_t)members * each));
    if (!*mem) return -1;
    shared_at(c, m, *mem, &team.coop_shared);
    float *b = *mem + shared_floats(c, m);
    for (int i = 0; i < members; ++i, b += each) {
        own_at(c, m, b, &team.coop_own[i]);
        team.coop_rows[i] = (Row *)(b + own_floats(c, m));
    }
    atomic_store(&barrier.count, 0);
    atomic_store(&barrier.sense, 0);
    return 0;
}

/* Run one job of `n_slices` slices: slice i decodes rows [lo[i], hi[i]) for steps [t0, t1)
 * and/or prefills prompts [plo[i], phi[i]); or, for JOB_COOP, the slices are the members of one
 * cooperative decode of rows [lo[0], hi[0]). The caller's thread runs slice 0; returns 0, or
 * nonzero when a slice ran out of memory. */
int rlvr_run(const Ctx *c, int kind, int n_slices, const int32_t *bounds, int t0, int t1) {
    if (n_slices < 1 || n_slices > MAX_SLICES) return -2;
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&team.submit);
    const int have = grow(n_slices - 1); /* fewer only if the system refused a thread */
    /* members meet at barriers, so each needs a thread of its own */
    if (kind == JOB_COOP && n_slices > have + 1) n_slices = have + 1;
    team.c = c;
    team.kind = kind;
    team.t0 = t0;
    team.t1 = t1;
    team.n_slices = n_slices;
    for (int i = 0; i < n_slices; ++i) {
        team.lo[i] = bounds[4 * i];
        team.hi[i] = bounds[4 * i + 1];
        team.plo[i] = bounds[4 * i + 2];
        team.phi[i] = bounds[4 * i + 3];
        team.rc[i] = 0;
    }
    float *coop_mem = NULL;
    if (kind == JOB_COOP && coop_alloc(c, n_slices, &coop_mem)) {
        pthread_mutex_unlock(&team.submit);
        return -1;
    }
    atomic_store(&team.pending, team.workers);
    keep_spinning(SPIN_NS);
    pthread_mutex_lock(&team.m);
    atomic_fetch_add(&team.generation, 1);
    pthread_cond_broadcast(&team.cv);
    pthread_mutex_unlock(&team.m);
    int rc = run_slice(0);
    for (int i = have + 1; i < n_slices; ++i) rc |= run_slice(i); /* slices no worker exists for */
    /* wait for the other slices: spin briefly, then poll asleep (a spinning waiter would take a
     * core from the workers when the machine's cores are oversubscribed, as shared VMs are) */
    for (long spin_end = now_ns() + 50000; atomic_load(&team.pending) > 0;) {
        if (now_ns() < spin_end) {
            for (int k = 0; k < 64; ++k) cpu_relax();
        } else {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    for (int i = 1; i < n_slices; ++i) rc |= team.rc[i];
    free(coop_mem);
    keep_spinning(SPIN_NS);
    pthread_mutex_unlock(&team.submit);
    return rc;
}
