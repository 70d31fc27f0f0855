// conv.cu: the Gated DeltaNet front end: causal depthwise conv1d with its state, and the
// per-head gates. One thread per element.
#include "fermi.cuh"

// out[t, c] = silu(sum_j w[c, j] * xe[t + j, c]), xe = [state (K-1 rows), x]
// x, out: [T, C]; state: [C, K-1] oldest first; w: [C, K]
extern "C" __global__ void conv1d_silu(const float* x, const float* state, const float* w,
                                       float* out, int T, int C, int K)
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * C) return;
    const int c = (int)(i % C), t = (int)(i / C);
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
        int s = t + j - (K - 1);
        float v = s >= 0 ? x[(long long)s * C + c] : state[(long long)c * (K - 1) + (s + K - 1)];
        acc += w[c * K + j] * v;
    }
    out[i] = fm_silu(acc);
}

// state <- the last K-1 rows of [state, x]; one thread per channel (reads before writes)
#define CONV_MAX_TAIL 15
extern "C" __global__ void conv1d_state(const float* x, float* state, int T, int C, int K)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float tail[CONV_MAX_TAIL];
    for (int j = 0; j < K - 1; ++j) {
        int s = T + j - (K - 1);
        tail[j] = s >= 0 ? x[(long long)s * C + c] : state[(long long)c * (K - 1) + (s + K - 1)];
    }
    for (int j = 0; j < K - 1; ++j) state[(long long)c * (K - 1) + j] = tail[j];
}

// g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(beta); alpha, beta: [T, nv] in place
extern "C" __global__ void gdn_gates(float* alpha, float* beta, const float* ssm_a,
                                     const float* dt_bias, int T, int nv)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * nv) return;
    const int h = i % nv;
    const float a = alpha[i] + dt_bias[h];
    const float sp = a > 20.0f ? a : log1pf(expf(a));
    alpha[i] = ssm_a[h] * sp;
    beta[i] = fm_sigmoid(beta[i]);
}
