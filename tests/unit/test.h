/* test: a minimal test harness. Each test file defines functions registered in
 * tests/unit/main.c; CHECK records a failure with its location and goes on. */
#ifndef KP_TEST_H
#define KP_TEST_H

#include <stdio.h>

extern int test_failures; /* failures in the current test */

/* Marks the current test skipped, saying why (what it checks cannot run here:
 * no CUDA device): it counts as skipped, not passed, unless a check failed. */
void test_skip(const char *why);

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            test_failures++;                                                                                   \
            fprintf(stderr, "  %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);                         \
            fprintf(stderr, __VA_ARGS__);                                                                      \
            fputc('\n', stderr);                                                                               \
        }                                                                                                      \
    } while (0)

/* Directory of the committed fixtures (tests/fixtures), from KAPITSA_FIXTURES or the default. */
const char *test_fixtures(void);
/* The backend model-level tests run on: KAPITSA_TEST_DEVICE (cpu, cuda; default
 * cpu), two cpu threads, precise GPU products. NULL with err_set() if unusable. */
struct backend *test_backend(void);
/* A fresh temporary directory for this test run (removed by tests/run.sh). */
const char *test_tmpdir(void);
/* text under grammar gm (test_grammar.c): -1 refused at some byte, 0 open,
 * 1 complete; fed whole it must get the same verdict (a failed check if not). */
struct grammar;
int test_verdict(const struct grammar *gm, const char *text);

#endif
