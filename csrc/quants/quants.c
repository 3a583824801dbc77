/* Block formats: the type table, file-layout decoding (the scalar reference),
 * and the repacking into the interleaved layout described in quants.h, with
 * its scalar decoder. A type is its chunk decoder(s) and one row of the table. */
#include <math.h>

#include "quants/quants.h"

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t ld32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static float f16at(const uint8_t *p) { return llb_f16_to_f32(llb_rd16(p)); }

#define LO4 0x0F0F0F0Fu

/* ---- file layout: chunk decoders (value e of chunk sub = dw[e/16]*q[e] + mw[e/16]) ---- */

static void set_affine(float dw[2], float mw[2], float d, float m) {
    dw[0] = dw[1] = d;
    mw[0] = mw[1] = m;
}

/* 32 values from 16 bytes: low nibbles then high nibbles (every 32-block type's order). */
static void nibbles32(const uint8_t *qs, int16_t q[32]) {
    for (int e = 0; e < 16; e++) {
        q[e] = qs[e] & 15;
        q[e + 16] = qs[e] >> 4;
    }
}

/* 5th bits from a 32-bit little-endian mask: bit e belongs to value e. */
static void fifth_bits(const uint8_t *qh4, int16_t q[32]) {
    const uint32_t qh = ld32(qh4);
    for (int e = 0; e < 32; e++) q[e] |= (int16_t)(((qh >> e) & 1) << 4);
}

static void fc_q4_0(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    nibbles32(b + 2, q);
    for (int e = 0; e < 32; e++) q[e] -= 8;
    set_affine(dw, mw, f16at(b), 0.0f);
}

static void fc_q4_1(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    nibbles32(b + 4, q);
    set_affine(dw, mw, f16at(b), f16at(b + 2));
}

static void fc_q5_0(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    nibbles32(b + 6, q);
    fifth_bits(b + 2, q);
    for (int e = 0; e < 32; e++) q[e] -= 16;
    set_affine(dw, mw, f16at(b), 0.0f);
}

static void fc_q5_1(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    nibbles32(b + 8, q);
    fifth_bits(b + 4, q);
    set_affine(dw, mw, f16at(b), f16at(b + 2));
}

static void fc_q8_0(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = (int8_t)b[2 + e];
    set_affine(dw, mw, f16at(b), 0.0f);
}

/* IQ4_NL / IQ4_XS: a nibble indexes a non-uniform 16-level grid (ggml's kvalues_iq4nl). */
const int8_t llb_iq4_grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* MXFP4: a nibble is an FP4 e2m1 value; stored doubled so that it is an integer. */
const int8_t llb_fp4_grid[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* MXFP4's E8M0 exponent byte e: scale 2^(e-127), halved for the doubled grid (exact; tiny e are subnormal). */
static float e8m0_half(uint8_t e) { return ldexpf(1.0f, (int)e - 128); }

static void grid32(const uint8_t *qs, const int8_t *grid, int16_t q[32]) {
    for (int e = 0; e < 16; e++) {
        q[e] = grid[qs[e] & 15];
        q[e + 16] = grid[qs[e] >> 4];
    }
}

static void fc_iq4_nl(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    grid32(b + 2, llb_iq4_grid, q);
    set_affine(dw, mw, f16at(b), 0.0f);
}

static void fc_mxfp4(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    grid32(b + 1, llb_fp4_grid, q);
    set_affine(dw, mw, e8m0_half(b[0]), 0.0f);
}

/* IQ4_XS: d @0, scales_h u16 @2 (2 bits per sub-block), scales_l @4 (a nibble per sub-block), qs @8;
 * sub-block s's scale is ls - 32. */
static int iq4_xs_scale(const uint8_t *b, int sub) {
    return (((b[4 + sub / 2] >> (4 * (sub & 1))) & 15) | (((llb_rd16(b + 2) >> (2 * sub)) & 3) << 4)) - 32;
}

static void fc_iq4_xs(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    grid32(b + 8 + 16 * sub, llb_iq4_grid, q);
    set_affine(dw, mw, f16at(b) * (float)iq4_xs_scale(b, sub), 0.0f);
}

/* Q4_K/Q5_K: six-bit scale and min j of 8, packed in 12 bytes. */
static void k4_scale_min(const uint8_t *s12, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s12[j] & 63;
        *m = s12[j + 4] & 63;
    } else {
        *sc = (s12[j + 4] & 0xF) | ((s12[j - 4] >> 6) << 4);
        *m = (s12[j + 4] >> 4) | ((s12[j] >> 6) << 4);
    }
}

static void fc_q4_k(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    /* d, dmin @0, scales @4, qs @16: 64-value chunk sub/2, nibble sub%2 */
    int sc, m;
    k4_scale_min(b + 4, sub, &sc, &m);
    for (int l = 0; l < 32; l++) q[l] = (b[16 + 32 * (sub >> 1) + l] >> (4 * (sub & 1))) & 15;
    set_affine(dw, mw, f16at(b) * (float)sc, -(f16at(b + 2) * (float)m));
}

static void fc_q5_k(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    /* as Q4_K with qh @16 (bit sub of byte l: value l's 5th bit) and qs @48 */
    int sc, m;
    k4_scale_min(b + 4, sub, &sc, &m);
    for (int l = 0; l < 32; l++)
        q[l] = (int16_t)(((b[48 + 32 * (sub >> 1) + l] >> (4 * (sub & 1))) & 15) | ((b[16 + l] >> sub) & 1) << 4);
    set_affine(dw, mw, f16at(b) * (float)sc, -(f16at(b + 2) * (float)m));
}

static void fc_q6_k(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    /* ql @0, qh @128, int8 scales @192, d @208; 128-value half h, quarter qq of it */
    const int h = sub >> 2, qq = sub & 3;
    const float d = f16at(b + 208);
    for (int l = 0; l < 32; l++) {
        const int lo = (b[64 * h + 32 * (qq & 1) + l] >> (4 * (qq >> 1))) & 15;
        const int hi = (b[128 + 32 * h + l] >> (2 * qq)) & 3;
        q[l] = (int16_t)((lo | hi << 4) - 32);
    }
    for (int k = 0; k < 2; k++) {
        dw[k] = d * (float)(int8_t)b[192 + 2 * sub + k];
        mw[k] = 0.0f;
    }
}

static void fc_q2_k(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    /* scales @0 (low nibble scale, high nibble min, per 16 values), qs @16, d @80, dmin @82;
     * 128-value half h = sub/4 holds 4 bit-pairs of 32 bytes, pair j = sub%4 */
    const int h = sub >> 2, j = sub & 3;
    const float d = f16at(b + 80), dmin = f16at(b + 82);
    for (int l = 0; l < 32; l++) q[l] = (b[16 + 32 * h + l] >> (2 * j)) & 3;
    for (int k = 0; k < 2; k++) {
        const uint8_t s = b[2 * sub + k];
        dw[k] = d * (float)(s & 15);
        mw[k] = -(dmin * (float)(s >> 4));
    }
}

/* Q3_K's six-bit scale i (of 16; minus 32): nibble i/8 of byte i%8, top bits the (i/4)-th pair of byte 8 + i%4. */
static int q3_scale(const uint8_t *b, int i) {
    const int lo = (b[96 + (i & 7)] >> (4 * (i >> 3))) & 15, hi = (b[104 + (i & 3)] >> (2 * (i >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

static void fc_q3_k(const uint8_t *b, int sub, int16_t q[32], float dw[2], float mw[2]) {
    /* hmask @0 (bit sub of byte l; clear = minus 4), qs @32 as Q2_K's, 6-bit scales @96, d @108 */
    const int h = sub >> 2, j = sub & 3;
    const float d = f16at(b + 108);
    for (int l = 0; l < 32; l++)
        q[l] = (int16_t)(((b[32 + 32 * h + l] >> (2 * j)) & 3) - (((b[l] >> sub) & 1) ? 0 : 4));
    for (int k = 0; k < 2; k++) {
        dw[k] = d * (float)q3_scale(b, 2 * sub + k);
        mw[k] = 0.0f;
    }
}

/* ---- packing (interleaved types) ---------------------------------------- */

/* The 4 nibble vectors of 32 values whose codes are the low (shift 0) or high (shift 4)
 * nibbles of src[0..31]: vector v of row r takes quad v (values 4v..4v+3 = src[4v..])
 * in its low nibbles and quad v+4 (src[16+4v..]) in its high nibbles. */
static void place_nibbles(uint8_t *vecs, int r, const uint8_t *lo_src, const uint8_t *hi_src, int shift) {
    for (int v = 0; v < 4; v++) {
        const uint32_t lo = (ld32(lo_src + 4 * v) >> shift) & LO4, hi = (ld32(hi_src + 4 * v) >> shift) & LO4;
        put32(vecs + 64 * v + 4 * r, lo | hi << 4);
    }
}

/* file: byte e = value e (low nibble), value e+16 (high): exactly our vector bytes */
static void pk_q4_0(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b));
    for (int v = 0; v < 4; v++) memcpy(gb + 32 + 64 * v + 4 * r, b + 2 + 4 * v, 4);
}

static void pk_q4_1(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b));
    put16(gb + 32 + 2 * r, llb_rd16(b + 2));
    for (int v = 0; v < 4; v++) memcpy(gb + 64 + 64 * v + 4 * r, b + 4 + 4 * v, 4);
}

/* Row r's bytes of a bit-plane vector from a 32-bit mask of 5th bits (bit e = value e's). */
static void place_plane(uint8_t *plane, int r, uint32_t qh) {
    for (int j = 0; j < 4; j++) { /* plane byte j: bit t = 5th bit of value 4t+j = bit 4t+j of qh */
        uint32_t x = (qh >> j) & 0x11111111u; /* bits at 4t: fold pairwise into 8 adjacent bits */
        x = (x | x >> 3) & 0x03030303u;
        x = (x | x >> 6) & 0x000F000Fu;
        plane[4 * r + j] = (uint8_t)(x | x >> 12);
    }
}

static void pk_q5_0(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b));
    for (int v = 0; v < 4; v++) memcpy(gb + 32 + 64 * v + 4 * r, b + 6 + 4 * v, 4);
    place_plane(gb + LLB_Q5_0_PLANE, r, ld32(b + 2));
}

static void pk_q5_1(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b));
    put16(gb + 32 + 2 * r, llb_rd16(b + 2));
    for (int v = 0; v < 4; v++) memcpy(gb + 64 + 64 * v + 4 * r, b + 8 + 4 * v, 4);
    place_plane(gb + LLB_Q5_1_PLANE, r, ld32(b + 4));
}

/* IQ4_NL's file block is Q4_0's (d, 16 nibble bytes): so is its packed group-block. */
static void pk_iq4_nl(const uint8_t *b, int r, uint8_t *gb) { pk_q4_0(b, r, gb); }

static void pk_mxfp4(const uint8_t *b, int r, uint8_t *gb) {
    gb[r] = b[0];
    for (int v = 0; v < 4; v++) memcpy(gb + LLB_MXFP4_CODES + 64 * v + 4 * r, b + 1 + 4 * v, 4);
}

static void pk_q8_0(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b));
    for (int t = 0; t < 8; t++) put32(gb + 32 + 64 * t + 4 * r, ld32(b + 2 + 4 * t) ^ 0x80808080u);
}

/* Q4_K/Q5_K (qt): header (d, dmin, 12 scale bytes) at b, the 128 nibble bytes at qs. */
static void pack_k4(const int qt, const uint8_t *b, const uint8_t *qs, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b));
    put16(gb + 32 + 2 * r, llb_rd16(b + 2));
    for (int s = 0; s < 8; s++) { /* sub-block s: nibble s%2 of the 32 bytes of 64-value chunk s/2 */
        int sc, m;
        k4_scale_min(b + 4, s, &sc, &m);
        gb[64 + 16 * s + r] = (uint8_t)sc;
        gb[192 + 32 * (s >> 1) + 2 * r + (s & 1)] = (uint8_t)m;
        const uint8_t *q = qs + 32 * (s >> 1);
        place_nibbles(gb + LLB_K4_NIBBLES(qt, s), r, q, q + 16, 4 * (s & 1));
    }
}

static void pk_q4_k(const uint8_t *b, int r, uint8_t *gb) { pack_k4(LLB_Q4_K, b, b + 16, r, gb); }

static void pk_q5_k(const uint8_t *b, int r, uint8_t *gb) {
    pack_k4(LLB_Q5_K, b, b + 48, r, gb);
    for (int s = 0; s < 8; s++) /* value l of sub-block s has its 5th bit in bit s of qh[l] (qh @16) */
        for (int j = 0; j < 4; j++) {
            uint8_t v = 0;
            for (int t = 0; t < 8; t++) v |= (uint8_t)(((b[16 + 4 * t + j] >> s) & 1) << t);
            gb[LLB_Q5_K_PLANE(s) + 4 * r + j] = v;
        }
}

static void pk_iq4_xs(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b));
    for (int s = 0; s < 8; s++) { /* the file's 16 bytes of a sub-block are Q4_0's: our vector bytes */
        gb[32 + 16 * s + r] = (uint8_t)(int8_t)iq4_xs_scale(b, s);
        for (int v = 0; v < 4; v++) memcpy(gb + LLB_K4_NIBBLES(LLB_IQ4_XS, s) + 64 * v + 4 * r, b + 8 + 16 * s + 4 * v, 4);
    }
}

static void pk_q6_k(const uint8_t *b, int r, uint8_t *gb) {
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
        uint8_t *sub = gb + LLB_Q6_K_SUBS + 192 * u;
        put32(sub + 4 * r, lo[0] | lo[1] << 4);
        put32(sub + 64 + 4 * r, lo[2] | lo[3] << 4);
        put32(sub + 128 + 4 * r, hi);
        gb[32 + 16 * u + r] = b[192 + u];
    }
}

/* Q3_K: the 2-bit L vector of 16 codes (code & 3) of row r: byte j bits 2i.. = value 4i+j. */
static void place_l2(uint8_t *vec, int r, const int16_t *code16) {
    for (int j = 0; j < 4; j++) {
        uint8_t v = 0;
        for (int i = 0; i < 4; i++) v |= (uint8_t)((code16[4 * i + j] & 3) << (2 * i));
        vec[4 * r + j] = v;
    }
}

/* Q2_K's codes of step s (sub-blocks 2s, 2s+1) in two vectors @LLB_Q2_K_CODES + 128s, vector v holding
 * quads 2v, 2v+1: byte 4r+j bits 2(2h+k).. = row r's code of sub-block 2s+k, value 4(2v+h)+j. The byte of
 * value e (0..15) of sub-block u, and its shift: */
static const uint8_t *q2k_byte(const uint8_t *gb, int u, int r, int e) {
    return gb + LLB_Q2_K_CODES + 128 * (u >> 1) + 64 * (e >> 3) + 4 * r + (e & 3);
}
static int q2k_shift(int u, int e) { return 2 * (2 * ((e >> 2) & 1) + (u & 1)); }

static void pk_q2_k(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b + 80));
    put16(gb + 32 + 2 * r, llb_rd16(b + 82));
    for (int sub = 0; sub < 8; sub++) { /* chunk sub = sub-blocks 2sub, 2sub+1 */
        int16_t q[32];
        float dw[2], mw[2];
        fc_q2_k(b, sub, q, dw, mw);
        for (int k = 0; k < 2; k++) { /* OR-ed into the group, zeroed before packing (llb_pack_group) */
            const int u = 2 * sub + k;
            gb[64 + 16 * u + r] = b[u];
            for (int e = 0; e < 16; e++)
                *(uint8_t *)q2k_byte(gb, u, r, e) |= (uint8_t)((q[16 * k + e] & 3) << q2k_shift(u, e));
        }
    }
}

static void pk_q3_k(const uint8_t *b, int r, uint8_t *gb) {
    put16(gb + 2 * r, llb_rd16(b + 108));
    for (int s = 0; s < 8; s++) {
        int16_t q[32];
        float dw[2], mw[2];
        fc_q3_k(b, s, q, dw, mw);
        uint8_t *p = gb + LLB_Q3_K_SUBS + 192 * s;
        for (int e = 0; e < 32; e++) q[e] = (int16_t)(q[e] + 4); /* code 0..7 */
        for (int k = 0; k < 2; k++) {
            gb[32 + 16 * (2 * s + k) + r] = (uint8_t)(int8_t)q3_scale(b, 2 * s + k);
            place_l2(p + 64 * k, r, q + 16 * k);
        }
        for (int j = 0; j < 4; j++) {
            uint8_t v = 0;
            for (int k = 0; k < 2; k++)
                for (int i = 0; i < 4; i++) v |= (uint8_t)(((q[16 * k + 4 * i + j] >> 2) & 1) << (4 * k + i));
            p[128 + 4 * r + j] = v;
        }
    }
}

/* ---- packed layout: scalar decoders -------------------------------------- */

static int nib(const uint8_t *vecs, int r, int e) {
    const int t = e >> 2;
    return (vecs[64 * (t & 3) + 4 * r + (e & 3)] >> (4 * (t >> 2))) & 15;
}

static void pc_q4_0(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = (int16_t)(nib(gb + 32, r, e) - 8);
    set_affine(dw, mw, f16at(gb + 2 * r), 0.0f);
}

static void pc_q4_1(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = (int16_t)nib(gb + 64, r, e);
    set_affine(dw, mw, f16at(gb + 2 * r), f16at(gb + 32 + 2 * r));
}

/* Value e's 5th bit (as 16 or 0) from a bit-plane vector: byte 4r + e%4, bit e/4. */
static int plane_bit(const uint8_t *plane, int r, int e) { return ((plane[4 * r + (e & 3)] >> (e >> 2)) & 1) << 4; }

static void pc_q5_0(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = (int16_t)((nib(gb + 32, r, e) | plane_bit(gb + LLB_Q5_0_PLANE, r, e)) - 16);
    set_affine(dw, mw, f16at(gb + 2 * r), 0.0f);
}

static void pc_q5_1(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = (int16_t)(nib(gb + 64, r, e) | plane_bit(gb + LLB_Q5_1_PLANE, r, e));
    set_affine(dw, mw, f16at(gb + 2 * r), f16at(gb + 32 + 2 * r));
}

static void pc_iq4_nl(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = llb_iq4_grid[nib(gb + 32, r, e)];
    set_affine(dw, mw, f16at(gb + 2 * r), 0.0f);
}

static void pc_mxfp4(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = llb_fp4_grid[nib(gb + LLB_MXFP4_CODES, r, e)];
    set_affine(dw, mw, e8m0_half(gb[r]), 0.0f);
}

static void pc_q8_0(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]) {
    (void)sub;
    for (int e = 0; e < 32; e++) q[e] = (int16_t)(gb[32 + 64 * (e >> 2) + 4 * r + (e & 3)] - 128);
    set_affine(dw, mw, f16at(gb + 2 * r), 0.0f);
}

/* Q4_K's or Q5_K's (qt) low 4 bits and scales. */
static void pc_k4(const int qt, const uint8_t *gb, int s, int r, int16_t q[32], float dw[2], float mw[2]) {
    for (int e = 0; e < 32; e++) q[e] = (int16_t)nib(gb + LLB_K4_NIBBLES(qt, s), r, e);
    set_affine(dw, mw, f16at(gb + 2 * r) * (float)gb[64 + 16 * s + r],
               -(f16at(gb + 32 + 2 * r) * (float)gb[192 + 32 * (s >> 1) + 2 * r + (s & 1)]));
}

static void pc_q4_k(const uint8_t *gb, int s, int r, int16_t q[32], float dw[2], float mw[2]) {
    pc_k4(LLB_Q4_K, gb, s, r, q, dw, mw);
}

static void pc_q5_k(const uint8_t *gb, int s, int r, int16_t q[32], float dw[2], float mw[2]) {
    pc_k4(LLB_Q5_K, gb, s, r, q, dw, mw);
    for (int e = 0; e < 32; e++) q[e] = (int16_t)(q[e] | plane_bit(gb + LLB_Q5_K_PLANE(s), r, e));
}

static void pc_iq4_xs(const uint8_t *gb, int s, int r, int16_t q[32], float dw[2], float mw[2]) {
    for (int e = 0; e < 32; e++) q[e] = llb_iq4_grid[nib(gb + LLB_K4_NIBBLES(LLB_IQ4_XS, s), r, e)];
    set_affine(dw, mw, f16at(gb + 2 * r) * (float)(int8_t)gb[32 + 16 * s + r], 0.0f);
}

static void pc_q6_k(const uint8_t *gb, int s, int r, int16_t q[32], float dw[2], float mw[2]) {
    const float d = f16at(gb + 2 * r);
    for (int h = 0; h < 2; h++) {
        const int u = 2 * s + h;
        const uint8_t *sub = gb + LLB_Q6_K_SUBS + 192 * u;
        dw[h] = d * (float)(int8_t)gb[32 + 16 * u + r];
        mw[h] = 0.0f;
        for (int e = 0; e < 16; e++) {
            const int i = e >> 2, j = e & 3;
            const int lo = (sub[64 * (i >> 1) + 4 * r + j] >> (4 * (i & 1))) & 15;
            const int hi = (sub[128 + 4 * r + j] >> (2 * i)) & 3;
            q[16 * h + e] = (int16_t)((lo | hi << 4) - 32);
        }
    }
}

/* Value e (0..15) of row r's L vector: its low 2 bits. */
static int l2_at(const uint8_t *vec, int r, int e) { return (vec[4 * r + (e & 3)] >> (2 * (e >> 2))) & 3; }

static void pc_q2_k(const uint8_t *gb, int s, int r, int16_t q[32], float dw[2], float mw[2]) {
    const float d = f16at(gb + 2 * r), dmin = f16at(gb + 32 + 2 * r);
    for (int k = 0; k < 2; k++) {
        const int u = 2 * s + k, sm = gb[64 + 16 * u + r];
        for (int e = 0; e < 16; e++) q[16 * k + e] = (int16_t)((*q2k_byte(gb, u, r, e) >> q2k_shift(u, e)) & 3);
        dw[k] = d * (float)(sm & 15);
        mw[k] = -(dmin * (float)(sm >> 4));
    }
}

static void pc_q3_k(const uint8_t *gb, int s, int r, int16_t q[32], float dw[2], float mw[2]) {
    const float d = f16at(gb + 2 * r);
    const uint8_t *p = gb + LLB_Q3_K_SUBS + 192 * s;
    for (int k = 0; k < 2; k++) {
        for (int e = 0; e < 16; e++) {
            const int hb = (p[128 + 4 * r + (e & 3)] >> (4 * k + (e >> 2))) & 1;
            q[16 * k + e] = (int16_t)((l2_at(p + 64 * k, r, e) | hb << 2) - 4);
        }
        dw[k] = d * (float)(int8_t)gb[32 + 16 * (2 * s + k) + r];
        mw[k] = 0.0f;
    }
}

/* ---- the table ------------------------------------------------------------ */

#define FLOAT_TYPE(id, bytes) {LLB_##id, #id, 1, bytes, 0, 0, NULL, NULL, NULL}
/* Interleaved types: packed group-block size, file chunk decoder, packer, packed decoder. */
#define PACKED_TYPE(id, blk, bytes, gbytes, s16, lc, skew) \
    {LLB_##id, #id, blk, bytes, gbytes, s16, fc_##lc, pk_##lc, pc_##lc, skew}
/* Row-block types: 16 file blocks per group-block. */
#define ROWBLOCK_TYPE(id, blk, bytes, s16, lc) {LLB_##id, #id, blk, bytes, LLB_IL * (bytes), s16, fc_##lc, NULL, NULL}

static const llb_type_info types[] = {
    FLOAT_TYPE(F32, 4),
    FLOAT_TYPE(F16, 2),
    FLOAT_TYPE(BF16, 2),
    PACKED_TYPE(Q4_0, LLB_QK, 18, LLB_GB_Q4_0, 0, q4_0, 0),
    PACKED_TYPE(Q4_1, LLB_QK, 20, LLB_GB_Q4_1, 0, q4_1, 0),
    PACKED_TYPE(Q5_0, LLB_QK, 22, LLB_GB_Q5_0, 0, q5_0, 16),
    PACKED_TYPE(Q5_1, LLB_QK, 24, LLB_GB_Q5_1, 0, q5_1, 16),
    PACKED_TYPE(Q8_0, LLB_QK, 34, LLB_GB_Q8_0, 0, q8_0, 16),
    PACKED_TYPE(Q2_K, LLB_QKK, 84, LLB_GB_Q2_K, 1, q2_k, 0),
    PACKED_TYPE(Q3_K, LLB_QKK, 110, LLB_GB_Q3_K, 1, q3_k, 0),
    PACKED_TYPE(Q4_K, LLB_QKK, 144, LLB_GB_Q4_K, 0, q4_k, 0),
    PACKED_TYPE(Q5_K, LLB_QKK, 176, LLB_GB_Q5_K, 0, q5_k, 16),
    PACKED_TYPE(Q6_K, LLB_QKK, 210, LLB_GB_Q6_K, 1, q6_k, 0),
    PACKED_TYPE(IQ4_NL, LLB_QK, 18, LLB_GB_IQ4_NL, 0, iq4_nl, 0),
    PACKED_TYPE(IQ4_XS, LLB_QKK, 136, LLB_GB_IQ4_XS, 0, iq4_xs, 0),
    PACKED_TYPE(MXFP4, LLB_QK, 17, LLB_GB_MXFP4, 0, mxfp4, 0),
};
#define N_TYPES ((int)(sizeof(types) / sizeof(types[0])))

const llb_type_info *llb_type_at(int i) { return i >= 0 && i < N_TYPES ? &types[i] : NULL; }

const llb_type_info *llb_type_get(int qtype) {
    for (int i = 0; i < N_TYPES; i++)
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

void llb_pack_group(const llb_type_info *t, const uint8_t *src, long rows, long cols, long g, uint8_t *gdst) {
    const long nb = cols / t->block;
    const size_t rb = llb_row_bytes(t, cols);
    memset(gdst, 0, (size_t)nb * t->group_bytes); /* padding rows: all-zero blocks have scale 0 */
    const long r1 = rows - g * LLB_IL < LLB_IL ? rows - g * LLB_IL : LLB_IL;
    for (long r = 0; r < r1; r++) {
        const uint8_t *row = src + (size_t)(g * LLB_IL + r) * rb;
        for (long b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * t->block_bytes;
            uint8_t *gb = gdst + (size_t)b * t->group_bytes;
            if (t->pack_row) t->pack_row(blk, (int)r, gb);
            else memcpy(gb + (size_t)r * t->block_bytes, blk, (size_t)t->block_bytes);
        }
    }
}

void llb_pack_groups(const llb_type_info *t, const uint8_t *src, long rows, long cols, uint8_t *dst, long g0, long g1) {
    const size_t gbytes = (size_t)(cols / t->block) * t->group_bytes;
    for (long g = g0; g < g1; g++) llb_pack_group(t, src, rows, cols, g, dst + (size_t)g * gbytes);
}

/* Row r of 32-value chunk c of a packed group (any packed type). */
static void packed_row_chunk(const llb_type_info *t, const uint8_t *group, long c, int r, int16_t *q, float *dw,
                             float *mw) {
    const long per = t->block / 32; /* chunks per block */
    const uint8_t *gb = group + (size_t)(c / per) * t->group_bytes;
    if (t->packed_chunk) t->packed_chunk(gb, (int)(c % per), r, q, dw, mw);
    else t->file_chunk(gb + (size_t)r * t->block_bytes, (int)(c % per), q, dw, mw);
}

void llb_packed_chunk_decode(const llb_type_info *t, const uint8_t *group, long chunk, int16_t q[LLB_IL][32],
                             float dw[LLB_IL][2], float mw[LLB_IL][2]) {
    for (int r = 0; r < LLB_IL; r++) packed_row_chunk(t, group, chunk, r, q[r], dw[r], mw[r]);
}

static void chunk_to_float(const int16_t *q, const float *dw, const float *mw, float *out) {
    for (int e = 0; e < 32; e++) out[e] = dw[e >> 4] * (float)q[e] + mw[e >> 4];
}

void llb_dequant_row(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, long row, float *out) {
    (void)rows;
    int16_t q[32];
    float dw[2], mw[2];
    if (layout == LLB_LAYOUT_FILE) {
        const uint8_t *p = w + (size_t)row * llb_row_bytes(t, cols);
        if (t->block == 1) {
            for (long k = 0; k < cols; k++) {
                const uint8_t *v = p + (size_t)k * t->block_bytes;
                if (t->qtype == LLB_F32) memcpy(out + k, v, 4);
                else out[k] = t->qtype == LLB_F16 ? llb_f16_to_f32(llb_rd16(v)) : llb_bf16_to_f32(llb_rd16(v));
            }
            return;
        }
        for (long c = 0; c < cols / 32; c++) {
            t->file_chunk(p + (size_t)(c * 32 / t->block) * t->block_bytes, (int)(c % (t->block / 32)), q, dw, mw);
            chunk_to_float(q, dw, mw, out + 32 * c);
        }
        return;
    }
    const uint8_t *group = w + (size_t)(row / LLB_IL) * (size_t)(cols / t->block) * t->group_bytes;
    for (long c = 0; c < cols / 32; c++) {
        packed_row_chunk(t, group, c, (int)(row % LLB_IL), q, dw, mw);
        chunk_to_float(q, dw, mw, out + 32 * c);
    }
}
