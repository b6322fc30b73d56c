/* Host memory bandwidth for the benchmarks' rooflines. Decode reads weights, so its roofline
 * is the READ bandwidth at the same thread count (each thread sums its share of a buffer),
 * not memcpy's (which also writes); memcpy is kept for reference. Best of 6 runs. */
#ifndef STRATA_REFERENCE_TOOLS_BANDWIDTH_H
#define STRATA_REFERENCE_TOOLS_BANDWIDTH_H

#include <stddef.h>

/* Bytes read per second over `bytes` split across `threads` (1..64); 0 when out of memory. */
double host_read_bandwidth(size_t bytes, int threads);

/* Bytes copied per second (each byte read once and written once); 0 when out of memory. */
double host_memcpy_bandwidth(size_t bytes, int threads);

#endif
