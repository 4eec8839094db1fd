/* attnres.c - Block Attention Residuals: the depth-wise softmax mix.
 *
 * Mix(A, p) over the values [A_0 .. A_{m-1}, p]: score_j = (nw*pw) .
 * RMSNorm(v_j) (computed as dot(v_j, nw*pw) / rms(v_j)), softmax over j in
 * fp32-rounded doubles with max subtraction, output = sum_j a_j v_j (raw
 * values).  Sums are in double and in index order, so the result is the same
 * for every batch width and thread count.
 */
#include "model.h"
#include "mathfn.h"

#include <math.h>

void attnres_mix(const float *anchors, int n_anchors, size_t anchor_stride, const float *p, int T, int h,
                 const float *nwpw, float eps, float *out, float *probs)
{
    double score[DBG_MAX_ANCHORS + 1], a[DBG_MAX_ANCHORS + 1];
    int m = n_anchors + 1;
    for (int t = 0; t < T; t++) {
        const float *pt = p + (size_t)t * h;
        double mx = -INFINITY;
        for (int j = 0; j < m; j++) {
            const float *v = j < n_anchors ? anchors + (size_t)j * anchor_stride + (size_t)t * h : pt;
            double ss = 0.0, dot = 0.0;
            for (int i = 0; i < h; i++) {
                ss += (double)v[i] * (double)v[i];
                dot += (double)v[i] * (double)nwpw[i];
            }
            score[j] = (double)(float)(dot / sqrt(ss / h + (double)eps));
            if (score[j] > mx) mx = score[j];
        }
        double sum = 0.0;
        for (int j = 0; j < m; j++) {
            a[j] = df_exp(score[j] - mx);
            sum += a[j];
        }
        for (int j = 0; j < m; j++) {
            a[j] /= sum;
            if (probs) probs[(size_t)t * (size_t)m + (size_t)j] = (float)a[j];
        }
        float *o = out + (size_t)t * h;
        for (int i = 0; i < h; i++) {
            double acc = 0.0;
            for (int j = 0; j < m; j++) {
                const float *v = j < n_anchors ? anchors + (size_t)j * anchor_stride + (size_t)t * h : pt;
                acc += a[j] * (double)v[i];
            }
            o[i] = (float)acc;
        }
    }
}
