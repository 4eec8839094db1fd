/* kernels_kda.h - the KDA delta rule's two passes over a head's state S
 * ([Dk][Dk], row d, column v), written once for every ISA (included by each
 * kernel file after it defines the macros below).  Both are elementwise in
 * v, every element with the reference's operations in its order: a
 * multiply, then an add (never fused; -ffp-contract=off), and each column's
 * sum over rows d in increasing d.  Lanes are columns, so the width does
 * not change a bit; blocks of four vectors keep their column sums in
 * registers while d runs.
 *   kda_decay_pred: S[d][v] = S[d][v] * dec[d];  pred[v] = pred[v] + k[d] * S[d][v]
 *   kda_update_out: S[d][v] = S[d][v] + b[d] * p[v];  o[v] = o[v] + q[d] * S[d][v]
 * Macros: KV (a vector of KW floats), kv_load(p), kv_store(p, v), kv_set1(x),
 * kv_mul, kv_add, KDA_FN(name) (the ISA's function name).
 */

static void KDA_FN(kda_decay_pred)(float *S, int Dk, const float *dec, const float *k, float *pred)
{
    int v0 = 0;
    for (; v0 + 4 * KW <= Dk; v0 += 4 * KW) {
        KV a0 = kv_load(pred + v0), a1 = kv_load(pred + v0 + KW), a2 = kv_load(pred + v0 + 2 * KW),
           a3 = kv_load(pred + v0 + 3 * KW);
        for (int d = 0; d < Dk; d++) {
            float *row = S + (size_t)d * Dk + v0;
            KV dd = kv_set1(dec[d]), kk = kv_set1(k[d]);
            KV r0 = kv_mul(kv_load(row), dd), r1 = kv_mul(kv_load(row + KW), dd);
            KV r2 = kv_mul(kv_load(row + 2 * KW), dd), r3 = kv_mul(kv_load(row + 3 * KW), dd);
            kv_store(row, r0), kv_store(row + KW, r1), kv_store(row + 2 * KW, r2), kv_store(row + 3 * KW, r3);
            a0 = kv_add(a0, kv_mul(kk, r0)), a1 = kv_add(a1, kv_mul(kk, r1));
            a2 = kv_add(a2, kv_mul(kk, r2)), a3 = kv_add(a3, kv_mul(kk, r3));
        }
        kv_store(pred + v0, a0), kv_store(pred + v0 + KW, a1), kv_store(pred + v0 + 2 * KW, a2),
            kv_store(pred + v0 + 3 * KW, a3);
    }
    for (; v0 + KW <= Dk; v0 += KW) {
        KV a = kv_load(pred + v0);
        for (int d = 0; d < Dk; d++) {
            float *row = S + (size_t)d * Dk + v0;
            KV r = kv_mul(kv_load(row), kv_set1(dec[d]));
            kv_store(row, r);
            a = kv_add(a, kv_mul(kv_set1(k[d]), r));
        }
        kv_store(pred + v0, a);
    }
    for (; v0 < Dk; v0++)
        for (int d = 0; d < Dk; d++) {
            float *x = S + (size_t)d * Dk + v0;
            *x = *x * dec[d];
            pred[v0] = pred[v0] + k[d] * *x;
        }
}

static void KDA_FN(kda_update_out)(float *S, int Dk, const float *b, const float *p, const float *q, float *o)
{
    int v0 = 0;
    for (; v0 + 4 * KW <= Dk; v0 += 4 * KW) {
        KV a0 = kv_load(o + v0), a1 = kv_load(o + v0 + KW), a2 = kv_load(o + v0 + 2 * KW),
           a3 = kv_load(o + v0 + 3 * KW);
        KV p0 = kv_load(p + v0), p1 = kv_load(p + v0 + KW), p2 = kv_load(p + v0 + 2 * KW),
           p3 = kv_load(p + v0 + 3 * KW);
        for (int d = 0; d < Dk; d++) {
            float *row = S + (size_t)d * Dk + v0;
            KV bb = kv_set1(b[d]), qq = kv_set1(q[d]);
            KV r0 = kv_add(kv_load(row), kv_mul(bb, p0)), r1 = kv_add(kv_load(row + KW), kv_mul(bb, p1));
            KV r2 = kv_add(kv_load(row + 2 * KW), kv_mul(bb, p2)), r3 = kv_add(kv_load(row + 3 * KW), kv_mul(bb, p3));
            kv_store(row, r0), kv_store(row + KW, r1), kv_store(row + 2 * KW, r2), kv_store(row + 3 * KW, r3);
            a0 = kv_add(a0, kv_mul(qq, r0)), a1 = kv_add(a1, kv_mul(qq, r1));
            a2 = kv_add(a2, kv_mul(qq, r2)), a3 = kv_add(a3, kv_mul(qq, r3));
        }
        kv_store(o + v0, a0), kv_store(o + v0 + KW, a1), kv_store(o + v0 + 2 * KW, a2), kv_store(o + v0 + 3 * KW, a3);
    }
    for (; v0 + KW <= Dk; v0 += KW) {
        KV a = kv_load(o + v0), pv = kv_load(p + v0);
        for (int d = 0; d < Dk; d++) {
            float *row = S + (size_t)d * Dk + v0;
            KV r = kv_add(kv_load(row), kv_mul(kv_set1(b[d]), pv));
            kv_store(row, r);
            a = kv_add(a, kv_mul(kv_set1(q[d]), r));
        }
        kv_store(o + v0, a);
    }
    for (; v0 < Dk; v0++)
        for (int d = 0; d < Dk; d++) {
            float *x = S + (size_t)d * Dk + v0;
            *x = *x + b[d] * p[v0];
            o[v0] = o[v0] + q[d] * *x;
        }
}
