/* lamina's native decode step: one token per row through a whole pre-LN GPT, on AVX2 + FMA.

   Built and loaded by lamina/native/build.py (cc -O3 -mavx2 -mfma -mf16c -fopenmp -shared), driven
   through ctypes by lamina/native/step.py, which fills the structs below with pointers to
   the model's own tensors (nothing is copied) and holds the step equal to the PyTorch model
   in tests/test_native.py.

   Why it exists: at batch 1 a small model is bound by per-op overhead and by reading its
   weights. Here a step is one call, run by all threads together with barriers between
   phases, and a quantized linear reads its int4/int8 weights as they are stored: the input row
   is quantized once to int16 in blocks of 32 (a scale per block: ~15 bits, so the result is
   within ~1e-4 of the float path), each block's dot product is integer `vpmaddwd`, and the
   weight's and input's scales multiply the block's integer sum (the shape of llama.cpp's
   Q4 x Q8 product, with 16-bit inputs: on SmolLM2 they decoded as fast as 8-bit ones and
   far closer to the float result; the figures are in BENCHMARKS.md only).

   Weights, as lamina stores them (quant/linear.py):
     LIN_F32   w float (n, k)
     LIN_INT4  w uint8 (n, k/2), element 2i in the low nibble of byte i, 2i+1 in the high one;
               s, mn float (n, k/gs) each: w = q s + mn (lamina's (k/gs, n, 2) scale and
               zero, w = (q - 8) scale + zero, rearranged once by Int4Linear.prepare through
               native/structs.py's int4_rows: a row's groups side by side, mn = zero - 8 scale)
     LIN_INT8  w int8 (n, k); s float (n, k/gs): w = q scale (gs = k: a scale per row)
   The int4 dot product reads a block's 16 bytes as [16 low nibbles | 16 high nibbles], so the
   input is quantized in that order ([even elements | odd elements] per block of 32).
     LIN_Q4K .. LIN_Q5_1  w GGML's blocks as a GGUF file stores them (lamina/quant/kquant.py):
               Q4_K, Q5_K, Q6_K super-blocks of 256, Q8_0, Q5_0, Q5_1 blocks of 32; each 32
               weights unpacked to int16 with their scales decoded once per super-block, the
               input in natural order (see "GGML's blocks"); one input row of Q4_K and Q6_K
               takes an integer form where the CPU has AVX-512 VNNI (kq_int: the input's scale
               per 256, each super-block summed in int32; its inputs as two byte planes for
               vpdpbusd: kq_planes); a Q4_K or Q5_0 linear's w may be laid out again in place,
               16 rows in the lanes of a vector (lw = w then: lm_kq_pack16, "one row, Q4_K in
               16-row lanes" and "one row, Q5_0 in 16-row lanes")
     LIN_PARTS w an array of gs Lins of those kinds stacked by rows (a fused q/k/v whose parts
               the file typed apart)
   The token table is float, int8 or one of the GGML kinds (a row dequantized per lookup).
*/
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

enum { LIN_F32 = 0, LIN_INT4 = 1, LIN_INT8 = 2 };
/* GGML's blocks as a GGUF file stores them (see "GGML's blocks" below), and a linear made of
   row ranges of different kinds (a fused q/k/v whose parts the file typed apart) */
enum { LIN_Q4K = 3, LIN_Q5K = 4, LIN_Q6K = 5, LIN_Q8_0 = 6, LIN_Q5_0 = 7, LIN_Q5_1 = 8, LIN_PARTS = 9 };
enum { NORM_LAYER = 0, NORM_RMS = 1 };
enum { ACT_GELU = 0, ACT_RELU = 1, ACT_RELU2 = 2, ACT_SWIGLU = 3 };

typedef struct {
    int32_t kind, n, k, gs;
    const void *w;
    const float *s;  /* scales: int4 (n, k/gs); int8 (n, k/gs) */
    const float *mn; /* int4 only: minimums (n, k/gs) */
    const float *bias;
    /* int4 only, or NULL: the weights, scales and minimums laid out again for a batch's rows
       (16 weight rows in the lanes of a vector: lm_pack16, "weights in lanes" below) */
    const uint8_t *lw;
    const float *ls, *lmn;
} Lin; /* GGML kinds: w the rows' blocks; LIN_PARTS: w an array of gs Lins, stacked by rows */

typedef struct {
    const float *n1w, *n1b, *n2w, *n2b; /* norm gains and shifts, NULL where absent */
    const float *qg, *kg;               /* qk-norm gains, NULL where absent */
    Lin qkv, proj, fc, out;
    float *kc, *vc; /* this layer's cache: (batch, kv heads, cache_len, hd); IEEE halves where
                       the model's kv16 is set */
} Layer;

typedef struct {
    int32_t n_layers, d, H, Hkv, hd, ff, vocab, cache_len;
    int32_t norm, act, qk_norm, rope;
    float eps, emb_scale, softcap; /* 0: none */
    int32_t emb_kind, emb_gs;      /* LIN_F32 or LIN_INT8 */
    int32_t kv16;                  /* 1: the caches hold IEEE halves (lm_step's "16-bit caches") */
    const void *emb_w;
    const float *emb_s;
    const float *pos_table; /* (block, d) added at the position, or NULL */
    const float *inv_freq;  /* (hd/2) rotary frequencies, or NULL */
    const float *nfw, *nfb; /* final norm */
    Lin head;
    const Layer *layers;
} Model;

/* ------------------------------------------------------------------ threads */

/* The threads are OpenMP's, and the library links libgomp.so.1: in a process that has loaded
   PyTorch, that is PyTorch's own copy, so a step runs on the very threads torch's ops use (no
   second pool competing for the cores with torch's spinning one). Between the phases of a
   step the threads meet at a barrier of our own that spins first (OpenMP's barrier sleeps in
   the kernel under OMP_WAIT_POLICY=PASSIVE, which at ~270 barriers a step would cost
   milliseconds) and sleeps only when a wait runs long (barrier_wait below). */

typedef void (*JobFn)(void *ctx, int tid, int nt);

/* libgomp's threads do not survive a fork: a forked child that entered a parallel region
   would wait for them forever (PyTorch's ops hang there too), so after a fork a step runs on
   the calling thread alone. */
static int forked = 0;
static void mark_forked(void) { forked = 1; }
__attribute__((constructor)) static void watch_forks(void) { pthread_atfork(NULL, NULL, mark_forked); }

/* team: where to write the team's size (a barrier's), or NULL */
static void run_parallel(JobFn fn, void *ctx, int nt, atomic_int *team) {
    if (nt <= 1 || forked) {
        if (team) atomic_store(team, 1);
        fn(ctx, 0, 1);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
#pragma omp single
        if (team) atomic_store(team, omp_get_num_threads()); /* the team we got */
        fn(ctx, omp_get_thread_num(), omp_get_num_threads());
    }
}

typedef struct {
    atomic_uint count, phase;
    atomic_int n, sleepers; /* the team's size; threads asleep on phase (futex) */
} Barrier;

/* How long a thread waiting at a barrier spins before it sleeps. The phases of a step are
   balanced, so a wait is normally a few microseconds and ends in the spin; but where the cores
   are shared (a server's event loop and clients beside the step, other processes, more threads
   than cores), a partner put off its core holds the others for as long as it is off: a
   waiter that sleeps gives its core back (to the partner, or to whoever took the partner's),
   where one that spins holds it. So the spin adapts: each wait that ends asleep halves it
   (down to BAR_SPIN_MIN ns), each that ends in the spin lengthens it by BAR_SPIN_STEP ns, up to
   bar_spin_us. Linux sleeps on the phase word (futex); elsewhere the wait yields its core.
   lm_bar_spin sets the most (-1 leaves it; 0 sleeps at once) and returns it. */
enum { BAR_SPIN_MIN = 2000, BAR_SPIN_STEP = 500 };
static int bar_spin_us = 100;
static atomic_int bar_spin_ns = 100000; /* the spin now */
int lm_bar_spin(int choice) {
    if (choice >= 0) bar_spin_us = choice, atomic_store(&bar_spin_ns, choice * 1000);
    return bar_spin_us;
}

/* the waits that have slept so far (the tests see the sleeping path taken) */
static atomic_int bar_sleeps = 0;
int lm_bar_sleeps(void) { return atomic_load(&bar_sleeps); }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void phase_sleep(atomic_uint *phase, unsigned seen) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)phase, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
#else
    (void)phase, (void)seen;
    sched_yield();
#endif
}

static void phase_wake(atomic_uint *phase) {
#ifdef __linux__
    syscall(SYS_futex, (unsigned *)phase, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)phase;
#endif
}

static void barrier_wait(Barrier *b) {
    const int n = atomic_load_explicit(&b->n, memory_order_relaxed);
    if (n <= 1) return;
    const unsigned phase = atomic_load_explicit(&b->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == (unsigned)n - 1) {
        atomic_store_explicit(&b->count, 0, memory_order_relaxed);
        atomic_fetch_add(&b->phase, 1); /* seq_cst with the sleepers' count: one sees the other */
        if (atomic_load(&b->sleepers)) phase_wake(&b->phase);
        return;
    }
    const int most = bar_spin_us * 1000, spin = atomic_load_explicit(&bar_spin_ns, memory_order_relaxed);
    int64_t t0 = 0;
    int slept = 0;
    for (unsigned i = 1; atomic_load_explicit(&b->phase, memory_order_acquire) == phase; i++) {
        if (i % 64) { /* the clock read once every 64 pauses */
            _mm_pause();
            continue;
        }
        const int64_t t = now_ns();
        if (!t0) t0 = t;
        if (t - t0 < spin) continue;
        slept = 1;
        atomic_fetch_add_explicit(&bar_sleeps, 1, memory_order_relaxed);
        atomic_fetch_add(&b->sleepers, 1);
        if (atomic_load(&b->phase) == phase) phase_sleep(&b->phase, phase); /* returns at once if it moved */
        atomic_fetch_sub(&b->sleepers, 1);
    }
    int next = slept ? spin / 2 : spin + BAR_SPIN_STEP;
    next = next < BAR_SPIN_MIN ? BAR_SPIN_MIN : next;
    next = next > most ? most : next;
    if (next != spin) atomic_store_explicit(&bar_spin_ns, next, memory_order_relaxed);
}

/* A step's threads each hold a CPU of their own for the step (pin_self: the one it is on, or the
   first allowed one no other thread of the step holds), and get their own masks back at its end.
   Why: a server's step shares 2 cores with its event loop and clients, and its waits at the
   barriers sleep (barrier_wait); Linux then sees two threads that wake each other in turn and
   may run both on one CPU, taking turns there while the other CPU idles (perf sched on an
   8-client `lamina serve`, AMD EPYC 2 cores: the step's two threads alternating on CPU 0 for
   ms while CPU 1 was idle; 23-30% of each CPU idle mid-load; BENCHMARKS.md, issue 33's section).
   A thread that finds no free CPU (more threads than CPUs) runs unpinned. lm_step_pin(0) turns
   it off (-1 leaves it; returns it). */
static int step_pin = 1;
int lm_step_pin(int choice) {
    if (choice >= 0) step_pin = choice ? 1 : 0;
    return step_pin;
}
typedef struct {
    unsigned long m[16];
} CpuMask;
/* pin the calling thread to its CPU, or to the first allowed one no other thread of the step
   claimed; *old gets its mask; 1 if pinned */
static int pin_self(atomic_ulong *claimed, CpuMask *old) {
#ifdef __linux__
    if (syscall(SYS_sched_getaffinity, 0, sizeof old->m, old->m) <= 0) return 0;
    unsigned cpu = 0;
    if (syscall(SYS_getcpu, &cpu, NULL, NULL) != 0) return 0;
    int pick = -1;
    if (cpu < 64 && (old->m[0] >> cpu & 1) && !(atomic_fetch_or(claimed, 1ul << cpu) & (1ul << cpu))) pick = (int)cpu;
    for (int c = 0; c < 64 && pick < 0; c++)
        if ((old->m[0] >> c & 1) && !(atomic_fetch_or(claimed, 1ul << c) & (1ul << c))) pick = c;
    if (pick < 0) return 0;
    CpuMask one = {{0}};
    one.m[0] = 1ul << pick;
    return syscall(SYS_sched_setaffinity, 0, sizeof one.m, one.m) == 0;
#else
    (void)claimed, (void)old;
    return 0;
#endif
}
static void unpin_self(const CpuMask *old) {
#ifdef __linux__
    syscall(SYS_sched_setaffinity, 0, sizeof old->m, old->m);
#else
    (void)old;
#endif
}

/* where the weight streams' software prefetches go: 1 L2 (_MM_HINT_T2), 0 L1, 2 none (the
   hardware's prefetchers alone: on the AMD EPYC a step then takes 1.4-1.8x as long; the
   distance ahead, 8 KB to 128 KB, moved it by no more than the noise; lm_pf_l2 to compare) */
static int pf_l2 = 1;
#define PF_W(p) (pf_l2 == 1 ? _mm_prefetch((p), _MM_HINT_T2) : pf_l2 == 0 ? _mm_prefetch((p), _MM_HINT_T0) : (void)0)
int lm_pf_l2(int choice) {
    if (choice >= 0) pf_l2 = choice > 2 ? 1 : choice;
    return pf_l2;
}

/* ------------------------------------------------------------------ small maths */

static inline float hsum128(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float dot_f32(const float *a, const float *b, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* y += a * x */
static inline void axpy(float *y, float a, const float *x, int n) {
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* e^x for x <= 0 (softmax), relative error ~1e-7 (Cephes' polynomial on [-ln2/2, ln2/2]) */
static inline __m256 exp256(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201E-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* s[i] <- e^s[i] for scores already shifted by their maximum; *sum <- their sum */
static void softmax_unnormalised(float *s, int n, float *sum) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp256(_mm256_loadu_ps(s + i));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float t = hsum(acc);
    for (; i < n; i++) {
        s[i] = expf(s[i]);
        t += s[i];
    }
    *sum = t;
}

/* y[c0..c1) of the normed row x (n floats): the statistics over the whole row, the same floats
   whichever columns a call writes (a step's threads share a row's columns: norm_row is all) */
static void norm_cols(const float *x, float *y, int n, const float *w, const float *b, int kind, float eps, int c0, int c1) {
    if (kind == NORM_RMS) {
        float ss = dot_f32(x, x, n);
        float r = 1.0f / sqrtf(ss / n + eps);
        for (int i = c0; i < c1; i++) y[i] = x[i] * r * (w ? w[i] : 1.0f);
    } else {
        float mean = 0, var = 0;
        for (int i = 0; i < n; i++) mean += x[i];
        mean /= n;
        for (int i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
        float r = 1.0f / sqrtf(var / n + eps);
        for (int i = c0; i < c1; i++) y[i] = (x[i] - mean) * r * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f);
    }
}

static void norm_row(const float *x, float *y, int n, const float *w, const float *b, int kind, float eps) {
    norm_cols(x, y, n, w, b, kind, eps, 0, n);
}

static inline float act1(int act, float v) {
    switch (act) {
    case ACT_GELU: return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    case ACT_RELU: return v > 0 ? v : 0;
    case ACT_RELU2: return v > 0 ? v * v : 0;
    default: return v;
    }
}

/* ------------------------------------------------------------------ linears */

/* A linear's input rows, ready for its kind: floats, or int8 blocks with their scales. */
typedef struct {
    const float *x; /* (B, k) floats (LIN_F32) */
    int16_t *q;     /* (B, k) quantized, in the order the weight kind reads */
    float *dx;      /* (B, k/32): block scales */
    float *sx;      /* (B, k/gs) int4 only: per weight group, the sum of its inputs */
    int8_t *q8;     /* (B, k) the same rows in int8 (one row's AVX-512 VNNI form), or NULL */
    float *d8;      /* (B, k/32): their block scales */
    float *s8;      /* (B, k/32): each block's sum as rounded (d8 x its int8 sum: the minimums' part
                       must see the same inputs as the weights' q, else 8 s x the rounding stays) */
    int span;       /* blocks of 32 sharing one int16 scale in q (dx repeats it): 1, or 8 for the
                       super-block kinds' integer form (kq_int below) */
    int lanes8;     /* a step whose int4 linears are in lanes with int8 inputs (lanes8): its int8
                       linears (the head) take int8 inputs at every row count too (head8) */
    uint16_t *xb;   /* (B, k) the rows in bf16 where the step multiplies in bf16 (lin_rows_bf: B at
                       least lm_gemm_min(), AVX-512 BF16), or NULL */
    int32_t *c8;    /* (B, k/32) where int8 blocks are made (q8): -128 x each block's integer sum
                       (the int8 prompt form's, lin_rows_i8), or NULL */
    int i8;         /* the int8 prompt form (lin_rows_i8) for: 0 no linear; 1 the linears that read
                       a layer's normed input (qkv, fc of `layers`); 2 fc alone; 3 every one */
    float *pd, *ps; /* its inputs: int8 blocks in xb's memory, their scales, rounded sums and */
    int32_t *pc;    /* -128 x integer sums, packed by groups of GI8 rows, block-major (i8_pack) */
    const Layer *layers;
    int nl;
} Act;

/* int8 inputs (llama.cpp's Q8_0 activations: a scale per 32, amax / 127) for one input row where
   the CPU has AVX-512 VNNI: `vpdpbusd` multiplies 64 weight bytes by 64 input bytes at once.
   Faster, but coarser than the int16 form, and further from llama.cpp's logits (its inputs are
   rounded elsewhere: BENCHMARKS.md has the error and speed): off unless LAMINA_ACT8=1 in the
   environment, or lm_act8(1). -1 until asked. */
static int act8 = -1;

static int cpu_has_vnni(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

static int act8_on(void) {
    if (act8 < 0) {
        const char *e = getenv("LAMINA_ACT8");
        act8 = cpu_has_vnni() && e && strcmp(e, "1") == 0;
    }
    return act8;
}

static int lanes8_on(void); /* the int4 lanes' int8 inputs (lanes8, with the lanes below) */
static int lanes_512(void);
/* whether L, an int8 linear of a step in lanes8, takes the int8 inputs (one row: one_row8; a
   batch: lane_rows8_512), so that its rounding does not depend on the rows in the batch */
static int head8(const Lin *L, const Act *a) { return L->kind == LIN_INT8 && a->lanes8 && a->q8 && lanes_512(); }

/* choice 0: int16 inputs everywhere; 1: int8 ones for one row where the CPU has VNNI; -1 leaves
   it; returns the form in force */
int lm_act8(int choice) {
    if (choice >= 0) act8 = choice && cpu_has_vnni();
    return act8_on();
}

/* Q4_K's integer form for one input row (one_row_q4k_int, AVX-512 VNNI): the input's int16
   scale shared by a super-block of 256 (quantize_rows' span 8), each block's weights times
   their 6-bit scale as int16 (`vpmullw`, at most 15 x 63) and `vpdpwssd` by the inputs into one
   int32 sum per super-block, which takes one float multiply (d x the input's scale); the
   minimums through the blocks' input sums, 8 floats a super-block. -1 until asked: on where the
   CPU has VNNI; lm_kq_int(0) keeps the per-32 float form (one_row_kq_512). */
static int kq_int = -1;
static inline int kq_int_on(void) {
    if (kq_int < 0) kq_int = cpu_has_vnni();
    return kq_int;
}
int lm_kq_int(int choice) {
    if (choice >= 0) kq_int = choice && cpu_has_vnni();
    return kq_int_on();
}
static inline int kq_int_for(int kind, int k) { return (kind == LIN_Q4K || kind == LIN_Q6K) && k % 256 == 0 && kq_int_on(); }

#define QMAX 32767.0f /* inputs quantized to int16 per block of 32 */

/* the largest |x| of n floats (n a multiple of 8) */
static inline float amax_of(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}

/* gs: the weight groups whose input sums sx holds (0: none); span: blocks of 32 sharing one
   int16 scale (1, or 8: a super-block's, for kq_int; k a multiple of 256 then) */
/* blocks b0..b1 of rows r0..r1 (b0 and b1 multiples of the span and of gs / 32, or b1 = k / 32:
   each block's numbers depend on its span's and group's inputs only) */
/* only8: the int8 form alone (a->q8 set; a linear in lanes that takes int8 inputs, lanes8) */
static void quantize_blocks(const float *x, int r0, int r1, int k, int perm, int gs, int span, int b0, int b1, int only8, Act *a) {
    int nb = k / 32, per = gs > 0 ? gs / 32 : 1;
    a->span = span;
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * k;
        int16_t *q = a->q + (size_t)r * k;
        float wide = 0.0f; /* span > 1: the amax of the current span */
        for (int b = b0; b < b1; b++) {
            if (span > 1 && b % span == 0) wide = amax_of(xr + 32 * b, 32 * span);
            /* vectorized, with the scalar form's exact results: the same max, product and
               rounding (cvtps2dq rounds to nearest even, as lrintf does) */
            const float *xb = xr + 32 * b;
            const __m256 sign = _mm256_set1_ps(-0.0f);
            __m256 v[4], mx = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float amax = _mm_cvtss_f32(m4), aq = span > 1 ? wide : amax;
            if (a->q8) { /* the int8 form, from the floats (not from the int16 values) */
                const __m256 id8 = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
                __m256i u[4], s8 = _mm256_setzero_si256();
                for (int i = 0; i < 4; i++) {
                    u[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id8));
                    s8 = _mm256_add_epi32(s8, u[i]);
                }
                /* int32 -> int8 in order (packs work per 128-bit lane: a dword permute puts
                   them back), then, for int4's order, each lane's evens before its odds */
                __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(u[0], u[1]), _mm256_packs_epi32(u[2], u[3]));
                q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                if (perm) {
                    const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                                        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
                    q = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(q, eo), _MM_SHUFFLE(3, 1, 2, 0));
                }
                _mm256_storeu_si256((__m256i *)(a->q8 + (size_t)r * k + 32 * b), q);
                __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4E));
                t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xB1));
                a->d8[r * nb + b] = amax / 127.0f;
                a->s8[r * nb + b] = amax / 127.0f * (float)_mm_cvtsi128_si32(t4);
                if (a->c8) a->c8[r * nb + b] = -128 * _mm_cvtsi128_si32(t4);
                if (only8) continue;
            }
            float d = aq / QMAX, id = aq > 0 ? QMAX / aq : 0.0f;
            const __m256 vid = _mm256_set1_ps(id);
            const __m256i hi = _mm256_set1_epi32(32767), lo = _mm256_set1_epi32(-32767);
            __m256i acc = _mm256_setzero_si256();
            int32_t t32[32];
            for (int i = 0; i < 4; i++) {
                __m256i qi = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
                qi = _mm256_max_epi32(_mm256_min_epi32(qi, hi), lo);
                acc = _mm256_add_epi32(acc, qi);
                _mm256_storeu_si256((__m256i *)(t32 + 8 * i), qi);
            }
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            const int sum = _mm_cvtsi128_si32(s4);
            int16_t t[32];
            for (int i = 0; i < 32; i++) t[i] = (int16_t)t32[i];
            int16_t *qb = q + 32 * b;
            if (perm)
                for (int i = 0; i < 16; i++) qb[i] = t[2 * i], qb[16 + i] = t[2 * i + 1];
            else
                memcpy(qb, t, sizeof t);
            a->dx[r * nb + b] = d;
            if (gs > 0) {
                float *g = &a->sx[r * (nb / per) + b / per];
                *g = (b % per ? *g : 0.0f) + d * (float)sum;
            }
        }
    }
}

/* input rows r0..r1 of x, ready for L (each row's part of a is its own: rows may be shared
   out among threads) */
static void quantize_rows(const float *x, int r0, int r1, int k, int perm, int gs, int span, Act *a) {
    quantize_blocks(x, r0, r1, k, perm, gs, span, 0, k / 32, 0, a);
}

/* the blocks of 32 inputs that L's quantized input shares a scale or a group sum over (1, 8...) */
static int prepare_unit(const Lin *L) {
    if (L->kind == LIN_PARTS) L = (const Lin *)L->w;
    if (L->kind == LIN_INT4) return L->gs / 32;
    if (L->kind == LIN_INT8 || L->kind == LIN_F32) return 1;
    return kq_int_for(L->kind, L->k) ? 8 : 1;
}

/* the span prepare_blocks quantizes L's input with (1, or 8: kq_int) */
static int prepare_span(const Lin *L) {
    if (L->kind == LIN_PARTS) L = (const Lin *)L->w;
    return L->kind >= LIN_Q4K && kq_int_for(L->kind, L->k) ? 8 : 1;
}

#define BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))) /* the bf16 GEMM below */
static int bf_covers(const Lin *L);
BF16 static void bf16_rows(const float *x, int r0, int r1, int k, uint16_t *xb);
static int i8_form(const Lin *L, const Act *a);
#define GI8 10 /* input rows per pass of the int8 prompt form over a weight tile (lin_rows_i8) */
/* blocks b0..b1 of rows r0..r1 of x (k wide) rounded as quantize_blocks' int8 form, into the int8
   prompt form's packed inputs: row r's block b at group r / GI8, then b, then r % GI8 */
static void i8_pack(const float *x, int r0, int r1, int k, int b0, int b1, Act *a) {
    const int nb = k / 32;
    int8_t q[k];
    float d[nb], s[nb];
    int32_t c[nb];
    Act t = {0};
    t.q8 = q, t.d8 = d, t.s8 = s, t.c8 = c;
    for (int r = r0; r < r1; r++) {
        quantize_blocks(x + (size_t)r * k, 0, 1, k, 0, 0, 1, b0, b1, 1, &t);
        const size_t g = (size_t)(r / GI8), i = (size_t)(r % GI8);
        int8_t *o = (int8_t *)a->xb + g * GI8 * k + i * 32;
        for (int b = b0; b < b1; b++) {
            memcpy(o + (size_t)b * GI8 * 32, q + 32 * b, 32);
            const size_t at = g * GI8 * nb + (size_t)b * GI8 + i;
            a->pd[at] = d[b], a->ps[at] = s[b], a->pc[at] = c[b];
        }
    }
}

/* blocks b0..b1 of x's rows r0..r1 made ready for L (b0, b1 multiples of prepare_unit(L), or b1
   the last block; where a->xb, a linear the bf16 form takes: its rows in bf16 alone) */
static void prepare_blocks(const Lin *L, const float *x, int r0, int r1, int b0, int b1, Act *a) {
    a->x = x;
    if (a->xb && bf_covers(L)) {
        if (i8_form(L, a)) { /* the int8 form's (Act.pd above) */
            i8_pack(x, r0, r1, L->k, b0, b1, a);
            return;
        }
        bf16_rows(x, r0, r1, L->k, a->xb); /* the bf16 form's input (whole rows: b0, b1 span them) */
        return;
    }
    if (L->kind == LIN_PARTS) L = (const Lin *)L->w; /* parts are all GGML kinds: one form */
    if (L->kind == LIN_INT4) quantize_blocks(x, r0, r1, L->k, 1, L->gs, 1, b0, b1, L->lw && a->q8 && lanes8_on(), a);
    else if (L->kind == LIN_INT8) quantize_blocks(x, r0, r1, L->k, 0, 0, 1, b0, b1, head8(L, a), a);
    else if (L->kind != LIN_F32) /* GGML: natural order; a scale per super-block for kq_int */
        quantize_blocks(x, r0, r1, L->k, 0, 32, kq_int_for(L->kind, L->k) ? 8 : 1, b0, b1, 0, a);
}

static void prepare_rows(const Lin *L, const float *x, int r0, int r1, Act *a) {
    prepare_blocks(L, x, r0, r1, 0, L->k / 32, a); /* (parts: L itself, the form lin_rows reads) */
}

static void prepare_act(const Lin *L, const float *x, int B, Act *a) { prepare_rows(L, x, 0, B, a); }

/* a block's integer dot product, 8 partial sums: int4 weights (16 bytes) x int16 inputs */
/* a weight block as two vectors of 16 int16: int4 (16 bytes, [low nibbles | high nibbles]) */
static inline void unpack_q4(const uint8_t *w, int b, __m256i *w0, __m256i *w1) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i raw = _mm_loadu_si128((const __m128i *)(w + 16 * b));
    *w0 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
    *w1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
}

/* ... and int8 (32 bytes) */
static inline void unpack_q8(const int8_t *w, int b, __m256i *w0, __m256i *w1) {
    const __m128i *wb = (const __m128i *)(w + 32 * b);
    *w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb));
    *w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb + 1));
}

/* an unpacked block times an input block: 8 partial integer sums */
static inline __m256i dot_block(__m256i w0, __m256i w1, const int16_t *xq, int b) {
    const __m256i *xb = (const __m256i *)(xq + 32 * b);
    return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xb)),
                            _mm256_madd_epi16(w1, _mm256_loadu_si256(xb + 1)));
}

static inline __m256i q4_block(const uint8_t *w, const int16_t *xq, int b) {
    __m256i w0, w1;
    unpack_q4(w, b, &w0, &w1);
    return dot_block(w0, w1, xq, b);
}

static inline __m256i q8_block(const int8_t *w, const int16_t *xq, int b) {
    __m256i w0, w1;
    unpack_q8(w, b, &w0, &w1);
    return dot_block(w0, w1, xq, b);
}

/* sum over blocks b of (scale of b's weight group) x dx[b] x block(b), four chains at a time;
   a group holds 2^sh blocks (sh = 31: one group for the whole row) */
#define BLOCK_SUM(BLOCK, W)                                                                   \
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                                \
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();                                \
    int b = 0;                                                                                \
    for (; b + 4 <= nb; b += 4) {                                                             \
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b >> sh] * dx[b]), _mm256_cvtepi32_ps(BLOCK(W, xq, b)), a0); \
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(sc[(b + 1) >> sh] * dx[b + 1]), _mm256_cvtepi32_ps(BLOCK(W, xq, b + 1)), a1); \
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(sc[(b + 2) >> sh] * dx[b + 2]), _mm256_cvtepi32_ps(BLOCK(W, xq, b + 2)), a2); \
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(sc[(b + 3) >> sh] * dx[b + 3]), _mm256_cvtepi32_ps(BLOCK(W, xq, b + 3)), a3); \
    }                                                                                         \
    for (; b < nb; b++)                                                                       \
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(sc[b >> sh] * dx[b]), _mm256_cvtepi32_ps(BLOCK(W, xq, b)), a0); \
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));

static inline float row_q4(const Lin *L, int n, const int16_t *xq, const float *dx, const float *sx) {
    const int k = L->k, nb = k / 32, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const uint8_t *w = (const uint8_t *)L->w + (size_t)n * (k / 2);
    const float *sc = L->s + (size_t)n * groups;
    BLOCK_SUM(q4_block, w)
    /* the minimums' part: sum over groups of mn[g] x (the group's inputs summed) */
    return sum + dot_f32(L->mn + (size_t)n * groups, sx, groups);
}

static inline float row_q8(const Lin *L, int n, const int16_t *xq, const float *dx) {
    const int k = L->k, nb = k / 32, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const int8_t *w = (const int8_t *)L->w + (size_t)n * k;
    const float *sc = L->s + (size_t)n * groups;
    BLOCK_SUM(q8_block, w)
    return sum;
}

#define TILE 8 /* input rows sharing one unpacked weight block */
#ifndef PF_ROWS
#define PF_ROWS 2
#endif

/* ------------------------------------------------------------------ GGML's blocks, as stored */

/* A GGUF tensor's rows kept as the file holds them: each row k/256 super-blocks (Q4_K, Q5_K,
   Q6_K) or k/32 blocks (Q8_0, Q5_0, Q5_1) of GGML's layout, read here 32 weights at a time as
   int16 q with a float scale for each 16 (s0, s1) and a minimum for the 32:
   w = s q + mn. The super-blocks' 6-bit scales are decoded once per super-block. */

enum { PER_SB_MAX = 8 };

static inline int kq_per(int kind) { return kind <= LIN_Q6K ? 256 : 32; }
static inline int kq_bytes(int kind) {
    switch (kind) {
    case LIN_Q4K: return 144;
    case LIN_Q5K: return 176;
    case LIN_Q6K: return 210;
    case LIN_Q8_0: return 34;
    case LIN_Q5_0: return 22;
    default: return 24; /* LIN_Q5_1 */
    }
}
static inline int kq_has_min(int kind) { return kind == LIN_Q4K || kind == LIN_Q5K || kind == LIN_Q5_1; }
static inline size_t kq_row_bytes(int kind, int k) { return (size_t)(k / kq_per(kind)) * kq_bytes(kind); }

/* IEEE half -> float, exactly (the file's fp16 scales): F16C's one instruction where the build
   has it (build.py compiles with -mf16c), else the bits moved by hand */
static inline float half(const uint8_t *p) {
#ifdef __F16C__
    uint16_t bits;
    memcpy(&bits, p, 2);
    return _cvtsh_ss(bits);
#else
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 31, m = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
        return sign ? -f : f;
    }
    v.u = sign | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
    return v.f;
#endif
}

/* the scales (s: one per 16 weights) and minimums (mn: one per 32) of a super-block or block */
static inline __attribute__((always_inline)) void kq_scales(int kind, const uint8_t *blk, float *s, float *mn) {
    if (kind == LIN_Q4K || kind == LIN_Q5K) {
        /* 12 bytes as words A B C: scales 0-3 = A's bytes' low 6 bits, minimums 0-3 = B's;
           scales 4-7 = C's low nibbles under A's top 2 bits, minimums 4-7 = C's high nibbles
           under B's top 2 bits (each byte's bits 6-7 moved to 4-5: (word >> 2) & 0x30..) */
        uint32_t w[3];
        memcpy(w, blk + 4, 12);
        const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, b45 = 0x30303030u;
        const __m128i sc = _mm_setr_epi32((int)(w[0] & lo6), (int)((w[2] & lo4) | ((w[0] >> 2) & b45)), 0, 0);
        const __m128i m = _mm_setr_epi32((int)(w[1] & lo6), (int)(((w[2] >> 4) & lo4) | ((w[1] >> 2) & b45)), 0, 0);
        const __m256 s8 = _mm256_mul_ps(_mm256_set1_ps(half(blk)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
        const __m256 m8 = _mm256_mul_ps(_mm256_set1_ps(half(blk + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m)));
        const __m256 lo = _mm256_unpacklo_ps(s8, s8), hi = _mm256_unpackhi_ps(s8, s8);
        _mm256_storeu_ps(s, _mm256_permute2f128_ps(lo, hi, 0x20)); /* s0 s0 s1 s1 .. s3 s3 */
        _mm256_storeu_ps(s + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
        _mm256_storeu_ps(mn, _mm256_xor_ps(m8, _mm256_set1_ps(-0.0f))); /* -(dmin m), exactly */
    } else if (kind == LIN_Q6K) {
        const float d = half(blk + 208);
        const int8_t *sc = (const int8_t *)(blk + 192);
        for (int g = 0; g < 16; g++) s[g] = d * (float)sc[g];
        for (int j = 0; j < 8; j++) mn[j] = 0.0f;
    } else {
        const float d = half(blk);
        s[0] = s[1] = d;
        mn[0] = kind == LIN_Q5_1 ? half(blk + 2) : 0.0f; /* Q5_0's offset 16 is in its q */
    }
}

/* 32 bits (little-endian) -> 32 bytes, 0x10 where the bit is set */
static inline __m256i bits_to_16s(uint32_t bits) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)bits),
        _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* weights j*32 .. j*32+31 of a super-block (j = 0 for a block of 32) as 32 signed bytes (every
   kind's q fits: Q8_0's own bytes, Q6_K's q - 32, Q5_0's q - 16, the others' 0..31) */
static inline __attribute__((always_inline)) __m256i kq_q8(int kind, const uint8_t *blk, int j) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (kind == LIN_Q4K || kind == LIN_Q5K) {
        const uint8_t *qs = blk + (kind == LIN_Q4K ? 16 : 48) + 32 * (j / 2);
        __m256i raw = _mm256_loadu_si256((const __m256i *)qs);
        __m256i q = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(raw, 4) : raw, m4);
        if (kind == LIN_Q5K) {
            __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
            __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
            q = _mm256_or_si256(q, _mm256_slli_epi16(hb, 4));
        }
        return q;
    }
    if (kind == LIN_Q6K) {
        const int n = j / 4, t = j % 4;
        __m256i raw = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32 * (t & 1)));
        __m256i lo = _mm256_and_si256(t >= 2 ? _mm256_srli_epi16(raw, 4) : raw, m4);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t), _mm256_set1_epi8(3));
        return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
    }
    if (kind == LIN_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    /* Q5_0, Q5_1: 16 bytes of nibbles (weights i and i + 16), 32 high bits */
    const uint8_t *qh = blk + (kind == LIN_Q5_0 ? 2 : 4);
    uint32_t bits;
    memcpy(&bits, qh, 4);
    __m128i raw = _mm_loadu_si128((const __m128i *)(qh + 4));
    __m256i nib = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    __m256i q = _mm256_or_si256(_mm256_and_si256(nib, m4), bits_to_16s(bits));
    return kind == LIN_Q5_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(16)) : q; /* Q5_0: w = d (q - 16) */
}

/* ... as two vectors of 16 int16 */
static inline __attribute__((always_inline)) void kq_unpack(int kind, const uint8_t *blk, int j, __m256i *w0, __m256i *w1) {
    const __m256i q = kq_q8(kind, blk, j);
    *w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
    *w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
}

/* x . row for one weight row of kind `kind` (int16 inputs xq, scales dx and sums sx per 32) */
static inline __attribute__((always_inline)) float row_kq(int kind, const uint8_t *row, int k, const int16_t *xq,
                                                          const float *dx, const float *sx) {
    const int per = kq_per(kind), bs = kq_bytes(kind), sub = per / 32, nsb = k / per;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float msum = 0.0f, s[16], mn[PER_SB_MAX];
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = row + (size_t)sb * bs;
        kq_scales(kind, blk, s, mn);
        for (int j = 0; j < sub; j++) {
            const int b = sb * sub + j;
            __m256i w0, w1;
            kq_unpack(kind, blk, j, &w0, &w1);
            const __m256i *xb = (const __m256i *)(xq + 32 * b);
            __m256i p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(xb));
            __m256i p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(xb + 1));
            if (kind == LIN_Q6K) {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * j] * dx[b]), _mm256_cvtepi32_ps(p0), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * j + 1] * dx[b]), _mm256_cvtepi32_ps(p1), acc1);
            } else {
                __m256 v = _mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1));
                if (b & 1) acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * j] * dx[b]), v, acc1);
                else acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * j] * dx[b]), v, acc0);
                if (kq_has_min(kind)) msum += mn[j] * sx[b];
            }
        }
    }
    return hsum(_mm256_add_ps(acc0, acc1)) + msum;
}

/* the same for up to TILE input rows at once, each weight block unpacked once for all */
static inline __attribute__((always_inline)) void tile_kq(int kind, const uint8_t *row, int k, int rows, const Act *a,
                                                          int r0, float *v) {
    const int per = kq_per(kind), bs = kq_bytes(kind), sub = per / 32, nsb = k / per, nb = k / 32;
    __m256 acc[TILE];
    float msum[TILE], s[16], mn[PER_SB_MAX];
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps(), msum[r] = 0.0f;
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = row + (size_t)sb * bs;
        kq_scales(kind, blk, s, mn);
        for (int j = 0; j < sub; j++) {
            const int b = sb * sub + j;
            __m256i w0, w1;
            kq_unpack(kind, blk, j, &w0, &w1);
            for (int r = 0; r < rows; r++) {
                const __m256i *xb = (const __m256i *)(a->q + (size_t)(r0 + r) * k + 32 * b);
                const float dxb = a->dx[(size_t)(r0 + r) * nb + b];
                __m256i p0 = _mm256_madd_epi16(w0, _mm256_loadu_si256(xb));
                __m256i p1 = _mm256_madd_epi16(w1, _mm256_loadu_si256(xb + 1));
                if (kind == LIN_Q6K) {
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * j] * dxb), _mm256_cvtepi32_ps(p0), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * j + 1] * dxb), _mm256_cvtepi32_ps(p1), acc[r]);
                } else {
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(s[2 * j] * dxb),
                                             _mm256_cvtepi32_ps(_mm256_add_epi32(p0, p1)), acc[r]);
                    if (kq_has_min(kind)) msum[r] += mn[j] * a->sx[(size_t)(r0 + r) * nb + b];
                }
            }
        }
    }
    for (int r = 0; r < rows; r++) v[r] = hsum(acc[r]) + msum[r];
}

/* weights j*32 .. j*32+31 of a super-block -> 32 floats, exactly GGML's (and gguf-py's)
   dequantization: s[2j] q (first 16), s[2j + 1] q (last 16), + mn[j] where the kind has one
   (a product then a sum, each rounded, as gguf-py's; exact but for Q6_K's one rounding) */
static inline __attribute__((always_inline)) void kq_dequant_sub(int kind, const uint8_t *blk, int j, const float *s,
                                                                 const float *mn, __m256 o[4]) {
    __m256i w[2];
    kq_unpack(kind, blk, j, &w[0], &w[1]);
    for (int h = 0; h < 2; h++) {
        const __m256 sc = _mm256_set1_ps(s[2 * j + h]);
        for (int e = 0; e < 2; e++) {
            const __m128i q = e ? _mm256_extracti128_si256(w[h], 1) : _mm256_castsi256_si128(w[h]);
            __m256 p = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(q)));
            if (kq_has_min(kind)) {
                __asm__("" : "+x"(p)); /* the product rounded before the sum (no fma) */
                p = _mm256_add_ps(p, _mm256_set1_ps(mn[j]));
            }
            o[2 * h + e] = p;
        }
    }
}

/* 16 floats -> bf16, rounded to nearest even as torch's cast (a NaN stays a quiet NaN) */
static inline __m256i bf16_of(__m256 a, __m256 b) {
    __m256i r[2];
    const __m256 v[2] = {a, b};
    for (int h = 0; h < 2; h++) {
        const __m256i x = _mm256_castps_si256(v[h]);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
        __m256i y = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v[h], v[h], _CMP_UNORD_Q));
        r[h] = _mm256_blendv_epi8(y, _mm256_set1_epi32(0x7FC0), nan);
    }
    /* packus works within 128-bit lanes: put the halves back in order */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
}

/* one weight row of kind `kind` -> k floats (y) or k bf16 (yb: the floats' torch cast) */
static inline __attribute__((always_inline)) void kq_dequant_row_k(int kind, const uint8_t *row, int k, float *y, uint16_t *yb) {
    const int per = kq_per(kind), bs = kq_bytes(kind), sub = per / 32, nsb = k / per;
    float s[16], mn[PER_SB_MAX];
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = row + (size_t)sb * bs;
        kq_scales(kind, blk, s, mn);
        for (int j = 0; j < sub; j++) {
            __m256 o[4];
            kq_dequant_sub(kind, blk, j, s, mn, o);
            const size_t at = (size_t)(sb * sub + j) * 32;
            if (yb) {
                _mm256_storeu_si256((__m256i *)(yb + at), bf16_of(o[0], o[1]));
                _mm256_storeu_si256((__m256i *)(yb + at + 16), bf16_of(o[2], o[3]));
            } else {
                for (int e = 0; e < 4; e++) _mm256_storeu_ps(y + at + 8 * e, o[e]);
            }
        }
    }
}

#define KQ_CASES(F) F(LIN_Q4K) F(LIN_Q5K) F(LIN_Q6K) F(LIN_Q8_0) F(LIN_Q5_0) F(LIN_Q5_1)

static void kq_dequant_row(int kind, const uint8_t *row, int k, float *y, uint16_t *yb) {
    switch (kind) {
#define DEQ_CASE(K) case K: kq_dequant_row_k(K, row, k, y, yb); return;
        KQ_CASES(DEQ_CASE)
#undef DEQ_CASE
    }
}

static float row_kq_any(int kind, const uint8_t *row, int k, const int16_t *xq, const float *dx, const float *sx) {
    switch (kind) {
#define ROW_CASE(K) case K: return row_kq(K, row, k, xq, dx, sx);
        KQ_CASES(ROW_CASE)
#undef ROW_CASE
    }
    return 0.0f;
}

static void tile_kq_any(int kind, const uint8_t *row, int k, int rows, const Act *a, int r0, float *v) {
    switch (kind) {
#define TILE_CASE(K) case K: tile_kq(K, row, k, rows, a, r0, v); return;
        KQ_CASES(TILE_CASE)
#undef TILE_CASE
    }
}

/* rows n0..n1 of a GGML-block linear into y (as lin_rows) */
static void lin_rows_kq(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32;
    const size_t rb = kq_row_bytes(L->kind, k);
    for (int n = n0; n < n1; n++) {
        const uint8_t *row = (const uint8_t *)L->w + (size_t)n * rb;
        const float bias = L->bias ? L->bias[n] : 0.0f;
        if (n + PF_ROWS < n1) /* a row further on its way (rows of small blocks stream poorly) */
            for (size_t o = 0; o < rb; o += 64) PF_W((const char *)row + PF_ROWS * rb + o);
        for (int r0 = 0; r0 < B; r0 += TILE) {
            const int rows = B - r0 < TILE ? B - r0 : TILE;
            float v[TILE];
            if (rows == 1)
                v[0] = row_kq_any(L->kind, row, k, a->q + (size_t)r0 * k, a->dx + (size_t)r0 * nb, a->sx + (size_t)r0 * nb);
            else
                tile_kq_any(L->kind, row, k, rows, a, r0, v);
            for (int r = 0; r < rows; r++) {
                float *o = y + (size_t)(r0 + r) * ystride + n;
                *o = (accumulate ? *o : 0.0f) + v[r] + bias;
            }
        }
    }
}

/* rows 0..n of a GGML-block tensor -> floats (n, k): for lamina's PyTorch path and its tests */
int lm_dequant(int kind, const void *w, int n, int k, float *y) {
    if (kind < LIN_Q4K || kind > LIN_Q5_1 || k % kq_per(kind)) return 0;
    const size_t rb = kq_row_bytes(kind, k);
    for (int r = 0; r < n; r++) kq_dequant_row(kind, (const uint8_t *)w + (size_t)r * rb, k, y + (size_t)r * k, NULL);
    return 1;
}

typedef struct {
    int kind, n, k, gs; /* kind -1: lamina's int8 rows, a float scale per gs of a row */
    const uint8_t *w;
    const float *scale;
    uint16_t *y;
} DequantJob;

/* lamina's int8 row -> bf16 as torch's bf16 `q.bfloat16() * scale.bfloat16()`: the scale's
   bf16 (round to nearest even) times q, exact in float, then rounded once */
static void i8_dequant_row_bf16(const int8_t *q, const float *scale, int k, int gs, uint16_t *y) {
    for (int g = 0; g < k / gs; g++) {
        const __m256i sb = bf16_of(_mm256_set1_ps(scale[g]), _mm256_set1_ps(scale[g]));
        const __m256 sc = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(sb)), 16));
        for (int i = g * gs; i < (g + 1) * gs; i += 16) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(q + i));
            const __m256 lo = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
            const __m256 hi = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
            _mm256_storeu_si256((__m256i *)(y + i), bf16_of(lo, hi));
        }
    }
}

static void dequant_job(void *ctx, int tid, int nt) {
    const DequantJob *j = (const DequantJob *)ctx;
    const size_t rb = j->kind < 0 ? (size_t)j->k : kq_row_bytes(j->kind, j->k);
    for (int r = (int)((long)j->n * tid / nt); r < (int)((long)j->n * (tid + 1) / nt); r++) {
        if (j->kind < 0)
            i8_dequant_row_bf16((const int8_t *)j->w + (size_t)r * rb, j->scale + (size_t)r * (j->k / j->gs), j->k, j->gs,
                                j->y + (size_t)r * j->k);
        else
            kq_dequant_row(j->kind, j->w + (size_t)r * rb, j->k, NULL, j->y + (size_t)r * j->k);
    }
}

/* the same as bf16 (each value the float's round to nearest even, as torch's cast), the rows
   shared among nthreads: for a prefill's long calls, which multiply in bf16 (no float copy,
   cast or concatenation on the way) */
int lm_dequant_bf16(int kind, const void *w, int n, int k, uint16_t *y, int nthreads) {
    if (kind < LIN_Q4K || kind > LIN_Q5_1 || k % kq_per(kind)) return 0;
    DequantJob j = {kind, n, k, 0, (const uint8_t *)w, NULL, y};
    run_parallel(dequant_job, &j, nthreads < 1 ? 1 : nthreads, NULL);
    return 1;
}

/* the same for lamina's int8 rows q (n, k) with a float scale per gs inputs of a row (gs = k:
   one per row), each value torch's bf16 product of the two's bf16 */
int lm_dequant_i8_bf16(const int8_t *q, const float *scale, int n, int k, int gs, uint16_t *y, int nthreads) {
    if (gs < 16 || gs % 16 || k % gs) return 0;
    DequantJob j = {-1, n, k, gs, (const uint8_t *)q, scale, y};
    run_parallel(dequant_job, &j, nthreads < 1 ? 1 : nthreads, NULL);
    return 1;
}

/* ------------------------------------------------------------------ a batch's rows in lanes */

/* The int4 and int8 linears of a batch (B >= 2 rows: a server's sequences decoded together)
   put up to LANES input rows in the lanes of one vector. The input, quantized as for one row,
   is rearranged as int16 pairs, rows in lanes (absent rows zero); each weight block is unpacked
   once into its 16 pairs (elements 2p, 2p + 1), each broadcast to all lanes, so one `vpmaddwd`
   (+ add) multiplies a weight pair into every row's sum at once. With AVX-512 VNNI (checked at
   run time; other CPUs take the AVX2 form) a 16-lane `vpdpwssd` covers two blocks of 8 rows.
   A block's integer sums take its scales as one vector (the rows' input scales times the
   weight's), the int4 minimums one fma per group; BENCHMARKS.md (the server's section) has
   what 8 rows cost against one in each form. The same integer products as the one-row path,
   summed in another order (~1e-6 relative). */
#define LANES 8
#define NT 4 /* weight rows sharing each load of the inputs (4: the fastest here of 1..8) */

typedef struct {
    int32_t *xt; /* (k/32, 16, LANES) int16 pairs */
    float *dxt;  /* (k/32, LANES) block scales */
    float *sxt;  /* (k/gs, LANES) int4: the group sums */
} LaneAct;

/* Inputs p and p + 1 of a block as one int32 pair (the lanes' layout): neighbours, or for
   int4's [even | odd] order, p and 16 + p. */
static inline int32_t lane_pair(const int16_t *qb, int p, int perm) {
    const int16_t lo = perm ? qb[p] : qb[2 * p], hi = perm ? qb[16 + p] : qb[2 * p + 1];
    return (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
}

static void lane_act(const Lin *L, const Act *a, int r0, int rows, LaneAct *t) {
    const int k = L->k, nb = k / 32, groups = L->kind == LIN_INT4 ? k / L->gs : 0;
    const int perm = L->kind == LIN_INT4; /* int4 inputs are [even | odd] per block */
    for (int r = 0; r < LANES; r++) {
        const int16_t *q = r < rows ? a->q + (size_t)(r0 + r) * k : NULL;
        for (int b = 0; b < nb; b++) {
            int32_t *o = t->xt + (size_t)b * 16 * LANES + r;
            for (int p = 0; p < 16; p++) o[p * LANES] = q ? lane_pair(q + 32 * b, p, perm) : 0;
            t->dxt[b * LANES + r] = q ? a->dx[(size_t)(r0 + r) * nb + b] : 0.0f;
        }
        for (int g = 0; g < groups; g++) t->sxt[g * LANES + r] = q ? a->sx[(size_t)(r0 + r) * groups + g] : 0.0f;
    }
}

/* weight row n's block b as 16 int16 pairs (elements 2p, 2p + 1) */
static inline void lane_pairs(const Lin *L, int n, int b, int32_t *wp) {
    if (L->kind == LIN_INT4) { /* byte p holds elements 2p (low nibble) and 2p + 1 */
        const __m128i raw = _mm_loadu_si128((const __m128i *)((const uint8_t *)L->w + (size_t)n * (L->k / 2) + 16 * b));
        const __m256i m = _mm256_set1_epi32(15);
        __m256i p0 = _mm256_cvtepu8_epi32(raw), p1 = _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8));
        p0 = _mm256_or_si256(_mm256_and_si256(p0, m), _mm256_slli_epi32(_mm256_srli_epi32(p0, 4), 16));
        p1 = _mm256_or_si256(_mm256_and_si256(p1, m), _mm256_slli_epi32(_mm256_srli_epi32(p1, 4), 16));
        _mm256_store_si256((__m256i *)wp, p0);
        _mm256_store_si256((__m256i *)(wp + 8), p1);
    } else {
        const __m128i *w = (const __m128i *)((const int8_t *)L->w + (size_t)n * L->k + 32 * b);
        _mm256_store_si256((__m256i *)wp, _mm256_cvtepi8_epi16(_mm_loadu_si128(w)));
        _mm256_store_si256((__m256i *)(wp + 8), _mm256_cvtepi8_epi16(_mm_loadu_si128(w + 1)));
    }
}

/* output rows n0..n1 for the `rows` inputs of t (rows r0..), into y as lin_rows; DP(acc, x, w):
   acc + the pairwise products of x and w summed per 32-bit lane */
#define LANE_BODY(DP)                                                                                  \
    const int k = L->k, nb = k / 32, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32); \
    for (int n = n0; n < n1; n += NT) {                                                                \
        const int nt = n1 - n < NT ? n1 - n : NT;                                                      \
        __m256 f[NT];                                                                                  \
        for (int j = 0; j < NT; j++) f[j] = _mm256_setzero_ps();                                       \
        for (int b = 0; b < nb; b++) {                                                                 \
            int32_t wp[NT][16] __attribute__((aligned(32)));                                           \
            for (int j = 0; j < NT; j++) lane_pairs(L, j < nt ? n + j : n, b, wp[j]);                  \
            const __m256i *xb = (const __m256i *)(t->xt + (size_t)b * 16 * LANES);                     \
            __m256i s[NT][2];                                                                          \
            for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = _mm256_setzero_si256();                   \
            for (int p = 0; p < 16; p += 2) {                                                          \
                const __m256i x0 = _mm256_load_si256(xb + p), x1 = _mm256_load_si256(xb + p + 1);      \
                for (int j = 0; j < NT; j++) {                                                         \
                    s[j][0] = DP(s[j][0], x0, _mm256_set1_epi32(wp[j][p]));                            \
                    s[j][1] = DP(s[j][1], x1, _mm256_set1_epi32(wp[j][p + 1]));                        \
                }                                                                                      \
            }                                                                                          \
            const __m256 dx = _mm256_loadu_ps(t->dxt + b * LANES);                                    \
            for (int j = 0; j < NT; j++) {                                                             \
                const float sc = L->s[(size_t)(j < nt ? n + j : n) * groups + (b >> sh)];              \
                f[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(s[j][0], s[j][1])),        \
                                       _mm256_mul_ps(dx, _mm256_set1_ps(sc)), f[j]);                   \
            }                                                                                          \
        }                                                                                              \
        for (int j = 0; j < nt; j++) {                                                                 \
            if (L->kind == LIN_INT4)                                                                   \
                for (int g = 0; g < groups; g++)                                                       \
                    f[j] = _mm256_fmadd_ps(_mm256_set1_ps(L->mn[(size_t)(n + j) * groups + g]),        \
                                           _mm256_loadu_ps(t->sxt + g * LANES), f[j]);                 \
            float v[LANES];                                                                            \
            _mm256_storeu_ps(v, f[j]);                                                                 \
            const float bias = L->bias ? L->bias[n + j] : 0.0f;                                        \
            for (int r = 0; r < rows; r++) {                                                           \
                float *o = y + (size_t)(r0 + r) * ystride + n + j;                                     \
                *o = (accumulate ? *o : 0.0f) + v[r] + bias;                                           \
            }                                                                                          \
        }                                                                                              \
    }

#define LANE_ARGS const Lin *L, const LaneAct *t, int r0, int rows, float *y, int ystride, int n0, int n1, int accumulate
#define DP_AVX2(acc, x, w) _mm256_add_epi32(acc, _mm256_madd_epi16(x, w))
static void lane_rows_avx2(LANE_ARGS) { LANE_BODY(DP_AVX2) }

/* With AVX-512 a 16-lane vector holds the 8 rows of two blocks side by side (lane 2r + e: row
   r, block 2c + e of block pair c; xt2[c][pair][row][e]): one 64-bit broadcast puts a pair of
   each block's weights beside the rows' inputs, so a `vpdpwssd` covers two blocks of 8 rows. */
typedef struct {
    int32_t *xt;  /* (nb/2 rounded up, 16, LANES, 2) int16 pairs */
    float *dxt;   /* (nb/2 rounded up, LANES, 2) block scales */
    float *sxt;   /* (k/gs, LANES) int4: the group sums */
    float *sx2;   /* int4 in groups of 32: (nb/2 rounded up, LANES, 2) the blocks' sums laid out as
                     dxt, so the minimums join each block pair's fma; otherwise NULL */
} LaneAct2;

/* int8: the pair lane_rows_512's w2[j][i] holds (its 32-bit unpacks, within 128-bit lanes) */
#define I8_PAIR(i) ((i) < 8 ? 4 * ((i) / 2) + (i) % 2 : 4 * (((i) - 8) / 2) + 2 + (i) % 2)

static void lane_act2(const Lin *L, const Act *a, int r0, int rows, LaneAct2 *t) {
    const int k = L->k, nb = k / 32, nc = (nb + 1) / 2, groups = L->kind == LIN_INT4 ? k / L->gs : 0;
    const int perm = L->kind == LIN_INT4;
    for (int r = 0; r < LANES; r++) {
        const int16_t *q = r < rows ? a->q + (size_t)(r0 + r) * k : NULL;
        for (int b = 0; b < 2 * nc; b++) {
            const int c = b / 2, e = b % 2, real = q && b < nb;
            int32_t *o = t->xt + (size_t)c * 16 * LANES * 2 + r * 2 + e;
            for (int p = 0; p < 16; p++) o[p * LANES * 2] = real ? lane_pair(q + 32 * b, perm ? p : I8_PAIR(p), perm) : 0;
            t->dxt[(size_t)c * LANES * 2 + r * 2 + e] = real ? a->dx[(size_t)(r0 + r) * nb + b] : 0.0f;
            if (t->sx2) t->sx2[(size_t)c * LANES * 2 + r * 2 + e] = real ? a->sx[(size_t)(r0 + r) * nb + b] : 0.0f;
        }
        if (!t->sx2)
            for (int g = 0; g < groups; g++) t->sxt[g * LANES + r] = q ? a->sx[(size_t)(r0 + r) * groups + g] : 0.0f;
    }
}

#ifndef LANE_PF
#define LANE_PF 2 /* groups of NT weight rows ahead to prefetch: 0 / 2 / 4 gave an 8-row step of
                     23.0 / 17.5 / 18.1 ms (head 4.0 / 2.1 / 2.5 ms), BENCHMARKS.md */
#endif
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void lane_rows_512(const Lin *L, const LaneAct2 *t, int r0, int rows, float *y, int ystride, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, nc = (nb + 1) / 2, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const size_t rb = L->kind == LIN_INT4 ? (size_t)k / 2 : (size_t)k;
    for (int n = n0; n < n1; n += NT) {
        const int nt = n1 - n < NT ? n1 - n : NT;
        if (LANE_PF && n + (LANE_PF + 1) * NT <= n1) { /* a group further on its way: weights, scales, minimums */
            const char *next = (const char *)L->w + (size_t)(n + LANE_PF * NT) * rb;
            for (size_t o = 0; o < NT * rb; o += 64) PF_W(next + o);
            for (size_t o = 0; o < NT * groups * 4; o += 64) {
                PF_W((const char *)(L->s + (size_t)(n + LANE_PF * NT) * groups) + o);
                if (L->kind == LIN_INT4) PF_W((const char *)(L->mn + (size_t)(n + LANE_PF * NT) * groups) + o);
            }
        }
        __m512 f[NT];
        for (int j = 0; j < NT; j++) f[j] = _mm512_setzero_ps();
        for (int c = 0; c < nc; c++) {
            const int b0 = 2 * c, b1 = b0 + 1 < nb ? b0 + 1 : -1;
            /* w2[j][p]: (block b0's pair p, block b1's pair p), made in registers */
            int64_t w2[NT][16] __attribute__((aligned(64)));
            for (int j = 0; j < NT; j++) {
                const int nn = j < nt ? n + j : n;
                if (L->kind == LIN_INT4) {
                    const uint8_t *wr = (const uint8_t *)L->w + (size_t)nn * (k / 2);
                    const __m128i r0 = _mm_loadu_si128((const __m128i *)(wr + 16 * b0));
                    const __m128i r1 = b1 >= 0 ? _mm_loadu_si128((const __m128i *)(wr + 16 * b1)) : _mm_setzero_si128();
                    const __m512i m = _mm512_set1_epi32(15);
                    __m512i lo = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(r0, r1));
                    __m512i hi = _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(r0, r1));
                    lo = _mm512_or_si512(_mm512_and_si512(lo, m), _mm512_slli_epi32(_mm512_srli_epi32(lo, 4), 16));
                    hi = _mm512_or_si512(_mm512_and_si512(hi, m), _mm512_slli_epi32(_mm512_srli_epi32(hi, 4), 16));
                    _mm512_store_si512(w2[j], lo);
                    _mm512_store_si512(w2[j] + 8, hi);
                } else {
                    const int8_t *wr = (const int8_t *)L->w + (size_t)nn * k;
                    const __m512i p0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wr + 32 * b0)));
                    const __m512i p1 = b1 >= 0 ? _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wr + 32 * b1))) : _mm512_setzero_si512();
                    /* 32-bit pairs interleaved across the two blocks within 128-bit lanes (one
                       cycle, where a lane-crossing permute took three): w2[j][i] holds pair
                       I8_PAIR(i), which lane_act2 puts beside it */
                    _mm512_store_si512(w2[j], _mm512_unpacklo_epi32(p0, p1));
                    _mm512_store_si512(w2[j] + 8, _mm512_unpackhi_epi32(p0, p1));
                }
            }
            const __m512i *xb = (const __m512i *)(t->xt + (size_t)c * 16 * LANES * 2);
            __m512i s[NT][2];
            for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = _mm512_setzero_si512();
            for (int i = 0; i < 16; i += 2) {
                const __m512i x0 = _mm512_load_si512(xb + i), x1 = _mm512_load_si512(xb + i + 1);
                for (int j = 0; j < NT; j++) {
                    s[j][0] = _mm512_dpwssd_epi32(s[j][0], x0, _mm512_set1_epi64(w2[j][i]));
                    s[j][1] = _mm512_dpwssd_epi32(s[j][1], x1, _mm512_set1_epi64(w2[j][i + 1]));
                }
            }
            const __m512 dx = _mm512_loadu_ps(t->dxt + (size_t)c * LANES * 2);
            for (int j = 0; j < NT; j++) {
                const float *sc = L->s + (size_t)(j < nt ? n + j : n) * groups;
                double s2d;
                if (sh == 0 && b1 >= 0) { /* a scale per block: the pair's two side by side */
                    memcpy(&s2d, sc + b0, 8);
                } else {
                    float s2[2] = {sc[b0 >> sh], b1 >= 0 ? sc[b1 >> sh] : 0.0f};
                    memcpy(&s2d, s2, 8);
                }
                const __m512 sv = _mm512_castpd_ps(_mm512_set1_pd(s2d));
                f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s[j][0], s[j][1])), _mm512_mul_ps(dx, sv), f[j]);
                if (t->sx2) { /* the minimums: (mn b0, mn b1) times the rows' block sums */
                    const float *mn = L->mn + (size_t)(j < nt ? n + j : n) * groups;
                    float m2[2] = {mn[b0], b1 >= 0 ? mn[b1] : 0.0f};
                    double m2d;
                    memcpy(&m2d, m2, 8);
                    f[j] = _mm512_fmadd_ps(_mm512_castpd_ps(_mm512_set1_pd(m2d)), _mm512_loadu_ps(t->sx2 + (size_t)c * LANES * 2), f[j]);
                }
            }
        }
        for (int j = 0; j < nt; j++) {
            /* lanes 2r and 2r + 1 are row r's two blocks: added, then the rows' 8 sums */
            const __m512 pr = _mm512_add_ps(f[j], _mm512_permute_ps(f[j], 0xB1));
            __m256 v8 = _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), pr));
            if (L->kind == LIN_INT4 && !t->sx2)
                for (int g = 0; g < groups; g++)
                    v8 = _mm256_fmadd_ps(_mm256_set1_ps(L->mn[(size_t)(n + j) * groups + g]), _mm256_loadu_ps(t->sxt + g * LANES), v8);
            float v[LANES];
            _mm256_storeu_ps(v, v8);
            const float bias = L->bias ? L->bias[n + j] : 0.0f;
            for (int r = 0; r < rows; r++) {
                float *o = y + (size_t)(r0 + r) * ystride + n + j;
                *o = (accumulate ? *o : 0.0f) + v[r] + bias;
            }
        }
    }
}

static int lanes_wide = -1; /* 1: the AVX-512 VNNI form; -1 until asked */

static int cpu_has_512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
}

static int lanes_512(void) {
    if (lanes_wide < 0) lanes_wide = cpu_has_512(); /* the same whichever thread asks first */
    return lanes_wide;
}

/* which form a batch's linears take: choice 0 the AVX2 form, 1 the AVX-512 one where the CPU
   has it, -1 leaves it; returns the form in force (tests run both where both run) */
int lm_lanes_wide(int choice) {
    if (choice >= 0) lanes_wide = choice && cpu_has_512();
    return lanes_512();
}

/* the fewest rows worth the lanes (which cost the same for 1 row as for 8): the AVX-512 form's
   8 rows cost about 2.3 rows' time (BENCHMARKS.md, the server's section). The AVX2 form's, per
   kind, on the AVX2-only EPYC Zen 3 (bench/batch_step.py, SmolLM2 Q4_1, 2 threads): int4 lanes
   even with the per-row tiles at 4 rows (blocks 21.2 / 21.3 ms), ahead from 5 (22.4 / 26.0);
   the int8 head in lanes 5.6-7.6 ms for 2..8 rows against the tiles' 2.4 (2) .. 5.5 (8), so an
   int8 linear takes the tiles (LANES + 1: never the lanes). lm_lanes_min (int4) and
   lm_lanes_min8 (int8) set the AVX2 thresholds (2..LANES + 1; -1 leaves) and return them, so
   that they can be compared (bench/batch_step.py --switch lm_lanes_min). */
static int lanes_min_avx2 = 5, lanes_min_avx2_i8 = LANES + 1;
static int lanes_set(int *at, int choice) {
    if (choice >= 2) *at = choice > LANES + 1 ? LANES + 1 : choice;
    return *at;
}
int lm_lanes_min(int choice) { return lanes_set(&lanes_min_avx2, choice); }
int lm_lanes_min8(int choice) { return lanes_set(&lanes_min_avx2_i8, choice); }
static int lanes_min(int wide) { return wide ? 3 : lanes_min_avx2; }
static int lanes_min_for(int wide, int kind) { return !wide && kind == LIN_INT8 ? lanes_min_avx2_i8 : lanes_min(wide); }

static void lin_rows(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate);

/* ------------------------------------------------------------------ one row in AVX-512 */

/* whether a GGML-block linear's one row takes the AVX-512 form below or row_kq's AVX2 loop:
   2 (the default) the AVX-512 form for every kind but Q6_K, 3 for the per-32 kinds only (Q8_0,
   Q5_0, Q5_1), 1 always, 0 never. On the AMD EPYC
   (Zen 4; bench/step_profile.py, one row, all layers of a role in turn, under the lock) the
   AVX-512 form is faster for the per-32 kinds (SmolLM2's Q5_0 fc 5.05 -> 4.41 ms, 1 thread),
   about even for Q4_K (the 1B shape's fc 34.5 -> 33.3 ms) and slower for Q6_K (the 1B shape's
   Q6_K head 29.8 -> 39.3 ms; SmolLM2's Q6_K/Q4_K out 2.42 -> 2.68 ms, 2 threads 1.29 -> 1.71).
   lm_kq_wide sets it (-1 leaves it) and returns it, so that the forms can be compared. */
static int kq_wide = 2;
int lm_kq_wide(int choice) {
    if (choice >= 0) kq_wide = choice > 3 ? 2 : choice;
    return kq_wide;
}
static inline int kq_wide_for(int kind) {
    return kq_wide == 2 ? kind != LIN_Q6K : kq_wide == 3 ? kind > LIN_Q6K : kq_wide;
}

/* whether an int8 linear's one row takes the AVX-512 form (one_row_i8_512: 1, the default) or
   the AVX2 row loop (0); -1 leaves it; returns the form in force (1 only where the CPU has
   AVX-512). SmolLM2 Q8_0 (lamina's int8, a scale per 32), bench/step_profile.py: BENCHMARKS.md. */
static int i8_wide = 1;
int lm_i8_wide(int choice) {
    if (choice >= 0) i8_wide = choice ? 1 : 0;
    return i8_wide && lanes_512();
}
#ifndef I8_PF
#define I8_PF 4 /* passes ahead to prefetch */
#endif

/* One input row (a lone sequence's decode step) where the CPU has AVX-512: each block of 32
   weights widened to 32 int16 in one vector and multiplied by the input's block with one
   `vpmaddwd` (the same integer products and sums as the AVX2 path), NR weight rows at a time
   so that each input block is loaded once for all of them. */
#define WIDE __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define NR 4 /* weight rows per pass over the input */

/* Prefetches ahead run to the linear's last row (L->n), not to this call's n1: a step calls a
   linear in units of rows (lin_shared_act), and a thread's next unit is most often the rows
   right after, so the passes past n1 are on their way when it starts (stopped at n1, each unit
   began with its first passes waiting on memory). The lanes forms likewise. */

/* the NR rows from n (rows past n1 repeat row n: computed, not stored) */
static inline int nr_row(int n, int j, int n1) { return n + j < n1 ? n + j : n; }

/* How the one-row AVX-512 forms prefetch the weights of the passes ahead: 1 (the default) a few
   lines a row at each step of a pass (each step the bytes it reads, so many passes on), 0 all of
   a pass's rows at its start (the earlier form: bursts of up to NR x k bytes of prefetches, which
   on the AMD EPYC Zen 4 left a row of 1536 int8 weights streaming at 0.53x the spread form's
   rate; BENCHMARKS.md). lm_pf_spread sets it (-1 leaves it) and returns it. */
static int pf_spread = 1;
int lm_pf_spread(int choice) {
    if (choice >= 0) pf_spread = choice ? 1 : 0;
    return pf_spread;
}
/* passes ahead that the GGML kinds' spread prefetches reach (lm_pf_passes, 1..64; -1 leaves it) */
static int pf_passes = 4;
int lm_pf_passes(int choice) {
    if (choice >= 1) pf_passes = choice > 64 ? 64 : choice;
    return pf_passes;
}

/* row[j]: the NR weight rows of a pass from n, each rb bytes (nr_row), with the rows four passes
   on prefetched at once where pf_spread is 0 (else the kernel calls pf_rows as it goes) */
static inline void nr_rows(const Lin *L, size_t rb, int n, int n1, const uint8_t **row) {
    for (int j = 0; j < NR; j++) row[j] = (const uint8_t *)L->w + (size_t)nr_row(n, j, n1) * rb;
    if (!pf_spread && n + 4 * NR < n1)
        for (size_t o = 0; o < NR * rb; o += 64) PF_W((const char *)row[0] + 4 * NR * rb + o);
}

/* the lines of bytes from..to of each of the NR rows pfo bytes on (from 0: the first line too;
   else from the line after the one holding from, which the previous call took) */
static inline void pf_rows(const uint8_t *const *row, size_t pfo, size_t from, size_t to) {
    for (int j = 0; j < NR; j++) {
        const uintptr_t a0 = (uintptr_t)(row[j] + pfo + from), a1 = (uintptr_t)(row[j] + pfo + to);
        for (uintptr_t p = from ? (a0 + 63) & ~(uintptr_t)63 : a0 & ~(uintptr_t)63; p < a1; p += 64) PF_W((const char *)p);
    }
}

WIDE static void store_nr(const Lin *L, const __m512 *acc, const float *extra, float *y, int n, int n1, int accumulate) {
    for (int j = 0; j < NR && n + j < n1; j++) {
        const float v = _mm512_reduce_add_ps(acc[j]) + extra[j] + (L->bias ? L->bias[n + j] : 0.0f);
        y[n + j] = (accumulate ? y[n + j] : 0.0f) + v;
    }
}

/* int4 rows n0..n1 for one input row (int8 ones: one_row_i8_512 below) */
WIDE static void one_row_q4_512(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const size_t wb = (size_t)k / 2;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *w[NR];
        const float *sc[NR];
        for (int j = 0; j < NR; j++) {
            const int r = nr_row(n, j, n1);
            w[j] = (const uint8_t *)L->w + (size_t)r * wb;
            sc[j] = L->s + (size_t)r * groups;
        }
        if (n + 2 * NR < L->n) { /* the pass after next on its way: weights, scales, minimums */
            for (size_t o = 0; o < NR * wb; o += 64) PF_W((const char *)w[0] + 2 * NR * wb + o);
            for (size_t o = 0; o < NR * groups * 4; o += 64) {
                PF_W((const char *)(sc[0] + 2 * NR * groups) + o);
                PF_W((const char *)(L->mn + (size_t)(n + 2 * NR) * groups) + o);
            }
        }
        __m512 acc[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const __m512i x = _mm512_loadu_si512((const void *)(a->q + 32 * b));
            const float d = a->dx[b];
            for (int j = 0; j < NR; j++) { /* [16 low nibbles | 16 high nibbles] as 32 int16 */
                const __m128i raw = _mm_loadu_si128((const __m128i *)(w[j] + 16 * b));
                const __m512i wz = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), m4));
                acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(sc[j][b >> sh] * d), _mm512_cvtepi32_ps(_mm512_madd_epi16(wz, x)), acc[j]);
            }
        }
        float mins[NR] = {0}; /* the minimums' part, as row_q4 */
        for (int j = 0; j < NR && n + j < n1; j++) mins[j] = dot_f32(L->mn + (size_t)(n + j) * groups, a->sx, groups);
        store_nr(L, acc, mins, y, n, n1, accumulate);
    }
}

/* the products s dx of blocks b0 .. b0 + m (m <= 16) of NR rows' scales sc (groups of 2^sh
   blocks; b0 a multiple of 16, so that block b0 + i takes scale (b0 >> sh) + (i >> sh)) */
WIDE static inline __attribute__((always_inline)) void sd16(const float *const *sc, const float *dx, int b0, int m, int sh, __m512 *sd) {
    const __mmask16 live = (__mmask16)((1u << m) - 1);
    const __m512 dxv = _mm512_maskz_loadu_ps(live, dx + b0);
    if (sh == 0) {
        for (int j = 0; j < NR; j++) sd[j] = _mm512_mul_ps(_mm512_maskz_loadu_ps(live, sc[j] + b0), dxv);
        return;
    }
    const int ng = ((b0 + m - 1) >> sh) - (b0 >> sh) + 1;
    const __mmask16 glive = (__mmask16)((1u << ng) - 1);
    const __m512i gidx = _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), sh > 4 ? 4 : sh);
    for (int j = 0; j < NR; j++) sd[j] = _mm512_mul_ps(_mm512_permutexvar_ps(gidx, _mm512_maskz_loadu_ps(glive, sc[j] + (b0 >> sh))), dxv);
}

/* int4 rows in block pairs (one_row_q4p_512, AVX-512 VNNI; 1, the default, where the CPU has it;
   0 keeps one_row_q4_512; -1 leaves it; returns the form in force) */
static int q4_pair = 1;
int lm_q4_pair(int choice) {
    if (choice >= 0) q4_pair = choice ? 1 : 0;
    return q4_pair && lanes_512();
}

/* int4 rows n0..n1 for one input row, two blocks a step: a row's 32 bytes of blocks b and b + 1
   widened to 32 int16 ([b's 16 bytes | b + 1's]), their low nibbles (the blocks' even weights)
   and high nibbles (odd) each one vector; the input's two blocks regrouped the same way once a
   pass for the NR rows ([b even | b + 1 even], [b odd | b + 1 odd]: its [even | odd] order per
   block makes that two 256-bit shuffles), so two `vpdpwssd` give block b's 8 partial sums in
   lanes 0-7 and b + 1's in 8-15; one conversion and one fma by [s_b dx_b x8 | s_b+1 dx_b+1 x8]
   (the products s dx computed 16 blocks at a time, spread by `vpermps`). one_row_q4_512 takes a
   block a step: its own unpacking, conversion, scalar product and fma for each. The same integer
   products; float sums in another order. */
VNNI static void one_row_q4p_512(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, nb2 = nb & ~1, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const size_t wb = (size_t)k / 2;
    const __m512i m4 = _mm512_set1_epi16(0x0F);
    const __m512i half_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *w[NR];
        const float *sc[NR];
        for (int j = 0; j < NR; j++) {
            const int r = nr_row(n, j, n1);
            w[j] = (const uint8_t *)L->w + (size_t)r * wb;
            sc[j] = L->s + (size_t)r * groups;
        }
        /* the pass after next on its way: scales and minimums at once, the weights a line a row
           every four blocks (spread through the pass, as one_row_i8_512) */
        const int ahead = n + 2 * NR < L->n, spread = ahead && pf_spread;
        const size_t pfo = 2 * NR * wb;
        if (ahead) {
            if (!spread)
                for (size_t o = 0; o < NR * wb; o += 64) PF_W((const char *)w[0] + pfo + o);
            for (size_t o = 0; o < NR * groups * 4; o += 64) {
                PF_W((const char *)(sc[0] + 2 * NR * groups) + o);
                PF_W((const char *)(L->mn + (size_t)(n + 2 * NR) * groups) + o);
            }
        }
        __m512 acc[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps();
        for (int b0 = 0; b0 < nb2; b0 += 16) { /* 16 blocks: their s dx products, one vector a row */
            const int m = nb2 - b0 < 16 ? nb2 - b0 : 16;
            __m512 sd[NR];
            sd16(sc, a->dx, b0, m, sh, sd);
            for (int p = 0; p < m; p += 2) {
                const int b = b0 + p;
                const __m512i xa = _mm512_loadu_si512((const void *)(a->q + 32 * b));
                const __m512i xb = _mm512_loadu_si512((const void *)(a->q + 32 * b + 32));
                const __m512i xe = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(1, 0, 1, 0)); /* even weights' inputs */
                const __m512i xo = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(3, 2, 3, 2)); /* odd */
                const __m512i idx = _mm512_add_epi32(half_idx, _mm512_set1_epi32(p));
                if (spread && !(b & 3))
                    for (int j = 0; j < NR; j++) PF_W((const char *)w[j] + pfo + 16 * b);
                for (int j = 0; j < NR; j++) {
                    const __m512i z = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w[j] + 16 * b)));
                    const __m512i s = _mm512_dpwssd_epi32(_mm512_madd_epi16(_mm512_and_si512(z, m4), xe), _mm512_srli_epi16(z, 4), xo);
                    acc[j] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, sd[j]), _mm512_cvtepi32_ps(s), acc[j]);
                }
            }
        }
        if (nb2 < nb) { /* an odd last block: one_row_q4_512's step */
            const int b = nb2;
            const __m512i x = _mm512_loadu_si512((const void *)(a->q + 32 * b));
            const float d = a->dx[b];
            for (int j = 0; j < NR; j++) {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(w[j] + 16 * b));
                const __m512i wz = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F)));
                acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(sc[j][b >> sh] * d), _mm512_cvtepi32_ps(_mm512_madd_epi16(wz, x)), acc[j]);
            }
        }
        float mins[NR] = {0}; /* the minimums' part, as row_q4 */
        for (int j = 0; j < NR && n + j < n1; j++) mins[j] = dot_f32(L->mn + (size_t)(n + j) * groups, a->sx, groups);
        store_nr(L, acc, mins, y, n, n1, accumulate);
    }
}

/* int8 rows n0..n1 for one input row (GGUF's Q8_0 read into lamina's int8: q int8 (n, k), a
   float scale per group): 32 weights widened to 32 int16 in one vector, one `vpmaddwd` by the
   input's block; the products s dx of 16 blocks of a row made at once (one vector multiply,
   stored), each block's fma taking its product as a broadcast memory operand. The AVX2 row loop's
   integer products and sums; float sums in another order. (It replaced a form that multiplied
   and broadcast s dx per block and row: the same floats in the same order, BENCHMARKS.md.) */
WIDE static void one_row_i8_512(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const float zero[NR] = {0};
    for (int n = n0; n < n1; n += NR) {
        const int8_t *w[NR];
        const float *sc[NR];
        for (int j = 0; j < NR; j++) {
            const int r = nr_row(n, j, n1);
            w[j] = (const int8_t *)L->w + (size_t)r * k;
            sc[j] = L->s + (size_t)r * groups;
        }
        /* I8_PF passes on: the scales at once, the weights a line a row every two blocks (spread
           through the pass, not all at its start: faster in a C harness, BENCHMARKS.md) */
        const int ahead = n + I8_PF * NR < L->n, spread = ahead && pf_spread;
        const size_t pfo = (size_t)I8_PF * NR * k;
        if (ahead) {
            if (!spread)
                for (size_t o = 0; o < (size_t)NR * k; o += 64) PF_W((const char *)w[0] + pfo + o);
            for (size_t o = 0; o < (size_t)NR * groups * 4; o += 64) PF_W((const char *)(sc[0] + (size_t)I8_PF * NR * groups) + o);
        }
        __m512 acc[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps();
        for (int b0 = 0; b0 < nb; b0 += 16) {
            const int m = nb - b0 < 16 ? nb - b0 : 16;
            __m512 sdv[NR];
            float sd[NR][16] __attribute__((aligned(64)));
            sd16(sc, a->dx, b0, m, sh, sdv);
            for (int j = 0; j < NR; j++) _mm512_store_ps(sd[j], sdv[j]);
            for (int p = 0; p < m; p++) {
                const int b = b0 + p;
                const __m512i x = _mm512_loadu_si512((const void *)(a->q + 32 * b));
                if (spread && !(b & 1))
                    for (int j = 0; j < NR; j++) PF_W((const char *)w[j] + pfo + 32 * b);
                for (int j = 0; j < NR; j++) {
                    const __m512i wz = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w[j] + 32 * b)));
                    acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(sd[j][p]), _mm512_cvtepi32_ps(_mm512_madd_epi16(wz, x)), acc[j]);
                }
            }
        }
        store_nr(L, acc, zero, y, n, n1, accumulate);
    }
}

/* Q5_0 and Q5_1 blocks of 32 straight to 32 int16 (the same integers as kq_q8 widened): the
   16 bytes of nibbles widened once, low nibbles in lanes 0-15 and high ones in 16-31, the 32
   high bits a lane mask (Q5_0: q - 16 where the bit is clear; Q5_1: q + 16 where it is set), in
   place of kq_q8's byte shuffles; 1 (the default) this form, 0 kq_q8's (lm_q5_mask to compare) */
static int q5_mask = 1;
int lm_q5_mask(int choice) {
    if (choice >= 0) q5_mask = choice ? 1 : 0;
    return q5_mask;
}
WIDE static inline __attribute__((always_inline)) __m512i kq_w16_512(int kind, const uint8_t *blk, int jj) {
    if ((kind == LIN_Q5_0 || kind == LIN_Q5_1) && q5_mask) {
        const uint8_t *qh = blk + (kind == LIN_Q5_0 ? 2 : 4);
        uint32_t bits;
        memcpy(&bits, qh, 4);
        const __m256i t = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qh + 4)));
        const __m512i nib = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(t, _mm256_set1_epi16(15))), _mm256_srli_epi16(t, 4), 1);
        return kind == LIN_Q5_0 ? _mm512_mask_sub_epi16(nib, (__mmask32)~bits, nib, _mm512_set1_epi16(16))
                                : _mm512_mask_add_epi16(nib, (__mmask32)bits, nib, _mm512_set1_epi16(16));
    }
    return _mm512_cvtepi8_epi16(kq_q8(kind, blk, jj));
}

/* Q5_0 and Q5_1 rows in block pairs (one_row_q5p_512; 1, the default, where the CPU has AVX-512
   VNNI; 0 keeps one_row_kq_512; -1 leaves it; returns the form in force) */
static int q5_pair = 1;
int lm_q5_pair(int choice) {
    if (choice >= 0) q5_pair = choice ? 1 : 0;
    return q5_pair && lanes_512();
}

/* Q5_0 / Q5_1 rows n0..n1 for one input row, two blocks a step (one_row_q4p_512's way): blocks b
   and b + 1's 16 bytes of nibbles side by side, widened to 32 int16, their low nibbles (weights
   0-15 of each) one vector and their high ones (16-31) another, the 32 + 32 high bits regrouped
   the same way into two lane masks (Q5_0: q - 16 where the bit is clear; Q5_1: q + 16 where it
   is set, as kq_w16_512); the input's two blocks regrouped once a pass ([b 0-15 | b + 1 0-15],
   [b 16-31 | b + 1 16-31]); two `vpdpwssd`, one conversion, one fma by [d_b dx_b x8 | d_b+1
   dx_b+1 x8]. The fp16 scales (and Q5_1's minimums) of 16 blocks of a row are read at once and
   converted by one `vcvtph2ps`; Q5_1's minimums' part is one fma of 16 a row (m x the blocks'
   input sums). The same integers as one_row_kq_512; float sums in another order. */
VNNI static inline __attribute__((always_inline)) void one_row_q5p(int kind, const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, nb2 = nb & ~1, bs = kq_bytes(kind), qo = kind == LIN_Q5_0 ? 2 : 4;
    const size_t rb = kq_row_bytes(kind, k);
    const __m512i m4 = _mm512_set1_epi16(0x0F), sixteen = _mm512_set1_epi16(16);
    const __m512i half_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        nr_rows(L, rb, n, n1, row);
        /* four passes on (as nr_rows), a line a row each pair of blocks, spread through the pass */
        const int ahead = pf_spread && n + pf_passes * NR < L->n;
        const size_t pfo = (size_t)pf_passes * NR * rb;
        __m512 acc[NR];
        __m128 mac[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps(), mac[j] = _mm_setzero_ps();
        {
            for (int b = 0; b < nb2; b += 2) {
                const __m512i xa = _mm512_loadu_si512((const void *)(a->q + 32 * b));
                const __m512i xb = _mm512_loadu_si512((const void *)(a->q + 32 * b + 32));
                const __m512i xl = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(1, 0, 1, 0)); /* weights 0-15 of each */
                const __m512i xh = _mm512_shuffle_i64x2(xa, xb, _MM_SHUFFLE(3, 2, 3, 2)); /* 16-31 */
                const __m128 dx2 = _mm_castpd_ps(_mm_load_sd((const double *)(a->dx + b)));
                const __m128 sx2 = kind == LIN_Q5_1 ? _mm_castpd_ps(_mm_load_sd((const double *)(a->sx + b))) : _mm_setzero_ps();
                if (ahead)
                    for (int j = 0; j < NR; j++) PF_W((const char *)row[j] + pfo + (size_t)b * bs);
                for (int j = 0; j < NR; j++) {
                    const uint8_t *q0 = row[j] + (size_t)b * bs + qo, *q1 = q0 + bs;
                    uint16_t d0, d1;
                    memcpy(&d0, q0 - qo, 2);
                    memcpy(&d1, q1 - qo, 2);
                    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(d0 | (uint32_t)d1 << 16)));
                    const __m512 sv = _mm512_permutexvar_ps(half_idx, _mm512_castps128_ps512(_mm_mul_ps(dd, dx2)));
                    if (kind == LIN_Q5_1) {
                        uint16_t m0, m1;
                        memcpy(&m0, q0 - 2, 2);
                        memcpy(&m1, q1 - 2, 2);
                        mac[j] = _mm_fmadd_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)(m0 | (uint32_t)m1 << 16))), sx2, mac[j]);
                    }
                    uint32_t h0, h1;
                    memcpy(&h0, q0, 4);
                    memcpy(&h1, q1, 4);
                    const __m512i z = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(q0 + 4))),
                                                                                   _mm_loadu_si128((const __m128i *)(q1 + 4)), 1));
                    __m512i lo = _mm512_and_si512(z, m4), hi = _mm512_srli_epi16(z, 4);
                    const __mmask32 blo = (h0 & 0xFFFFu) | h1 << 16, bhi = h0 >> 16 | (h1 & 0xFFFF0000u);
                    if (kind == LIN_Q5_0) {
                        lo = _mm512_mask_sub_epi16(lo, (__mmask32)~blo, lo, sixteen);
                        hi = _mm512_mask_sub_epi16(hi, (__mmask32)~bhi, hi, sixteen);
                    } else {
                        lo = _mm512_mask_add_epi16(lo, blo, lo, sixteen);
                        hi = _mm512_mask_add_epi16(hi, bhi, hi, sixteen);
                    }
                    const __m512i s = _mm512_dpwssd_epi32(_mm512_madd_epi16(lo, xl), hi, xh);
                    acc[j] = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(s), acc[j]);
                }
            }
        }
        float msum[NR];
        for (int j = 0; j < NR; j++) msum[j] = kind == LIN_Q5_1 ? hsum128(mac[j]) : 0.0f;
        if (nb2 < nb) { /* an odd last block: one_row_kq_512's step */
            const int b = nb2;
            const __m512i x = _mm512_loadu_si512((const void *)(a->q + 32 * b));
            for (int j = 0; j < NR; j++) {
                float s[16], mn[PER_SB_MAX];
                const uint8_t *blk = row[j] + (size_t)b * bs;
                kq_scales(kind, blk, s, mn);
                acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(s[0] * a->dx[b]), _mm512_cvtepi32_ps(_mm512_madd_epi16(kq_w16_512(kind, blk, 0), x)), acc[j]);
                if (kind == LIN_Q5_1) msum[j] += mn[0] * a->sx[b];
            }
        }
        store_nr(L, acc, msum, y, n, n1, accumulate);
    }
}

VNNI static void one_row_q5_0p(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) { one_row_q5p(LIN_Q5_0, L, a, y, n0, n1, accumulate); }
VNNI static void one_row_q5_1p(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) { one_row_q5p(LIN_Q5_1, L, a, y, n0, n1, accumulate); }

/* GGML-block rows n0..n1 for one input row */
WIDE static inline __attribute__((always_inline)) void one_row_kq_512(int kind, const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, per = kq_per(kind), bs = kq_bytes(kind), sub = per / 32, nsb = k / per;
    const size_t rb = kq_row_bytes(kind, k);
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        nr_rows(L, rb, n, n1, row);
        const int spread = pf_spread && n + pf_passes * NR < L->n;
        __m512 acc[NR];
        float msum[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps(), msum[j] = 0.0f;
        for (int sb = 0; sb < nsb; sb++) {
            if (spread) pf_rows(row, (size_t)pf_passes * NR * rb, (size_t)sb * bs, (size_t)(sb + 1) * bs);
            float s[NR][16], mn[NR][PER_SB_MAX];
            for (int j = 0; j < NR; j++) kq_scales(kind, row[j] + (size_t)sb * bs, s[j], mn[j]);
            for (int jj = 0; jj < sub; jj++) {
                const int b = sb * sub + jj;
                const __m512i x = _mm512_loadu_si512((const void *)(a->q + 32 * b));
                const float d = a->dx[b];
                for (int j = 0; j < NR; j++) {
                    const __m512i wz = kq_w16_512(kind, row[j] + (size_t)sb * bs, jj);
                    const __m512 p = _mm512_cvtepi32_ps(_mm512_madd_epi16(wz, x));
                    if (kind == LIN_Q6K) { /* a scale per 16: lanes 0-7 the first 16, 8-15 the next */
                        const __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(s[j][2 * jj] * d), _mm256_set1_ps(s[j][2 * jj + 1] * d), 1);
                        acc[j] = _mm512_fmadd_ps(sv, p, acc[j]);
                    } else {
                        acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(s[j][2 * jj] * d), p, acc[j]);
                        if (kq_has_min(kind)) msum[j] += mn[j][jj] * a->sx[b];
                    }
                }
            }
        }
        store_nr(L, acc, msum, y, n, n1, accumulate);
    }
}

WIDE static void one_row_kq_any_512(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    switch (L->kind) {
#define WIDE_CASE(K) case K: one_row_kq_512(K, L, a, y, n0, n1, accumulate); return;
        KQ_CASES(WIDE_CASE)
#undef WIDE_CASE
    }
}

/* ------------------------------------------------------------------ one row in AVX2, NR rows a pass */

/* One input row where the CPU lacks AVX-512 (lm_nr2): NR weight rows per pass over the input,
   each input block loaded once for all of them, the rows of passes further on prefetched, with
   the row loop's integer products (unpack_q4 / unpack_q8, dot_block) and its minimums' part
   (row_q4's). Whole passes only: the rows past the last multiple of NR take the row loop.
   lm_nr2: 1 (the default) int4 rows with k <= 1024 only, 2 int4 and int8 rows of any k, 0 the
   row loops alone; -1 leaves it; returns the form in force (0 where the AVX-512 forms run).
   The default from bench/step_profile.py --switch lm_nr2 on the AVX2-only AMD EPYC (Zen 3),
   SmolLM2 Q4_1: 1 and 2 both faster than 0 in a whole step, 1 the faster of the two at one
   thread (its int4 out projection at k 1536 and its int8 head gain only when the role is timed
   alone, partly from cache) and even at two (BENCHMARKS.md). */
static int nr2 = 1;
int lm_nr2(int choice) {
    if (choice >= 0) nr2 = choice > 2 ? 1 : choice;
    return lanes_512() ? 0 : nr2;
}
static inline int nr2_for(const Lin *L) {
    if (lanes_512() || L->k % 32) return 0;
    return L->kind == LIN_INT4 ? nr2 == 2 || (nr2 == 1 && L->k <= 1024) : L->kind == LIN_INT8 && nr2 == 2;
}
#ifndef NR2_PF
#define NR2_PF 2 /* passes ahead to prefetch (none: the hardware's prefetchers alone, far slower) */
#endif

/* rows n0..n1 (n1 - n0 a multiple of NR) for one input row: int4 (q4, with row_q4's minimums'
   part) or int8; q4 a constant at each call, so each kind gets its own loop */
static inline __attribute__((always_inline)) void one_row_nr2(int q4, const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const size_t wb = q4 ? (size_t)k / 2 : (size_t)k; /* bytes a weight row */
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *w = (const uint8_t *)L->w + (size_t)n * wb; /* the NR rows, one after another */
        const float *sc = L->s + (size_t)n * groups;
        if (n + NR2_PF * NR < n1) { /* NR2_PF passes on: weights, scales (and int4's minimums) */
            for (size_t o = 0; o < NR * wb; o += 64) PF_W((const char *)w + NR2_PF * NR * wb + o);
            for (size_t o = 0; o < (size_t)NR * groups * 4; o += 64) {
                PF_W((const char *)(sc + NR2_PF * NR * groups) + o);
                if (q4) PF_W((const char *)(L->mn + (size_t)(n + NR2_PF * NR) * groups) + o);
            }
        }
        __m256 acc[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            const float d = a->dx[b];
            for (int j = 0; j < NR; j++) {
                __m256i w0, w1;
                if (q4) unpack_q4(w + j * wb, b, &w0, &w1);
                else unpack_q8((const int8_t *)w + j * wb, b, &w0, &w1);
                acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(sc[j * groups + (b >> sh)] * d), _mm256_cvtepi32_ps(dot_block(w0, w1, a->q, b)), acc[j]);
            }
        }
        for (int j = 0; j < NR; j++) {
            float v = hsum(acc[j]) + (L->bias ? L->bias[n + j] : 0.0f);
            if (q4) v += dot_f32(L->mn + (size_t)(n + j) * groups, a->sx, groups);
            y[n + j] = (accumulate ? y[n + j] : 0.0f) + v;
        }
    }
}

/* each kind its own function: inlined into lin_rows instead, the step gained less from nr2 (BENCHMARKS.md) */
static void one_row_q4_nr2(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) { one_row_nr2(1, L, a, y, n0, n1, accumulate); }
static void one_row_i8_nr2(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) { one_row_nr2(0, L, a, y, n0, n1, accumulate); }

/* ------------------------------------------------------------------ one row, int8 inputs */

/* The VNNI form (see act8): each weight block as 32 unsigned bytes u with w = u - off (off 0
   for the kinds whose offset is a minimum, folded in through the input sums as above), two
   blocks to a 64-byte vector beside the input's two int8 blocks: `vpdpbusd` sums each 4
   products into 16 int32 lanes (8 per block), started from -off x the input's sums. */
#ifndef PF8
#define PF8 4 /* passes ahead to prefetch */
#endif

static inline int u8_shift(int kind) { /* log2 of off, or -1: none */
    return kind == LIN_Q6K ? 5 : kind == LIN_Q5_0 ? 4 : kind == LIN_Q8_0 || kind == LIN_INT8 ? 7 : -1;
}

static inline __attribute__((always_inline)) __m256i kq_u8(int kind, const uint8_t *blk, int j) {
    const __m256i q = kq_q8(kind, blk, j);
    if (kind == LIN_Q6K) return _mm256_add_epi8(q, _mm256_set1_epi8(32));
    if (kind == LIN_Q5_0) return _mm256_add_epi8(q, _mm256_set1_epi8(16));
    if (kind == LIN_Q8_0) return _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80));
    return q;
}

/* blocks b and b + 1 (zero when !two) of a row as 64 unsigned bytes */
VNNI static inline __attribute__((always_inline)) __m512i pair_u8(int kind, const uint8_t *row, int b, int two) {
    if (kind == LIN_INT4) { /* 16 bytes a block: [low nibbles | high nibbles] */
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        if (!two) {
            const __m128i raw = _mm_loadu_si128((const __m128i *)(row + 16 * b));
            return _mm512_and_si512(_mm512_zextsi256_si512(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw)), m4);
        }
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(row + 16 * b));
        const __m512i z = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(raw), _mm256_srli_epi16(raw, 4), 1), m4);
        return _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* [lo b, hi b, lo b+1, hi b+1] */
    }
    if (kind == LIN_INT8) {
        const __m512i f = _mm512_set1_epi8((char)0x80);
        return two ? _mm512_xor_si512(_mm512_loadu_si512((const void *)(row + 32 * b)), f)
                   : _mm512_zextsi256_si512(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(row + 32 * b)), _mm256_set1_epi8((char)0x80)));
    }
    const int bs = kq_bytes(kind);
    const __m512i lo = _mm512_zextsi256_si512(kq_u8(kind, row + (size_t)b * bs, 0));
    return two ? _mm512_inserti64x4(lo, kq_u8(kind, row + (size_t)(b + 1) * bs, 0), 1) : lo;
}

static inline __attribute__((always_inline)) float lin_scale(int kind, const Lin *L, const uint8_t *row, int n, int b, int groups, int sh, float *mn) {
    if (kind == LIN_INT4 || kind == LIN_INT8) return L->s[(size_t)n * groups + (b >> sh)];
    float s[2];
    kq_scales(kind, row + (size_t)b * kq_bytes(kind), s, mn);
    return s[0];
}

/* rows n0..n1 of an int4, int8 or per-32 GGML linear (Q8_0, Q5_0, Q5_1) for one input row */
VNNI static inline __attribute__((always_inline)) void one_row8_32(int kind, const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, sh8 = u8_shift(kind);
    const int groups = kind == LIN_INT4 || kind == LIN_INT8 ? k / L->gs : 1;
    const int sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const size_t rb = kind == LIN_INT4 ? (size_t)k / 2 : kind == LIN_INT8 ? (size_t)k : kq_row_bytes(kind, k);
    const __m512i ones = _mm512_set1_epi8(1);
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        int rn[NR];
        for (int j = 0; j < NR; j++) rn[j] = nr_row(n, j, n1), row[j] = (const uint8_t *)L->w + (size_t)rn[j] * rb;
        if (PF8 && n + PF8 * NR < n1) {
            for (size_t o = 0; o < NR * rb; o += 64) _mm_prefetch((const char *)row[0] + PF8 * NR * rb + o, _MM_HINT_T2);
            if (groups > 1 || kind == LIN_INT4 || kind == LIN_INT8) /* lamina's kinds: their scales (and minimums) */
                for (size_t o = 0; o < NR * groups * 4; o += 64) {
                    _mm_prefetch((const char *)(L->s + (size_t)(n + PF8 * NR) * groups) + o, _MM_HINT_T0);
                    if (kind == LIN_INT4) _mm_prefetch((const char *)(L->mn + (size_t)(n + PF8 * NR) * groups) + o, _MM_HINT_T0);
                }
        }
        __m512 acc[NR];
        float msum[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps(), msum[j] = 0.0f;
        for (int b = 0; b < nb; b += 2) {
            const int two = b + 1 < nb;
            const __m512i x = two ? _mm512_loadu_si512((const void *)(a->q8 + 32 * b))
                                  : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(a->q8 + 32 * b)));
            const float d0 = a->d8[b], d1 = two ? a->d8[b + 1] : 0.0f;
            __m512i init = _mm512_setzero_si512();
            if (sh8 >= 0) init = _mm512_sub_epi32(init, _mm512_slli_epi32(_mm512_dpbusd_epi32(init, ones, x), sh8));
            for (int j = 0; j < NR; j++) {
                float mn0[1] = {0}, mn1[1] = {0};
                const float s0 = lin_scale(kind, L, row[j], rn[j], b, groups, sh, mn0);
                const float s1 = two ? lin_scale(kind, L, row[j], rn[j], b + 1, groups, sh, mn1) : 0.0f;
                const __m512i p = _mm512_dpbusd_epi32(init, pair_u8(kind, row[j], b, two), x);
                const __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(s0 * d0), _mm256_set1_ps(s1 * d1), 1);
                acc[j] = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(p), acc[j]);
                if (kind == LIN_Q5_1) msum[j] += mn0[0] * a->s8[b] + (two ? mn1[0] * a->s8[b + 1] : 0.0f);
            }
        }
        if (kind == LIN_INT4)
            for (int j = 0; j < NR && n + j < n1; j++) {
                const float *mn = L->mn + (size_t)(n + j) * groups;
                if (groups == nb) msum[j] = dot_f32(mn, a->s8, nb);
                else
                    for (int b = 0; b < nb; b++) msum[j] += mn[b >> sh] * a->s8[b];
            }
        store_nr(L, acc, msum, y, n, n1, accumulate);
    }
}

/* rows n0..n1 of a super-block linear (Q4_K, Q5_K, Q6_K: 8 blocks of 32 each) for one input row */
VNNI static inline __attribute__((always_inline)) void one_row8_sb(int kind, const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, bs = kq_bytes(kind), nsb = k / 256, sh8 = u8_shift(kind);
    const size_t rb = kq_row_bytes(kind, k);
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        for (int j = 0; j < NR; j++) row[j] = (const uint8_t *)L->w + (size_t)nr_row(n, j, n1) * rb;
        if (PF8 && n + PF8 * NR < n1)
            for (size_t o = 0; o < NR * rb; o += 64) _mm_prefetch((const char *)row[0] + PF8 * NR * rb + o, _MM_HINT_T2);
        __m512 acc[NR];
        float msum[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps(), msum[j] = 0.0f;
        for (int sb = 0; sb < nsb; sb++) {
            float s[NR][16], mn[NR][PER_SB_MAX];
            for (int j = 0; j < NR; j++) kq_scales(kind, row[j] + (size_t)sb * bs, s[j], mn[j]);
            for (int jj = 0; jj < 8; jj += 2) {
                const int b = sb * 8 + jj;
                const __m512i x = _mm512_loadu_si512((const void *)(a->q8 + 32 * b));
                const __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(a->d8[b]), _mm256_set1_ps(a->d8[b + 1]), 1);
                __m512i init = _mm512_setzero_si512();
                if (sh8 >= 0) init = _mm512_sub_epi32(init, _mm512_slli_epi32(_mm512_dpbusd_epi32(init, ones, x), sh8));
                for (int j = 0; j < NR; j++) {
                    const uint8_t *blk = row[j] + (size_t)sb * bs;
                    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(kq_u8(kind, blk, jj)), kq_u8(kind, blk, jj + 1), 1);
                    const __m512i p = _mm512_dpbusd_epi32(init, w, x);
                    __m512 sv; /* Q6_K: a scale per 16 (4 lanes); the others per 32 (8 lanes) */
                    if (kind == LIN_Q6K) sv = _mm512_permutexvar_ps(quad, _mm512_castps128_ps512(_mm_loadu_ps(&s[j][2 * jj])));
                    else sv = _mm512_insertf32x8(_mm512_set1_ps(s[j][2 * jj]), _mm256_set1_ps(s[j][2 * jj + 2]), 1);
                    acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(sv, dd), _mm512_cvtepi32_ps(p), acc[j]);
                    if (kq_has_min(kind)) msum[j] += mn[j][jj] * a->s8[b] + mn[j][jj + 1] * a->s8[b + 1];
                }
            }
        }
        store_nr(L, acc, msum, y, n, n1, accumulate);
    }
}

VNNI static void one_row8(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    switch (L->kind) {
    case LIN_INT4: one_row8_32(LIN_INT4, L, a, y, n0, n1, accumulate); return;
    case LIN_INT8: one_row8_32(LIN_INT8, L, a, y, n0, n1, accumulate); return;
    case LIN_Q8_0: one_row8_32(LIN_Q8_0, L, a, y, n0, n1, accumulate); return;
    case LIN_Q5_0: one_row8_32(LIN_Q5_0, L, a, y, n0, n1, accumulate); return;
    case LIN_Q5_1: one_row8_32(LIN_Q5_1, L, a, y, n0, n1, accumulate); return;
    case LIN_Q4K: one_row8_sb(LIN_Q4K, L, a, y, n0, n1, accumulate); return;
    case LIN_Q5K: one_row8_sb(LIN_Q5K, L, a, y, n0, n1, accumulate); return;
    case LIN_Q6K: one_row8_sb(LIN_Q6K, L, a, y, n0, n1, accumulate); return;
    }
}

/* ------------------------------------------------------------------ one row, Q4_K in integers */

/* Q4_K rows n0..n1 for one input row quantized with a scale per super-block (a->span 8; see
   kq_int): per super-block and weight row, the 8 blocks' weights q (0..15) times their 6-bit
   scale as int16 by `vpmullw`, `vpdpwssd` by the int16 inputs into 16 int32 lanes (16 products
   a lane at most 15 x 63 x 32767: no overflow), then one conversion and one fma by d x the
   input's scale; the minimums' part dmin x m_j x the blocks' input sums, one 8-float fma. The
   same weights and inputs as the per-32 form, with the super-block's sums exact in integers.
   The NR rows of a pass go in step: a super-block's scales of all NR rows are decoded first,
   then each 32 bytes of weights are taken for every row in turn, so the rows' int32 sums are NR
   independent chains (a row at a time made one chain of 8 dependent `vpdpwssd` a row, slower:
   BENCHMARKS.md, "Q4_K's rows in step"). */
VNNI static void one_row_q4k_int(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nsb = k / 256;
    const size_t rb = kq_row_bytes(LIN_Q4K, k);
    const __m512i m4 = _mm512_set1_epi16(0x0F);
    const uint32_t lo6 = 0x3f3f3f3fu, lo4 = 0x0f0f0f0fu, b45 = 0x30303030u;
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        nr_rows(L, rb, n, n1, row);
        const int spread = pf_spread && n + pf_passes * NR < L->n;
        __m512 acc[NR];
        __m256 macc[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps(), macc[j] = _mm256_setzero_ps();
        for (int sb = 0; sb < nsb; sb++) {
            if (spread) pf_rows(row, (size_t)pf_passes * NR * rb, (size_t)sb * 144, (size_t)(sb + 1) * 144);
            const __m512i *xs = (const __m512i *)(a->q + 256 * sb);
            const float dxs = a->dx[8 * sb];
            const __m256 sxs = _mm256_loadu_ps(a->sx + 8 * sb);
            int32_t sw[NR][8] __attribute__((aligned(32))); /* each scale in both halves of a word pair */
            __m512i isum[NR];
            for (int j = 0; j < NR; j++) {
                const uint8_t *blk = row[j] + (size_t)sb * 144;
                uint32_t w[3];
                memcpy(w, blk + 4, 12);
                const __m256i sc = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)(w[0] & lo6), (int)((w[2] & lo4) | ((w[0] >> 2) & b45)), 0, 0));
                const __m256i mi = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)(w[1] & lo6), (int)(((w[2] >> 4) & lo4) | ((w[1] >> 2) & b45)), 0, 0));
                _mm256_store_si256((__m256i *)sw[j], _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16)));
                macc[j] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(mi), _mm256_set1_ps(half(blk + 2))), sxs, macc[j]);
                isum[j] = _mm512_setzero_si512();
            }
            for (int p = 0; p < 4; p++) { /* 32 bytes: blocks 2p (low nibbles) and 2p + 1 (high) */
                const __m512i xl = _mm512_loadu_si512((const void *)(xs + 2 * p)), xh = _mm512_loadu_si512((const void *)(xs + 2 * p + 1));
                for (int j = 0; j < NR; j++) {
                    const __m512i raw = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(row[j] + (size_t)sb * 144 + 16 + 32 * p)));
                    const __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_srli_epi16(raw, 4);
                    isum[j] = _mm512_dpwssd_epi32(isum[j], _mm512_mullo_epi16(lo, _mm512_set1_epi32(sw[j][2 * p])), xl);
                    isum[j] = _mm512_dpwssd_epi32(isum[j], _mm512_mullo_epi16(hi, _mm512_set1_epi32(sw[j][2 * p + 1])), xh);
                }
            }
            for (int j = 0; j < NR; j++)
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[j]), _mm512_set1_ps(half(row[j] + (size_t)sb * 144) * dxs), acc[j]);
        }
        float mins[NR];
        for (int j = 0; j < NR; j++) mins[j] = -hsum(macc[j]);
        store_nr(L, acc, mins, y, n, n1, accumulate);
    }
}

/* Q6_K rows n0..n1 the same way: a super-block's 16 int8 scales (one per 16 weights) as int16,
   spread over each block's two halves by `vpermw`; q - 32 (-32..31) times its scale is at most
   4096 in size, so a lane's 16 products stay below 2^31 (16 x 4096 x 32767 = 2147418112). */
static const int16_t Q6_SPREAD[8][32] __attribute__((aligned(64))) = {
#define SPREAD_ROW(j) {2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, 2 * j, \
    2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1}
    SPREAD_ROW(0), SPREAD_ROW(1), SPREAD_ROW(2), SPREAD_ROW(3), SPREAD_ROW(4), SPREAD_ROW(5), SPREAD_ROW(6), SPREAD_ROW(7)
#undef SPREAD_ROW
};

VNNI static void one_row_q6k_int(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nsb = k / 256;
    const size_t rb = kq_row_bytes(LIN_Q6K, k);
    const __m512i m4 = _mm512_set1_epi16(0x0F), m30 = _mm512_set1_epi16(0x30), off = _mm512_set1_epi16(32);
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        nr_rows(L, rb, n, n1, row);
        const int spread = pf_spread && n + pf_passes * NR < L->n;
        __m512 acc[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps();
        for (int sb = 0; sb < nsb; sb++) {
            if (spread) pf_rows(row, (size_t)pf_passes * NR * rb, (size_t)sb * 210, (size_t)(sb + 1) * 210);
            const __m512i *xs = (const __m512i *)(a->q + 256 * sb);
            const float dxs = a->dx[8 * sb];
            for (int j = 0; j < NR; j++) {
                const uint8_t *blk = row[j] + (size_t)sb * 210;
                const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192))));
                __m512i isum = _mm512_setzero_si512();
                for (int h = 0; h < 2; h++) { /* 128 weights: ql 64 bytes, qh 32 */
                    const __m512i A = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 64 * h)));
                    const __m512i B = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32)));
                    const __m512i H = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
                    __m512i q[4];
                    q[0] = _mm512_or_si512(_mm512_and_si512(A, m4), _mm512_and_si512(_mm512_slli_epi16(H, 4), m30));
                    q[1] = _mm512_or_si512(_mm512_and_si512(B, m4), _mm512_and_si512(_mm512_slli_epi16(H, 2), m30));
                    q[2] = _mm512_or_si512(_mm512_srli_epi16(A, 4), _mm512_and_si512(H, m30));
                    q[3] = _mm512_or_si512(_mm512_srli_epi16(B, 4), _mm512_and_si512(_mm512_srli_epi16(H, 2), m30));
                    for (int t = 0; t < 4; t++) {
                        const int b = 4 * h + t;
                        const __m512i s = _mm512_permutexvar_epi16(_mm512_load_si512((const void *)Q6_SPREAD[b]), sc);
                        const __m512i w = _mm512_mullo_epi16(_mm512_sub_epi16(q[t], off), s);
                        isum = _mm512_dpwssd_epi32(isum, w, _mm512_loadu_si512((const void *)(xs + b)));
                    }
                }
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(half(blk + 208) * dxs), acc[j]);
            }
        }
        const float zero[NR] = {0};
        store_nr(L, acc, zero, y, n, n1, accumulate);
    }
}

/* ------------------------------------------------------------------ one row, Q4_K / Q6_K by byte planes */

/* The same integers as the two forms above, in bytes: the input's int16 x split exactly into
   x = 256 xh + xl (xh = x >> 8 signed, xl = x & 255 unsigned), two planes of bytes made once a
   call (kq_planes), so that a super-block's weights stay bytes, 64 to a vector, and `vpdpbusd`
   takes four products a lane: h = dpbusd(0, q, xh), then dpbusd(h << 8, xl, q) is sum q x over
   the lane's 4 weights, exact (|h| <= 4 x 63 x 128). A super-block gives 4 such vectors; one
   transposing sum (sum4x4) leaves 16 lanes, each one block's (Q4_K: half a block, 16 products)
   or one 16-group's (Q6_K) sum, multiplied by its scale in int32 (`vpmulld`) and converted once.
   Where the forms above took `vpmullw` and `vpdpwssd` for every 32 weights (and Q6_K's int16
   unpacking), this takes two `vpdpbusd` for every 64. Bounds: Q4_K's lane 16 x 15 x 32767 x 63
   < 2^29; Q6_K's weights go in unsigned (0..63), each group's sum less 32 x its inputs' sum (the
   planes' g32) is sum (q - 32) x, then times the scale at most 16 x 32 x 32767 x 128 < 2^31.
   The Q4_K form decodes the scales, minimums and d of a pass's 4 rows at once by byte permutes
   (`vpermb`: AVX-512 VBMI). On where the CPU has VNNI (and VBMI for Q4_K); lm_kq_planes(0)
   keeps the forms above, -1 leaves it; returns the form in force. */
static int kq_planes = 1, kq_vnni = -1, kq_vbmi = -1;
#define VBMI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx512vbmi")))
static void kq_cpu(void) {
    if (kq_vnni >= 0) return;
    __builtin_cpu_init();
    kq_vbmi = cpu_has_vnni() && __builtin_cpu_supports("avx512vbmi");
    kq_vnni = cpu_has_vnni();
}
int lm_kq_planes(int choice) {
    kq_cpu();
    if (choice >= 0) kq_planes = choice ? 1 : 0;
    return kq_planes && kq_vnni;
}
static inline int kq_planes_for(int kind) {
    kq_cpu();
    return kq_planes && (kind == LIN_Q6K ? kq_vnni : kq_vbmi);
}

/* the planes of one input row (k a multiple of 256), per super-block 512 bytes: 4 vectors, each
   xh (64 bytes) then xl (64), holding the inputs of the weights the kernel's 4 vectors hold
   (Q4_K: blocks 0 2 | 1 3 | 4 6 | 5 7, the low and high nibbles of its 32-byte rows; Q6_K: in
   order); Q6_K also g32: per super-block 16 int32, 32 x a 16-group's inputs' sum in sum4x4's
   lane order (lane 4c + i: group 4i + c) */
VNNI static void kq_planes_of(int kind, const int16_t *q, int k, int8_t *p, int32_t *g32) {
    static const int q4k_order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int sb = 0; sb < k / 256; sb++) {
        for (int s = 0; s < 8; s++) {
            const __m512i x = _mm512_loadu_si512((const void *)(q + 256 * sb + 32 * (kind == LIN_Q4K ? q4k_order[s] : s)));
            int8_t *o = p + 512 * sb + 128 * (s / 2) + 32 * (s % 2);
            _mm256_storeu_si256((__m256i *)o, _mm512_cvtepi16_epi8(_mm512_srai_epi16(x, 8)));
            _mm256_storeu_si256((__m256i *)(o + 64), _mm512_cvtepi16_epi8(x));
        }
        if (kind == LIN_Q6K)
            for (int lane = 0; lane < 16; lane++) {
                const int16_t *g = q + 256 * sb + 16 * (4 * (lane % 4) + lane / 4);
                int32_t s = 0;
                for (int i = 0; i < 16; i++) s += g[i];
                g32[16 * sb + lane] = 32 * s;
            }
    }
}

/* 4 vectors of 16 int32 -> lane 4c + i: the sum of v[i]'s 128-bit chunk c */
VNNI static inline __attribute__((always_inline)) __m512i sum4x4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/* 64 weight bytes w (0..63) by their inputs' planes at xp: each lane sum w x over 4 weights */
VNNI static inline __attribute__((always_inline)) __m512i dot_planes(__m512i w, const int8_t *xp) {
    const __m512i h = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512((const void *)xp));
    return _mm512_dpbusd_epi32(_mm512_slli_epi32(h, 8), _mm512_loadu_si512((const void *)(xp + 64)), w);
}

VBMI static void one_row_q4k_planes(const Lin *L, const Act *a, const int8_t *xp, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nsb = k / 256;
    const size_t rb = kq_row_bytes(LIN_Q4K, k);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* byte permutes of the 4 rows' first 16 bytes (d, dmin, 12 scale bytes S0..S11; row r at
       16 r): the scales in sum4x4's lane order, 16 bytes a row ([s0 s1 s4 s5] x2, [s2 s3 s6 s7]
       x2): s_i = S_i & 63 (i < 4), s_i = (S_(i+4) & 15) | (S_(i-4) >> 6) << 4; the minimums 8
       bytes a row (row r at 8 r): m_i = S_(i+4) & 63, m_i = S_(i+4) >> 4 | (S_i >> 6) << 4 */
    static const int8_t ia[16] = {4, 5, 12, 13, 4, 5, 12, 13, 6, 7, 14, 15, 6, 7, 14, 15}; /* row 0's; + 16 r */
    static const int8_t ib[16] = {0, 1, 4, 5, 0, 1, 4, 5, 2, 3, 6, 7, 2, 3, 6, 7};
    static const int8_t ma[16] = {63, 63, 15, 15, 63, 63, 15, 15, 63, 63, 15, 15, 63, 63, 15, 15};
    static const int8_t ic[32] = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31,
                                  40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63};
    static const int8_t idd[16] = {0, 1, 16, 17, 32, 33, 48, 49, 2, 3, 18, 19, 34, 35, 50, 51}; /* d, then dmin */
    const __m512i rows16 = _mm512_setr_epi32(0, 0, 0, 0, 0x10101010, 0x10101010, 0x10101010, 0x10101010,
                                             0x20202020, 0x20202020, 0x20202020, 0x20202020, 0x30303030, 0x30303030, 0x30303030, 0x30303030);
    const __m512i IA = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ia)), rows16);
    const __m512i IB = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ib)), rows16);
    const __m512i MA = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ma));
    const __m512i IC = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)ic)), ID = _mm512_sub_epi8(IC, _mm512_set1_epi8(4));
    const __m512i MC = _mm512_set1_epi64(0x3f3f3f3f), ME = _mm512_set1_epi64((long long)0x0f0f0f0f00000000ULL);
    const __m512i IDD = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)idd));
    const __mmask64 kb = 0xccccccccccccccccULL, kd = 0xf0f0f0f0f0f0f0f0ULL; /* the bytes of s_i, m_i with i >= 4 */
    const __m512i pair_dmin[2] = {_mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5),
                                  _mm512_setr_epi32(6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7)};
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        nr_rows(L, rb, n, n1, row);
        const int spread = pf_spread && n + pf_passes * NR < L->n;
        __m512 acc[NR], macc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}; /* minimums: rows 2q, 2q + 1 */
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps();
        for (int sb = 0; sb < nsb; sb++) {
            if (spread) pf_rows(row, (size_t)pf_passes * NR * rb, (size_t)sb * 144, (size_t)(sb + 1) * 144);
            const int8_t *xs = xp + 512 * sb;
            const __m256 sx8 = _mm256_loadu_ps(a->sx + 8 * sb);
            const __m512 sxs = _mm512_insertf32x8(_mm512_castps256_ps512(sx8), sx8, 1);
            __m512i hd = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(row[0] + (size_t)sb * 144)));
            for (int j = 1; j < NR; j++) hd = _mm512_inserti32x4(hd, _mm_loadu_si128((const __m128i *)(row[j] + (size_t)sb * 144)), j);
            const __m512i A = _mm512_and_si512(_mm512_permutexvar_epi8(IA, hd), MA);
            const __m512i sc = _mm512_ternarylogic_epi32(A, _mm512_srli_epi16(_mm512_maskz_permutexvar_epi8(kb, IB, hd), 2), m30, 0xF8);
            const __m512i C = _mm512_permutexvar_epi8(IC, hd);
            __m512i mi = _mm512_ternarylogic_epi32(_mm512_and_si512(C, MC), _mm512_srli_epi16(C, 4), ME, 0xF8);
            mi = _mm512_ternarylogic_epi32(mi, _mm512_srli_epi16(_mm512_maskz_permutexvar_epi8(kd, ID, hd), 2), m30, 0xF8);
            const __m256 dd = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi8(IDD, hd)));
            const __m512 ddx = _mm512_castps256_ps512(_mm256_mul_ps(dd, _mm256_set1_ps(a->dx[8 * sb])));
            for (int q = 0; q < 2; q++) {
                const __m128i m16 = q ? _mm512_extracti32x4_epi32(mi, 1) : _mm512_castsi512_si128(mi);
                const __m512 mf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(m16));
                macc[q] = _mm512_fmadd_ps(_mm512_mul_ps(mf, _mm512_permutexvar_ps(pair_dmin[q], _mm512_castps256_ps512(dd))), sxs, macc[q]);
            }
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) {
                const uint8_t *blk = row[j] + (size_t)sb * 144 + 16;
                __m512i v[4];
                for (int P = 0; P < 2; P++) { /* 64 bytes: blocks 4P, 4P + 2 low nibbles, 4P + 1, 4P + 3 high */
                    const __m512i raw = _mm512_loadu_si512((const void *)(blk + 64 * P));
                    v[2 * P] = dot_planes(_mm512_and_si512(raw, m4), xs + 256 * P);
                    v[2 * P + 1] = dot_planes(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m4), xs + 256 * P + 128);
                }
                const __m128i s16 = j ? _mm512_extracti32x4_epi32(sc, j) : _mm512_castsi512_si128(sc);
                const __m512i t = _mm512_mullo_epi32(sum4x4(v[0], v[1], v[2], v[3]), _mm512_cvtepu8_epi32(s16));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_permutexvar_ps(_mm512_set1_epi32(j), ddx), acc[j]);
            }
        }
        float mins[NR];
        for (int q = 0; q < 2; q++) {
            mins[2 * q] = -hsum(_mm512_castps512_ps256(macc[q]));
            mins[2 * q + 1] = -hsum(_mm512_extractf32x8_ps(macc[q], 1));
        }
        store_nr(L, acc, mins, y, n, n1, accumulate);
    }
}

VNNI static void one_row_q6k_planes(const Lin *L, const Act *a, const int8_t *xp, const int32_t *g32, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nsb = k / 256;
    const size_t rb = kq_row_bytes(LIN_Q6K, k);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i shl = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2), shr = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
    const __m128i order = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15); /* sum4x4's lanes */
    for (int n = n0; n < n1; n += NR) {
        const uint8_t *row[NR];
        nr_rows(L, rb, n, n1, row);
        const int spread = pf_spread && n + pf_passes * NR < L->n;
        __m512 acc[NR];
        for (int j = 0; j < NR; j++) acc[j] = _mm512_setzero_ps();
        for (int sb = 0; sb < nsb; sb++) {
            if (spread) pf_rows(row, (size_t)pf_passes * NR * rb, (size_t)sb * 210, (size_t)(sb + 1) * 210);
            const int8_t *xs = xp + 512 * sb;
            const float dxs = a->dx[8 * sb];
            const __m512i gs = _mm512_loadu_si512((const void *)(g32 + 16 * sb));
#pragma GCC unroll 4
            for (int j = 0; j < NR; j++) {
                const uint8_t *blk = row[j] + (size_t)sb * 210;
                __m512i v[4];
                for (int h = 0; h < 2; h++) { /* 128 weights: ql 64 bytes (low 4 bits), qh 32 (2 bits each, 4 weights a byte) */
                    const __m512i ql = _mm512_loadu_si512((const void *)(blk + 64 * h));
                    const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h)));
                    const __m512i lo = _mm512_ternarylogic_epi32(ql, _mm512_and_si512(_mm512_sllv_epi64(qh, shl), m30), m4, 0xE4);
                    const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), _mm512_and_si512(_mm512_srlv_epi64(qh, shr), m30), m4, 0xE4);
                    v[2 * h] = dot_planes(lo, xs + 256 * h);
                    v[2 * h + 1] = dot_planes(hi, xs + 256 * h + 128);
                }
                const __m512i s16 = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blk + 192)), order));
                const __m512i t = _mm512_mullo_epi32(_mm512_sub_epi32(sum4x4(v[0], v[1], v[2], v[3]), gs), s16);
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_set1_ps(half(blk + 208) * dxs), acc[j]);
            }
        }
        const float zero[NR] = {0};
        store_nr(L, acc, zero, y, n, n1, accumulate);
    }
}

/* Q4_K / Q6_K rows n0..n1 for one input row by byte planes; 0 when out of memory (the caller then
   runs the forms above) */
static int one_row_kq_planes(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int nsb = L->k / 256;
    void *buf = aligned_alloc(64, (size_t)nsb * (512 + 64));
    if (!buf) return 0;
    int32_t *g32 = (int32_t *)((int8_t *)buf + (size_t)nsb * 512);
    kq_planes_of(L->kind, a->q, L->k, (int8_t *)buf, g32);
    if (L->kind == LIN_Q4K) one_row_q4k_planes(L, a, (const int8_t *)buf, y, n0, n1, accumulate);
    else one_row_q6k_planes(L, a, (const int8_t *)buf, g32, y, n0, n1, accumulate);
    free(buf);
    return 1;
}

/* ------------------------------------------------------------------ one row, Q4_K in 16-row lanes */

/* A Q4_K linear laid out again at load, in place (lm_kq_pack16, by native/step.py's
   pack_kq_lanes; the same bytes, no copy beside them), so that each lane of a vector
   accumulates one of 16 weight rows and no sum needs a horizontal reduction (the byte-plane
   form above ends each super-block and row with a transposing sum, sum4x4). Per group G of 16
   rows (n a multiple of 16) and super-block sb, 2304 bytes (16 x 144) at (G nsb + sb) 2304:
     0     d of the 16 rows (fp16)          32   dmin of the 16 rows (fp16)
     64    block b's 16 rows (16 b + r): low 4 bits of its scale | low 4 bits of its minimum << 4
     192   16 c + r (c < 4): the high 2 bits of block c's scale, of its minimum << 2, and of
           block c + 4's << 4 and << 6
     256   the weights: chunk i (blocks 2i low nibbles, 2i + 1 high, as GGML holds them), vector
           j (64 bytes), lane r: row r's bytes 32 i + 4 j .. + 3.
   The input's int16 x in two byte planes in natural order (x = 256 xh + xl), each quad
   broadcast: per chunk and vector, H += dpbusd(q, xh quad), L += dpbusd(xl quad, q) for the low
   nibbles and the high ones, then a block's sum is (H << 8) + L, exact (|H| <= 32 x 15 x 128),
   times its 16 rows' scales (`vpmulld`); a chunk's two blocks summed in int32 (at most
   2 x 32 x 15 x 32768 x 63 < 2^31), converted and multiplied by d dx in one fma. The minimums:
   each block's 16 minimums times its input sum (sx), times dmin once a super-block. The same
   integers per block as the forms above; the floats summed in other groupings (tests/test_kquant.py). */
/* a lanes form's switch: *state -1 until first asked, then on where the CPU has AVX-512 VNNI and
   the environment variable `env` is not "0"; choice >= 0 sets it (on only where the CPU allows),
   -1 leaves it; returns the choice in force */
static int lanes_switch(int *state, const char *env, int choice) {
    kq_cpu();
    if (choice >= 0) *state = choice && kq_vnni && lanes_512();
    if (*state < 0) {
        const char *e = getenv(env);
        *state = kq_vnni && lanes_512() && !(e && strcmp(e, "0") == 0);
    }
    return *state;
}
static int kq_lanes = -1;
static int kq_lanes_on(void) { return kq_lanes >= 0 ? kq_lanes : lanes_switch(&kq_lanes, "LAMINA_KQ_LANES", -1); }
/* choice 0: Q4_K linears keep GGML's layout at load and the byte-plane form; 1: laid out in lanes
   (where the CPU has AVX-512 VNNI); -1 leaves it; returns the choice in force. A linear already in
   lanes stays so: with 0 its calls unpack each group of 16 rows to run the other forms */
int lm_kq_lanes(int choice) { return lanes_switch(&kq_lanes, "LAMINA_KQ_LANES", choice); }

#define KL_SB 2304 /* bytes of 16 rows' super-block */
/* how many super-blocks ahead the lanes form prefetches (lm_kq_pf_ahead, 1..64, 0 none (the
   hardware's prefetcher alone); -1 leaves it) */
static int kq_pf_ahead = 4;
int lm_kq_pf_ahead(int choice) {
    if (choice >= 0) kq_pf_ahead = choice > 64 ? 64 : choice;
    return kq_pf_ahead;
}

/* Q4_K's 12 scale bytes S -> the 8 blocks' scales and minimums (6 bits each), and back */
static void q4k_unpack_scales(const uint8_t *S, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        sc[j] = S[j] & 63, m[j] = S[j + 4] & 63;
        sc[j + 4] = (S[j + 8] & 15) | (S[j] >> 6) << 4;
        m[j + 4] = (S[j + 8] >> 4) | (S[j + 4] >> 6) << 4;
    }
}
static void q4k_pack_scales(const uint8_t *sc, const uint8_t *m, uint8_t *S) {
    for (int j = 0; j < 4; j++) {
        S[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        S[j + 4] = (uint8_t)(m[j] | (m[j + 4] >> 4) << 6);
        S[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
}

/* one group of 16 rows: GGML's rows (src, 16 x rb bytes) -> lanes (dst, as many), or back */
static void kq_group_to_lanes(const uint8_t *src, uint8_t *dst, int nsb, int back) {
    const size_t rb = (size_t)nsb * 144;
    for (int sb = 0; sb < nsb; sb++) {
        uint8_t *o = back ? (uint8_t *)src + (size_t)sb * KL_SB : dst + (size_t)sb * KL_SB;
        for (int r = 0; r < 16; r++) {
            uint8_t *g = back ? dst + r * rb + (size_t)sb * 144 : (uint8_t *)src + r * rb + (size_t)sb * 144;
            uint8_t sc[8], m[8];
            if (back) {
                memcpy(g, o + 2 * r, 2), memcpy(g + 2, o + 32 + 2 * r, 2);
                for (int b = 0; b < 8; b++) {
                    const uint8_t lo = o[64 + 16 * b + r], hi = o[192 + 16 * (b % 4) + r] >> (b < 4 ? 0 : 4);
                    sc[b] = (lo & 15) | (hi & 3) << 4, m[b] = (lo >> 4) | (hi >> 2 & 3) << 4;
                }
                q4k_pack_scales(sc, m, g + 4);
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 8; j++) memcpy(g + 16 + 32 * i + 4 * j, o + 256 + 64 * (8 * i + j) + 4 * r, 4);
            } else {
                memcpy(o + 2 * r, g, 2), memcpy(o + 32 + 2 * r, g + 2, 2);
                q4k_unpack_scales(g + 4, sc, m);
                for (int b = 0; b < 8; b++) o[64 + 16 * b + r] = (uint8_t)((sc[b] & 15) | (m[b] & 15) << 4);
                for (int c = 0; c < 4; c++)
                    o[192 + 16 * c + r] = (uint8_t)((sc[c] >> 4) | (m[c] >> 4) << 2 | (sc[c + 4] >> 4) << 4 | (m[c + 4] >> 4) << 6);
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 8; j++) memcpy(o + 256 + 64 * (8 * i + j) + 4 * r, g + 16 + 32 * i + 4 * j, 4);
            }
        }
    }
}

/* ------------------------------------------------------------------ one row, Q5_0 in 16-row lanes */

/* A Q5_0 linear laid out again at load as the Q4_K lanes above (lm_kq_pack16: the same bytes, in
   place in the torch path's buffers, the runtime's one copy), so that a vector's lane r
   accumulates weight row r and the scales of 16 rows are one conversion. Per group G of 16 rows
   (n a multiple of 16), nb = k / 32 blocks, nb x 352 bytes (16 x 22) at G nb 352:
     0         block b's d of the 16 rows at 32 b (fp16)
     32 nb     block b's high bits at 64 b, lane r row r's 32, transposed: bit 8 i + u of the
               word is the high bit of weight 4 u + i (vector u's byte i below)
     96 nb     block b's nibbles at 256 b, vector v (64 bytes), lane r: row r's bytes 4 v .. + 3
               (low nibbles weights 4 v + i, high ones 16 + 4 v + i, as GGML holds them).
   One row: the input's int16 x in two byte planes (x = 256 xh + xl, kq_planes_flat), each quad
   broadcast; per vector the low and the high nibbles, each with 16 added where its high bit
   (one `vptestmb` on the transposed word) is set, so q = 0..31 as bytes; H += dpbusd(q, xh
   quad), L += dpbusd(xl quad, q); a block's sum is (H << 8) + L - 16 x its inputs' sum, exact
   (at most 32 x 31 x 32767 + 16 x 32 x 32767 < 2^31), converted and multiplied by d dx in one
   fma: the same integers per block as one_row_q5p; the floats summed in another order. */
static int q50_lanes = -1;
static int q50_lanes_on(void) { return q50_lanes >= 0 ? q50_lanes : lanes_switch(&q50_lanes, "LAMINA_Q50_LANES", -1); }
/* choice 0: Q5_0 linears keep GGML's layout at load and one_row_q5p; 1: laid out in lanes (where
   the CPU has AVX-512 VNNI); -1 leaves it; returns the choice in force. A linear already in
   lanes stays so: with 0 its calls unpack each group of 16 rows to run the other forms */
int lm_q50_lanes(int choice) { return lanes_switch(&q50_lanes, "LAMINA_Q50_LANES", choice); }

#define Q50_B 352 /* bytes of 16 rows' block */
/* how many blocks of 16 rows (352 bytes) ahead the lanes form prefetches (lm_q50_pf_ahead, 0 none,
   at most 1024; -1 leaves it) */
static int q50_pf_ahead = 24;
int lm_q50_pf_ahead(int choice) {
    if (choice >= 0) q50_pf_ahead = choice > 1024 ? 1024 : choice;
    return q50_pf_ahead;
}

/* one group of 16 Q5_0 rows (nb blocks): GGML's rows (src) -> lanes (dst), or back */
__attribute__((target("bmi2"))) static void q50_group_to_lanes(const uint8_t *src, uint8_t *dst, int nb, int back) {
    const size_t rb = (size_t)nb * 22;
    uint8_t *o = back ? (uint8_t *)src : dst;
    for (int r = 0; r < 16; r++) {
        uint8_t *g = back ? dst + r * rb : (uint8_t *)src + r * rb;
        for (int b = 0; b < nb; b++) {
            uint8_t *blk = g + (size_t)b * 22, *od = o + 32 * b + 2 * r, *oh = o + (size_t)32 * nb + 64 * b + 4 * r;
            uint8_t *oq = o + (size_t)96 * nb + 256 * (size_t)b + 4 * r;
            uint32_t bits, t = 0;
            if (back) {
                memcpy(blk, od, 2);
                memcpy(&t, oh, 4);
                bits = 0;
                for (int u = 0; u < 8; u++) bits |= _pext_u32(t, 0x01010101u << u) << (4 * u);
                memcpy(blk + 2, &bits, 4);
                for (int v = 0; v < 4; v++) memcpy(blk + 6 + 4 * v, oq + 64 * v, 4);
            } else {
                memcpy(od, blk, 2);
                memcpy(&bits, blk + 2, 4);
                for (int u = 0; u < 8; u++) t |= _pdep_u32(bits >> (4 * u) & 15u, 0x01010101u << u);
                memcpy(oh, &t, 4);
                for (int v = 0; v < 4; v++) memcpy(oq + 64 * v, blk + 6 + 4 * v, 4);
            }
        }
    }
}


/* the kinds laid out in 16-row lanes (Q4_K, Q5_0): bytes of a group of 16 rows, and a group
   between GGML's rows and the lanes (back 1: lanes src -> GGML's rows dst) */
static inline int lanes_kind(const Lin *L) { return L->lw && (L->kind == LIN_Q4K || L->kind == LIN_Q5_0); }
static inline size_t lanes_group_bytes(int kind, int k) { return kind == LIN_Q5_0 ? (size_t)(k / 32) * Q50_B : (size_t)(k / 256) * KL_SB; }
static void lanes_group(int kind, const uint8_t *src, uint8_t *dst, int k, int back) {
    if (kind == LIN_Q5_0) q50_group_to_lanes(src, dst, k / 32, back);
    else kq_group_to_lanes(src, dst, k / 256, back);
}

/* lays a Q4_K or Q5_0 linear's rows (w: L's n x k, as GGML holds them) out in lanes in place (pack
   1), or back from lanes (pack 0); returns 1, or 0 where it does not apply (another kind, k not a
   multiple of 256 (Q4_K) or 32 (Q5_0), n not of 16, lm_q50_lanes(0) for Q5_0, lm_kq_lanes(0) or this CPU lacks AVX-512 VNNI; for pack 0 only the shape
   counts) or out of memory: then nothing changed. w NULL: only whether it applies. */
int lm_kq_pack16(const Lin *L, uint8_t *w, int pack) {
    if (L->n % 16 || L->n <= 0) return 0;
    if (L->kind == LIN_Q4K) {
        if (L->k % 256 || (pack && !kq_lanes_on())) return 0;
    } else if (L->kind != LIN_Q5_0 || L->k % 32 || L->k <= 0 || (pack && !q50_lanes_on()))
        return 0;
    if (!w) return 1;
    const size_t gb = lanes_group_bytes(L->kind, L->k);
    uint8_t *tmp = malloc(gb);
    if (!tmp) return 0;
    for (int G = 0; G < L->n / 16; G++) {
        uint8_t *g = w + (size_t)G * gb;
        memcpy(tmp, g, gb);
        lanes_group(L->kind, tmp, g, L->k, !pack);
    }
    free(tmp);
    return 1;
}

/* rows n0..n1 of a Q4_K or Q5_0 linear in lanes by any other form: each group of 16 rows back to GGML's
   layout in a buffer, then those rows as a linear of their own; 0 when out of memory */
static int kq_lanes_by_rows(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate) {
    const size_t gb = lanes_group_bytes(L->kind, L->k);
    uint8_t *tmp = aligned_alloc(64, (gb + 63) / 64 * 64);
    if (!tmp) return 0;
    for (int G = n0 / 16; G * 16 < n1; G++) {
        lanes_group(L->kind, (const uint8_t *)L->lw + (size_t)G * gb, tmp, L->k, 1);
        Lin g = *L;
        g.w = tmp, g.lw = NULL, g.n = 16, g.bias = L->bias ? L->bias + 16 * G : NULL;
        const int lo = n0 > 16 * G ? n0 - 16 * G : 0, hi = n1 < 16 * G + 16 ? n1 - 16 * G : 16;
        lin_rows(&g, B, a, y + 16 * G, ystride, lo, hi, accumulate);
    }
    free(tmp);
    return 1;
}

/* Q4_K or Q5_0 rows in lanes (lm_kq_pack16) -> bf16 as lm_dequant_bf16 writes GGML's (a prefill's
   long calls), each group of 16 rows back to GGML's layout in a buffer first, the groups shared
   among nthreads; 0 where the shape does not fit or out of memory */
typedef struct {
    const uint8_t *w;
    int kind, n, k;
    uint16_t *y;
    atomic_int failed;
} LanesDequant;

static void dequant_lanes_job(void *ctx, int tid, int nt) {
    LanesDequant *j = (LanesDequant *)ctx;
    const int ng = j->n / 16;
    const size_t gb = lanes_group_bytes(j->kind, j->k), rb = kq_row_bytes(j->kind, j->k);
    uint8_t *tmp = malloc(gb);
    if (!tmp) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int G = (int)((long)ng * tid / nt); G < (int)((long)ng * (tid + 1) / nt); G++) {
        lanes_group(j->kind, j->w + (size_t)G * gb, tmp, j->k, 1);
        for (int r = 0; r < 16; r++) kq_dequant_row(j->kind, tmp + r * rb, j->k, NULL, j->y + (size_t)(16 * G + r) * j->k);
    }
    free(tmp);
}

int lm_dequant_lanes_bf16(int kind, const void *w, int n, int k, uint16_t *y, int nthreads) {
    if ((kind == LIN_Q4K ? k % 256 : kind == LIN_Q5_0 ? k % 32 : 1) || k <= 0 || n % 16 || n <= 0) return 0;
    LanesDequant j = {(const uint8_t *)w, kind, n, k, y, 0};
    run_parallel(dequant_lanes_job, &j, nthreads < 1 ? 1 : nthreads, NULL);
    return !atomic_load(&j.failed);
}

/* the input's planes in natural order: xh (k bytes), then xl (k bytes) */
WIDE static void kq_planes_flat(const int16_t *q, int k, int8_t *p) {
    for (int i = 0; i < k; i += 32) {
        const __m512i x = _mm512_loadu_si512((const void *)(q + i));
        _mm256_storeu_si256((__m256i *)(p + i), _mm512_cvtepi16_epi8(_mm512_srai_epi16(x, 8)));
        _mm256_storeu_si256((__m256i *)(p + k + i), _mm512_cvtepi16_epi8(x));
    }
}

/* the 16 sums f[r] of lanes group G for R input rows (r0.., ystride apart) -> y's outputs kept, with
   the bias (and onto y) */
VNNI static inline __attribute__((always_inline)) void lanes_store(const Lin *L, const __m512 *f, const int R, int G, __mmask16 keep, float *y, int r0, int ystride, int accumulate) {
    const __m512 bias = L->bias ? _mm512_maskz_loadu_ps(keep, L->bias + 16 * G) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        float *o = y + (size_t)(r0 + r) * ystride + 16 * G;
        __m512 v = _mm512_add_ps(f[r], bias);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(keep, o));
        _mm512_mask_storeu_ps(o, keep, v);
    }
}

/* one vector of 64 weight bytes' low (ql) and high (qh) nibbles against the input's byte planes
   (x = 256 xh + xl): the quads at e for ql and e + far for qh, broadcast; H += dpbusd(q, xh quad),
   L += dpbusd(xl quad, q) (a sum is then (H << 8) + L) */
VNNI static inline __attribute__((always_inline)) void planes_dot(__m512i *Hl, __m512i *Ll, __m512i *Hh, __m512i *Lh, __m512i ql, __m512i qh,
                                                                 const int8_t *xh, const int8_t *xl, int e, int far) {
    int32_t hq0, hq1, lq0, lq1;
    memcpy(&hq0, xh + e, 4), memcpy(&hq1, xh + e + far, 4), memcpy(&lq0, xl + e, 4), memcpy(&lq1, xl + e + far, 4);
    *Hl = _mm512_dpbusd_epi32(*Hl, ql, _mm512_set1_epi32(hq0));
    *Ll = _mm512_dpbusd_epi32(*Ll, _mm512_set1_epi32(lq0), ql);
    *Hh = _mm512_dpbusd_epi32(*Hh, qh, _mm512_set1_epi32(hq1));
    *Lh = _mm512_dpbusd_epi32(*Lh, _mm512_set1_epi32(lq1), qh);
}

/* one input row's sums v of lanes group G -> y's outputs n0..n1 among them */
VNNI static inline __attribute__((always_inline)) void lanes_store1(const Lin *L, __m512 v, float *y, int G, int n0, int n1, int accumulate) {
    const int r0 = n0 > 16 * G ? n0 - 16 * G : 0, r1 = n1 < 16 * G + 16 ? n1 - 16 * G : 16;
    lanes_store(L, &v, 1, G, (__mmask16)(((1u << r1) - 1) & ~((1u << r0) - 1)), y, 0, 0, accumulate);
}

VNNI static void one_row_q4k_lanes(const Lin *L, const Act *a, const int8_t *xp, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nsb = k / 256;
    const size_t gb = (size_t)nsb * KL_SB;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const int8_t *xh = xp, *xl = xp + k;
    for (int G = n0 / 16; G * 16 < n1; G++) {
        const uint8_t *g = (const uint8_t *)L->lw + (size_t)G * gb;
        __m512 acc = _mm512_setzero_ps(), macc = _mm512_setzero_ps();
        for (int sb = 0; sb < nsb; sb++) {
            const uint8_t *s = g + (size_t)sb * KL_SB;
            if (kq_pf_ahead)
                for (int o = 0; o < KL_SB; o += 64) PF_W((const char *)s + (size_t)kq_pf_ahead * KL_SB + o);
            const int8_t *h0 = xh + 256 * sb, *l0 = xl + 256 * sb;
            /* the scales and minimums of the 16 rows, block b at 16 b */
            const __m512i lo0 = _mm512_loadu_si512((const void *)(s + 64)), lo1 = _mm512_loadu_si512((const void *)(s + 128));
            const __m512i hi = _mm512_loadu_si512((const void *)(s + 192));
            uint8_t scb[128], mnb[128];
            _mm512_storeu_si512((void *)scb, _mm512_ternarylogic_epi32(_mm512_and_si512(lo0, m4), _mm512_slli_epi16(hi, 4), m30, 0xF8));
            _mm512_storeu_si512((void *)(scb + 64), _mm512_ternarylogic_epi32(_mm512_and_si512(lo1, m4), hi, m30, 0xF8));
            _mm512_storeu_si512((void *)mnb, _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(lo0, 4), m4), _mm512_slli_epi16(hi, 2), m30, 0xF8));
            _mm512_storeu_si512((void *)(mnb + 64), _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(lo1, 4), m4), _mm512_srli_epi16(hi, 2), m30, 0xF8));
            __m512 ms = _mm512_setzero_ps();
            for (int b = 0; b < 8; b++)
                ms = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mnb + 16 * b)))), _mm512_set1_ps(a->sx[8 * sb + b]), ms);
            macc = _mm512_fmadd_ps(ms, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32))), macc);
            const __m512 ddx = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s)), _mm512_set1_ps(a->dx[8 * sb]));
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const uint8_t *qv = s + 256 + 512 * i;
                __m512i Hl = _mm512_setzero_si512(), Ll = _mm512_setzero_si512(), Hh = _mm512_setzero_si512(), Lh = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++) {
                    const __m512i raw = _mm512_loadu_si512((const void *)(qv + 64 * j));
                    const __m512i ql = _mm512_and_si512(raw, m4), qh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                    planes_dot(&Hl, &Ll, &Hh, &Lh, ql, qh, h0, l0, 64 * i + 4 * j, 32);
                }
                const __m512i sl = _mm512_add_epi32(_mm512_slli_epi32(Hl, 8), Ll), sh = _mm512_add_epi32(_mm512_slli_epi32(Hh, 8), Lh);
                const __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(sl, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(scb + 32 * i)))),
                                                   _mm512_mullo_epi32(sh, _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(scb + 32 * i + 16)))));
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), ddx, acc);
            }
        }
        lanes_store1(L, _mm512_sub_ps(acc, macc), y, G, n0, n1, accumulate);
    }
}

VNNI static void one_row_q50_lanes(const Lin *L, const Act *a, const int8_t *xp, const int32_t *off, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32;
    const size_t gb = (size_t)nb * Q50_B;
    const __m512i m4 = _mm512_set1_epi8(0x0F), c16 = _mm512_set1_epi8(16);
    const int8_t *xh = xp, *xl = xp + k;
    for (int G = n0 / 16; G * 16 < n1; G++) {
        const uint8_t *g = (const uint8_t *)L->lw + (size_t)G * gb;
        const uint8_t *dq = g, *hq = g + (size_t)32 * nb, *wq = g + (size_t)96 * nb;
        const char *ahead = (const char *)g + (size_t)q50_pf_ahead * Q50_B, *end = (const char *)L->lw + (size_t)((L->n + 15) / 16) * gb;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            if (q50_pf_ahead && ahead + (size_t)(b + 1) * Q50_B <= end) /* q50_pf_ahead blocks on, spread through the group */
                for (int o = 0; o < Q50_B; o += 64) PF_W(ahead + (size_t)b * Q50_B + o);
            const __m512i hv = _mm512_loadu_si512((const void *)(hq + 64 * (size_t)b));
            __m512i H0 = _mm512_setzero_si512(), L0 = _mm512_set1_epi32(off[b]), H1 = _mm512_setzero_si512(), L1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                const __m512i raw = _mm512_loadu_si512((const void *)(wq + 256 * (size_t)b + 64 * v));
                __m512i ql = _mm512_and_si512(raw, m4), qh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                ql = _mm512_mask_add_epi8(ql, _mm512_test_epi8_mask(hv, _mm512_set1_epi8((char)(1 << v))), ql, c16);
                qh = _mm512_mask_add_epi8(qh, _mm512_test_epi8_mask(hv, _mm512_set1_epi8((char)(16 << v))), qh, c16);
                planes_dot(&H0, &L0, &H1, &L1, ql, qh, xh, xl, 32 * b + 4 * v, 16);
            }
            const __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(H0, H1), 8), _mm512_add_epi32(L0, L1));
            const __m512 ddx = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dq + 32 * (size_t)b))), _mm512_set1_ps(a->dx[b]));
            if (b & 1) acc1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), ddx, acc1);
            else acc0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), ddx, acc0);
        }
        lanes_store1(L, _mm512_add_ps(acc0, acc1), y, G, n0, n1, accumulate);
    }
}

/* Q4_K or Q5_0 rows n0..n1 in lanes for one input row: the input's byte planes (and Q5_0's
   -16 x each block's integer sum) made once, then the kind's kernel; 0 when out of memory */
static int one_row_lanes(const Lin *L, const Act *a, float *y, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32;
    int8_t *buf = aligned_alloc(64, ((size_t)2 * k + (size_t)4 * nb + 127) / 64 * 64);
    if (!buf) return 0;
    kq_planes_flat(a->q, k, buf);
    if (L->kind == LIN_Q5_0) {
        int32_t *off = (int32_t *)(buf + 2 * k);
        for (int b = 0; b < nb; b++) {
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += a->q[32 * b + i];
            off[b] = -16 * s;
        }
        one_row_q50_lanes(L, a, buf, off, y, n0, n1, accumulate);
    } else
        one_row_q4k_lanes(L, a, buf, y, n0, n1, accumulate);
    free(buf);
    return 1;
}

/* An int8 linear's batch with int8 inputs (head8: the head of a step whose int4 lanes take
   int8, so that it rounds as those and as its one-row form, one_row8): lane_rows_512's layout
   with 4 input bytes a lane (xt8[c][i][row][e]: quad I8Q(i) of block 2c + e) and the weights
   as unsigned bytes (w + 128, `vpdpbusd` takes one side unsigned), each sum started at -128 x
   the row's block sum: 8 `vpdpbusd` a block pair and weight row where the int16 form takes 16. */
typedef struct {
    int32_t *xt;  /* (nc, 8, LANES, 2) 4 int8 inputs */
    float *dxt;   /* (nc, LANES, 2) block scales (d8) */
    int32_t *off; /* (nc, LANES, 2) -128 x the block's integer sum */
} LaneAct8;

/* which quad of a block w2[j][i] holds below (the 32-bit unpacks work within 128-bit lanes) */
#define I8Q(i) ((i) < 4 ? ((i) < 2 ? (i) : (i) + 2) : ((i) < 6 ? (i) - 2 : (i)))

static void lane_act8(const Lin *L, const Act *a, int r0, int rows, LaneAct8 *t) {
    const int k = L->k, nb = k / 32, nc = (nb + 1) / 2;
    for (int r = 0; r < LANES; r++) {
        const int8_t *q = r < rows ? a->q8 + (size_t)(r0 + r) * k : NULL;
        for (int b = 0; b < 2 * nc; b++) {
            const int c = b / 2, e = b % 2, real = q && b < nb;
            int32_t *o = t->xt + (size_t)c * 8 * LANES * 2 + r * 2 + e, sum = 0;
            for (int i = 0; i < 8; i++) {
                int32_t v = 0;
                if (real) {
                    memcpy(&v, q + 32 * b + 4 * I8Q(i), 4);
                    for (int j = 0; j < 4; j++) sum += q[32 * b + 4 * I8Q(i) + j];
                }
                o[i * LANES * 2] = v;
            }
            t->dxt[(size_t)c * LANES * 2 + r * 2 + e] = real ? a->d8[(size_t)(r0 + r) * nb + b] : 0.0f;
            t->off[(size_t)c * LANES * 2 + r * 2 + e] = -128 * sum;
        }
    }
}

VNNI static void lane_rows8_512(const Lin *L, const LaneAct8 *t, int r0, int rows, float *y, int ystride, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, nc = (nb + 1) / 2, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const __m256i f80 = _mm256_set1_epi8((char)0x80);
    for (int n = n0; n < n1; n += NT) {
        const int nt = n1 - n < NT ? n1 - n : NT;
        if (LANE_PF && n + (LANE_PF + 1) * NT <= n1) {
            const char *next = (const char *)L->w + (size_t)(n + LANE_PF * NT) * k;
            for (size_t o = 0; o < (size_t)NT * k; o += 64) PF_W(next + o);
            for (size_t o = 0; o < NT * groups * 4; o += 64) PF_W((const char *)(L->s + (size_t)(n + LANE_PF * NT) * groups) + o);
        }
        __m512 f[NT];
        for (int j = 0; j < NT; j++) f[j] = _mm512_setzero_ps();
        for (int c = 0; c < nc; c++) {
            const int b0 = 2 * c, b1 = b0 + 1 < nb ? b0 + 1 : -1;
            int64_t w2[NT][8] __attribute__((aligned(64)));
            for (int j = 0; j < NT; j++) {
                const int8_t *wr = (const int8_t *)L->w + (size_t)(j < nt ? n + j : n) * k;
                const __m256i p0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wr + 32 * b0)), f80);
                const __m256i p1 = b1 >= 0 ? _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(wr + 32 * b1)), f80) : _mm256_setzero_si256();
                _mm256_store_si256((__m256i *)w2[j], _mm256_unpacklo_epi32(p0, p1));
                _mm256_store_si256((__m256i *)(w2[j] + 4), _mm256_unpackhi_epi32(p0, p1));
            }
            const __m512i *xb = (const __m512i *)(t->xt + (size_t)c * 8 * LANES * 2);
            const __m512i init = _mm512_loadu_si512((const void *)(t->off + (size_t)c * LANES * 2));
            __m512i s[NT][2];
            for (int j = 0; j < NT; j++) s[j][0] = init, s[j][1] = _mm512_setzero_si512();
            for (int i = 0; i < 8; i += 2) {
                const __m512i x0 = _mm512_load_si512(xb + i), x1 = _mm512_load_si512(xb + i + 1);
                for (int j = 0; j < NT; j++) {
                    s[j][0] = _mm512_dpbusd_epi32(s[j][0], _mm512_set1_epi64(w2[j][i]), x0);
                    s[j][1] = _mm512_dpbusd_epi32(s[j][1], _mm512_set1_epi64(w2[j][i + 1]), x1);
                }
            }
            const __m512 dx = _mm512_loadu_ps(t->dxt + (size_t)c * LANES * 2);
            for (int j = 0; j < NT; j++) {
                const float *sc = L->s + (size_t)(j < nt ? n + j : n) * groups;
                float s2[2] = {sc[b0 >> sh], b1 >= 0 ? sc[b1 >> sh] : 0.0f};
                double s2d;
                memcpy(&s2d, s2, 8);
                const __m512 sv = _mm512_castpd_ps(_mm512_set1_pd(s2d));
                f[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s[j][0], s[j][1])), _mm512_mul_ps(dx, sv), f[j]);
            }
        }
        for (int j = 0; j < nt; j++) { /* lane 2r + e: row r's block pair sums */
            float v[2 * LANES];
            _mm512_storeu_ps(v, f[j]);
            const float bias = L->bias ? L->bias[n + j] : 0.0f;
            for (int r = 0; r < rows; r++) {
                float *o = y + (size_t)(r0 + r) * ystride + n + j;
                *o = (accumulate ? *o : 0.0f) + (v[2 * r] + v[2 * r + 1]) + bias;
            }
        }
    }
}

/* An int8 head in lanes (a batch engine's copy, lm_pack_i8: native/step.py keeps it beside the
   rows, which the token table and the one- and two-row heads read): 16 weight rows in the lanes
   of a vector, lane i of vector h of block b holding row 16G + i's bytes 4h..4h+3 of the block
   + 128 (unsigned for `vpdpbusd`), then the 16 rows' scales (groups, 16) per group of rows. Each
   input row's 4 bytes are the broadcast operand, so a `vpdpbusd` is 16 weight rows x 4 inputs
   of one row with nothing rebuilt per block: lane_rows8_512 (above) broadcasts each weight row's
   bytes and rebuilds them for every block pair and group of 4 rows (an 8-row head 2.0-2.8 ms
   there, 3x one row's 0.7-0.9, BENCHMARKS.md issue 33). The same integer sums (from -128 x the
   block's input sum), scaled by the same products and summed in the same order (even and odd
   blocks apart, then added), so the same bits as lane_rows8_512. */
VNNI static inline __attribute__((always_inline)) void i8_lanes_body(const Lin *L, const Act *a, int r0, const int R, const int32_t *off,
                                                                    float *y, int ystride, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, groups = k / L->gs, sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const int ng = (L->n + 15) / 16;
    for (int G = n0 / 16; G * 16 < n1; G++) {
        const uint8_t *wg = L->lw + (size_t)G * nb * 512;
        const float *sg = L->ls + (size_t)G * groups * 16;
        const char *ahead = G + 2 < ng ? (const char *)wg + 2 * (size_t)nb * 512 : NULL; /* 2 groups on */
        __m512 f0[LANES], f1[LANES];
        for (int r = 0; r < R; r++) f0[r] = _mm512_setzero_ps(), f1[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m512i acc[LANES];
            for (int r = 0; r < R; r++) acc[r] = _mm512_set1_epi32(off[r * nb + b]);
            const __m512i *wb = (const __m512i *)(wg + (size_t)b * 512);
            for (int h = 0; h < 8; h++) {
                if (ahead) PF_W(ahead + (size_t)b * 512 + 64 * h); /* spread through the group: a burst stalls */
                const __m512i w = _mm512_load_si512(wb + h);
                for (int r = 0; r < R; r++) {
                    int32_t x;
                    memcpy(&x, a->q8 + (size_t)(r0 + r) * k + 32 * b + 4 * h, 4);
                    acc[r] = _mm512_dpbusd_epi32(acc[r], w, _mm512_set1_epi32(x));
                }
            }
            const __m512 ws = _mm512_loadu_ps(sg + (size_t)(b >> sh) * 16);
            for (int r = 0; r < R; r++) {
                const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(a->d8[(size_t)(r0 + r) * nb + b]), ws);
                if (b & 1) f1[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), sc, f1[r]);
                else f0[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), sc, f0[r]);
            }
        }
        const int l0 = n0 > 16 * G ? n0 - 16 * G : 0, l1 = n1 < 16 * G + 16 ? n1 - 16 * G : 16;
        const __mmask16 keep = (__mmask16)(((1u << l1) - 1) & ~((1u << l0) - 1));
        const __m512 bias = L->bias ? _mm512_maskz_loadu_ps(keep, L->bias + 16 * G) : _mm512_setzero_ps();
        for (int r = 0; r < R; r++) {
            float *o = y + (size_t)(r0 + r) * ystride + 16 * G;
            __m512 v = _mm512_add_ps(accumulate ? _mm512_maskz_loadu_ps(keep, o) : _mm512_setzero_ps(), _mm512_add_ps(f0[r], f1[r]));
            if (L->bias) v = _mm512_add_ps(v, bias);
            _mm512_mask_storeu_ps(o, keep, v);
        }
    }
}

#define I8_LANES_R(R) \
    VNNI static void i8_lanes_r##R(const Lin *L, const Act *a, int r0, const int32_t *off, float *y, int ystride, int n0, int n1, int accumulate) { \
        i8_lanes_body(L, a, r0, R, off, y, ystride, n0, n1, accumulate);                                                                         \
    }
I8_LANES_R(1) I8_LANES_R(2) I8_LANES_R(3) I8_LANES_R(4) I8_LANES_R(5) I8_LANES_R(6) I8_LANES_R(7) I8_LANES_R(8)
#undef I8_LANES_R

/* rows r0..r0+rows (1..LANES) of an int8 linear in lanes, int8 inputs; 0 where it does not apply */
static int i8_lanes(const Lin *L, const Act *a, int r0, int rows, float *y, int ystride, int n0, int n1, int accumulate) {
    static void (*const by_rows[LANES])(const Lin *, const Act *, int, const int32_t *, float *, int, int, int, int) = {
        i8_lanes_r1, i8_lanes_r2, i8_lanes_r3, i8_lanes_r4, i8_lanes_r5, i8_lanes_r6, i8_lanes_r7, i8_lanes_r8};
    const int k = L->k, nb = k / 32;
    if (L->kind != LIN_INT8 || !L->lw || !L->ls || nb > 512 || rows < 1 || rows > LANES) return 0;
    int32_t off[LANES * 512];
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++) {
            const int8_t *q = a->q8 + (size_t)(r0 + r) * k + 32 * b;
            int32_t sum = 0;
            for (int j = 0; j < 32; j++) sum += q[j];
            off[r * nb + b] = -128 * sum;
        }
    by_rows[rows - 1](L, a, r0, off, y, ystride, n0, n1, accumulate);
    return 1;
}

/* An int8 linear (n, k) laid out in lanes for i8_lanes: w (ceil(n/16), k/32, 8, 16, 4) bytes,
   each + 128; s (ceil(n/16), k/gs, 16) scales; a last group's missing rows repeat row n - 1 (computed,
   not stored). With w NULL: whether it applies here (AVX-512 VNNI, k and gs multiples of 32). */
int lm_pack_i8(const Lin *L, uint8_t *w, float *s) {
    if (L->kind != LIN_INT8 || !lanes_512() || L->k % 32 || L->gs % 32 || L->k / 32 > 512 || !L->w || !L->s) return 0;
    if (!w) return 1;
    const int n = L->n, k = L->k, nb = k / 32, groups = k / L->gs, ng = (n + 15) / 16;
    const int8_t *q = (const int8_t *)L->w;
    for (int G = 0; G < ng; G++) {
        for (int i = 0; i < 16; i++) {
            const int row = 16 * G + i < n ? 16 * G + i : n - 1;
            for (int b = 0; b < nb; b++)
                for (int h = 0; h < 8; h++) { /* 4 bytes at once, each flipped to unsigned */
                    uint32_t v;
                    memcpy(&v, q + (size_t)row * k + 32 * b + 4 * h, 4);
                    v ^= 0x80808080u;
                    memcpy(w + (((size_t)G * nb + b) * 8 + h) * 64 + 4 * i, &v, 4);
                }
            for (int g = 0; g < groups; g++) s[((size_t)G * groups + g) * 16 + i] = L->s[(size_t)row * groups + g];
        }
    }
    return 1;
}

/* ------------------------------------------------------------------ weights in lanes (int4) */

/* The int4 linears where the CPU has AVX-512 VNNI and the linear was laid out again once, in
   place (lm_pack16, by native/step.py's pack_lanes for an engine of 3 rows or more; its rows'
   own layout then freed, so every call on it, one row too, runs here: lanes16): 16 weight rows sit in the
   lanes of one vector, each lane an int16 pair of its row's weights, and each input row's int16
   pair is the broadcast operand, so one `vpdpwssd` multiplies a pair of 16 weight rows by one
   input row with no unpacking per input row (the form above rebuilds each weight pair for every
   block pair and broadcasts the weights, ~2.6x the vector operations per product). The scales
   and minimums of the 16 rows are one vector per block; each output row's 16 sums are stored
   at once. The same integer products as the one-row path, summed in another order. In a C harness
   (one thread, 8 rows, fc's 3072 x 576, in cache): 242 us the form above, 151 us this one; int8
   inputs with `vpdpbusd` took 90 us but were 250x further from the dequantized product
   (relative RMS 3.8e-3 against 1.5e-5: llama.cpp's Q8_0 rounding).
   Both input forms run on one layout (lanes8 picks): int16 inputs (lane16_body, `vpdpwssd`, 16
   a block and input row) and int8 ones (lane8_body, `vpdpbusd`, 8: the one-row act8 form's
   quantizer, llama.cpp's Q4_1 x Q8_1 rounding), the default where the CPU has VNNI.
   Layout, per group G of 16 rows and block b: 4 vectors of 64 bytes, vector h lane i (row
   16G + i) holding the row's block bytes 4h..4h+3 as they are (byte j: elements 2j, low
   nibble, and 2j + 1). So & 0x0F0F0F0F gives int8 quad h of the int4 input order ([even | odd]:
   elements 8h, 8h + 2, 8h + 4, 8h + 6) and (>> 4) & 0x0F0F0F0F quad 4 + h (the odd ones), and
   (v >> 4t) & 0x000F000F the int16 pair p = 4h + t (elements 8h + t, 8h + t + 4); then the
   scales and minimums (groups, nb, 16) floats. */
#define P16_ROWS 16

/* which inputs the int4 lanes take: 1 int8 (lane8_body; where the CPU has AVX-512 VNNI, unless
   LAMINA_LANES_ACT8=0 in the environment), 0 int16 (lane16_body). -1 until asked. */
static int lanes8 = -1;

static int lanes8_on(void) {
    if (lanes8 < 0) {
        const char *e = getenv("LAMINA_LANES_ACT8");
        lanes8 = cpu_has_vnni() && !(e && strcmp(e, "0") == 0);
    }
    return lanes8;
}

/* choice 0: int16 inputs for the int4 lanes; 1: int8 ones where the CPU has VNNI; -1 leaves
   it; returns the form in force */
int lm_lanes_act8(int choice) {
    if (choice >= 0) lanes8 = choice && cpu_has_vnni();
    return lanes8_on();
}

/* the sizes lm_pack16 fills: bytes of weights, floats of scales (and as many minimums) */
static size_t pack16_bytes(const Lin *L) { return (size_t)((L->n + 15) / 16) * (L->k / 32) * 256; }
static size_t pack16_floats(const Lin *L) { return (size_t)((L->n + 15) / 16) * (L->k / 32) * 16; }

/* lays out an int4 linear's weights (w: pack16_bytes, 64-byte aligned), scales and minimums (sc,
   mn: pack16_floats each, 64-byte aligned) for the kernel below; returns 1, or 0 where it does
   not apply (not int4, this CPU lacks AVX-512 VNNI, or lm_lanes_wide(0) chose the AVX2 form):
   then nothing is written. w NULL: only
   whether it applies. A Lin with lw set runs every call in lanes (one row too), so its rows'
   own layout (w, s, mn) may then be NULL: native/step.py's pack_lanes frees it. */
int lm_pack16(const Lin *L, uint8_t *w, float *sc, float *mn) {
    if (L->kind != LIN_INT4 || L->k % 32 || L->gs % 32 || !cpu_has_vnni() || !lanes_512()) return 0;
    if (!w) return 1;
    const int n = L->n, k = L->k, nb = k / 32, ng = (n + 15) / 16, groups = k / L->gs, per = L->gs / 32;
    memset(w, 0, pack16_bytes(L));
    for (int G = 0; G < ng; G++)
        for (int b = 0; b < nb; b++) {
            uint32_t *o = (uint32_t *)(w + ((size_t)G * nb + b) * 256);
            float *so = sc + ((size_t)G * nb + b) * 16, *mo = mn + ((size_t)G * nb + b) * 16;
            for (int i = 0; i < 16; i++) {
                const int row = 16 * G + i;
                so[i] = mo[i] = 0.0f;
                if (row >= n) continue;
                const uint8_t *src = (const uint8_t *)L->w + (size_t)row * (k / 2) + 16 * b;
                for (int h = 0; h < 4; h++) memcpy(&o[h * 16 + i], src + 4 * h, 4); /* the row's dword h */
                so[i] = L->s[(size_t)row * groups + b / per];
                mo[i] = L->mn[(size_t)row * groups + b / per];
            }
        }
    return 1;
}

/* the inverse: a linear in lanes (lw, ls, lmn) back to its rows' layout, into w (n, k/2), s and mn
   (n, k/gs) (the scales and minimums of a group of blocks are equal in the lanes); 0 where L is
   not int4 in lanes. */
int lm_unpack16(const Lin *L, uint8_t *w, float *s, float *mn) {
    if (L->kind != LIN_INT4 || !L->lw || L->k % 32 || L->gs % 32) return 0;
    const int n = L->n, k = L->k, nb = k / 32, groups = k / L->gs, per = L->gs / 32;
    for (int row = 0; row < n; row++) {
        const int G = row / 16, i = row % 16;
        for (int b = 0; b < nb; b++) {
            const uint32_t *o = (const uint32_t *)(L->lw + ((size_t)G * nb + b) * 256);
            uint8_t *dst = w + (size_t)row * (k / 2) + 16 * b;
            for (int h = 0; h < 4; h++) memcpy(dst + 4 * h, &o[h * 16 + i], 4);
            if (b % per == 0) {
                s[(size_t)row * groups + b / per] = L->ls[((size_t)G * nb + b) * 16 + i];
                mn[(size_t)row * groups + b / per] = L->lmn[((size_t)G * nb + b) * 16 + i];
            }
        }
    }
    return 1;
}

/* a batch's input rows r0.. for the kernel: int16 pairs (nb, LANES, 16), the blocks' scales and
   scaled sums (nb, LANES) */
typedef struct {
    int32_t *xp;
    float *dx, *bs;
} Act16;

/* the kernel reads rows 0..rows-1 only (its instance is the row count), so absent rows are not
   written. A block's 32 int16 inputs come [even | odd] (int4's order): one permute puts each
   pair p = 4h + t (elements 8h + t, 8h + t + 4: the layout's) in int32 p; their sum by one
   `vpmaddwd` with ones. */
VNNI static void act16(const Lin *L, const Act *a, int r0, int rows, Act16 *t) {
    const int k = L->k, nb = k / 32;
    static const int16_t order[32] = {0, 2, 16, 18, 1, 3, 17, 19, 4, 6, 20, 22, 5, 7, 21, 23,
                                      8, 10, 24, 26, 9, 11, 25, 27, 12, 14, 28, 30, 13, 15, 29, 31};
    const __m512i pairs = _mm512_loadu_si512((const void *)order);
    const __m512i ones = _mm512_set1_epi16(1);
    for (int r = 0; r < rows; r++) {
        const int16_t *q = a->q + (size_t)(r0 + r) * k;
        for (int b = 0; b < nb; b++) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 32 * b));
            _mm512_store_si512((void *)(t->xp + ((size_t)b * LANES + r) * 16), _mm512_permutexvar_epi16(pairs, v));
            const int sum = _mm512_reduce_add_epi32(_mm512_madd_epi16(v, ones));
            const float d = a->dx[(size_t)(r0 + r) * nb + b];
            t->dx[b * LANES + r] = d;
            t->bs[b * LANES + r] = d * (float)sum;
        }
    }
}

#ifndef PF16
#define PF16 2 /* groups of 16 rows ahead to prefetch */
#endif
/* the lanes' two input forms share these: the prefetch of group G + PF16's block b (its weights,
   scales and minimums), and a group's R output rows stored (f plus the bias, added to y's where
   accumulating, the stores kept to keep's rows) */
static inline __attribute__((always_inline)) void lanes_prefetch(const uint8_t *wg, const float *sg, const float *mg, int nb, int b) {
    const char *pw = (const char *)(wg + ((size_t)PF16 * nb + b) * 256);
    for (int o = 0; o < 256; o += 64) PF_W(pw + o);
    PF_W((const char *)(sg + ((size_t)PF16 * nb + b) * 16));
    PF_W((const char *)(mg + ((size_t)PF16 * nb + b) * 16));
}

/* output rows n0..n1 (the groups of 16 they touch; the stores kept to n0..n1) for the R inputs of
   t (rows r0..), into y as lin_rows. R is a constant in each instance below (1..LANES); a row's
   integer sums go to NA = 4 / R accumulators (R < 4: the blocks' 16 `vpdpwssd` in independent
   chains) added at each block's end, so every row's result is the same whatever R. */
VNNI static inline __attribute__((always_inline)) void lane16_body(const Lin *L, const Act16 *t, int r0, const int R, float *y, int ystride, int n0, int n1, int accumulate) {
    const int nb = L->k / 32, NA = R >= 4 ? 1 : 4 / R;
    const __m512i m = _mm512_set1_epi32(0x000F000F);
    for (int G = n0 / 16; G * 16 < n1; G++) {
        const int lo = G * 16 < n0 ? n0 - G * 16 : 0, hi = n1 - G * 16 < 16 ? n1 - G * 16 : 16;
        const __mmask16 keep = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        const uint8_t *wg = L->lw + (size_t)G * nb * 256;
        const float *sg = L->ls + (size_t)G * nb * 16, *mg = L->lmn + (size_t)G * nb * 16;
        const int pf = PF16 && (G + PF16) * 16 < L->n;
        __m512 f[LANES];
        for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            if (pf) lanes_prefetch(wg, sg, mg, nb, b);
            __m512i acc[LANES]; /* R * NA of them: 4 or R */
            for (int r = 0; r < R * NA; r++) acc[r] = _mm512_setzero_si512();
            const int32_t *xb = t->xp + (size_t)b * LANES * 16;
            for (int h = 0; h < 4; h++) {
                const __m512i pk = _mm512_load_si512((const void *)(wg + (size_t)b * 256 + 64 * h));
                const __m512i w0 = _mm512_and_si512(pk, m), w1 = _mm512_and_si512(_mm512_srli_epi32(pk, 4), m);
                const __m512i w2 = _mm512_and_si512(_mm512_srli_epi32(pk, 8), m), w3 = _mm512_and_si512(_mm512_srli_epi32(pk, 12), m);
                for (int r = 0; r < R; r++) {
                    const int32_t *x = xb + r * 16 + 4 * h;
                    __m512i *c = &acc[r * NA + h % NA];
                    *c = _mm512_dpwssd_epi32(*c, w0, _mm512_set1_epi32(x[0]));
                    *c = _mm512_dpwssd_epi32(*c, w1, _mm512_set1_epi32(x[1]));
                    *c = _mm512_dpwssd_epi32(*c, w2, _mm512_set1_epi32(x[2]));
                    *c = _mm512_dpwssd_epi32(*c, w3, _mm512_set1_epi32(x[3]));
                }
            }
            const __m512 sc = _mm512_load_ps(sg + (size_t)b * 16), mn = _mm512_load_ps(mg + (size_t)b * 16);
            for (int r = 0; r < R; r++) {
                __m512i s = acc[r * NA];
                for (int j = 1; j < NA; j++) s = _mm512_add_epi32(s, acc[r * NA + j]);
                f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, _mm512_set1_ps(t->dx[b * LANES + r])), f[r]);
                f[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(t->bs[b * LANES + r]), f[r]);
            }
        }
        lanes_store(L, f, R, G, keep, y, r0, ystride, accumulate);
    }
}

#define LANE16_R(R) \
    VNNI static void lane16_r##R(const Lin *L, const Act16 *t, int r0, float *y, int ystride, int n0, int n1, int accumulate) { \
        lane16_body(L, t, r0, R, y, ystride, n0, n1, accumulate);                                                              \
    }
LANE16_R(1) LANE16_R(2) LANE16_R(3) LANE16_R(4) LANE16_R(5) LANE16_R(6) LANE16_R(7) LANE16_R(8)
#undef LANE16_R

/* lane16_body with int8 inputs (lanes8): input rows r0..r0 + R - 1 of a straight from the act8
   quantizer (q8 in int4's [even | odd] order, d8, s8), no repacking. Per block, the 4 weight
   vectors give 8 unsigned quads (& and >> 4), and one `vpdpbusd` a quad and input row takes the
   input's 4 bytes broadcast: 8 a block and row where the int16 form takes 16. Scales times d8,
   minimums times s8 (the block's sum as rounded), as the one-row int8 form. NA as there. */
VNNI static inline __attribute__((always_inline)) void lane8_body(const Lin *L, const Act *a, int r0, const int R, float *y, int ystride, int n0, int n1, int accumulate) {
    const int k = L->k, nb = k / 32, NA = R >= 4 ? 1 : 4 / R;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int G = n0 / 16; G * 16 < n1; G++) {
        const int lo = G * 16 < n0 ? n0 - G * 16 : 0, hi = n1 - G * 16 < 16 ? n1 - G * 16 : 16;
        const __mmask16 keep = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        const uint8_t *wg = L->lw + (size_t)G * nb * 256;
        const float *sg = L->ls + (size_t)G * nb * 16, *mg = L->lmn + (size_t)G * nb * 16;
        const int pf = PF16 && (G + PF16) * 16 < L->n;
        __m512 f[LANES];
        for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
        for (int b = 0; b < nb; b++) {
            if (pf) lanes_prefetch(wg, sg, mg, nb, b);
            __m512i wq[8];
            for (int h = 0; h < 4; h++) {
                const __m512i pk = _mm512_load_si512((const void *)(wg + (size_t)b * 256 + 64 * h));
                wq[h] = _mm512_and_si512(pk, m4);
                wq[4 + h] = _mm512_and_si512(_mm512_srli_epi16(pk, 4), m4);
            }
            __m512i acc[LANES]; /* R * NA of them: 4 or R */
            for (int r = 0; r < R * NA; r++) acc[r] = _mm512_setzero_si512();
            for (int r = 0; r < R; r++) {
                const int8_t *x = a->q8 + (size_t)(r0 + r) * k + 32 * b;
                for (int q = 0; q < 8; q++) {
                    int32_t x4;
                    memcpy(&x4, x + 4 * q, 4);
                    __m512i *c = &acc[r * NA + q % NA];
                    *c = _mm512_dpbusd_epi32(*c, wq[q], _mm512_set1_epi32(x4));
                }
            }
            const __m512 sc = _mm512_load_ps(sg + (size_t)b * 16), mn = _mm512_load_ps(mg + (size_t)b * 16);
            for (int r = 0; r < R; r++) {
                __m512i s = acc[r * NA];
                for (int j = 1; j < NA; j++) s = _mm512_add_epi32(s, acc[r * NA + j]);
                const size_t rb = (size_t)(r0 + r) * nb + b;
                f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, _mm512_set1_ps(a->d8[rb])), f[r]);
                f[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a->s8[rb]), f[r]);
            }
        }
        lanes_store(L, f, R, G, keep, y, r0, ystride, accumulate);
    }
}

#define LANE8_R(R) \
    VNNI static void lane8_r##R(const Lin *L, const Act *a, int r0, float *y, int ystride, int n0, int n1, int accumulate) { \
        lane8_body(L, a, r0, R, y, ystride, n0, n1, accumulate);                                                           \
    }
LANE8_R(1) LANE8_R(2) LANE8_R(3) LANE8_R(4) LANE8_R(5) LANE8_R(6) LANE8_R(7) LANE8_R(8)
#undef LANE8_R

/* the int4 rows n0..n1 of a linear laid out in lanes (lm_pack16), for any number of inputs: every
   call on such a linear comes here (its rows' own layout may be gone, see lm_pack16); returns 0
   when out of memory */
static int lanes16(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate) {
    static void (*const by_rows[LANES])(const Lin *, const Act16 *, int, float *, int, int, int, int) = {
        lane16_r1, lane16_r2, lane16_r3, lane16_r4, lane16_r5, lane16_r6, lane16_r7, lane16_r8};
    static void (*const by_rows8[LANES])(const Lin *, const Act *, int, float *, int, int, int, int) = {
        lane8_r1, lane8_r2, lane8_r3, lane8_r4, lane8_r5, lane8_r6, lane8_r7, lane8_r8};
    if (a->q8 && lanes8_on()) { /* int8 inputs: the quantizer's rows as they are */
        for (int r0 = 0; r0 < B; r0 += LANES) by_rows8[(B - r0 < LANES ? B - r0 : LANES) - 1](L, a, r0, y, ystride, n0, n1, accumulate);
        return 1;
    }
    const int nb = L->k / 32;
    void *buf = aligned_alloc(64, ((size_t)nb * 18 * LANES * 4 + 63) & ~(size_t)63);
    if (!buf) return 0;
    Act16 t = {(int32_t *)buf, (float *)buf + (size_t)nb * 16 * LANES, NULL}; /* 18 per block */
    t.bs = t.dx + (size_t)nb * LANES;
    for (int r0 = 0; r0 < B; r0 += LANES) {
        const int rows = B - r0 < LANES ? B - r0 : LANES;
        act16(L, a, r0, rows, &t);
        by_rows[rows - 1](L, &t, r0, y, ystride, n0, n1, accumulate);
    }
    free(buf);
    return 1;
}

/* rows n0..n1 of an int4 / int8 linear for B >= 2 inputs; 0 when out of memory (the caller
   then runs its own loop) */
static int lane_rows(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate) {
    const int nb = L->k / 32, nc = (nb + 1) / 2, groups = L->kind == LIN_INT4 ? L->k / L->gs : 0;
    const int wide = lanes_512();
    void *buf = aligned_alloc(64, ((size_t)(2 * nc) * 18 * LANES * 4 + (size_t)groups * LANES * 4 + 63) & ~(size_t)63);
    if (!buf) return 0;
    LaneAct t = {(int32_t *)buf, (float *)buf + (size_t)nb * 16 * LANES, NULL};
    t.sxt = t.dxt + (size_t)nb * LANES;
    LaneAct2 t2 = {(int32_t *)buf, (float *)buf + (size_t)nc * 32 * LANES, NULL, NULL};
    t2.sxt = t2.dxt + (size_t)nc * 2 * LANES;
    if (groups == nb) t2.sx2 = t2.sxt + (size_t)groups * LANES;
    for (int r0 = 0; r0 < B; r0 += LANES) {
        const int rows = B - r0 < LANES ? B - r0 : LANES;
        if (rows < lanes_min_for(wide, L->kind)) { /* too few to fill the lanes: those rows by themselves */
            const int k = L->k;
            Act sub = {a->x ? a->x + (size_t)r0 * k : NULL, a->q + (size_t)r0 * k, a->dx + (size_t)r0 * nb,
                       a->sx + (size_t)r0 * (groups ? groups : 1), a->q8 ? a->q8 + (size_t)r0 * k : NULL,
                       a->q8 ? a->d8 + (size_t)r0 * nb : NULL, a->q8 ? a->s8 + (size_t)r0 * nb : NULL, a->span, a->lanes8, NULL};
            lin_rows(L, rows, &sub, y + (size_t)r0 * ystride, ystride, n0, n1, accumulate);
            continue;
        }
        if (wide && head8(L, a) && i8_lanes(L, a, r0, rows, y, ystride, n0, n1, accumulate)) continue; /* in lanes */
        if (wide && head8(L, a)) { /* int8 inputs (the buffer holds them: 20 of its 36 int32 a block pair and lane) */
            LaneAct8 t8 = {(int32_t *)buf, (float *)buf + (size_t)nc * 16 * LANES, NULL};
            t8.off = (int32_t *)(t8.dxt + (size_t)nc * 2 * LANES);
            lane_act8(L, a, r0, rows, &t8);
            lane_rows8_512(L, &t8, r0, rows, y, ystride, n0, n1, accumulate);
        } else if (wide) {
            lane_act2(L, a, r0, rows, &t2);
            lane_rows_512(L, &t2, r0, rows, y, ystride, n0, n1, accumulate);
        } else {
            lane_act(L, a, r0, rows, &t);
            lane_rows_avx2(L, &t, r0, rows, y, ystride, n0, n1, accumulate);
        }
    }
    free(buf);
    return 1;
}

/* ------------------------------------------------------------------ a prompt's linears in bf16 */

/* A step of many rows (a prompt's chunk: B >= lm_gemm_min(), 16 unless set) on a CPU with
   AVX-512 BF16 multiplies its linears in bf16, as a GEMM: the weights held quantized (int4 and
   int8 rows, GGML's blocks, Q4_K in lanes) are dequantized, a tile of GR = 32 rows at a time,
   into a buffer of bf16 pairs (pair p of the tile's 32 rows side by side: Wt[p][32], 2 vectors),
   and each input row, converted to bf16 once per linear (prepare_blocks: round to nearest even),
   is multiplied into those 32 rows by `vdpbf16ps` with its pair broadcast from memory, GTOK
   input rows at a time (2 x GTOK float accumulators; the sums in float). The integer kernels
   read each weight block once for every row too, but unpack and scale it per row and block;
   here a weight is dequantized once per call and each product is one half of a `vdpbf16ps`
   lane. bf16 keeps 8 bits of the weights' and inputs' significands (the int16 inputs keep ~15):
   the logits move by ~1e-3 of the largest (BENCHMARKS.md, tests/test_native_gemm.py).
   The dequantization: each 16 rows into a row buffer (bf16 in natural order), then 16 x 16
   pairs transposed into Wt. The buffers are each thread's own, kept for the next call
   (gemm_scratch). */
#define GR 32   /* weight rows per tile: two vectors of 16 */
#define GTOK 12 /* input rows per pass over a tile: 24 accumulators */

static int gemm_bf = -1, gemm_min = 16;
static int cpu_has_bf16(void) {
    __builtin_cpu_init();
    return cpu_has_vnni() && __builtin_cpu_supports("avx512bf16");
}
static int gemm_on(void) {
    if (gemm_bf < 0) gemm_bf = cpu_has_bf16();
    return gemm_bf;
}
/* choice 1: a step of lm_gemm_min() rows or more multiplies in bf16 where the CPU has AVX-512
   BF16; 0: the integer kernels at every row count; -1 leaves it; returns the choice in force */
int lm_gemm_bf16(int choice) {
    if (choice >= 0) gemm_bf = choice && cpu_has_bf16();
    return gemm_on();
}
/* the rows from which a step multiplies in bf16 (>= 1; 0 or less leaves it); returns it */
int lm_gemm_min(int choice) {
    if (choice >= 1) gemm_min = choice;
    return gemm_min;
}
/* whether a step of B rows takes the bf16 form (its linears that bf_covers) */
static int gemm_rows(int B) { return B >= gemm_min && gemm_on(); }

/* whether the bf16 form reads L's weights: int4 rows (not in lanes alone), int8 rows, GGML's
   blocks (Q4_K in lanes too), parts of those; not float weights */
static int bf_covers(const Lin *L) {
    if (L->kind == LIN_PARTS) {
        for (int i = 0; i < L->gs; i++)
            if (!bf_covers((const Lin *)L->w + i)) return 0;
        return L->gs > 0;
    }
    if (L->k % 32 || L->n < 1 || !L->w) return 0;
    if (L->kind == LIN_INT4 || L->kind == LIN_INT8) return L->gs >= 32 && L->gs % 32 == 0 && L->k % L->gs == 0;
    if (L->kind >= LIN_Q4K && L->kind <= LIN_Q5_1)
        return L->k % kq_per(L->kind) == 0 && !(lanes_kind(L) && L->n % 16);
    return 0;
}

/* rows r0..r1 of x (k wide) -> bf16 rows of xb, round to nearest even */
BF16 static void bf16_rows(const float *x, int r0, int r1, int k, uint16_t *xb) {
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * k;
        uint16_t *o = xb + (size_t)r * k;
        int i = 0;
        for (; i + 32 <= k; i += 32)
            _mm512_storeu_si512((void *)(o + i), (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xr + i + 16), _mm512_loadu_ps(xr + i)));
        for (; i < k; i += 16) _mm256_storeu_si256((__m256i *)(o + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xr + i)));
    }
}

/* 32 floats (lo: the first 16) -> 32 bf16 in order */
BF16 static inline __m512i bf_pack(__m512 lo, __m512 hi) { return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); }

/* one row of GGML's blocks of kind `kind` (a constant where it is inlined) -> k bf16 */
BF16 static inline __attribute__((always_inline)) void bf_row_kq(const int kind, const uint8_t *row, int k, uint16_t *o) {
    const int per = kq_per(kind), bs = kq_bytes(kind), sub = per / 32;
    if (sub == 1) { /* blocks of 32: one scale (and minimum) a block */
        for (int b = 0; b < k / 32; b++) {
            const uint8_t *blk = row + (size_t)b * bs;
            const __m256i q = kq_q8(kind, blk, 0);
            const __m512 sc = _mm512_set1_ps(half(blk));
            const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
            const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
            if (kind == LIN_Q5_1) {
                const __m512 m = _mm512_set1_ps(half(blk + 2));
                _mm512_storeu_si512((void *)(o + (size_t)b * 32), bf_pack(_mm512_fmadd_ps(lo, sc, m), _mm512_fmadd_ps(hi, sc, m)));
            } else
                _mm512_storeu_si512((void *)(o + (size_t)b * 32), bf_pack(_mm512_mul_ps(lo, sc), _mm512_mul_ps(hi, sc)));
        }
        return;
    }
    float s[16], mn[PER_SB_MAX];
    for (int sb = 0; sb < k / per; sb++) {
        const uint8_t *blk = row + (size_t)sb * bs;
        kq_scales(kind, blk, s, mn);
        for (int j = 0; j < sub; j++) {
            const __m256i q = kq_q8(kind, blk, j);
            const __m512 m = _mm512_set1_ps(mn[j]);
            const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), _mm512_set1_ps(s[2 * j]), m);
            const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), _mm512_set1_ps(s[2 * j + 1]), m);
            _mm512_storeu_si512((void *)(o + (size_t)(sb * sub + j) * 32), bf_pack(lo, hi));
        }
    }
}

/* weight row n of a GGML-block linear L in GGML's layout: in place, or (in 16-row lanes) in grp,
   its group put back there (*gat: the group grp holds, -1 none) */
static const uint8_t *ggml_row(const Lin *L, int n, uint8_t *grp, int *gat) {
    const int k = L->k, kind = L->kind;
    const size_t rb = kq_row_bytes(kind, k);
    if (!lanes_kind(L)) return (const uint8_t *)L->w + (size_t)n * rb;
    if (*gat != n / 16) {
        lanes_group(kind, (const uint8_t *)L->lw + (size_t)(n / 16) * lanes_group_bytes(kind, k), grp, k, 1);
        *gat = n / 16;
    }
    return grp + (size_t)(n % 16) * rb;
}

/* one weight row of L (not parts) -> k bf16 (natural order); grp: a Q4_K group in lanes put back
   in GGML's layout (16 rows), *gat the group it holds (-1: none) */
BF16 static void bf_row(const Lin *L, int n, uint16_t *o, uint8_t *grp, int *gat) {
    const int k = L->k, nb = k / 32;
    if (L->kind == LIN_INT4) { /* byte i: elements 2i (low nibble) and 2i + 1 (high) */
        const uint8_t *w = (const uint8_t *)L->w + (size_t)n * (k / 2);
        const float *s = L->s + (size_t)n * (k / L->gs), *mn = L->mn + (size_t)n * (k / L->gs);
        const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                               20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        for (int b = 0; b < nb; b++) {
            const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + 16 * b)));
            const int g = 32 * b / L->gs;
            const __m512 sc = _mm512_set1_ps(s[g]), m = _mm512_set1_ps(mn[g]);
            const __m512 ev = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))), sc, m);
            const __m512 od = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), sc, m);
            _mm512_storeu_si512((void *)(o + 32 * b), _mm512_permutexvar_epi16(inter, bf_pack(ev, od)));
        }
        return;
    }
    if (L->kind == LIN_INT8) {
        const int8_t *w = (const int8_t *)L->w + (size_t)n * k;
        const float *s = L->s + (size_t)n * (k / L->gs);
        for (int b = 0; b < nb; b++) {
            const __m512 sc = _mm512_set1_ps(s[32 * b / L->gs]);
            const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + 32 * b)))), sc);
            const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + 32 * b + 16)))), sc);
            _mm512_storeu_si512((void *)(o + 32 * b), bf_pack(lo, hi));
        }
        return;
    }
    const int kind = L->kind;
    if (kind == LIN_Q5_0 && L->lw) { /* in 16-row lanes: read in place (the floats below, the same bits) */
        const uint8_t *g = (const uint8_t *)L->lw + (size_t)(n / 16) * lanes_group_bytes(kind, k);
        const int r = n % 16;
        const __m256i pick = _mm256_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
        const __m256i bit = _mm256_setr_epi8(1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32, 32, 64, 64, 64, 64,
                                              -128, -128, -128, -128);
        for (int b = 0; b < nb; b++) {
            const uint8_t *q = g + (size_t)96 * nb + 256 * (size_t)b + 4 * r;
            uint32_t t, w[4];
            memcpy(&t, g + (size_t)32 * nb + 64 * (size_t)b + 4 * r, 4);
            for (int v = 0; v < 4; v++) memcpy(&w[v], q + 64 * v, 4);
            const __m128i raw = _mm_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
            __m256i z = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, _mm_set1_epi8(15))),
                                                _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)), 1);
            const __mmask32 hb = _mm256_test_epi8_mask(_mm256_shuffle_epi8(_mm256_set1_epi32((int)t), pick), bit);
            z = _mm256_sub_epi8(_mm256_mask_add_epi8(z, hb, z, _mm256_set1_epi8(16)), _mm256_set1_epi8(16));
            const __m512 d = _mm512_set1_ps(half(g + 32 * (size_t)b + 2 * r)), m = _mm512_setzero_ps();
            const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(z))), d, m);
            const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(z, 1))), d, m);
            _mm512_storeu_si512((void *)(o + 32 * b), bf_pack(lo, hi));
        }
        return;
    }
    const uint8_t *row = ggml_row(L, n, grp, gat);
    switch (kind) { /* each kind's loop compiled for it (a kind known at compile time) */
    case LIN_Q4K: bf_row_kq(LIN_Q4K, row, k, o); return;
    case LIN_Q5K: bf_row_kq(LIN_Q5K, row, k, o); return;
    case LIN_Q6K: bf_row_kq(LIN_Q6K, row, k, o); return;
    case LIN_Q8_0: bf_row_kq(LIN_Q8_0, row, k, o); return;
    case LIN_Q5_0: bf_row_kq(LIN_Q5_0, row, k, o); return;
    default: bf_row_kq(LIN_Q5_1, row, k, o); return;
    }
}

/* 16 rows' bf16 (rb: row stride k) -> pairs 0..k/2 of lanes h*16 .. h*16+15 of the tile Wt
   (32 bit words: Wt[p * GR + lane]), 16 x 16 words at a time */
BF16 static void bf_transpose16(const uint16_t *rb, int k, uint32_t *Wt, int h) {
    for (int c = 0; c < k / 32; c++) {
        __m512i r[16], t[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512((const void *)(rb + (size_t)i * k + 32 * c));
        for (int i = 0; i < 8; i++) {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        for (int i = 0; i < 4; i++) { /* r[4i + c]: rows 4i..4i+3 of word 4 L + c in 128-bit lane L */
            r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        uint32_t *o = Wt + (size_t)(16 * c) * GR + 16 * h;
        for (int j = 0; j < 4; j++) {
            const __m512i u0 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x44), u1 = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xEE);
            const __m512i u2 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x44), u3 = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xEE);
            _mm512_store_si512((void *)(o + (size_t)j * GR), _mm512_shuffle_i32x4(u0, u2, 0x88));
            _mm512_store_si512((void *)(o + (size_t)(4 + j) * GR), _mm512_shuffle_i32x4(u0, u2, 0xDD));
            _mm512_store_si512((void *)(o + (size_t)(8 + j) * GR), _mm512_shuffle_i32x4(u1, u3, 0x88));
            _mm512_store_si512((void *)(o + (size_t)(12 + j) * GR), _mm512_shuffle_i32x4(u1, u3, 0xDD));
        }
    }
}

/* T input rows (x: bf16, row stride k) times the tile's 16 (W2 0) or 32 rows (kp pairs) -> y
   rows (stride ys) at the tile's columns, lanes m0 / m1 kept; + bias, + y where accumulate */
BF16 static inline __attribute__((always_inline)) void bf_tile(const int T, const int W2, const uint32_t *Wt, int kp,
                                                               const uint16_t *x, int k, float *y, size_t ys, __mmask16 m0,
                                                               __mmask16 m1, const float *bias, int accumulate) {
    __m512 c0[GTOK], c1[GTOK];
    for (int t = 0; t < T; t++) c0[t] = c1[t] = _mm512_setzero_ps();
    for (int p = 0; p < kp; p++) {
        const __m512bh w0 = (__m512bh)_mm512_load_si512((const void *)(Wt + (size_t)p * GR));
        const __m512bh w1 = W2 ? (__m512bh)_mm512_load_si512((const void *)(Wt + (size_t)p * GR + 16)) : w0;
        for (int t = 0; t < T; t++) {
            int32_t xv;
            memcpy(&xv, x + (size_t)t * k + 2 * p, 4);
            const __m512bh b = (__m512bh)_mm512_set1_epi32(xv);
            c0[t] = _mm512_dpbf16_ps(c0[t], w0, b);
            if (W2) c1[t] = _mm512_dpbf16_ps(c1[t], w1, b);
        }
    }
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias && W2 ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    for (int t = 0; t < T; t++) {
        float *o = y + (size_t)t * ys;
        __m512 v = _mm512_add_ps(c0[t], b0);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m0, o));
        _mm512_mask_storeu_ps(o, m0, v);
        if (W2) {
            v = _mm512_add_ps(c1[t], b1);
            if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m1, o + 16));
            _mm512_mask_storeu_ps(o + 16, m1, v);
        }
    }
}

#define BF_T(T)                                                                                     \
    case T:                                                                                         \
        if (W2) bf_tile(T, 1, Wt, kp, x, k, y, ys, m0, m1, bias, accumulate);                       \
        else bf_tile(T, 0, Wt, kp, x, k, y, ys, m0, m1, bias, accumulate);                          \
        return;
BF16 static void bf_tile_any(int T, int W2, const uint32_t *Wt, int kp, const uint16_t *x, int k, float *y, size_t ys,
                             __mmask16 m0, __mmask16 m1, const float *bias, int accumulate) {
    switch (T) {
        BF_T(1) BF_T(2) BF_T(3) BF_T(4) BF_T(5) BF_T(6) BF_T(7) BF_T(8) BF_T(9) BF_T(10) BF_T(11) BF_T(12)
    }
}
#undef BF_T

/* each thread's buffers, kept for its next call (a prompt's chunk makes ~100 calls a thread):
   the tile (GR rows x k bf16), 16 rows in natural order, a Q4_K group put back */
static __thread uint8_t *gemm_buf;
static __thread size_t gemm_cap;
static uint8_t *gemm_scratch(size_t bytes) {
    if (bytes > gemm_cap) {
        free(gemm_buf);
        gemm_buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        gemm_cap = gemm_buf ? bytes : 0;
    }
    return gemm_buf;
}

typedef int (*RowsFn)(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate);
/* rows n0..n1 of a parts linear L, each part's share by f (its rows at its offset); 0 where f fails */
static int parts_rows(RowsFn f, const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate) {
    const Lin *parts = (const Lin *)L->w;
    for (int i = 0, off = 0; i < L->gs; off += parts[i].n, i++) {
        const int lo = n0 > off ? n0 : off, hi = n1 < off + parts[i].n ? n1 : off + parts[i].n;
        if (lo < hi && !f(&parts[i], B, a, y + off, ystride, lo - off, hi - off, accumulate)) return 0;
    }
    return 1;
}

/* rows n0..n1 of L for B input rows in bf16 (a->xb) (as lin_rows); 0 when out of memory */
BF16 static int lin_rows_bf(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate) {
    if (L->kind == LIN_PARTS) return parts_rows(lin_rows_bf, L, B, a, y, ystride, n0, n1, accumulate);
    const int k = L->k, kp = k / 2, lanes = lanes_kind(L);
    const size_t tile = (size_t)GR * k * 2, rows16 = (size_t)16 * k * 2;
    uint8_t *buf = gemm_scratch(tile + rows16 + (lanes ? lanes_group_bytes(L->kind, k) : 0));
    if (!buf) return 0;
    uint32_t *Wt = (uint32_t *)buf;
    uint16_t *rb = (uint16_t *)(buf + tile);
    uint8_t *grp = buf + tile + rows16;
    int gat = -1;
    for (int n = n0; n < n1; n += GR) {
        const int rows = n1 - n < GR ? n1 - n : GR;
        for (int h = 0; h * 16 < rows; h++) {
            const int hr = rows - 16 * h < 16 ? rows - 16 * h : 16;
            for (int r = 0; r < hr; r++) bf_row(L, n + 16 * h + r, rb + (size_t)r * k, grp, &gat);
            if (hr < 16) memset(rb + (size_t)hr * k, 0, (size_t)(16 - hr) * k * 2);
            bf_transpose16(rb, k, Wt, h);
        }
        const int W2 = rows > 16;
        const __mmask16 m0 = (__mmask16)(rows >= 16 ? 0xFFFF : (1u << rows) - 1);
        const __mmask16 m1 = (__mmask16)(rows >= 32 ? 0xFFFF : rows > 16 ? (1u << (rows - 16)) - 1 : 0);
        for (int t0 = 0; t0 < B; t0 += GTOK)
            bf_tile_any(B - t0 < GTOK ? B - t0 : GTOK, W2, Wt, kp, a->xb + (size_t)t0 * k, k, y + (size_t)t0 * ystride + n,
                        (size_t)ystride, m0, m1, L->bias ? L->bias + n : NULL, accumulate);
    }
    return 1;
}

/* ------------------------------------------------------------------ a prompt's linears in int8 */

/* The same GEMM with int8 products (`vpdpbusd`: 64 byte products a cycle, bf16's 32), for fc
   (the default, Act.i8 2) or qkv and fc (1) of a prompt's chunk (every linear it covers: 3,
   lm_linear_i8). The weights stay exact: each row's block of 32 as w = a u + c, u unsigned bytes
   (the kinds with a minimum: their q as is, c the minimum (Q4_K / Q5_K: the sub-block's scale in
   a); the others: u = q + 128, c 0); the inputs as llama.cpp's Q8_0 activations (quantize_blocks'
   int8 form: per 32, amax / 127, to nearest even; i8_pack). Per block and input row the integer
   sum starts at -128 x the input's integer sum where u is q + 128 (exact), then 8 `vpdpbusd` (the
   tile's 16 rows' bytes in a register, the input's 4 bytes broadcast), converted, times the
   input's scale, an fma by a, and for a minimum an fma of c by the block's rounded input sum.
   BENCHMARKS.md ("The int8 prompt form") has the accuracy: with int8 inputs on all four linears
   the logits are further from fp32 than llama.cpp's own prefill (Q4_1, Q8_0); on qkv and fc
   nearer, on fc alone ~2x nearer still; the out-projections keep bf16, and Q6_K (scales per 16).
   Tile: 16 weight rows, per block of 32 8 vectors of the 16 rows' 4 bytes, then a and c (I8_BLK
   bytes); GI8 input rows per pass (2 GI8 + 3 vectors live). */
#define I8 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define I8_BLK 640   /* a tile's block: 8 x 64 bytes, 16 floats a, 16 floats c */

static int gemm_i8 = -1;
/* where the step multiplies in bf16 (lm_gemm_bf16) and the CPU has AVX-512 VNNI, the int8 form
   for a prompt's fc alone (choice 2) or qkv and fc (1); 0, the default: bf16 everywhere
   (LAMINA_GEMM_I8=1 / 2 in the environment picks the others); -1 leaves it; returns the choice in
   force. Off by default: int8 inputs move the logits ~5x further from fp32's than bf16's (still
   nearer than llama.cpp's own prefill), enough to flip SmolLM2's near ties, the chat reply to
   "What is the capital of France?" among them with fc alone beside the bf16 attention
   (BENCHMARKS.md) */
int lm_gemm_i8(int choice) {
    kq_cpu();
    if (choice < 0 && gemm_i8 < 0) {
        const char *e = getenv("LAMINA_GEMM_I8");
        choice = e && (strcmp(e, "1") == 0 || strcmp(e, "2") == 0) ? e[0] - '0' : 0;
    }
    if (choice >= 0) gemm_i8 = choice >= 1 && choice <= 2 && kq_vnni && lanes_512() ? choice : 0;
    return gemm_i8;
}
static int gemm_i8_on(void) { return gemm_i8 >= 0 ? gemm_i8 : lm_gemm_i8(-1); }

static int i8_kind_min(int kind) { return kind == LIN_INT4 || kq_has_min(kind); }

/* whether the int8 form reads L's weights: what bf_covers takes but Q6_K */
static int i8_covers(const Lin *L) {
    if (L->kind == LIN_PARTS) {
        for (int i = 0; i < L->gs; i++)
            if (((const Lin *)L->w)[i].kind == LIN_Q6K) return 0;
        return bf_covers(L);
    }
    return L->kind != LIN_Q6K && bf_covers(L);
}

/* whether a step's linear L takes the int8 form (Act.i8 above); prepare_blocks and lin_rows ask
   the same, so L's inputs are made for the form that reads them */
static int i8_form(const Lin *L, const Act *a) {
    if (!a->i8 || !i8_covers(L)) return 0;
    if (a->i8 == 3) return 1;
    for (int l = 0; l < a->nl; l++)
        if ((a->i8 == 1 && L == &a->layers[l].qkv) || L == &a->layers[l].fc) return 1;
    return 0;
}

/* one weight row of L (not parts) -> k bytes u (natural order), a and c per block of 32;
   grp, gat: as bf_row's */
I8 static void i8_row(const Lin *L, int n, uint8_t *u, float *a, float *c, uint8_t *grp, int *gat) {
    const int k = L->k, nb = k / 32;
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    if (L->kind == LIN_INT4) { /* byte i: elements 2i (low nibble) and 2i + 1 (high) */
        const uint8_t *w = (const uint8_t *)L->w + (size_t)n * (k / 2);
        const float *s = L->s + (size_t)n * (k / L->gs), *mn = L->mn + (size_t)n * (k / L->gs);
        for (int b = 0; b < nb; b++) {
            const __m128i raw = _mm_loadu_si128((const __m128i *)(w + 16 * b)), m4 = _mm_set1_epi8(15);
            const __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
            _mm_storeu_si128((__m128i *)(u + 32 * b), _mm_unpacklo_epi8(lo, hi));
            _mm_storeu_si128((__m128i *)(u + 32 * b + 16), _mm_unpackhi_epi8(lo, hi));
            a[b] = s[32 * b / L->gs], c[b] = mn[32 * b / L->gs];
        }
        return;
    }
    if (L->kind == LIN_INT8) {
        const int8_t *w = (const int8_t *)L->w + (size_t)n * k;
        const float *s = L->s + (size_t)n * (k / L->gs);
        for (int b = 0; b < nb; b++) {
            _mm256_storeu_si256((__m256i *)(u + 32 * b), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(w + 32 * b)), flip));
            a[b] = s[32 * b / L->gs], c[b] = 0.0f;
        }
        return;
    }
    const int kind = L->kind, per = kq_per(kind), bs = kq_bytes(kind), sub = per / 32;
    const uint8_t *row = ggml_row(L, n, grp, gat);
    const int has_min = kq_has_min(kind);
    float s[16], mn[PER_SB_MAX];
    for (int sb = 0; sb < k / per; sb++) {
        const uint8_t *blk = row + (size_t)sb * bs;
        kq_scales(kind, blk, s, mn);
        for (int j = 0; j < sub; j++) {
            const __m256i q = kq_q8(kind, blk, j);
            const int b = sb * sub + j;
            _mm256_storeu_si256((__m256i *)(u + 32 * b), has_min ? q : _mm256_xor_si256(q, flip));
            a[b] = s[2 * j], c[b] = mn[j];
        }
    }
}

/* T input rows (a group of i8_pack's: int8 x, scales xd, rounded sums xs, corrections xc) times
   the tile (16 rows) -> y rows (stride ys), lanes m kept; + bias, + y where accumulate */
I8 static inline __attribute__((always_inline)) void i8_tile(const int T, const int MIN, const uint8_t *Wt, int nb, const int8_t *x,
                                                            const float *xd, const float *xs, const int32_t *xc, float *y,
                                                            size_t ys, __mmask16 m, const float *bias, int accumulate) {
    __m512 acc[GI8];
    for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = Wt + (size_t)b * I8_BLK;
        __m512i s[GI8];
        const int8_t *xb = x + (size_t)b * GI8 * 32;
        const float *db = xd + (size_t)b * GI8, *sb = xs + (size_t)b * GI8;
        for (int t = 0; t < T; t++) s[t] = MIN ? _mm512_setzero_si512() : _mm512_set1_epi32(xc[(size_t)b * GI8 + t]);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const __m512i w = _mm512_load_si512((const void *)(blk + 64 * j));
            for (int t = 0; t < T; t++) {
                int32_t xv;
                memcpy(&xv, xb + 32 * t + 4 * j, 4);
                s[t] = _mm512_dpbusd_epi32(s[t], w, _mm512_set1_epi32(xv));
            }
        }
        const __m512 av = _mm512_load_ps((const float *)(blk + 512));
        const __m512 cv = MIN ? _mm512_load_ps((const float *)(blk + 576)) : _mm512_setzero_ps();
        for (int t = 0; t < T; t++) {
            const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(s[t]), _mm512_set1_ps(db[t]));
            acc[t] = _mm512_fmadd_ps(f, av, acc[t]);
            if (MIN) acc[t] = _mm512_fmadd_ps(cv, _mm512_set1_ps(sb[t]), acc[t]);
        }
    }
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
    for (int t = 0; t < T; t++) {
        float *o = y + (size_t)t * ys;
        __m512 v = _mm512_add_ps(acc[t], bv);
        if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, o));
        _mm512_mask_storeu_ps(o, m, v);
    }
}

#define I8_T(T)                                                                                     \
    case T:                                                                                         \
        if (MIN) i8_tile(T, 1, Wt, nb, x, xd, xs, xc, y, ys, m, bias, accumulate);                   \
        else i8_tile(T, 0, Wt, nb, x, xd, xs, xc, y, ys, m, bias, accumulate);                       \
        return;
I8 static void i8_tile_any(int T, int MIN, const uint8_t *Wt, int nb, const int8_t *x, const float *xd, const float *xs,
                           const int32_t *xc, float *y, size_t ys, __mmask16 m, const float *bias, int accumulate) {
    switch (T) {
        I8_T(1) I8_T(2) I8_T(3) I8_T(4) I8_T(5) I8_T(6) I8_T(7) I8_T(8) I8_T(9) I8_T(10)
    }
}
#undef I8_T

/* rows n0..n1 of L for B input rows in int8 (i8_pack's) (as lin_rows); 0 when out of memory */
I8 static int lin_rows_i8(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1, int accumulate) {
    if (L->kind == LIN_PARTS) return parts_rows(lin_rows_i8, L, B, a, y, ystride, n0, n1, accumulate);
    const int k = L->k, nb = k / 32, lanes = lanes_kind(L), MIN = i8_kind_min(L->kind);
    const size_t tile = (size_t)nb * I8_BLK, rows16 = (size_t)16 * k + (size_t)32 * nb * sizeof(float);
    uint8_t *buf = gemm_scratch(tile + rows16 + (lanes ? lanes_group_bytes(L->kind, k) : 0));
    if (!buf) return 0;
    uint8_t *Wt = buf, *ub = buf + tile, *grp = buf + tile + rows16;
    float *ab = (float *)(ub + (size_t)16 * k), *cb = ab + (size_t)16 * nb;
    const int8_t *xq = (const int8_t *)a->xb;
    int gat = -1;
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(k));
    const __m512i sc = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int n = n0; n < n1; n += 16) {
        const int hr = n1 - n < 16 ? n1 - n : 16;
        for (int r = 0; r < hr; r++) i8_row(L, n + r, ub + (size_t)r * k, ab + (size_t)r * nb, cb + (size_t)r * nb, grp, &gat);
        if (hr < 16) {
            memset(ub + (size_t)hr * k, 0, (size_t)(16 - hr) * k);
            memset(ab + (size_t)hr * nb, 0, (size_t)(16 - hr) * nb * sizeof(float));
            memset(cb + (size_t)hr * nb, 0, (size_t)(16 - hr) * nb * sizeof(float));
        }
        const __m512i rnb = _mm512_mullo_epi32(sc, _mm512_set1_epi32(nb));
        for (int b = 0; b < nb; b++) { /* 16 rows' 4-byte words side by side */
            uint8_t *o = Wt + (size_t)b * I8_BLK;
            for (int j = 0; j < 8; j++)
                _mm512_store_si512((void *)(o + 64 * j), _mm512_i32gather_epi32(rows, (const void *)(ub + 32 * b + 4 * j), 1));
            _mm512_store_ps((float *)(o + 512), _mm512_i32gather_ps(rnb, ab + b, 4));
            _mm512_store_ps((float *)(o + 576), _mm512_i32gather_ps(rnb, cb + b, 4));
        }
        const __mmask16 m = (__mmask16)(hr >= 16 ? 0xFFFF : (1u << hr) - 1);
        for (int t0 = 0; t0 < B; t0 += GI8)
            i8_tile_any(B - t0 < GI8 ? B - t0 : GI8, MIN, Wt, nb, xq + (size_t)t0 * k, a->pd + (size_t)t0 * nb,
                        a->ps + (size_t)t0 * nb, a->pc + (size_t)t0 * nb, y + (size_t)t0 * ystride + n, (size_t)ystride, m,
                        L->bias ? L->bias + n : NULL, accumulate);
    }
    return 1;
}

/* y[r, n] (+)= x[r] . w[n] + bias[n] for output rows n0..n1 and input rows r < B */
static void lin_rows(const Lin *L, int B, const Act *a, float *y, int ystride, int n0, int n1,
                     int accumulate) {
    if (a->xb && bf_covers(L)) { /* a prompt's rows in bf16 or int8 (inputs made ready so by prepare_blocks) */
        if (!(i8_form(L, a) ? lin_rows_i8 : lin_rows_bf)(L, B, a, y, ystride, n0, n1, accumulate)) /* out of memory: NaN */
            for (int r = 0; r < B; r++)
                for (int n = n0; n < n1; n++) y[(size_t)r * ystride + n] = NAN;
        return;
    }
    if (L->kind == LIN_PARTS) { /* each part's rows, at their offset */
        const Lin *parts = (const Lin *)L->w;
        for (int i = 0, off = 0; i < L->gs; off += parts[i].n, i++) {
            const int lo = n0 > off ? n0 : off, hi = n1 < off + parts[i].n ? n1 : off + parts[i].n;
            if (lo < hi) lin_rows(&parts[i], B, a, y + off, ystride, lo - off, hi - off, accumulate);
        }
        return;
    }
    if (L->kind == LIN_INT4 && L->lw) { /* laid out in lanes: every number of rows */
        if (lanes16(L, B, a, y, ystride, n0, n1, accumulate)) return;
        if (!L->w) { /* out of memory and no rows' layout to fall back on: NaN, not garbage */
            for (int r = 0; r < B; r++)
                for (int n = n0; n < n1; n++) y[(size_t)r * ystride + n] = NAN;
            return;
        }
    }
    if (lanes_kind(L)) { /* in 16-row lanes (lm_kq_pack16): one row there, else by groups of rows */
        int failed = 0; /* out of memory part way: rows already (+)= written, so no second pass */
        const int q50 = L->kind == LIN_Q5_0;
        if (B < lanes_min(1) && a->span == (q50 ? 1 : 8) && (q50 ? q50_lanes_on() : kq_lanes_on()) && !(a->q8 && act8_on())) { /* the one-row form per row, as below */
            const int k = L->k, nb = k / 32;
            for (int r = 0; r < B && !failed; r++) {
                Act one = *a;
                one.x = a->x ? a->x + (size_t)r * k : NULL, one.q = a->q + (size_t)r * k;
                one.dx = a->dx + (size_t)r * nb, one.sx = a->sx + (size_t)r * nb;
                failed = !one_row_lanes(L, &one, y + (size_t)r * ystride, n0, n1, accumulate);
            }
            if (!failed) return;
        }
        if (failed || !kq_lanes_by_rows(L, B, a, y, ystride, n0, n1, accumulate)) /* out of memory: NaN, not garbage */
            for (int r = 0; r < B; r++)
                for (int n = n0; n < n1; n++) y[(size_t)r * ystride + n] = NAN;
        return;
    }
    if (B == 1 && a->q8 && (act8_on() || head8(L, a)) && L->kind != LIN_F32) { /* one row, int8 inputs (act8; q8 may be there for lanes8 alone) */
        one_row8(L, a, y, n0, n1, accumulate);
        return;
    }
    if (B == 1 && (L->kind == LIN_Q4K || L->kind == LIN_Q6K) && a->span == 8 && kq_int_on()) { /* one row: integers */
        if (kq_planes_for(L->kind) && one_row_kq_planes(L, a, y, n0, n1, accumulate)) return;
        if (L->kind == LIN_Q4K) one_row_q4k_int(L, a, y, n0, n1, accumulate);
        else one_row_q6k_int(L, a, y, n0, n1, accumulate);
        return;
    }
    if (B == 1 && (L->kind == LIN_INT4 || (L->kind == LIN_INT8 && i8_wide) || (L->kind >= LIN_Q4K && kq_wide_for(L->kind))) && lanes_512()) { /* one row: AVX-512 */
        if (L->kind == LIN_INT4) (q4_pair ? one_row_q4p_512 : one_row_q4_512)(L, a, y, n0, n1, accumulate);
        else if (L->kind == LIN_INT8) one_row_i8_512(L, a, y, n0, n1, accumulate);
        else if (L->kind == LIN_Q5_0 && q5_pair) one_row_q5_0p(L, a, y, n0, n1, accumulate);
        else if (L->kind == LIN_Q5_1 && q5_pair) one_row_q5_1p(L, a, y, n0, n1, accumulate);
        else one_row_kq_any_512(L, a, y, n0, n1, accumulate);
        return;
    }
    if (B == 1 && nr2_for(L)) { /* one row, AVX2: whole passes of NR rows, the rest the row loop below */
        const int n2 = n0 + (n1 - n0) / NR * NR;
        if (L->kind == LIN_INT4) one_row_q4_nr2(L, a, y, n0, n2, accumulate);
        else one_row_i8_nr2(L, a, y, n0, n2, accumulate);
        if (n2 == n1) return;
        n0 = n2;
    }
    if (B > 1 && B < lanes_min(1) && (L->kind == LIN_INT4 || L->kind >= LIN_Q4K || head8(L, a)) && lanes_512()) {
        /* too few rows for the lanes: the one-row form per row, the weights read again from cache */
        const int k = L->k, nb = k / 32, gsum = L->kind == LIN_INT4 ? k / L->gs : nb;
        for (int r = 0; r < B; r++) {
            Act one = {a->x ? a->x + (size_t)r * k : NULL, a->q + (size_t)r * k, a->dx + (size_t)r * nb,
                       a->sx + (size_t)r * gsum, a->q8 ? a->q8 + (size_t)r * k : NULL,
                       a->q8 ? a->d8 + (size_t)r * nb : NULL, a->q8 ? a->s8 + (size_t)r * nb : NULL, a->span, a->lanes8, NULL};
            lin_rows(L, 1, &one, y + (size_t)r * ystride, ystride, n0, n1, accumulate);
        }
        return;
    }
    if (L->kind >= LIN_Q4K) {
        lin_rows_kq(L, B, a, y, ystride, n0, n1, accumulate);
        return;
    }
    if (B >= lanes_min_for(lanes_512(), L->kind) && L->kind != LIN_F32 && lane_rows(L, B, a, y, ystride, n0, n1, accumulate))
        return;
    const int k = L->k, nb = k / 32, groups = L->gs ? k / L->gs : 1; /* float: gs 0 */
    const int sh = groups == 1 ? 31 : __builtin_ctz(L->gs / 32);
    const size_t wb = L->kind == LIN_F32 ? (size_t)k * 4 : L->kind == LIN_INT4 ? (size_t)k / 2 : (size_t)k;
    for (int n = n0; n < n1; n++) {
        const float bias = L->bias ? L->bias[n] : 0.0f;
        if (n + PF_ROWS < n1) { /* a row further on its way: weights, then scales */
            const char *next = (const char *)L->w + (size_t)(n + PF_ROWS) * wb;
            for (size_t o = 0; o < wb; o += 64) PF_W(next + o);
            if (L->kind != LIN_F32) PF_W((const char *)(L->s + (size_t)(n + PF_ROWS) * groups));
            if (L->kind == LIN_INT4) PF_W((const char *)(L->mn + (size_t)(n + PF_ROWS) * groups));
        }
        for (int r0 = 0; r0 < B; r0 += TILE) {
            const int rows = B - r0 < TILE ? B - r0 : TILE;
            float v[TILE];
            if (L->kind == LIN_F32) {
                for (int r = 0; r < rows; r++)
                    v[r] = dot_f32((const float *)L->w + (size_t)n * k, a->x + (size_t)(r0 + r) * k, k);
            } else if (rows == 1) {
                const int r = r0;
                v[0] = L->kind == LIN_INT4
                           ? row_q4(L, n, a->q + (size_t)r * k, a->dx + r * nb, a->sx + r * groups)
                           : row_q8(L, n, a->q + (size_t)r * k, a->dx + r * nb);
            } else { /* unpack each weight block once for up to TILE input rows */
                __m256 acc[TILE];
                for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
                const float *sc = L->s + (size_t)n * groups;
                for (int b = 0; b < nb; b++) {
                    __m256i w0, w1;
                    if (L->kind == LIN_INT4)
                        unpack_q4((const uint8_t *)L->w + (size_t)n * (k / 2), b, &w0, &w1);
                    else
                        unpack_q8((const int8_t *)L->w + (size_t)n * k, b, &w0, &w1);
                    const float s = sc[b >> sh];
                    for (int r = 0; r < rows; r++) {
                        __m256i p = dot_block(w0, w1, a->q + (size_t)(r0 + r) * k, b);
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(s * a->dx[(r0 + r) * nb + b]), _mm256_cvtepi32_ps(p), acc[r]);
                    }
                }
                for (int r = 0; r < rows; r++) {
                    v[r] = hsum(acc[r]);
                    if (L->kind == LIN_INT4)
                        v[r] += dot_f32(L->mn + (size_t)n * groups, a->sx + (r0 + r) * groups, groups);
                }
            }
            for (int r = 0; r < rows; r++) {
                float *o = y + (size_t)(r0 + r) * ystride + n;
                *o = (accumulate ? *o : 0.0f) + v[r] + bias;
            }
        }
    }
}

static void split(int n, int tid, int nt, int *n0, int *n1) {
    int chunk = (n + nt - 1) / nt;
    chunk = (chunk + 7) & ~7;
    *n0 = tid * chunk < n ? tid * chunk : n;
    *n1 = (tid + 1) * chunk < n ? (tid + 1) * chunk : n;
}

/* One row's input to L (k wide) shared out among a step's threads: thread tid's blocks of 32,
   b0..b1, in whole units of prepare_unit(L) blocks. A step of one row gives each thread its
   columns of a norm or activation and their quantized blocks, where thread 0 alone did the row
   while the others waited (BENCHMARKS.md, issue 31's Zen 4 section) */
static void split_blocks(const Lin *L, int k, int tid, int nt, int *b0, int *b1) {
    const int nb = k / 32, unit = prepare_unit(L), units = (nb + unit - 1) / unit, per = (units + nt - 1) / nt;
    *b0 = tid * per * unit < nb ? tid * per * unit : nb;
    *b1 = (tid + 1) * per * unit < nb ? (tid + 1) * per * unit : nb;
}

/* whether a one-row step shares its rows' norms, activations and input blocks among its threads
   (1, the default) or thread 0 makes them (0); -1 leaves it; returns it (step_profile --switch) */
static int col_split = 1;
int lm_col_split(int choice) {
    if (choice >= 0) col_split = choice ? 1 : 0;
    return col_split;
}

/* ------------------------------------------------------------------ one linear (small M) */

typedef struct {
    const Lin *L;
    int B;
    Act a;
    float *y;
} LinJob;

static void lin_job(void *p, int tid, int nt) {
    LinJob *j = (LinJob *)p;
    int n0, n1;
    split(j->L->n, tid, nt, &n0, &n1);
    lin_rows(j->L, j->B, &j->a, j->y, j->L->n, n0, n1, 0);
}

/* y (B, n) = x (B, k) @ W.T + bias, by the integer kernels (bf 0), in bf16 (bf 1) or by the
   int8 prompt form (bf 2) */
static int linear_call(const Lin *L, int B, const float *x, float *y, int nthreads, int bf) {
    LinJob j = {L, B, {0}, y};
    int nb = L->k / 32;
    void *buf = NULL;
    if (bf) {
        const size_t rows = bf == 2 ? (size_t)(B + GI8 - 1) / GI8 * GI8 : (size_t)B; /* (i8_pack's groups) */
        buf = malloc(rows * L->k * sizeof(uint16_t) + (bf == 2 ? rows * nb * 3 * sizeof(float) : 0) + 64);
        if (!buf) return 0;
        j.a.xb = (uint16_t *)buf;
        if (bf == 2) {
            j.a.pd = (float *)(j.a.xb + rows * L->k), j.a.ps = j.a.pd + rows * nb;
            j.a.pc = (int32_t *)(j.a.ps + rows * nb), j.a.i8 = 3;
        }
    } else if (L->kind != LIN_F32) {
        const int q8 = (B == 1 && act8_on()) || (L->lw && lanes8_on()); /* as lm_step: int8 inputs for one row, or the lanes */
        buf = malloc((size_t)B * L->k * (sizeof(int16_t) + q8) + (size_t)B * nb * (2 + 2 * q8) * sizeof(float) + 64);
        if (!buf) return 0;
        j.a.dx = (float *)buf;
        j.a.sx = j.a.dx + (size_t)B * nb;
        if (q8) j.a.d8 = j.a.sx + (size_t)B * nb, j.a.s8 = j.a.d8 + (size_t)B * nb;
        j.a.q = (int16_t *)(j.a.sx + (size_t)B * nb * (1 + 2 * q8));
        if (q8) j.a.q8 = (int8_t *)(j.a.q + (size_t)B * L->k);
    }
    prepare_act(L, x, B, &j.a);
    run_parallel(lin_job, &j, nthreads, NULL);
    free(buf);
    return 1;
}

/* y (B, n) = x (B, k) @ W.T + bias; returns 0 on failure (out of memory, threads) */
int lm_linear(const Lin *L, int B, const float *x, float *y, int nthreads) { return linear_call(L, B, x, y, nthreads, 0); }

/* the same in bf16 as a step of many rows multiplies (lin_rows_bf) at any B; 0 where this CPU
   or L's kind does not take it (lm_gemm_bf16(0) included) */
int lm_linear_bf16(const Lin *L, int B, const float *x, float *y, int nthreads) {
    if (!gemm_on() || !bf_covers(L) || B < 1) return 0;
    return linear_call(L, B, x, y, nthreads, 1);
}

/* the same by the int8 prompt form (lin_rows_i8) at any B; 0 where this CPU or L's kind does not
   take it (lm_gemm_bf16(0) or lm_gemm_i8(0) included) */
int lm_linear_i8(const Lin *L, int B, const float *x, float *y, int nthreads) {
    if (!gemm_on() || !gemm_i8_on() || !i8_covers(L) || B < 1) return 0;
    return linear_call(L, B, x, y, nthreads, 2);
}

/* ------------------------------------------------------------------ the decode step */

typedef struct {
    const Model *m;
    int B;
    const int64_t *tokens, *positions, *starts, *slots, *rows;
    float *logits;
    int hb; /* the head's rows: the batch's last hb (logits (hb, vocab)); B but for lm_step_last */
    Barrier bar;
    atomic_ulong cpus; /* the CPUs the step's threads hold (pin_self) */
    struct Share *share; /* a phase's counters, one line per thread (Work below) */
    int phases;
    /* scratch */
    float *x, *xn, *qkv, *att, *fco, *h, *cs, *sn, *scores, *parts;
    float *kvs; /* kv16: each thread's chunk of keys, then of values, as floats (2 CHUNK hd) */
    Act a;
    Act a2; /* fused feed-forward (step_fuse): the out-projection's inputs, made while fc reads a */
    Act *ta;   /* step_fuse, a few rows on several threads: each thread's own inputs to qkv and fc */
    float *txn; /* (threads, B, d): each thread's own normed rows */
    int nch; /* attention chunks of CHUNK slots up to the farthest row's slot */
    /* run: the rows are one cache row's consecutive slots (a prompt's chunk), attended as a
       prefill (step_run_attention): Tk keys from the row's start, kt the keys transposed by
       blocks of PA_KB ((Hkv, tkp / PA_KB, hd, PA_KB)), vf the values (Hkv, Tk, hd), pq each
       thread's query rows and outputs (2 (PA_ROWS + 8) hd) */
    int run, Tk, tkp;
    float *kt, *vf, *pq;
} Step;

#define CHUNK 128 /* cache slots per attention task */

static void rope(float *v, const float *c, const float *s, int hd) {
    int h2 = hd / 2;
    for (int j = 0; j < h2; j++) {
        float x1 = v[j], x2 = v[j + h2];
        v[j] = x1 * c[j] - x2 * s[j];
        v[j + h2] = x2 * c[j] + x1 * s[j];
    }
}

static void rms_head(float *v, int hd, const float *g, float eps) {
    float r = 1.0f / sqrtf(dot_f32(v, v, hd) / hd + eps);
    for (int i = 0; i < hd; i++) v[i] = v[i] * r * (g ? g[i] : 1.0f);
}

static void embed(const Model *m, int64_t tok, int64_t pos, float *x) {
    const int d = m->d;
    if (m->emb_kind == LIN_F32) {
        memcpy(x, (const float *)m->emb_w + (size_t)tok * d, d * sizeof(float));
    } else if (m->emb_kind >= LIN_Q4K) {
        kq_dequant_row(m->emb_kind, (const uint8_t *)m->emb_w + (size_t)tok * kq_row_bytes(m->emb_kind, d), d, x, NULL);
    } else {
        const int8_t *q = (const int8_t *)m->emb_w + (size_t)tok * d;
        const int groups = d / m->emb_gs;
        for (int i = 0; i < d; i++) x[i] = (float)q[i] * m->emb_s[(size_t)tok * groups + i / m->emb_gs];
    }
    if (m->emb_scale != 0.0f)
        for (int i = 0; i < d; i++) x[i] *= m->emb_scale;
    if (m->pos_table)
        for (int i = 0; i < d; i++) x[i] += m->pos_table[(size_t)pos * d + i];
}

/* sc[i] = q . k_i x scale for the len keys from kb: 8 keys at a time, each one fma chain, the
   8 sums reduced together (hd a multiple of 8; else one dot_f32 a key) */
static void scores(const float *q, const float *kb, int len, int hd, float scale, float *sc) {
    int i = 0;
    if (hd % 8 == 0)
        for (; i + 8 <= len; i += 8) {
            __m256 a[8];
            for (int t = 0; t < 8; t++) {
                const float *kr = kb + (size_t)(i + t) * hd;
                __m256 v = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(kr));
                for (int c = 8; c < hd; c += 8) v = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(kr + c), v);
                a[t] = v;
            }
            const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
            const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
            const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
            _mm256_storeu_ps(sc + i, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
        }
    for (; i < len; i++) sc[i] = dot_f32(q, kb + (size_t)i * hd, hd) * scale;
}

/* o = sum over i < len of w[i] v_i, o held in registers 64 floats at a time (hd a multiple of
   64; else one axpy a value) */
static void weighted_sum(const float *w, const float *vb, int len, int hd, float *o) {
    if (hd % 64) {
        memset(o, 0, hd * sizeof(float));
        for (int i = 0; i < len; i++) axpy(o, w[i], vb + (size_t)i * hd, hd);
        return;
    }
    for (int c0 = 0; c0 < hd; c0 += 64) {
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int i = 0; i < len; i++) {
            const __m256 wi = _mm256_set1_ps(w[i]);
            const float *vr = vb + (size_t)i * hd + c0;
            for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(wi, _mm256_loadu_ps(vr + 8 * c), acc[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + c0 + 8 * c, acc[c]);
    }
}

/* Attention in AVX-512 for heads of 64 (where the CPU has it; lm_att_wide(0) keeps the AVX2
   form above): the scores 8 keys at a time, each key's 64 products in 4 fmas of 16; and the
   weighted sum of values for all the query heads of one key/value head at once (up to ATT_G:
   GQA's group), each value row loaded once for the group, where the AVX2 form reads it once a
   head. The same products as the AVX2 form, summed in another order. */
#define ATT_G 4
static int att_wide = 1;
/* the AVX-512 form's scores a group of query heads at once (scores_group_512: each key row
   widened once for the group; the same bits), or 0 a head at a time (lm_att_group; -1 leaves it;
   returns it) */
static int att_group = 1;
int lm_att_group(int choice) {
    if (choice >= 0) att_group = choice ? 1 : 0;
    return att_group;
}
int lm_att_wide(int choice) {
    if (choice >= 0) att_wide = choice ? 1 : 0;
    return att_wide && lanes_512();
}

/* 16 cached elements from p as floats: float32, or IEEE halves where h (16-bit caches, one
   vcvtph2ps) */
WIDE static inline __attribute__((always_inline)) __m512 load16(const char *p, const int h) {
    return h ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)) : _mm512_loadu_ps((const float *)p);
}

/* one key's 64 products with the query q0..q3, in 16 lanes (kr: its row, halves where h) */
WIDE static inline __attribute__((always_inline)) __m512 key64(__m512 q0, __m512 q1, __m512 q2, __m512 q3, const char *kr,
                                                               const int h) {
    const int es = h ? 2 : 4;
    __m512 v = _mm512_mul_ps(q0, load16(kr, h));
    v = _mm512_fmadd_ps(q1, load16(kr + 16 * es, h), v);
    v = _mm512_fmadd_ps(q2, load16(kr + 32 * es, h), v);
    return _mm512_fmadd_ps(q3, load16(kr + 48 * es, h), v);
}

/* keys ahead whose rows the first head of a group prefetches while it scores (0: none), and the
   values' rows prefetched beside them (into L2) for the weighted sum that follows: without them
   one core streams a cache chunk far below its read bandwidth (BENCHMARKS.md, issue 31's Zen 4
   section). lm_att_pf sets it (-1 leaves it) and returns it. */
static int att_pf = 8;
int lm_att_pf(int choice) {
    if (choice >= 0) att_pf = choice;
    return att_pf;
}

/* nk: the thread's next task's keys (nlen rows, or NULL), prefetched into L2 8 rows a pass of 8
   keys here, as its values are in weighted_group: spread through a task, so that a core keeps
   its reads in flight while it computes (a burst of a whole task's lines at its start left
   one core's attention far below its read bandwidth; BENCHMARKS.md, issue 31's Zen 4 section) */
static inline __attribute__((always_inline)) void pf_keys(const char *nk, int from, int to, const int h) {
    const int rb = h ? 128 : 256; /* a row's bytes */
    for (int t = from; t < to; t++)
        for (int o = 0; o < rb; o += 64) PF_W(nk + (size_t)t * rb + o);
}

/* a task's scores for the G query heads of one key/value head at once (q: G heads of 64 in a
   row, sc: G rows of CHUNK; G = 1: one head): each key row loaded (and widened) once for the
   group. Each head's score is the same sum in the same order whatever G: 8 keys a pass, in two
   halves of 4 whose 8-lane sums go through one hadd tree (its 4 keys' own lanes), the keys past
   the last 8 by reduce_add; vb's rows prefetched att_pf keys on, nk's spread through the task. */
WIDE static inline __attribute__((always_inline)) void scores_group_t(const int G, const float *q, const char *kb, const int h, int len,
                                                                      float scale, float *sc, const char *vb, const char *nk, int nlen) {
    __m512 qv[ATT_G][4];
    for (int g = 0; g < G; g++)
        for (int c = 0; c < 4; c++) qv[g][c] = _mm512_loadu_ps(q + (size_t)g * 64 + 16 * c);
    const int pf = vb ? att_pf : 0, rb = h ? 128 : 256, es = h ? 2 : 4;
    const __m128 s4 = _mm_set1_ps(scale);
    int i = 0;
    for (; i + 8 <= len; i += 8) {
        if (nk) pf_keys(nk, i, i + 8 < nlen ? i + 8 : nlen, h);
        if (pf)
            for (int t = 0; t < 8; t++)
                for (int o = 0; o < rb; o += 64) {
                    _mm_prefetch(kb + (size_t)(i + t + pf) * rb + o, _MM_HINT_T0);
                    _mm_prefetch(vb + (size_t)(i + t) * rb + o, _MM_HINT_T1);
                }
        for (int half = 0; half < 8; half += 4) {
            __m256 a[ATT_G][4];
            for (int t = 0; t < 4; t++) {
                const char *kr = kb + (size_t)(i + half + t) * rb;
                const __m512 k0 = load16(kr, h), k1 = load16(kr + 16 * es, h), k2 = load16(kr + 32 * es, h), k3 = load16(kr + 48 * es, h);
                for (int g = 0; g < G; g++) {
                    __m512 v = _mm512_mul_ps(qv[g][0], k0);
                    v = _mm512_fmadd_ps(qv[g][1], k1, v);
                    v = _mm512_fmadd_ps(qv[g][2], k2, v);
                    v = _mm512_fmadd_ps(qv[g][3], k3, v);
                    a[g][t] = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
                }
            }
            for (int g = 0; g < G; g++) {
                const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[g][0], a[g][1]), _mm256_hadd_ps(a[g][2], a[g][3]));
                const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
                _mm_storeu_ps(sc + (size_t)g * CHUNK + i + half, _mm_mul_ps(sum, s4));
            }
        }
    }
    if (nk) pf_keys(nk, i, nlen, h);
    for (; i < len; i++)
        for (int g = 0; g < G; g++)
            sc[(size_t)g * CHUNK + i] = _mm512_reduce_add_ps(key64(qv[g][0], qv[g][1], qv[g][2], qv[g][3], kb + (size_t)i * rb, h)) * scale;
}

/* F(g) for a group of G query heads, g a constant 1..ATT_G (4: G 4 or more), then return */
#define GROUP_SWITCH(G, F)                                                                            \
    switch (G) {                                                                                      \
    case 1: F(1); return;                                                                             \
    case 2: F(2); return;                                                                             \
    case 3: F(3); return;                                                                             \
    default: F(4); return;                                                                            \
    }

/* a group's scores (scores_group_t), G <= ATT_G; kb's rows float32, or halves where h */
WIDE static void scores_group_512(int G, const float *q, const char *kb, int h, int len, float scale, float *sc, const char *vb,
                                  const char *nk, int nlen) {
#define SG(g) (h ? scores_group_t(g, q, kb, 1, len, scale, sc, vb, nk, nlen) : scores_group_t(g, q, kb, 0, len, scale, sc, vb, nk, nlen))
    GROUP_SWITCH(G, SG);
#undef SG
}

/* the largest of s[0..n) (n >= 1) */
WIDE static float max_512(const float *s, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + i));
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, s + i));
    }
    return _mm512_reduce_max_ps(m);
}

/* o[g] = sum over i < len of w[g CHUNK + i] v_i for the G heads g of a group; nv: the next
   task's values (nlen rows, or NULL), prefetched a row a value */
WIDE static inline __attribute__((always_inline)) void weighted_group(int G, const float *w, const char *vb, const int h, int len,
                                                                      float **o, const char *nv, int nlen) {
    __m512 acc[ATT_G][4];
    const int es = h ? 2 : 4;
    for (int g = 0; g < G; g++)
        for (int c = 0; c < 4; c++) acc[g][c] = _mm512_setzero_ps();
    for (int i = 0; i < len; i++) {
        const char *vr = vb + (size_t)i * 64 * es;
        if (nv && i < nlen) pf_keys(nv, i, i + 1, h);
        const __m512 v0 = load16(vr, h), v1 = load16(vr + 16 * es, h), v2 = load16(vr + 32 * es, h), v3 = load16(vr + 48 * es, h);
        for (int g = 0; g < G; g++) {
            const __m512 wi = _mm512_set1_ps(w[g * CHUNK + i]);
            acc[g][0] = _mm512_fmadd_ps(wi, v0, acc[g][0]);
            acc[g][1] = _mm512_fmadd_ps(wi, v1, acc[g][1]);
            acc[g][2] = _mm512_fmadd_ps(wi, v2, acc[g][2]);
            acc[g][3] = _mm512_fmadd_ps(wi, v3, acc[g][3]);
        }
    }
    if (nv) pf_keys(nv, len, nlen, h);
    for (int g = 0; g < G; g++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(o[g] + 16 * c, acc[g][c]);
}

WIDE static void weighted_group_512(int G, const float *w, const char *vb, int h, int len, float **o, const char *nv, int nlen) {
#define WG(g) (h ? weighted_group(g, w, vb, 1, len, o, nv, nlen) : weighted_group(g, w, vb, 0, len, o, nv, nlen))
    GROUP_SWITCH(G, WG);
#undef WG
}

/* whether a thread's attention task prefetches its next task's keys and values (1) or not (0):
   the AVX-512 form spreads them through the task (scores_group_512, weighted_group), the AVX2 form
   asks for them all at the task's start; -1 leaves it; returns it (bench/batch_step.py,
   bench/step_profile.py --switch lm_att_next) */
static int att_next = 1;
int lm_att_next(int choice) {
    if (choice >= 0) att_next = choice ? 1 : 0;
    return att_next;
}

/* 16-bit caches (Model.kv16): a row's new key and value are stored as IEEE halves (F16C's
   round to nearest even, as torch's float32 -> float16 copy rounds), half the bytes a step's
   attention streams. The AVX-512 form reads the halves where it read floats (load16: the same
   products and sums of the same values); the AVX2 form widens a task's chunk of keys and values
   to floats in its thread's scratch first (kv16_widen). Either way each row attends the same
   rounded keys and values whatever the batch. */
static inline void kv16_store(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

/* n halves of keys and of values from kh, vh into kf, vf (floats) */
static void kv16_widen(const char *kh, const char *vh, size_t n, float *kf, float *vf) {
    const uint16_t *k = (const uint16_t *)kh, *v = (const uint16_t *)vh;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(kf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + i))));
        _mm256_storeu_ps(vf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i))));
    }
    for (; i < n; i++) kf[i] = _cvtsh_ss(k[i]), vf[i] = _cvtsh_ss(v[i]);
}

/* hr[c0..c1) = the activation of the feed-forward's outputs f (ff wide; SwiGLU: gate f[0..ff),
   up f[ff..2ff)); c0 a multiple of 8, so that each column takes the same path whatever the range */
static void act_cols(const Model *m, const float *f, float *hr, int ff, int c0, int c1) {
    if (m->act == ACT_SWIGLU) { /* silu(a) b, e^-a by exp256 (~1e-7 of expf's) */
        int i = c0;
        const __m256 one = _mm256_set1_ps(1.0f), top = _mm256_set1_ps(88.0f);
        for (; i + 8 <= c1; i += 8) {
            const __m256 a = _mm256_loadu_ps(f + i);
            const __m256 e = exp256(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), a), top));
            _mm256_storeu_ps(hr + i, _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(one, e)), _mm256_loadu_ps(f + ff + i)));
        }
        for (; i < c1; i++) hr[i] = f[i] / (1.0f + expf(-f[i])) * f[ff + i];
    } else
        for (int i = c0; i < c1; i++) hr[i] = act1(m->act, f[i]);
}

/* Work shared with taking (`share`): a phase's units are each thread's own as before (`home`:
   strided, unit u to thread u % nt, or contiguous, thread o the o-th run), claimed one at a time
   from that thread's counter; a thread that has claimed all its own takes what is left of the
   others'. So a thread put off its core (a server's event loop or clients on the same cores)
   holds the phase for the unit it is in, not for its whole share. Which thread computes a unit
   changes no result: a unit's work reads the phase's inputs and writes its own outputs, with
   the thread's own scratch. lm_step_share(0) keeps each thread to its own units. */
static int step_share = 1;
int lm_step_share(int choice) {
    if (choice >= 0) step_share = choice ? 1 : 0;
    return step_share;
}

struct Share {
    atomic_int next;
    char pad[60];
};

typedef struct {
    struct Share *c; /* the phase's counters, one per thread */
    int n, nt, tid, k, strided, per;
} Work;

static Work work_start(Step *S, int *ph, int n, int strided, int tid, int nt) {
    Work w = {S->share + (size_t)(*ph)++ * nt, n, nt, tid, 0, strided, (n + nt - 1) / nt};
    return w;
}

/* the next unit this thread computes, or -1 when the phase has none left */
static inline int work_next(Work *w) {
    for (; w->k < (step_share ? w->nt : 1); w->k++) {
        const int o = (w->tid + w->k) % w->nt;
        const int j = atomic_fetch_add_explicit(&w->c[o].next, 1, memory_order_relaxed);
        if (w->strided) {
            const int u = o + j * w->nt;
            if (u < w->n) return u;
        } else {
            const int u = o * w->per + j;
            if (j < w->per && u < w->n) return u;
        }
    }
    return -1;
}

/* a linear's rows for all the step's rows, in units of 16-row groups (lanes) shared as above,
   its inputs a */
static void lin_shared_act(Step *S, int *ph, const Lin *L, const Act *a, int rows, float *y, int ystride, int accumulate,
                           float softcap, int tid, int nt) {
    const int n = L->n, groups = (n + 15) / 16, per = 8 * nt; /* ~8 units a thread */
    const int unit = 16 * ((groups + per - 1) / per), units = (n + unit - 1) / unit;
    Work w = work_start(S, ph, units, 0, tid, nt);
    for (int u; (u = work_next(&w)) >= 0;) {
        const int n0 = u * unit, n1 = n0 + unit < n ? n0 + unit : n;
        lin_rows(L, rows, a, y, ystride, n0, n1, accumulate);
        if (softcap != 0.0f)
            for (int r = 0; r < rows; r++)
                for (int i = n0; i < n1; i++) {
                    float *o = y + (size_t)r * ystride + i;
                    *o = softcap * tanhf(*o / softcap);
                }
    }
}

/* L over the step's B rows, its units shared out (lin_shared_act), its inputs S->a */
static void lin_shared(Step *S, int *ph, const Lin *L, float *y, int ystride, int accumulate, float softcap, int tid, int nt) {
    lin_shared_act(S, ph, L, &S->a, S->B, y, ystride, accumulate, softcap, tid, nt);
}

/* the norm of x into xn and its quantized input to L: with `cols` (one row on several threads)
   each thread its columns (split_blocks), else each thread its rows of the batch */
static void norm_and_prepare_from(Step *S, int *ph, const Lin *L, const float *w, const float *b, int cols, int tid,
                                  int nt, int from, Act *a);
static void norm_and_prepare(Step *S, int *ph, const Lin *L, const float *w, const float *b, int cols, int tid, int nt) {
    norm_and_prepare_from(S, ph, L, w, b, cols, tid, nt, 0, &S->a);
}

/* the same for x's rows from..B-1, normed and quantized into rows 0..B-1-from (the head's rows) */
static void norm_and_prepare_from(Step *S, int *ph, const Lin *L, const float *w, const float *b, int cols, int tid,
                                  int nt, int from, Act *a) {
    const Model *m = S->m;
    const int d = m->d;
    if (cols) { /* (one row: from is 0) */
        int b0, b1;
        split_blocks(L, d, tid, nt, &b0, &b1);
        norm_cols(S->x, S->xn, d, w, b, m->norm, m->eps, 32 * b0, 32 * b1);
        prepare_blocks(L, S->xn, 0, 1, b0, b1, a);
        return;
    }
    /* a batch's rows shared out; one row: thread 0. ph NULL: each thread its own rows only */
    const int rows = S->B - from;
    Work wk = ph ? work_start(S, ph, rows, 1, tid, nt) : (Work){0};
    for (int r = ph ? work_next(&wk) : tid; r >= 0 && r < rows; r = ph ? work_next(&wk) : r + nt) {
        norm_row(S->x + (size_t)(from + r) * d, S->xn + (size_t)r * d, d, w, b, m->norm, m->eps);
        prepare_rows(L, S->xn, r, r + 1, a);
    }
}

/* Fewer phases a step (fewer barriers: a batch's step had 11 a layer, each a wait for the
   slower thread): with step_fuse, where the batch's rows are shared out by rows (not one row's
   columns), a row's attention heads are merged and its inputs to the out-projection made in
   one unit, and the feed-forward's fc, activation and the inputs to its out-projection are one
   phase: a unit computes fc's gate and up rows for a range of columns of h (both halves for
   SwiGLU), their activation, and those columns' blocks of the out-projection's inputs (into
   a2, since fc still reads a). The same numbers, in the same order, as the phases apart: each
   output of a linear, an activation and a block of inputs depends on its own inputs only.
   lm_step_fuse(0) keeps the phases apart (-1 leaves it; returns it). */
static int step_fuse = 1;
/* the barriers the last step's threads met (lm_step_barriers: bench/batch_step.py prints it) */
static atomic_int step_barriers = 0;
int lm_step_barriers(void) { return atomic_load_explicit(&step_barriers, memory_order_relaxed); }
#define FUSE_OWN_ROWS 16 /* the most rows each thread norms for itself (norm_and_prepare_own) */
int lm_step_fuse(int choice) {
    if (choice >= 0) step_fuse = choice ? 1 : 0;
    return step_fuse;
}

/* one head's chunks merged by their maxima into the softmax of the whole (att row r, head h) */
static void merge_head(Step *S, int r, int h, int nch) {
    const int H = S->m->H, hd = S->m->hd;
    const float *parts = S->parts + ((size_t)r * H + h) * nch * (hd + 2);
    float mx = -INFINITY, sum = 0;
    for (int c = 0; c < nch; c++) mx = parts[c * (hd + 2)] > mx ? parts[c * (hd + 2)] : mx;
    float *o = S->att + (size_t)r * H * hd + (size_t)h * hd;
    memset(o, 0, hd * sizeof(float));
    for (int c = 0; c < nch; c++) {
        const float *part = parts + (size_t)c * (hd + 2);
        if (part[1] == 0.0f) continue;
        const float w = expf(part[0] - mx);
        sum += w * part[1];
        axpy(o, w, part + 2, hd);
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < hd; i++) o[i] *= inv;
}

/* the width of a fused feed-forward unit's columns of h (a multiple of the out-projection's
   input blocks), or 0 where the phases stay apart */
static int ff_unit(const Step *S, const Layer *ly, int nt) {
    const Model *m = S->m;
    const int ff = m->ff, al = 32 * prepare_unit(&ly->out);
    if (!step_fuse || !S->a2.dx || ff % al || ly->fc.n != (m->act == ACT_SWIGLU ? 2 * ff : ff)) return 0;
    const int per = 8 * nt; /* ~8 units a thread, as lin_shared_act */
    return al * ((ff / al + per - 1) / per);
}

/* every row of x normed and made ready for L by this thread alone, into its own ta and txn:
   the rows are few, so each thread doing them all costs less than a barrier's wait (the same
   numbers as norm_and_prepare's: each row's its own) */
static void norm_and_prepare_own(Step *S, const Lin *L, const float *w, const float *b, int tid) {
    const Model *m = S->m;
    const int d = m->d;
    float *xn = S->txn + (size_t)tid * S->B * d;
    for (int r = 0; r < S->B; r++) {
        norm_row(S->x + (size_t)r * d, xn + (size_t)r * d, d, w, b, m->norm, m->eps);
        prepare_rows(L, xn, r, r + 1, &S->ta[tid]);
    }
}

/* fc, the activation and the out-projection's inputs (a2) for columns of h in units of cw,
   fc's inputs a */
static void ff_fused(Step *S, int *ph, const Layer *ly, const Act *a, int cw, int tid, int nt) {
    const Model *m = S->m;
    const int B = S->B, ff = m->ff, fc_n = ly->fc.n, units = (ff + cw - 1) / cw;
    Work w = work_start(S, ph, units, 0, tid, nt);
    for (int u; (u = work_next(&w)) >= 0;) {
        const int c0 = u * cw, c1 = c0 + cw < ff ? c0 + cw : ff;
        lin_rows(&ly->fc, B, a, S->fco, fc_n, c0, c1, 0);
        if (m->act == ACT_SWIGLU) lin_rows(&ly->fc, B, a, S->fco, fc_n, ff + c0, ff + c1, 0);
        for (int r = 0; r < B; r++) act_cols(m, S->fco + (size_t)r * fc_n, S->h + (size_t)r * ff, ff, c0, c1);
        prepare_blocks(&ly->out, S->h, 0, B, c0 / 32, c1 / 32, &S->a2);
    }
}

static void step_body(Step *S, int tid, int nt);
static void step_job(void *p, int tid, int nt) {
    Step *S = (Step *)p;
    CpuMask old;
    const int pinned = step_pin && nt > 1 && pin_self(&S->cpus, &old);
    step_body(S, tid, nt);
    if (pinned) unpin_self(&old);
}

static void step_run_attention(Step *S, const Layer *ly, int *ph, int tid, int nt); /* after lm_prefill_attention */

/* the step's attention, row by row: each row's query heads over its own cache slots in chunks,
   the barrier after them included (any rows); step_body merges the chunks (merge_head) */
static void step_attention(Step *S, const Layer *ly, int *ph_, int tid, int nt) {
    const Model *m = S->m;
    const int B = S->B, H = m->H, Hkv = m->Hkv, hd = m->hd, L = m->cache_len, qkv_n = (H + 2 * Hkv) * hd, group = H / Hkv;
    const size_t bstride = (size_t)Hkv * L * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    int ph = *ph_;
    /* one query per head over the cache slots start..slot, in chunks of CHUNK slots shared
       out among the threads (a chunk's keys and values stay in cache for its group's heads);
       then each head's chunks are merged by their maxima into the softmax of the whole.
       The chunks do not depend on the thread count, so neither do the results. Tasks go
       chunk by chunk (all rows' and heads' first chunks, then the second ones...), so that
       the threads share the filled chunks: numbered row by row, a cache of 512 slots
       filled to 96 gave every task of the one filled chunk to thread 0 (an 8-row step's
       attention 3.6 ms on one thread while the other waited, BENCHMARKS.md). */
    const int nch = S->nch, wide_att = hd == 64 && group <= ATT_G && lm_att_wide(-1);
    Work watt = work_start(S, &ph, B * Hkv * nch, 1, tid, nt);
    for (int t; (t = work_next(&watt)) >= 0;) {
        const int c = t / (B * Hkv), r = (t / Hkv) % B, kh = t % Hkv;
        const int64_t first = S->starts[r];
        const int n = (int)(S->slots[r] - first + 1), c0 = c * CHUNK;
        const int len = n - c0 < CHUNK ? n - c0 : CHUNK;
        const size_t base = S->rows[r] * bstride + (size_t)kh * L * hd + (size_t)(first + c0) * hd;
        const int es = m->kv16 ? 2 : 4; /* a cached element's bytes */
        const char *kb = (const char *)ly->kc + base * es, *vb = (const char *)ly->vc + base * es;
        const char *nk = NULL, *nv = NULL; /* the thread's next task's keys and values, nlen rows */
        int nlen = 0;
        if (att_next && t + nt < B * Hkv * nch) {
            const int t2 = t + nt, c2 = t2 / (B * Hkv), r2 = (t2 / Hkv) % B, kh2 = t2 % Hkv;
            const int n2 = (int)(S->slots[r2] - S->starts[r2] + 1) - c2 * CHUNK;
            const size_t b2 = S->rows[r2] * bstride + (size_t)kh2 * L * hd + (size_t)(S->starts[r2] + c2 * CHUNK) * hd;
            nlen = n2 <= 0 ? 0 : n2 < CHUNK ? n2 : CHUNK;
            if (nlen) nk = (const char *)ly->kc + b2 * es, nv = (const char *)ly->vc + b2 * es;
            if (!wide_att || len <= 0) /* the AVX2 form (or no work here): all at once */
                for (size_t o = 0; o < (size_t)nlen * hd * es; o += 64) {
                    PF_W(nk + o);
                    PF_W(nv + o);
                }
        }
        if (m->kv16 && !wide_att && len > 0) { /* the AVX2 form reads floats: the chunk widened */
            float *kf = S->kvs + (size_t)tid * 2 * CHUNK * hd, *vf = kf + (size_t)CHUNK * hd;
            kv16_widen(kb, vb, (size_t)len * hd, kf, vf);
            kb = (const char *)kf, vb = (const char *)vf;
        }
        /* wide_att: each head's scores kept apart, the group's weighted sums at once */
        float *scg = S->scores + (size_t)tid * CHUNK * ATT_G, *og[ATT_G];
        const int grouped = wide_att && att_group && len > 0; /* the group's scores at once */
        if (grouped) scores_group_512(group, S->qkv + (size_t)r * qkv_n + (size_t)kh * group * hd, kb, m->kv16, len, scale, scg, vb, nk, nlen);
        for (int g = 0; g < group; g++) {
            const int h = kh * group + g;
            float *part = S->parts + (((size_t)r * H + h) * nch + c) * (hd + 2);
            float *o = part + 2;
            memset(o, 0, hd * sizeof(float));
            part[0] = -INFINITY, part[1] = 0.0f;
            if (len <= 0) continue;
            const float *q = S->qkv + (size_t)r * qkv_n + (size_t)h * hd;
            float *sc = scg + (wide_att ? (size_t)g * CHUNK : 0);
            if (wide_att && !grouped) scores_group_512(1, q, kb, m->kv16, len, scale, sc, g == 0 ? vb : NULL, g == 0 ? nk : NULL, nlen);
            else if (!wide_att) scores(q, (const float *)kb, len, hd, scale, sc);
            float mx = -INFINITY;
            if (wide_att) mx = max_512(sc, len);
            else
                for (int i = 0; i < len; i++) mx = sc[i] > mx ? sc[i] : mx;
            for (int i = 0; i < len; i++) sc[i] -= mx;
            softmax_unnormalised(sc, len, &part[1]);
            part[0] = mx;
            if (wide_att) og[g] = o;
            else weighted_sum(sc, (const float *)vb, len, hd, o);
        }
        if (wide_att && len > 0) weighted_group_512(group, scg, vb, m->kv16, len, og, nv, nlen);
    }
    barrier_wait(&S->bar);
    *ph_ = ph;
}

/* The slots the rows' new keys and values go to (the phase after qkv), asked for with the
   intent to write before qkv runs: each thread its own tasks of that phase (strided: tid, tid +
   nt, ...). Those lines are cold (a row's slot is written once), and the stores alone then meet
   their misses one after another (BENCHMARKS.md, issue 33's section, branch srv8).
   lm_slot_pf(0) leaves them to the stores (-1 leaves it; returns it). */
static int slot_pf = 1;
int lm_slot_pf(int choice) {
    if (choice >= 0) slot_pf = choice ? 1 : 0;
    return slot_pf;
}
__attribute__((target("prfchw"))) static void slot_prefetch(const Step *S, const Layer *ly, int tid, int nt) {
    const Model *m = S->m;
    if (!slot_pf || S->run) return;
    const int Hkv = m->Hkv, hd = m->hd, L = m->cache_len, es = m->kv16 ? 2 : 4;
    const size_t bstride = (size_t)Hkv * L * hd;
    for (int t = tid; t < S->B * Hkv; t += nt) {
        const int r = t / Hkv, kh = t % Hkv;
        const size_t at = (S->rows[r] * bstride + (size_t)kh * L * hd + (size_t)S->slots[r] * hd) * es;
        for (int o = 0; o < hd * es; o += 64) {
            _m_prefetchw((char *)ly->kc + at + o);
            _m_prefetchw((char *)ly->vc + at + o);
        }
    }
}

static void step_body(Step *S, int tid, int nt) {
    const Model *m = S->m;
    const int B = S->B, d = m->d, H = m->H, Hkv = m->Hkv, hd = m->hd, L = m->cache_len;
    const int qkv_n = (H + 2 * Hkv) * hd, group = H / Hkv, h2 = hd / 2;
    const size_t bstride = (size_t)Hkv * L * hd;
    int b0, b1, ph = 0; /* ph: the shared phases so far (Work), the same count on every thread */
    /* one row on several threads: each its columns of the norms and activations (split_blocks);
       widths a multiple of 32 (the quantized kinds' blocks) */
    const int cols = B == 1 && nt > 1 && col_split && d % 32 == 0 && (H * hd) % 32 == 0 && m->ff % 32 == 0;
    { /* each thread its rows (the same rows as its first norm below: no barrier between) */
        for (int r = tid; r < B; r += nt) {
            embed(m, S->tokens[r], S->positions[r], S->x + (size_t)r * d);
            if (m->rope)
                for (int j = 0; j < h2; j++) {
                    float ang = (float)S->positions[r] * m->inv_freq[j];
                    S->cs[r * h2 + j] = cosf(ang);
                    S->sn[r * h2 + j] = sinf(ang);
                }
        }
    }
    for (int l = 0; l < m->n_layers; l++) {
        const Layer *ly = &m->layers[l];
        /* (layer 0's row: thread 0, which embedded it, with no barrier between) */
        slot_prefetch(S, ly, tid, nt);
        const int own = !cols && S->ta && nt > 1; /* each thread its own norms (step_fuse) */
        if (own && l > 0) {
            norm_and_prepare_own(S, &ly->qkv, ly->n1w, ly->n1b, tid);
            lin_shared_act(S, &ph, &ly->qkv, &S->ta[tid], B, S->qkv, qkv_n, 0, 0.0f, tid, nt);
        } else {
            norm_and_prepare(S, l > 0 ? &ph : NULL, &ly->qkv, ly->n1w, ly->n1b, cols && l > 0, tid, nt);
            barrier_wait(&S->bar);
            lin_shared(S, &ph, &ly->qkv, S->qkv, qkv_n, 0, 0.0f, tid, nt);
        }
        barrier_wait(&S->bar);
        /* new keys and values: norm, rotate, store at the slot; the queries of their group too */
        Work wkv = work_start(S, &ph, B * Hkv, 1, tid, nt);
        for (int t; (t = work_next(&wkv)) >= 0;) {
            int r = t / Hkv, kh = t % Hkv;
            float *k = S->qkv + (size_t)r * qkv_n + (size_t)(H + kh) * hd;
            const float *v = S->qkv + (size_t)r * qkv_n + (size_t)(H + Hkv + kh) * hd;
            if (m->qk_norm) rms_head(k, hd, ly->kg, m->eps);
            if (m->rope) rope(k, S->cs + r * h2, S->sn + r * h2, hd);
            size_t at = S->rows[r] * bstride + (size_t)kh * L * hd + (size_t)S->slots[r] * hd;
            if (m->kv16) {
                kv16_store((uint16_t *)ly->kc + at, k, hd);
                kv16_store((uint16_t *)ly->vc + at, v, hd);
            } else {
                memcpy(ly->kc + at, k, hd * sizeof(float));
                memcpy(ly->vc + at, v, hd * sizeof(float));
            }
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                float *q = S->qkv + (size_t)r * qkv_n + (size_t)h * hd;
                if (m->qk_norm) rms_head(q, hd, ly->qg, m->eps);
                if (m->rope) rope(q, S->cs + r * h2, S->sn + r * h2, hd);
            }
        }
        barrier_wait(&S->bar);
        if (S->run) step_run_attention(S, ly, &ph, tid, nt); /* a prompt's chunk: blocked, as a prefill */
        else {
            step_attention(S, ly, &ph, tid, nt);
            if (!cols && step_fuse) { /* a row's heads merged, then its inputs to proj (fused) */
                Work wm = work_start(S, &ph, B, 1, tid, nt);
                for (int r; (r = work_next(&wm)) >= 0;) {
                    for (int h = 0; h < H; h++) merge_head(S, r, h, S->nch);
                    prepare_rows(&ly->proj, S->att, r, r + 1, &S->a);
                }
            } else {
                Work wmerge = work_start(S, &ph, B * H, 1, tid, nt);
                for (int t; (t = work_next(&wmerge)) >= 0;) merge_head(S, t / H, t % H, S->nch);
                barrier_wait(&S->bar);
            }
        }
        if (cols) {
            split_blocks(&ly->proj, H * hd, tid, nt, &b0, &b1);
            prepare_blocks(&ly->proj, S->att, 0, 1, b0, b1, &S->a);
        } else if (!step_fuse || S->run) { /* (a run's attention writes att itself: no merge) */
            Work wp = work_start(S, &ph, B, 1, tid, nt);
            for (int r; (r = work_next(&wp)) >= 0;) prepare_rows(&ly->proj, S->att, r, r + 1, &S->a);
        }
        barrier_wait(&S->bar);
        lin_shared(S, &ph, &ly->proj, S->x, d, 1, 0.0f, tid, nt); /* the residual: x += proj(att) */
        barrier_wait(&S->bar);
        const int fc_n = ly->fc.n, ff = m->ff, cw = cols ? 0 : ff_unit(S, ly, nt);
        const Act *fa = &S->a; /* fc's inputs */
        if (own && cw) {
            norm_and_prepare_own(S, &ly->fc, ly->n2w, ly->n2b, tid);
            fa = &S->ta[tid];
        } else {
            norm_and_prepare(S, &ph, &ly->fc, ly->n2w, ly->n2b, cols, tid, nt);
            barrier_wait(&S->bar);
        }
        if (cw) { /* fc, activation and out's inputs in one phase */
            ff_fused(S, &ph, ly, fa, cw, tid, nt);
            barrier_wait(&S->bar);
            lin_shared_act(S, &ph, &ly->out, &S->a2, B, S->x, d, 1, 0.0f, tid, nt);
            barrier_wait(&S->bar);
            continue;
        }
        lin_shared(S, &ph, &ly->fc, S->fco, fc_n, 0, 0.0f, tid, nt);
        barrier_wait(&S->bar);
        if (cols) {
            split_blocks(&ly->out, ff, tid, nt, &b0, &b1);
            act_cols(m, S->fco, S->h, ff, 32 * b0, 32 * b1);
            prepare_blocks(&ly->out, S->h, 0, 1, b0, b1, &S->a);
        } else {
            Work wa = work_start(S, &ph, B, 1, tid, nt);
            for (int r; (r = work_next(&wa)) >= 0;) {
                act_cols(m, S->fco + (size_t)r * fc_n, S->h + (size_t)r * ff, ff, 0, ff);
                prepare_rows(&ly->out, S->h, r, r + 1, &S->a);
            }
        }
        barrier_wait(&S->bar);
        lin_shared(S, &ph, &ly->out, S->x, d, 1, 0.0f, tid, nt);
        barrier_wait(&S->bar);
    }
    /* the head for the last hb rows alone (a prefill's chunk wants its last entry's logits) */
    const int hb = S->hb;
    Act ha = S->a; /* this thread's: the head's rows in bf16 only where they are enough (x and span
                      as the head's prepare_blocks sets them, where this thread prepares none) */
    if (!gemm_rows(hb)) ha.xb = NULL;
    ha.x = S->xn, ha.span = prepare_span(&m->head);
    norm_and_prepare_from(S, &ph, &m->head, m->nfw, m->nfb, cols, tid, nt, B - hb, &ha);
    barrier_wait(&S->bar);
    lin_shared_act(S, &ph, &m->head, &ha, hb, S->logits, m->vocab, 0, m->softcap, tid, nt);
}

/* a step of RUN_MIN rows or more that are one cache row's consecutive slots (a prompt's chunk)
   attends as a prefill (step_run_attention) where step_runs is 1 (the default); 0: row by row
   always. lm_step_runs(choice): -1 leaves it; returns it */
#define RUN_MIN 16
/* lm_prefill_attention's blocks (below) */
#define PA_KB 32   /* keys per block: 4 vectors */
#define PA_ROWS 48 /* query rows (positions x the group's heads) per task, at most */
#define PA_HD 256  /* widest head taken */
static int step_runs = 1;
int lm_step_runs(int choice) {
    if (choice >= 0) step_runs = choice ? 1 : 0;
    return step_runs;
}

static int max3(int a, int b, int c) { return a > b ? (a > c ? a : c) : (b > c ? b : c); }

/* whether any of m's linears is laid out in lanes (lm_pack16): its inputs then int8 too (lanes8) */
static int has_lanes(const Model *m) {
    if (m->head.lw) return 1;
    for (int l = 0; l < m->n_layers; l++) {
        const Layer *ly = &m->layers[l];
        if (ly->qkv.lw || ly->proj.lw || ly->fc.lw || ly->out.lw) return 1;
    }
    return 0;
}

/* One token per row r: writes every layer's key and value at slot slots[r] of cache row
   rows[r], attends that row's slots starts[r]..slots[r], and fills logits (B, vocab). Rows of
   one call may stand at different slots (sequences batched together, each in its own cache
   row); every weight block is read once for all of them. Returns 1, or 0 on failure. */
int lm_step_last(const Model *m, int B, const int64_t *tokens, const int64_t *positions,
                 const int64_t *starts, const int64_t *slots, const int64_t *rows, float *logits,
                 int nthreads, int keep);
int lm_step(const Model *m, int B, const int64_t *tokens, const int64_t *positions,
            const int64_t *starts, const int64_t *slots, const int64_t *rows, float *logits,
            int nthreads) {
    return lm_step_last(m, B, tokens, positions, starts, slots, rows, logits, nthreads, B);
}

/* lm_step with the head for the last `keep` rows alone (1..B): logits (keep, vocab), theirs.
   A prefill's chunk asks its last entry's; with keep < B and the rows one cache row's
   consecutive slots it multiplies in bf16 and attends blocked (lin_rows_bf, step_run_attention:
   rounded as a prefill, not row by row as lm_step rounds). */
int lm_step_last(const Model *m, int B, const int64_t *tokens, const int64_t *positions,
                 const int64_t *starts, const int64_t *slots, const int64_t *rows, float *logits,
                 int nthreads, int keep) {
    if (B < 1 || keep < 1 || keep > B) return 0;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > 256) nthreads = 256;
    const int d = m->d, hd = m->hd, qkv_n = (m->H + 2 * m->Hkv) * hd;
    const int fc_n = m->layers[0].fc.n, kmax = max3(d, m->H * hd, m->ff);
    /* the attention: a run's (step_run_attention) or row by row over the chunks of CHUNK slots
       up to the farthest row's (the chunks past it hold nothing) */
    /* the rows: one cache row's consecutive slots, of a call that wants fewer logits than rows
       (a prompt's chunk: the runtime's feed). lm_step (every row's logits: the engines' and the
       server's steps, where a rider's prompt may fill a step alone) never counts as one, so each
       of its rows is rounded as it would be alone, whatever else is in the batch. */
    int seq = keep < B && slots[0] >= starts[0];
    int64_t far = 1;
    for (int r = 0; r < B; r++) {
        far = slots[r] - starts[r] + 1 > far ? slots[r] - starts[r] + 1 : far;
        seq = seq && rows[r] == rows[0] && starts[r] == starts[0] && slots[r] == slots[0] + r;
    }
    const int run = seq && B >= RUN_MIN && step_runs && hd % 8 == 0 && hd <= PA_HD && m->H / m->Hkv <= PA_ROWS;
    const int nch_all = (m->cache_len + CHUNK - 1) / CHUNK;
    const int nch = far >= (int64_t)m->cache_len ? nch_all : (int)((far + CHUNK - 1) / CHUNK);
    const int Tk = run ? (int)far : 0, tkp = (Tk + PA_KB - 1) / PA_KB * PA_KB;
    /* a prompt's chunk of enough rows multiplies in bf16 (lin_rows_bf; seq above); every other
       step (lm_step's: a server's batch, one row) keeps the integer kernels, each row as alone */
    const int bf = seq && gemm_rows(B);
    /* in bf16, buffers never live at once share memory (the chunk's scratch grows with its
       rows): qkv and fco (a layer's qkv is read by its attention, before fc writes fco); xn, att
       and h (each made ready for its linear before the next is written); q and xb (a linear's
       inputs are one or the other, each consumed before the next linear's are made) */
    const size_t per_row = bf ? (size_t)d + (size_t)(qkv_n > fc_n ? qkv_n : fc_n) + (size_t)max3(d, m->H * hd, m->ff) + hd
                              : (size_t)2 * d + qkv_n + (size_t)m->H * hd + fc_n + m->ff + hd;
    size_t floats = (size_t)B * per_row + 2 * (size_t)B * (kmax / 32 + 1);
    if (run)
        floats += (size_t)m->Hkv * hd * (tkp + Tk) + (size_t)nthreads * 2 * (PA_ROWS + 8) * hd;
    else
        floats += (size_t)nthreads * CHUNK * ATT_G + (size_t)B * m->H * nch * (hd + 2) + (m->kv16 ? (size_t)nthreads * 2 * CHUNK * hd : 0);
    /* int8 inputs: the rows the one-row form takes (act8), or every row where linears are in lanes (lanes8) */
    const int q8 = (B < lanes_min(1) && act8_on()) || (lanes8_on() && has_lanes(m));
    if (q8) floats += 2 * (size_t)B * (kmax / 32 + 1) + ((size_t)B * kmax + 3) / 4;
    /* the int8 form's packed inputs: xb's memory (rows rounded up to GI8: B >= GI8 fits) and these */
    const int i8 = bf && B >= GI8 ? gemm_i8_on() : 0;
    if (i8) floats += 3 * (size_t)(B + GI8) * (kmax / 32);
    float *buf = (float *)malloc(floats * sizeof(float) + (size_t)B * kmax * sizeof(int16_t) + 64);
    if (!buf) return 0;
    Step S = {.m = m, .B = B, .tokens = tokens, .positions = positions, .starts = starts,
              .slots = slots, .rows = rows, .logits = logits, .hb = keep, .nch = nch, .run = run, .Tk = Tk, .tkp = tkp};
    atomic_init(&S.bar.n, nthreads);
    atomic_init(&S.bar.count, 0);
    atomic_init(&S.bar.phase, 0);
    atomic_init(&S.bar.sleepers, 0);
    atomic_init(&S.cpus, 0);
    S.phases = m->n_layers * 11 + 2; /* step_body's shared phases, at most */
    const size_t share_bytes = (size_t)S.phases * nthreads * sizeof(struct Share);
    S.share = (struct Share *)aligned_alloc(64, share_bytes);
    if (!S.share) {
        free(buf);
        return 0;
    }
    for (size_t i = 0; i < (size_t)S.phases * nthreads; i++) atomic_init(&S.share[i].next, 0);
    float *p = buf;
    S.x = p, p += (size_t)B * d;
    if (bf) { /* the shared buffers (above) */
        S.qkv = S.fco = p, p += (size_t)B * (qkv_n > fc_n ? qkv_n : fc_n);
        S.xn = S.att = S.h = p, p += (size_t)B * max3(d, m->H * hd, m->ff);
    } else {
        S.xn = p, p += (size_t)B * d;
        S.qkv = p, p += (size_t)B * qkv_n;
        S.att = p, p += (size_t)B * m->H * hd;
        S.fco = p, p += (size_t)B * fc_n;
        S.h = p, p += (size_t)B * m->ff;
    }
    S.cs = p, p += (size_t)B * (hd / 2);
    S.sn = p, p += (size_t)B * (hd / 2);
    if (run) {
        S.kt = p, p += (size_t)m->Hkv * hd * tkp;
        S.vf = p, p += (size_t)m->Hkv * hd * Tk;
        S.pq = p, p += (size_t)nthreads * 2 * (PA_ROWS + 8) * hd;
    } else {
        S.scores = p, p += (size_t)nthreads * CHUNK * ATT_G;
        S.parts = p, p += (size_t)B * m->H * nch * (hd + 2);
        if (m->kv16) S.kvs = p, p += (size_t)nthreads * 2 * CHUNK * hd;
    }
    S.a.dx = p, p += (size_t)B * (kmax / 32 + 1);
    S.a.sx = p, p += (size_t)B * (kmax / 32 + 1);
    if (q8) {
        S.a.d8 = p, p += (size_t)B * (kmax / 32 + 1);
        S.a.s8 = p, p += (size_t)B * (kmax / 32 + 1);
        S.a.q8 = (int8_t *)p, p += ((size_t)B * kmax + 3) / 4;
    }
    if (i8) {
        const size_t per = (size_t)(B + GI8) * (kmax / 32);
        S.a.pd = p, p += per;
        S.a.ps = p, p += per;
        S.a.pc = (int32_t *)p, p += per;
        S.a.i8 = i8, S.a.layers = m->layers, S.a.nl = m->n_layers;
    }
    S.a.q = (int16_t *)p;
    if (bf) S.a.xb = (uint16_t *)S.a.q; /* (the same memory: above) */
    S.a.lanes8 = q8 && lanes8_on() && has_lanes(m); /* the head too (head8) */
    float *buf2 = NULL; /* a2 (step_fuse): the same sizes as a's; not where the step multiplies in
                           bf16 (a2 and ta have no bf16 rows: those phases stay apart) */
    if (step_fuse && !bf) {
        const size_t per = (size_t)B * (kmax / 32 + 1);
        buf2 = (float *)malloc(((2 + 2 * q8) * per + (q8 ? ((size_t)B * kmax + 3) / 4 : 0)) * sizeof(float) +
                               (size_t)B * kmax * sizeof(int16_t) + 64);
        if (buf2) {
            float *p2 = buf2;
            S.a2.dx = p2, p2 += per;
            S.a2.sx = p2, p2 += per;
            if (q8) {
                S.a2.d8 = p2, p2 += per;
                S.a2.s8 = p2, p2 += per;
                S.a2.q8 = (int8_t *)p2, p2 += ((size_t)B * kmax + 3) / 4;
            }
            S.a2.q = (int16_t *)p2;
            S.a2.lanes8 = S.a.lanes8;
        }
    }
    void *buf3 = NULL; /* ta, txn: each thread's own inputs to qkv and fc (step_fuse, a few rows) */
    if (step_fuse && buf2 && nthreads > 1 && B <= FUSE_OWN_ROWS) {
        const size_t per = (size_t)B * (d / 32 + 1), nq8 = q8 ? ((size_t)B * d + 3) / 4 : 0;
        const size_t each = (size_t)B * d + (2 + 2 * q8) * per + nq8 + ((size_t)B * d + 1) / 2; /* floats */
        buf3 = malloc((size_t)nthreads * (sizeof(Act) + each * sizeof(float)) + 64);
        if (buf3) {
            S.ta = (Act *)buf3;
            float *p3 = (float *)(S.ta + nthreads);
            S.txn = p3, p3 += (size_t)nthreads * B * d;
            for (int t = 0; t < nthreads; t++) {
                Act *a = &S.ta[t];
                memset(a, 0, sizeof *a);
                a->dx = p3, p3 += per;
                a->sx = p3, p3 += per;
                if (q8) {
                    a->d8 = p3, p3 += per;
                    a->s8 = p3, p3 += per;
                    a->q8 = (int8_t *)p3, p3 += nq8;
                }
                a->q = (int16_t *)p3, p3 += ((size_t)B * d + 1) / 2;
                a->lanes8 = S.a.lanes8;
            }
        }
    }
    run_parallel(step_job, &S, nthreads, &S.bar.n);
    atomic_store_explicit(&step_barriers, (int)atomic_load(&S.bar.phase), memory_order_relaxed);
    free(buf3);
    free(buf2);
    free(S.share);
    free(buf);
    return 1;
}

/* What the loader (build.py) compares before the first call: the build's key, and the sizes and
   field offsets of the structs above, which must equal those of the ctypes structs in step.py
   (a field on one side only, or moved, is caught; sizeof catches one missing from this list). */
#ifndef LM_BUILD_KEY
#define LM_BUILD_KEY ""
#endif
const char *lm_build_key(void) { return LM_BUILD_KEY; }

typedef struct {
    const char *name;
    int64_t value;
} LayoutEntry;
#define SIZE(T) {#T, (int64_t)sizeof(T)}
#define AT(T, f) {#T "." #f, (int64_t)offsetof(T, f)}
static const LayoutEntry LAYOUT[] = {
    SIZE(Lin),         AT(Lin, kind),       AT(Lin, n),          AT(Lin, k),
    AT(Lin, gs),       AT(Lin, w),          AT(Lin, s),          AT(Lin, mn),
    AT(Lin, bias),     AT(Lin, lw),         AT(Lin, ls),         AT(Lin, lmn),
    SIZE(Layer),         AT(Layer, n1w),      AT(Layer, n1b),
    AT(Layer, n2w),    AT(Layer, n2b),      AT(Layer, qg),       AT(Layer, kg),
    AT(Layer, qkv),    AT(Layer, proj),     AT(Layer, fc),       AT(Layer, out),
    AT(Layer, kc),     AT(Layer, vc),       SIZE(Model),         AT(Model, n_layers),
    AT(Model, d),      AT(Model, H),        AT(Model, Hkv),      AT(Model, hd),
    AT(Model, ff),     AT(Model, vocab),    AT(Model, cache_len), AT(Model, norm),
    AT(Model, act),    AT(Model, qk_norm),  AT(Model, rope),     AT(Model, eps),
    AT(Model, emb_scale), AT(Model, softcap), AT(Model, emb_kind), AT(Model, emb_gs), AT(Model, kv16),
    AT(Model, emb_w),  AT(Model, emb_s),    AT(Model, pos_table), AT(Model, inv_freq),
    AT(Model, nfw),    AT(Model, nfb),      AT(Model, head),     AT(Model, layers),
    {0, 0}};
const LayoutEntry *lm_layout(void) { return LAYOUT; }

/* ------------------------------------------------------------------ a prompt's attention */

/* Causal attention over a prompt (a prefill's layers; lamina/native/prefill.py calls it where
   lamina.attention would call torch's SDPA): q (B, H, T, hd), k and v (B, Hkv, Tk, hd), each
   with its own strides and rows of hd contiguous floats (a view of the fused qkv output and of
   the KV cache, as the layer holds them); query i sees keys 0 .. i + Tk - T (queries are the
   last T of the Tk positions); out (B, T, H, hd) contiguous, the layer's (B, T, H hd) rows.

   Blocked, with the softmax online (flash attention's order): a task is QB positions of one
   row's key/value head with all G = H / Hkv query heads of its group (GQA: M = QB G query rows,
   up to PA_ROWS, reading each key and value once for the group), its rows PA_R at a time (a
   tile); for each block of PA_KB keys up to the task's last one, each tile's PA_R x PA_KB scores
   are made in registers (q x k^T, k^T laid out beforehand so that 8 keys sit in a vector; q
   prescaled), masked on the blocks that cross the diagonal, shifted by each row's running
   maximum and exponentiated (exp256), and their weighted values added to the tile's output
   rows, rescaled when a row's maximum grows. The keys and values of a block stay in L1 while
   the task's tiles use them. Tasks are taken from a counter, the longest (last) positions first,
   by torch's threads (run_parallel). A key a query may not see weighs exactly 0.

   Vectors of 8 floats both ways: the AVX-512 form (lm_patt_wide, where the CPU has it) is the
   same code compiled with AVX-512's 32 registers, which hold a 6 x 32 tile of scores where
   AVX2's 16 hold 3 x 32 (on the Zen 4 a 512-bit fma is two 256-bit halves: the wider tile is
   what pays, by halving the loads of k and v per product).

   The bf16 form (lm_patt_bf16, where the CPU has AVX-512 BF16; a prompt's chunks in the
   runtime, step_run_attention, and lm_prefill_attention_bf16): both products by `vdpbf16ps`,
   float sums, the softmax in float as above. The keys and values of each (kv head, block of
   PA_KB) rounded to bf16 (to nearest even) once, laid out in pairs shared by the group's query
   heads: the keys' pairs along the head's width (kb16: (hd / 2, PA_KB, 2), 16 keys a vector),
   the values' along the keys (vb16: (PA_KB / 2, hd, 2), 16 columns a vector); the query rows
   rounded once per task (prescaled), each pair broadcast from memory; the weights rounded
   before they are summed into l, each pair broadcast. A tile is 6 rows: 12 accumulators of
   scores, 24 of outputs (64 columns a pass). Each `vdpbf16ps` is 32 products where a 512-bit
   fma is 16: on the Zen 4 both issue one a cycle. */
/* PA_KB, PA_ROWS, PA_HD: above lm_step_last, which sizes a run's attention by them */

typedef struct {
    const float *q, *k, *v;
    float *out, *kt; /* kt: (B Hkv, tkp / PA_KB, hd, PA_KB) the keys transposed by blocks, zero past Tk */
    uint16_t *kb16, *vb16; /* the bf16 form's (bf): keys and values in pairs, (B Hkv, tkp / PA_KB, PA_KB hd) each */
    int B, H, Hkv, T, Tk, hd, G, qb, nqb, tkp, tasks, bf;
    float scale;
    int64_t qs[3], ks[3], vs[3]; /* strides in floats of batch, head, position */
    atomic_int next, failed;
} PrefillAtt;

static int patt_wide = 1;
/* the AVX-512 form (1, where the CPU has it) or the AVX2 one (0); -1 leaves it; returns the
   form in force (tests run both where both run) */
int lm_patt_wide(int choice) {
    if (choice >= 0) patt_wide = choice ? 1 : 0;
    return patt_wide && lanes_512();
}

static int patt_bf = 1;
/* choice 1: a prompt's chunks in the runtime attend in bf16 (the form above) where the CPU has
   AVX-512 BF16 and hd is a multiple of 16; 0: in float (lm_patt_wide's forms); -1 leaves it;
   returns the choice in force */
int lm_patt_bf16(int choice) {
    if (choice >= 0) patt_bf = choice ? 1 : 0;
    return patt_bf && cpu_has_bf16();
}

/* x -> bf16, to nearest even (bf16_of's rounding, one value) */
static inline uint16_t bf16_one(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (x != x) return 0x7FC0;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* a block's n keys and values (rows at strides kst, vst; n <= PA_KB, zeros after them) into their
   bf16 pairs kb16 and vb16 (the block's), rounded to nearest even; hd a multiple of 16 */
BF16 static void patt_block_bf16(const float *keys, int64_t kst, const float *vals, int64_t vst, int n, int hd,
                                 uint16_t *kb16, uint16_t *vb16) {
    uint32_t rows[PA_KB * PA_HD / 2], *kw = (uint32_t *)kb16; /* each key's pairs, then transposed */
    const int w = hd / 2;
    for (int j = 0; j < PA_KB; j++)
        for (int d = 0; d < hd; d += 16)
            _mm256_storeu_si256((__m256i *)(rows + j * w + d / 2),
                                j < n ? (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(keys + j * kst + d)) : _mm256_setzero_si256());
    for (int dp = 0; dp < w; dp++)
        for (int j = 0; j < PA_KB; j++) kw[dp * PA_KB + j] = rows[j * w + dp];
    /* values: keys 2 jp and 2 jp + 1 side by side, column by column */
    static const uint16_t order[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i mix = _mm512_loadu_si512((const void *)order);
    for (int jp = 0; jp < PA_KB / 2; jp++)
        for (int c = 0; c < hd; c += 16) {
            const __m512 e = 2 * jp < n ? _mm512_loadu_ps(vals + 2 * jp * vst + c) : _mm512_setzero_ps();
            const __m512 o = 2 * jp + 1 < n ? _mm512_loadu_ps(vals + (2 * jp + 1) * vst + c) : _mm512_setzero_ps();
            _mm512_storeu_si512((void *)(vb16 + (size_t)jp * 2 * hd + 2 * c),
                                _mm512_permutexvar_epi16(mix, (__m512i)_mm512_cvtne2ps_pbh(o, e)));
        }
}

static inline float hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* kt <- the keys of (b, kv head) transposed (bf: kb16 and vb16 <- its keys and values in bf16
   pairs), blocks of PA_KB keys shared among the threads */
static void patt_transpose_job(void *ctx, int tid, int nt) {
    const PrefillAtt *a = (const PrefillAtt *)ctx;
    const int nb = a->tkp / PA_KB, items = a->B * a->Hkv * nb, hd = a->hd;
    for (int it = (int)((long)items * tid / nt); it < (int)((long)items * (tid + 1) / nt); it++) {
        const int bh = it / nb, j0 = (it % nb) * PA_KB, b = bh / a->Hkv, h = bh % a->Hkv;
        const float *kb = a->k + b * a->ks[0] + h * a->ks[1];
        if (a->bf) {
            const size_t at = (size_t)bh * hd * a->tkp + (size_t)j0 * hd;
            patt_block_bf16(kb + j0 * a->ks[2], a->ks[2], a->v + b * a->vs[0] + h * a->vs[1] + j0 * a->vs[2], a->vs[2],
                            a->Tk - j0 < PA_KB ? a->Tk - j0 : PA_KB, hd, a->kb16 + at, a->vb16 + at);
            continue;
        }
        float *kt = a->kt + (size_t)bh * hd * a->tkp + (size_t)j0 * hd; /* (hd, PA_KB) */
        for (int j = 0; j < PA_KB; j++) {
            const float *kr = kb + (j0 + j) * a->ks[2];
            if (j0 + j < a->Tk)
                for (int d = 0; d < hd; d++) kt[d * PA_KB + j] = kr[d];
            else
                for (int d = 0; d < hd; d++) kt[d * PA_KB + j] = 0.0f;
        }
    }
}

/* O[r] <- O[r] al[r] + sum over j < nk of P[r][j] v_j, for columns c0 .. c0 + 8 NV of the R rows */
static inline __attribute__((always_inline)) void patt_pv(const int R, const int NV, const float *P, const float *al,
                                                          const float *vb, int64_t vst, int nk, float *O, int hd, int c0) {
    __m256 o[8][4];
    for (int r = 0; r < R; r++) {
        const __m256 s = _mm256_set1_ps(al[r]);
        for (int c = 0; c < NV; c++) o[r][c] = _mm256_mul_ps(s, _mm256_loadu_ps(O + r * hd + c0 + 8 * c));
    }
    for (int j = 0; j < nk; j++) {
        const float *vr = vb + j * vst + c0;
        __m256 x[4];
        for (int c = 0; c < NV; c++) x[c] = _mm256_loadu_ps(vr + 8 * c);
        for (int r = 0; r < R; r++) {
            const __m256 p = _mm256_broadcast_ss(P + r * PA_KB + j);
            for (int c = 0; c < NV; c++) o[r][c] = _mm256_fmadd_ps(p, x[c], o[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) _mm256_storeu_ps(O + r * hd + c0 + 8 * c, o[r][c]);
}

/* one tile of R query rows (Qs prescaled, R x hd; lim[r] the last key row r sees) over the
   keys kb .. kb + nk (nk <= PA_KB): the running maximum m, sum l and output O of each row */
static inline __attribute__((always_inline)) void patt_tile(const int R, const PrefillAtt *a, const float *Qs, const float *kt,
                                                            const float *vb, const int *lim, int kb, int nk, float *m,
                                                            float *l, float *O) {
    const int hd = a->hd;
    __m256 s[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) s[r][c] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const float *kr = kt + d * PA_KB;
        const __m256 k0 = _mm256_loadu_ps(kr), k1 = _mm256_loadu_ps(kr + 8), k2 = _mm256_loadu_ps(kr + 16),
                     k3 = _mm256_loadu_ps(kr + 24);
        for (int r = 0; r < R; r++) {
            const __m256 x = _mm256_broadcast_ss(Qs + r * hd + d);
            s[r][0] = _mm256_fmadd_ps(x, k0, s[r][0]);
            s[r][1] = _mm256_fmadd_ps(x, k1, s[r][1]);
            s[r][2] = _mm256_fmadd_ps(x, k2, s[r][2]);
            s[r][3] = _mm256_fmadd_ps(x, k3, s[r][3]);
        }
    }
    float P[8 * PA_KB] __attribute__((aligned(32))), al[8]; /* the scores, then their weights */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) _mm256_store_ps(P + r * PA_KB + 8 * c, s[r][c]);
    const int diag = kb + PA_KB - 1 > lim[0]; /* some key of the block hidden from some row */
    const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), ninf = _mm256_set1_ps(-INFINITY);
    float mnew[8] = {0}; /* each row's new maximum; then the factor its old sums take, e^(old - new) */
    for (int r = 0; r < R; r++) {
        float *pr = P + r * PA_KB;
        __m256 x[4];
        for (int c = 0; c < 4; c++) x[c] = _mm256_load_ps(pr + 8 * c);
        if (diag) {
            const __m256 last = _mm256_set1_ps((float)(lim[r] - kb));
            for (int c = 0; c < 4; c++) {
                const __m256 hide = _mm256_cmp_ps(_mm256_add_ps(iota, _mm256_set1_ps(8.0f * c)), last, _CMP_GT_OQ);
                _mm256_store_ps(pr + 8 * c, x[c] = _mm256_blendv_ps(x[c], ninf, hide));
            }
        }
        const float mx = hmax256(_mm256_max_ps(_mm256_max_ps(x[0], x[1]), _mm256_max_ps(x[2], x[3])));
        mnew[r] = mx > m[r] ? mx : m[r];
    }
    float old[8] = {0};
    for (int r = 0; r < R; r++) old[r] = m[r], m[r] = mnew[r];
    const __m256 o = _mm256_loadu_ps(old); /* -inf before a row's first block: its factor 0 */
    _mm256_storeu_ps(al, _mm256_and_ps(exp256(_mm256_sub_ps(o, _mm256_loadu_ps(mnew))), _mm256_cmp_ps(o, ninf, _CMP_NEQ_OQ)));
    for (int r = 0; r < R; r++) {
        float *pr = P + r * PA_KB;
        const __m256 sh = _mm256_set1_ps(mnew[r]);
        __m256 sum = _mm256_setzero_ps();
        for (int c = 0; c < 4; c++) {
            __m256 x = _mm256_load_ps(pr + 8 * c), p = exp256(_mm256_sub_ps(x, sh));
            if (diag) p = _mm256_and_ps(p, _mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ)); /* a hidden key weighs 0 */
            sum = _mm256_add_ps(sum, p);
            _mm256_store_ps(pr + 8 * c, p);
        }
        l[r] = l[r] * al[r] + hsum(sum);
    }
    int c0 = 0;
    for (; c0 + 32 <= hd; c0 += 32) patt_pv(R, 4, P, al, vb, a->vs[2], nk, O, hd, c0);
    switch ((hd - c0) / 8) {
    case 1: patt_pv(R, 1, P, al, vb, a->vs[2], nk, O, hd, c0); break;
    case 2: patt_pv(R, 2, P, al, vb, a->vs[2], nk, O, hd, c0); break;
    case 3: patt_pv(R, 3, P, al, vb, a->vs[2], nk, O, hd, c0); break;
    default: break;
    }
}

/* 2^x for x <= 0 (or -inf, a NaN: masked by the caller), relative error ~2e-6 (Taylor's degree 5
   on [-1/2, 1/2]): the bf16 form's weights, rounded to 8 bits after */
BF16 static inline __m512 exp2_512(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.3333558e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* the bf16 form's patt_pv: O[r] <- O[r] al[r] + sum over pairs jp < np of P16[r][2 jp, 2 jp + 1]
   . (v_2jp, v_2jp+1), columns c0 .. c0 + 16 NV (vb16: the block's values in pairs) */
BF16 static inline __attribute__((always_inline)) void patt_pv_bf(const int R, const int NV, const uint16_t *P16,
                                                                  const float *al, const uint16_t *vb16, int np,
                                                                  float *O, int hd, int c0) {
    __m512 o[6][4];
    for (int r = 0; r < R; r++) {
        const __m512 s = _mm512_set1_ps(al[r]);
        for (int c = 0; c < NV; c++) o[r][c] = _mm512_mul_ps(s, _mm512_loadu_ps(O + r * hd + c0 + 16 * c));
    }
    for (int jp = 0; jp < np; jp++) {
        const uint16_t *vr = vb16 + (size_t)jp * 2 * hd + 2 * c0;
        __m512bh x[4];
        for (int c = 0; c < NV; c++) x[c] = (__m512bh)_mm512_loadu_si512((const void *)(vr + 32 * c));
        for (int r = 0; r < R; r++) {
            int32_t pp;
            memcpy(&pp, P16 + r * PA_KB + 2 * jp, 4);
            const __m512bh p = (__m512bh)_mm512_set1_epi32(pp);
            for (int c = 0; c < NV; c++) o[r][c] = _mm512_dpbf16_ps(o[r][c], p, x[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(O + r * hd + c0 + 16 * c, o[r][c]);
}

/* patt_tile in bf16: Qb the R query rows (prescaled, rounded), kb16 and vb16 the block's keys
   and values in pairs */
BF16 static inline __attribute__((always_inline)) void patt_tile_bf(const int R, const PrefillAtt *a, const uint16_t *Qb,
                                                                    const uint16_t *kb16, const uint16_t *vb16,
                                                                    const int *lim, int kb, int nk, float *m, float *lv,
                                                                    float *O) {
    const int hd = a->hd;
    __m512 s[6][2];
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
    for (int dp = 0; dp < hd / 2; dp++) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512((const void *)(kb16 + dp * 2 * PA_KB)),
                       k1 = (__m512bh)_mm512_loadu_si512((const void *)(kb16 + dp * 2 * PA_KB + 32));
        for (int r = 0; r < R; r++) {
            int32_t qq;
            memcpy(&qq, Qb + r * hd + 2 * dp, 4);
            const __m512bh x = (__m512bh)_mm512_set1_epi32(qq);
            s[r][0] = _mm512_dpbf16_ps(s[r][0], x, k0);
            s[r][1] = _mm512_dpbf16_ps(s[r][1], x, k1);
        }
    }
    /* the softmax (patt_soft's, in base 2: the queries carry log2 e) on the registers: the
       weights rounded to bf16 into P16, their sums by `vdpbf16ps` with ones */
    uint16_t P16[6 * PA_KB] __attribute__((aligned(64)));
    float old[16] = {0}, mnew[16] = {0}, al[16];
    __m512 psum[6]; /* each row's weights summed by lanes: l's 16 parts (lv), added up after the task */
    const int diag = kb + PA_KB - 1 > lim[0]; /* some key of the block hidden from some row */
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);
    for (int r = 0; r < R; r++) {
        __mmask16 see0 = 0xFFFF, see1 = 0xFFFF;
        if (diag) {
            const __m512i last = _mm512_set1_epi32(lim[r] - kb);
            see0 = _mm512_cmple_epi32_mask(iota, last);
            see1 = _mm512_cmple_epi32_mask(_mm512_add_epi32(iota, _mm512_set1_epi32(16)), last);
        }
        const __m512 x0 = _mm512_mask_mov_ps(ninf, see0, s[r][0]), x1 = _mm512_mask_mov_ps(ninf, see1, s[r][1]);
        const float mx = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
        old[r] = m[r], mnew[r] = m[r] = mx > m[r] ? mx : m[r];
        const __m512 sh = _mm512_set1_ps(mnew[r]);
        const __m512 p0 = _mm512_maskz_mov_ps(see0, exp2_512(_mm512_sub_ps(x0, sh)));
        const __m512 p1 = _mm512_maskz_mov_ps(see1, exp2_512(_mm512_sub_ps(x1, sh)));
        const __m512bh pb = _mm512_cvtne2ps_pbh(p1, p0);
        _mm512_store_si512((void *)(P16 + r * PA_KB), (__m512i)pb);
        psum[r] = _mm512_dpbf16_ps(_mm512_setzero_ps(), pb, ones);
    }
    const __m512 o = _mm512_loadu_ps(old); /* -inf before a row's first block: its factor 0 */
    _mm512_storeu_ps(al, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(o, ninf, _CMP_NEQ_OQ), exp2_512(_mm512_sub_ps(o, _mm512_loadu_ps(mnew)))));
    for (int r = 0; r < R; r++) _mm512_storeu_ps(lv + 16 * r, _mm512_fmadd_ps(_mm512_loadu_ps(lv + 16 * r), _mm512_set1_ps(al[r]), psum[r]));
    const int np = (nk + 1) / 2; /* a block's last odd key: its pair's other weighs 0 (hidden) */
    int c0 = 0;
    for (; c0 + 64 <= hd; c0 += 64) patt_pv_bf(R, 4, P16, al, vb16, np, O, hd, c0);
    switch ((hd - c0) / 16) {
    case 1: patt_pv_bf(R, 1, P16, al, vb16, np, O, hd, c0); break;
    case 2: patt_pv_bf(R, 2, P16, al, vb16, np, O, hd, c0); break;
    case 3: patt_pv_bf(R, 3, P16, al, vb16, np, O, hd, c0); break;
    default: break;
    }
}

/* its tile of 6 rows, called (not inlined) from patt_task, whose other forms are not AVX-512 BF16's */
BF16 static void patt_tile_bf6(const PrefillAtt *a, const uint16_t *Qb, const uint16_t *kb16, const uint16_t *vb16,
                               const int *lim, int kb, int nk, float *m, float *lv, float *O) {
    patt_tile_bf(6, a, Qb, kb16, vb16, lim, kb, nk, m, lv, O);
}

/* one task: positions p0 .. p1 of batch row b's kv head h, with its G query heads (BF: in bf16,
   R = 6) */
static inline __attribute__((always_inline)) void patt_task(const int R, const int BF, const PrefillAtt *a, int task,
                                                            float *Qs, float *O) {
    const int hd = a->hd, G = a->G, off = a->Tk - a->T;
    const int bh = task % (a->B * a->Hkv), qblk = a->nqb - 1 - task / (a->B * a->Hkv);
    const int b = bh / a->Hkv, h = bh % a->Hkv, p0 = qblk * a->qb, p1 = p0 + a->qb < a->T ? p0 + a->qb : a->T;
    const int M = (p1 - p0) * G, tiles = (M + R - 1) / R;
    float m[PA_ROWS + 8], l[PA_ROWS + 8], lv[BF ? (PA_ROWS + 8) * 16 : 1]; /* lv: the bf16 form's l by lanes */
    int lim[PA_ROWS + 8];
    for (int r = 0; r < tiles * R; r++) { /* rows: position-major, the group's heads side by side */
        const int rr = r < M ? r : M - 1, p = p0 + rr / G, g = rr % G;
        const float *qr = a->q + b * a->qs[0] + (int64_t)(h * G + g) * a->qs[1] + p * a->qs[2];
        if (BF) /* in base 2 for the bf16 form's softmax */
            for (int d = 0; d < hd; d++) ((uint16_t *)Qs)[r * hd + d] = bf16_one(qr[d] * (a->scale * 1.44269504088896341f));
        else
            for (int d = 0; d < hd; d++) Qs[r * hd + d] = qr[d] * a->scale;
        memset(O + r * hd, 0, hd * sizeof(float));
        m[r] = -INFINITY, l[r] = 0.0f, lim[r] = p + off;
        if (BF) memset(lv + 16 * r, 0, 16 * sizeof(float));
    }
    const float *kt = a->kt + (size_t)bh * hd * a->tkp;
    const float *vb = a->v + b * a->vs[0] + h * a->vs[1];
    const int end = lim[M - 1] + 1; /* keys the task's last row sees */
    for (int kb = 0; kb < end; kb += PA_KB) {
        const int nk = end - kb < PA_KB ? end - kb : PA_KB;
        for (int t = 0; t < tiles; t++) {
            const int r0 = t * R;
            if (lim[r0 + R - 1] < kb) continue; /* every key of the block hidden from the tile */
            if (BF)
                patt_tile_bf6(a, (const uint16_t *)Qs + r0 * hd, a->kb16 + (size_t)bh * hd * a->tkp + (size_t)kb * hd,
                             a->vb16 + (size_t)bh * hd * a->tkp + (size_t)kb * hd, lim + r0, kb, nk, m + r0, lv + 16 * r0, O + r0 * hd);
            else
                patt_tile(R, a, Qs + r0 * hd, kt + (size_t)kb * hd, vb + kb * a->vs[2], lim + r0, kb, nk, m + r0, l + r0, O + r0 * hd);
        }
    }
    for (int r = 0; r < M; r++) {
        const int p = p0 + r / G, g = r % G;
        float *y = a->out + (((size_t)b * a->T + p) * a->H + h * G + g) * hd;
        if (BF) {
            float t = 0.0f;
            for (int i = 0; i < 16; i++) t += lv[16 * r + i];
            l[r] = t;
        }
        const float inv = 1.0f / l[r];
        for (int d = 0; d < hd; d++) y[d] = O[r * hd + d] * inv;
    }
}

WIDE static void patt_task_512(const PrefillAtt *a, int task, float *Qs, float *O) { patt_task(6, 0, a, task, Qs, O); }
static void patt_task_256(const PrefillAtt *a, int task, float *Qs, float *O) { patt_task(3, 0, a, task, Qs, O); }
BF16 static void patt_task_bf(const PrefillAtt *a, int task, float *Qs, float *O) { patt_task(6, 1, a, task, Qs, O); }
typedef void (*PattTask)(const PrefillAtt *, int, float *, float *);
/* the task's form: a's (bf16) or lm_patt_wide's */
static PattTask patt_form(const PrefillAtt *a) { return a->bf ? patt_task_bf : lm_patt_wide(-1) ? patt_task_512 : patt_task_256; }

static void patt_job(void *ctx, int tid, int nt) {
    (void)tid, (void)nt;
    PrefillAtt *a = (PrefillAtt *)ctx;
    const PattTask task = patt_form(a);
    const size_t n = (size_t)(PA_ROWS + 8) * a->hd; /* a task's query rows and outputs, and a tile past them */
    float *Qs = (float *)aligned_alloc(64, 2 * n * sizeof(float));
    if (!Qs) {
        atomic_store(&a->failed, 1);
        return;
    }
    for (int t = atomic_fetch_add(&a->next, 1); t < a->tasks; t = atomic_fetch_add(&a->next, 1))
        task(a, t, Qs, Qs + n);
    free(Qs);
}

/* strides: q's, k's and v's (batch, head, position) in floats. Returns 0 (out not filled) for a
   shape it does not take: hd a multiple of 8 up to PA_HD, Hkv dividing H with a group of at most
   PA_ROWS heads, 1 <= T <= Tk; or where its scratch (the keys transposed, a thread's rows)
   cannot be allocated. */
static int prefill_attention(const float *q, const float *k, const float *v, float *out, int B, int H, int Hkv, int T,
                             int Tk, int hd, float scale, const int64_t *strides, int nthreads, int bf) {
    if (B < 1 || Hkv < 1 || H % Hkv || H / Hkv > PA_ROWS || T < 1 || T > Tk || hd < 8 || hd % 8 || hd > PA_HD) return 0;
    const int tkp = (Tk + PA_KB - 1) / PA_KB * PA_KB;
    float *kt = (float *)aligned_alloc(64, (size_t)B * Hkv * hd * tkp * sizeof(float)); /* bf: kb16 and vb16 */
    if (!kt) return 0;
    PrefillAtt a = {.q = q, .k = k, .v = v, .out = out, .kt = kt, .B = B, .H = H, .Hkv = Hkv, .T = T, .Tk = Tk, .hd = hd,
                    .G = H / Hkv, .tkp = tkp, .scale = scale, .bf = bf};
    a.kb16 = (uint16_t *)kt, a.vb16 = a.kb16 + (size_t)B * Hkv * hd * tkp;
    a.qb = PA_ROWS / a.G;
    a.nqb = (T + a.qb - 1) / a.qb;
    a.tasks = a.nqb * B * Hkv;
    for (int i = 0; i < 3; i++) a.qs[i] = strides[i], a.ks[i] = strides[3 + i], a.vs[i] = strides[6 + i];
    atomic_init(&a.next, 0);
    atomic_init(&a.failed, 0);
    const int nt = nthreads < 1 ? 1 : nthreads;
    run_parallel(patt_transpose_job, &a, nt, NULL);
    run_parallel(patt_job, &a, nt, NULL);
    free(kt);
    return !atomic_load(&a.failed);
}
int lm_prefill_attention(const float *q, const float *k, const float *v, float *out, int B, int H, int Hkv, int T,
                         int Tk, int hd, float scale, const int64_t *strides, int nthreads) {
    return prefill_attention(q, k, v, out, B, H, Hkv, T, Tk, hd, scale, strides, nthreads, 0);
}
/* lm_prefill_attention in the bf16 form (the one a prompt's chunks take in the runtime, exposed
   for tests); 0 also where the form is off or not for this CPU, or hd not a multiple of 16 */
int lm_prefill_attention_bf16(const float *q, const float *k, const float *v, float *out, int B, int H, int Hkv, int T,
                              int Tk, int hd, float scale, const int64_t *strides, int nthreads) {
    if (!lm_patt_bf16(-1) || hd % 16) return 0;
    return prefill_attention(q, k, v, out, B, H, Hkv, T, Tk, hd, scale, strides, nthreads, 1);
}

/* Keys j0 .. j0 + PA_KB of kv head h (from the run's start) transposed into kt, and their values
   as floats into vf (a run's attention reads them so: lm_prefill_attention's layout); zero keys
   past Tk. bf: both in bf16 pairs instead, into kt's memory (PrefillAtt's kb16, vb16) */
static void step_run_keys(const Step *S, const Layer *ly, int h, int j0, int bf) {
    const Model *m = S->m;
    const int hd = m->hd, L = m->cache_len, Tk = S->Tk;
    const size_t at = S->rows[0] * (size_t)m->Hkv * L * hd + (size_t)h * L * hd + (size_t)S->starts[0] * hd;
    float *kt = S->kt + (size_t)h * hd * S->tkp + (size_t)j0 * hd, *vf = S->vf + ((size_t)h * Tk + j0) * hd;
    if (bf) { /* the cache's rows as they are, or widened from fp16 */
        uint16_t *kb16 = (uint16_t *)S->kt + (size_t)h * hd * S->tkp + (size_t)j0 * hd;
        const int n = Tk - j0 < PA_KB ? Tk - j0 : PA_KB;
        if (!m->kv16) {
            patt_block_bf16(ly->kc + at + (size_t)j0 * hd, hd, ly->vc + at + (size_t)j0 * hd, hd, n, hd, kb16,
                            kb16 + (size_t)m->Hkv * hd * S->tkp);
            return;
        }
        float kw[PA_KB * PA_HD], vw[PA_KB * PA_HD];
        for (int j = 0; j < n; j++) {
            const size_t e = at + (size_t)(j0 + j) * hd;
            kv16_widen((const char *)((const uint16_t *)ly->kc + e), (const char *)((const uint16_t *)ly->vc + e), hd,
                       kw + j * hd, vw + j * hd);
        }
        patt_block_bf16(kw, hd, vw, hd, n, hd, kb16, kb16 + (size_t)m->Hkv * hd * S->tkp);
        return;
    }
    float key[PA_HD];
    for (int j = 0; j < PA_KB; j++) {
        if (j0 + j >= Tk) {
            for (int d = 0; d < hd; d++) kt[d * PA_KB + j] = 0.0f;
            continue;
        }
        const size_t e = at + (size_t)(j0 + j) * hd;
        if (m->kv16) {
            kv16_widen((const char *)((const uint16_t *)ly->kc + e), (const char *)((const uint16_t *)ly->vc + e), hd, key,
                       vf + (size_t)j * hd);
        } else {
            memcpy(key, ly->kc + e, hd * sizeof(float));
            memcpy(vf + (size_t)j * hd, ly->vc + e, hd * sizeof(float));
        }
        for (int d = 0; d < hd; d++) kt[d * PA_KB + j] = key[d];
    }
}

/* A run's attention (S->run: the rows are one cache row's consecutive slots, a prompt's chunk):
   lm_prefill_attention's blocked form, the query rows of a task sharing each block of keys and
   values, where row by row (step_attention) each row reads every key again. The keys from the
   row's start (the cache's earlier ones and the run's own, stored above) transposed and the
   values widened to floats, then the tasks; the same causal attention, rounded otherwise. */
static void step_run_attention(Step *S, const Layer *ly, int *ph, int tid, int nt) {
    const Model *m = S->m;
    const int B = S->B, H = m->H, Hkv = m->Hkv, hd = m->hd, G = H / Hkv, nkb = S->tkp / PA_KB;
    const int bf = lm_patt_bf16(-1) && hd % 16 == 0;
    Work wk = work_start(S, ph, Hkv * nkb, 1, tid, nt);
    for (int t; (t = work_next(&wk)) >= 0;) step_run_keys(S, ly, t / nkb, (t % nkb) * PA_KB, bf);
    barrier_wait(&S->bar);
    PrefillAtt a = {.q = S->qkv, .v = S->vf, .out = S->att, .kt = S->kt, .B = 1, .H = H, .Hkv = Hkv, .T = B, .Tk = S->Tk,
                    .hd = hd, .G = G, .tkp = S->tkp, .scale = 1.0f / sqrtf((float)hd), .bf = bf};
    a.kb16 = (uint16_t *)S->kt, a.vb16 = a.kb16 + (size_t)Hkv * hd * S->tkp;
    a.qb = PA_ROWS / G;
    a.nqb = (B + a.qb - 1) / a.qb;
    a.tasks = a.nqb * Hkv;
    a.qs[1] = hd, a.qs[2] = (H + 2 * Hkv) * hd;
    a.vs[1] = (int64_t)S->Tk * hd, a.vs[2] = hd;
    const size_t n = (size_t)(PA_ROWS + 8) * hd;
    float *Qs = S->pq + (size_t)tid * 2 * n;
    const PattTask task = patt_form(&a);
    Work wa = work_start(S, ph, a.tasks, 1, tid, nt);
    for (int t; (t = work_next(&wa)) >= 0;) task(&a, t, Qs, Qs + n);
    barrier_wait(&S->bar);
}

/* ------------------------------------------------------------------ training attention (issue 36)

   Causal self-attention for a training step, forward and backward, for the short sequences and
   narrow heads of a small model (T <= TA_TMAX, hd a multiple of 8 up to TA_HD): one task holds
   one head's whole T x T scores in its scratch (64 x 64 floats is 16 KB), so nothing is blocked
   or rescaled online. The forward keeps each row's log-sum-exp; the backward recomputes the
   weights from it (P = e^(S - lse)), then dP = dO V^T, dS = P (dP - rowsum(P dP)), and
   dQ = s dS K, dK = s dS^T Q, dV = P^T dO (s the scale). A forward task is one query head of one
   batch row; a backward task is one key/value head of one batch row with its G query heads (GQA),
   so its dK and dV sum over the group in one fixed order. Every task runs whole on one thread,
   so the results are the same bits at any thread count. Inputs and outputs are bf16 or fp32
   (the arithmetic fp32), rows of hd elements at any (batch, head, position) strides.

   Every product is one register tile, ta_mk: C[R x 8 NV] (+)= sum over k of A(r, k) X[k][...],
   A read through two strides so that P^T and dS^T need no transposed copy; AVX-512's 32
   registers hold 6 x 32 (TA_WIDE), AVX2's 16 hold 3 x 32. */
#define TA_TMAX 256
#define TA_HD 128

typedef struct {
    const void *q, *k, *v, *dout;
    void *out, *dq, *dk, *dv;
    float *lse;
    int64_t s[7][3]; /* (batch, head, position) strides of q, k, v, out or dout, dq, dk, dv */
    int B, H, Hkv, T, hd, G, Tp, bf16, tasks;
    float scale;
    atomic_int next, failed;
} TrainAtt;

static int tatt_wide = 1;
int lm_tatt_wide(int choice) {
    if (choice >= 0) tatt_wide = choice ? 1 : 0;
    return tatt_wide && lanes_512();
}

/* 8 elements from bf16 or float32 as floats; 8 floats stored as bf16 (rounded to nearest even,
   as torch's casts round; a NaN stays a NaN) or float32 */
static inline __attribute__((always_inline)) __m256 ta_ld8(const void *p, int64_t i, int bf16) {
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    return _mm256_loadu_ps((const float *)p + i);
}
static inline __attribute__((always_inline)) void ta_st8(void *p, int64_t i, __m256 x, int bf16) {
    if (!bf16) {
        _mm256_storeu_ps((float *)p + i, x);
        return;
    }
    const __m256i u = _mm256_castps_si256(x), one = _mm256_set1_epi32(1);
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), one)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
}

/* dst[i][d] = src row i times mul (rows of hd floats) */
static inline __attribute__((always_inline)) void ta_load(float *dst, const void *src, int64_t base, int64_t st, int T, int hd, int bf16,
                                                          float mul) {
    const __m256 m = _mm256_set1_ps(mul);
    for (int i = 0; i < T; i++)
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(dst + (size_t)i * hd + d, _mm256_mul_ps(m, ta_ld8(src, base + i * st + d, bf16)));
}

static inline __attribute__((always_inline)) void ta_tr8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* dst (hd x Tp) = src^T times mul for src rows (T x hd, at base + i st), zero past T; and where
   rows is not NULL, rows (T x hd) = src as floats */
static inline __attribute__((always_inline)) void ta_load_t(float *rows, float *dst, const void *src, int64_t base, int64_t st, int T,
                                                            int hd, int Tp, int bf16, float mul) {
    const __m256 m = _mm256_set1_ps(mul);
    for (int i0 = 0; i0 < Tp; i0 += 8)
        for (int d0 = 0; d0 < hd; d0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) {
                r[j] = i0 + j < T ? ta_ld8(src, base + (i0 + j) * st + d0, bf16) : _mm256_setzero_ps();
                if (rows && i0 + j < T) _mm256_storeu_ps(rows + (size_t)(i0 + j) * hd + d0, r[j]);
            }
            ta_tr8(r);
            for (int j = 0; j < 8; j++) _mm256_storeu_ps(dst + (size_t)(d0 + j) * Tp + i0, _mm256_mul_ps(m, r[j]));
        }
}

static inline __attribute__((always_inline)) void ta_store(void *dst, int64_t base, int64_t st, const float *src, int T, int hd, int bf16) {
    for (int i = 0; i < T; i++)
        for (int d = 0; d < hd; d += 8) ta_st8(dst, base + i * st + d, _mm256_loadu_ps(src + (size_t)i * hd + d), bf16);
}

static inline __attribute__((always_inline)) void ta_mk(const int R, const int NV, const float *A, int64_t ars, int64_t acs,
                                                        const float *X, int64_t xs, int k0, int k1, float *C, int64_t cs, int add) {
    __m256 c[6][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) c[r][v] = add ? _mm256_loadu_ps(C + r * cs + 8 * v) : _mm256_setzero_ps();
    for (int k = k0; k < k1; k++) {
        const float *xk = X + (int64_t)k * xs;
        __m256 x[4];
        for (int v = 0; v < NV; v++) x[v] = _mm256_loadu_ps(xk + 8 * v);
        for (int r = 0; r < R; r++) {
            const __m256 a = _mm256_broadcast_ss(A + r * ars + (int64_t)k * acs);
            for (int v = 0; v < NV; v++) c[r][v] = _mm256_fmadd_ps(a, x[v], c[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(C + r * cs + 8 * v, c[r][v]);
}

#define TA_NV(R)                                                        \
    switch (nv) {                                                       \
    case 1: ta_mk(R, 1, A, ars, acs, X, xs, k0, k1, C, cs, add); break; \
    case 2: ta_mk(R, 2, A, ars, acs, X, xs, k0, k1, C, cs, add); break; \
    case 3: ta_mk(R, 3, A, ars, acs, X, xs, k0, k1, C, cs, add); break; \
    default: ta_mk(R, 4, A, ars, acs, X, xs, k0, k1, C, cs, add); break; \
    }

static inline __attribute__((always_inline)) void ta_mk_any(const int RM, int R, int nv, const float *A, int64_t ars, int64_t acs,
                                                            const float *X, int64_t xs, int k0, int k1, float *C, int64_t cs,
                                                            int add) {
    if (R == RM) { /* the common case, R a constant */
        TA_NV(RM)
        return;
    }
    switch (R) {
    case 1: TA_NV(1) break;
    case 2: TA_NV(2) break;
    case 3: TA_NV(3) break;
    case 4: TA_NV(4) break;
    default: TA_NV(5) break;
    }
}

/* C (T x Tp) = A (T x hd) Xt (hd x Tp), each row's columns up to its tile's last row's (causal) */
static inline __attribute__((always_inline)) void ta_scores(const int RM, const float *A, const float *Xt, float *C, int T, int Tp, int hd) {
    for (int i0 = 0; i0 < T; i0 += RM) {
        const int R = T - i0 < RM ? T - i0 : RM, ncol = (i0 + R + 7) / 8 * 8;
        for (int c = 0; c < ncol; c += 32) {
            const int nv = (ncol - c) / 8 < 4 ? (ncol - c) / 8 : 4;
            ta_mk_any(RM, R, nv, A + (size_t)i0 * hd, hd, 1, Xt + c, Tp, 0, hd, C + (size_t)i0 * Tp + c, Tp, 0);
        }
    }
}

/* C (T x hd) (+)= P X for P (T x Tp) lower triangular (zero past the diagonal): row i uses k <= i;
   or, transposed, C = P^T X: row j uses k >= j */
static inline __attribute__((always_inline)) void ta_pv(const int RM, const float *P, const float *X, float *C, int T, int Tp, int hd,
                                                        int add, int transposed) {
    for (int i0 = 0; i0 < T; i0 += RM) {
        const int R = T - i0 < RM ? T - i0 : RM;
        for (int c = 0; c < hd; c += 32) {
            const int nv = (hd - c) / 8 < 4 ? (hd - c) / 8 : 4;
            if (transposed)
                ta_mk_any(RM, R, nv, P + i0, 1, Tp, X + c, hd, i0, T, C + (size_t)i0 * hd + c, hd, add);
            else
                ta_mk_any(RM, R, nv, P + (size_t)i0 * Tp, Tp, 1, X + c, hd, 0, i0 + R, C + (size_t)i0 * hd + c, hd, add);
        }
    }
}

/* masks (lanes j > i) of the 8 columns from j */
static inline __m256 ta_keep(int j, int i) {
    const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmp_ps(_mm256_add_ps(iota, _mm256_set1_ps((float)j)), _mm256_set1_ps((float)i), _CMP_LE_OQ);
}

/* row i of the scores -> its weights (zero past i, to Tp); returns its log-sum-exp */
static inline __attribute__((always_inline)) float ta_softmax_row(float *p, int i, int Tp) {
    const int n = (i + 8) / 8 * 8;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 mx = ninf, sum = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        const __m256 x = _mm256_blendv_ps(ninf, _mm256_loadu_ps(p + j), ta_keep(j, i));
        _mm256_storeu_ps(p + j, x);
        mx = _mm256_max_ps(mx, x);
    }
    const float m = hmax256(mx);
    const __m256 vm = _mm256_set1_ps(m);
    for (int j = 0; j < n; j += 8) {
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(p + j), vm)), ta_keep(j, i));
        _mm256_storeu_ps(p + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    const float s = hsum(sum);
    const __m256 inv = _mm256_set1_ps(1.0f / s);
    for (int j = 0; j < n; j += 8) _mm256_storeu_ps(p + j, _mm256_mul_ps(_mm256_loadu_ps(p + j), inv));
    for (int j = n; j < Tp; j++) p[j] = 0.0f;
    return m + logf(s);
}

/* row i: p <- e^(s - lse) (zero past i), d (dP) <- scale p (dP - sum_j p dP) (zero past i) */
static inline __attribute__((always_inline)) void ta_grad_row(float *p, float *d, int i, int Tp, float lse, float scale) {
    const int n = (i + 8) / 8 * 8;
    const __m256 vl = _mm256_set1_ps(lse);
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        const __m256 keep = ta_keep(j, i);
        const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_and_ps(_mm256_loadu_ps(p + j), keep), vl)), keep);
        const __m256 g = _mm256_and_ps(_mm256_loadu_ps(d + j), keep);
        _mm256_storeu_ps(p + j, e);
        _mm256_storeu_ps(d + j, g);
        acc = _mm256_fmadd_ps(e, g, acc);
    }
    const __m256 D = _mm256_set1_ps(hsum(acc)), s = _mm256_set1_ps(scale);
    for (int j = 0; j < n; j += 8) {
        const __m256 e = _mm256_loadu_ps(p + j);
        _mm256_storeu_ps(d + j, _mm256_mul_ps(_mm256_mul_ps(s, e), _mm256_sub_ps(_mm256_loadu_ps(d + j), D)));
    }
    for (int j = n; j < Tp; j++) p[j] = d[j] = 0.0f;
}

/* the scratch a task uses, in floats (a multiple of 16) */
static size_t ta_scratch(int Tp, int hd) { return ((size_t)10 * Tp * hd + (size_t)2 * Tp * Tp + 15) / 16 * 16; }

static inline __attribute__((always_inline)) void ta_fwd_task(const int RM, const TrainAtt *a, int task, float *w) {
    const int T = a->T, hd = a->hd, Tp = a->Tp, bf = a->bf16;
    const int b = task / a->H, h = task % a->H, hk = h / a->G;
    const size_t m = (size_t)Tp * hd;
    float *Q = w, *K = Q + m, *Kt = K + m, *V = Kt + m, *O = V + m, *P = O + m;
    ta_load(Q, a->q, b * a->s[0][0] + h * a->s[0][1], a->s[0][2], T, hd, bf, 1.0f);
    ta_load_t(NULL, Kt, a->k, b * a->s[1][0] + hk * a->s[1][1], a->s[1][2], T, hd, Tp, bf, a->scale);
    ta_load(V, a->v, b * a->s[2][0] + hk * a->s[2][1], a->s[2][2], T, hd, bf, 1.0f);
    ta_scores(RM, Q, Kt, P, T, Tp, hd);
    float *lse = a->lse + (size_t)task * T;
    for (int i = 0; i < T; i++) lse[i] = ta_softmax_row(P + (size_t)i * Tp, i, Tp);
    ta_pv(RM, P, V, O, T, Tp, hd, 0, 0);
    ta_store(a->out, b * a->s[3][0] + h * a->s[3][1], a->s[3][2], O, T, hd, bf);
}

static inline __attribute__((always_inline)) void ta_bwd_task(const int RM, const TrainAtt *a, int task, float *w) {
    const int T = a->T, hd = a->hd, Tp = a->Tp, bf = a->bf16;
    const int b = task / a->Hkv, hk = task % a->Hkv;
    const size_t m = (size_t)Tp * hd;
    float *K = w, *Kt = K + m, *Vt = Kt + m, *Q = Vt + m, *dO = Q + m, *dQ = dO + m, *dK = dQ + m, *dV = dK + m;
    float *P = dV + m, *dS = P + (size_t)Tp * Tp;
    ta_load_t(K, Kt, a->k, b * a->s[1][0] + hk * a->s[1][1], a->s[1][2], T, hd, Tp, bf, a->scale);
    ta_load_t(NULL, Vt, a->v, b * a->s[2][0] + hk * a->s[2][1], a->s[2][2], T, hd, Tp, bf, 1.0f);
    for (int g = 0; g < a->G; g++) {
        const int h = hk * a->G + g;
        ta_load(Q, a->q, b * a->s[0][0] + h * a->s[0][1], a->s[0][2], T, hd, bf, 1.0f);
        ta_load(dO, a->dout, b * a->s[3][0] + h * a->s[3][1], a->s[3][2], T, hd, bf, 1.0f);
        ta_scores(RM, Q, Kt, P, T, Tp, hd);
        ta_scores(RM, dO, Vt, dS, T, Tp, hd);
        const float *lse = a->lse + ((size_t)b * a->H + h) * T;
        for (int i = 0; i < T; i++) ta_grad_row(P + (size_t)i * Tp, dS + (size_t)i * Tp, i, Tp, lse[i], a->scale);
        ta_pv(RM, dS, K, dQ, T, Tp, hd, 0, 0);
        ta_store(a->dq, b * a->s[4][0] + h * a->s[4][1], a->s[4][2], dQ, T, hd, bf);
        ta_pv(RM, P, dO, dV, T, Tp, hd, g > 0, 1);
        ta_pv(RM, dS, Q, dK, T, Tp, hd, g > 0, 1);
    }
    ta_store(a->dk, b * a->s[5][0] + hk * a->s[5][1], a->s[5][2], dK, T, hd, bf);
    ta_store(a->dv, b * a->s[6][0] + hk * a->s[6][1], a->s[6][2], dV, T, hd, bf);
}

WIDE static void ta_fwd_512(const TrainAtt *a, int t, float *w) { ta_fwd_task(6, a, t, w); }
static void ta_fwd_256(const TrainAtt *a, int t, float *w) { ta_fwd_task(3, a, t, w); }
WIDE static void ta_bwd_512(const TrainAtt *a, int t, float *w) { ta_bwd_task(6, a, t, w); }
static void ta_bwd_256(const TrainAtt *a, int t, float *w) { ta_bwd_task(3, a, t, w); }

/* a thread's scratch, kept from call to call (a step calls twice a layer; at most ~1.8 MB) */
static __thread float *ta_buf;
static __thread size_t ta_cap;

static void ta_job(TrainAtt *a, int backward) {
    const int wide = lm_tatt_wide(-1);
    const size_t need = ta_scratch(a->Tp, a->hd);
    if (ta_cap < need) {
        free(ta_buf);
        ta_buf = (float *)aligned_alloc(64, need * sizeof(float));
        ta_cap = ta_buf ? need : 0;
    }
    float *w = ta_buf;
    if (!w) {
        atomic_store(&a->failed, 1);
        return;
    }
    for (int t = atomic_fetch_add(&a->next, 1); t < a->tasks; t = atomic_fetch_add(&a->next, 1)) {
        if (backward)
            (wide ? ta_bwd_512 : ta_bwd_256)(a, t, w);
        else
            (wide ? ta_fwd_512 : ta_fwd_256)(a, t, w);
    }
}
static void ta_fwd_job(void *ctx, int tid, int nt) { (void)tid, (void)nt, ta_job((TrainAtt *)ctx, 0); }
static void ta_bwd_job(void *ctx, int tid, int nt) { (void)tid, (void)nt, ta_job((TrainAtt *)ctx, 1); }

static int ta_shape_ok(int B, int H, int Hkv, int T, int hd) {
    return B >= 1 && Hkv >= 1 && H >= Hkv && H % Hkv == 0 && T >= 1 && T <= TA_TMAX && hd >= 8 && hd % 8 == 0 && hd <= TA_HD;
}

/* Run a forward's or backward's tasks: its n tensors' (batch, head, position) strides copied in,
   then every task on the pool; 1 unless a task failed */
static int ta_run(TrainAtt *a, const int64_t *strides, int n, JobFn job, int nthreads) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 3; j++) a->s[i][j] = strides[3 * i + j];
    atomic_init(&a->next, 0);
    atomic_init(&a->failed, 0);
    run_parallel(job, a, nthreads < 1 ? 1 : nthreads, NULL);
    return !atomic_load(&a->failed);
}

/* The forward: out (rows of hd) and lse (B, H, T) float32. strides: 4 x (batch, head, position)
   of q, k, v, out, in elements; bf16: every tensor but lse is bf16 (else float32). Returns 0
   (nothing written) for a shape it does not take (see ta_shape_ok) or where scratch fails. */
int lm_train_attention_fwd(const void *q, const void *k, const void *v, void *out, float *lse, int B, int H, int Hkv, int T,
                           int hd, float scale, int bf16, const int64_t *strides, int nthreads) {
    if (!ta_shape_ok(B, H, Hkv, T, hd)) return 0;
    TrainAtt a = {.q = q, .k = k, .v = v, .out = out, .lse = lse, .B = B, .H = H, .Hkv = Hkv, .T = T, .hd = hd,
                  .G = H / Hkv, .Tp = (T + 7) / 8 * 8, .bf16 = bf16 ? 1 : 0, .tasks = B * H, .scale = scale};
    return ta_run(&a, strides, 4, ta_fwd_job, nthreads);
}

/* The backward: dq, dk, dv from dout and the forward's lse. strides: 7 x (batch, head, position)
   of q, k, v, dout, dq, dk, dv. Returns 0 as the forward does. */
int lm_train_attention_bwd(const void *q, const void *k, const void *v, const void *dout, const float *lse, void *dq, void *dk,
                           void *dv, int B, int H, int Hkv, int T, int hd, float scale, int bf16, const int64_t *strides,
                           int nthreads) {
    if (!ta_shape_ok(B, H, Hkv, T, hd)) return 0;
    TrainAtt a = {.q = q, .k = k, .v = v, .dout = dout, .dq = dq, .dk = dk, .dv = dv, .lse = (float *)lse, .B = B, .H = H,
                  .Hkv = Hkv, .T = T, .hd = hd, .G = H / Hkv, .Tp = (T + 7) / 8 * 8, .bf16 = bf16 ? 1 : 0, .tasks = B * Hkv,
                  .scale = scale};
    return ta_run(&a, strides, 7, ta_bwd_job, nthreads);
}

/* ------------------------------------------------------------------ a prefill's linears in int8 */

/* A long call (a prefill) may multiply int8 by int8 (torch._int_mm, AVX-512 VNNI in oneDNN;
   lamina/quant/int8mm.py). The input is smoothed first (SmoothQuant): input column i divided by
   c[i], the weights' column i multiplied by it (the product unchanged), c from the two's column
   maxima (lm_colmax_i8 for the weights', kept; lm_colmax for the input's), which moves the
   input's outlier channels into the weights. Then the weights are made int8 per call, one float
   scale per output row, into a reused buffer (lm_dequant_i8: a row dequantized into floats,
   times c, rounded as `(w / s).round()` with s = max|w| / 127 clamped at 1e-12, torch's own
   steps); the input rows the same way (lm_quant_rows_i8, times 1 / c); the int32 products scaled
   back by the two scales, plus the bias (lm_i8_scale, in place over the products). */

/* k floats -> k int8 q = round(x / s) (half to even), s = max(max|x| / 127, 1e-12), returned */
static float row_to_i8(const float *x, int k, int8_t *q) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 mx = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= k; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(abs, _mm256_loadu_ps(x + i)));
    float amax = hmax256(mx);
    for (; i < k; i++) amax = fmaxf(amax, fabsf(x[i]));
    float s = amax / 127.0f;
    if (!(s >= 1e-12f)) s = 1e-12f;
    const __m256 vs = _mm256_set1_ps(s);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (i = 0; i + 32 <= k; i += 32) {
        __m256i v[4];
        for (int e = 0; e < 4; e++) v[e] = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + i + 8 * e), vs));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(q + i), _mm256_permutevar8x32_epi32(p, order));
    }
    for (; i < k; i++) {
        const float r = nearbyintf(x[i] / s);
        q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
    }
    return s;
}

typedef struct {
    int kind, n, k, gs; /* kind: GGML's (LIN_Q4K ..), LIN_INT8 (q * scale) or LIN_INT4 (q scale + mn) */
    const uint8_t *w;
    const float *scale, *mn;
    const float *c; /* column multipliers, or NULL */
    int8_t *y;      /* NULL: the column maxima of |w| into cmax instead */
    float *ys, *cmax; /* cmax: k floats per thread */
    atomic_int failed; /* a thread's scratch could not be allocated */
    const int *cols; /* ncols columns whose exact floats go to wcols[r ncols + j] (before c) */
    int ncols, m, topk; /* topk entries per input row (m rows) set aside: idx, val [j m + row] */
    float *wcols;
    const int *idx;
    const float *val;
    float *corr; /* (n, m): row r's sum over j of val[j m + i] (w c)[r, idx[j m + i]] */
} I8Job;

/* lamina's int4 row (nibbles, low first) -> floats q s + mn per gs (a multiple of 32), a product
   then a sum, each rounded (as Int4Linear.dequantized) */
static void i4_dequant_row(const uint8_t *p, const float *s, const float *mn, int k, int gs, float *y) {
    const __m128i low = _mm_set1_epi8(15);
    for (int i = 0; i < k; i += 32) {
        const __m256 sc = _mm256_set1_ps(s[i / gs]), m = _mm256_set1_ps(mn[i / gs]);
        const __m128i b = _mm_loadu_si128((const __m128i *)(p + i / 2));
        const __m128i lo = _mm_and_si128(b, low), hi = _mm_and_si128(_mm_srli_epi16(b, 4), low);
        const __m128i q[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)}; /* in order */
        for (int e = 0; e < 4; e++) {
            const __m128i part = e & 1 ? _mm_srli_si128(q[e / 2], 8) : q[e / 2];
            __m256 v = _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part)));
            __asm__("" : "+x"(v)); /* no fma */
            _mm256_storeu_ps(y + i + 8 * e, _mm256_add_ps(v, m));
        }
    }
}

/* lamina's int8 row -> floats q * scale per gs (a multiple of 16 here) */
static void i8_dequant_row(const int8_t *q, const float *s, int k, int gs, float *y) {
    for (int i = 0; i < k; i += 16) {
        const __m256 sc = _mm256_set1_ps(s[i / gs]);
        const __m128i b = _mm_loadu_si128((const __m128i *)(q + i));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))));
        _mm256_storeu_ps(y + i + 8, _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))));
    }
}

static void i8_job(void *ctx, int tid, int nt) {
    I8Job *j = (I8Job *)ctx;
    const int k = j->k, groups = j->gs ? k / j->gs : 0;
    float *f = (float *)malloc((size_t)k * sizeof(float));
    if (!f) {
        atomic_store(&j->failed, 1);
        return;
    }
    const size_t rb = j->kind == LIN_INT8 ? (size_t)k : j->kind == LIN_INT4 ? (size_t)k / 2 : kq_row_bytes(j->kind, k);
    for (int r = (int)((long)j->n * tid / nt); r < (int)((long)j->n * (tid + 1) / nt); r++) {
        const uint8_t *row = j->w + (size_t)r * rb;
        if (j->kind == LIN_INT8) {
            i8_dequant_row((const int8_t *)row, j->scale + (size_t)r * groups, k, j->gs, f);
        } else if (j->kind == LIN_INT4) {
            i4_dequant_row(row, j->scale + (size_t)r * groups, j->mn + (size_t)r * groups, k, j->gs, f);
        } else {
            kq_dequant_row(j->kind, row, k, f, NULL);
        }
        if (!j->y) {
            float *mx = j->cmax + (size_t)tid * k;
            for (int i = 0; i < k; i++) mx[i] = fmaxf(mx[i], fabsf(f[i]));
            continue;
        }
        for (int e = 0; e < j->ncols; e++) j->wcols[(size_t)r * j->ncols + e] = f[j->cols[e]];
        if (j->c)
            for (int i = 0; i < k; i++) f[i] *= j->c[i];
        if (j->topk > 0) { /* the input rows' set-aside entries times this row, exactly */
            float *out = j->corr + (size_t)r * j->m;
            int i = 0;
            for (; i + 8 <= j->m; i += 8) {
                __m256 a = _mm256_setzero_ps();
                for (int e = 0; e < j->topk; e++) {
                    const size_t o = (size_t)e * j->m + i;
                    const __m256i ix = _mm256_loadu_si256((const __m256i *)(j->idx + o));
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(j->val + o), _mm256_i32gather_ps(f, ix, 4), a);
                }
                _mm256_storeu_ps(out + i, a);
            }
            for (; i < j->m; i++) {
                float a = 0.0f;
                for (int e = 0; e < j->topk; e++) a += j->val[(size_t)e * j->m + i] * f[j->idx[(size_t)e * j->m + i]];
                out[i] = a;
            }
        }
        j->ys[r] = row_to_i8(f, k, j->y + (size_t)r * k);
    }
    free(f);
}

static int i8_takes(int kind, const float *scale, const float *mn, int n, int k, int gs) {
    if (n < 1 || k < 1) return 0;
    if (kind == LIN_INT8 || kind == LIN_INT4)
        return gs >= 16 && gs % (kind == LIN_INT4 ? 32 : 16) == 0 && k % gs == 0 && scale && (kind == LIN_INT8 || mn);
    return kind >= LIN_Q4K && kind <= LIN_Q5_1 && k % kq_per(kind) == 0;
}

/* a linear's rows (n, k), times c[i] in column i where c is given -> int8 y (n, k) and a scale
   per row ys (n,): y ys ~ w c. kind LIN_INT8: w int8 with a float scale per gs (16k) of a row;
   LIN_INT4: w nibbles (n, k / 2) with scale and mn per gs (32k); GGML's kinds: w its blocks (scale,
   mn, gs unused). Returns 0 for what it does not take (or where a thread's scratch row could
   not be allocated). Where ncols > 0, the exact floats of columns cols[0 .. ncols) (before c)
   go to wcols (n, ncols) too; where topk > 0, the m input rows' set-aside entries (lm_quant_rows_i8:
   idx and val, (topk, m)) times the rows of w c go to corr (n, m), each row's products summed. */
int lm_dequant_i8(int kind, const void *w, const float *scale, const float *mn, int n, int k, int gs, const float *c,
                  int8_t *y, float *ys, const int *cols, int ncols, float *wcols, int m, int topk, const int *idx,
                  const float *val, float *corr, int nthreads) {
    if (!i8_takes(kind, scale, mn, n, k, gs) || !y || !ys) return 0;
    if ((ncols > 0 && (!cols || !wcols)) || (topk > 0 && (m < 1 || !idx || !val || !corr))) return 0;
    for (int e = 0; e < ncols; e++)
        if (cols[e] < 0 || cols[e] >= k) return 0;
    I8Job j = {kind, n, k, gs, (const uint8_t *)w, scale, mn, c, y, ys, NULL};
    j.cols = cols, j.ncols = ncols > 0 ? ncols : 0, j.wcols = wcols;
    j.m = m, j.topk = topk > 0 ? topk : 0, j.idx = idx, j.val = val, j.corr = corr;
    atomic_init(&j.failed, 0);
    run_parallel(i8_job, &j, nthreads < 1 ? 1 : nthreads, NULL);
    return !atomic_load(&j.failed);
}

static void reduce_max(const float *part, int parts, int k, float *out) {
    for (int i = 0; i < k; i++) {
        float m = 0.0f;
        for (int t = 0; t < parts; t++) m = fmaxf(m, part[(size_t)t * k + i]);
        out[i] = m;
    }
}

/* the same linear's column maxima of |w| (k floats) into out */
int lm_colmax_i8(int kind, const void *w, const float *scale, const float *mn, int n, int k, int gs, float *out,
                 int nthreads) {
    const int nt = nthreads < 1 ? 1 : nthreads;
    if (!i8_takes(kind, scale, mn, n, k, gs)) return 0;
    float *part = (float *)calloc((size_t)nt * k, sizeof(float));
    if (!part) return 0;
    I8Job j = {kind, n, k, gs, (const uint8_t *)w, scale, mn, NULL, NULL, NULL, part};
    j.ncols = j.topk = 0;
    atomic_init(&j.failed, 0);
    run_parallel(i8_job, &j, nt, NULL);
    if (!atomic_load(&j.failed)) reduce_max(part, nt, k, out);
    free(part);
    return !atomic_load(&j.failed);
}

typedef struct {
    const float *x;
    int m, k;
    float *part;
} ColJob;

static void colmax_job(void *ctx, int tid, int nt) {
    const ColJob *j = (const ColJob *)ctx;
    float *mx = j->part + (size_t)tid * j->k;
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int r = (int)((long)j->m * tid / nt); r < (int)((long)j->m * (tid + 1) / nt); r++) {
        const float *x = j->x + (size_t)r * j->k;
        int i = 0;
        for (; i + 8 <= j->k; i += 8)
            _mm256_storeu_ps(mx + i, _mm256_max_ps(_mm256_loadu_ps(mx + i), _mm256_and_ps(abs, _mm256_loadu_ps(x + i))));
        for (; i < j->k; i++) mx[i] = fmaxf(mx[i], fabsf(x[i]));
    }
}

/* float rows x (m, k) -> their column maxima of |x| (k floats) into out */
int lm_colmax(const float *x, int m, int k, float *out, int nthreads) {
    const int nt = nthreads < 1 ? 1 : nthreads;
    if (m < 1 || k < 1) return 0;
    float *part = (float *)calloc((size_t)nt * k, sizeof(float));
    if (!part) return 0;
    ColJob j = {x, m, k, part};
    run_parallel(colmax_job, &j, nt, NULL);
    reduce_max(part, nt, k, out);
    free(part);
    return 1;
}

#define TOPK_MAX 16 /* entries a row may set aside */

typedef struct {
    const float *x, *cinv;
    int m, k;
    int8_t *q;
    float *s;
    atomic_int failed;
    int topk; /* entries per row set aside (largest |x cinv|): idx, val [j m + row] */
    int *idx;
    float *val;
} RowsJob;

static void rows_i8_job(void *ctx, int tid, int nt) {
    RowsJob *j = (RowsJob *)ctx;
    const int k = j->k;
    float *f = j->cinv || j->topk ? (float *)malloc((size_t)k * sizeof(float)) : NULL;
    if ((j->cinv || j->topk) && !f) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int r = (int)((long)j->m * tid / nt); r < (int)((long)j->m * (tid + 1) / nt); r++) {
        const float *x = j->x + (size_t)r * k;
        if (f) {
            if (j->cinv)
                for (int i = 0; i < k; i++) f[i] = x[i] * j->cinv[i];
            else
                memcpy(f, x, (size_t)k * sizeof(float));
            x = f;
        }
        if (j->topk) { /* the topk largest |f| (the first of equals), in one pass, taken out */
            int ti[TOPK_MAX];
            float tv[TOPK_MAX]; /* descending */
            const int t = j->topk;
            for (int e = 0; e < t; e++) ti[e] = e, tv[e] = -1.0f;
            const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
            for (int i0 = 0; i0 < k; i0 += 8) {
                if (i0 + 8 <= k && !_mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(abs, _mm256_loadu_ps(f + i0)),
                                                                     _mm256_set1_ps(tv[t - 1]), _CMP_GT_OQ)))
                    continue; /* none of these 8 above the smallest kept */
                for (int i = i0; i < i0 + 8 && i < k; i++) {
                const float a = fabsf(f[i]);
                if (a <= tv[t - 1]) continue;
                int e = t - 1;
                for (; e > 0 && a > tv[e - 1]; e--) tv[e] = tv[e - 1], ti[e] = ti[e - 1];
                tv[e] = a, ti[e] = i;
                }
            }
            for (int e = 0; e < t; e++) {
                j->idx[(size_t)e * j->m + r] = ti[e];
                j->val[(size_t)e * j->m + r] = f[ti[e]];
                f[ti[e]] = 0.0f;
            }
        }
        j->s[r] = row_to_i8(x, k, j->q + (size_t)r * k);
    }
    free(f);
}

/* float rows x (m, k), times cinv[i] in column i where cinv is given -> int8 q (m, k) and a
   scale per row s (m,), as row_to_i8; where topk > 0 the row's topk largest |x cinv| are first
   taken out (zero in q, out of s), their columns and values to idx and val (topk, m) */
int lm_quant_rows_i8(const float *x, int m, int k, const float *cinv, int8_t *q, float *s, int topk, int *idx,
                     float *val, int nthreads) {
    if (m < 1 || k < 1 || topk < 0 || topk > k || topk > TOPK_MAX || (topk > 0 && (!idx || !val))) return 0;
    RowsJob j = {x, cinv, m, k, q, s};
    j.topk = topk, j.idx = idx, j.val = val;
    atomic_init(&j.failed, 0);
    run_parallel(rows_i8_job, &j, nthreads < 1 ? 1 : nthreads, NULL);
    return !atomic_load(&j.failed);
}

typedef struct {
    const int32_t *acc;
    const float *sa, *sw, *bias;
    int m, n;
    float *y;
    const float *corr; /* (n, m) or NULL */
} ScaleJob;

static void i8_scale_job(void *ctx, int tid, int nt) {
    const ScaleJob *j = (const ScaleJob *)ctx;
    const int n = j->n, n8 = n & ~7, r0 = (int)((long)j->m * tid / nt), r1 = (int)((long)j->m * (tid + 1) / nt);
    /* W columns at a time over all of this thread's rows: corr's columns stay in L1 */
    const int W = j->corr ? 64 : n;
    for (int i0 = 0; i0 < n; i0 += W) {
        const int iv = i0 + W < n8 ? i0 + W : n8, ie = i0 + W < n ? i0 + W : n;
        for (int r = r0; r < r1; r++) {
            const int32_t *a = j->acc + (size_t)r * n;
            float *y = j->y + (size_t)r * n;
            const float sa = j->sa[r];
            const __m256 va = _mm256_set1_ps(sa);
            for (int i = i0; i < iv; i += 8) {
                const __m256 s = _mm256_mul_ps(va, _mm256_loadu_ps(j->sw + i));
                __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(a + i))), s);
                if (j->corr) {
                    const __m256i ix = _mm256_mullo_epi32(
                        _mm256_add_epi32(_mm256_set1_epi32(i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                        _mm256_set1_epi32(j->m));
                    v = _mm256_add_ps(v, _mm256_i32gather_ps(j->corr + r, ix, 4));
                }
                if (j->bias) {
                    __asm__("" : "+x"(v)); /* no fma: the product rounded, then the sum */
                    v = _mm256_add_ps(v, _mm256_loadu_ps(j->bias + i));
                }
                _mm256_storeu_ps(y + i, v);
            }
            for (int i = iv > i0 ? iv : i0; i < ie; i++) {
                float v = (float)a[i] * (sa * j->sw[i]);
                if (j->corr) v += j->corr[(size_t)i * j->m + r];
                __asm__("" : "+x"(v));
                y[i] = j->bias ? v + j->bias[i] : v;
            }
        }
    }
}

/* y (m, n) = acc (m, n) * (sa[:, None] * sw[None, :]) (+ bias): the int32 products of two int8
   operands back in floats; y may be acc itself (each value read before it is written). Where
   corr is given, plus corr (n, m) transposed (lm_dequant_i8's set-aside entries' products). */
int lm_i8_scale(const int32_t *acc, const float *sa, const float *sw, const float *bias, int m, int n, float *y,
                const float *corr, int nthreads) {
    if (m < 1 || n < 1 || (long)m * n >= 2147483647L) return 0;
    ScaleJob j = {acc, sa, sw, bias, m, n, y, corr};
    run_parallel(i8_scale_job, &j, nthreads < 1 ? 1 : nthreads, NULL);
    return 1;
}
