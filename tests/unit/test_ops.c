/* Tests of the cpu backend's ops, with every kernel table, against direct
 * double-precision computations: rmsnorm, rope, paged attention with tree
 * masks, MoE routing and experts; top_k against a full sort. */
#include "../../src/backend/cpu/cpu.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x1234567887654321ull;
static float rndf(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) * 0x1.0p-53 * 2 - 1);
}

static const struct kern *const tables[] = {&kern_ref, &kern_avx2, &kern_avx512};
#define FOR_EACH_BACKEND(be)                                                                                   \
    for (size_t ti_ = 0; ti_ < sizeof tables / sizeof tables[0]; ti_++)                                      \
        for (struct backend *be = kern_supported(tables[ti_]) ? cpu_backend_init(2, tables[ti_]) : NULL; be;  \
             be->ops->free(be), be = NULL)

static void fill(struct tensor *t)
{
    for (int64_t i = 0; i < t->n_rows * t->row_stride; i++)
        ((float *)t->data)[i] = rndf();
}

void test_ops_rmsnorm_rope(void)
{
    FOR_EACH_BACKEND(be)
    {
        const struct backend_ops *op = be->ops;
        struct tensor x, w, o, f;
        const int32_t n = 5, heads = 3, hd = 12, rd = 8;
        op->alloc(be, &x, DT_F32, n, heads * hd);
        op->alloc(be, &o, DT_F32, n, heads * hd);
        op->alloc(be, &w, DT_F32, 1, hd);
        op->alloc(be, &f, DT_F32, 1, rd / 2);
        fill(&x);
        fill(&w);
        float inv[4] = {1.0f, 0.3f, 0.01f, 1e-4f};
        op->write(be, &f, 0, 1, inv);
        op->rmsnorm(be, &o, &x, &w, 1e-6f);
        const float *xv = x.data, *ov = o.data, *wv = w.data;
        for (int32_t r = 0; r < n; r++)
            for (int32_t h = 0; h < heads; h++) {
                double ss = 0;
                for (int32_t c = 0; c < hd; c++)
                    ss += (double)xv[r * heads * hd + h * hd + c] * xv[r * heads * hd + h * hd + c];
                double sc = 1 / sqrt(ss / hd + 1e-6);
                for (int32_t c = 0; c < hd; c++) {
                    double want = xv[r * heads * hd + h * hd + c] * sc * wv[c];
                    CHECK(fabs(ov[r * heads * hd + h * hd + c] - want) < 1e-5, "rmsnorm");
                }
            }
        int32_t pos[5] = {0, 1, 7, 100, 4096};
        struct attn_batch b = {.n_tokens = n, .pos = pos};
        op->set_batch(be, &b);
        memcpy(o.data, x.data, sizeof(float) * (size_t)(n * heads * hd));
        op->rope(be, &o, heads, hd, rd, &f, 1.5f);
        for (int32_t r = 0; r < n; r++)
            for (int32_t h = 0; h < heads; h++) {
                const float *a = xv + r * heads * hd + h * hd, *got = ov + r * heads * hd + h * hd;
                for (int32_t d = 0; d < rd / 2; d++) {
                    double ang = (double)(float)((float)pos[r] * inv[d]);
                    double c = cos(ang) * 1.5, s = sin(ang) * 1.5;
                    CHECK(fabs(got[d] - (a[d] * c - a[d + rd / 2] * s)) < 1e-5, "rope lo");
                    CHECK(fabs(got[d + rd / 2] - (a[d + rd / 2] * c + a[d] * s)) < 1e-5, "rope hi");
                }
                for (int32_t d = rd; d < hd; d++)
                    CHECK(got[d] == a[d], "rope must not touch dims past rope_dim");
            }
        op->release(be, &x);
        op->release(be, &o);
        op->release(be, &w);
        op->release(be, &f);
    }
}

void test_ops_attention_paged_tree(void)
{
    FOR_EACH_BACKEND(be)
    {
        const struct backend_ops *op = be->ops;
        const int32_t bs = 4, n_blocks = 16, n_head = 6, n_kv = 2, hd = 20, n = 7, n_seq = 2;
        struct tensor kc, vc, q, k, v, out;
        op->alloc(be, &kc, DT_F32, n_blocks * bs, n_kv * hd);
        op->alloc(be, &vc, DT_F32, n_blocks * bs, n_kv * hd);
        op->alloc(be, &q, DT_F32, n, n_head * hd);
        op->alloc(be, &k, DT_F32, n, n_kv * hd);
        op->alloc(be, &v, DT_F32, n, n_kv * hd);
        op->alloc(be, &out, DT_F32, n, n_head * hd);
        fill(&kc);
        fill(&vc);
        fill(&q);
        fill(&k);
        fill(&v);
        /* two sequences with scattered blocks; seq 0 has 9 cached tokens and a
         * tree of 5 batch tokens, seq 1 has 2 cached and a chain of 2 */
        int32_t table[2][8] = {{5, 2, 11, 7, 0, 0, 0, 0}, {9, 3, 0, 0, 0, 0, 0, 0}};
        int32_t len[2] = {9, 2};
        int32_t seq[7] = {0, 0, 0, 1, 0, 0, 1};
        int32_t idx[7] = {0, 1, 2, 0, 3, 4, 1};       /* index among the sequence's batch rows */
        int32_t parent[7] = {-1, 0, 0, -1, 1, 2, 3};  /* tree: 0 -> {1, 2}, 1 -> 4, 2 -> 5 */
        int32_t slot[7], n_kvv[7], mfrom[7], seq_row[7];
        uint8_t mask[7][7] = {{0}};
        for (int32_t i = 0; i < n; i++) {
            int32_t p = len[seq[i]] + idx[i];
            slot[i] = table[seq[i]][p / bs] * bs + p % bs;
            n_kvv[i] = p + 1;
            mfrom[i] = len[seq[i]];
            seq_row[i] = seq[i];
            for (int32_t a = i; a >= 0; a = parent[a])
                mask[i][idx[a]] = 1;
        }
        struct attn_batch b = {.n_tokens = n, .slot = slot, .seq_row = seq_row, .n_kv = n_kvv, .mask_from = mfrom,
                               .mask = &mask[0][0], .mask_stride = 7, .block_table = &table[0][0], .n_seq_rows = n_seq,
                               .max_blocks = 8, .block_size = bs};
        op->set_batch(be, &b);
        op->kv_store(be, &kc, &vc, &k, &v);
        op->attention(be, &out, &q, &kc, &vc, n_head, n_kv, hd, 0.3f);
        const float *K = kc.data, *V = vc.data, *Q = q.data, *O = out.data;
        for (int32_t i = 0; i < n; i++)
            for (int32_t h = 0; h < n_head; h++) {
                int32_t g = h / (n_head / n_kv);
                double s[32], mx = -1e300, sum = 0, o[20] = {0};
                int32_t rows[32], m = 0;
                for (int32_t p = 0; p < n_kvv[i]; p++) {
                    if (p >= mfrom[i] && !mask[i][p - mfrom[i]])
                        continue;
                    rows[m] = table[seq[i]][p / bs] * bs + p % bs;
                    double d = 0;
                    for (int32_t c = 0; c < hd; c++)
                        d += (double)Q[i * n_head * hd + h * hd + c] * K[rows[m] * n_kv * hd + g * hd + c];
                    s[m] = d * 0.3;
                    mx = s[m] > mx ? s[m] : mx;
                    m++;
                }
                for (int32_t t = 0; t < m; t++)
                    sum += s[t] = exp(s[t] - mx);
                for (int32_t t = 0; t < m; t++)
                    for (int32_t c = 0; c < hd; c++)
                        o[c] += s[t] / sum * V[rows[t] * n_kv * hd + g * hd + c];
                for (int32_t c = 0; c < hd; c++)
                    CHECK(fabs(O[i * n_head * hd + h * hd + c] - o[c]) < 1e-5, "attention token %d head %d", i, h);
            }
        struct tensor *all[] = {&kc, &vc, &q, &k, &v, &out};
        for (int i = 0; i < 6; i++)
            op->release(be, all[i]);
    }
}

/* A long causal chain (three chunks of keys, its 40 rows in one run) against
 * double-precision softmax, and each row bitwise equal to the same row
 * attended alone: what a row computes does not depend on its run. */
void test_ops_attention_long(void)
{
    FOR_EACH_BACKEND(be)
    {
        const struct backend_ops *op = be->ops;
        enum { BS = 16, N_CACHED = 100, N = 40, N_HEAD = 4, N_KV = 2, HD = 24, CAP = 160 };
        struct tensor kc, vc, q, out, one;
        op->alloc(be, &kc, DT_F32, CAP, N_KV * HD);
        op->alloc(be, &vc, DT_F32, CAP, N_KV * HD);
        op->alloc(be, &q, DT_F32, N, N_HEAD * HD);
        op->alloc(be, &out, DT_F32, N, N_HEAD * HD);
        op->alloc(be, &one, DT_F32, 1, N_HEAD * HD);
        fill(&kc);
        fill(&vc);
        fill(&q);
        int32_t table[CAP / BS], seq_row[N], n_kv[N], mfrom[N];
        for (int32_t i = 0; i < CAP / BS; i++)
            table[i] = (i * 7 + 3) % (CAP / BS); /* scattered blocks */
        for (int32_t i = 0; i < N; i++)
            seq_row[i] = 0, n_kv[i] = N_CACHED + i + 1, mfrom[i] = n_kv[i];
        struct attn_batch b = {.n_tokens = N, .seq_row = seq_row, .n_kv = n_kv, .mask_from = mfrom,
                               .block_table = table, .n_seq_rows = 1, .max_blocks = CAP / BS, .block_size = BS};
        op->set_batch(be, &b);
        op->attention(be, &out, &q, &kc, &vc, N_HEAD, N_KV, HD, 0.2f);
        const float *K = kc.data, *V = vc.data, *Q = q.data, *O = out.data;
        for (int32_t i = 0; i < N; i++) {
            for (int32_t h = 0; h < N_HEAD; h++) {
                const int32_t g = h / (N_HEAD / N_KV);
                static double sc[CAP];
                double mx = -1e300, sum = 0, o[HD] = {0};
                for (int32_t p = 0; p < n_kv[i]; p++) {
                    const int32_t r = table[p / BS] * BS + p % BS;
                    double d = 0;
                    for (int32_t c = 0; c < HD; c++)
                        d += (double)Q[i * N_HEAD * HD + h * HD + c] * K[r * N_KV * HD + g * HD + c];
                    sc[p] = d * 0.2;
                    mx = sc[p] > mx ? sc[p] : mx;
                }
                for (int32_t p = 0; p < n_kv[i]; p++)
                    sum += sc[p] = exp(sc[p] - mx);
                for (int32_t p = 0; p < n_kv[i]; p++)
                    for (int32_t c = 0; c < HD; c++)
                        o[c] += sc[p] / sum * V[(table[p / BS] * BS + p % BS) * N_KV * HD + g * HD + c];
                for (int32_t c = 0; c < HD; c++)
                    CHECK(fabs(O[i * N_HEAD * HD + h * HD + c] - o[c]) < 1e-5, "row %d head %d", i, h);
            }
            /* the row alone */
            struct tensor qi = tensor_rows(&q, i, 1);
            struct attn_batch b1 = b;
            b1.n_tokens = 1;
            b1.seq_row = &seq_row[i];
            b1.n_kv = &n_kv[i];
            b1.mask_from = &mfrom[i];
            op->set_batch(be, &b1);
            op->attention(be, &one, &qi, &kc, &vc, N_HEAD, N_KV, HD, 0.2f);
            CHECK(memcmp(one.data, O + i * N_HEAD * HD, sizeof(float) * N_HEAD * HD) == 0,
                  "row %d alone differs from the row in its run", i);
        }
        struct tensor *all[] = {&kc, &vc, &q, &out, &one};
        for (int k = 0; k < 5; k++)
            op->release(be, all[k]);
    }
}

/* A KFlash tree of 64 rows (binary, in heap order) after a committed prefix
 * of 150 keys in scattered blocks, f32 and bf16 caches: its rows go in one
 * run (the prefix's chunks read once for all of them), each row's output
 * bitwise the row attended alone, as plain decoding attends it, and within
 * rounding of double-precision softmax over the keys it sees. */
void test_ops_attention_tree_run(void)
{
    FOR_EACH_BACKEND(be)
    {
        const struct backend_ops *op = be->ops;
        enum { BS = 16, N_CACHED = 150, N = 64, N_HEAD = 8, N_KV = 2, HD = 32, CAP = 224 };
        for (int tt = 0; tt < 2; tt++) {
            const enum dtype kt = tt ? DT_BF16 : DT_F32;
            struct tensor kc, vc, q, out, one;
            op->alloc(be, &kc, kt, CAP, N_KV * HD);
            op->alloc(be, &vc, kt, CAP, N_KV * HD);
            op->alloc(be, &q, DT_F32, N, N_HEAD * HD);
            op->alloc(be, &out, DT_F32, N, N_HEAD * HD);
            op->alloc(be, &one, DT_F32, 1, N_HEAD * HD);
            fill(&q);
            static float K[CAP * N_KV * HD], V[CAP * N_KV * HD]; /* the caches' values as floats */
            for (int64_t e = 0; e < CAP * N_KV * HD; e++) {
                K[e] = rndf();
                V[e] = rndf();
                if (tt) { /* bf16: the values kept are the floats' upper halves */
                    uint32_t kb, vb;
                    memcpy(&kb, &K[e], 4);
                    memcpy(&vb, &V[e], 4);
                    ((uint16_t *)kc.data)[e] = (uint16_t)(kb >> 16);
                    ((uint16_t *)vc.data)[e] = (uint16_t)(vb >> 16);
                    kb &= 0xffff0000u;
                    vb &= 0xffff0000u;
                    memcpy(&K[e], &kb, 4);
                    memcpy(&V[e], &vb, 4);
                } else {
                    ((float *)kc.data)[e] = K[e];
                    ((float *)vc.data)[e] = V[e];
                }
            }
            int32_t table[CAP / BS], seq_row[N], n_kv[N], mfrom[N], parent[N];
            static uint8_t mask[N][N];
            memset(mask, 0, sizeof mask);
            for (int32_t i = 0; i < CAP / BS; i++)
                table[i] = (i * 5 + 2) % (CAP / BS);
            for (int32_t i = 0; i < N; i++) {
                parent[i] = i ? (i - 1) / 2 : -1;
                seq_row[i] = 0, n_kv[i] = N_CACHED + i + 1, mfrom[i] = N_CACHED;
                for (int32_t a = i; a >= 0; a = parent[a])
                    mask[i][a] = 1;
            }
            struct attn_batch b = {.n_tokens = N, .seq_row = seq_row, .n_kv = n_kv, .mask_from = mfrom,
                                   .mask = &mask[0][0], .mask_stride = N, .block_table = table, .n_seq_rows = 1,
                                   .max_blocks = CAP / BS, .block_size = BS};
            op->set_batch(be, &b);
            op->attention(be, &out, &q, &kc, &vc, N_HEAD, N_KV, HD, 0.2f);
            CHECK(cpu_backend_att_runs(be) == 1, "%s cache: the tree's rows in %d runs, not one", tt ? "bf16" : "f32",
                  cpu_backend_att_runs(be));
            const float *Q = q.data, *O = out.data;
            for (int32_t i = 0; i < N; i++) {
                for (int32_t h = 0; h < N_HEAD; h++) {
                    const int32_t g = h / (N_HEAD / N_KV);
                    double sc[CAP], mx = -1e300, sum = 0, o[HD] = {0};
                    for (int32_t p = 0; p < n_kv[i]; p++) {
                        sc[p] = -1e300;
                        if (p >= N_CACHED && !mask[i][p - N_CACHED])
                            continue;
                        const int32_t r = table[p / BS] * BS + p % BS;
                        double d = 0;
                        for (int32_t c = 0; c < HD; c++)
                            d += (double)Q[i * N_HEAD * HD + h * HD + c] * K[r * N_KV * HD + g * HD + c];
                        sc[p] = d * 0.2;
                        mx = sc[p] > mx ? sc[p] : mx;
                    }
                    for (int32_t p = 0; p < n_kv[i]; p++)
                        sum += sc[p] = sc[p] > -1e300 ? exp(sc[p] - mx) : 0;
                    for (int32_t p = 0; p < n_kv[i]; p++)
                        for (int32_t c = 0; c < HD; c++)
                            o[c] += sc[p] / sum * V[(table[p / BS] * BS + p % BS) * N_KV * HD + g * HD + c];
                    for (int32_t c = 0; c < HD; c++)
                        CHECK(fabs(O[i * N_HEAD * HD + h * HD + c] - o[c]) < 1e-5, "row %d head %d", i, h);
                }
                struct tensor qi = tensor_rows(&q, i, 1);
                struct attn_batch b1 = b;
                b1.n_tokens = 1;
                b1.seq_row = &seq_row[i];
                b1.n_kv = &n_kv[i];
                b1.mask_from = &mfrom[i];
                b1.mask = mask[i];
                op->set_batch(be, &b1);
                op->attention(be, &one, &qi, &kc, &vc, N_HEAD, N_KV, HD, 0.2f);
                CHECK(memcmp(one.data, O + i * N_HEAD * HD, sizeof(float) * N_HEAD * HD) == 0,
                      "%s cache: tree row %d alone differs from the row in the tree's run", tt ? "bf16" : "f32", i);
            }
            struct tensor *all[] = {&kc, &vc, &q, &out, &one};
            for (int k = 0; k < 5; k++)
                op->release(be, all[k]);
        }
    }
}

/* The moe op against double-precision arithmetic: h = RMSNorm(x), the
 * router's logits, softmax top-k (with and without renormalising), SwiGLU
 * experts; written to out, then added to a residual. With room for one row
 * (ws) a token, and for one a pick (ws2: the cpu runs every pick at once),
 * the same bits. Spread routing (runs 4, 5): the picks are MOE_SPREAD_ID's,
 * the weights the top-k's. */
void test_ops_moe(void)
{
    FOR_EACH_BACKEND(be)
    {
        const struct backend_ops *op = be->ops;
        const int32_t n = 6, E = 5, K = 2, H = 40, I = 36;
        struct tensor lg, ids, wts, x, h, out, res, ws, ws2, nw, router, gate[5], up[5], down[5];
        op->alloc(be, &lg, DT_F32, n, E);
        op->alloc(be, &ids, DT_I32, n, K);
        op->alloc(be, &wts, DT_F32, n, K);
        op->alloc(be, &x, DT_F32, n, H);
        op->alloc(be, &h, DT_F32, n, H);
        op->alloc(be, &out, DT_F32, n, H);
        op->alloc(be, &res, DT_F32, n, H);
        op->alloc(be, &ws, DT_F32, n, 2 * (H + I));
        op->alloc(be, &ws2, DT_F32, n * K, 2 * (H + I));
        op->alloc(be, &nw, DT_F32, 1, H);
        op->alloc(be, &router, DT_F32, E, H);
        for (int32_t e = 0; e < E; e++) {
            op->alloc(be, &gate[e], DT_F32, I, H);
            op->alloc(be, &up[e], DT_F32, I, H);
            op->alloc(be, &down[e], DT_F32, H, I);
            fill(&gate[e]);
            fill(&up[e]);
            fill(&down[e]);
        }
        fill(&x);
        fill(&nw);
        fill(&router);
        float first[2][6 * 40];
        for (int run = 0; run < 6; run++) {
            const int norm = run % 2;
            const bool spread = run >= 4;
            fill(&res);
            float res0[6 * 40];
            memcpy(res0, res.data, sizeof res0);
            const struct moe_block mb = {
                .norm = &nw, .eps = 1e-6f, .router = &router,
                .rt = {.k = K, .norm = norm, .n_group = 1, .topk_group = 1, .scale = 1.0f, .spread = spread},
                .ex = {E, gate, up, down}, .h = &h, .logits = &lg, .ids = &ids, .weights = &wts,
                .ws = run == 2 || run == 3 ? &ws2 : &ws,
            };
            op->moe(be, &out, &x, &mb, false);
            op->moe(be, &res, &x, &mb, true);
            if (run < 2)
                memcpy(first[norm], out.data, sizeof first[norm]);
            else if (!spread)
                CHECK(memcmp(first[norm], out.data, sizeof first[norm]) == 0, "moe: a row a pick, other bits");
            for (int32_t r = 0; r < n; r++) {
                const float *xr = (const float *)x.data + r * H, *hr = (const float *)h.data + r * H;
                double ss = 0;
                for (int32_t c = 0; c < H; c++)
                    ss += (double)xr[c] * xr[c];
                for (int32_t c = 0; c < H; c++)
                    CHECK(fabs(hr[c] - ((float *)nw.data)[c] * xr[c] / sqrt(ss / H + 1e-6)) < 1e-5, "moe h row %d", r);
                const float *l = (const float *)lg.data + r * E;
                for (int32_t e = 0; e < E; e++) {
                    double d = 0;
                    for (int32_t c = 0; c < H; c++)
                        d += (double)((float *)router.data)[e * H + c] * hr[c];
                    CHECK(fabs(l[e] - d) < 1e-5, "moe logit row %d expert %d", r, e);
                }
                double p[5], mx = -1e300, sum = 0;
                for (int32_t e = 0; e < E; e++)
                    mx = l[e] > mx ? l[e] : mx;
                for (int32_t e = 0; e < E; e++)
                    sum += p[e] = exp(l[e] - mx);
                int32_t best[2] = {-1, -1};
                for (int32_t j = 0; j < K; j++)
                    for (int32_t e = 0; e < E; e++)
                        if (e != best[0] && (best[j] < 0 || p[e] > p[best[j]]))
                            best[j] = e;
                double wsum = (p[best[0]] + p[best[1]]) / sum;
                double y[40] = {0};
                for (int32_t j = 0; j < K; j++) {
                    const double w = p[best[j]] / sum / (norm ? wsum : 1);
                    const int32_t e = spread ? (int32_t)((37 * r + j * (E / K)) % E) : best[j];
                    CHECK(((int32_t *)ids.data)[r * K + j] == e, "route row %d choice %d", r, j);
                    CHECK(fabs(((float *)wts.data)[r * K + j] - w) < 1e-6, "route weight");
                    double act[36];
                    for (int32_t i = 0; i < I; i++) {
                        double g = 0, u = 0;
                        for (int32_t c = 0; c < H; c++) {
                            g += (double)((float *)gate[e].data)[i * H + c] * hr[c];
                            u += (double)((float *)up[e].data)[i * H + c] * hr[c];
                        }
                        act[i] = g / (1 + exp(-g)) * u;
                    }
                    for (int32_t c = 0; c < H; c++)
                        for (int32_t i = 0; i < I; i++)
                            y[c] += w * ((float *)down[e].data)[c * I + i] * act[i];
                }
                for (int32_t c = 0; c < H; c++) {
                    const double tol = 1e-5 * (1 + fabs(y[c])); /* the products' sums are O(10) here */
                    CHECK(fabs(((float *)out.data)[r * H + c] - y[c]) < tol, "moe out row %d col %d", r, c);
                    CHECK(fabs(((float *)res.data)[r * H + c] - (res0[r * H + c] + y[c])) < tol,
                          "moe residual row %d col %d", r, c);
                }
            }
        }
        struct tensor *all[] = {&lg, &ids, &wts, &x, &h, &out, &res, &ws, &ws2, &nw, &router};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            op->release(be, all[i]);
        for (int32_t e = 0; e < E; e++) {
            op->release(be, &gate[e]);
            op->release(be, &up[e]);
            op->release(be, &down[e]);
        }
    }
}

/* rows with planted ties and -inf: top_k equals a full sort by (value
 * descending, column ascending) */
static const float *cmp_row;
static int cmp_rank(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (cmp_row[i] != cmp_row[j])
        return cmp_row[i] > cmp_row[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

void test_ops_top_k(void)
{
    struct backend *be = cpu_backend_init(1, NULL);
    const int32_t cols[] = {16, 17, 1000, 40000};
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        const int32_t n = 3, V = cols[c];
        struct tensor t;
        CHECK(be->ops->alloc(be, &t, DT_F32, n, V) == 0, "alloc");
        float *x = t.data;
        for (int64_t i = 0; i < (int64_t)n * V; i++)
            x[i] = rndf();
        for (int32_t r = 0; r < n; r++) { /* ties at the top and inside the top 16, and -inf */
            float *row = x + (int64_t)r * V;
            row[V - 1] = row[V / 2] = row[3] = 2.0f;
            row[V / 3] = row[V / 4] = 1.5f;
            row[1] = -INFINITY;
        }
        int32_t *order = malloc(sizeof(int32_t) * (size_t)V), ids[3 * TOP_K_MAX];
        float vals[3 * TOP_K_MAX];
        for (int32_t k = 1; k <= TOP_K_MAX && k <= V; k += 5) {
            be->ops->top_k(be, &t, k, ids, vals);
            for (int32_t r = 0; r < n; r++) {
                for (int32_t i = 0; i < V; i++)
                    order[i] = i;
                cmp_row = x + (int64_t)r * V;
                qsort(order, (size_t)V, sizeof(int32_t), cmp_rank);
                for (int32_t q = 0; q < k; q++) {
                    CHECK(ids[r * k + q] == order[q], "cols %d k %d row %d rank %d: %d, want %d", V, k, r, q,
                          ids[r * k + q], order[q]);
                    CHECK(vals[r * k + q] == cmp_row[order[q]], "cols %d k %d: value", V, k);
                }
            }
        }
        free(order);
        be->ops->release(be, &t);
    }
    be->ops->free(be);
}
