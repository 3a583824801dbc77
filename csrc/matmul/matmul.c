/* The matmul driver: picks the ISA's kernel, quantizes the activations once
 * per call, and splits the work, (16-row group, or a pair of groups where the kernel
 * takes pairs) x (chunk of 64 activation rows, or of the table's llb_kernels.unit_rows) units, over the thread
 * pool in chunks of consecutive units, so that a thread
 * streams contiguous regions of the packed weights. A call may hold up to LLB_MM_MAX_PARTS
 * matrices of one type that share the activations (llb_matmul_many): their
 * units follow each other and are split as one list. */
#include "matmul/matmul.h"

#include <stdatomic.h>

#include "core/alloc.h"
#include "core/isa.h"
#include "core/state.h"
#include "matmul/kernels/kernels.h"
#include "core/threadpool.h"

/* Chunks a parallel call is cut into (see llb_parallel_for). */
#define MM_CHUNKS 32
/* A part takes its kernel's larger units (llb_kernels.unit_rows) only if it still has this many. */
#define MM_MIN_UNITS 8
/* Up to this many activation rows each thread of a parallel matmul quantizes its own copy. */
#define LLB_PRIVATE_ACT_ROWS 64

static const llb_kernels *active_kernels(void) {
    return LLB_PER_ISA(&llb_kernels_scalar, &llb_kernels_avx2, &llb_kernels_avx512);
}

/* Writable views of one copy of the quantized activations. */
typedef struct {
    int8_t *qs, *qs2;
    float *d, *sum, *d2;
    int32_t *bias, *bs16n, *bias2, *w16;
} act_bufs;

/* One matrix of a call (see llb_matmul_many): its kernel view and where its units start. */
typedef struct {
    llb_mm mm;           /* t, rows, out, row_bytes; a is set per thread */
    llb_kernel_fn fn;
    int layout;
    const uint8_t *w;
    size_t group_bytes;  /* bytes of one packed 16-row group over all columns */
    long ngroups, first_unit, units;
    long unit_rows, nchunks; /* activation rows per unit (the last takes the rest), units per group */
} mm_part;

typedef struct {
    llb_mm mm;           /* what the parts share: t (the first part's), cols, n, x and the activations' tile height */
    const llb_kernels *k;
    int offset;
    size_t group_bytes;  /* the largest part's group_bytes (0: no part is of a packed type) */
    long units;
    long span;           /* groups per unit: 2 where the kernel takes pairs (llb_kernels.pairs) and n > 1, else 1 */
    mm_part part[LLB_MM_MAX_PARTS];
    uint8_t *repack;     /* per-thread pairs of group_bytes buffers when a quantized type comes in the file layout */
    size_t off_repack;   /* where they start in the scratch */
    int needs_repack;
    int quantize;        /* activations quantized to 8 bits */
    int words16;         /* and their llb_act.w16 filled (256-blocks, where the table has words16) */
    /* quantized activations: copies of act_bytes from acts (one, or one per thread: private_acts) */
    uint8_t *acts;
    size_t act_bytes, off_d, off_bias, off_sum, off_bs16n, off_qs2, off_d2, off_bias2, off_w16;
    int private_acts;
    /* A GEMV's one row (private_acts and n == 1): the first thread to get there quantizes copy 0 for all,
     * the others read it once it is done (shared_state 2) or, arriving while it is being written (1),
     * quantize their own copy tid + 1; no thread waits for another. */
    int shared_acts;
    /* private_acts: thread tid reads copy acts_ready[tid] - 1 (0: it has none yet). Written once per thread
     * and call, on lines of their own: the fields above are read at every chunk by every thread. */
    _Alignas(64) unsigned short acts_ready[LLB_POOL_MAX_THREADS];
    _Alignas(64) atomic_int shared_state; /* shared_acts: 0 not started, 1 being quantized, 2 done */
} mm_ctx;

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static act_bufs act_copy(const mm_ctx *c, int k) {
    uint8_t *b = c->acts + (size_t)k * c->act_bytes;
    return (act_bufs){(int8_t *)b, (int8_t *)(b + c->off_qs2), (float *)(b + c->off_d), (float *)(b + c->off_sum),
                      (float *)(b + c->off_d2), (int32_t *)(b + c->off_bias), (int32_t *)(b + c->off_bs16n),
                      (int32_t *)(b + c->off_bias2), (int32_t *)(b + c->off_w16)};
}

static llb_act act_view(const mm_ctx *c, const act_bufs *a) {
    return (llb_act){a->qs, a->d, a->bias, a->sum, a->bs16n, a->qs2, a->d2, a->bias2, a->w16, c->mm.a.xt};
}

/* Rows [i0, i1), their blocks [b0, b1) (blocks of the weight type's size), into a. Whole rows only in a
 * 32-block type (the outlier test of quant32 takes the RMS of what it is given). */
static void quantize_part(const mm_ctx *c, const act_bufs *a, long i0, long i1, long b0, long b1) {
    const long K = c->mm.cols, blk = c->mm.t->block, nb = K / blk, xt = c->mm.a.xt;
    for (long i = i0; i < i1; i++) {
        const float *x = c->mm.x + i * K + b0 * blk;
        const size_t at = llb_act_at(i, b0, nb, xt);
        if (blk == LLB_QKK) {
            c->k->quant256(x, (b1 - b0) * blk, xt, a->qs + 256 * at, a->d + 8 * at, a->sum + 8 * at, a->bs16n + 16 * at);
            if (c->words16) c->k->words16(a->qs + 256 * at, (b1 - b0) * blk, xt, a->w16 + 16 * at);
        } else
            c->k->quant32(x, (b1 - b0) * blk, xt, c->offset, a->qs + 32 * at, a->d + at, a->bias + at, a->sum + at,
                          a->qs2 + 32 * at, a->d2 + at, a->bias2 + at);
    }
}

static void quantize_rows(const mm_ctx *c, const act_bufs *a, long i0, long i1) {
    quantize_part(c, a, i0, i1, 0, c->mm.cols / c->mm.t->block);
}

/* Tiles [t0, t1) of activation rows: whole tiles, so no two threads write one. */
static void quantize_task(void *ctx, long t0, long t1, int tid) {
    (void)tid;
    mm_ctx *c = ctx;
    const act_bufs a = act_copy(c, 0);
    const long xt = c->mm.a.xt;
    quantize_rows(c, &a, t0 * xt, t1 * xt < c->mm.n ? t1 * xt : c->mm.n);
}

/* The copy of the activations thread tid reads in a private_acts call, quantized (see shared_acts). For a
 * GEMV's one row the worker then starts on its weights soon after it wakes, without fetching the float
 * row from the caller's cache and quantizing it again: the caller is there first. */
static int own_acts(mm_ctx *c, int tid) {
    int k = tid;
    if (c->shared_acts) {
        int s = atomic_load_explicit(&c->shared_state, memory_order_acquire);
        if (s == 2) return 0;
        if (s == 0 && atomic_compare_exchange_strong(&c->shared_state, &s, 1)) {
            const act_bufs a = act_copy(c, 0);
            quantize_rows(c, &a, 0, c->mm.n);
            atomic_store_explicit(&c->shared_state, 2, memory_order_release);
            return 0;
        }
        k = tid + 1;
    }
    const act_bufs own = act_copy(c, k);
    quantize_rows(c, &own, 0, c->mm.n);
    return k;
}

/* Group g of part p: in place, or packed from the file layout into the thread's buffer of g's parity
 * (bufs, two of group_bytes: a pair's groups both), cached per parity: the last unit's. */
static const uint8_t *group_data(const mm_ctx *c, const mm_part *p, long g, uint8_t *bufs, const mm_part *cp[2],
                                 long cg[2]) {
    if (!p->group_bytes) return p->w + (size_t)g * LLB_IL * p->mm.row_bytes;
    if (p->layout == LLB_LAYOUT_PACKED) return p->w + (size_t)g * p->group_bytes;
    const int k = (int)(g & 1);
    uint8_t *buf = bufs + (size_t)k * c->group_bytes;
    if (g != cg[k] || p != cp[k]) llb_pack_group(p->mm.t, p->w, p->mm.rows, p->mm.cols, g, buf);
    cp[k] = p;
    cg[k] = g;
    return buf;
}

/* Work units [u0, u1) of (group or pair of groups, chunk) units in group-major order: a thread streams a
 * contiguous region of the packed weights and reuses a group while it is in cache.
 * With private_acts a thread first quantizes all rows into its own copy (once per call,
 * before its first chunk; a thread that claims no chunk never does). Rows
 * quantized once by the caller made the other threads fetch every line of them
 * from the caller's cache in the middle of the GEMM loop: their halves ran 30-40%
 * slower than the caller's (8 rows x 576x1536 Q4_1: 34 vs 25 us), and the serial
 * quantization before the fork left them idle. Reading x and quantizing it is a
 * plain stream the prefetchers hide; a few rows' quantization twice costs less. */
static void matmul_task(void *ctx, long u0, long u1, int tid) {
    mm_ctx *c = ctx;
    llb_act a = c->mm.a;
    if (c->private_acts) {
        if (!c->acts_ready[tid]) /* a store at every chunk bounced the line between the threads */
            c->acts_ready[tid] = (unsigned short)(own_acts(c, tid) + 1);
        const act_bufs own = act_copy(c, c->acts_ready[tid] - 1);
        a = act_view(c, &own);
    }
    long cg[2] = {-1, -1};
    const mm_part *cp[2] = {NULL, NULL};
    uint8_t *bufs = c->repack ? c->repack + (size_t)tid * 2 * c->group_bytes : NULL;
    int pi = -1;
    const mm_part *p = NULL;
    llb_mm mm;
    long part_end = u0; /* the current part's units end here: set it up (a kernel view copied once per part) */
    for (long u = u0; u < u1; u++) {
        if (u >= part_end) {
            do pi++;
            while (u >= c->part[pi].first_unit + c->part[pi].units);
            p = &c->part[pi];
            part_end = p->first_unit + p->units;
            mm = p->mm;
            mm.a = a;
            mm.wg2 = NULL;
        }
        /* one chunk per group (a GEMV): no division */
        const long v = u - p->first_unit, g = (p->nchunks == 1 ? v : v / p->nchunks) * c->span,
                   i0 = p->nchunks == 1 ? 0 : v % p->nchunks * p->unit_rows;
        const uint8_t *wg = group_data(c, p, g, bufs, cp, cg);
        if (c->span == 2) mm.wg2 = g + 1 < p->ngroups ? group_data(c, p, g + 1, bufs, cp, cg) : NULL;
        p->fn(&mm, wg, g, i0, i0 + p->unit_rows < mm.n ? i0 + p->unit_rows : mm.n);
    }
}

/* A type's kernel table (the active ISA's, or the scalar one where the ISA has no kernel for it)
 * and kernel. */
static const llb_kernels *type_kernels(const llb_type_info *t, int exact, llb_kernel_fn *fn) {
    const llb_kernels *k = active_kernels();
    if (!(*fn = k->kernel(t->qtype, exact))) { /* the scalar one, with its activation layout */
        k = &llb_kernels_scalar;
        *fn = k->kernel(t->qtype, exact);
    }
    return k;
}

/* Pairs of groups share each activation load in the GEMM; the GEMV (n == 1) keeps single groups. */
static long type_span(const llb_kernels *k, const llb_type_info *t, long n, int exact) {
    return n > 1 && k->pairs && k->pairs(t->qtype, exact) ? 2 : 1;
}

/* Whether types a and b can share one call's activations: the same kernel table, work unit span and
 * quantization (none, or the same block size), and for 32-blocks one zero point in the bias (a kernel
 * whose act_offset is 0 never reads the bias: kernels.h). */
static int can_share(const llb_type_info *a, const llb_type_info *b, long n, int exact) {
    llb_kernel_fn fa, fb;
    const llb_kernels *k = type_kernels(a, exact, &fa);
    if (a == b) return 1;
    if (type_kernels(b, exact, &fb) != k || !fa || !fb || type_span(k, a, n, exact) != type_span(k, b, n, exact)) return 0;
    if (!exact && (!a->group_bytes) != (!b->group_bytes)) return 0;
    if (exact || !a->group_bytes) return 1;
    if (a->block != b->block) return 0;
    const int oa = k->act_offset(a->qtype), ob = k->act_offset(b->qtype);
    return a->block != 32 || !oa || !ob || oa == ob;
}

/* Fill c for a call on up to nth threads (parallel: whether it will fork); returns the scratch
 * bytes it needs, or 0 with c->units = -1 when n_parts is out of range. The parts' types
 * (parts[i].t, NULL: t) can share activations (can_share). */
static size_t mm_setup(mm_ctx *c, const llb_type_info *t, const llb_mm_part *parts, int n_parts, long cols,
                       const float *x, long n, int exact, int nth, int *parallel) {
    *c = (mm_ctx){0};
    *parallel = 0;
    if (n_parts < 1 || n_parts > LLB_MM_MAX_PARTS || n < 0 || cols < 1) {
        c->units = -1;
        return 0;
    }
    if (n == 0) return 0; /* no activation rows (an expert no token chose): no tile height to divide by */
    llb_kernel_fn fn;
    c->k = type_kernels(t, exact, &fn);
    c->mm = (llb_mm){.t = t, .cols = cols, .n = n, .x = x, .far = llb_isa_far_stream()};
    c->span = type_span(c->k, t, n, exact);
    size_t weight_bytes = 0;
    for (int i = 0; i < n_parts; i++) {
        mm_part *p = &c->part[i];
        const llb_type_info *pt = parts[i].t ? parts[i].t : t;
        p->mm = (llb_mm){.t = pt, .rows = parts[i].rows, .cols = cols, .n = n, .x = x, .out = parts[i].out,
                         .row_bytes = llb_row_bytes(pt, cols), .far = c->mm.far};
        const llb_kernels *pk = type_kernels(pt, exact, &p->fn);
        p->layout = parts[i].layout;
        p->w = parts[i].w;
        p->group_bytes = pt->group_bytes ? (size_t)(cols / pt->block) * pt->group_bytes : 0;
        if (p->group_bytes > c->group_bytes) c->group_bytes = p->group_bytes;
        p->ngroups = (parts[i].rows + LLB_IL - 1) / LLB_IL;
        p->first_unit = c->units;
        /* the kernel's rows per unit where that still leaves MM_MIN_UNITS units to share, else LLB_ICHUNK
         * (which unit computes a row does not change its result: kernels.h) */
        const long gunits = (p->ngroups + c->span - 1) / c->span;
        const long big = pk->unit_rows ? pk->unit_rows(pt->qtype, exact, cols) : LLB_ICHUNK;
        p->unit_rows = gunits * ((n + big - 1) / big) >= MM_MIN_UNITS ? big : LLB_ICHUNK;
        p->nchunks = (n + p->unit_rows - 1) / p->unit_rows;
        p->units = gunits * p->nchunks;
        c->units += p->units;
        weight_bytes += p->group_bytes ? p->group_bytes * (size_t)p->ngroups : (size_t)parts[i].rows * p->mm.row_bytes;
        c->needs_repack |= pt->group_bytes && p->layout == LLB_LAYOUT_FILE;
        /* the zero point the shared bias carries: the one nonzero among the parts' (can_share) */
        if (!exact && pt->group_bytes && pt->block == 32 && c->k->act_offset(pt->qtype))
            c->offset = c->k->act_offset(pt->qtype);
    }
    c->quantize = !exact && t->group_bytes;
    /* for every 256-block call, not only Q6_K's: its scratch size and its activations then do not
     * depend on which parts share them (llb_matmul_here_scratch, a prep's same_x) */
    c->words16 = c->quantize && t->block == LLB_QKK && c->k->words16 != NULL;

    /* Below ~128 KB of weight traffic (x activation rows) a fork/join (~1.2 us measured,
     * plus moving activations to the other core) costs more than the second core saves. */
    *parallel = nth > 1 && weight_bytes * (size_t)n >= 128 * 1024;
    /* Up to LLB_PRIVATE_ACT_ROWS rows each thread quantizes its own copy (see matmul_task);
     * beyond, quantizing twice costs more than it saves and the threads split the rows. */
    c->private_acts = c->quantize && *parallel && n <= LLB_PRIVATE_ACT_ROWS;
    c->shared_acts = c->private_acts && n == 1;

    /* One scratch region: the quantized activations (one copy or one per thread), then
     * per-thread repack buffers (two each: a pair's groups). */
    const long xt = n < LLB_XT ? n : LLB_XT;
    const size_t nb32 = (size_t)((n + xt - 1) / xt * xt) * (cols / 32); /* whole tiles; d, sum: one per 32 values */
    c->mm.a.xt = xt;
    if (c->quantize) {
        c->off_d = align64(nb32 * 32);
        c->off_bias = align64(c->off_d + nb32 * sizeof(float));
        c->off_sum = align64(c->off_bias + nb32 * sizeof(int32_t));
        c->off_bs16n = align64(c->off_sum + nb32 * sizeof(float));
        c->off_qs2 = align64(c->off_bs16n + 2 * nb32 * sizeof(int32_t));
        c->off_d2 = align64(c->off_qs2 + nb32 * 32);
        c->off_bias2 = align64(c->off_d2 + nb32 * sizeof(float));
        c->off_w16 = align64(c->off_bias2 + nb32 * sizeof(int32_t));
        c->act_bytes = align64(c->off_w16 + (c->words16 ? 2 * nb32 * sizeof(int32_t) : 0));
    }
    c->off_repack = c->act_bytes * (size_t)(c->private_acts ? nth + c->shared_acts : 1);
    return c->off_repack + (c->needs_repack ? (size_t)nth * 2 * c->group_bytes : 0);
}

/* The activations of a call set up by mm_setup quantized into its scratch s, unless each thread
 * quantizes its own copy (private_acts). */
static void mm_quantize(mm_ctx *c, uint8_t *s, int nth, int parallel) {
    if (c->quantize) {
        c->acts = s;
        if (!c->private_acts) {
            const act_bufs a = act_copy(c, 0);
            c->mm.a = act_view(c, &a);
            const long tiles = (c->mm.n + c->mm.a.xt - 1) / c->mm.a.xt;
            if (parallel && (size_t)c->mm.n * c->mm.cols >= 65536)
                llb_parallel_for(quantize_task, c, tiles, llb_grain(tiles, MM_CHUNKS, 1, 1), nth);
            else quantize_rows(c, &a, 0, c->mm.n); /* one thread: not worth a fork/join */
        }
    }
}

/* Run a call set up by mm_setup with its scratch s (on nth threads if parallel, else here). */
static void mm_run(mm_ctx *c, uint8_t *s, int nth, int parallel) {
    if (c->needs_repack) c->repack = s + c->off_repack;
    mm_quantize(c, s, nth, parallel);
    /* Chunks of units from the sizes only: results never depend on them (a unit writes
     * whole outputs), and a few per thread let the running threads take over the share
     * of one the machine has descheduled. */
    /* redo: a unit writes its outputs out of place from inputs it never writes, so a parked
     * worker's chunk can be run again by the caller (see llb_parallel_for_redo). */
    if (parallel) llb_parallel_for_redo(matmul_task, c, c->units, llb_grain(c->units, MM_CHUNKS, 1, 1), nth);
    else matmul_task(c, 0, c->units, 0);
}

int llb_matmul_many(const llb_type_info *t, const llb_mm_part *parts, int n_parts, long cols, const float *x, long n,
                    int exact) {
    mm_ctx c;
    int parallel;
    int share = 1; /* every two parts' types (pairs: two zero points may each go with a third's 0) */
    for (int i = 0; i < n_parts && n_parts <= LLB_MM_MAX_PARTS; i++)
        for (int j = i + 1; j < n_parts; j++)
            share &= can_share(parts[i].t ? parts[i].t : t, parts[j].t ? parts[j].t : t, n, exact);
    if (!share) { /* one call per part, each of its own type */
        for (int i = 0; i < n_parts; i++) {
            llb_mm_part one = parts[i];
            one.t = NULL;
            if (llb_matmul_many(parts[i].t ? parts[i].t : t, &one, 1, cols, x, n, exact) != 0) return -1;
        }
        return 0;
    }
    /* Per-thread scratch is sized for nth threads; another Python thread may resize the
     * pool before the fork, so the matmul fork runs on at most nth (llb_parallel_for's max_threads). */
    const int nth = llb_pool_threads();
    const size_t total = mm_setup(&c, t, parts, n_parts, cols, x, n, exact, nth, &parallel);
    if (c.units < 0) return -1;
    uint8_t *s = total ? llb_scratch(total) : NULL;
    if (total && !s) return -1;
    mm_run(&c, s, nth, parallel);
    return 0;
}

size_t llb_matmul_here_scratch(const llb_type_info *t, long cols, long n, int exact) {
    mm_ctx c;
    int parallel;
    const llb_mm_part part = {.rows = 1};
    return mm_setup(&c, t, &part, 1, cols, NULL, n, exact, 1, &parallel) + 64;
}

int llb_matmul_many_here(const llb_type_info *t, const llb_mm_part *parts, int n_parts, long cols, const float *x,
                         long n, int exact, uint8_t *scratch) {
    mm_ctx c;
    int parallel;
    mm_setup(&c, t, parts, n_parts, cols, x, n, exact, 1, &parallel);
    if (c.units < 0) return -1;
    mm_run(&c, scratch, 1, 0);
    return 0;
}

int llb_matmul_outlier(void) { return LLB_OUTLIER; }

int llb_matmul_has_kernel(const llb_type_info *t, int isa, int exact) {
    const llb_kernels *k = &llb_kernels_scalar;
#if LLB_X86
    if (isa == LLB_ISA_AVX512) k = &llb_kernels_avx512;
    if (isa == LLB_ISA_AVX2) k = &llb_kernels_avx2;
#else
    if (isa != LLB_ISA_SCALAR) return 0;
#endif
    return k->kernel(t->qtype, exact) != NULL;
}

int llb_matmul(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, const float *x, float *out,
               long n, int exact) {
    const llb_mm_part part = {.layout = layout, .w = w, .rows = rows, .out = out};
    return llb_matmul_many(t, &part, 1, cols, x, n, exact);
}

/* ---- packing and row access --------------------------------------------- */

typedef struct {
    const llb_type_info *t;
    int layout;
    const uint8_t *src;
    long rows, cols;
    uint8_t *dst;
    const int32_t *ids;
    float *out;
    long n;
    long groups;             /* pack: row groups per matrix */
    size_t src_bytes, dst_bytes;   /* pack: one matrix in the file, packed */
} rows_ctx;

/* Row groups [i0, i1) of LLB_IL rows, counted over the matrices back to back. */
static void pack_task(void *ctx, long i0, long i1, int tid) {
    (void)tid;
    rows_ctx *c = ctx;
    while (i0 < i1) {
        const long m = i0 / c->groups, g0 = i0 % c->groups;
        const long g1 = g0 + (i1 - i0) < c->groups ? g0 + (i1 - i0) : c->groups;
        llb_pack_groups(c->t, c->src + (size_t)m * c->src_bytes, c->rows, c->cols, c->dst + (size_t)m * c->dst_bytes,
                        g0, g1);
        i0 += g1 - g0;
    }
}

/* Rows [r0, r1) of all the matrices (the file layout is kept: rows back to back on both sides). */
static void copy_task(void *ctx, long r0, long r1, int tid) {
    (void)tid;
    rows_ctx *c = ctx;
    const size_t rb = llb_row_bytes(c->t, c->cols);
    memcpy(c->dst + r0 * rb, c->src + r0 * rb, (size_t)(r1 - r0) * rb);
}

void llb_pack(const llb_type_info *t, const uint8_t *src, long rows, long cols, uint8_t *dst, long count) {
    rows_ctx c = {.t = t, .src = src, .rows = rows, .cols = cols, .dst = dst,
                  .groups = (rows + LLB_IL - 1) / LLB_IL,
                  .src_bytes = llb_matrix_bytes(t, LLB_LAYOUT_FILE, rows, cols),
                  .dst_bytes = llb_matrix_bytes(t, llb_pack_layout(t), rows, cols)};
    if (llb_pack_layout(t) == LLB_LAYOUT_PACKED) {
        const long n = c.groups * count;
        llb_parallel_for(pack_task, &c, n, llb_grain(n, MM_CHUNKS, 1, 1), LLB_POOL_MAX_THREADS);
    } else {
        const long n = rows * count;
        llb_parallel_for(copy_task, &c, n, llb_grain(n, MM_CHUNKS, 1, 1), LLB_POOL_MAX_THREADS);
    }
}

static void rows_task(void *ctx, long i0, long i1, int tid) {
    (void)tid;
    rows_ctx *c = ctx;
    for (long i = i0; i < i1; i++)
        llb_dequant_row(c->t, c->layout, c->src, c->rows, c->cols, c->ids ? c->ids[i] : i, c->out + i * c->cols);
}

void llb_get_rows(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, const int32_t *ids,
                  float *out, long n) {
    rows_ctx c = {.t = t, .layout = layout, .src = w, .rows = rows, .cols = cols, .ids = ids, .out = out, .n = n};
    if (n * cols < 65536) rows_task(&c, 0, n, 0); /* one token's embedding: no fork/join */
    else llb_parallel_for(rows_task, &c, n, llb_grain(n, MM_CHUNKS, 1, 1), LLB_POOL_MAX_THREADS);
}

struct llb_mm_prep {
    mm_ctx c;
};

size_t llb_matmul_prep_bytes(void) { return sizeof(llb_mm_prep); }

long llb_matmul_prep(llb_mm_prep *p, const llb_type_info *t, const llb_mm_part *parts, int n_parts, long cols,
                     const float *x, long n, int exact, uint8_t *scratch, const llb_mm_prep *same_x) {
    mm_ctx *c = &p->c;
    int parallel;
    mm_setup(c, t, parts, n_parts, cols, x, n, exact, 1, &parallel); /* one thread's setup: shared activations */
    if (c->units < 0 || c->needs_repack) return -1;
    if (c->units == 0) return 0;
    if (same_x && c->quantize) { /* the same rows quantized the same way: share them */
        c->offset = same_x->c.offset;
        c->acts = same_x->c.acts;
        c->mm.a = same_x->c.mm.a;
    } else {
        mm_quantize(c, scratch, 1, 0);
    }
    return c->units;
}

void llb_matmul_prep_run(const llb_mm_prep *p, long u0, long u1) {
    if (u0 < u1) matmul_task((void *)&p->c, u0, u1, 0); /* tid 0: no private copy, no repack buffer */
}
