/* pull: the hub download protocol (see pull.h). References: huggingface_hub's
 * file_download.py (cache layout, .incomplete files, ETag / X-Linked-Etag,
 * X-Repo-Commit) and the hub's model info API. */
#define _GNU_SOURCE
#include "pull.h"

#include "../base/clock.h"
#include "../base/err.h"
#include "cache.h"

#include <curl/curl.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PULL_TRIES 6

struct pfile {
    char *name;
    char *shown; /* name as printed: control characters escaped (a hub's names reach the terminal) */
    int64_t size;
    char etag[72]; /* sha256 (LFS) or git blob sha1 */
    bool lfs;
};

struct pull {
    const char *repo, *endpoint;
    char auth[1100];
    char commit[72];
    char dir[4608], locks[4700];
    struct pfile *f;
    int32_t n_f, next, failed;
    char err[1024];
    pthread_mutex_t mu;
    int64_t total, done;
    double t0, last_draw;
    const struct hub_pull_opts *o;
};

static void curl_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static int mkdirs(const char *path)
{
    char tmp[4800];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* ---- the model info API ---- */

struct buf {
    char *p;
    size_t n;
};

static size_t buf_write(char *data, size_t sz, size_t nm, void *ctx)
{
    struct buf *b = ctx;
    size_t len = sz * nm;
    if (b->n + len > (64u << 20))
        return 0;
    char *q = realloc(b->p, b->n + len + 1);
    if (!q)
        return 0;
    memcpy(q + b->n, data, len);
    b->p = q;
    b->n += len;
    b->p[b->n] = 0;
    return len;
}

struct hdrs {
    char error_code[64];
};

static size_t hdr_cb(char *data, size_t sz, size_t nm, void *ctx)
{
    struct hdrs *h = ctx;
    size_t len = sz * nm;
    if (len > 13 && strncasecmp(data, "x-error-code:", 13) == 0) {
        const char *v = data + 13;
        while (*v == ' ')
            v++;
        snprintf(h->error_code, sizeof h->error_code, "%.*s", (int)strcspn(v, "\r\n"), v);
    }
    return len;
}

/* Whether a GGUF file's name holds quant as a word of its own (Q4_K_M in
 * "Qwen3-8B-Q4_K_M.gguf" or "Q4_K_M/x-00001-of-00002.gguf", not in "Q4_K_M_L"). */
bool hub_gguf_has_quant(const char *name, const char *quant)
{
    const size_t l = strlen(name), q = strlen(quant);
    if (l < 5 || strcmp(name + l - 5, ".gguf") != 0 || q == 0)
        return false;
    for (const char *p = name; (p = strcasestr(p, quant)); p++) {
        const char b = p == name ? '-' : p[-1], a = p[q];
        if (!isalnum((unsigned char)b) && b != '_' && !isalnum((unsigned char)a) && a != '_')
            return true;
    }
    return false;
}

static bool wanted(const struct pull *p, const char *name)
{
    if (p->o->quant)
        return hub_gguf_has_quant(name, p->o->quant);
    static const char *const keep[] = {"config.json", "generation_config.json", "tokenizer.json",
                                       "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"};
    if (strchr(name, '/'))
        return false;
    size_t l = strlen(name);
    if ((l > 12 && strcmp(name + l - 12, ".safetensors") == 0) ||
        (l > 23 && strcmp(name + l - 23, ".safetensors.index.json") == 0))
        return true;
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (strcmp(name, keep[i]) == 0)
            return true;
    return false;
}

/* Whether a listed name would leave the snapshot folder: absolute, or a
 * segment that is empty, "." or "..". */
static bool name_escapes(const char *name)
{
    if (name[0] == '/' || name[0] == '\0')
        return true;
    for (const char *seg = name;; seg++) {
        const size_t l = strcspn(seg, "/");
        if (l == 0 || (l == 1 && seg[0] == '.') || (l == 2 && seg[0] == '.' && seg[1] == '.'))
            return true;
        seg += l;
        if (!*seg)
            return false;
    }
}

/* name with its control characters as \xNN, malloc'd */
static char *name_shown(const char *name)
{
    char *out = malloc(4 * strlen(name) + 1), *o = out;
    for (const unsigned char *c = (const unsigned char *)name; out && *c; c++)
        o += *c < 0x20 || *c == 0x7f ? sprintf(o, "\\x%02x", *c) : sprintf(o, "%c", *c);
    if (out)
        *o = '\0';
    return out;
}

static bool hex_ok(const char *s, size_t n)
{
    if (strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdef", s[i]))
            return false;
    return true;
}

static int fetch_info(struct pull *p, const char *revision)
{
    char url[2048];
    snprintf(url, sizeof url, "%s/api/models/%s/revision/%s?blobs=true", p->endpoint, p->repo, revision);
    CURL *c = curl_easy_init();
    struct buf b = {0};
    struct hdrs h = {{0}};
    struct curl_slist *hl = p->auth[0] ? curl_slist_append(NULL, p->auth) : NULL;
    int rc = -1;
    long code = 0;
    if (!c)
        return err_set("pull: cannot start libcurl");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, hdr_cb);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &h);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "kapitsa/0.1");
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    json_t *root = b.p ? json_loads(b.p, 0, NULL) : NULL;
    const char *msg = root ? json_string_value(json_object_get(root, "error")) : NULL;
    if (cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_PROXY) {
        err_set("pull: cannot reach %s (%s): offline? HF_ENDPOINT names the hub to use instead (a mirror, or "
                "your own)", p->endpoint, curl_easy_strerror(cc));
    } else if (cc != CURLE_OK) {
        err_set("pull: %s: %s", url, curl_easy_strerror(cc));
    } else if (code == 401 || code == 403) {
        err_set("pull: %s is gated or private (HTTP %ld%s%s): %s", p->repo, code, msg ? ": " : "", msg ? msg : "",
                p->auth[0] ? "your HF_TOKEN has no access; accept the model's terms on its hub page"
                           : "set HF_TOKEN to a token with access (and accept the model's terms on its hub page)");
    } else if (code == 404) {
        if (strcmp(h.error_code, "RevisionNotFound") == 0)
            err_set("pull: %s has no revision '%s'", p->repo, revision);
        else
            err_set("pull: no model %s on %s (or it is private: set HF_TOKEN)", p->repo, p->endpoint);
    } else if (code != 200 || !root) {
        err_set("pull: %s: HTTP %ld%s%s", url, code, msg ? ": " : "", msg ? msg : "");
    } else {
        const char *sha = json_string_value(json_object_get(root, "sha"));
        json_t *sib = json_object_get(root, "siblings");
        if (!sha || !hex_ok(sha, 40) || !json_is_array(sib)) {
            err_set("pull: %s: the model info lacks a commit sha or a file list", url);
        } else {
            snprintf(p->commit, sizeof p->commit, "%s", sha);
            p->f = calloc(json_array_size(sib) + 1, sizeof *p->f);
            size_t i;
            json_t *s;
            rc = p->f ? 0 : err_set("pull: out of memory");
            json_array_foreach(sib, i, s) {
                const char *name = json_string_value(json_object_get(s, "rfilename"));
                if (rc == 0 && name && name_escapes(name)) {
                    char *shown = name_shown(name);
                    fprintf(p->o->progress ? p->o->progress : stderr,
                            "pull: skipping %s: its path leaves the snapshot folder\n", shown ? shown : "?");
                    free(shown);
                    continue;
                }
                if (rc != 0 || !name || !wanted(p, name))
                    continue;
                struct pfile *f = &p->f[p->n_f];
                json_t *lfs = json_object_get(s, "lfs");
                const char *e = lfs ? json_string_value(json_object_get(lfs, "sha256"))
                                    : json_string_value(json_object_get(s, "blobId"));
                f->lfs = lfs != NULL;
                f->size = json_integer_value(json_object_get(lfs ? lfs : s, "size"));
                f->shown = name_shown(name);
                if (!e || !hex_ok(e, f->lfs ? 64 : 40) || f->size < 0) {
                    rc = err_set("pull: %s: file %s has no valid %s and size", url, f->shown ? f->shown : "?",
                                 f->lfs ? "sha256" : "blob id");
                    free(f->shown);
                    f->shown = NULL;
                    continue;
                }
                f->name = strdup(name);
                if (!f->name || !f->shown) {
                    free(f->name);
                    free(f->shown);
                    f->name = f->shown = NULL;
                    rc = err_set("pull: out of memory");
                    continue;
                }
                snprintf(f->etag, sizeof f->etag, "%s", e);
                p->total += f->size;
                p->n_f++;
            }
            if (rc == 0 && p->n_f == 0 && p->o->quant)
                rc = err_set("pull: %s has no .gguf file of quantisation %s", p->repo, p->o->quant);
            else if (rc == 0 && p->n_f == 0)
                rc = err_set("pull: %s has no safetensors weights or configs to fetch", p->repo);
        }
    }
    json_decref(root);
    free(b.p);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return rc;
}

/* ---- one file ---- */

struct sink {
    struct pull *p;
    FILE *fp;
    int write_errno;
    int64_t got;
    CURL *c;
    int64_t have, size; /* bytes already on disk, the listed size */
    bool over;          /* the server sent more than the listed size */
};

static void draw(struct pull *p, bool force)
{
    const struct hub_pull_opts *o = p->o;
    double t = clock_now_s();
    if (!o->progress || !o->bar || (!force && t - p->last_draw < 0.2))
        return;
    p->last_draw = t;
    double el = t - p->t0, rate = el > 0 ? (double)p->done / el : 0;
    int width = 30, fill = p->total ? (int)(width * p->done / p->total) : width;
    double eta = rate > 0 ? (double)(p->total - p->done) / rate : 0;
    fprintf(o->progress, "\r[%.*s%*s] %7.1f / %.1f MB  %6.1f MB/s  ETA %4.0fs ", fill,
            "##############################", width - fill, "", (double)p->done / 1e6, (double)p->total / 1e6,
            rate / 1e6, eta);
    fflush(o->progress);
}

static size_t file_write(char *data, size_t sz, size_t nm, void *ctx)
{
    struct sink *s = ctx;
    size_t len = sz * nm;
    /* the listed size bounds what is taken: the rest of it after a range
     * answered with 206, the whole of it otherwise */
    long code = 0;
    curl_easy_getinfo(s->c, CURLINFO_RESPONSE_CODE, &code);
    if (s->got + (int64_t)len > (code == 206 ? s->size - s->have : s->size)) {
        s->over = true;
        return 0;
    }
    if (fwrite(data, 1, len, s->fp) != len || fflush(s->fp) != 0) {
        s->write_errno = errno ? errno : EIO;
        return 0;
    }
    s->got += (int64_t)len;
    pthread_mutex_lock(&s->p->mu);
    s->p->done += (int64_t)len;
    draw(s->p, false);
    pthread_mutex_unlock(&s->p->mu);
    return len;
}

/* sha256 (LFS) or git's blob sha1 of the finished file, as lowercase hex */
static int file_digest(const char *path, const struct pfile *f, char *hex)
{
    FILE *fp = fopen(path, "rb");
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char md[EVP_MAX_MD_SIZE], chunk[1 << 16];
    unsigned int mdlen = 0;
    int rc = -1;
    if (fp && ctx && EVP_DigestInit_ex(ctx, f->lfs ? EVP_sha256() : EVP_sha1(), NULL) == 1) {
        if (!f->lfs) {
            char head[64];
            int hl = snprintf(head, sizeof head, "blob %lld", (long long)f->size);
            EVP_DigestUpdate(ctx, head, (size_t)hl + 1); /* with its NUL */
        }
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, fp)) > 0)
            EVP_DigestUpdate(ctx, chunk, got);
        if (!ferror(fp) && EVP_DigestFinal_ex(ctx, md, &mdlen) == 1) {
            for (unsigned int i = 0; i < mdlen; i++)
                sprintf(hex + 2 * i, "%02x", md[i]);
            rc = 0;
        }
    }
    if (fp)
        fclose(fp);
    EVP_MD_CTX_free(ctx);
    return rc;
}

static bool transient(CURLcode cc)
{
    return cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
           cc == CURLE_COULDNT_CONNECT || cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_GOT_NOTHING ||
           cc == CURLE_HTTP2 || cc == CURLE_HTTP2_STREAM;
}

/* Downloads f into blob.incomplete (resuming), checks it, renames it. */
static int fetch_blob(struct pull *p, const struct pfile *f, const char *blob)
{
    char part[4900], url[4096];
    snprintf(part, sizeof part, "%s.incomplete", blob);
    CURL *c = curl_easy_init();
    /* the name percent-encoded a segment at a time */
    int o = snprintf(url, sizeof url, "%s/%s/resolve/%s", p->endpoint, p->repo, p->commit);
    for (const char *seg = f->name; c && *seg && o > 0 && (size_t)o < sizeof url;) {
        const size_t l = strcspn(seg, "/");
        char *e = curl_easy_escape(c, seg, (int)l);
        o += snprintf(url + o, sizeof url - (size_t)o, "/%s", e ? e : "");
        curl_free(e);
        seg += l + (seg[l] == '/');
    }
    struct curl_slist *hl = p->auth[0] ? curl_slist_append(NULL, p->auth) : NULL;
    int rc = -1;
    if (!c)
        return err_set("pull: cannot start libcurl");
    for (int attempt = 0; attempt < PULL_TRIES; attempt++) {
        struct stat st;
        int64_t have = stat(part, &st) == 0 ? st.st_size : 0;
        if (have > f->size) {
            if (truncate(part, 0) != 0) {
                err_set("pull: cannot truncate %s: %s", part, strerror(errno));
                break;
            }
            have = 0;
        }
        struct sink s = {p, fopen(part, "ab"), 0, 0, c, have, f->size, false};
        if (!s.fp) {
            err_set("pull: cannot write %s: %s", part, strerror(errno));
            break;
        }
        char range[64];
        snprintf(range, sizeof range, "%lld-", (long long)have);
        curl_easy_reset(c);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, file_write);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
        curl_easy_setopt(c, CURLOPT_USERAGENT, "kapitsa/0.1");
        if (have > 0 && have < f->size)
            curl_easy_setopt(c, CURLOPT_RANGE, range);
        CURLcode cc = have == f->size ? CURLE_OK : curl_easy_perform(c);
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        fclose(s.fp);
        if (cc == CURLE_OK && have > 0 && code == 200) {
            /* the server ignored the range and sent the whole file after the part we had */
            pthread_mutex_lock(&p->mu);
            p->done -= have;
            pthread_mutex_unlock(&p->mu);
            FILE *in = fopen(part, "rb");
            int ok = in && fseeko(in, have, SEEK_SET) == 0;
            char tmp[5000];
            snprintf(tmp, sizeof tmp, "%s.whole", part);
            FILE *out = ok ? fopen(tmp, "wb") : NULL;
            char chunk[1 << 16];
            size_t got;
            while (out && (got = fread(chunk, 1, sizeof chunk, in)) > 0)
                ok &= fwrite(chunk, 1, got, out) == got;
            if (in)
                fclose(in);
            if (!out || fclose(out) != 0 || !ok || rename(tmp, part) != 0) {
                err_set("pull: cannot rewrite %s: %s", part, strerror(errno));
                break;
            }
        }
        if (s.over) {
            unlink(part);
            err_set("pull: %s: the hub sent more than the %lld bytes it lists; the download was discarded, nothing "
                    "installed",
                    f->shown, (long long)f->size);
            break;
        }
        if (s.write_errno) {
            err_set("pull: writing %s failed: %s%s", part, strerror(s.write_errno),
                    s.write_errno == ENOSPC || s.write_errno == EFBIG
                        ? " (disk full or file size limit; free space and run pull again to resume)"
                        : "");
            break;
        }
        if (cc != CURLE_OK) {
            if (transient(cc) && attempt + 1 < PULL_TRIES) {
                usleep(200000u << (attempt < 4 ? attempt : 4));
                continue;
            }
            if (code >= 400)
                err_set("pull: %s: HTTP %ld", url, code);
            else
                err_set("pull: %s: %s (the partial file is kept; run pull again to resume)", url,
                        curl_easy_strerror(cc));
            break;
        }
        if (stat(part, &st) != 0 || st.st_size != f->size) {
            if (attempt + 1 < PULL_TRIES)
                continue; /* short: resume */
            err_set("pull: %s: got %lld bytes of %lld", f->shown, (long long)(stat(part, &st) == 0 ? st.st_size : 0),
                    (long long)f->size);
            break;
        }
        char hex[2 * EVP_MAX_MD_SIZE + 1];
        if (file_digest(part, f, hex) != 0) {
            err_set("pull: cannot read back %s", part);
            break;
        }
        if (strcmp(hex, f->etag) != 0) {
            unlink(part);
            err_set("pull: %s: %s mismatch (expected %s, got %s); the download was discarded, nothing installed",
                    f->shown, f->lfs ? "sha256" : "git blob sha1", f->etag, hex);
            break;
        }
        if (rename(part, blob) != 0) {
            err_set("pull: cannot rename %s: %s", part, strerror(errno));
            break;
        }
        rc = 0;
        break;
    }
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return rc;
}

/* snapshots/COMMIT/NAME -> ../../blobs/ETAG (one more ../ a folder in NAME) */
static int link_file(struct pull *p, const struct pfile *f)
{
    char snap[4800], path[5000], target[256], tmp[5100];
    snprintf(snap, sizeof snap, "%s/snapshots/%s", p->dir, p->commit);
    snprintf(path, sizeof path, "%s/%s", snap, f->name);
    const char *slash = strrchr(path, '/');
    snprintf(tmp, sizeof tmp, "%.*s", (int)(slash - path), path);
    if (mkdirs(tmp) != 0)
        return err_set("pull: cannot create %s: %s", tmp, strerror(errno));
    size_t o = 0;
    for (const char *c = f->name; (c = strchr(c, '/')); c++)
        o += (size_t)snprintf(target + o, sizeof target - o, "../");
    snprintf(target + o, sizeof target - o, "../../blobs/%s", f->etag);
    snprintf(tmp, sizeof tmp, "%s.%d.lnk", path, (int)getpid());
    unlink(tmp);
    if (symlink(target, tmp) != 0 || rename(tmp, path) != 0)
        return err_set("pull: cannot link %s: %s", path, strerror(errno));
    return 0;
}

static int pull_file(struct pull *p, const struct pfile *f)
{
    char blob[4800], lock[4800];
    struct stat st;
    snprintf(blob, sizeof blob, "%s/blobs/%s", p->dir, f->etag);
    snprintf(lock, sizeof lock, "%s/%s.lock", p->locks, f->etag);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return err_set("pull: cannot open %s: %s", lock, strerror(errno));
    flock(fd, LOCK_EX); /* another pull of the same blob finishes first */
    int rc = 0;
    if (stat(blob, &st) == 0 && st.st_size == f->size) {
        pthread_mutex_lock(&p->mu);
        p->done += f->size;
        pthread_mutex_unlock(&p->mu);
    } else {
        rc = fetch_blob(p, f, blob);
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (rc == 0)
        rc = link_file(p, f);
    if (rc == 0 && p->o->progress && !p->o->bar) {
        pthread_mutex_lock(&p->mu);
        fprintf(p->o->progress, "pull: %s  %.1f MB  ok\n", f->shown, (double)f->size / 1e6);
        pthread_mutex_unlock(&p->mu);
    }
    return rc;
}

static void *worker(void *ctx)
{
    struct pull *p = ctx;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int32_t i = p->failed ? p->n_f : p->next++;
        pthread_mutex_unlock(&p->mu);
        if (i >= p->n_f)
            return NULL;
        if (pull_file(p, &p->f[i]) != 0) {
            pthread_mutex_lock(&p->mu);
            if (!p->failed)
                snprintf(p->err, sizeof p->err, "%s", err_msg());
            p->failed = 1;
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int hub_pull(const char *repo, const char *revision, const struct hub_pull_opts *o, char *out, size_t n)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_once);
    struct pull p = {0};
    p.repo = repo;
    p.o = o;
    pthread_mutex_init(&p.mu, NULL);
    signal(SIGXFSZ, SIG_IGN); /* a file size limit is an EFBIG error, not a kill */
    const char *ep = o->endpoint ? o->endpoint : getenv("HF_ENDPOINT");
    p.endpoint = ep && *ep ? ep : "https://huggingface.co";
    const char *tok = o->token ? o->token : getenv("HF_TOKEN");
    if (tok && *tok)
        snprintf(p.auth, sizeof p.auth, "Authorization: Bearer %s", tok);
    int rc = -1;
    char cache[4096], refs[5000], tmp[5100];
    if (!*revision || strstr(revision, "..") || strspn(revision, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                  "0123456789._-/") != strlen(revision)) {
        err_set("pull: '%s' is not a revision (a branch, tag or commit)", revision);
        goto done;
    }
    if (hub_repo_dir(repo, p.dir, sizeof p.dir) != 0 || fetch_info(&p, revision) != 0)
        goto done;
    hub_cache_dir(cache, sizeof cache);
    snprintf(p.locks, sizeof p.locks, "%s/.locks/%s", cache, strrchr(p.dir, '/') + 1);
    snprintf(tmp, sizeof tmp, "%s/blobs", p.dir);
    if (mkdirs(tmp) != 0 || mkdirs(p.locks) != 0) {
        err_set("pull: cannot create %s: %s", tmp, strerror(errno));
        goto done;
    }
    p.t0 = clock_now_s();
    for (int32_t i = 0; o->check && !o->quant && i < p.n_f; i++) {
        if (strcmp(p.f[i].name, "config.json") != 0)
            continue;
        const struct pfile cfg = p.f[i];
        p.f[i] = p.f[0];
        p.f[0] = cfg;
        char snap[4700];
        snprintf(snap, sizeof snap, "%s/snapshots/%s", p.dir, p.commit);
        if (pull_file(&p, &p.f[0]) != 0)
            goto done;
        if (o->check(snap) != 0) {
            char why[1024];
            snprintf(why, sizeof why, "%s", err_msg());
            err_set("pull: %s is not a model Kapitsa runs (%s); nothing more was downloaded", repo, why);
            goto done;
        }
        p.next = 1;
        break;
    }
    int32_t nt = o->n_parallel > 0 ? o->n_parallel : 4;
    if (nt > p.n_f)
        nt = p.n_f;
    pthread_t th[16];
    if (nt > 16)
        nt = 16;
    int32_t started = 0;
    for (; started < nt; started++)
        if (pthread_create(&th[started], NULL, worker, &p) != 0)
            break;
    if (started == 0)
        worker(&p);
    for (int32_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    draw(&p, true);
    if (o->progress && o->bar)
        fputc('\n', o->progress);
    if (p.failed) {
        err_set("%s", p.err);
        goto done;
    }
    if (strcmp(revision, p.commit) != 0) {
        char ref_path[4900];
        snprintf(ref_path, sizeof ref_path, "%s/refs/%s", p.dir, revision);
        snprintf(refs, sizeof refs, "%s", ref_path);
        *strrchr(refs, '/') = 0; /* a branch like pr/1 lives in a subfolder */
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", ref_path, (int)getpid());
        FILE *f = mkdirs(refs) == 0 ? fopen(tmp, "w") : NULL;
        if (!f || fputs(p.commit, f) < 0 || fclose(f) != 0 || rename(tmp, ref_path) != 0) {
            err_set("pull: cannot write %s: %s", ref_path, strerror(errno));
            goto done;
        }
    }
    snprintf(out, n, "%s/snapshots/%s", p.dir, p.commit);
    rc = 0;
done:
    for (int32_t i = 0; i < p.n_f; i++) {
        free(p.f[i].name);
        free(p.f[i].shown);
    }
    free(p.f);
    pthread_mutex_destroy(&p.mu);
    return rc;
}
