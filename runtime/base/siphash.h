/* SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash, for keys that a client
 * who does not know the 128-bit key cannot make collide (the prefix cache's block keys: a
 * collision there would serve one request another's KV). Header: the function only. */
#ifndef STRATA_RUNTIME_BASE_SIPHASH_H
#define STRATA_RUNTIME_BASE_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* SipHash-2-4 of data [len] under key [2] (k0, k1: the key's two little-endian halves). */
uint64_t strata_siphash(const uint64_t key[2], const void *data, size_t len);

#endif
