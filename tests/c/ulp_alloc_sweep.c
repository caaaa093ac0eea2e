/*
 * A user-mode ULP's control scenario for the black-box allocation sweep
 * (ulp/host-c/tests/c_ulp.rs, c_ulp_allocation_sweep): run once per
 * allocation index with IRPVERBS_FAIL_NTH_ALLOC=N, the Nth allocation the
 * process makes once the device is loaded is refused.
 *
 * Every verb (Win32 call, IOCTL or speed-path call) that fails with the
 * refusal's error -- ERROR_NO_SYSTEM_RESOURCES, or the NTSTATUS
 * STATUS_INSUFFICIENT_RESOURCES -- is issued once more and must then
 * succeed: the refused call changed nothing and the device keeps working.
 * Any other failure, or a wrong result, fails the program. It opens the
 * device, queries it, creates a PD, an MR, a completion channel, a CQ on
 * it, an SRQ, a QP walked to RTS (looped back to itself), an AH and a CEP
 * listening; moves a SEND through the QP to the SRQ, with the completion
 * event taken from the channel by an overlapped request whose hEvent has
 * its low bit set (no completion packet) and the rest reaped from an I/O
 * completion port; pends a CQ notify and cancels it; posts a packet of its
 * own to the port; destroys everything, closes its handles and, on the
 * host, unloads the driver, whose verifier and leak checks must find
 * nothing. Exit code 0 means every check held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "irpverbs.h"
#include "irpverbs_host.h"
#include "irpverbs_user.h"

#include "check.h"

/* <winnt.h> defines some STATUS_ codes as DWORD: compare as NtStatus. */
#define ST(s) ((NtStatus)(s))

#define PORT_KEY ((ULONG_PTR)0x5EE9)
#define WAIT_MS 10000

static HANDLE dev, port, event;
static int verbs, retries;

/* Stops at once: nothing after this can hold. */
static void give_up(const char *what) {
    CHECK(0, "%s: giving up", what);
    printf("%d verbs, %d retried; %d passed, %d failed\n", verbs, retries, passed, failed);
    exit(1);
}

/* Takes the completion packet of `ov` from the port. */
static void reap(OVERLAPPED *ov, DWORD millis) {
    DWORD got = 0;
    ULONG_PTR key = 0;
    LPOVERLAPPED pov = NULL;
    GetQueuedCompletionStatus(port, &got, &key, &pov, millis);
    CHECK(pov == ov && key == PORT_KEY, "completion packet %p key %#lx, want %p", (void *)pov,
          (unsigned long)key, (void *)ov);
    CHECK(got == (DWORD)ov->InternalHigh, "packet bytes %u, InternalHigh %u", (unsigned)got,
          (unsigned)ov->InternalHigh);
}

/* Issues one overlapped IOCTL and waits for its completion: reaped from
 * the port, or (`via_event`) waited for on the event, whose handle's low
 * bit keeps the completion off the port. The NTSTATUS, with
 * STATUS_INSUFFICIENT_RESOURCES for a request refused before the driver
 * saw it (FALSE, ERROR_NO_SYSTEM_RESOURCES, no completion). */
static NTSTATUS issue(DWORD code, const void *in, DWORD in_len, void *out, DWORD out_len,
                      DWORD *bytes, int via_event) {
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    if (via_event) ov.hEvent = (HANDLE)((uintptr_t)event | 1);
    DWORD n = 0;
    BOOL ok = DeviceIoControl(dev, code, (LPVOID)in, in_len, out, out_len, &n, &ov);
    DWORD err = ok ? ERROR_SUCCESS : GetLastError();
    if (!ok && err == ERROR_NO_SYSTEM_RESOURCES && ov.Internal == (ULONG_PTR)STATUS_PENDING) {
        /* Refused before the driver (no IRP): the OVERLAPPED stays as
         * DeviceIoControl set it, no packet, no event. */
        if (!via_event) {
            DWORD got;
            ULONG_PTR key;
            LPOVERLAPPED pov = NULL;
            BOOL q = GetQueuedCompletionStatus(port, &got, &key, &pov, 0);
            CHECK(!q && pov == NULL, "a packet (%p) for a request refused before the driver",
                  (void *)pov);
        }
        return ST(STATUS_INSUFFICIENT_RESOURCES);
    }
    if (via_event) {
        CHECK(WaitForSingleObject(event, WAIT_MS) == WAIT_OBJECT_0, "event of IOCTL %#x",
              (unsigned)code);
    } else {
        reap(&ov, WAIT_MS);
    }
    CHECK(HasOverlappedIoCompleted(&ov), "IOCTL %#x still pending", (unsigned)code);
    DWORD got = 0;
    BOOL r = GetOverlappedResult(dev, &ov, &got, FALSE);
    NTSTATUS st = (NTSTATUS)(DWORD)ov.Internal;
    CHECK((r != FALSE) == (st >= 0) && got == (DWORD)ov.InternalHigh,
          "GetOverlappedResult disagrees with the OVERLAPPED");
    if (bytes) *bytes = got;
    return st;
}

/* A verb: the IOCTL, issued once more after an injected refusal; it must
 * end in STATUS_SUCCESS. */
static void verb_ex(const char *what, DWORD code, const void *in, DWORD in_len, void *out,
                    DWORD out_len, int via_event) {
    verbs++;
    DWORD bytes = 0;
    NTSTATUS st = issue(code, in, in_len, out, out_len, &bytes, via_event);
    if (st == ST(STATUS_INSUFFICIENT_RESOURCES)) {
        retries++;
        printf("retry: %s\n", what);
        st = issue(code, in, in_len, out, out_len, &bytes, via_event);
    }
    CHECK(st == ST(STATUS_SUCCESS), "%s: %#x", what, (unsigned)st);
    CHECK(bytes == (out ? out_len : 0), "%s: %u bytes out of %u", what, (unsigned)bytes,
          (unsigned)out_len);
    if (st != ST(STATUS_SUCCESS)) give_up(what);
}

static void verb(const char *what, DWORD code, const void *in, DWORD in_len, void *out,
                 DWORD out_len) {
    verb_ex(what, code, in, in_len, out, out_len, 0);
}

/* A Win32 call that returns BOOL, issued once more after a refusal. */
#define WIN32_VERB(what, call)                                                                 \
    do {                                                                                       \
        verbs++;                                                                               \
        BOOL ok_ = (call);                                                                     \
        if (!ok_ && GetLastError() == ERROR_NO_SYSTEM_RESOURCES) {                             \
            retries++;                                                                         \
            printf("retry: %s\n", what);                                                       \
            ok_ = (call);                                                                      \
        }                                                                                      \
        CHECK(ok_, "%s: error %u", what, (unsigned)GetLastError());                            \
        if (!ok_) give_up(what);                                                               \
    } while (0)

/* A call that returns a handle or pointer (`bad` on failure), issued once
 * more after a refusal. */
#define OPEN_VERB(what, var, bad, call)                                                        \
    do {                                                                                       \
        verbs++;                                                                               \
        var = (call);                                                                          \
        if (var == (bad) && GetLastError() == ERROR_NO_SYSTEM_RESOURCES) {                     \
            retries++;                                                                         \
            printf("retry: %s\n", what);                                                       \
            var = (call);                                                                      \
        }                                                                                      \
        CHECK(var != (bad), "%s: error %u", what, (unsigned)GetLastError());                   \
        if (var == (bad)) give_up(what);                                                       \
    } while (0)

/* A speed-path call that returns an NtStatus, issued once more after a
 * refusal. */
#define SPEED_VERB(what, call)                                                                 \
    do {                                                                                       \
        verbs++;                                                                               \
        NtStatus st_ = (call);                                                                 \
        if (st_ == ST(STATUS_INSUFFICIENT_RESOURCES)) {                                        \
            retries++;                                                                         \
            printf("retry: %s\n", what);                                                       \
            st_ = (call);                                                                      \
        }                                                                                      \
        CHECK(st_ == ST(STATUS_SUCCESS), "%s: %#x", what, (unsigned)st_);                      \
        if (st_ != ST(STATUS_SUCCESS)) give_up(what);                                          \
    } while (0)

static unsigned char mem[4096];

/* Polls `cq` for `want` completions (WAIT_MS at most). */
static int poll_n(IvUserCq *cq, IvCqe *wc, int want) {
    int got = 0;
    for (long spins = 0; got < want && spins < 10000000L; spins++) {
        int32_t n = IvUserPollCq(cq, wc + got, (uint32_t)(want - got));
        if (n < 0) {
            CHECK(0, "poll: %#x", (unsigned)n);
            return got;
        }
        got += n;
    }
    return got;
}

int main(void) {
    OPEN_VERB("CreateFileA", dev, INVALID_HANDLE_VALUE,
              CreateFileA("\\\\.\\irpverbs0", GENERIC_READ | GENERIC_WRITE, 0, NULL, OPEN_EXISTING,
                          FILE_FLAG_OVERLAPPED, NULL));
    OPEN_VERB("CreateIoCompletionPort (new)", port, NULL,
              CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 1));
    HANDLE assoc;
    OPEN_VERB("CreateIoCompletionPort (associate)", assoc, NULL,
              CreateIoCompletionPort(dev, port, PORT_KEY, 1));
    CHECK(assoc == port, "associated with another port");
    OPEN_VERB("CreateEventA", event, NULL, CreateEventA(NULL, TRUE, FALSE, NULL));

    IvQueryDeviceOut attr;
    verb("query device", IOCTL_IV_QUERY_DEVICE, NULL, 0, &attr, sizeof attr);
    CHECK(attr.phys_port_cnt == 1 && attr.max_qp > 0, "device attributes");
    IvQueryPortIn pin = {1, 0};
    IvQueryPortOut pout;
    verb("query port", IOCTL_IV_QUERY_PORT, &pin, sizeof pin, &pout, sizeof pout);
    CHECK(pout.state == IV_PORT_ACTIVE, "port state %u", (unsigned)pout.state);
    IvQueryGidIn gin = {1, 0};
    IvQueryGidOut gid;
    verb("query gid", IOCTL_IV_QUERY_GID, &gin, sizeof gin, &gid, sizeof gid);

    IvAllocPdIn pdin;
    memset(&pdin, 0, sizeof pdin);
    IvAllocPdOut pd;
    verb("alloc pd", IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd, sizeof pd);

    IvRegMrIn mrin;
    memset(&mrin, 0, sizeof mrin);
    mrin.pd = pd.pd;
    mrin.addr = (uint64_t)(uintptr_t)mem;
    mrin.length = sizeof mem;
    mrin.access = IV_ACCESS_LOCAL_WRITE;
    IvRegMrOut mr;
    verb("reg mr", IOCTL_IV_REG_MR, &mrin, sizeof mrin, &mr, sizeof mr);

    IvCreateChannelOut ch;
    verb("create channel", IOCTL_IV_CREATE_CHANNEL, &pdin, sizeof pdin, &ch, sizeof ch);

    IvCreateCqIn cqin;
    memset(&cqin, 0, sizeof cqin);
    cqin.cqe = 16;
    cqin.channel = ch.channel;
    cqin.user_context = 0xC0;
    IvCreateCqOut cq;
    verb("create cq", IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq, sizeof cq);

    IvCreateSrqIn srqin;
    memset(&srqin, 0, sizeof srqin);
    srqin.pd = pd.pd;
    srqin.max_wr = 8;
    srqin.max_sge = 1;
    IvCreateSrqOut srq;
    verb("create srq", IOCTL_IV_CREATE_SRQ, &srqin, sizeof srqin, &srq, sizeof srq);

    IvCreateQpIn qpin;
    memset(&qpin, 0, sizeof qpin);
    qpin.pd = pd.pd;
    qpin.send_cq = cq.cq;
    qpin.recv_cq = cq.cq;
    qpin.srq = srq.srq;
    qpin.qp_type = IV_QPT_RC;
    qpin.cap.max_send_wr = 8;
    qpin.cap.max_send_sge = 1;
    qpin.cap.max_inline_data = 16;
    IvCreateQpOut qp;
    verb("create qp", IOCTL_IV_CREATE_QP, &qpin, sizeof qpin, &qp, sizeof qp);

    /* RESET -> INIT -> RTR -> RTS, looped back to itself. */
    IvModifyQpIn m;
    memset(&m, 0, sizeof m);
    m.qp = qp.qp;
    m.attr_mask = IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS;
    m.attr.qp_state = IV_QPS_INIT;
    m.attr.port_num = 1;
    m.attr.qp_access_flags = IV_ACCESS_REMOTE_WRITE;
    verb("modify qp to INIT", IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0);
    memset(&m.attr, 0, sizeof m.attr);
    m.attr_mask = IV_QP_STATE | IV_QP_AV | IV_QP_PATH_MTU | IV_QP_DEST_QPN | IV_QP_RQ_PSN |
                  IV_QP_MAX_DEST_RD_ATOMIC | IV_QP_MIN_RNR_TIMER;
    m.attr.qp_state = IV_QPS_RTR;
    memcpy(m.attr.ah_attr.dgid, gid.gid, 16);
    m.attr.ah_attr.is_global = 1;
    m.attr.ah_attr.port_num = 1;
    m.attr.ah_attr.hop_limit = 64;
    m.attr.path_mtu = IV_MTU_1024;
    m.attr.dest_qp_num = qp.qpn;
    m.attr.rq_psn = 100;
    m.attr.max_dest_rd_atomic = 1;
    m.attr.min_rnr_timer = 1;
    verb("modify qp to RTR", IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0);
    memset(&m.attr, 0, sizeof m.attr);
    m.attr_mask = IV_QP_STATE | IV_QP_TIMEOUT | IV_QP_RETRY_CNT | IV_QP_RNR_RETRY | IV_QP_SQ_PSN |
                  IV_QP_MAX_QP_RD_ATOMIC;
    m.attr.qp_state = IV_QPS_RTS;
    m.attr.timeout = 14;
    m.attr.retry_cnt = 7;
    m.attr.rnr_retry = 7;
    m.attr.sq_psn = 100;
    m.attr.max_rd_atomic = 1;
    verb("modify qp to RTS", IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0);
    IvHandleIn qh = {qp.qp};
    IvQueryQpOut qq;
    verb("query qp", IOCTL_IV_QUERY_QP, &qh, sizeof qh, &qq, sizeof qq);
    CHECK(qq.attr.qp_state == IV_QPS_RTS && qq.attr.dest_qp_num == qp.qpn, "QP state %u",
          (unsigned)qq.attr.qp_state);

    IvCreateAhIn ahin;
    memset(&ahin, 0, sizeof ahin);
    ahin.pd = pd.pd;
    memcpy(ahin.attr.dgid, gid.gid, 16);
    ahin.attr.is_global = 1;
    ahin.attr.port_num = 1;
    ahin.attr.hop_limit = 64;
    IvCreateAhOut ah;
    verb("create ah", IOCTL_IV_CREATE_AH, &ahin, sizeof ahin, &ah, sizeof ah);

    IvCreateCepIn cepin = {0xCE};
    IvCreateCepOut cep;
    verb("create cep", IOCTL_IV_CREATE_CEP, &cepin, sizeof cepin, &cep, sizeof cep);
    IvListenIn lin = {cep.cep, 0x5EE0001};
    verb("listen", IOCTL_IV_LISTEN, &lin, sizeof lin, NULL, 0);

    /* The speed path. */
    IvUserCq *ucq;
    IvUserSrq *usrq;
    IvUserQp *uqp;
    OPEN_VERB("IvUserCqOpen", ucq, NULL, IvUserCqOpen(dev, &cq));
    OPEN_VERB("IvUserSrqOpen", usrq, NULL, IvUserSrqOpen(dev, &srq));
    OPEN_VERB("IvUserQpOpen", uqp, NULL, IvUserQpOpen(dev, &qp));

    /* A SEND through the QP to its SRQ; its completion event comes through
     * the channel to a request whose event handle has its low bit set. */
    IvSge rsg = {(uint64_t)(uintptr_t)mem, 64, mr.lkey};
    IvUserRecvWr rwr;
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = 1;
    rwr.sg_list = &rsg;
    rwr.num_sge = 1;
    SPEED_VERB("post srq recv", IvUserPostSrqRecv(usrq, &rwr));
    SPEED_VERB("arm cq", IvUserReqNotifyCq(ucq, 0));
    IvUserSendWr swr;
    memset(&swr, 0, sizeof swr);
    swr.wr_id = 2;
    swr.opcode = IV_WR_SEND;
    swr.flags = IV_SEND_SIGNALED | IV_SEND_INLINE;
    swr.inline_data = "sweep";
    swr.inline_len = 5;
    SPEED_VERB("post send", IvUserPostSend(uqp, &swr));
    IvHandleIn chh = {ch.channel};
    IvCqEventOut ev;
    verb_ex("get cq event (event, no packet)", IOCTL_IV_GET_CQ_EVENT, &chh, sizeof chh, &ev,
            sizeof ev, 1);
    CHECK(ev.cq == cq.cq && ev.user_context == 0xC0, "event names CQ %#llx",
          (unsigned long long)ev.cq);
    IvAckIn ack = {cq.cq, 1, 0};
    verb("ack cq events", IOCTL_IV_ACK_CQ_EVENTS, &ack, sizeof ack, NULL, 0);
    IvCqe wc[2];
    memset(wc, 0, sizeof wc);
    CHECK(poll_n(ucq, wc, 2) == 2, "two completions");
    int sends = 0, recvs = 0;
    for (int i = 0; i < 2; i++) {
        CHECK(wc[i].status == IV_WC_SUCCESS, "wr_id %llu status %u", (unsigned long long)wc[i].wr_id,
              (unsigned)wc[i].status);
        sends += wc[i].wr_id == 2;
        recvs += wc[i].wr_id == 1 && wc[i].byte_len == 5;
    }
    CHECK(sends == 1 && recvs == 1 && memcmp(mem, "sweep", 5) == 0, "the SEND arrived");

    /* A CQ notify pended on the port, then cancelled. */
    verbs++;
    IvCqNotifyIn nin;
    memset(&nin, 0, sizeof nin);
    nin.cq = cq.cq;
    nin.arm = IV_NOTIFY_NEXT;
    IvCqEventOut nev;
    OVERLAPPED nov;
    for (int attempt = 0;; attempt++) {
        memset(&nov, 0, sizeof nov);
        BOOL ok = DeviceIoControl(dev, IOCTL_IV_CQ_NOTIFY, &nin, sizeof nin, &nev, sizeof nev, NULL,
                                  &nov);
        DWORD err = GetLastError();
        if (!ok && err == ERROR_IO_PENDING) break;
        if (attempt == 0 && !ok && err == ERROR_NO_SYSTEM_RESOURCES) {
            retries++;
            printf("retry: cq notify\n");
            /* Completed by the driver: its packet. Refused before: none. */
            if (nov.Internal != (ULONG_PTR)STATUS_PENDING) reap(&nov, 0);
            continue;
        }
        CHECK(0, "cq notify: ok %d error %u", (int)ok, (unsigned)err);
        give_up("cq notify");
    }
    WIN32_VERB("CancelIoEx", CancelIoEx(dev, &nov));
    reap(&nov, WAIT_MS);
    CHECK((NTSTATUS)(DWORD)nov.Internal == ST(STATUS_CANCELLED), "cancelled notify: %#x",
          (unsigned)nov.Internal);

    /* A packet of the ULP's own through the port. */
    OVERLAPPED mine;
    memset(&mine, 0, sizeof mine);
    WIN32_VERB("PostQueuedCompletionStatus", PostQueuedCompletionStatus(port, 7, PORT_KEY, &mine));
    DWORD got = 0;
    ULONG_PTR key = 0;
    LPOVERLAPPED pov = NULL;
    WIN32_VERB("GetQueuedCompletionStatus",
               GetQueuedCompletionStatus(port, &got, &key, &pov, WAIT_MS));
    CHECK(got == 7 && key == PORT_KEY && pov == &mine, "the posted packet");

    /* Everything goes. */
    IvUserQpClose(uqp);
    IvUserSrqClose(usrq);
    IvUserCqClose(ucq);
    IvHandleIn h;
    h.handle = cep.cep;
    verb("destroy cep", IOCTL_IV_DESTROY_CEP, &h, sizeof h, NULL, 0);
    h.handle = ah.ah;
    verb("destroy ah", IOCTL_IV_DESTROY_AH, &h, sizeof h, NULL, 0);
    verb("destroy qp", IOCTL_IV_DESTROY_QP, &qh, sizeof qh, NULL, 0);
    h.handle = srq.srq;
    verb("destroy srq", IOCTL_IV_DESTROY_SRQ, &h, sizeof h, NULL, 0);
    h.handle = cq.cq;
    verb("destroy cq", IOCTL_IV_DESTROY_CQ, &h, sizeof h, NULL, 0);
    verb("destroy channel", IOCTL_IV_DESTROY_CHANNEL, &chh, sizeof chh, NULL, 0);
    h.handle = mr.mr;
    verb("dereg mr", IOCTL_IV_DEREG_MR, &h, sizeof h, NULL, 0);
    h.handle = pd.pd;
    verb("dealloc pd", IOCTL_IV_DEALLOC_PD, &h, sizeof h, NULL, 0);
    WIN32_VERB("CloseHandle (event)", CloseHandle(event));
    WIN32_VERB("CloseHandle (device)", CloseHandle(dev));
    WIN32_VERB("CloseHandle (port)", CloseHandle(port));
#ifndef _WIN32
    /* Host only: the driver unloads; its verifier and leak checks must find
     * nothing. */
    WIN32_VERB("IrpverbsHostUnload", IrpverbsHostUnload());
#endif

    printf("%d verbs, %d retried; %d passed, %d failed\n", verbs, retries, passed, failed);
    return failed == 0 ? 0 : 1;
}
