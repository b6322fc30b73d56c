/* Collectives among the ranks of one TP or KVP group: all-reduce (sum, fp32),
 * all-gather and broadcast, over the framed TCP transport (TLS and the Hello handshake
 * included) or over POSIX shared memory when the ranks share a host.
 *
 * Determinism (the project's guarantee that results never depend on timing): an all-reduce
 * adds the ranks' vectors in one fixed order, rank 0 first,
 *     out[i] = (((x0[i] + x1[i]) + x2[i]) + ...) + x{N-1}[i],
 * the same on every transport, so the result is bit-identical on every rank, between TCP and
 * shared memory, and to a sequential sum in rank order, whatever order messages arrive in.
 *   - TCP: a ring of one connection per direction (rank r connects to r+1, accepts r-1).
 *     The reduction is a chain: rank 0 sends its chunk to 1, rank r adds its own values to the
 *     partial it receives (partial + own: the order above) and passes it on, rank N-1 holds
 *     the final chunk and sends it on around the ring (N-1 -> 0 -> 1 -> ... -> N-2). Chunks of
 *     COLL_TCP_CHUNK floats pipeline the chain, so each link carries the vector at most twice;
 *     latency is 2(N-1) hops. (A ring reduce-scatter would start each chunk's sum at another
 *     rank and so change the order per chunk.) All-gather passes each rank's block around
 *     the ring; broadcast passes the root's vector down the chain root -> root+1 -> ...
 *     Each rank has one sender thread (the only user of the connection to r+1) and receives
 *     on the caller's thread (the only user of the connection from r-1): no TLS object is
 *     shared between threads and a full socket buffer never deadlocks the ring.
 *   - Shared memory: every rank copies its chunk into its slot; after a barrier rank r sums
 *     the elements of its 1/N of the chunk over the slots in rank order into a result area;
 *     after a second barrier every rank copies the result out. Two sets of slots alternate
 *     between rounds, so a round needs only those two barriers.
 *
 * Frames: data travels as Activation frames (no schema change), fields used as
 *   stage_from = sender's group rank, stage_to = receiver's group rank, step = the operation's
 *   sequence number in the group (every rank calls the same operations in the same order),
 *   nonce = (op << 32) | origin rank, pos = element offset of the chunk, hidden = the chunk
 *   as a 1-D F32 tensor. A frame that does not match what the receiver expects (another op,
 *   sequence, sender, offset or length) is a desync error, never silently summed.
 *   The Hello of each ring link carries stage_index = the rank, layer_start = the group size
 *   and name = "coll <group>"; a peer of another group, rank or size is refused.
 *
 * Failure: every blocking call (open, each operation) ends within timeout_ms. A dead or
 * closed peer gives STRATA_ECLOSED / STRATA_EIO / STRATA_ETIMEOUT naming the rank; the
 * failing rank then closes its links (TCP) or raises the group's abort flag (shm), so the
 * others fail promptly too. After an error the communicator only reports it again. */
#ifndef STRATA_WIRE_COLLECTIVE_H
#define STRATA_WIRE_COLLECTIVE_H

#include <stddef.h>
#include <stdint.h>

#include "wire/auth.h"
#include "wire/tls.h"
#include "wire/transport.h"

#define COLL_MAX_RANKS 64
#define COLL_TCP_CHUNK ((size_t)1 << 16) /* floats per TCP frame (256 KiB) */
#define COLL_SHM_SLOT ((size_t)1 << 18)  /* default floats per shm slot and round */
#define COLL_DEFAULT_TIMEOUT_MS 10000

enum coll_transport { COLL_TCP = 0, COLL_SHM = 1 };

struct coll_options {
    int rank;          /* this process's rank in the group, 0 <= rank < size */
    int size;          /* ranks in the group, 1 <= size <= COLL_MAX_RANKS */
    const char *group; /* group name (e.g. "s0.k1.tp"), checked at Hello; <= 48 chars */
    int timeout_ms;    /* every blocking call; 0 = COLL_DEFAULT_TIMEOUT_MS */

    /* TCP: every rank's listen address; a NULL hosts (or entry) means 127.0.0.1. */
    const char *const *hosts; /* [size] */
    const int *ports;         /* [size] */
    const char *listen_host;  /* where this rank listens (e.g. "0.0.0.0"); NULL = hosts[rank] */
    /* Optional: an already bound listener for this rank (taken over and closed by
     * coll_close); else the rank listens on listen_host:ports[rank]. */
    struct wire_listener *listener;
    struct wire_tls *tls;            /* NULL = plaintext */
    const struct wire_auth_key *key; /* Hello HMAC key (NULL or len 0 = none) */
    const uint8_t *fingerprint;      /* [WIRE_FINGERPRINT_BYTES] model fingerprint or NULL */

    /* Shared memory: a name unique to this group and run ("/strata-..."); rank 0 creates
     * it and unlinks it once every rank has attached. */
    const char *shm_name;
    size_t shm_slot_floats; /* 0 = COLL_SHM_SLOT */

    /* coll_open only: stay on TCP even when every rank shares this host. */
    int tcp_only;
};

struct coll;

/* Opens the group on TCP (connects the ring, runs TLS and the Hello on each link) or on
 * shared memory. Every rank of the group must call it within timeout_ms of the others. */
int coll_open_tcp(struct coll **out, const struct coll_options *options);
int coll_open_shm(struct coll **out, const struct coll_options *options);
/* What a stage uses: opens the TCP ring, and when every rank runs on this host (same host
 * name and kernel boot id, exchanged over the ring) and tcp_only is 0, moves the data plane to
 * shared memory under a fresh name that rank 0 draws and sends around the ring (shm_name is
 * ignored). The ring stays open beside it. coll_transport_of() tells which was chosen. */
int coll_open(struct coll **out, const struct coll_options *options);

/* Closes links / unmaps; accepts NULL. */
void coll_close(struct coll *c);

/* Sets the limit of every later blocking call (timeout_ms >= 1). Called between operations
 * only (e.g. a TP follower waits for its leader's next command without a practical limit,
 * then bounds the data that follows). */
int coll_set_timeout(struct coll *c, int timeout_ms);
int coll_timeout(const struct coll *c);

enum coll_transport coll_transport_of(const struct coll *c);
int coll_rank(const struct coll *c);
int coll_size(const struct coll *c);

/* data[n] <- the sum over ranks of data[n], in rank order (see above). n may be 0; every
 * rank passes the same n. */
int coll_allreduce_sum(struct coll *c, float *data, size_t n);

/* out[size * n] <- every rank's in[n], rank r's at out + r·n. `in` may alias out + rank·n. */
int coll_allgather(struct coll *c, float *out, const float *in, size_t n);

/* data[n] <- root's data[n] on every rank. */
int coll_broadcast(struct coll *c, float *data, size_t n, int root);

/* What this rank's operations have cost so far (benchmarks and the stage's log
 * ask for the all-reduce time per token): per kind, the calls made, the floats they
 * carried (n of each call) and the wall time spent inside them, which is the transfer plus
 * the wait for the slowest rank to arrive. Zero-length and size-1 calls are not counted. */
struct coll_op_stats {
    uint64_t calls, floats, ns;
};
struct coll_stats {
    struct coll_op_stats allreduce, allgather, broadcast;
};
void coll_stats_get(const struct coll *c, struct coll_stats *out);

#endif
