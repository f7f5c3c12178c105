//go:build cgo

// The calling thread's last error, kept in C thread-local storage so that,
// like errno, it belongs to the thread that made the failing call: a Go
// function exported through cgo runs on the OS thread of its C caller.
//
// Only a pointer lives in thread-local storage, the text on the heap: Go's
// c-shared libraries are marked STATIC_TLS, so their whole TLS block must fit
// in the few hundred bytes glibc keeps spare for libraries loaded after
// start-up (dlopen from Python after torch fails with "cannot allocate memory
// in static TLS block" when the text itself is thread-local).
#include <stdlib.h>
#include <string.h>
#include "gorun.h"

#define GORUN_ERRLEN 4096

static __thread char *gorun_errtext;
static __thread int gorun_errrank = -1;

void gorunSetError(const char *text, size_t n, int rank) {
    if (gorun_errtext == NULL) {
        gorun_errtext = malloc(GORUN_ERRLEN); // one per thread that ever fails a call
        if (gorun_errtext == NULL) {
            return;
        }
    }
    if (n >= GORUN_ERRLEN) {
        n = GORUN_ERRLEN - 1;
    }
    memcpy(gorun_errtext, text, n);
    gorun_errtext[n] = 0;
    gorun_errrank = rank;
}

void gorunClearError(void) {
    if (gorun_errtext != NULL) {
        gorun_errtext[0] = 0;
    }
    gorun_errrank = -1;
}

const char *gorun_last_error(void) { return gorun_errtext != NULL ? gorun_errtext : ""; }

int gorun_last_error_rank(void) { return gorun_errrank; }

const char *gorun_status_name(int status) {
    switch (status) {
    case GORUN_OK: return "GORUN_OK";
    case GORUN_ERR_INVALID: return "GORUN_ERR_INVALID";
    case GORUN_ERR_PEER_LOST: return "GORUN_ERR_PEER_LOST";
    case GORUN_ERR_DESYNC: return "GORUN_ERR_DESYNC";
    case GORUN_ERR_TIMEOUT: return "GORUN_ERR_TIMEOUT";
    case GORUN_ERR_ABORTED: return "GORUN_ERR_ABORTED";
    case GORUN_ERR_CLOSED: return "GORUN_ERR_CLOSED";
    case GORUN_ERR_INIT: return "GORUN_ERR_INIT";
    case GORUN_ERR_INTERNAL: return "GORUN_ERR_INTERNAL";
    }
    return "GORUN_ERR_UNKNOWN";
}
