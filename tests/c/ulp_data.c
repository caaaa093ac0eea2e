/*
 * A user-mode ULP moving data, written as it would be on Windows: the
 * control path is overlapped DeviceIoControl reaped from an I/O completion
 * port; the speed path is the user library (irpverbs_user.h), posting and
 * polling on the rings mapped into the process. Two RC QPs on one device are
 * connected to each other (loopback) and exchange:
 *   - SEND / RECV (a two-element gather list),
 *   - SEND with immediate data, inline,
 *   - RDMA WRITE, then RDMA WRITE with immediate (consuming a receive),
 *   - RDMA READ of what was written,
 * every payload checked byte for byte, every completion's status, opcode,
 * length and immediate checked.
 *
 * Completions are waited for the Windows way: IOCTL_IV_CQ_NOTIFY is pended
 * with an OVERLAPPED on the completion port, the CQ is armed with
 * IvUserReqNotifyCq (no system call), polled once more, and the port
 * delivers the event. A driver that does not implement IOCTL_IV_CQ_NOTIFY
 * (ERROR_INVALID_FUNCTION) is busy-polled instead, and the test says so.
 *
 * A completion channel then: a CQ on it raises one event per arming and
 * none unarmed, taken with IOCTL_IV_GET_CQ_EVENT and acknowledged, with the
 * busy rules of libibverbs.
 *
 * On non-Windows hosts it links against libirpverbs_host_c (the driver and
 * the soft HCA in-process); exit code 0 means every check held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "irpverbs.h"
#include "irpverbs_host.h"
#include "irpverbs_user.h"

#include "check.h"

/* <winnt.h> defines some STATUS_ codes as DWORD: compare as NtStatus. */
#define ST(s) ((NtStatus)(s))

#define PORT_KEY ((ULONG_PTR)0xDA7A)
#define WAIT_MS 10000

static HANDLE dev, port;
static int notify_supported = 1;

/* Reaps the completion packet of `ov` from the port. A request still
 * pending after WAIT_MS is cancelled (its OVERLAPPED must not outlive it)
 * and reaped then. */
static NTSTATUS reap(OVERLAPPED *ov) {
    DWORD got = 0;
    ULONG_PTR key = 0;
    LPOVERLAPPED pov = NULL;
    GetQueuedCompletionStatus(port, &got, &key, &pov, WAIT_MS);
    if (pov == NULL && !HasOverlappedIoCompleted(ov)) {
        CHECK(0, "request still pending after %d ms: cancelling it", WAIT_MS);
        CancelIoEx(dev, ov);
        GetQueuedCompletionStatus(port, &got, &key, &pov, WAIT_MS);
    }
    CHECK(pov == ov && key == PORT_KEY, "completion packet %p, want %p", (void *)pov, (void *)ov);
    return (NTSTATUS)(DWORD)ov->Internal;
}

/* One overlapped control IOCTL, reaped from the port: the NTSTATUS. */
static NTSTATUS ioctl(DWORD code, const void *in, DWORD in_len, void *out, DWORD out_len) {
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    DWORD bytes = 0;
    DeviceIoControl(dev, code, (LPVOID)in, in_len, out, out_len, &bytes, &ov);
    return reap(&ov);
}

/* A CQ as the ULP keeps it: its handle (for IOCTLs) and its speed path. */
typedef struct Cq {
    IvCreateCqOut out;
    IvUserCq *u;
    const char *name;
} Cq;

/* Takes one completion from `cq`, waiting for it through the completion
 * port (or by polling where the driver has no CQ notify). 1, or 0 after
 * WAIT_MS without one. */
static int wait_one(Cq *cq, IvCqe *wc) {
    time_t start = time(NULL);
    for (;;) {
        int32_t n = IvUserPollCq(cq->u, wc, 1);
        if (n == 1) return 1;
        if (n < 0) {
            CHECK(0, "poll %s: %#x", cq->name, (unsigned)n);
            return 0;
        }
        if (time(NULL) - start > WAIT_MS / 1000) return 0;
        if (!notify_supported) continue;

        /* Pend the notify first, arm, poll once more: a completion that
         * arrives after the poll above raises the event the request waits
         * for, so none is missed. */
        OVERLAPPED ov;
        memset(&ov, 0, sizeof ov);
        IvCqNotifyIn in;
        memset(&in, 0, sizeof in);
        in.cq = cq->out.cq;
        in.arm = IV_NOTIFY_NO_ARM; /* armed below, without a system call */
        IvCqEventOut ev;
        memset(&ev, 0, sizeof ev);
        DWORD bytes = 0;
        BOOL ok = DeviceIoControl(dev, IOCTL_IV_CQ_NOTIFY, &in, sizeof in, &ev, sizeof ev, &bytes,
                                  &ov);
        if (!ok && GetLastError() == ERROR_INVALID_FUNCTION) {
            reap(&ov);
            notify_supported = 0;
            printf("note: the driver has no IOCTL_IV_CQ_NOTIFY; polling the CQs\n");
            continue;
        }
        CHECK(IvUserReqNotifyCq(cq->u, 0) == ST(STATUS_SUCCESS), "arm %s", cq->name);
        n = IvUserPollCq(cq->u, wc, 1);
        if (n == 1) {
            /* Got it after all: the notify is not needed any more. */
            CancelIoEx(dev, &ov);
            NTSTATUS st = reap(&ov);
            CHECK(st == ST(STATUS_CANCELLED) || st == ST(STATUS_SUCCESS), "cancelled notify: %#x",
                  (unsigned)st);
            return 1;
        }
        NTSTATUS st = reap(&ov);
        CHECK(st == ST(STATUS_SUCCESS), "notify %s: %#x", cq->name, (unsigned)st);
        if (st != ST(STATUS_SUCCESS)) return 0;
        CHECK(ev.cq == cq->out.cq, "event names CQ %#llx", (unsigned long long)ev.cq);
    }
}

/* Waits for one completion and checks it. */
static IvCqe expect(Cq *cq, uint64_t wr_id, uint32_t opcode, uint32_t byte_len) {
    IvCqe wc;
    memset(&wc, 0, sizeof wc);
    if (!wait_one(cq, &wc)) {
        /* Nothing after this can hold: stop here. */
        CHECK(0, "no completion on %s for wr_id %llu (is the transport engine there?)", cq->name,
              (unsigned long long)wr_id);
        printf("%d passed, %d failed\n", passed, failed);
        exit(1);
    }
    CHECK(wc.status == IV_WC_SUCCESS, "%s wr_id %llu: status %u", cq->name,
          (unsigned long long)wc.wr_id, (unsigned)wc.status);
    CHECK(wc.wr_id == wr_id && wc.opcode == opcode, "%s: wr_id %llu opcode %u, want %llu %u",
          cq->name, (unsigned long long)wc.wr_id, (unsigned)wc.opcode, (unsigned long long)wr_id,
          (unsigned)opcode);
    if (byte_len != (uint32_t)-1) {
        CHECK(wc.byte_len == byte_len, "%s: byte_len %u, want %u", cq->name, (unsigned)wc.byte_len,
              (unsigned)byte_len);
    }
    return wc;
}

static void create_cq(Cq *cq, const char *name) {
    IvCreateCqIn in;
    memset(&in, 0, sizeof in);
    in.cqe = 64;
    in.user_context = (uint64_t)(uintptr_t)cq;
    cq->name = name;
    CHECK(ioctl(IOCTL_IV_CREATE_CQ, &in, sizeof in, &cq->out, sizeof cq->out) == 0, "create %s",
          name);
    cq->u = IvUserCqOpen(dev, &cq->out);
    CHECK(cq->u != NULL, "open %s: %u", name, (unsigned)GetLastError());
}

static IvCreateQpOut create_qp(IvHandle pd, const Cq *cq) {
    IvCreateQpIn in;
    memset(&in, 0, sizeof in);
    in.pd = pd;
    in.send_cq = cq->out.cq;
    in.recv_cq = cq->out.cq;
    in.qp_type = IV_QPT_RC;
    in.cap.max_send_wr = 32;
    in.cap.max_recv_wr = 32;
    in.cap.max_send_sge = 2;
    in.cap.max_recv_sge = 2;
    in.cap.max_inline_data = 64;
    IvCreateQpOut out;
    memset(&out, 0, sizeof out);
    CHECK(ioctl(IOCTL_IV_CREATE_QP, &in, sizeof in, &out, sizeof out) == 0, "create qp");
    return out;
}

/* The transport's timers: the attributes connect_qp sets. */
typedef struct {
    uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer;
} Timers;

static const Timers DEFAULT_TIMERS = {14, 7, 7, 12};

static void connect_qp_timers(IvHandle qp, uint32_t dest_qpn, const uint8_t gid[16], Timers t);

/* RESET -> INIT -> RTR -> RTS against `dest_qpn` at `gid`. */
static void connect_qp(IvHandle qp, uint32_t dest_qpn, const uint8_t gid[16]) {
    connect_qp_timers(qp, dest_qpn, gid, DEFAULT_TIMERS);
}

/* connect_qp with the timer attributes `t`. */
static void connect_qp_timers(IvHandle qp, uint32_t dest_qpn, const uint8_t gid[16], Timers t) {
    IvModifyQpIn m;
    memset(&m, 0, sizeof m);
    m.qp = qp;
    m.attr_mask = IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS;
    m.attr.qp_state = IV_QPS_INIT;
    m.attr.port_num = 1;
    m.attr.qp_access_flags = IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;
    CHECK(ioctl(IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0) == 0, "INIT");
    memset(&m.attr, 0, sizeof m.attr);
    m.attr_mask = IV_QP_STATE | IV_QP_AV | IV_QP_PATH_MTU | IV_QP_DEST_QPN | IV_QP_RQ_PSN |
                  IV_QP_MAX_DEST_RD_ATOMIC | IV_QP_MIN_RNR_TIMER;
    m.attr.qp_state = IV_QPS_RTR;
    memcpy(m.attr.ah_attr.dgid, gid, 16);
    m.attr.ah_attr.is_global = 1;
    m.attr.ah_attr.port_num = 1;
    m.attr.ah_attr.hop_limit = 64;
    m.attr.path_mtu = IV_MTU_1024;
    m.attr.dest_qp_num = dest_qpn;
    m.attr.rq_psn = 0x100;
    m.attr.max_dest_rd_atomic = 4;
    m.attr.min_rnr_timer = t.min_rnr_timer;
    CHECK(ioctl(IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0) == 0, "RTR");
    memset(&m.attr, 0, sizeof m.attr);
    m.attr_mask = IV_QP_STATE | IV_QP_TIMEOUT | IV_QP_RETRY_CNT | IV_QP_RNR_RETRY | IV_QP_SQ_PSN |
                  IV_QP_MAX_QP_RD_ATOMIC;
    m.attr.qp_state = IV_QPS_RTS;
    m.attr.timeout = t.timeout;
    m.attr.retry_cnt = t.retry_cnt;
    m.attr.rnr_retry = t.rnr_retry;
    m.attr.sq_psn = 0x100;
    m.attr.max_rd_atomic = 4;
    CHECK(ioctl(IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0) == 0, "RTS");
}

/* The registered memory: A's and B's buffers in one MR. */
enum { SRC = 0, DST = 4096, REMOTE = 8192, READ_BACK = 12288, BUF = 16384 };
static union {
    unsigned char b[BUF];
    uint64_t align;
} mem;

static IvSge at(uint32_t off, uint32_t len, uint32_t lkey) {
    IvSge s;
    s.addr = (uint64_t)(uintptr_t)(mem.b + off);
    s.length = len;
    s.lkey = lkey;
    return s;
}

/* Milliseconds on a monotonic clock. */
static double now_ms(void) {
#ifdef _WIN32
    LARGE_INTEGER count, freq;
    QueryPerformanceCounter(&count);
    QueryPerformanceFrequency(&freq);
    return (double)count.QuadPart * 1e3 / (double)freq.QuadPart;
#else
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
#endif
}

/* Waits for one completion of `wr_id` with `status`. */
static void expect_status(Cq *cq, uint64_t wr_id, uint32_t status, const char *what) {
    IvCqe wc;
    memset(&wc, 0, sizeof wc);
    if (!wait_one(cq, &wc)) {
        CHECK(0, "%s: no completion on %s (do the transport's timers run?)", what, cq->name);
        printf("%d passed, %d failed\n", passed, failed);
        exit(1);
    }
    CHECK(wc.wr_id == wr_id && wc.status == status, "%s: wr_id %llu status %u, want %llu %u",
          what, (unsigned long long)wc.wr_id, (unsigned)wc.status, (unsigned long long)wr_id,
          (unsigned)status);
}

/* A QP of its own (with its user-mode speed path) connected by
 * `connect_qp_timers`, for the timer cases. */
static IvUserQp *timed_qp(IvHandle pd, const Cq *cq, IvCreateQpOut *out, uint32_t dest_qpn,
                          const uint8_t gid[16], Timers t) {
    *out = create_qp(pd, cq);
    connect_qp_timers(out->qp, dest_qpn, gid, t);
    IvUserQp *q = IvUserQpOpen(dev, out);
    CHECK(q != NULL, "open timed QP: %u", (unsigned)GetLastError());
    return q;
}

static void destroy_qp(IvUserQp *q, IvHandle qp) {
    IvUserQpClose(q);
    IvHandleIn h;
    h.handle = qp;
    CHECK(ioctl(IOCTL_IV_DESTROY_QP, &h, sizeof h, NULL, 0) == 0, "destroy timed qp");
}

/* The transport keeps time without a wire (loopback, one device):
 *   - a SEND to a QP that does not exist completes RETRY_EXC_ERR after
 *     retry_cnt + 1 local ACK timeouts (4.096 us x 2^timeout each);
 *   - a SEND that meets RNR NAKs completes RNR_RETRY_EXC_ERR after
 *     rnr_retry RNR waits (0-6);
 *   - with rnr_retry 7 it waits until a receive is posted, then succeeds. */
static void timers(IvHandle pd, Cq *cq, const uint8_t gid[16], uint32_t lkey) {
    IvCreateQpOut o;
    IvUserSendWr wr;
    memset(&wr, 0, sizeof wr);
    wr.opcode = IV_WR_SEND;
    wr.flags = IV_SEND_SIGNALED | IV_SEND_INLINE;
    wr.inline_data = "tick";
    wr.inline_len = 4;

    Timers t = {10, 3, 7, 12};
    IvUserQp *q = timed_qp(pd, cq, &o, 0xABCDE, gid, t);
    double start = now_ms();
    wr.wr_id = 900;
    CHECK(IvUserPostSend(q, &wr) == ST(STATUS_SUCCESS), "post send to a missing QP");
    expect_status(cq, 900, IV_WC_RETRY_EXC_ERR, "missing QP");
    double took = now_ms() - start, want = (t.retry_cnt + 1) * 4.096e-3 * (1 << t.timeout);
    CHECK(took >= want * 0.99, "RETRY_EXC_ERR after %.1f ms, before %.1f ms of timeouts", took,
          want);
    destroy_qp(q, o.qp);

    for (uint8_t rnr_retry = 0; rnr_retry <= 7; rnr_retry++) {
        Timers rt = {14, 7, rnr_retry, 14}; /* RNR timer 14: 1.28 ms */
        IvCreateQpOut so, ro;
        so = create_qp(pd, cq);
        ro = create_qp(pd, cq);
        connect_qp_timers(so.qp, ro.qpn, gid, rt);
        connect_qp_timers(ro.qp, so.qpn, gid, rt);
        IvUserQp *s = IvUserQpOpen(dev, &so), *rq = IvUserQpOpen(dev, &ro);
        CHECK(s && rq, "open RNR QPs");
        wr.wr_id = 910 + rnr_retry;
        start = now_ms();
        CHECK(IvUserPostSend(s, &wr) == ST(STATUS_SUCCESS), "post send (RNR)");
        if (rnr_retry < 7) {
            expect_status(cq, wr.wr_id, IV_WC_RNR_RETRY_EXC_ERR, "RNR");
            took = now_ms() - start;
            want = rnr_retry * 1.28;
            CHECK(took >= want * 0.99, "rnr_retry %u: RNR_RETRY_EXC_ERR after %.1f ms, before %.1f",
                  (unsigned)rnr_retry, took, want);
        } else {
            /* Waits (RNR NAKs without end) until a receive comes. */
            IvCqe wc;
            while (now_ms() - start < 20) {
                CHECK(IvUserPollCq(cq->u, &wc, 1) == 0, "rnr_retry 7 completed early: %u",
                      (unsigned)wc.status);
            }
            IvSge rsg = at(DST, 64, lkey);
            IvUserRecvWr rwr;
            memset(&rwr, 0, sizeof rwr);
            rwr.wr_id = 990;
            rwr.sg_list = &rsg;
            rwr.num_sge = 1;
            CHECK(IvUserPostRecv(rq, &rwr) == ST(STATUS_SUCCESS), "post recv (RNR)");
            /* The send and the receive complete, in either order. */
            IvCqe got[2];
            int n = 0;
            while (n < 2 && wait_one(cq, &got[n])) n++;
            CHECK(n == 2, "rnr_retry 7: %d completions", n);
            for (int i = 0; i < n; i++) {
                CHECK(got[i].status == IV_WC_SUCCESS, "rnr_retry 7: wr_id %llu status %u",
                      (unsigned long long)got[i].wr_id, (unsigned)got[i].status);
            }
            CHECK(memcmp(mem.b + DST, "tick", 4) == 0, "rnr_retry 7: payload");
        }
        destroy_qp(s, so.qp);
        destroy_qp(rq, ro.qp);
    }
}

/* Polls `cq` until it holds one completion (WAIT_MS at most), without a
 * notification: 1 with *wc, or 0. */
static int poll_for(Cq *cq, IvCqe *wc) {
    time_t start = time(NULL);
    while (time(NULL) - start <= WAIT_MS / 1000) {
        int32_t n = IvUserPollCq(cq->u, wc, 1);
        if (n != 0) return n == 1;
    }
    return 0;
}

/* A completion channel, as libibverbs' ibv_comp_channel: a CQ created on
 * it and armed (IvUserReqNotifyCq) reports one event there per arming; an
 * unarmed one reports none; the event is taken with an overlapped
 * IOCTL_IV_GET_CQ_EVENT reaped from the port and acknowledged with
 * IOCTL_IV_ACK_CQ_EVENTS. A CQ with unacknowledged events, and a channel
 * with a CQ on it, cannot be destroyed. */
static void channel(IvHandle pd, const uint8_t gid[16], uint32_t lkey) {
    IvAllocPdIn none;
    memset(&none, 0, sizeof none);
    IvCreateChannelOut ch;
    CHECK(ioctl(IOCTL_IV_CREATE_CHANNEL, &none, sizeof none, &ch, sizeof ch) == 0, "channel");
    Cq cq;
    IvCreateCqIn in;
    memset(&in, 0, sizeof in);
    in.cqe = 64;
    in.channel = ch.channel;
    in.user_context = (uint64_t)(uintptr_t)&cq;
    cq.name = "channel cq";
    CHECK(ioctl(IOCTL_IV_CREATE_CQ, &in, sizeof in, &cq.out, sizeof cq.out) == 0, "cq on channel");
    cq.u = IvUserCqOpen(dev, &cq.out);
    IvCreateQpOut q1 = create_qp(pd, &cq), q2 = create_qp(pd, &cq);
    connect_qp(q1.qp, q2.qpn, gid);
    connect_qp(q2.qp, q1.qpn, gid);
    IvUserQp *s = IvUserQpOpen(dev, &q1), *r = IvUserQpOpen(dev, &q2);
    CHECK(cq.u && s && r, "open the channel's CQ and QPs: %u", (unsigned)GetLastError());
    if (!cq.u || !s || !r) return;

    /* A wait on the channel, pended before any completion. */
    IvHandleIn chh = {ch.channel};
    IvCqEventOut ev;
    memset(&ev, 0, sizeof ev);
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    DWORD bytes = 0;
    BOOL ok = DeviceIoControl(dev, IOCTL_IV_GET_CQ_EVENT, &chh, sizeof chh, &ev, sizeof ev, &bytes,
                              &ov);
    CHECK(!ok && GetLastError() == ERROR_IO_PENDING, "channel wait: %u", (unsigned)GetLastError());

    IvSge rsg = at(DST, 64, lkey), ssg = at(SRC, 64, lkey);
    IvUserRecvWr rwr;
    memset(&rwr, 0, sizeof rwr);
    rwr.sg_list = &rsg;
    rwr.num_sge = 1;
    IvUserSendWr wr;
    memset(&wr, 0, sizeof wr);
    wr.opcode = IV_WR_SEND;
    wr.flags = IV_SEND_SIGNALED;
    wr.num_sge = 1;
    wr.sg_list = &ssg;
    IvCqe wc;
    for (int round = 0; round < 2; round++) {
        if (round == 1) {
            CHECK(IvUserReqNotifyCq(cq.u, 0) == ST(STATUS_SUCCESS), "arm the channel's CQ");
        }
        rwr.wr_id = 300 + (uint64_t)round;
        wr.wr_id = 310 + (uint64_t)round;
        CHECK(IvUserPostRecv(r, &rwr) == ST(STATUS_SUCCESS), "post recv");
        CHECK(IvUserPostSend(s, &wr) == ST(STATUS_SUCCESS), "post send");
        for (int k = 0; k < 2; k++) {
            CHECK(poll_for(&cq, &wc) && wc.status == IV_WC_SUCCESS &&
                      (wc.wr_id == rwr.wr_id || wc.wr_id == wr.wr_id),
                  "round %d: completion %d: wr_id %llu status %u", round, k,
                  (unsigned long long)wc.wr_id, (unsigned)wc.status);
        }
        if (round == 0) {
            /* Unarmed: two completions, no event. */
            CHECK(!HasOverlappedIoCompleted(&ov), "an unarmed CQ raised a channel event");
        }
    }
    /* Armed once: one event (two completions), naming the CQ. */
    CHECK(reap(&ov) == 0, "channel wait: %#x", (unsigned)ov.Internal);
    CHECK(ev.cq == cq.out.cq && ev.user_context == (uint64_t)(uintptr_t)&cq,
          "event names CQ %#llx", (unsigned long long)ev.cq);

    IvHandleIn h = {cq.out.cq};
    IvUserQpClose(s);
    IvUserQpClose(r);
    IvUserCqClose(cq.u);
    h.handle = q1.qp;
    CHECK(ioctl(IOCTL_IV_DESTROY_QP, &h, sizeof h, NULL, 0) == 0, "destroy channel qp 1");
    h.handle = q2.qp;
    CHECK(ioctl(IOCTL_IV_DESTROY_QP, &h, sizeof h, NULL, 0) == 0, "destroy channel qp 2");
    h.handle = cq.out.cq;
    CHECK(ioctl(IOCTL_IV_DESTROY_CQ, &h, sizeof h, NULL, 0) == ST(STATUS_DEVICE_BUSY),
          "a CQ with an unacknowledged event was destroyed");
    IvAckIn ack;
    memset(&ack, 0, sizeof ack);
    ack.handle = cq.out.cq;
    ack.count = 2;
    CHECK(ioctl(IOCTL_IV_ACK_CQ_EVENTS, &ack, sizeof ack, NULL, 0) == ST(STATUS_INVALID_PARAMETER),
          "acked two events of one");
    CHECK(ioctl(IOCTL_IV_DESTROY_CHANNEL, &chh, sizeof chh, NULL, 0) == ST(STATUS_DEVICE_BUSY),
          "a channel with a CQ was destroyed");
    ack.count = 1;
    CHECK(ioctl(IOCTL_IV_ACK_CQ_EVENTS, &ack, sizeof ack, NULL, 0) == 0, "ack");
    CHECK(ioctl(IOCTL_IV_DESTROY_CQ, &h, sizeof h, NULL, 0) == 0, "destroy the channel's CQ");
    CHECK(ioctl(IOCTL_IV_DESTROY_CHANNEL, &chh, sizeof chh, NULL, 0) == 0, "destroy channel");
}

int main(void) {
    dev = CreateFileA("\\\\.\\irpverbs0", GENERIC_READ | GENERIC_WRITE, 0, NULL, OPEN_EXISTING,
                      FILE_FLAG_OVERLAPPED, NULL);
    CHECK(dev != INVALID_HANDLE_VALUE, "CreateFileA: %u", (unsigned)GetLastError());
    if (dev == INVALID_HANDLE_VALUE) return 1;
    port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 1);
    CHECK(CreateIoCompletionPort(dev, port, PORT_KEY, 1) == port, "associate");

    IvAllocPdIn pdin;
    memset(&pdin, 0, sizeof pdin);
    IvAllocPdOut pd;
    CHECK(ioctl(IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd, sizeof pd) == 0, "alloc pd");
    for (int i = 0; i < BUF; i++) mem.b[i] = (unsigned char)(i * 13 + 7);
    IvRegMrIn mrin;
    memset(&mrin, 0, sizeof mrin);
    mrin.pd = pd.pd;
    mrin.addr = (uint64_t)(uintptr_t)mem.b;
    mrin.length = BUF;
    mrin.access = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;
    IvRegMrOut mr;
    CHECK(ioctl(IOCTL_IV_REG_MR, &mrin, sizeof mrin, &mr, sizeof mr) == 0, "reg mr");
    uint32_t lkey = mr.lkey;

    Cq cqa, cqb;
    create_cq(&cqa, "cq A");
    create_cq(&cqb, "cq B");
    IvCreateQpOut qa = create_qp(pd.pd, &cqa), qb = create_qp(pd.pd, &cqb);
    IvQueryGidIn gin = {1, 0};
    IvQueryGidOut gid;
    CHECK(ioctl(IOCTL_IV_QUERY_GID, &gin, sizeof gin, &gid, sizeof gid) == 0, "query gid");
    connect_qp(qa.qp, qb.qpn, gid.gid);
    connect_qp(qb.qp, qa.qpn, gid.gid);
    IvUserQp *a = IvUserQpOpen(dev, &qa), *b = IvUserQpOpen(dev, &qb);
    CHECK(a && b, "open QPs: %u", (unsigned)GetLastError());
    if (failed) return 1;

    IvUserRecvWr rwr;
    IvUserSendWr wr;
    IvSge rsg, sg[2];

    /* SEND / RECV: 1000 bytes gathered from two pieces. */
    memset(mem.b + DST, 0, 4096);
    rsg = at(DST, 4096, lkey);
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = 100;
    rwr.sg_list = &rsg;
    rwr.num_sge = 1;
    CHECK(IvUserPostRecv(b, &rwr) == ST(STATUS_SUCCESS), "post recv");
    sg[0] = at(SRC, 600, lkey);
    sg[1] = at(SRC + 600, 400, lkey);
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 1;
    wr.opcode = IV_WR_SEND;
    wr.flags = IV_SEND_SIGNALED;
    wr.num_sge = 2;
    wr.sg_list = sg;
    CHECK(IvUserPostSend(a, &wr) == ST(STATUS_SUCCESS), "post send");
    expect(&cqa, 1, IV_WC_OP_SEND, (uint32_t)-1);
    IvCqe wc = expect(&cqb, 100, IV_WC_OP_RECV, 1000);
    CHECK(wc.qp_num == qb.qpn, "recv on QP %#x", (unsigned)wc.qp_num);
    CHECK(memcmp(mem.b + DST, mem.b + SRC, 1000) == 0, "SEND payload");

    /* SEND with immediate data, inline. */
    static const char hello[] = "hello over the speed path";
    memset(mem.b + DST, 0, 4096);
    rwr.wr_id = 101;
    CHECK(IvUserPostRecv(b, &rwr) == ST(STATUS_SUCCESS), "post recv");
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 2;
    wr.opcode = IV_WR_SEND_WITH_IMM;
    wr.flags = IV_SEND_SIGNALED | IV_SEND_INLINE | IV_SEND_SOLICITED;
    wr.imm_or_inv = 0x11223344u;
    wr.inline_len = sizeof hello;
    wr.inline_data = hello;
    CHECK(IvUserPostSend(a, &wr) == ST(STATUS_SUCCESS), "post send inline");
    expect(&cqa, 2, IV_WC_OP_SEND, (uint32_t)-1);
    wc = expect(&cqb, 101, IV_WC_OP_RECV, sizeof hello);
    CHECK((wc.wc_flags & IV_WC_WITH_IMM) && wc.imm_or_inv == 0x11223344u, "immediate %#x",
          (unsigned)wc.imm_or_inv);
    CHECK(memcmp(mem.b + DST, hello, sizeof hello) == 0, "inline payload");

    /* RDMA WRITE into B's memory. */
    memset(mem.b + REMOTE, 0, 4096);
    sg[0] = at(SRC, 4096, lkey);
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 3;
    wr.opcode = IV_WR_RDMA_WRITE;
    wr.flags = IV_SEND_SIGNALED;
    wr.num_sge = 1;
    wr.sg_list = sg;
    wr.remote_addr = (uint64_t)(uintptr_t)(mem.b + REMOTE);
    wr.rkey = mr.rkey;
    CHECK(IvUserPostSend(a, &wr) == ST(STATUS_SUCCESS), "post write");
    expect(&cqa, 3, IV_WC_OP_RDMA_WRITE, (uint32_t)-1);
    CHECK(memcmp(mem.b + REMOTE, mem.b + SRC, 4096) == 0, "RDMA WRITE payload");

    /* RDMA WRITE with immediate: B's receive completes with the data. */
    rwr.wr_id = 102;
    CHECK(IvUserPostRecv(b, &rwr) == ST(STATUS_SUCCESS), "post recv");
    sg[0] = at(SRC + 100, 50, lkey);
    wr.wr_id = 4;
    wr.opcode = IV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_or_inv = 0xA5A5A5A5u;
    wr.remote_addr = (uint64_t)(uintptr_t)(mem.b + REMOTE + 2000);
    CHECK(IvUserPostSend(a, &wr) == ST(STATUS_SUCCESS), "post write imm");
    expect(&cqa, 4, IV_WC_OP_RDMA_WRITE, (uint32_t)-1);
    wc = expect(&cqb, 102, IV_WC_OP_RECV_RDMA_WITH_IMM, 50);
    CHECK((wc.wc_flags & IV_WC_WITH_IMM) && wc.imm_or_inv == 0xA5A5A5A5u, "write imm %#x",
          (unsigned)wc.imm_or_inv);
    CHECK(memcmp(mem.b + REMOTE + 2000, mem.b + SRC + 100, 50) == 0, "WRITE imm payload");

    /* RDMA READ back what was written, into A's memory, scattered. */
    memset(mem.b + READ_BACK, 0, 4096);
    sg[0] = at(READ_BACK, 3000, lkey);
    sg[1] = at(READ_BACK + 3000, 1096, lkey);
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 5;
    wr.opcode = IV_WR_RDMA_READ;
    wr.flags = IV_SEND_SIGNALED;
    wr.num_sge = 2;
    wr.sg_list = sg;
    wr.remote_addr = (uint64_t)(uintptr_t)(mem.b + REMOTE);
    wr.rkey = mr.rkey;
    CHECK(IvUserPostSend(a, &wr) == ST(STATUS_SUCCESS), "post read");
    expect(&cqa, 5, IV_WC_OP_RDMA_READ, 4096);
    CHECK(memcmp(mem.b + READ_BACK, mem.b + REMOTE, 4096) == 0, "RDMA READ payload");

    /* Nothing else completed. */
    CHECK(IvUserPollCq(cqa.u, &wc, 1) == 0 && IvUserPollCq(cqb.u, &wc, 1) == 0, "extra completions");

    timers(pd.pd, &cqa, gid.gid, lkey);
    channel(pd.pd, gid.gid, lkey);

    /* Close the speed path, then destroy. */
    IvUserQpClose(a);
    IvUserQpClose(b);
    IvUserCqClose(cqa.u);
    IvUserCqClose(cqb.u);
    IvHandleIn h;
    h.handle = qa.qp;
    CHECK(ioctl(IOCTL_IV_DESTROY_QP, &h, sizeof h, NULL, 0) == 0, "destroy qp A");
    h.handle = qb.qp;
    CHECK(ioctl(IOCTL_IV_DESTROY_QP, &h, sizeof h, NULL, 0) == 0, "destroy qp B");
    h.handle = cqa.out.cq;
    CHECK(ioctl(IOCTL_IV_DESTROY_CQ, &h, sizeof h, NULL, 0) == 0, "destroy cq A");
    h.handle = cqb.out.cq;
    CHECK(ioctl(IOCTL_IV_DESTROY_CQ, &h, sizeof h, NULL, 0) == 0, "destroy cq B");
    h.handle = mr.mr;
    CHECK(ioctl(IOCTL_IV_DEREG_MR, &h, sizeof h, NULL, 0) == 0, "dereg mr");
    h.handle = pd.pd;
    CHECK(ioctl(IOCTL_IV_DEALLOC_PD, &h, sizeof h, NULL, 0) == 0, "dealloc pd");
    CHECK(CloseHandle(dev), "close device");
    CHECK(CloseHandle(port), "close port");
#ifndef _WIN32
    CHECK(IrpverbsHostQuiesce(10000), "driver still holds objects after close");
#endif

    printf("%s: %d passed, %d failed\n", notify_supported ? "notify" : "polled", passed, failed);
    return failed == 0 ? 0 : 1;
}
