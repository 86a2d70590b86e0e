/* path_data: where the binary finds its data (the catalog, the embedded
 * models): KAPITSA_DATA first, then beside the binary, with the places looked
 * in named when none has it. */
#define _POSIX_C_SOURCE 200809L
#include "../../src/base/err.h"
#include "../../src/base/path.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void test_path_data(void)
{
    char dir[4096], file[4200], out[8192];
    snprintf(dir, sizeof dir, "%s/path_data", test_tmpdir());
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/catalog.json", dir);
    FILE *f = fopen(file, "w");
    CHECK(f != NULL, "cannot write %s", file);
    if (f)
        fclose(f);
    setenv("KAPITSA_DATA", dir, 1);
    CHECK(path_data("catalog.json", out, sizeof out) == 0 && strcmp(out, file) == 0, "KAPITSA_DATA first: %s", out);
    /* what KAPITSA_DATA lacks comes from the source tree (the test binary's build/../models, or ./models) */
    CHECK(path_data("kapitsa-tiny", out, sizeof out) == 0 && strstr(out, "models/kapitsa-tiny"), "%s", out);
    CHECK(path_data("no-such-model", out, sizeof out) == -1 && strstr(err_msg(), "no-such-model is in none of") &&
              strstr(err_msg(), dir) && strstr(err_msg(), "share/kapitsa/models"),
          "%s", err_msg());
    unsetenv("KAPITSA_DATA");
}
