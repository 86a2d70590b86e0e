/* cache: paths in the Hugging Face hub cache (see cache.h). */
#define _GNU_SOURCE
#include "cache.h"

#include "../base/err.h"
#include "catalog.h"
#include "local.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void hub_cache_dir(char *out, size_t n)
{
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v)
        snprintf(out, n, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v)
        snprintf(out, n, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        snprintf(out, n, "%s/huggingface/hub", v);
    else
        snprintf(out, n, "%s/.cache/huggingface/hub", (v = getenv("HOME")) && *v ? v : "/tmp");
}

/* ORG/NAME with one slash, no "..", no empty part */
static int repo_ok(const char *repo)
{
    const char *s = strchr(repo, '/');
    return s && s != repo && s[1] && !strchr(s + 1, '/') && !strstr(repo, "..") && strlen(repo) < 200;
}

int hub_repo_dir(const char *repo, char *out, size_t n)
{
    if (!repo_ok(repo))
        return err_set("hub: '%s' is not a hub id (ORG/NAME)", repo);
    char cache[4096];
    hub_cache_dir(cache, sizeof cache);
    const char *s = strchr(repo, '/');
    snprintf(out, n, "%s/models--%.*s--%s", cache, (int)(s - repo), repo, s + 1);
    return 0;
}

int hub_snapshot_dir(const char *repo, const char *revision, char *out, size_t n)
{
    char dir[4608], commit[128] = "", path[4800];
    if (hub_repo_dir(repo, dir, sizeof dir) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/refs/%s", dir, revision);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(commit, sizeof commit, f))
            commit[0] = 0;
        fclose(f);
        commit[strcspn(commit, "\r\n")] = 0;
    } else {
        snprintf(commit, sizeof commit, "%s", revision); /* a commit given directly */
    }
    snprintf(out, n, "%s/snapshots/%s", dir, commit);
    /* a pull writes the ref last, so a snapshot a ref names is whole (a GGUF repo's has no config.json) */
    if (!commit[0] || strchr(commit, '/') || access(out, R_OK) != 0)
        return err_set("hub: %s (%s) is not downloaded; run: kapitsa pull %s", repo, revision, repo);
    return 0;
}

int hub_model_dir(const char *ref, char *out, size_t n)
{
    struct stat st;
    const size_t len = strlen(ref);
    if (stat(ref, &st) == 0 && (S_ISDIR(st.st_mode) || (S_ISREG(st.st_mode) && len > 5 &&
                                                        strcmp(ref + len - 5, ".gguf") == 0))) {
        snprintf(out, n, "%s", ref); /* a model folder, or a GGUF file */
        return 0;
    }
    if (ref[0] == '/' || ref[0] == '.' || ref[0] == '~')
        return err_set("hub: %s: No such file or directory (not a model folder or a .gguf file)", ref);
    if (strncmp(ref, "ollama:", 7) == 0)
        return local_ollama_path(ref + 7, out, n);
    const char *quant = strchr(ref, ':');
    if (quant && strchr(ref, '/') && strchr(ref, '/') < quant) { /* ORG/NAME:QUANT, a GGUF repo's file */
        char repo[256], snap[4608];
        snprintf(repo, sizeof repo, "%.*s", (int)(quant - ref), ref);
        if (!repo_ok(repo) || hub_snapshot_dir(repo, "main", snap, sizeof snap) != 0)
            return err_set("hub: %s is not downloaded (kapitsa pull %s)", ref, ref);
        return local_snapshot_gguf(snap, quant + 1, out, n);
    }
    struct catalog c;
    const char *repo = ref, *rev = "main";
    char rbuf[256], vbuf[128];
    if (catalog_load(&c, NULL) == 0) {
        const struct catalog_model *m = catalog_find(&c, ref);
        if (m) {
            snprintf(rbuf, sizeof rbuf, "%s", m->repo);
            snprintf(vbuf, sizeof vbuf, "%s", m->revision);
            repo = rbuf;
            rev = vbuf;
        }
        catalog_free(&c);
    }
    if (!repo_ok(repo))
        return err_set("hub: '%s' is not a folder, a catalog name (kapitsa list) or a hub id ORG/NAME", ref);
    return hub_snapshot_dir(repo, rev, out, n);
}

static int64_t walk_total;
static int add_size(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    if (flag == FTW_F)
        walk_total += st->st_size;
    return 0;
}

int64_t hub_repo_bytes(const char *repo)
{
    char dir[4608], blobs[4700];
    if (hub_repo_dir(repo, dir, sizeof dir) != 0)
        return 0;
    snprintf(blobs, sizeof blobs, "%s/blobs", dir);
    walk_total = 0;
    nftw(blobs, add_size, 16, FTW_PHYS);
    return walk_total;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 ? 0 : -1;
}

int hub_repo_remove(const char *repo)
{
    char dir[4608];
    struct stat st;
    if (hub_repo_dir(repo, dir, sizeof dir) != 0)
        return -1;
    if (stat(dir, &st) != 0)
        return err_set("hub: %s is not in the cache (%s)", repo, dir);
    if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return err_set("hub: cannot remove %s: %s", dir, strerror(errno));
    return 0;
}
