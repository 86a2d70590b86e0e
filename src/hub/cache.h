/* cache: the Hugging Face hub cache on disk, as huggingface_hub lays it out,
 * so that checkpoints downloaded by other tools are used in place:
 *   CACHE/models--ORG--NAME/blobs/ETAG            file contents (LFS: sha256)
 *   CACHE/models--ORG--NAME/snapshots/COMMIT/PATH relative symlinks to ../../blobs/ETAG
 *   CACHE/models--ORG--NAME/refs/REVISION         the commit a branch or tag points to
 * CACHE is HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub. Model references (run --model, serve, ...)
 * resolve through it: a folder, a catalog name, or an ORG/NAME hub id. */
#ifndef KP_HUB_CACHE_H
#define KP_HUB_CACHE_H

#include <stddef.h>
#include <stdint.h>

/* The cache folder (not created). */
void hub_cache_dir(char *out, size_t n);
/* CACHE/models--ORG--NAME for a hub id ORG/NAME; -1 with err_set() if the id is malformed. */
int hub_repo_dir(const char *repo, char *out, size_t n);
/* The snapshot folder of repo at revision (a branch/tag through refs/, or a
 * commit); -1 with err_set() if it is not in the cache. */
int hub_snapshot_dir(const char *repo, const char *revision, char *out, size_t n);
/* A model reference to what holds the model: an existing folder or .gguf
 * file, a catalog name or a hub id (its snapshot folder at main, or at the
 * catalog's revision), ORG/NAME:QUANT (that quantisation's GGUF in the
 * repo's snapshot), or ollama:NAME[:TAG] (the GGUF in Ollama's store; see
 * local.h). -1 with err_set() saying how to get it when it is not here. */
int hub_model_dir(const char *ref, char *out, size_t n);
/* Bytes of the blobs of a cached repo (each counted once). */
int64_t hub_repo_bytes(const char *repo);
/* Removes a cached repo (blobs, snapshots, refs); -1 with err_set() if absent. */
int hub_repo_remove(const char *repo);

#endif
