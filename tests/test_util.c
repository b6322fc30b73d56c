/* Helpers shared by Strata's cmocka tests. */
#include "tests/test_util.h"

#include <stdio.h>
#include <stdlib.h>

const char *test_path(const char *workspace_relative) {
    static char buf[4096];
    const char *dir = getenv("TEST_SRCDIR");
    const char *ws = getenv("TEST_WORKSPACE");
    if (dir && ws)
        snprintf(buf, sizeof buf, "%s/%s/%s", dir, ws, workspace_relative);
    else
        snprintf(buf, sizeof buf, "%s", workspace_relative);
    return buf;
}

void test_skip_all(const char *reason) {
    printf("skipped: %s\n", reason);
    fflush(stdout);
}
