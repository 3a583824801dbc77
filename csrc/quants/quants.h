/* Weight formats: ggml's block layouts (as stored in GGUF files) and our
 * interleaved "packed" layout (fp16/bf16 conversion: core/fp16.h).
 *
 * File layout (layout id 0): row after row, each row a run of blocks exactly
 * as ggml stores them. Packed layout (layout id 1, quantized types only):
 * rows are taken in groups of LLB_IL = 16; for each block index b the 16 rows'
 * block b are stored together, re-arranged so that one 64-byte vector holds
 * 4 consecutive values ("a quad") of each of the 16 rows: lane r of a 32-bit
 * SIMD vector is then output row r, and one VNNI instruction (u8 x s8, four
 * products summed per lane) advances 16 rows at once. A group's blocks are
 * contiguous, so a thread streams one linear region (prefetch-friendly).
 * The last group is zero-padded (scale 0; MXFP4: codes 0, weight +0) to 16 rows.
 *
 * Packed group-block layouts (byte offsets; "d[16]" = 16 fp16, row r at 2r;
 * a "vector" is 64 bytes, byte 4r+j = row r, value j of the quad):
 *   Q4_0 288: d[16] @0, 4 nibble vectors @32: vector v low nibbles = quad v,
 *             high nibbles = quad v+4 (values 0..15, weight = d*(q-8))
 *   Q4_1 320: d[16] @0, m[16] @32, nibble vectors @64 (weight = d*q + m)
 *   Q5_0 352: d[16] @0, nibble vectors @32, bit-plane vector @288 whose
 *             byte 4r+j bit t is the 5th bit of quad t (weight = d*(q-16))
 *   Q5_1 384: d[16] @0, m[16] @32, nibble vectors @64, bit-plane vector @320 (weight = d*q + m)
 *   IQ4_NL 288: Q4_0's layout; a nibble indexes the IQ4 grid (weight = d*grid[q])
 *   MXFP4 272: e[16] @0 (E8M0 bytes, scale 2^(e-127)), nibble vectors @16; a nibble is an
 *             FP4 (e2m1) value (weight = 2^(e-128) * fp4x2[q], the grid doubled to integers)
 *   Q8_0 544: d[16] @0, 8 code vectors @32 (vector t = quad t), codes stored as
 *             w + 128 (w ^ 0x80) so that they are unsigned like the other types'
 *   Q4_K 2368 per 256 values: d[16] @0, dmin[16] @32, scales u8 [8 sub][16
 *             rows] @64, mins u8 [4 sub pairs][16 rows][2] @192, then per
 *             32-value sub-block s a Q4_0-style set of 4 nibble vectors @320+256s
 *             (weight = d*sc[s]*q - dmin*m[s])
 *   Q5_K 2880 per 256 values: Q4_K's header (320 bytes), then per sub-block s @320+320s its
 *             4 nibble vectors (the low 4 bits, as Q4_K's) and a Q5_0-style bit-plane vector
 *             @576+320s (byte 4r+j bit t = 5th bit of quad t): one ascending stream, which Zen 4's
 *             hardware prefetchers follow (with the planes after all the nibbles they did not)
 *   IQ4_XS 2208 per 256 values: d[16] @0, scales i8 [8 sub][16 rows] @32 (ls - 32), then per
 *             32-value sub-block s a Q4_0-style set of 4 nibble vectors @160+256s; a nibble
 *             indexes the IQ4 grid (weight = d*sc[s]*grid[q])
 *   Q6_K 3360 per 256 values: d[16] @0, scales i8 [16 sub][16 rows] @32, then
 *             per 16-value sub-block u @288+192u: vector A (low nibbles = low 4
 *             bits of quad 4u, high nibbles = quad 4u+1), B (quads 4u+2, 4u+3),
 *             H (bits 2i..2i+1 = top 2 bits of quad 4u+i); weight = d*sc*(q-32)
 *   Q3_K 1824 per 256 values: d[16] @0, scales i8 [16 sub][16 rows] @32 (sc - 32), then per
 *             32-value pair of 16-value sub-blocks s @288+192s: vector L of sub-block 2s, L of
 *             2s+1 (byte 4r+j bits 2i..2i+1 = low 2 bits of quad i), H (byte 4r+j bit 4k+i = 3rd
 *             bit of quad i of sub-block 2s+k); code 0..7, weight = d*sc*(code-4)
 *   Q2_K 1344 per 256 values (the file's size): d[16] @0, dmin[16] @32, the file's scale bytes
 *             [16 sub][16 rows] @64 (low nibble sc, high nibble m), then per 32-value step s two
 *             vectors @320+128s, vector v holding quads 2v, 2v+1 of both sub-blocks (byte 4r+j bits
 *             2(2h+k)..: code of sub-block 2s+k, value 4(2v+h)+j: sub-block 2s's codes & 3 and
 *             2s+1's & 12, in place, after one shift for the odd quads); weight = d*sc*code - dmin*m
 *   Row-block types (none shipped: where a new type runs first; pack_row NULL in
 *             the table): the 16 rows' file blocks side by side (row r at r*block_bytes),
 *             so a group streams as one region at the file's size; their scalar kernel
 *             decodes file blocks (file_chunk), and a SIMD kernel may do the same.
 */
#ifndef LLB_QUANTS_H
#define LLB_QUANTS_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/fp16.h"

/* ggml's type ids (as stored in GGUF tensor infos). */
enum llb_qtype {
    LLB_F32 = 0, LLB_F16 = 1, LLB_Q4_0 = 2, LLB_Q4_1 = 3, LLB_Q5_0 = 6, LLB_Q5_1 = 7,
    LLB_Q8_0 = 8, LLB_Q2_K = 10, LLB_Q3_K = 11, LLB_Q4_K = 12, LLB_Q5_K = 13, LLB_Q6_K = 14,
    LLB_IQ4_NL = 20, LLB_IQ4_XS = 23, LLB_BF16 = 30, LLB_MXFP4 = 39,
};

enum llb_layout { LLB_LAYOUT_FILE = 0, LLB_LAYOUT_PACKED = 1 };

#define LLB_IL 16      /* rows per packed group */
#define LLB_QK 32      /* values per block of Q4_0/Q4_1/Q5_0/Q8_0 */
#define LLB_QKK 256    /* values per super-block of the K-quants and IQ4_XS */

/* Bytes of the interleaved types' packed group-blocks (the layouts above), and the offsets the
 * SIMD kernels address as constants. */
#define LLB_GB_Q4_0 288
#define LLB_GB_Q4_1 320
#define LLB_GB_Q5_0 352
#define LLB_GB_Q8_0 544
#define LLB_GB_Q4_K 2368
#define LLB_GB_Q5_K 2880
#define LLB_GB_Q6_K 3360
#define LLB_GB_IQ4_XS 2208
#define LLB_GB_Q5_1 384
#define LLB_GB_IQ4_NL 288
#define LLB_GB_MXFP4 272
#define LLB_Q5_1_PLANE 320 /* Q5_1's bit-plane vector */
#define LLB_MXFP4_CODES 16 /* MXFP4's nibble vectors (after the 16 exponent bytes) */
#define LLB_GB_Q2_K 1344
#define LLB_GB_Q3_K 1824
#define LLB_Q5_0_PLANE 288 /* Q5_0's bit-plane vector */
#define LLB_Q4_K_CODES 320 /* Q4_K's (and Q5_K's) first sub-block of nibble vectors (256 bytes each) */
/* Sub-block s's nibble vectors of a Q4_K, Q5_K (each followed by its bit plane) or IQ4_XS group-block. */
#define LLB_K4_NIBBLES(qt, s) \
    ((qt) == LLB_IQ4_XS ? LLB_IQ4_XS_CODES + 256 * (s) : LLB_Q4_K_CODES + ((qt) == LLB_Q5_K ? 320 : 256) * (s))
#define LLB_Q5_K_PLANE(s) (LLB_Q4_K_CODES + 320 * (s) + 256) /* Q5_K's sub-block s's bit-plane vector */
#define LLB_Q6_K_SUBS 288  /* Q6_K's first 16-value sub-block (192 bytes each) */
#define LLB_IQ4_XS_CODES 160 /* IQ4_XS's first sub-block of nibble vectors (256 bytes each) */
#define LLB_Q2_K_CODES 320 /* Q2_K's first 16-value sub-block's 2-bit vector (64 bytes each) */
#define LLB_Q3_K_SUBS 288  /* Q3_K's first pair of 16-value sub-blocks (192 bytes each) */

/* One 32-value chunk of a block as integers and per-16-value affine terms:
 * value e = dw[e/16] * q[e] + mw[e/16]. Every quantized type decodes to this (the scalar
 * kernels and dequantization run on it); chunk `sub` of a block is values 32*sub.. */
typedef void (*llb_file_chunk_fn)(const uint8_t *block, int sub, int16_t q[32], float dw[2], float mw[2]);
/* The same from a packed group-block (interleaved types): row r's chunk sub. */
typedef void (*llb_packed_chunk_fn)(const uint8_t *gb, int sub, int r, int16_t q[32], float dw[2], float mw[2]);

/* Static facts about one weight type: its row in the table (quants/quants.c). */
typedef struct {
    int qtype;
    const char *name;
    int block;        /* values per block (1 for F32/F16/BF16) */
    int block_bytes;  /* bytes per block in the file */
    int group_bytes;  /* bytes per packed 16-row group-block; 0 = type is never packed */
    int sub16;        /* scales (and mins) change every 16 values, not every 32 */
    llb_file_chunk_fn file_chunk;       /* NULL for the float types */
    /* Interleaved packing (see above) and its decoder; NULL for the row-block types. */
    void (*pack_row)(const uint8_t *block, int r, uint8_t *gb);
    llb_packed_chunk_fn packed_chunk;
    /* Bytes past a page boundary where a packed matrix of the type starts when the GEMVs stream as on
     * AMD (llb_isa_far_stream): 16 put each 64-byte code vector across two lines, which Zen 4 streamed
     * faster for these types only (docs/BENCHMARKS.md, "Zen 4, 2026-12-04 night"); the arena places it. */
    int far_skew;
} llb_type_info;

/* IQ4_NL/IQ4_XS: the 16 levels a nibble indexes (ggml's kvalues_iq4nl). */
extern const int8_t llb_iq4_grid[16];
/* MXFP4: the 16 FP4 (e2m1) values a nibble encodes, doubled so that they are integers. */
extern const int8_t llb_fp4_grid[16];

/* NULL for a type the kernels do not handle. */
const llb_type_info *llb_type_get(int qtype);
/* The table's rows in order: the i-th, or NULL past the end. */
const llb_type_info *llb_type_at(int i);

/* Bytes of one row in the file layout; 0 if cols is not a multiple of the block. */
size_t llb_row_bytes(const llb_type_info *t, long cols);
/* Bytes a matrix needs in `layout`; 0 on a bad layout for the type. */
size_t llb_matrix_bytes(const llb_type_info *t, int layout, long rows, long cols);
/* The layout pack() produces for this type. */
int llb_pack_layout(const llb_type_info *t);

/* File layout -> packed: groups g0..g1-1 (rows [16*g0, 16*g1)) into the packed matrix dst,
 * or the single group g into a buffer of its own. */
void llb_pack_groups(const llb_type_info *t, const uint8_t *src, long rows, long cols, uint8_t *dst, long g0, long g1);
void llb_pack_group(const llb_type_info *t, const uint8_t *src, long rows, long cols, long g, uint8_t *gdst);

/* Dequantize one row (file or packed layout) to float32; the reference the
 * SIMD kernels are checked against. */
void llb_dequant_row(const llb_type_info *t, int layout, const uint8_t *w, long rows, long cols, long row, float *out);

/* Scalar decode of a packed group's 32-value chunk c (block c, or sub-chunk
 * c%8 of super-block c/8): q[r][k] integer values and, per row and per half
 * (16 values), weight = dw*q + mw. */
void llb_packed_chunk_decode(const llb_type_info *t, const uint8_t *group, long chunk, int16_t q[LLB_IL][32], float dw[LLB_IL][2],
                             float mw[LLB_IL][2]);

static inline uint16_t llb_rd16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

#endif
