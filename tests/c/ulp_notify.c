/*
 * The notification styles of a Windows ULP, written as on Windows: events
 * (CreateEventA, SetEvent, ResetEvent, WaitForSingleObject) and per-request
 * completion port suppression. A file bound to a completion port queues the
 * completion of every overlapped request to the port, except a request whose
 * OVERLAPPED.hEvent has its low bit set: that one is only signalled through
 * its event (the low bit masked off) and GetOverlappedResult.
 *
 * The requests that stay pended are CQ notifications and channel waits,
 * completed by destroying their CQ or channel or by CancelIoEx; the commands
 * (ALLOC_PD, CREATE_CQ) complete on their own.
 *
 * On non-Windows hosts it links against libirpverbs_host_c; exit code 0 means
 * every check held.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "irpverbs.h"
#include "irpverbs_host.h"

#include "check.h"

#define PORT_KEY ((ULONG_PTR)0x5E)

static HANDLE dev, port;

/* The event with its low bit set: the request it names skips the port. */
static HANDLE no_port(HANDLE ev) { return (HANDLE)((uintptr_t)ev | 1); }

/* Takes every packet the port has within `ms` of quiet; returns how many,
 * storing up to `max` OVERLAPPED addresses and the last call's error. */
static int drain(LPOVERLAPPED *seen, int max, DWORD *last_err) {
    int n = 0;
    for (;;) {
        DWORD bytes = 0;
        ULONG_PTR key = 0;
        LPOVERLAPPED ov = NULL;
        BOOL ok = GetQueuedCompletionStatus(port, &bytes, &key, &ov, 200);
        if (ov == NULL) {
            CHECK(!ok && GetLastError() == WAIT_TIMEOUT, "empty port: ok=%d err=%u", (int)ok,
                  (unsigned)GetLastError());
            return n;
        }
        CHECK(key == PORT_KEY, "packet key %lu", (unsigned long)key);
        if (last_err) *last_err = ok ? ERROR_SUCCESS : GetLastError();
        if (n < max) seen[n] = ov;
        n++;
    }
}

/* One overlapped IOCTL kept off the port: issued with a low-bit event and
 * reaped through that event and GetOverlappedResult. Returns the NTSTATUS. */
static NTSTATUS call(HANDLE ev, DWORD code, const void *in, DWORD in_len, void *out,
                     DWORD out_len) {
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    ov.hEvent = no_port(ev);
    BOOL ok = DeviceIoControl(dev, code, (LPVOID)in, in_len, out, out_len, NULL, &ov);
    CHECK(ok || GetLastError() == ERROR_IO_PENDING || HasOverlappedIoCompleted(&ov),
          "ioctl %#x: error %u", (unsigned)code, (unsigned)GetLastError());
    CHECK(WaitForSingleObject(ev, 5000) == WAIT_OBJECT_0, "ioctl %#x: event not set",
          (unsigned)code);
    DWORD n = 0;
    GetOverlappedResult(dev, &ov, &n, TRUE);
    return (NTSTATUS)(DWORD)ov.Internal;
}

static void events(void) {
    HANDLE manual = CreateEventA(NULL, TRUE, FALSE, NULL);
    HANDLE autoev = CreateEventA(NULL, FALSE, TRUE, NULL);
    CHECK(manual != NULL && autoev != NULL, "CreateEventA: %u", (unsigned)GetLastError());
    CHECK(WaitForSingleObject(manual, 0) == WAIT_TIMEOUT, "manual starts signalled");
    CHECK(WaitForSingleObject(autoev, 0) == WAIT_OBJECT_0, "initially set auto event not set");
    CHECK(WaitForSingleObject(autoev, 20) == WAIT_TIMEOUT, "auto event not reset by its wait");
    CHECK(SetEvent(manual), "SetEvent");
    CHECK(WaitForSingleObject(manual, 0) == WAIT_OBJECT_0 &&
              WaitForSingleObject(manual, INFINITE) == WAIT_OBJECT_0,
          "manual event did not stay set");
    CHECK(ResetEvent(manual) && WaitForSingleObject(manual, 0) == WAIT_TIMEOUT, "ResetEvent");
    CHECK(SetEvent(autoev) && WaitForSingleObject(autoev, INFINITE) == WAIT_OBJECT_0 &&
              WaitForSingleObject(autoev, 0) == WAIT_TIMEOUT,
          "one SetEvent, one auto wait");
    CHECK(CloseHandle(manual) && CloseHandle(autoev), "close events");
    SetLastError(0);
    CHECK(WaitForSingleObject(manual, 0) == WAIT_FAILED && GetLastError() == ERROR_INVALID_HANDLE,
          "wait on a closed event: err %u", (unsigned)GetLastError());
    CHECK(!SetEvent(manual) && GetLastError() == ERROR_INVALID_HANDLE, "SetEvent after close");
}

int main(void) {
    events();

    dev = CreateFileA("\\\\.\\irpverbs0", GENERIC_READ | GENERIC_WRITE, 0, NULL, OPEN_EXISTING,
                      FILE_FLAG_OVERLAPPED, NULL);
    CHECK(dev != INVALID_HANDLE_VALUE, "CreateFileA: error %u", (unsigned)GetLastError());
    if (dev == INVALID_HANDLE_VALUE) return 1;
    port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 1);
    CHECK(port != NULL && CreateIoCompletionPort(dev, port, PORT_KEY, 1) == port,
          "completion port: %u", (unsigned)GetLastError());
    HANDLE ev = CreateEventA(NULL, FALSE, FALSE, NULL);
    HANDLE ev2 = CreateEventA(NULL, TRUE, FALSE, NULL);
    CHECK(ev != NULL && ev2 != NULL, "events: %u", (unsigned)GetLastError());
    LPOVERLAPPED seen[8];
    DWORD err = 0;

    /* Two commands: one reaches the port, the low-bit one does not; both
     * set their events and report through GetOverlappedResult. */
    IvAllocPdIn pdin;
    memset(&pdin, 0, sizeof pdin);
    IvAllocPdOut pd1, pd2;
    OVERLAPPED o1, o2;
    memset(&o1, 0, sizeof o1);
    memset(&o2, 0, sizeof o2);
    o1.hEvent = ev;
    o2.hEvent = no_port(ev2);
    BOOL ok = DeviceIoControl(dev, IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd1, sizeof pd1, NULL,
                              &o1);
    CHECK(ok || GetLastError() == ERROR_IO_PENDING, "alloc pd 1: %u", (unsigned)GetLastError());
    ok = DeviceIoControl(dev, IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd2, sizeof pd2, NULL, &o2);
    CHECK(ok || GetLastError() == ERROR_IO_PENDING, "alloc pd 2: %u", (unsigned)GetLastError());
    CHECK(WaitForSingleObject(ev, 5000) == WAIT_OBJECT_0, "event of the port request");
    CHECK(WaitForSingleObject(ev2, 5000) == WAIT_OBJECT_0, "event of the suppressed request");
    DWORD n1 = 0, n2 = 0;
    CHECK(GetOverlappedResult(dev, &o1, &n1, TRUE) && n1 == sizeof pd1, "result 1: %u bytes",
          (unsigned)n1);
    CHECK(GetOverlappedResult(dev, &o2, &n2, TRUE) && n2 == sizeof pd2, "result 2: %u bytes",
          (unsigned)n2);
    CHECK(pd1.pd != 0 && pd2.pd != 0 && pd1.pd != pd2.pd, "two PDs");
    int got = drain(seen, 8, &err);
    CHECK(got == 1 && seen[0] == &o1, "port got %d packets (want only the plain request's)", got);

    /* CQs to wait on, created through calls that never touch the port. */
    IvCreateCqIn cqin;
    memset(&cqin, 0, sizeof cqin);
    cqin.cqe = 8;
    IvCreateCqOut cq1, cq2, cq3;
    CHECK(call(ev, IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq1, sizeof cq1) == 0, "cq 1");
    CHECK(call(ev, IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq2, sizeof cq2) == 0, "cq 2");
    CHECK(call(ev, IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq3, sizeof cq3) == 0, "cq 3");
    CHECK(drain(seen, 8, NULL) == 0, "low-bit commands reached the port");

    /* Pended notifications: issuing one resets its event (set beforehand). */
    IvCqNotifyIn arm1 = {cq1.cq, IV_NOTIFY_NEXT, 0};
    IvCqNotifyIn arm2 = {cq2.cq, IV_NOTIFY_NEXT, 0};
    IvCqEventOut e1, e2;
    OVERLAPPED w1, w2;
    memset(&w1, 0, sizeof w1);
    memset(&w2, 0, sizeof w2);
    HANDLE wev1 = CreateEventA(NULL, TRUE, TRUE, NULL);
    HANDLE wev2 = CreateEventA(NULL, TRUE, TRUE, NULL);
    w1.hEvent = no_port(wev1);
    w2.hEvent = wev2;
    ok = DeviceIoControl(dev, IOCTL_IV_CQ_NOTIFY, &arm1, sizeof arm1, &e1, sizeof e1, NULL, &w1);
    CHECK(!ok && GetLastError() == ERROR_IO_PENDING, "notify 1 did not pend: %u",
          (unsigned)GetLastError());
    ok = DeviceIoControl(dev, IOCTL_IV_CQ_NOTIFY, &arm2, sizeof arm2, &e2, sizeof e2, NULL, &w2);
    CHECK(!ok && GetLastError() == ERROR_IO_PENDING, "notify 2 did not pend: %u",
          (unsigned)GetLastError());
    CHECK(WaitForSingleObject(wev1, 50) == WAIT_TIMEOUT, "issuing did not reset event 1");
    CHECK(WaitForSingleObject(wev2, 0) == WAIT_TIMEOUT, "issuing did not reset event 2");
    DWORD n = 0;
    CHECK(!GetOverlappedResult(dev, &w1, &n, FALSE) && GetLastError() == ERROR_IO_INCOMPLETE,
          "pended result: %u", (unsigned)GetLastError());
    CHECK(!HasOverlappedIoCompleted(&w1) && !HasOverlappedIoCompleted(&w2), "completed early");
    CHECK(drain(seen, 8, NULL) == 0, "a pended request reached the port");

    /* Destroying the CQs ends both waits with STATUS_DELETE_PENDING: both
     * events are set, only the plain one's packet reaches the port. */
    IvHandleIn h1 = {cq1.cq}, h2 = {cq2.cq};
    CHECK(call(ev, IOCTL_IV_DESTROY_CQ, &h1, sizeof h1, NULL, 0) == 0, "destroy cq 1");
    CHECK(call(ev, IOCTL_IV_DESTROY_CQ, &h2, sizeof h2, NULL, 0) == 0, "destroy cq 2");
    CHECK(WaitForSingleObject(wev1, 5000) == WAIT_OBJECT_0, "suppressed wait's event not set");
    CHECK(WaitForSingleObject(wev2, 5000) == WAIT_OBJECT_0, "plain wait's event not set");
    CHECK(!GetOverlappedResult(dev, &w1, &n, TRUE) && GetLastError() == ERROR_ACCESS_DENIED,
          "wait 1 result: %u", (unsigned)GetLastError());
    CHECK((NTSTATUS)(DWORD)w1.Internal == STATUS_DELETE_PENDING, "wait 1 status %#x",
          (unsigned)w1.Internal);
    CHECK((NTSTATUS)(DWORD)w2.Internal == STATUS_DELETE_PENDING, "wait 2 status %#x",
          (unsigned)w2.Internal);
    got = drain(seen, 8, &err);
    CHECK(got == 1 && seen[0] == &w2 && err == ERROR_ACCESS_DENIED,
          "port got %d packets, err %u (want the plain wait's only)", got, (unsigned)err);

    /* Cancelled: the suppressed request's event is set, nothing queued. */
    IvCqNotifyIn arm3 = {cq3.cq, IV_NOTIFY_NEXT, 0};
    OVERLAPPED w3;
    memset(&w3, 0, sizeof w3);
    w3.hEvent = no_port(wev1);
    ok = DeviceIoControl(dev, IOCTL_IV_CQ_NOTIFY, &arm3, sizeof arm3, &e1, sizeof e1, NULL, &w3);
    CHECK(!ok && GetLastError() == ERROR_IO_PENDING, "notify 3 did not pend");
    CHECK(WaitForSingleObject(wev1, 0) == WAIT_TIMEOUT, "event 1 not reset");
    CHECK(CancelIoEx(dev, &w3), "cancel: %u", (unsigned)GetLastError());
    CHECK(WaitForSingleObject(wev1, 5000) == WAIT_OBJECT_0, "cancelled wait's event not set");
    CHECK(!GetOverlappedResult(dev, &w3, &n, TRUE) && GetLastError() == ERROR_OPERATION_ABORTED,
          "cancelled result: %u", (unsigned)GetLastError());
    CHECK(drain(seen, 8, NULL) == 0, "the cancelled suppressed request reached the port");

    /* A completion channel's wait, suppressed, ended by destroying it. */
    IvCreateChannelOut ch;
    CHECK(call(ev, IOCTL_IV_CREATE_CHANNEL, &pdin, sizeof pdin, &ch, sizeof ch) == 0, "channel");
    IvHandleIn chh = {ch.channel};
    OVERLAPPED w4;
    memset(&w4, 0, sizeof w4);
    w4.hEvent = no_port(wev2);
    ok = DeviceIoControl(dev, IOCTL_IV_GET_CQ_EVENT, &chh, sizeof chh, &e1, sizeof e1, NULL, &w4);
    CHECK(!ok && GetLastError() == ERROR_IO_PENDING, "channel wait did not pend");
    CHECK(WaitForSingleObject(wev2, 20) == WAIT_TIMEOUT, "event 2 not reset");
    CHECK(call(ev, IOCTL_IV_DESTROY_CHANNEL, &chh, sizeof chh, NULL, 0) == 0, "destroy channel");
    CHECK(WaitForSingleObject(wev2, 5000) == WAIT_OBJECT_0, "channel wait's event not set");
    CHECK((NTSTATUS)(DWORD)w4.Internal == STATUS_DELETE_PENDING, "channel wait %#x",
          (unsigned)w4.Internal);
    CHECK(drain(seen, 8, NULL) == 0, "the suppressed channel wait reached the port");

#ifndef _WIN32
    /* An hEvent that is not an event fails the call (host handle values). */
    OVERLAPPED bad;
    memset(&bad, 0, sizeof bad);
    bad.hEvent = (HANDLE)(uintptr_t)0x7770;
    CHECK(!DeviceIoControl(dev, IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd1, sizeof pd1, NULL,
                           &bad) &&
              GetLastError() == ERROR_INVALID_HANDLE,
          "a bad hEvent was accepted");
#endif

    CHECK(CloseHandle(wev1) && CloseHandle(wev2) && CloseHandle(ev) && CloseHandle(ev2),
          "close events");
    CHECK(CloseHandle(dev) && CloseHandle(port), "close device and port");
#ifndef _WIN32
    CHECK(IrpverbsHostQuiesce(10000), "driver still holds objects after close");
#endif
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
