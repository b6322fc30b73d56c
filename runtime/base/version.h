/* The Strata build's version, as stages report it (Control Describe, strata-serve's Info).
 * Bumped by hand on a release; the wire protocol has its own version (wire/message.h). */
#ifndef STRATA_RUNTIME_BASE_VERSION_H
#define STRATA_RUNTIME_BASE_VERSION_H

#define STRATA_VERSION "0.1.0"

#endif
