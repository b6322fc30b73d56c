/* Oracle drafts, a benchmark instrument for speculative decoding: drafts read from a recorded
 * run of the same requests (the tokens the model did generate), each replaced by a wrong
 * token at a set rate. It measures the mechanism (rows per step, the ring's trips, what a
 * rejection costs) at a chosen acceptance, apart from how well any real drafter predicts a
 * given checkpoint: `./strata bench speculate` runs it at 1.0, 0.8, 0.6 and 0.4. Never a way
 * to serve: the output is still the model's own, verified as any draft is, but the drafts
 * come from knowing it in advance.
 *
 * The file: one line per request, "PROMPT_IDS GENERATED_IDS", each a comma-separated list
 * of token ids (what `strata-client` prints as a request's prompt and tokens). */
#ifndef STRATA_RUNTIME_STAGE_ORACLE_DRAFT_H
#define STRATA_RUNTIME_STAGE_ORACLE_DRAFT_H

#include <stdint.h>

struct oracle_draft; /* opaque */

/* Reads FILE; `accept` in [0, 1] is the chance that each draft is the recorded token (else
 * it is a token the model did not sample there). STRATA_EINVAL / EFORMAT naming the file and
 * line, STRATA_ENOTFOUND when it cannot be read. */
int oracle_draft_load(struct oracle_draft **out, const char *path, double accept);
void oracle_draft_free(struct oracle_draft *o); /* accepts NULL */

/* Up to k drafts for the request whose prompt is [prompt_len] after its first `generated`
 * tokens, into out [k]: how many (0 when no recorded line has this prompt or it has no
 * tokens left). Deterministic: the same request and step get the same drafts. */
int oracle_draft(const struct oracle_draft *o, const int32_t *prompt, int prompt_len, int generated,
                 int k, int vocab, int32_t *out);

#endif
