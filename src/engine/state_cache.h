/* state_cache: the recurrent state of the recurrent layers (DeltaNet, Mamba2)
 * of one context, beside the KV cache.
 *
 * Storage is a pool of slots allocated once: per recurrent layer a conv tensor
 * [n_slots][(K-1)*conv_dim] and a state tensor [n_slots][state_dim], F32 in
 * backend memory. Slot 0 is kept all zeros (a fresh sequence copies it). Each
 * live sequence holds one slot: its state after its committed tokens. A
 * forward writes new states into fresh slots (never into a committed one), so
 * a commit only re-points the sequence at the slot of the row it ends on, and
 * a forward that is not committed changes nothing. Nothing here allocates
 * after state_cache_init.
 *
 * Ownership: the cache owns the tensors and the tables. */
#ifndef KP_STATE_CACHE_H
#define KP_STATE_CACHE_H

#include "../model/model.h"

#include <stdint.h>

struct state_cache {
    struct backend *be;
    int32_t n_rec_layer;  /* 0: the model has no recurrent layer; every call is a no-op */
    int32_t n_slots;
    struct tensor *conv;  /* [n_rec_layer] each [n_slots][(K-1)*conv_dim] */
    struct tensor *ssm;   /* [n_rec_layer] each [n_slots][state_dim] */
    int32_t *free_ids;    /* stack of free slots */
    int32_t n_free;
    int32_t *seq_slot;    /* [n_seq_max] committed slot of each sequence, -1 when none */
    int32_t n_seq_max;
};

/* n_slots includes the zero slot. */
int state_cache_init(struct state_cache *sc, struct backend *be, const struct model_config *c, int32_t n_seq_max,
                     int32_t n_slots);
void state_cache_free(struct state_cache *sc);

/* A free slot, or -1 when none is left (no error message: callers decide). */
int32_t state_slot_take(struct state_cache *sc);
void state_slot_give(struct state_cache *sc, int32_t slot);
/* Copies the states of slot src into slot dst (every layer). */
void state_slot_copy(struct state_cache *sc, int32_t dst, int32_t src);

/* Gives seq a zeroed slot (a new sequence) or a copy of src's (a fork). -1
 * with err_set() when no slot is free. */
int state_seq_init(struct state_cache *sc, int32_t seq, int32_t src);
void state_seq_release(struct state_cache *sc, int32_t seq);
/* Makes slot the committed state of seq, giving back the one it replaces. */
void state_seq_set(struct state_cache *sc, int32_t seq, int32_t slot);

#endif
