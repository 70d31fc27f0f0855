/* fp32 ops of one decode step. See ops.h. */
// O3 for the vectorizer; no-trapping-math lets it turn the clamps of fm_expf into min/max.
// Before the includes, so that the inline functions of activations.h are built the same way.
#pragma GCC optimize("O3", "no-trapping-math")
#include <string.h>
#include "ops.h"
#include "conv_body.h"

static float sum_sq(const float *x, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += x[i + k] * x[i + k];
    for (; i < n; i++) s[0] += x[i] * x[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void fm_rmsnorm(const float *x, const float *w, float *y, int n, float eps) {
    const float r = 1.0f / sqrtf(sum_sq(x, n) / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

void fm_l2norm_scale(float *x, int n, float eps, float scale) {
    const float r = scale / sqrtf(sum_sq(x, n) + eps);
    for (int i = 0; i < n; i++) x[i] *= r;
}

void fm_conv_update_generic(FM_CONV_ARGS) {
    conv_update(state, w, x, out, C, K);
}

void fm_silu_mul(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = fm_silu(g[i]) * u[i];
}

void fm_mul_silu(float *o, const float *z, int n) {
    for (int i = 0; i < n; i++) o[i] *= fm_silu(z[i]);
}

void fm_mul_sigmoid(float *o, const float *g, int n) {
    for (int i = 0; i < n; i++) o[i] *= fm_sigmoid(g[i]);
}

void fm_gdn_head_generic(FM_GDN_ARGS) {
    (void)stream;   // plain stores: the reference sibling
    float mem[dv], delta[dv];
    memset(mem, 0, sizeof mem);
    for (int i = 0; i < dk; i++) {          // mem = S0^T k, so (decay S0)^T k = decay mem
        const float *row = S0 + (size_t)i * dv;
        for (int j = 0; j < dv; j++) mem[j] += row[j] * k[i];
    }
    for (int j = 0; j < dv; j++) {
        delta[j] = beta * (v[j] - decay * mem[j]);
        o[j] = 0.0f;
    }
    for (int i = 0; i < dk; i++) {          // S = decay S0 + k delta^T ; o = S^T q
        const float *row0 = S0 + (size_t)i * dv;
        float *row = S + (size_t)i * dv;
        const float ki = k[i], qi = q[i];
        for (int j = 0; j < dv; j++) {
            row[j] = decay * row0[j] + ki * delta[j];
            o[j] += row[j] * qi;
        }
    }
}

void fm_rope_neox(float *x, int rope_dim, const float *cs) {
    const int half = rope_dim / 2;
    const float *c = cs, *s = cs + half;
    for (int i = 0; i < half; i++) {
        const float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c[i] - x1 * s[i];
        x[i + half] = x1 * c[i] + x0 * s[i];
    }
}

void fm_route(const float *logits, int E, int k, float *probs, int *ids, float *w) {
    float mx = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < E; e++) {
        probs[e] = expf(logits[e] - mx);
        sum += probs[e];
    }
    for (int e = 0; e < E; e++) probs[e] /= sum;
    float kept = 0.0f;
    for (int s = 0; s < k; s++) {            // k passes: k is 8, E is 256
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int r = 0; r < s; r++) taken |= ids[r] == e;
            if (!taken && (best < 0 || probs[e] > probs[best])) best = e;
        }
        ids[s] = best;
        w[s] = probs[best];
        kept += probs[best];
    }
    for (int s = 0; s < k; s++) w[s] /= kept;
}
