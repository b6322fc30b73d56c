/* The whole wire API in one include: messages and codec, transport, TLS, handshake. */
#ifndef STRATA_WIRE_WIRE_H
#define STRATA_WIRE_WIRE_H

#include "wire/auth.h"
#include "wire/codec.h"
#include "wire/message.h"
#include "wire/tls.h"
#include "wire/transport.h"

#endif
