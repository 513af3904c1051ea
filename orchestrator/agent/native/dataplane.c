/* The tcp transport's data path, per chunk, outside the interpreter (issue 28).
 *
 * Python (agent/native_engine.py) describes an iteration once: every range a rank receives
 * or sends, per partition, with the connection each send goes out on. Threads here then
 * move the chunks: one writer per outgoing connection (and one reading its ACKs), and
 * whichever Python thread serves an incoming connection calls dp_serve, which reads chunks
 * straight into the gradient buffer (a copy) or into a scratch slice it adds in (a
 * reduction). The rules are agent/engine.py's, chunk by chunk:
 *   - a chunk of a step-s send is written once every receive of an earlier step into its
 *     range has been applied (clear_to_send);
 *   - an arrived chunk of step s is applied once, besides, every send of an earlier step
 *     out of its range has been written (clear_to_apply), and once this rank has entered
 *     its iteration (a chunk of the next one waits); one that may not land yet is staged
 *     and applied by whichever thread later makes it clear;
 *   - a partition's steps are written in turn (the sends of one step at once), partitions
 *     start by priority within `credit` bytes in flight, a stream (partition, connection)
 *     writes its transfers one after another, and END ends it once its partition is
 *     written; the receiver ACKs an END once everything before it has landed.
 * Range state lives in arrays the caller owns (numpy), so Python reads it as it moves
 * (stall reports, traces, counters) without a call. Frames are agent/transports/tcp.py's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define HELLO 1
#define CHUNK 2
#define END 3
#define ACK 4
#define REFUSE 5
#define READY 6
#define MAX_REASON 4096
#define ERROR_LEN (MAX_REASON + 1)
#ifndef SO_MAX_PACING_RATE
#define SO_MAX_PACING_RATE 47
#endif

#pragma pack(push, 1)
typedef struct {
    uint8_t kind, flag;
    uint16_t pad;
    uint32_t iteration, partition, step, src;
    uint64_t offset;
    uint32_t count;
} head_t;
#pragma pack(pop)
_Static_assert(sizeof(head_t) == 32, "frame head is 32 bytes");

/* One range of the iteration, as arrays (struct of arrays, owned by the caller). */
typedef struct {
    int32_t *part, *step, *peer, *kind; /* kind: 0 receive, 1 send */
    int64_t *lo, *hi, *start;
    int32_t *conn, *order, *copy, *done;  /* send: connection index, order among its step's sends */
    int32_t *step_index;                  /* send: index of its step in the partition's plan */
    double *share, *begun, *first, *last; /* send: share of the link; times (CLOCK_REALTIME) */
} ranges_t;

typedef struct staged {
    struct staged *next;
    int range, serve; /* the range it belongs to; the serving call that staged it */
    int64_t offset;
    int32_t count, copy;
    float data[];
} staged_t;

typedef struct {
    int fd, rank, dead, reader_done, next_stream, turn;
    int *ends; /* stream ids whose END is due, in order */
    int nends, cap_ends, acks_due;
    int pace_dirty;
    uint64_t paced; /* the rate last set (0: never) */
    char error[ERROR_LEN];
    int refused; /* the error is the receiver's refusal (ACK with a reason, or REFUSE) */
    pthread_t writer;
} conn_t;

typedef struct {
    int rank, fd;        /* fd -1: ended (under mu) */
    int ended;           /* nothing more may be written on it: a REFUSE went, or it closed (under wmu) */
    pthread_mutex_t wmu; /* its writes: ACKs and REFUSE by its serving thread, READYs by `readies` */
} inbound_t;

typedef struct {
    int first_range, nranges; /* its ranges are contiguous */
    int nsteps;               /* steps of its plan that have sends (their step_index 0..) */
    int64_t cost;
    int cur, started, written, done; /* cur: step_index being written */
} part_t;

typedef struct {
    int32_t rank;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* writers: a receive moved on, an END is due */
    pthread_cond_t cv_done; /* dp_iterate and dp_close: a transfer, an ACK, an error */
    pthread_cond_t cv_serve; /* serving calls: an iteration began, a staged chunk landed */
    pthread_mutex_t apply_mu; /* two serving threads may add into one range in one step (a PS) */
    float *buffer;
    int64_t chunk, stage_bytes, credit;
    double link_rate, slack;
    ranges_t r;
    int nranges;
    part_t *parts;
    int32_t *start_order; /* partition indices by priority */
    int nparts, next_start;
    int64_t in_flight;
    conn_t *conns;
    int nconns, max_conns;
    int64_t iteration;
    int closed, running, cancelled, answering, iterating;
    int wake[2]; /* a pipe that wakes the answers thread */
    pthread_t answers;
    char error[ERROR_LEN];
    int error_rank;
    staged_t *staged;
    int64_t *staged_bytes; /* per serving call */
    int nserve, serving;
    double *progressed; /* CLOCK_MONOTONIC of the last chunk moved (shared with Python) */
    /* rendezvous: a send waits for its receiver's READY for its step (`ready`, per range);
     * a receive range's READY goes out once every receive of an earlier step of its
     * partition is done (`announced`), on the connection its sender opened (`inbound`) */
    int rendezvous;
    int32_t *meets; /* per range (the caller's): a send that waits for a READY, a receive that says one */
    int8_t *ready, *announced;
    int64_t (*heard)[4]; /* READYs of an iteration not begun: iteration, partition, step, rank */
    int nheard, cap_heard;
    inbound_t **inbound; /* each allocated once: a serving thread keeps its own */
    int ninbound;
    int64_t (*due)[4]; /* READYs to write (their thread: `readies`): iteration, partition, step, rank */
    int ndue, cap_due;
    pthread_cond_t cv_ready; /* `readies`: a READY is due */
    pthread_t readies;
    int readying;
} dp_t;

static double now_real(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double now_mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* -- rules (caller holds mu) ------------------------------------------------------------ */
static void wake_all(dp_t *d) {
    pthread_cond_broadcast(&d->cv);
    pthread_cond_broadcast(&d->cv_done);
    pthread_cond_broadcast(&d->cv_serve);
    pthread_cond_broadcast(&d->cv_ready);
}

static int overlaps_earlier(dp_t *d, int part, int kind, int step, int64_t lo, int64_t hi) {
    part_t *p = &d->parts[part];
    for (int i = p->first_range; i < p->first_range + p->nranges; i++)
        if (d->r.kind[i] == kind && d->r.step[i] < step && d->r.lo[i] < d->r.hi[i] && d->r.lo[i] < hi &&
            lo < d->r.hi[i])
            return 1;
    return 0;
}

static int clear_to_send(dp_t *d, int part, int step, int64_t lo, int64_t hi) {
    return !overlaps_earlier(d, part, 0, step, lo, hi);
}

static int clear_to_apply(dp_t *d, int part, int step, int64_t lo, int64_t hi) {
    return clear_to_send(d, part, step, lo, hi) && !overlaps_earlier(d, part, 1, step, lo, hi);
}

static void fail(dp_t *d, int rank, const char *why) {
    if (d->error[0]) return;
    snprintf(d->error, ERROR_LEN, "%s", why[0] ? why : "failed");
    d->error_rank = rank;
    wake_all(d);
}

static void start_partitions(dp_t *d);
static int write_full(int fd, struct iovec *iov, int n);
static int start_thread(void *(*fn)(void *), void *arg, pthread_t *t);

/* `list` (of `*cap` items of `size` bytes, `n` of them used) with room for one more:
 * doubled when full */
static void *room_for(void *list, int n, int *cap, size_t size) {
    if (n < *cap) return list;
    *cap = *cap ? 2 * *cap : 16;
    return realloc(list, (size_t)*cap * size);
}

/* one READY of a list: iteration, partition, step, rank */
static void put_ready(int64_t *x, int64_t iteration, int part, int step, int rank) {
    x[0] = iteration;
    x[1] = part;
    x[2] = step;
    x[3] = rank;
}

/* READY for (iteration, partition, step) to `rank`: queued for the `readies` thread, which
 * writes it outside `mu` (a full socket then holds up no one who drains the peer's) */
static void send_ready(dp_t *d, int64_t iteration, int part, int step, int rank) {
    d->due = room_for(d->due, d->ndue, &d->cap_due, sizeof *d->due);
    put_ready(d->due[d->ndue++], iteration, part, step, rank);
    pthread_cond_signal(&d->cv_ready);
}

/* Writes the queued READYs, each on every inbound connection of its rank (the send that
 * waits for it may go over any of the rank's NICs); one for a rank not connected yet stays
 * queued until it is (dp_serve signals). Outside `mu`: a full socket holds up no one who
 * drains the peer's. */
static void *readies(void *arg) {
    dp_t *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->closed) {
        int found = -1;
        for (int k = 0; k < d->ndue && found < 0; k++)
            for (int j = 0; j < d->ninbound && found < 0; j++)
                if (d->inbound[j]->rank == d->due[k][3] && d->inbound[j]->fd >= 0) found = k;
        if (found < 0) {
            pthread_cond_wait(&d->cv_ready, &d->mu);
            continue;
        }
        int64_t x[4];
        memcpy(x, d->due[found], sizeof x);
        memmove(d->due + found, d->due + found + 1, (--d->ndue - found) * sizeof *d->due);
        head_t h = {.kind = READY, .iteration = (uint32_t)x[0], .partition = (uint32_t)x[1],
                    .step = (uint32_t)x[2], .src = (uint32_t)d->rank};
        for (int j = 0; j < d->ninbound; j++) {
            inbound_t *to = d->inbound[j]; /* (allocated until dp_close) */
            if (to->rank != x[3] || to->fd < 0) continue;
            int fd = to->fd;
            pthread_mutex_unlock(&d->mu);
            pthread_mutex_lock(&to->wmu);
            if (!to->ended) { /* a failure: that connection is over; the others carry it */
                struct iovec v = {&h, sizeof h};
                write_full(fd, &v, 1);
            }
            pthread_mutex_unlock(&to->wmu);
            pthread_mutex_lock(&d->mu);
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* READYs for the steps of partition `pi` this rank has entered, to whoever sends to it there:
 * a receive's READY goes once every receive of an earlier step from another sender is done
 * (its own sender's come first on their connection anyway: a ring's receiver says READY for
 * every step as it enters the iteration). Sent whether or not this rank's own sends wait for
 * them: a peer that does waits for nothing that never comes (caller holds mu) */
static void announce(dp_t *d, int pi) {
    if (!d->running) return;
    part_t *p = &d->parts[pi];
    int end = p->first_range + p->nranges;
    for (int i = p->first_range; i < end; i++) {
        if (d->r.kind[i] != 0 || d->announced[i] || !d->meets || !d->meets[i]) continue;
        int held = 0;
        for (int j = p->first_range; j < end && !held; j++) {
            if (d->r.kind[j] != 0 || d->r.done[j] || d->r.step[j] >= d->r.step[i]) continue;
            int sends_now = 0; /* a sender of step i's too: its data comes in order anyway */
            for (int k = p->first_range; k < end && !sends_now; k++)
                sends_now = d->r.kind[k] == 0 && d->r.step[k] == d->r.step[i] && d->r.peer[k] == d->r.peer[j];
            held = !sends_now;
        }
        if (held) continue;
        d->announced[i] = 1;
        for (int j = p->first_range; j < i; j++) /* one READY per (step, sender) */
            if (d->r.kind[j] == 0 && d->r.step[j] == d->r.step[i] && d->r.peer[j] == d->r.peer[i]) goto said;
        send_ready(d, d->iteration, pi, d->r.step[i], d->r.peer[i]);
    said:;
    }
}

/* a READY heard: the sends it clears may go (caller holds mu) */
static void mark_ready(dp_t *d, int64_t iteration, int part, int step, int rank) {
    if (iteration != d->iteration || !d->running) {
        if (iteration <= d->iteration) return; /* (stale: cannot happen, a send waited for it) */
        d->heard = room_for(d->heard, d->nheard, &d->cap_heard, sizeof *d->heard);
        put_ready(d->heard[d->nheard++], iteration, part, step, rank);
        return;
    }
    if (part < 0 || part >= d->nparts) return;
    part_t *p = &d->parts[part];
    for (int i = p->first_range; i < p->first_range + p->nranges; i++)
        if (d->r.kind[i] == 1 && d->r.step[i] == step && d->r.peer[i] == rank) d->ready[i] = 1;
    pthread_cond_broadcast(&d->cv);
}

static void activate_step(dp_t *d, part_t *p) {
    /* the first step at or after `cur` with a send still to write; none: the partition is
     * written, and its streams' ENDs are due */
    double now = now_real();
    for (; p->cur < p->nsteps; p->cur++) {
        int any = 0;
        for (int i = p->first_range; i < p->first_range + p->nranges; i++)
            if (d->r.kind[i] == 1 && d->r.step_index[i] == p->cur && !d->r.done[i]) {
                any = 1;
                if (d->r.begun[i] == 0) d->r.begun[i] = now;
                d->conns[d->r.conn[i]].pace_dirty = 1;
            }
        if (any) return;
    }
    if (p->written) return;
    p->written = 1;
    /* one END per connection this partition sent on */
    for (int c = 0; c < d->nconns; c++) {
        int used = 0;
        for (int i = p->first_range; i < p->first_range + p->nranges && !used; i++)
            used = d->r.kind[i] == 1 && d->r.conn[i] == c;
        if (!used) continue;
        conn_t *k = &d->conns[c];
        k->ends = room_for(k->ends, k->nends, &k->cap_ends, sizeof *k->ends);
        k->ends[k->nends++] = k->next_stream++;
        k->acks_due++;
    }
}

static void check_done(dp_t *d, part_t *p) {
    if (p->done || !p->written) return;
    for (int i = p->first_range; i < p->first_range + p->nranges; i++)
        if (!d->r.done[i]) return;
    /* written (its ENDs queued behind its last chunks) and every receive applied: its credit
     * goes back (the ACKs are collected once the iteration's partitions are all done) */
    p->done = 1;
    d->in_flight -= p->cost;
    start_partitions(d);
}

static void start_partitions(dp_t *d) {
    while (d->next_start < d->nparts) {
        part_t *p = &d->parts[d->start_order[d->next_start]];
        if (d->credit && d->in_flight && d->in_flight + p->cost > d->credit) return;
        d->next_start++;
        p->started = 1;
        d->in_flight += p->cost;
        activate_step(d, p);
        check_done(d, p);
    }
}

/* a range moved on by `count` elements (caller holds mu) */
static void advance(dp_t *d, int i, int64_t count) {
    double now = now_real();
    if (d->r.first[i] == 0) d->r.first[i] = now;
    d->r.lo[i] += count;
    *d->progressed = now_mono();
    if (d->r.lo[i] >= d->r.hi[i]) {
        d->r.done[i] = 1;
        d->r.last[i] = now;
        part_t *p = &d->parts[d->r.part[i]];
        if (d->r.kind[i] == 1) {
            d->conns[d->r.conn[i]].pace_dirty = 1;
            activate_step(d, p);
        } else {
            announce(d, d->r.part[i]);
        }
        check_done(d, p);
        wake_all(d); /* a transfer done: a step, a partition or the iteration may be */
    } else if (d->r.kind[i] == 0) {
        pthread_cond_broadcast(&d->cv); /* a send waiting on this range may go on */
    }
}

static void apply(dp_t *d, int64_t offset, const float *data, int32_t count, int copy) {
    float *view = d->buffer + offset;
    if (copy) {
        memcpy(view, data, (size_t)count * 4);
        return;
    }
    pthread_mutex_lock(&d->apply_mu);
    for (int32_t j = 0; j < count; j++) view[j] += data[j];
    pthread_mutex_unlock(&d->apply_mu);
}

/* staged chunks that may land now do (caller holds mu) */
static void land_staged(dp_t *d) {
    int moved = 1;
    while (moved) {
        moved = 0;
        for (staged_t **at = &d->staged; *at;) {
            staged_t *s = *at;
            int i = s->range;
            int earlier = 0; /* a chunk of its transfer staged before it goes first */
            for (staged_t *t = d->staged; t != s; t = t->next) earlier |= t->range == i;
            if (!earlier && s->offset == d->r.lo[i] &&
                clear_to_apply(d, d->r.part[i], d->r.step[i], s->offset, s->offset + s->count)) {
                int32_t count = s->count;
                apply(d, s->offset, s->data, count, s->copy);
                *at = s->next;
                d->staged_bytes[s->serve] -= (int64_t)count * 4;
                free(s);
                advance(d, i, count);
                pthread_cond_broadcast(&d->cv_serve);
                moved = 1;
                continue;
            }
            at = &s->next;
        }
    }
}

/* -- I/O ------------------------------------------------------------------------------------ */
static int read_full(int fd, void *to, size_t size) {
    size_t got = 0;
    while (got < size) {
        ssize_t n = recv(fd, (char *)to + got, size - got, MSG_WAITALL);
        if (n == 0) return -1;
        if (n < 0) {
            if (errno == EINTR) continue;
            return -2;
        }
        got += n;
    }
    return 0;
}

/* write `iov` whole on a non-blocking or blocking socket, waiting for room with poll */
static int write_full(int fd, struct iovec *iov, int n) {
    while (n) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = n};
        ssize_t w = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, -1) < 0 && errno != EINTR) return -errno;
            if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                return -(err ? err : EPIPE);
            }
            continue;
        }
        while (n && (size_t)w >= iov[0].iov_len) {
            w -= iov[0].iov_len;
            iov++;
            n--;
        }
        if (n) {
            iov[0].iov_base = (char *)iov[0].iov_base + w;
            iov[0].iov_len -= w;
        }
    }
    return 0;
}

static void conn_failed(dp_t *d, conn_t *c, int refused, const char *why) {
    if (!c->dead || (refused && !c->refused)) {
        snprintf(c->error, ERROR_LEN, "%s", why);
        c->refused = refused;
    }
    c->dead = 1;
    wake_all(d);
}

/* the next thing connection `c` may write (caller holds mu): an END (-2 - its index), a
 * send range's index, or -1 */
static int pick(dp_t *d, int c) {
    if (d->conns[c].nends) return -2;
    /* partitions in turn from the one after the last written: their streams share the
     * connection evenly, as the model shares it (and the Python path's frame lock did) */
    for (int k = 1; k <= d->nparts; k++) {
        int pi = (d->conns[c].turn + k) % d->nparts;
        part_t *p = &d->parts[pi];
        if (!p->started || p->written) continue;
        int best = -1;
        for (int i = p->first_range; i < p->first_range + p->nranges; i++) {
            if (d->r.kind[i] != 1 || d->r.conn[i] != c || d->r.done[i] || d->r.step_index[i] != p->cur) continue;
            if (best < 0 || d->r.order[i] < d->r.order[best]) best = i; /* the stream writes in order */
        }
        if (best < 0 || (d->rendezvous && d->meets && d->meets[best] && !d->ready[best]))
            continue; /* its receiver has not entered the step */
        int64_t lo = d->r.lo[best], hi = lo + d->chunk < d->r.hi[best] ? lo + d->chunk : d->r.hi[best];
        if (clear_to_send(d, pi, d->r.step[best], lo, hi)) {
            d->conns[c].turn = pi;
            return best;
        }
    }
    return -1;
}

static void pace(dp_t *d, conn_t *c) {
    /* the largest share among the transfers it is writing; unpaced with the link to itself;
     * left as it was once none is (agent/pacing.py) */
    double share = -1;
    for (int i = 0; i < d->nranges; i++)
        if (d->r.kind[i] == 1 && &d->conns[d->r.conn[i]] == c && !d->r.done[i] && d->r.begun[i] != 0 &&
            d->r.share[i] > share)
            share = d->r.share[i];
    c->pace_dirty = 0;
    if (share < 0 || d->link_rate <= 0) return;
    uint64_t rate = share >= 1 ? UINT64_MAX : (uint64_t)(share * d->slack * d->link_rate);
    if (rate == c->paced) return;
    c->paced = rate;
    setsockopt(c->fd, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof rate);
}

static void *writer(void *arg) {
    void **a = arg;
    dp_t *d = a[0];
    int ci = (int)(intptr_t)a[1];
    free(arg);
    pthread_mutex_lock(&d->mu);
    for (;;) {
        conn_t *c = &d->conns[ci];
        if (d->closed || c->dead) break;
        if (!d->running || c->fd < 0) { /* (no socket yet: dp_attach gives it one) */
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        if (c->pace_dirty) pace(d, c);
        int i = pick(d, ci);
        if (i == -1) {
            pthread_cond_wait(&d->cv, &d->mu);
            continue;
        }
        head_t h = {0};
        struct iovec iov[2] = {{&h, sizeof h}, {NULL, 0}};
        int n = 1;
        int64_t count = 0;
        if (i == -2) {
            h.kind = END;
            h.partition = c->ends[0];
            memmove(c->ends, c->ends + 1, (--c->nends) * sizeof(int));
        } else {
            int64_t lo = d->r.lo[i];
            count = d->r.hi[i] - lo < d->chunk ? d->r.hi[i] - lo : d->chunk;
            h.kind = CHUNK;
            h.flag = d->r.copy[i];
            h.iteration = (uint32_t)d->iteration;
            h.partition = d->r.part[i];
            h.step = d->r.step[i];
            h.offset = lo;
            h.count = (uint32_t)count;
            iov[1].iov_base = d->buffer + lo;
            iov[1].iov_len = count * 4;
            n = 2;
        }
        h.src = (uint32_t)d->rank;
        pthread_mutex_unlock(&d->mu);
        int err = write_full(c->fd, iov, n);
        pthread_mutex_lock(&d->mu);
        c = &d->conns[ci];
        if (err) {
            char why[ERROR_LEN];
            snprintf(why, sizeof why, "%s", strerror(-err));
            conn_failed(d, c, 0, why);
            break;
        }
        if (i >= 0) {
            advance(d, i, count);
            if (d->staged) land_staged(d); /* a chunk staged behind this send may land now */
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* What connection `ci`'s receiver sent (readable now): its ACKs and REFUSE. 0 while the
 * connection goes on, 1 once it has ended. */
static int read_answer(dp_t *d, int ci, int fd) {
    char why[ERROR_LEN];
    head_t h;
    int r = read_full(fd, &h, sizeof h);
    char reason[MAX_REASON + 1] = "";
    if (!r && h.count > MAX_REASON) {
        snprintf(reason, sizeof reason, "the peer sent a reason of %u bytes", h.count);
        h.kind = 0;
    } else if (!r) {
        r = read_full(fd, reason, h.count);
        reason[r ? 0 : h.count] = 0;
    }
    pthread_mutex_lock(&d->mu);
    conn_t *c = &d->conns[ci];
    int ended = 1;
    if (r) {
        snprintf(why, sizeof why, "%s", r == -1 ? "the peer closed the connection" : strerror(errno));
        conn_failed(d, c, 0, why);
    } else if (h.kind == READY) {
        mark_ready(d, h.iteration, (int)h.partition, (int)h.step, (int)h.src);
        ended = 0;
    } else if (h.kind == ACK) {
        c->acks_due--;
        if (!h.flag) conn_failed(d, c, 1, reason);
        pthread_cond_broadcast(&d->cv_done);
        ended = 0;
    } else {
        conn_failed(d, c, h.kind == REFUSE, reason);
    }
    if (ended) {
        c->reader_done = 1;
        wake_all(d);
    }
    pthread_mutex_unlock(&d->mu);
    return ended;
}

/* One thread reads every outgoing connection's answers (one ACK per stream and iteration:
 * few), polling them; a thread each doubled the threads of a mesh's agents. */
static void *answers(void *arg) {
    dp_t *d = arg;
    struct pollfd *fds = calloc(d->max_conns + 1, sizeof *fds);
    int *which = calloc(d->max_conns + 1, sizeof *which);
    for (;;) {
        int n = 1;
        fds[0] = (struct pollfd){.fd = d->wake[0], .events = POLLIN}; /* a connection added, or closing */
        pthread_mutex_lock(&d->mu);
        int closed = d->closed;
        for (int c = 0; c < d->nconns; c++)
            if (!d->conns[c].reader_done && d->conns[c].fd >= 0) {
                fds[n] = (struct pollfd){.fd = d->conns[c].fd, .events = POLLIN};
                which[n++] = c;
            }
        pthread_mutex_unlock(&d->mu);
        if (closed) break;
        if (poll(fds, n, -1) <= 0) continue;
        if (fds[0].revents) {
            char drain[64];
            while (read(d->wake[0], drain, sizeof drain) > 0) {
            }
        }
        for (int j = 1; j < n; j++)
            if (fds[j].revents) read_answer(d, which[j], fds[j].fd);
    }
    free(fds);
    free(which);
    return NULL;
}

/* -- receiving ---------------------------------------------------------------------------- */
/* the receive range an incoming chunk continues (caller holds mu): -1 if none. A chunk
 * continues its transfer where the applied part and the chunks staged after it end. */
static int find(dp_t *d, const head_t *h) {
    if (h->partition >= (uint32_t)d->nparts) return -1;
    part_t *p = &d->parts[h->partition];
    for (int i = p->first_range; i < p->first_range + p->nranges; i++) {
        if (d->r.kind[i] || d->r.done[i] || d->r.step[i] != (int32_t)h->step || d->r.peer[i] != (int32_t)h->src)
            continue;
        int64_t next = d->r.lo[i];
        for (staged_t *s = d->staged; s; s = s->next)
            if (s->range == i) next = s->offset + s->count;
        if (next == (int64_t)h->offset) return i;
    }
    return -1;
}

static int has_staged(dp_t *d, int range, int serve) {
    for (staged_t *s = d->staged; s; s = s->next)
        if (s->range == range || (range < 0 && s->serve == serve)) return 1;
    return 0;
}

/* Serve one incoming connection (its HELLO read) until it ends: 0 when it closed, 1 when
 * this side refused it (the reason sent to the peer in a REFUSE). */
int dp_serve(dp_t *d, int fd, int src) {
    pthread_mutex_lock(&d->mu);
    int me = d->nserve++;
    inbound_t *in = malloc(sizeof *in);
    in->rank = src;
    in->fd = fd;
    in->ended = 0;
    pthread_mutex_init(&in->wmu, NULL);
    d->inbound = realloc(d->inbound, (d->ninbound + 1) * sizeof *d->inbound);
    d->inbound[d->ninbound++] = in;
    int threadless = 0; /* (a rank with no connection of its own yet starts it here) */
    if (!d->readying) {
        if (start_thread(readies, d, &d->readies)) threadless = 1;
        else d->readying = 1;
    }
    pthread_cond_signal(&d->cv_ready); /* READYs queued for it while it was not connected */
    d->staged_bytes = realloc(d->staged_bytes, d->nserve * sizeof(int64_t));
    d->staged_bytes[me] = 0;
    d->serving++;
    pthread_mutex_unlock(&d->mu);
    float *scratch = malloc(d->chunk * 4);
    char err[ERROR_LEN] = "";
    if (threadless)
        snprintf(err, sizeof err, "RuntimeError: rank %d could not start a thread to answer this connection: this "
                 "host is out of threads (kernel.pid_max, kernel.threads-max or the cgroup's pids.max)", d->rank);
    while (!err[0]) {
        head_t h;
        if (read_full(fd, &h, sizeof h)) break;
        if (h.kind == END) {
            pthread_mutex_lock(&d->mu);
            while (!d->closed && has_staged(d, -1, me)) pthread_cond_wait(&d->cv_serve, &d->mu);
            pthread_mutex_unlock(&d->mu);
            head_t a = {.kind = ACK, .flag = 1, .partition = h.partition};
            struct iovec v = {&a, sizeof a};
            pthread_mutex_lock(&in->wmu);
            int wrote = write_full(fd, &v, 1);
            pthread_mutex_unlock(&in->wmu);
            if (wrote) break;
            continue;
        }
        if (h.kind != CHUNK) {
            snprintf(err, sizeof err, "ValueError: unexpected frame kind %u", h.kind);
            break;
        }
        if (h.count == 0 || h.count > d->chunk) {
            snprintf(err, sizeof err, "ValueError: a chunk of %u elements (chunks here carry 1 to %ld)", h.count,
                     (long)d->chunk);
            break;
        }
        pthread_mutex_lock(&d->mu);
        int i = -1;
        while (!err[0]) {
            if (d->closed) {
                snprintf(err, sizeof err, "ConnectionAbortedError: the run was reconfigured");
            } else if ((int64_t)h.iteration < d->iteration) {
                snprintf(err, sizeof err, "ValueError: chunk for finished iteration %u", h.iteration);
            } else if ((int64_t)h.iteration > d->iteration || !d->running) {
                pthread_cond_wait(&d->cv_serve, &d->mu); /* the next iteration's: once this rank enters it */
                continue;
            } else if ((i = find(d, &h)) < 0) {
                snprintf(err, sizeof err,
                         "ValueError: unexpected chunk: step %u, partition %u, [%lu, +%u) from rank %u", h.step,
                         h.partition, (unsigned long)h.offset, h.count, h.src);
            } else if ((int64_t)h.offset + h.count > d->r.hi[i]) {
                snprintf(err, sizeof err, "ValueError: chunk [%lu, +%u) from rank %u overruns its transfer",
                         (unsigned long)h.offset, h.count, h.src);
            }
            break;
        }
        if (err[0]) {
            pthread_mutex_unlock(&d->mu);
            break;
        }
        int64_t size = (int64_t)h.count * 4;
        if (!has_staged(d, i, me) && clear_to_apply(d, h.partition, h.step, h.offset, h.offset + h.count)) {
            pthread_mutex_unlock(&d->mu);
            float *into = h.flag ? d->buffer + h.offset : scratch;
            if (read_full(fd, into, size)) break;
            if (!h.flag) apply(d, h.offset, scratch, h.count, 0);
            pthread_mutex_lock(&d->mu);
            advance(d, i, h.count);
            if (d->staged) land_staged(d);
            pthread_mutex_unlock(&d->mu);
            continue;
        }
        /* not yet: staged, and applied by whichever thread makes it clear */
        while (!d->closed && d->staged_bytes[me] && d->staged_bytes[me] + size > d->stage_bytes)
            pthread_cond_wait(&d->cv_serve, &d->mu);
        d->staged_bytes[me] += size;
        pthread_mutex_unlock(&d->mu);
        staged_t *s = malloc(sizeof(staged_t) + size);
        s->next = NULL;
        s->range = i;
        s->serve = me;
        s->offset = h.offset;
        s->count = h.count;
        s->copy = h.flag;
        if (read_full(fd, s->data, size)) {
            free(s);
            pthread_mutex_lock(&d->mu);
            d->staged_bytes[me] -= size;
            pthread_mutex_unlock(&d->mu);
            break;
        }
        pthread_mutex_lock(&d->mu);
        staged_t **at = &d->staged;
        while (*at) at = &(*at)->next;
        *at = s;
        land_staged(d);
        pthread_mutex_unlock(&d->mu);
    }
    free(scratch);
    int refused = 0;
    if (err[0]) {
        refused = 1;
        size_t len = strlen(err);
        head_t r = {.kind = REFUSE, .count = (uint32_t)len};
        struct iovec v[2] = {{&r, sizeof r}, {err, len}};
        pthread_mutex_lock(&in->wmu);
        in->ended = 1; /* the REFUSE is the last frame */
        write_full(fd, v, 2);
        pthread_mutex_unlock(&in->wmu);
    }
    pthread_mutex_lock(&in->wmu);
    in->ended = 1;
    pthread_mutex_unlock(&in->wmu);
    pthread_mutex_lock(&d->mu);
    in->fd = -1; /* no READY goes out on it any more */
    /* what it staged and never applied goes: its connection is over */
    for (staged_t **at = &d->staged; *at;) {
        staged_t *s = *at;
        if (s->serve == me) {
            *at = s->next;
            free(s);
        } else {
            at = &s->next;
        }
    }
    d->staged_bytes[me] = 0;
    d->serving--;
    wake_all(d);
    pthread_mutex_unlock(&d->mu);
    return refused;
}

/* -- the engine --------------------------------------------------------------------------- */
dp_t *dp_new(int32_t rank, float *buffer, int64_t chunk, int64_t stage_bytes, int64_t credit,
             double link_rate, double slack, int max_conns, double *progressed) {
    dp_t *d = calloc(1, sizeof *d);
    d->rank = rank;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->apply_mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &a);
    pthread_cond_init(&d->cv_done, &a);
    pthread_cond_init(&d->cv_serve, &a);
    pthread_cond_init(&d->cv_ready, &a);
    d->buffer = buffer;
    d->chunk = chunk;
    d->stage_bytes = stage_bytes;
    d->credit = credit;
    d->link_rate = link_rate;
    d->slack = slack;
    d->max_conns = max_conns;
    d->conns = calloc(max_conns ? max_conns : 1, sizeof(conn_t));
    d->iteration = -1;
    if (pipe2(d->wake, O_CLOEXEC | O_NONBLOCK)) d->wake[0] = d->wake[1] = -1;
    d->progressed = progressed;
    return d;
}

/* 0, or pthread_create's error (EAGAIN: the host's or the cgroup's thread limit). */
static int start_thread(void *(*fn)(void *), void *arg, pthread_t *t) {
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 256 * 1024); /* a mesh's agents run one per peer */
    int rc = pthread_create(t, &a, fn, arg);
    pthread_attr_destroy(&a);
    return rc;
}

/* The socket (its HELLO sent) of connection `c`, registered without one (fd -1). */
void dp_attach(dp_t *d, int c, int fd) {
    pthread_mutex_lock(&d->mu);
    if (d->closed || d->conns[c].fd >= 0) {
        close(fd);
    } else {
        d->conns[c].fd = fd;
        d->conns[c].pace_dirty = 1;
        wake_all(d);
    }
    pthread_mutex_unlock(&d->mu);
    if (write(d->wake[1], "a", 1) < 0) {
    }
}

/* Connection `c` could not be opened: `why`, reported when the iteration needs it. */
void dp_unreachable(dp_t *d, int c, const char *why) {
    pthread_mutex_lock(&d->mu);
    conn_failed(d, &d->conns[c], 0, why);
    d->conns[c].reader_done = 1;
    wake_all(d);
    pthread_mutex_unlock(&d->mu);
}

/* A connection to peer `rank` over socket `fd` (its HELLO sent), or -1: not open yet (see
 * dp_attach). Its index; -1 when full, -2 when its thread could not start (errno's EAGAIN:
 * the host's thread limit; the caller still owns `fd`). While one is not open, the iteration goes on:
 * this rank still receives, as the Python path's write waiting for its connection did. */
int dp_connection(dp_t *d, int fd, int rank) {
    pthread_mutex_lock(&d->mu);
    if (d->nconns >= d->max_conns) {
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    if (!d->answering) {
        if (start_thread(answers, d, &d->answers)) {
            pthread_mutex_unlock(&d->mu);
            return -2;
        }
        d->answering = 1;
    }
    if (!d->readying) {
        if (start_thread(readies, d, &d->readies)) {
            pthread_mutex_unlock(&d->mu);
            return -2;
        }
        d->readying = 1;
    }
    int c = d->nconns;
    conn_t *k = &d->conns[c];
    void **a = malloc(2 * sizeof(void *));
    a[0] = d;
    a[1] = (void *)(intptr_t)c;
    k->fd = fd;
    k->rank = rank;
    if (start_thread(writer, a, &k->writer)) { /* not counted: nothing joins it */
        free(a);
        k->fd = -1;
        pthread_mutex_unlock(&d->mu);
        return -2;
    }
    d->nconns++;
    if (write(d->wake[1], "c", 1) < 0) { /* (full: it is awake anyway) */
    }
    pthread_mutex_unlock(&d->mu);
    return c;
}

/* The ranges of every iteration (arrays kept by the caller) and the partitions: ranges of
 * partition p are [first[p], first[p] + count[p]), its sends' step_index run 0..steps[p]-1;
 * partitions start in `order`. */
void dp_plan(dp_t *d, int nranges, int32_t *part, int32_t *step, int32_t *peer, int32_t *kind, int64_t *lo,
             int64_t *hi, int64_t *start, int32_t *conn, int32_t *order, int32_t *copy, int32_t *done,
             int32_t *step_index, double *share, double *begun, double *first, double *last, int nparts,
             int32_t *part_first, int32_t *part_count, int32_t *part_steps, int64_t *part_cost,
             int32_t *start_order) {
    pthread_mutex_lock(&d->mu);
    d->r = (ranges_t){part, step, peer, kind, lo, hi, start, conn, order, copy, done, step_index,
                      share, begun, first, last};
    d->nranges = nranges;
    d->meets = NULL; /* (dp_meets gives this plan's) */
    free(d->ready);
    free(d->announced);
    d->ready = calloc(nranges ? nranges : 1, 1);
    d->announced = calloc(nranges ? nranges : 1, 1);
    free(d->parts);
    d->parts = calloc(nparts ? nparts : 1, sizeof(part_t));
    d->nparts = nparts;
    for (int p = 0; p < nparts; p++) {
        d->parts[p].first_range = part_first[p];
        d->parts[p].nranges = part_count[p];
        d->parts[p].nsteps = part_steps[p];
        d->parts[p].cost = part_cost[p];
    }
    d->start_order = start_order;
    pthread_mutex_unlock(&d->mu);
}

/* a dead connection the iteration still needs (caller holds mu) */
static int needed(dp_t *d, int c) {
    conn_t *k = &d->conns[c];
    if (k->acks_due > 0 || k->nends) return 1;
    for (int i = 0; i < d->nranges; i++)
        if (d->r.kind[i] == 1 && d->r.conn[i] == c && !d->r.done[i]) return 1;
    return 0;
}

static int finished(dp_t *d) {
    for (int p = 0; p < d->nparts; p++)
        if (!d->parts[p].done) return 0;
    for (int c = 0; c < d->nconns; c++)
        if (d->conns[c].acks_due > 0 || d->conns[c].nends) return 0;
    return 1;
}

/* One allreduce: 0 once every range has moved and every END is acknowledged; 1 on an error
 * (dp_error says which); 2 when cancelled or closed. */
int dp_iterate(dp_t *d, int64_t iteration) {
    pthread_mutex_lock(&d->mu);
    d->iterating = 1;
    for (int i = 0; i < d->nranges; i++) {
        d->r.lo[i] = d->r.start[i];
        d->r.done[i] = d->r.lo[i] >= d->r.hi[i];
        d->r.begun[i] = d->r.first[i] = d->r.last[i] = 0;
    }
    for (int p = 0; p < d->nparts; p++) {
        part_t *q = &d->parts[p];
        q->cur = q->started = q->written = q->done = 0;
    }
    d->next_start = 0;
    d->in_flight = 0;
    d->error[0] = 0;
    d->cancelled = 0;
    d->iteration = iteration;
    d->running = 1;
    *d->progressed = now_mono();
    memset(d->ready, 0, d->nranges ? d->nranges : 1);
    memset(d->announced, 0, d->nranges ? d->nranges : 1);
    int kept = 0;
    for (int k = 0; k < d->nheard; k++) { /* READYs that came before this rank entered */
        int64_t *x = d->heard[k];
        if (x[0] == iteration) {
            mark_ready(d, x[0], (int)x[1], (int)x[2], (int)x[3]);
        } else if (x[0] > iteration) {
            memmove(d->heard[kept++], x, sizeof *d->heard);
        }
    }
    d->nheard = kept;
    for (int p = 0; p < d->nparts; p++) announce(d, p);
    start_partitions(d);
    wake_all(d);
    int result = 0;
    double dead_since = 0;
    for (;;) {
        if (d->closed || d->cancelled) {
            result = 2;
            break;
        }
        if (d->error[0]) {
            result = 1;
            break;
        }
        int bad = -1, waiting = 0;
        for (int c = 0; c < d->nconns && bad < 0; c++)
            if (d->conns[c].dead && needed(d, c)) bad = c;
        if (bad >= 0) {
            conn_t *k = &d->conns[bad];
            /* the receiver's REFUSE may still be on its way, behind the write that failed */
            if (!k->reader_done && !k->refused) {
                if (!dead_since) dead_since = now_mono();
                waiting = now_mono() - dead_since < 0.2;
            }
            if (!waiting) {
                fail(d, k->rank, k->error);
                result = 1;
                break;
            }
        }
        if (finished(d)) break;
        if (waiting) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            t.tv_nsec += 20 * 1000 * 1000;
            if (t.tv_nsec >= 1000000000L) {
                t.tv_sec++;
                t.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&d->cv_done, &d->mu, &t);
        } else {
            pthread_cond_wait(&d->cv_done, &d->mu);
        }
    }
    d->running = 0;
    d->iterating = 0;
    wake_all(d);
    pthread_mutex_unlock(&d->mu);
    return result;
}

void dp_cancel(dp_t *d) {
    pthread_mutex_lock(&d->mu);
    d->cancelled = 1;
    wake_all(d);
    pthread_mutex_unlock(&d->mu);
}

/* Whether range `i`'s next chunk may move now (a stall report's `ready`): a send's once it
 * is clear to send, a receive's once it is clear to apply. */
int dp_ready(dp_t *d, int i) {
    pthread_mutex_lock(&d->mu);
    int64_t lo = d->r.lo[i], hi = lo + d->chunk < d->r.hi[i] ? lo + d->chunk : d->r.hi[i];
    /* a send waiting for its receiver's READY waits on the peer: ready; a receive whose READY
     * has not gone out waits on this rank's own earlier steps: not */
    int ready = d->r.kind[i] ? clear_to_send(d, d->r.part[i], d->r.step[i], lo, hi)
                             : clear_to_apply(d, d->r.part[i], d->r.step[i], lo, hi) &&
                                   (!d->rendezvous || !d->meets || !d->meets[i] || d->announced[i]);
    pthread_mutex_unlock(&d->mu);
    return ready;
}

const char *dp_error(dp_t *d) { return d->error; }
int dp_error_rank(dp_t *d) { return d->error_rank; }

/* Wind everything up without waiting: connections shut down, every wait woken (a serving
 * call, a chunk waiting for its iteration, dp_iterate) to find the engine closed. */
void dp_stop(dp_t *d) {
    pthread_mutex_lock(&d->mu);
    d->closed = 1;
    for (int c = 0; c < d->nconns; c++)
        if (d->conns[c].fd >= 0) shutdown(d->conns[c].fd, SHUT_RDWR);
    wake_all(d);
    pthread_mutex_unlock(&d->mu);
    if (write(d->wake[1], "x", 1) < 0) {
    }
}

/* Stop every thread and free what they used, once no dp_serve or dp_iterate call is inside
 * (the caller has shut its incoming sockets down): 0; 1 if one still is after 5 s (then `d`
 * is kept, its threads gone). */
int dp_close(dp_t *d) {
    dp_stop(d);
    for (int c = 0; c < d->nconns; c++) pthread_join(d->conns[c].writer, NULL);
    if (d->answering) pthread_join(d->answers, NULL);
    if (d->readying) pthread_join(d->readies, NULL);
    for (int c = 0; c < d->nconns; c++) {
        if (d->conns[c].fd >= 0) close(d->conns[c].fd);
        free(d->conns[c].ends);
    }
    pthread_mutex_lock(&d->mu);
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += 5;
    while ((d->serving || d->iterating) && pthread_cond_timedwait(&d->cv_done, &d->mu, &t) == 0) {
    }
    int busy = d->serving > 0 || d->iterating;
    pthread_mutex_unlock(&d->mu);
    if (busy) return 1;
    while (d->staged) {
        staged_t *s = d->staged;
        d->staged = s->next;
        free(s);
    }
    free(d->staged_bytes);
    for (int k = 0; k < d->ninbound; k++) {
        pthread_mutex_destroy(&d->inbound[k]->wmu);
        free(d->inbound[k]);
    }
    free(d->inbound);
    free(d->heard);
    free(d->due);
    free(d->ready);
    free(d->announced);
    free(d->parts);
    free(d->conns);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->apply_mu);
    close(d->wake[0]);
    close(d->wake[1]);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->cv_done);
    pthread_cond_destroy(&d->cv_serve);
    pthread_cond_destroy(&d->cv_ready);
    free(d);
    return 0;
}

/* A READY the caller read off a connection before handing it over (see mark_ready) */
void dp_heard(dp_t *d, int64_t iteration, int part, int step, int rank) {
    pthread_mutex_lock(&d->mu);
    mark_ready(d, iteration, part, step, rank);
    pthread_mutex_unlock(&d->mu);
}

/* Which ranges meet their peer (the plan's rendezvous: Schedule.rendezvous): an array of
 * the caller's, one per range of dp_plan */
void dp_meets(dp_t *d, int32_t *meets) {
    pthread_mutex_lock(&d->mu);
    d->meets = meets;
    pthread_mutex_unlock(&d->mu);
}

void dp_set_rendezvous(dp_t *d, int on) {
    pthread_mutex_lock(&d->mu);
    d->rendezvous = on;
    pthread_mutex_unlock(&d->mu);
}

void dp_set_link_rate(dp_t *d, double rate) {
    pthread_mutex_lock(&d->mu);
    d->link_rate = rate;
    for (int c = 0; c < d->nconns; c++) d->conns[c].pace_dirty = 1;
    pthread_mutex_unlock(&d->mu);
}

/* ACKs connection `c` still waits for (for a stall report) */
int dp_acks_due(dp_t *d, int c) {
    pthread_mutex_lock(&d->mu);
    int due = c < d->nconns ? d->conns[c].acks_due : 0;
    pthread_mutex_unlock(&d->mu);
    return due;
}
