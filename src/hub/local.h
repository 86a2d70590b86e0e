/* local: GGUF models where other tools keep them, found and named so that
 * `kapitsa list` shows them and --model takes them:
 *   the Hugging Face cache   a repo's .gguf files, named ORG/NAME:QUANT (pulled
 *                            by `kapitsa pull ORG/NAME:QUANT`, huggingface-cli or
 *                            llama.cpp's -hf)
 *   llama.cpp's cache        LLAMA_CACHE, else ~/.cache/llama.cpp: .gguf files,
 *                            named by their path
 *   Ollama's store           OLLAMA_MODELS, else ~/.ollama/models, else
 *                            /usr/share/ollama/.ollama/models: manifests/HOST/NS/
 *                            NAME/TAG (JSON naming the model layer's digest) and
 *                            blobs/sha256-HEX (the GGUF itself), named
 *                            ollama:NAME:TAG */
#ifndef KP_HUB_LOCAL_H
#define KP_HUB_LOCAL_H

#include <stddef.h>
#include <stdint.h>

struct local_gguf {
    char name[4096]; /* what --model takes */
    char path[4096]; /* the file (a split set's first part) */
    int64_t bytes;   /* the file's size (all parts of a split set) */
    const char *where; /* "hf", "llama.cpp" or "ollama" */
};

/* Every GGUF model found, into a new array (free() it). -1 with err_set() only
 * when out of memory: stores that are absent are skipped. */
int local_gguf_list(struct local_gguf **out, int32_t *n);
/* ollama:NAME[:TAG] (TAG default latest; NAME may be NS/NAME) to its model
 * blob. -1 with err_set() saying what is missing. */
int local_ollama_path(const char *ref, char *out, size_t n);
/* The GGUF of quant in a snapshot folder (the first part of a split set):
 * -1 with err_set() when there is none. */
int local_snapshot_gguf(const char *snapshot, const char *quant, char *out, size_t n);

#endif
