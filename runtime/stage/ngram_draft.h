/* Model-free draft tokens for speculative decoding (prompt lookup): the tokens that followed
 * the latest earlier occurrence of the sequence's last n tokens, for the longest n that
 * occurs. Chats, code and summaries repeat their own text (names, identifiers, quoted
 * lines), and a greedy model often settles into a loop; both continue an earlier span, and
 * each draft the target model confirms is a token that cost no step of its own.
 *
 * Pure and deterministic: the same sequence gives the same drafts, so a request's steps
 * (and the frames a pipeline sends) do not depend on timing. */
#ifndef STRATA_RUNTIME_STAGE_NGRAM_DRAFT_H
#define STRATA_RUNTIME_STAGE_NGRAM_DRAFT_H

#include <stdint.h>

/* The longest suffix searched for (then shorter ones, down to one token). */
#define NGRAM_DRAFT_MAX_N 3

/* Writes k drafts for what follows seq [n] into out [k] and returns k, or 0 when no suffix
 * recurs: for the longest m <= NGRAM_DRAFT_MAX_N (and < n) whose last-m-token suffix occurs
 * earlier in seq, the tokens after its latest such occurrence, continued past the end of seq
 * as the repetition it is (the p tokens after it repeat with period p). */
int ngram_draft(const int32_t *seq, int n, int k, int32_t *out);

#endif
