/* make_test_pki DIR: writes the throwaway PKI of test_pki.h into DIR (created if missing),
 * for the pipeline TLS test. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/base/status.h"
#include "tests/wire/test_pki.h"

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: make_test_pki DIR\n");
        return 2;
    }
    if (mkdir(argv[1], 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "make_test_pki: mkdir %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    if (test_pki_make(argv[1]) < 0) {
        fprintf(stderr, "make_test_pki: %s\n", strata_last_error());
        return 1;
    }
    return 0;
}
