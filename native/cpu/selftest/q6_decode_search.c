/* Is there a cheaper decode of the Q6_Kp planes (quants.h) than its 9 vector operations?
 * An exhaustive search over the programs of the same kind, 8 operations or fewer: each of the
 * registers R0..R3 is one value masked with 63, the values being the planes X, Y, Z and what at
 * most 4 shifts and xors make from them (`psrlw`/`psllw` by 1..7 bits of a plane or of a xor;
 * `pxor` of any two). Such a program decodes every block only if the 48 stored bits of each
 * 16-bit lane map one to one onto the 48 value bits, which is a rank over GF(2): shifts, xors
 * and masks are linear there. Not part of the extension; about 7 minutes on one core:
 *
 *   cc -O2 native/cpu/selftest/q6_decode_search.c -o /tmp/q6_search && /tmp/q6_search [OPS]
 *
 * OPS (default 4) bounds the shifts and xors. It first checks the layout's own program (5
 * shifts and xors) directly; OPS 5 runs for hours. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_VALUES 8   // the 3 planes and up to 5 derived values

// a 16-bit lane of a value: bit i is the xor of the stored bits set in bits[i] (X 0-15,
// Y 16-31, Z 32-47)
typedef struct { uint64_t bits[16]; char name[96]; int shifted; } value;

static const int VALUE_BITS[12] = { 0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13 };   // & 63 in each byte

static value pool[MAX_VALUES];
static int n_pool;
static long found;

static int rank48(uint64_t rows[48]) {
    int rank = 0;
    for (int bit = 0; bit < 48; bit++) {
        int pivot = -1;
        for (int k = rank; k < 48 && pivot < 0; k++)
            if (rows[k] >> bit & 1) pivot = k;
        if (pivot < 0) continue;
        const uint64_t t = rows[rank];
        rows[rank] = rows[pivot];
        rows[pivot] = t;
        for (int k = 0; k < 48; k++)
            if (k != rank && (rows[k] >> bit & 1)) rows[k] ^= rows[rank];
        rank++;
    }
    return rank;
}

// R0..R3 = v[0..3] & 63 decode every lane
static int decodes(const value *const v[4]) {
    uint64_t rows[48];
    for (int r = 0; r < 4; r++)
        for (int k = 0; k < 12; k++) rows[12 * r + k] = v[r]->bits[VALUE_BITS[k]];
    return rank48(rows) == 48;
}

static value shifted(const value *v, int s, int right) {
    value out = { .shifted = 1 };
    for (int i = 0; i < 16; i++) {
        const int from = right ? i + s : i - s;
        out.bits[i] = from >= 0 && from < 16 ? v->bits[from] : 0;
    }
    snprintf(out.name, sizeof out.name, "%.80s %s %d", v->name, right ? ">>" : "<<", s);
    return out;
}

static value xored(const value *a, const value *b) {
    value out = { .shifted = 0 };
    for (int i = 0; i < 16; i++) out.bits[i] = a->bits[i] ^ b->bits[i];
    snprintf(out.name, sizeof out.name, "(%.45s ^ %.45s)", a->name, b->name);
    return out;
}

// every 4 values to mask that take the newest one (the others were tried before it)
static void try_masks(void) {
    const value *last = &pool[n_pool - 1];
    for (int a = 0; a < n_pool - 1; a++)
        for (int b = a + 1; b < n_pool - 1; b++)
            for (int c = b + 1; c < n_pool - 1; c++) {
                const value *v[4] = { &pool[a], &pool[b], &pool[c], last };
                if (decodes(v) && found++ < 10)
                    printf("%d operations: the masks of %s, %s, %s, %s\n", n_pool - 3 + 4, v[0]->name, v[1]->name,
                           v[2]->name, v[3]->name);
            }
}

static void search(int ops_left) {
    if (n_pool > 3) try_masks();
    if (!ops_left) return;
    for (int a = 0; a < n_pool; a++) {
        for (int b = a + 1; b < n_pool; b++) {
            pool[n_pool++] = xored(&pool[a], &pool[b]);
            search(ops_left - 1);
            n_pool--;
        }
        if (pool[a].shifted) continue;   // a shift of a shift is one shift, or a mask
        for (int s = 1; s < 8; s++)
            for (int right = 0; right < 2; right++) {
                pool[n_pool++] = shifted(&pool[a], s, right);
                search(ops_left - 1);
                n_pool--;
            }
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   // each line as it is found
    const int ops = argc > 1 ? atoi(argv[1]) : 4;
    if (ops < 1 || ops > MAX_VALUES - 3) {
        fprintf(stderr, "OPS must be 1..%d\n", MAX_VALUES - 3);
        return 2;
    }
    const char *names[3] = { "X", "Y", "Z" };
    for (int p = 0; p < 3; p++) {
        memset(&pool[p], 0, sizeof pool[p]);
        for (int i = 0; i < 16; i++) pool[p].bits[i] = 1ull << (16 * p + i);
        strcpy(pool[p].name, names[p]);
    }
    n_pool = 3;
    // the layout's program: R0 = X & 63, R1 = Y & 63, R2 = (Z ^ X >> 2) & 63, R3 = (Z >> 2 ^ Y >> 6) & 63
    const value x2 = shifted(&pool[0], 2, 1), z2 = shifted(&pool[2], 2, 1), y6 = shifted(&pool[1], 6, 1);
    const value r2 = xored(&pool[2], &x2), r3 = xored(&z2, &y6);
    const value *layout[4] = { &pool[0], &pool[1], &r2, &r3 };
    const int layout_decodes = decodes(layout);
    printf("the layout's 9 operations decode every lane: %s\n", layout_decodes ? "yes" : "NO");
    if (!layout_decodes) return 1;
    search(ops);
    printf("programs of %d operations or fewer that decode every lane: %ld\n", ops + 4, found);
    return 0;
}
