/*
 * A kernel-mode ULP connecting through the CM with CEP callbacks, in C, in
 * host mode (irpverbs_kernel.h, version 2 of the direct-call table).
 *
 * Two kernel files on one device (the CM loops back to the port's own GID):
 * "server" listens, "client" connects. Each CEP has a callback registered in
 * the table; the callback only records that it ran (and at which IRQL: it
 * must be DISPATCH_LEVEL, which the host verifier checks as well) and says
 * "reap now"; the ULP then reaps with poll_cep_event: the REQ (the
 * listener's CONNECT_REQUEST), the REP (the client's REPLY) and, with the
 * RTU, the accept's completion. Both QPs reach RTS, and a SEND moves data
 * through the table's speed path.
 *
 * Then the rundown: once unregister_cep_callback returned, a CEP's events
 * (the disconnect's) never call the callback again and go back to
 * IOCTL_IV_GET_CEP_EVENT. Version 1 callers still get the version 1 table.
 *
 * Host only (IrpverbsHostCreateKernelFile, IrpverbsHostQueryInterface,
 * IrpverbsHostGetFileObject and IrpverbsHostGetCurrentIrql stand in for
 * IoGetDeviceObjectPointer, the PnP IRP and KeGetCurrentIrql). Exit code 0
 * means every check held.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "irpverbs.h"
#include "irpverbs_host.h"
#include "irpverbs_kernel.h"

#include "check.h"

#define SERVICE 0x5EEDull
#define WAIT_MS 20000
#define MSG 48

static IvKernelInterface t;

/* What a callback saw: how often it ran, at which IRQL, the last CEP. */
typedef struct {
    atomic_int calls;
    atomic_int wrong_irql;
    atomic_ullong last_cep;
    atomic_ullong last_context;
} Seen;

static Seen listener_seen, client_seen, conn_seen;

/* The callback: "reap now". It runs at DISPATCH_LEVEL and only notes it. */
static void on_cep(void *context, IvHandle cep, uint64_t user_context) {
    Seen *s = (Seen *)context;
    if (IrpverbsHostGetCurrentIrql() != 2) atomic_fetch_add(&s->wrong_irql, 1);
    atomic_store(&s->last_cep, cep);
    atomic_store(&s->last_context, user_context);
    atomic_fetch_add(&s->calls, 1);
}

static double now_ms(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Waits until the callback of `s` ran more than `calls` times. */
static int wait_call(Seen *s, int calls) {
    double end = now_ms() + WAIT_MS;
    while (atomic_load(&s->calls) <= calls)
        if (now_ms() > end) return 0;
    return 1;
}

/* A synchronous internal IOCTL on `f`: the NTSTATUS (0 on success). */
static NTSTATUS ioctl_on(HANDLE f, DWORD code, const void *in, DWORD in_len, void *out,
                         DWORD out_len) {
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    DWORD bytes = 0;
    if (!DeviceIoControl(f, code, (LPVOID)in, in_len, out, out_len, &bytes, &ov) &&
        GetLastError() != ERROR_IO_PENDING)
        return (NTSTATUS)ov.Internal ? (NTSTATUS)ov.Internal : (NTSTATUS)0xC0000001u;
    GetOverlappedResult(f, &ov, &bytes, TRUE);
    return (NTSTATUS)ov.Internal;
}

/* An overlapped internal IOCTL left in flight. */
static void start(HANDLE f, DWORD code, const void *in, DWORD in_len, OVERLAPPED *ov) {
    memset(ov, 0, sizeof *ov);
    DWORD bytes = 0;
    BOOL ok = DeviceIoControl(f, code, (LPVOID)in, in_len, NULL, 0, &bytes, ov);
    CHECK(ok || GetLastError() == ERROR_IO_PENDING, "start %#x: %u", (unsigned)code,
          (unsigned)GetLastError());
}

static NTSTATUS finish(HANDLE f, OVERLAPPED *ov) {
    DWORD bytes = 0;
    GetOverlappedResult(f, ov, &bytes, TRUE);
    return (NTSTATUS)ov->Internal;
}

/* One side: its kernel file, CQ, QP, opened in the table. */
typedef struct {
    HANDLE file;
    void *fo;
    IvCreateCqOut cq;
    IvCreateQpOut qp;
    IvKernelCq *kcq;
    IvKernelQp *kqp;
} Side;

static void side(Side *s) {
    s->file = IrpverbsHostCreateKernelFile(FILE_FLAG_OVERLAPPED);
    CHECK(s->file != INVALID_HANDLE_VALUE, "kernel file");
    s->fo = IrpverbsHostGetFileObject(s->file);
    CHECK(s->fo != NULL, "file object");
}

static IvHandle pd_of(Side *s) {
    IvAllocPdIn in;
    memset(&in, 0, sizeof in);
    IvAllocPdOut out;
    memset(&out, 0, sizeof out);
    CHECK(ioctl_on(s->file, IOCTL_IV_ALLOC_PD, &in, sizeof in, &out, sizeof out) == 0, "pd");
    return out.pd;
}

static void queues(Side *s, IvHandle pd) {
    IvCreateCqIn cqin;
    memset(&cqin, 0, sizeof cqin);
    cqin.cqe = 16;
    CHECK(ioctl_on(s->file, IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &s->cq, sizeof s->cq) == 0,
          "cq");
    IvCreateQpIn in;
    memset(&in, 0, sizeof in);
    in.pd = pd;
    in.send_cq = s->cq.cq;
    in.recv_cq = s->cq.cq;
    in.qp_type = IV_QPT_RC;
    in.cap.max_send_wr = 8;
    in.cap.max_recv_wr = 8;
    in.cap.max_send_sge = 1;
    in.cap.max_recv_sge = 1;
    CHECK(ioctl_on(s->file, IOCTL_IV_CREATE_QP, &in, sizeof in, &s->qp, sizeof s->qp) == 0, "qp");
    CHECK(t.open_cq(t.context, s->cq.cqn, &s->cq.ring, &s->kcq) == STATUS_SUCCESS, "open cq");
    CHECK(t.open_qp(t.context, &s->qp, &s->kqp) == STATUS_SUCCESS, "open qp");
}

static IvHandle new_cep(Side *s, uint64_t user_context) {
    IvCreateCepIn in = {user_context};
    IvCreateCepOut out;
    memset(&out, 0, sizeof out);
    CHECK(ioctl_on(s->file, IOCTL_IV_CREATE_CEP, &in, sizeof in, &out, sizeof out) == 0, "cep");
    return out.cep;
}

static uint32_t qp_state(Side *s) {
    IvHandleIn h = {s->qp.qp};
    IvQueryQpOut q;
    memset(&q, 0, sizeof q);
    CHECK(ioctl_on(s->file, IOCTL_IV_QUERY_QP, &h, sizeof h, &q, sizeof q) == 0, "query qp");
    return q.attr.qp_state;
}

/* Polls `cq` until one completion arrives (or WAIT_MS passes). */
static int poll_one(Side *s, IvCqe *wc) {
    double end = now_ms() + WAIT_MS;
    for (;;) {
        int32_t n = t.poll_cq(t.context, s->kcq, wc, 1);
        if (n != 0) return n;
        if (now_ms() > end) return 0;
    }
}

static void destroy(HANDLE f, DWORD code, IvHandle h, const char *what) {
    IvHandleIn in = {h};
    CHECK(ioctl_on(f, code, &in, sizeof in, NULL, 0) == 0, "destroy %s", what);
}

static unsigned char buf_a[MSG], buf_b[MSG];

int main(void) {
    HANDLE probe = IrpverbsHostCreateKernelFile(0);
    CHECK(probe != INVALID_HANDLE_VALUE, "kernel file: %u", (unsigned)GetLastError());
    if (probe == INVALID_HANDLE_VALUE) return 1;

    /* Versions: a version 1 caller gets the version 1 table; version 2 needs
     * the whole table. */
    IvGuid type = IV_KERNEL_INTERFACE_GUID_INIT;
    IvKernelInterface v1;
    memset(&v1, 0xAB, sizeof v1);
    CHECK(IrpverbsHostQueryInterface(probe, &type, IV_KERNEL_INTERFACE_V1_SIZE, 1, &v1) ==
              STATUS_SUCCESS,
          "version 1 query");
    CHECK(v1.size == IV_KERNEL_INTERFACE_V1_SIZE && v1.version == 1 && v1.req_notify_cq != NULL,
          "version 1 table: size %u version %u", (unsigned)v1.size, (unsigned)v1.version);
    {
        /* Nothing past version 1's table was written. */
        const unsigned char *tail = (const unsigned char *)&v1 + IV_KERNEL_INTERFACE_V1_SIZE;
        int untouched = 1;
        for (size_t i = 0; i < sizeof v1 - IV_KERNEL_INTERFACE_V1_SIZE; i++)
            untouched &= tail[i] == 0xAB;
        CHECK(untouched, "version 1 query wrote past its table");
    }
    v1.interface_dereference(v1.context);
    CHECK(IrpverbsHostQueryInterface(probe, &type, IV_KERNEL_INTERFACE_V1_SIZE,
                                     IV_KERNEL_INTERFACE_VERSION, &t) == STATUS_INVALID_PARAMETER,
          "version 2 in a version 1 buffer");
    CHECK(IrpverbsHostQueryInterface(probe, &type, sizeof t, 3, &t) == STATUS_INVALID_PARAMETER,
          "version 3");
    CHECK(IrpverbsHostQueryInterface(probe, &type, sizeof t, IV_KERNEL_INTERFACE_VERSION, &t) ==
              STATUS_SUCCESS,
          "version 2 query");
    CHECK(t.size == sizeof t && t.version == 2 && t.register_cep_callback &&
              t.unregister_cep_callback && t.poll_cep_event,
          "version 2 table");
    CloseHandle(probe);

    Side server, client;
    memset(&server, 0, sizeof server);
    memset(&client, 0, sizeof client);
    side(&server);
    side(&client);
    IvHandle spd = pd_of(&server), cpd = pd_of(&client);
    queues(&server, spd);
    queues(&client, cpd);
    /* Kernel ULP memory: registered from the kernel files. */
    IvRegMrIn mrin;
    memset(&mrin, 0, sizeof mrin);
    mrin.pd = spd;
    mrin.addr = (uint64_t)(uintptr_t)buf_b;
    mrin.length = MSG;
    mrin.access = IV_ACCESS_LOCAL_WRITE;
    IvRegMrOut smr, cmr;
    memset(&smr, 0, sizeof smr);
    memset(&cmr, 0, sizeof cmr);
    CHECK(ioctl_on(server.file, IOCTL_IV_REG_MR, &mrin, sizeof mrin, &smr, sizeof smr) == 0,
          "server mr");
    mrin.pd = cpd;
    mrin.addr = (uint64_t)(uintptr_t)buf_a;
    CHECK(ioctl_on(client.file, IOCTL_IV_REG_MR, &mrin, sizeof mrin, &cmr, sizeof cmr) == 0,
          "client mr");
    IvQueryGidIn gin = {1, 0};
    IvQueryGidOut gid;
    memset(&gid, 0, sizeof gid);
    CHECK(ioctl_on(client.file, IOCTL_IV_QUERY_GID, &gin, sizeof gin, &gid, sizeof gid) == 0,
          "gid");
    if (failed) return 1;

    /* Bad calls change nothing. */
    IvHandle listener = new_cep(&server, 0x11);
    CHECK(t.register_cep_callback(t.context, server.fo, listener, NULL, NULL) ==
              STATUS_INVALID_PARAMETER,
          "NULL callback");
    CHECK(t.register_cep_callback(t.context, server.fo, listener + 1, on_cep, &listener_seen) ==
              STATUS_INVALID_HANDLE,
          "no such CEP");
    CHECK(t.register_cep_callback(t.context, client.fo, listener, on_cep, &listener_seen) ==
              STATUS_INVALID_HANDLE,
          "another file's CEP");
    CHECK(t.register_cep_callback(t.context, NULL, listener, on_cep, &listener_seen) ==
              STATUS_INVALID_HANDLE,
          "no file object");
    IvCepEventOut ev;
    CHECK(t.poll_cep_event(t.context, server.fo, listener, NULL) == STATUS_INVALID_PARAMETER,
          "NULL event");

    /* The server listens with a callback. */
    CHECK(t.register_cep_callback(t.context, server.fo, listener, on_cep, &listener_seen) ==
              STATUS_SUCCESS,
          "register listener");
    CHECK(t.poll_cep_event(t.context, server.fo, listener, &ev) == 0, "no event yet");
    IvListenIn lin = {listener, SERVICE};
    CHECK(ioctl_on(server.file, IOCTL_IV_LISTEN, &lin, sizeof lin, NULL, 0) == 0, "listen");
    /* A CEP with a callback takes no GET_CEP_EVENT. */
    IvHandleIn lh = {listener};
    CHECK(ioctl_on(server.file, IOCTL_IV_GET_CEP_EVENT, &lh, sizeof lh, &ev, sizeof ev) ==
              STATUS_INVALID_DEVICE_STATE,
          "GET_CEP_EVENT on a callback CEP");

    /* The client connects, its CEP with a callback too. */
    IvHandle cc = new_cep(&client, 0x22);
    CHECK(t.register_cep_callback(t.context, client.fo, cc, on_cep, &client_seen) ==
              STATUS_SUCCESS,
          "register client");
    IvCmConnectIn cin;
    memset(&cin, 0, sizeof cin);
    cin.cep = cc;
    cin.qp = client.qp.qp;
    cin.service_id = SERVICE;
    memcpy(cin.local_gid, gid.gid, 16);
    memcpy(cin.remote_gid, gid.gid, 16);
    cin.starting_psn = 0x10;
    cin.cm_response_timeout = 16;
    cin.max_cm_retries = 5;
    cin.local_ack_timeout = 14;
    cin.path_mtu = IV_MTU_1024;
    cin.responder_resources = 4;
    cin.initiator_depth = 4;
    cin.retry_count = 7;
    cin.rnr_retry_count = 7;
    cin.min_rnr_timer = 12;
    cin.flags = IV_CM_FLOW_CONTROL;
    OVERLAPPED cov;
    start(client.file, IOCTL_IV_CM_CONNECT, &cin, sizeof cin, &cov);

    /* REQ: the listener's callback, then its CONNECT_REQUEST. */
    CHECK(wait_call(&listener_seen, 0), "the listener's callback never ran");
    CHECK(atomic_load(&listener_seen.last_cep) == listener &&
              atomic_load(&listener_seen.last_context) == 0x11,
          "listener callback's CEP");
    memset(&ev, 0, sizeof ev);
    CHECK(t.poll_cep_event(t.context, server.fo, listener, &ev) == 1, "reap the REQ");
    CHECK(ev.event_type == IV_CEP_EVENT_CONNECT_REQUEST && ev.service_id == SERVICE &&
              ev.cep != 0 && ev.cep != listener && ev.remote_qpn == client.qp.qpn,
          "CONNECT_REQUEST: type %u", (unsigned)ev.event_type);
    IvHandle conn = ev.cep;
    CHECK(t.poll_cep_event(t.context, server.fo, listener, &ev) == 0, "the listener drained");
    /* The new connection's CEP inherited the listener's callback; give it
     * its own (from outside any callback). */
    CHECK(t.register_cep_callback(t.context, server.fo, conn, on_cep, &conn_seen) ==
              STATUS_SUCCESS,
          "register the connection's CEP");

    IvCmAcceptIn ain;
    memset(&ain, 0, sizeof ain);
    ain.cep = conn;
    ain.qp = server.qp.qp;
    ain.starting_psn = 0x20;
    ain.responder_resources = 4;
    ain.initiator_depth = 4;
    ain.rnr_retry_count = 7;
    ain.min_rnr_timer = 12;
    ain.flags = IV_CM_FLOW_CONTROL;
    OVERLAPPED aov;
    start(server.file, IOCTL_IV_CM_ACCEPT, &ain, sizeof ain, &aov);

    /* REP: the client's callback and its REPLY; the connect completes after
     * the RTU, and the accept on it. */
    NTSTATUS cst = finish(client.file, &cov);
    CHECK(cst == STATUS_SUCCESS, "connect: %#x", (unsigned)cst);
    CHECK(wait_call(&client_seen, 0), "the client's callback never ran");
    memset(&ev, 0, sizeof ev);
    CHECK(t.poll_cep_event(t.context, client.fo, cc, &ev) == 1, "reap the REP");
    CHECK(ev.event_type == IV_CEP_EVENT_REPLY && ev.remote_qpn == server.qp.qpn && ev.cep == cc,
          "REPLY: type %u", (unsigned)ev.event_type);
    while (t.poll_cep_event(t.context, client.fo, cc, &ev) == 1) {
    }
    NTSTATUS ast = finish(server.file, &aov);
    CHECK(ast == STATUS_SUCCESS, "accept (the RTU): %#x", (unsigned)ast);
    while (t.poll_cep_event(t.context, server.fo, conn, &ev) == 1) {
    }
    CHECK(qp_state(&client) == IV_QPS_RTS && qp_state(&server) == IV_QPS_RTS, "both in RTS");
    CHECK(atomic_load(&listener_seen.wrong_irql) == 0 && atomic_load(&client_seen.wrong_irql) == 0 &&
              atomic_load(&conn_seen.wrong_irql) == 0,
          "a callback below DISPATCH_LEVEL");

    /* Data through the table's speed path. */
    for (int i = 0; i < MSG; i++) buf_a[i] = (unsigned char)(i * 7 + 3);
    IvSge rsg = {(uint64_t)(uintptr_t)buf_b, MSG, smr.lkey};
    IvKernelRecvWr rwr;
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = 0xB;
    rwr.sg_list = &rsg;
    rwr.num_sge = 1;
    CHECK(t.post_recv(t.context, server.kqp, &rwr) == STATUS_SUCCESS, "post recv");
    IvSge ssg = {(uint64_t)(uintptr_t)buf_a, MSG, cmr.lkey};
    IvKernelSendWr swr;
    memset(&swr, 0, sizeof swr);
    swr.wr_id = 0xA;
    swr.opcode = IV_WR_SEND;
    swr.flags = IV_SEND_SIGNALED;
    swr.num_sge = 1;
    swr.sg_list = &ssg;
    CHECK(t.post_send(t.context, client.kqp, &swr) == STATUS_SUCCESS, "post send");
    IvCqe wc;
    memset(&wc, 0, sizeof wc);
    CHECK(poll_one(&client, &wc) == 1 && wc.wr_id == 0xA && wc.status == IV_WC_SUCCESS,
          "send completion: status %u", (unsigned)wc.status);
    memset(&wc, 0, sizeof wc);
    CHECK(poll_one(&server, &wc) == 1 && wc.wr_id == 0xB && wc.status == IV_WC_SUCCESS &&
              wc.byte_len == MSG,
          "receive completion: status %u", (unsigned)wc.status);
    CHECK(memcmp(buf_a, buf_b, MSG) == 0, "the data");

    /* The rundown: after unregister returns, the callback is never called
     * again; the CEP's events go back to GET_CEP_EVENT. */
    CHECK(t.unregister_cep_callback(t.context, server.fo, conn) == STATUS_SUCCESS,
          "unregister the connection's CEP");
    CHECK(t.unregister_cep_callback(t.context, client.fo, cc) == STATUS_SUCCESS,
          "unregister the client's CEP");
    int conn_calls = atomic_load(&conn_seen.calls), client_calls = atomic_load(&client_seen.calls);
    IvCmDisconnectIn din;
    memset(&din, 0, sizeof din);
    din.cep = cc;
    OVERLAPPED dov;
    start(client.file, IOCTL_IV_CM_DISCONNECT, &din, sizeof din, &dov);
    IvHandleIn ch = {conn};
    memset(&ev, 0, sizeof ev);
    CHECK(ioctl_on(server.file, IOCTL_IV_GET_CEP_EVENT, &ch, sizeof ch, &ev, sizeof ev) == 0 &&
              ev.event_type == IV_CEP_EVENT_DISCONNECT_REQUEST,
          "the DREQ through GET_CEP_EVENT: type %u", (unsigned)ev.event_type);
    din.cep = conn;
    CHECK(ioctl_on(server.file, IOCTL_IV_CM_DISCONNECT, &din, sizeof din, NULL, 0) == 0,
          "answer the DREQ");
    CHECK(finish(client.file, &dov) == STATUS_SUCCESS, "disconnect");
    CHECK(atomic_load(&conn_seen.calls) == conn_calls &&
              atomic_load(&client_seen.calls) == client_calls,
          "a callback ran after its unregister returned");
    CHECK(t.unregister_cep_callback(t.context, server.fo, listener) == STATUS_SUCCESS,
          "unregister the listener");

    /* Close in the table, destroy, release the interface. */
    t.close_qp(t.context, server.kqp);
    t.close_qp(t.context, client.kqp);
    t.close_cq(t.context, server.kcq);
    t.close_cq(t.context, client.kcq);
    destroy(server.file, IOCTL_IV_DESTROY_CEP, conn, "conn cep");
    destroy(server.file, IOCTL_IV_DESTROY_CEP, listener, "listener");
    destroy(client.file, IOCTL_IV_DESTROY_CEP, cc, "client cep");
    destroy(server.file, IOCTL_IV_DESTROY_QP, server.qp.qp, "server qp");
    destroy(client.file, IOCTL_IV_DESTROY_QP, client.qp.qp, "client qp");
    destroy(server.file, IOCTL_IV_DESTROY_CQ, server.cq.cq, "server cq");
    destroy(client.file, IOCTL_IV_DESTROY_CQ, client.cq.cq, "client cq");
    destroy(server.file, IOCTL_IV_DEREG_MR, smr.mr, "server mr");
    destroy(client.file, IOCTL_IV_DEREG_MR, cmr.mr, "client mr");
    destroy(server.file, IOCTL_IV_DEALLOC_PD, spd, "server pd");
    destroy(client.file, IOCTL_IV_DEALLOC_PD, cpd, "client pd");
    t.interface_dereference(t.context);
    CHECK(CloseHandle(server.file) && CloseHandle(client.file), "close");
    CHECK(IrpverbsHostQuiesce(10000), "driver still holds objects after close");

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
