/* strata-stage --probe-links FILE: instead of serving, each stage of a ring measures its link
 * to the next stage with the stages' own frames and transport (wire/link_probe.h), while it
 * echoes the probe of the stage before it, and writes what it measured to FILE as the hosts
 * file's link object for strata-plan --hosts. Every stage of the ring runs with the same flags
 * it serves with (listen address, next stage, TLS key or certificates) plus --probe-links. */
#ifndef STRATA_RUNTIME_STRATA_STAGE_PROBE_H
#define STRATA_RUNTIME_STRATA_STAGE_PROBE_H

#include "runtime/strata_stage_args.h"
#include "wire/tls.h"

/* Returns the exit code (0: the link measured and FILE written). tls NULL: plaintext. */
int strata_stage_probe_links(const struct args *a, const char *listen_host, int listen_port,
                             struct wire_tls *tls, int hidden);

#endif
