/* Helpers shared by Strata's cmocka tests. */
#ifndef STRATA_TESTS_TEST_UTIL_H
#define STRATA_TESTS_TEST_UTIL_H

/* Resolves a workspace-relative path (e.g. "tests/golden/dense_gqa") to the test's
 * runfiles directory. Returns a pointer to a static buffer. */
const char *test_path(const char *workspace_relative);

/* Reports that the whole test binary is skipped and why. `./strata test` counts a test
 * whose log contains a line starting with "skipped:" as skipped, never as passed.
 * Call it from main and return 0 right after. */
void test_skip_all(const char *reason);

#endif
