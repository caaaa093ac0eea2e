/*
 * A user-mode ULP written as it would be on Windows: it opens the device for
 * overlapped I/O, associates it with an I/O completion port, and drives the
 * control verbs as overlapped DeviceIoControl calls reaped from the port.
 * It creates a PD, CQ and QP, walks the QP RESET -> INIT -> RTR -> RTS, hits
 * the busy cases, and closes the handle with its objects still alive.
 *
 * On non-Windows hosts it links against libirpverbs_host_c (the Win32 subset
 * over the driver running in-process); exit code 0 means every check held.
 */
#include <stdio.h>
#include <string.h>

#include "irpverbs.h"
#include "irpverbs_host.h"

#include "check.h"

#define PORT_KEY ((ULONG_PTR)0x1B)

static HANDLE dev, port;
static int pended_count;

/* Issues one overlapped IOCTL and reaps its completion from the port.
 * Returns the NTSTATUS from OVERLAPPED.Internal. */
static NTSTATUS ioctl(DWORD code, const void *in, DWORD in_len, void *out, DWORD out_len,
                      DWORD *bytes_out) {
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    DWORD bytes = 0;
    BOOL ok = DeviceIoControl(dev, code, (LPVOID)in, in_len, out, out_len, &bytes, &ov);
    if (!ok) {
        DWORD err = GetLastError();
        if (err == ERROR_IO_PENDING) {
            pended_count++;
        }
    }
    /* Pended or not, the completion is queued to the port. */
    DWORD got = 0;
    ULONG_PTR key = 0;
    LPOVERLAPPED pov = NULL;
    BOOL q = GetQueuedCompletionStatus(port, &got, &key, &pov, 5000);
    CHECK(pov == &ov, "completion packet names another OVERLAPPED (%p, want %p)", (void *)pov,
          (void *)&ov);
    CHECK(key == PORT_KEY, "completion key %lu", (unsigned long)key);
    CHECK(HasOverlappedIoCompleted(&ov), "OVERLAPPED still pending after its packet");
    NTSTATUS status = (NTSTATUS)(DWORD)ov.Internal;
    CHECK((q != FALSE) == (status >= 0), "GetQueuedCompletionStatus result vs status %#x",
          (unsigned)status);
    CHECK(got == (DWORD)ov.InternalHigh, "bytes %u vs InternalHigh %u", (unsigned)got,
          (unsigned)ov.InternalHigh);
    DWORD ovbytes = 0;
    BOOL r = GetOverlappedResult(dev, &ov, &ovbytes, FALSE);
    CHECK((r != FALSE) == (status >= 0) && ovbytes == got, "GetOverlappedResult disagrees");
    if (bytes_out) *bytes_out = got;
    return status;
}

int main(void) {
    dev = CreateFileA("\\\\.\\irpverbs0", GENERIC_READ | GENERIC_WRITE, 0, NULL, OPEN_EXISTING,
                      FILE_FLAG_OVERLAPPED, NULL);
    CHECK(dev != INVALID_HANDLE_VALUE, "CreateFileA: error %u", (unsigned)GetLastError());
    if (dev == INVALID_HANDLE_VALUE) return 1;
    port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 1);
    CHECK(port != NULL, "CreateIoCompletionPort(new): %u", (unsigned)GetLastError());
    CHECK(CreateIoCompletionPort(dev, port, PORT_KEY, 1) == port, "associate: %u", (unsigned)GetLastError());

    HANDLE nf = CreateFileA("\\\\.\\nosuchdev", GENERIC_READ, 0, NULL, OPEN_EXISTING, 0, NULL);
    CHECK(nf == INVALID_HANDLE_VALUE && GetLastError() == ERROR_FILE_NOT_FOUND, "bad name opened");

    /* Version and device: answered without a command. */
    IvGetVersionOut ver;
    DWORD n = 0;
    CHECK(ioctl(IOCTL_IV_GET_VERSION, NULL, 0, &ver, sizeof ver, &n) == 0, "get version");
    CHECK(n == sizeof ver && ver.abi_version == IV_ABI_VERSION, "abi version %#x", ver.abi_version);
    IvQueryDeviceOut devattr;
    CHECK(ioctl(IOCTL_IV_QUERY_DEVICE, NULL, 0, &devattr, sizeof devattr, &n) == 0, "query device");
    CHECK(devattr.phys_port_cnt == 1 && devattr.max_qp > 0, "device attributes");
    int pended_before = pended_count;

    /* PD, CQ, QP: each a command to the HCA, so each pends. */
    IvAllocPdIn pdin;
    memset(&pdin, 0, sizeof pdin);
    IvAllocPdOut pd;
    CHECK(ioctl(IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd, sizeof pd, NULL) == 0, "alloc pd");
    CHECK(pended_count == pended_before + 1, "ALLOC_PD did not pend");

    IvCreateCqIn cqin;
    memset(&cqin, 0, sizeof cqin);
    cqin.cqe = 64;
    IvCreateCqOut cq;
    CHECK(ioctl(IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq, sizeof cq, NULL) == 0, "create cq");
    CHECK(cq.cqe >= 64, "cqe %u", cq.cqe);

    IvCreateQpIn qpin;
    memset(&qpin, 0, sizeof qpin);
    qpin.pd = pd.pd;
    qpin.send_cq = cq.cq;
    qpin.recv_cq = cq.cq;
    qpin.qp_type = IV_QPT_RC;
    qpin.cap.max_send_wr = 32;
    qpin.cap.max_recv_wr = 32;
    qpin.cap.max_send_sge = 1;
    qpin.cap.max_recv_sge = 1;
    IvCreateQpOut qp;
    CHECK(ioctl(IOCTL_IV_CREATE_QP, &qpin, sizeof qpin, &qp, sizeof qp, NULL) == 0, "create qp");

    IvQueryGidIn gin = {1, 0};
    IvQueryGidOut gid;
    CHECK(ioctl(IOCTL_IV_QUERY_GID, &gin, sizeof gin, &gid, sizeof gid, NULL) == 0, "query gid");

    /* RESET -> INIT -> RTR -> RTS, looped back to itself. */
    IvModifyQpIn m;
    memset(&m, 0, sizeof m);
    m.qp = qp.qp;
    m.attr_mask = IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS;
    m.attr.qp_state = IV_QPS_INIT;
    m.attr.port_num = 1;
    m.attr.qp_access_flags = IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;
    CHECK(ioctl(IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0, NULL) == 0, "to INIT");

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
    m.attr.max_dest_rd_atomic = 4;
    m.attr.min_rnr_timer = 12;
    CHECK(ioctl(IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0, NULL) == 0, "to RTR");

    /* A transition the state machine does not have: RTR -> SQD. */
    IvModifyQpIn bad = m;
    bad.attr_mask = IV_QP_STATE;
    bad.attr.qp_state = IV_QPS_SQD;
    NTSTATUS st = ioctl(IOCTL_IV_MODIFY_QP, &bad, sizeof bad, NULL, 0, NULL);
    CHECK(st == STATUS_INVALID_DEVICE_STATE, "RTR->SQD gave %#x", (unsigned)st);

    memset(&m.attr, 0, sizeof m.attr);
    m.attr_mask = IV_QP_STATE | IV_QP_TIMEOUT | IV_QP_RETRY_CNT | IV_QP_RNR_RETRY | IV_QP_SQ_PSN |
                  IV_QP_MAX_QP_RD_ATOMIC;
    m.attr.qp_state = IV_QPS_RTS;
    m.attr.timeout = 14;
    m.attr.retry_cnt = 7;
    m.attr.rnr_retry = 7;
    m.attr.sq_psn = 200;
    m.attr.max_rd_atomic = 4;
    CHECK(ioctl(IOCTL_IV_MODIFY_QP, &m, sizeof m, NULL, 0, NULL) == 0, "to RTS");

    IvHandleIn qh = {qp.qp};
    IvQueryQpOut qq;
    CHECK(ioctl(IOCTL_IV_QUERY_QP, &qh, sizeof qh, &qq, sizeof qq, NULL) == 0, "query qp");
    CHECK(qq.attr.qp_state == IV_QPS_RTS, "state %u", qq.attr.qp_state);
    CHECK(qq.attr.dest_qp_num == qp.qpn && qq.attr.sq_psn == 200, "attributes not kept");

    /* Busy: the PD and the CQ have a QP on them. Nothing changes. */
    IvHandleIn pdh = {pd.pd};
    st = ioctl(IOCTL_IV_DEALLOC_PD, &pdh, sizeof pdh, NULL, 0, NULL);
    CHECK(st == STATUS_DEVICE_BUSY, "dealloc pd with qp: %#x", (unsigned)st);
    IvHandleIn cqh = {cq.cq};
    st = ioctl(IOCTL_IV_DESTROY_CQ, &cqh, sizeof cqh, NULL, 0, NULL);
    CHECK(st == STATUS_DEVICE_BUSY, "destroy cq with qp: %#x", (unsigned)st);
    CHECK(ioctl(IOCTL_IV_QUERY_QP, &qh, sizeof qh, &qq, sizeof qq, NULL) == 0 &&
              qq.attr.qp_state == IV_QPS_RTS,
          "busy destroys changed the QP");

    /* Errors map to Win32 errors too. */
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    IvHandleIn stale = {0x1234};
    BOOL ok = DeviceIoControl(dev, IOCTL_IV_DESTROY_QP, &stale, sizeof stale, NULL, 0, NULL, &ov);
    DWORD e = GetLastError();
    if (!ok && e == ERROR_IO_PENDING) {
        DWORD b;
        ok = GetOverlappedResult(dev, &ov, &b, TRUE);
        e = GetLastError();
    }
    CHECK(!ok && e == ERROR_INVALID_HANDLE, "stale handle: ok=%d err=%u", (int)ok, (unsigned)e);
    DWORD b2;
    ULONG_PTR k2;
    LPOVERLAPPED p2;
    GetQueuedCompletionStatus(port, &b2, &k2, &p2, 5000); /* reap its packet */
    CHECK(p2 == &ov, "stale-handle packet");

    CHECK(!DeviceIoControl((HANDLE)(intptr_t)0x7777, IOCTL_IV_GET_VERSION, NULL, 0, NULL, 0, NULL,
                           &ov) &&
              GetLastError() == ERROR_INVALID_HANDLE,
          "bad handle accepted");
    CHECK(!CancelIoEx(dev, NULL) && GetLastError() == ERROR_NOT_FOUND, "nothing to cancel");

    /* A port with nothing queued times out. */
    LPOVERLAPPED none = (LPOVERLAPPED)1;
    CHECK(!GetQueuedCompletionStatus(port, &b2, &k2, &none, 10) && GetLastError() == WAIT_TIMEOUT &&
              none == NULL,
          "empty port did not time out");

    /* A second open without FILE_FLAG_OVERLAPPED: synchronous calls. */
    HANDLE sync = CreateFileA("\\\\.\\irpverbs0", GENERIC_READ, 0, NULL, OPEN_EXISTING, 0, NULL);
    CHECK(sync != INVALID_HANDLE_VALUE, "sync open");
    IvQueryPortIn pin = {1, 0};
    IvQueryPortOut pout;
    DWORD got = 0;
    CHECK(DeviceIoControl(sync, IOCTL_IV_QUERY_PORT, &pin, sizeof pin, &pout, sizeof pout, &got,
                          NULL) &&
              got == sizeof pout && pout.state == IV_PORT_ACTIVE,
          "sync query port");
    /* Read-only access cannot create objects. */
    IvAllocPdOut pd2;
    CHECK(!DeviceIoControl(sync, IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd2, sizeof pd2, &got,
                           NULL) &&
              GetLastError() == ERROR_ACCESS_DENIED,
          "read-only handle allocated a PD");
    CHECK(CloseHandle(sync), "close sync");

    /* Close with the PD, CQ and QP alive: the driver runs them down. */
    CHECK(CloseHandle(dev), "close device");
    CHECK(CloseHandle(port), "close port");
    CHECK(!CloseHandle(dev) && GetLastError() == ERROR_INVALID_HANDLE, "double close");
#ifndef _WIN32
    /* Host only: prove the driver ran everything down and leaked nothing. */
    CHECK(IrpverbsHostQuiesce(10000), "driver still holds objects after close");
#endif

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
