/* A throwaway PKI for TLS tests, made with the OpenSSL C API (EC P-256, valid two days, so that
 * tests with an advanced clock stay inside the validity):
 * in `dir`, ca.crt (the trusted cluster CA) with a.crt/a.key and b.crt/b.key signed by it,
 * and rogue-ca.crt with rogue.crt/rogue.key signed by that other CA. Tests therefore need
 * no openssl command. */
#ifndef STRATA_TESTS_WIRE_TEST_PKI_H
#define STRATA_TESTS_WIRE_TEST_PKI_H

/* 0, or STRATA_EIO with the failing step as strata_last_error(). */
int test_pki_make(const char *dir);

#endif
