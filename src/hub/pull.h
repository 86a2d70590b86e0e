/* pull: downloads a model from a Hugging Face hub (the hub's HTTP protocol
 * with libcurl) into the hub cache (cache.h).
 *
 * The file list comes from the model info API (GET /api/models/REPO/revision/REV
 * ?blobs=true: the commit, each file's size and, for LFS files, its sha256);
 * each wanted file (weights, configs, tokenizer, chat template; or a GGUF
 * repo's files of one quantisation) is fetched
 * from /REPO/resolve/COMMIT/FILE, following redirects, into
 * blobs/ETAG.incomplete, resumed with Range after a dropped connection or an
 * interrupted pull, checked (size, and sha256 for LFS files or the git blob
 * sha1 for others), and only then renamed to blobs/ETAG and linked from the
 * snapshot. A file lock per blob lets two pulls of one model run at once.
 * HF_ENDPOINT and HF_TOKEN are honoured; gated and missing repos, and a hub
 * that cannot be reached, get errors that say what to do. config.json comes
 * first, so that a model the caller cannot run is refused before its weights. */
#ifndef KP_HUB_PULL_H
#define KP_HUB_PULL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct hub_pull_opts {
    const char *endpoint; /* NULL: HF_ENDPOINT, else https://huggingface.co */
    const char *token;    /* NULL: HF_TOKEN, else none */
    int32_t n_parallel;   /* files at once; <= 0: 4 */
    FILE *progress;       /* NULL: quiet */
    bool bar;             /* a redrawn progress bar (a terminal) instead of a line per file */
    const char *quant;    /* a GGUF repo's quantisation (Q4_K_M, ...): only the .gguf files whose name
                             holds it (every part of a split set, in folders too); NULL: safetensors */
    /* Called once config.json is in the snapshot folder (its path), before any
     * other file is fetched: -1 with err_set() refuses the model (one the
     * caller cannot run) and the pull stops there. NULL, a quantisation's pull
     * or a repo without config.json: no check. */
    int (*check)(const char *snapshot);
};

/* Fetches repo at revision; out receives the snapshot folder. -1 with
 * err_set() on failure (nothing half-written is left looking complete). */
int hub_pull(const char *repo, const char *revision, const struct hub_pull_opts *o, char *out, size_t n);
/* Whether a .gguf file name holds quant as a word of its own (case-insensitive). */
bool hub_gguf_has_quant(const char *name, const char *quant);

#endif
