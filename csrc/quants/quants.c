/* Block formats: the type table, file-layout dequantization (the scalar
 * reference), and the repacking into the interleaved layout described in
 * quants.h, with its scalar decoder. */
#include "quants/quants.h"

static const llb_type_info types[] = {
    {LLB_F32, "F32", 1, 4, 0},
    {LLB_F16, "F16", 1, 2, 0},
    {LLB_BF16, "BF16", 1, 2, 0},
    {LLB_Q4_0, "Q4_0", LLB_QK, 18, 288},
    {LLB_Q4_1, "Q4_1", LLB_QK, 20, 320},
    {LLB_Q5_0, "Q5_0", LLB_QK, 22, 352},
    {LLB_Q8_0, "Q8_0", LLB_QK, 34, 544},
    {LLB_Q4_K, "Q4_K", LLB_QKK, 144, 2368},
    {LLB_Q6_K, "Q6_K", LLB_QKK, 210, 3360},
};

const llb_type_info *llb_type_get(int qtype) {
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (types[i].qtype == qtype) return &types[i];
    return NULL;
}

size_t llb_row_bytes(const llb_type_info *t, long cols) {
    if (cols <= 0 || cols % t->block) return 0;
    return (size_t)(cols / t->block) * (size_t)t->block_bytes;
}

int llb_pack_layout(const llb_type_info *t) { return t->group_bytes ? LLB_LAYOUT_PACKED : LLB_LAYOUT_FILE; }

size_t llb_matrix_bytes(const llb_type_info *t, int layout, long rows, long cols) {
    if (rows <= 0 || cols <= 0 || cols % t->block) return 0;
    if (layout == LLB_LAYOUT_FILE) return (size_t)rows * llb_row_bytes(t, cols);
    if (layout != LLB_LAYOUT_PACKED || !t->group_bytes) return 0;
    const size_t groups = (size_t)(rows + LLB_IL - 1) / LLB_IL;
    return groups * (size_t)(cols / t->block) * (size_t)t->group_bytes;
}

/* ---- file layout: one block to float ---------------------------------- */

static void k4_scale_min(const uint8_t *s12, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s12[j] & 63;
        *m = s12[j + 4] & 63;
    } else {
        *sc = (s12[j + 4] & 0xF) | ((s12[j - 4] >> 6) << 4);
        *m = (s12[j + 4] >> 4) | ((s12[j] >> 6) << 4);
    }
}

/* Unsigned integer codes of one file block, in value order: nibbles for
 * Q4_0/Q4_1/Q4_K, 5 bits for Q5_0, 6 bits for Q6_K, the raw byte for Q8_0. */
static void file_block_codes(int qtype, const uint8_t *b, uint8_t *q) {
    switch (qtype) {
    case LLB_Q4_0:
    case LLB_Q4_1: {
        const uint8_t *qs = b + (qtype == LLB_Q4_0 ? 2 : 4);
        for (int e = 0; e < 16; e++) {
            q[e] = qs[e] & 15;
            q[e + 16] = qs[e] >> 4;
        }
        break;
    }
    case LLB_Q5_0: {
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        for (int e = 0; e < 16; e++) {
            q[e] = (uint8_t)((b[6 + e] & 15) | ((qh >> e) & 1) << 4);
            q[e + 16] = (uint8_t)((b[6 + e] >> 4) | ((qh >> (e + 16)) & 1) << 4);
        }
        break;
    }
    case LLB_Q8_0:
        memcpy(q, b + 2, 32);
        break;
    case LLB_Q4_K:
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) {
                q[64 * j + l] = b[16 + 32 * j + l] & 15;
                q[64 * j + 32 + l] = b[16 + 32 * j + l] >> 4;
            }
        break;
    case LLB_Q6_K:
        for (int h = 0; h < 2; h++)
            for (int qq = 0; qq < 4; qq++)
                for (int l = 0; l < 32; l++) {
                    const int lo = (b[64 * h + 32 * (qq & 1) + l] >> (4 * (qq >> 1))) & 15;
                    const int hi = (b[128 + 32 * h + l] >> (2 * qq)) & 3;
                    q[128 * h + 32 * qq + l] = (uint8_t)(lo | hi << 4);
                }
        break;
    }
}

static void file_block_dequant(const llb_type_info *t, const uint8_t *b, float *y) {
    uint8_t q[LLB_QKK];
    switch (t->qtype) {
    case LLB_F32: memcpy(y, b, 4); return;
    case LLB_F16: *y = llb_f16_to_f32(llb_rd16(b)); return;
    case LLB_BF16: *y = llb_bf16_to_f32(llb_rd16(b)); return;
    }
    file_block_codes(t->qtype, b, q);
    const float d = llb_f16_to_f32(llb_rd16(t->qtype == LLB_Q6_K ? b + 208 : b));
    switch (t->qtype) {
    case LLB_Q4_0: for (int e = 0; e < 32; e++) y[e] = d * (float)(q[e] - 8); break;
    case LLB_Q5_0: for (int e = 0; e < 32; e++) y[e] = d * (float)(q[e] - 16); break;
    case LLB_Q8_0: for (int e = 0; e < 32; e++) y[e] = d * (float)(int8_t)q[e]; break;
    case LLB_Q4_1: {
        const float m = llb_f16_to_f32(llb_rd16(b + 2));
        for (int e = 0; e < 32; e++) y[e] = d * (float)q[e] + m;
        break;
    }
    case LLB_Q4_K: {
        const float dmin = llb_f16_to_f32(llb_rd16(b + 2));
        for (int s = 0; s < 8; s++) {
            int sc, m;
            k4_scale_min(b + 4, s, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            for (int l = 0; l < 32; l++) y[32 * s + l] = dl * (float)q[32 * s + l] - ml;
        }
        break;
    }
    case LLB_Q6_K:
        for (int u = 0; u < 16; u++) {
            const float dl = d * (float)(int8_t)b[192 + u];
            for (int l = 0; l < 16; l++) y[16 * u + l] = dl * (float)(q[16 * u + l] - 32);
        }
        break;
    }
}

/* ---- packing ------------------------------------------------------------ */

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define LO4 0x0F0F0F0Fu

/* The 4 nibble vectors of 32 values whose codes are the low (shift 0) or high (shift 4)
 * nibbles of src[0..31]: vector v of row r takes quad v (values 4v..4v+3 = src[4v..])
 * in its low nibbles and quad v+4 (src[16+4v..]) in its high nibbles. */
static void place_nibbles(uint8_t *vecs, int r, const uint8_t *lo_src, const uint8_t *hi_src, int shift) {
    for (int v = 0; v < 4; v++) {
        const uint32_t lo = (ld32(lo_src + 4 * v) >> shift) & LO4, hi = (ld32(hi_src + 4 * v) >> shift) & LO4;
        put32(vecs + 64 * v + 4 * r, lo | hi << 4);
    }
}

static void pack_block_row(int qtype, const uint8_t *b, int r, uint8_t *gb) {
    switch (qtype) {
    case LLB_Q4_0: /* file: byte e = value e (low nibble), value e+16 (high): exactly our vector bytes */
        put16(gb + 2 * r, llb_rd16(b));
        for (int v = 0; v < 4; v++) memcpy(gb + 32 + 64 * v + 4 * r, b + 2 + 4 * v, 4);
        break;
    case LLB_Q4_1:
        put16(gb + 2 * r, llb_rd16(b));
        put16(gb + 32 + 2 * r, llb_rd16(b + 2));
        for (int v = 0; v < 4; v++) memcpy(gb + 64 + 64 * v + 4 * r, b + 4 + 4 * v, 4);
        break;
    case LLB_Q5_0: {
        put16(gb + 2 * r, llb_rd16(b));
        for (int v = 0; v < 4; v++) memcpy(gb + 32 + 64 * v + 4 * r, b + 6 + 4 * v, 4);
        const uint32_t qh = ld32(b + 2);
        for (int j = 0; j < 4; j++) { /* plane byte j: bit t = 5th bit of value 4t+j = bit 4t+j of qh */
            uint32_t x = (qh >> j) & 0x11111111u; /* bits at 4t: fold pairwise into 8 adjacent bits */
            x = (x | x >> 3) & 0x03030303u;
            x = (x | x >> 6) & 0x000F000Fu;
            gb[288 + 4 * r + j] = (uint8_t)(x | x >> 12);
        }
        break;
    }
    case LLB_Q8_0:
        put16(gb + 2 * r, llb_rd16(b));
        for (int t = 0; t < 8; t++) put32(gb + 32 + 64 * t + 4 * r, ld32(b + 2 + 4 * t) ^ 0x80808080u);
        break;
    case LLB_Q4_K:
        put16(gb + 2 * r, llb_rd16(b));
        put16(gb + 32 + 2 * r, llb_rd16(b + 2));
        for (int s = 0; s < 8; s++) { /* sub-block s: nibble s%2 of the 32 bytes of 64-value chunk s/2 */
            int sc, m;
            k4_scale_min(b + 4, s, &sc, &m);
            gb[64 + 16 * s + r] = (uint8_t)sc;
            gb[192 + 32 * (s >> 1) + 2 * r + (s & 1)] = (uint8_t)m;
            const uint8_t *qs = b + 16 + 32 * (s >> 1);
            place_nibbles(gb + 320 + 256 * s, r, qs, qs + 16, 4 * (s & 1));
        }
        break;
    case LLB_Q6_K:
        put16(gb + 2 * r, llb_rd16(b + 208));
        for (int u = 0; u < 16; u++) {
            /* values 16u.. sit in half u/8, quarter (u%8)/2, at offset 16*(u%2) of that quarter's 32 */
            const int half = u >> 3, qq = (u & 7) >> 1, off = 16 * (u & 1);
            const uint8_t *ql = b + 64 * half + 32 * (qq & 1) + off, *qh = b + 128 + 32 * half + off;
            uint32_t lo[4], hi = 0;
            for (int i = 0; i < 4; i++) {
                lo[i] = (ld32(ql + 4 * i) >> (4 * (qq >> 1))) & LO4;
                hi |= ((ld32(qh + 4 * i) >> (2 * qq)) & 0x03030303u) << (2 * i);
            }
            uint8_t *sub = gb + 288 + 192 * u;
            put32(sub + 4 * r, lo[0] | lo[1] << 4);
            put32(sub + 64 + 4 * r, lo[2] | lo[3] << 4);
            put32(sub + 128 + 4 * r, hi);
            gb[32 + 16 * u + r] = b[192 + u];
        }
        break;
    }
}

void llb_pack_group(const llb_type_info *t, const uint8_t *src, long rows, long cols, long g, uint8_t *gdst) {
    const long nb = cols / t->block;
    const size_t rb = llb_row_bytes(t, cols);
    memset(gdst, 0, (size_t)nb * t->group_bytes); /* padding rows: all-zero blocks have scale 0 */
    const long r1 = rows - g * LLB_IL < LLB_IL ? rows - g * LLB_IL : LLB_IL;
    for (long r = 0; r < r1; r++) {
        const uint8_t *row = src + (size_t)(g * LLB_IL + r) * rb;
        for (long b = 0; b < nb; b++)
            pack_block_row(t->qtype, row + (size_t)b * t->block_bytes, (int)r, gdst + (size_t)b * t->group_bytes);
    }
}

void llb_pack_groups(const llb_type_info *t, const uint8_t *src, long rows, long cols, uint8_t *dst, long g0, long g1) {
    const size_t gbytes = (size_t)(cols / t->block) * t->group_bytes;
    for (long g = g0; g < g1; g++) llb_pack_group(t, src, rows, cols, g, dst + (size_t)g * gbytes);
}

/* ---- packed layout: scalar decode --------------------------------------- */

static int nib(const uint8_t *vecs, int r, int e) {
    const int t = e >> 2;
    return (vecs[64 * (t & 3) + 4 * r + (e & 3)] >> (4 * (t >> 2))) & 15;
}

/* Row r of chunk c: q[32] integers, weight = dw[e/16]*q + mw[e/16]. */
static void packed_row_chunk(int qtype, const uint8_t *group, long c, int r, int16_t *q, float *dw, float *mw) {
    const uint8_t *gb;
    switch (qtype) {
    case LLB_Q4_0:
    case LLB_Q4_1:
    case LLB_Q5_0:
    case LLB_Q8_0: {
        gb = group + (size_t)c * llb_type_get(qtype)->group_bytes;
        const float d = llb_f16_to_f32(llb_rd16(gb + 2 * r));
        dw[0] = dw[1] = d;
        mw[0] = mw[1] = qtype == LLB_Q4_1 ? llb_f16_to_f32(llb_rd16(gb + 32 + 2 * r)) : 0.0f;
        for (int e = 0; e < 32; e++) {
            if (qtype == LLB_Q8_0) q[e] = (int16_t)(gb[32 + 64 * (e >> 2) + 4 * r + (e & 3)] - 128);
            else if (qtype == LLB_Q4_1) q[e] = (int16_t)nib(gb + 64, r, e);
            else if (qtype == LLB_Q4_0) q[e] = (int16_t)(nib(gb + 32, r, e) - 8);
            else q[e] = (int16_t)((nib(gb + 32, r, e) | ((gb[288 + 4 * r + (e & 3)] >> (e >> 2)) & 1) << 4) - 16);
        }
        break;
    }
    case LLB_Q4_K: {
        gb = group + (size_t)(c >> 3) * 2368;
        const int s = (int)(c & 7);
        const float d = llb_f16_to_f32(llb_rd16(gb + 2 * r)), dmin = llb_f16_to_f32(llb_rd16(gb + 32 + 2 * r));
        dw[0] = dw[1] = d * (float)gb[64 + 16 * s + r];
        mw[0] = mw[1] = -(dmin * (float)gb[192 + 32 * (s >> 1) + 2 * r + (s & 1)]);
        for (int e = 0; e < 32; e++) q[e] = (int16_t)nib(gb + 320 + 256 * s, r, e);
        break;
    }
    case LLB_Q6_K: {
        gb = group + (size_t)(c >> 3) * 3360;
        const float d = llb_f16_to_f32(llb_rd16(gb + 2 * r));
        for (int h = 0; h < 2; h++) {
            const int u = 2 * (int)(c & 7) + h;
            const uint8_t *sub = gb + 288 + 192 * u;
            dw[h] = d * (float)(int8_t)gb[32 + 16 * u + r];
            mw[h] = 0.0f;
            for (int e = 0; e < 16; e++) {
                const int i = e >> 2, j = e & 3;
                const int lo = (sub[64 * (i >> 1) + 4 * r + j] >> (4 * (i & 1))) & 15;
                const int hi = (sub[128 + 4 * r + j] >> (2 * i)) & 3;
                q[16 * h + e] = (int16_t)((lo | hi << 4) - 32);
            }
        }
        break;
    }
    }
}

void llb_packed_chunk_decode(int qtype, const uint8_t *group, long chunk, int16_t q[LLB_IL][32], float dw[LLB_IL][2],
                             float mw[LLB_IL][2]) {
    for (int r = 0; r < LLB_IL; r++) packed_row_chunk(qtype, group, chunk, r, q[r], dw[r], mw[r]);
}

void llb_dequant_row(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, long row, float *out) {
    (void)rows;
    if (layout == LLB_LAYOUT_FILE) {
        const uint8_t *p = w + (size_t)row * llb_row_bytes(t, cols);
        for (long b = 0; b < cols / t->block; b++) file_block_dequant(t, p + (size_t)b * t->block_bytes, out + b * t->block);
        return;
    }
    const long nb = cols / t->block;
    const uint8_t *group = w + (size_t)(row / LLB_IL) * (size_t)nb * t->group_bytes;
    int16_t q[32];
    float dw[2], mw[2];
    for (long c = 0; c < cols / 32; c++) {
        packed_row_chunk(t->qtype, group, c, (int)(row % LLB_IL), q, dw, mw);
        for (int e = 0; e < 32; e++) out[32 * c + e] = dw[e >> 4] * (float)q[e] + mw[e >> 4];
    }
}
