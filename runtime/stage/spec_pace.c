#include "runtime/stage/spec_pace.h"

void spec_pace_start(struct spec_pace *p, int k) {
    p->k = p->cur = k;
    p->wait = 0;
    p->backoff = SPEC_PACE_BACKOFF;
}

int spec_pace_next(struct spec_pace *p) {
    if (p->wait > 0) {
        p->wait--;
        return 0;
    }
    return p->cur;
}

void spec_pace_after(struct spec_pace *p, int drafted, int accepted) {
    if (accepted > 0) p->backoff = SPEC_PACE_BACKOFF;
    if (accepted >= drafted)
        p->cur = 2 * drafted;
    else if (accepted > 0)
        p->cur = accepted + 1;
    else if ((p->cur = drafted / 2) == 0) {
        p->cur = 1;
        p->wait = p->backoff;
        if (p->backoff < SPEC_PACE_BACKOFF_MAX) p->backoff *= 2;
    }
    if (p->cur > p->k) p->cur = p->k;
}
