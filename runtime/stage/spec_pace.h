/* How many drafts a request's next decode step carries: stage 0's pace for one request,
 * adapted to how its drafts fare. Twice as many after a step whose drafts were all accepted
 * (up to k), as many as were accepted plus one after a partial hit, and after a total miss
 * half as many; when that leaves none, no drafts for SPEC_PACE_BACKOFF steps, twice as many
 * after each further total miss (up to SPEC_PACE_BACKOFF_MAX), and back to the first wait
 * after a hit. A request whose drafts never land soon pays almost nothing; one whose drafts
 * land keeps k. Doubling rather than one more: an edit that copies long runs of its prompt
 * reaches a large k in a few steps (`strata-stage-bench ngram-text` on two of this
 * repository's own edits, k 16: 2.6 -> 3.6 and 3.3 -> 4.1 tokens per step; k 4: 2.25 -> 2.38
 * and 2.67 -> 2.76).
 *
 * Pure and deterministic (no clock, no load: the draft budget under load is the stage's),
 * so `strata-stage-bench ngram-text` replays the same pace over real text. */
#ifndef STRATA_RUNTIME_STAGE_SPEC_PACE_H
#define STRATA_RUNTIME_STAGE_SPEC_PACE_H

#define SPEC_PACE_BACKOFF 4
#define SPEC_PACE_BACKOFF_MAX 64

struct spec_pace {
    int k;       /* the most drafts per step (0: none) */
    int cur;     /* drafts the next step carries */
    int wait;    /* steps left without drafts */
    int backoff; /* the next wait after a total miss */
};

/* Starts a request's pace at k drafts per step. */
void spec_pace_start(struct spec_pace *p, int k);

/* The drafts of the request's next step (its first in flight): 0 while it waits, counting the
 * wait down. */
int spec_pace_next(struct spec_pace *p);

/* After a step that carried `drafted` drafts (> 0), `accepted` of them accepted. */
void spec_pace_after(struct spec_pace *p, int drafted, int accepted);

#endif
