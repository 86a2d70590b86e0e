/* state_cache: slots of recurrent state beside the KV cache (see state_cache.h). */
#include "state_cache.h"

#include "../base/err.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int state_cache_init(struct state_cache *sc, struct backend *be, const struct model_config *c, int32_t n_seq_max,
                     int32_t n_slots)
{
    memset(sc, 0, sizeof *sc);
    sc->be = be;
    sc->n_seq_max = n_seq_max;
    sc->seq_slot = malloc((size_t)n_seq_max * sizeof(int32_t));
    if (!sc->seq_slot)
        return err_set("state_cache: out of memory");
    for (int32_t s = 0; s < n_seq_max; s++)
        sc->seq_slot[s] = -1;
    if (c->n_rec_layer == 0)
        return 0;
    sc->n_rec_layer = c->n_rec_layer;
    sc->n_slots = n_slots;
    sc->conv = calloc((size_t)c->n_rec_layer, sizeof *sc->conv);
    sc->ssm = calloc((size_t)c->n_rec_layer, sizeof *sc->ssm);
    sc->free_ids = calloc((size_t)n_slots, sizeof *sc->free_ids);
    if (!sc->conv || !sc->ssm || !sc->free_ids) {
        err_set("state_cache: out of memory");
        goto fail;
    }
    for (int32_t l = 0; l < c->n_rec_layer; l++)
        if (be->ops->alloc(be, &sc->conv[l], DT_F32, n_slots, (int64_t)(c->conv_kernel - 1) * c->rec_conv_dim) != 0 ||
            be->ops->alloc(be, &sc->ssm[l], DT_F32, n_slots, c->rec_state_dim) != 0) {
            char why[512]; /* the backend's message, kept before err_set writes over it */
            snprintf(why, sizeof why, "%s", err_msg());
            err_set("state_cache: %s, for the recurrent states of %d slots (fewer sequences need less)", why,
                    (int)n_slots);
            goto fail;
        }
    for (int32_t s = n_slots - 1; s >= 1; s--) /* slot 0 stays zero (alloc zero-fills) */
        sc->free_ids[sc->n_free++] = s;
    return 0;
fail:
    state_cache_free(sc);
    return -1;
}

void state_cache_free(struct state_cache *sc)
{
    for (int32_t l = 0; sc->conv && sc->ssm && l < sc->n_rec_layer; l++) {
        if (sc->conv[l].data)
            sc->be->ops->release(sc->be, &sc->conv[l]);
        if (sc->ssm[l].data)
            sc->be->ops->release(sc->be, &sc->ssm[l]);
    }
    free(sc->conv);
    free(sc->ssm);
    free(sc->free_ids);
    free(sc->seq_slot);
    memset(sc, 0, sizeof *sc);
}

int32_t state_slot_take(struct state_cache *sc) { return sc->n_free ? sc->free_ids[--sc->n_free] : -1; }

void state_slot_give(struct state_cache *sc, int32_t slot)
{
    assert(slot > 0 && slot < sc->n_slots && sc->n_free < sc->n_slots - 1);
    sc->free_ids[sc->n_free++] = slot;
}

void state_slot_copy(struct state_cache *sc, int32_t dst, int32_t src)
{
    for (int32_t l = 0; l < sc->n_rec_layer; l++) {
        sc->be->ops->copy_rows(sc->be, &sc->conv[l], &src, &dst, 1);
        sc->be->ops->copy_rows(sc->be, &sc->ssm[l], &src, &dst, 1);
    }
}

int state_seq_init(struct state_cache *sc, int32_t seq, int32_t src)
{
    assert(seq >= 0 && seq < sc->n_seq_max && sc->seq_slot[seq] < 0);
    if (sc->n_rec_layer == 0)
        return 0;
    int32_t slot = state_slot_take(sc);
    if (slot < 0)
        return err_set("state_cache: all %d recurrent state slots are in use", sc->n_slots - 1);
    state_slot_copy(sc, slot, src >= 0 ? sc->seq_slot[src] : 0);
    sc->seq_slot[seq] = slot;
    return 0;
}

void state_seq_release(struct state_cache *sc, int32_t seq)
{
    if (sc->n_rec_layer && sc->seq_slot[seq] > 0)
        state_slot_give(sc, sc->seq_slot[seq]);
    sc->seq_slot[seq] = -1;
}

void state_seq_set(struct state_cache *sc, int32_t seq, int32_t slot)
{
    if (sc->seq_slot[seq] > 0)
        state_slot_give(sc, sc->seq_slot[seq]);
    sc->seq_slot[seq] = slot;
}
