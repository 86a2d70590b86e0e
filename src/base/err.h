/* err: the last expected-failure message of the calling thread.
 *
 * Library code never prints or exits on bad input: it returns an error code
 * and records one human-readable, module-prefixed message here
 * ("safetensors: model.safetensors: tensor 'x': offsets past end of file").
 * The caller (CLI, server) decides how to show it. The message lives in
 * thread-local storage until the next err_set on the same thread. */
#ifndef KP_ERR_H
#define KP_ERR_H

#if defined(__GNUC__)
#define KP_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KP_PRINTF(a, b)
#endif

/* Records the message; always returns -1 so that `return err_set(...)` reads well. */
int err_set(const char *fmt, ...) KP_PRINTF(1, 2);
/* The last message of this thread, "" if none. */
const char *err_msg(void);
void err_clear(void);

#endif
