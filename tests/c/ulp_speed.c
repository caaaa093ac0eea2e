/*
 * The user-mode speed-path library (irpverbs_user.h) without data movement,
 * written as a Windows ULP: the control path is overlapped DeviceIoControl
 * reaped from a completion port; the speed path is IvUser* calls. It checks
 * what each call does to the rings the driver mapped into the process (the
 * WQE bytes, the producer index, the arm word), plays the HCA to check
 * IvUserPollCq (it writes CQEs into a CQ no QP uses), and checks the
 * library's refusals.
 *
 * On non-Windows hosts it links against libirpverbs_host_c; exit code 0 means
 * every check held.
 */
#include <stdio.h>
#include <string.h>

#include "irpverbs.h"
#include "irpverbs_host.h"
#include "irpverbs_user.h"

#include "check.h"

/* <winnt.h> defines some STATUS_ codes as DWORD: compare as NtStatus. */
#define ST(s) ((NtStatus)(s))

#define PORT_KEY ((ULONG_PTR)0x5EED)

static HANDLE dev, port;

/* One overlapped IOCTL, reaped from the port: the NTSTATUS. */
static NTSTATUS ioctl(DWORD code, const void *in, DWORD in_len, void *out, DWORD out_len) {
    OVERLAPPED ov;
    memset(&ov, 0, sizeof ov);
    DWORD bytes = 0;
    DeviceIoControl(dev, code, (LPVOID)in, in_len, out, out_len, &bytes, &ov);
    DWORD got = 0;
    ULONG_PTR key = 0;
    LPOVERLAPPED pov = NULL;
    GetQueuedCompletionStatus(port, &got, &key, &pov, 5000);
    CHECK(pov == &ov && key == PORT_KEY, "completion packet for another request");
    return (NTSTATUS)(DWORD)ov.Internal;
}

/* The rings of `handle`, mapped into the process: a user-mode create
 * response carries only their geometry. */
static IvMapRingsOut map_rings(IvHandle handle) {
    IvHandleIn in = {handle};
    IvMapRingsOut m;
    memset(&m, 0, sizeof m);
    CHECK(ioctl(IOCTL_IV_MAP_RINGS, &in, sizeof in, &m, sizeof m) == 0, "map rings");
    return m;
}

/* The ring's control block and slot `index`, as mapped into the process. */
static volatile IvRingControl *control(const IvRingMap *m) {
    return (volatile IvRingControl *)(uintptr_t)m->control_addr;
}
static unsigned char *slot(const IvRingMap *m, uint32_t index) {
    return (unsigned char *)(uintptr_t)m->entries_addr + (size_t)(index & (m->entries - 1)) * m->stride;
}

int main(void) {
    dev = CreateFileA("\\\\.\\irpverbs0", GENERIC_READ | GENERIC_WRITE, 0, NULL, OPEN_EXISTING,
                      FILE_FLAG_OVERLAPPED, NULL);
    CHECK(dev != INVALID_HANDLE_VALUE, "CreateFileA: %u", (unsigned)GetLastError());
    if (dev == INVALID_HANDLE_VALUE) return 1;
    port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 1);
    CHECK(CreateIoCompletionPort(dev, port, PORT_KEY, 1) == port, "associate");

    /* The file's doorbell page: one page, the same every time. Mapped
     * before the rings, it gives each queue a slot (below). */
    IvMapDoorbellsOut db, db_again;
    memset(&db, 0, sizeof db);
    memset(&db_again, 0, sizeof db_again);
    CHECK(ioctl(IOCTL_IV_MAP_DOORBELLS, NULL, 0, &db, sizeof db) == 0, "map doorbells");
    CHECK(db.page_addr != 0 && db.page_addr % IV_DOORBELL_PAGE_SIZE == 0 &&
              db.page_len == IV_DOORBELL_PAGE_SIZE && db.slots == IV_DOORBELL_SLOTS,
          "doorbell page");
    CHECK(ioctl(IOCTL_IV_MAP_DOORBELLS, NULL, 0, &db_again, sizeof db_again) == 0 &&
              memcmp(&db, &db_again, sizeof db) == 0,
          "the same page");

    IvAllocPdIn pdin;
    memset(&pdin, 0, sizeof pdin);
    IvAllocPdOut pd;
    CHECK(ioctl(IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd, sizeof pd) == 0, "alloc pd");
    IvCreateCqIn cqin;
    memset(&cqin, 0, sizeof cqin);
    cqin.cqe = 16;
    IvCreateCqOut cq, spare;
    CHECK(ioctl(IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq, sizeof cq) == 0, "create cq");
    cqin.cqe = 4;
    CHECK(ioctl(IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &spare, sizeof spare) == 0, "spare cq");

    IvCreateQpIn qpin;
    memset(&qpin, 0, sizeof qpin);
    qpin.pd = pd.pd;
    qpin.send_cq = cq.cq;
    qpin.recv_cq = cq.cq;
    qpin.qp_type = IV_QPT_RC;
    qpin.cap.max_send_wr = 8;
    qpin.cap.max_recv_wr = 8;
    qpin.cap.max_send_sge = 2;
    qpin.cap.max_recv_sge = 2;
    qpin.cap.max_inline_data = 32;
    IvCreateQpOut qp;
    CHECK(ioctl(IOCTL_IV_CREATE_QP, &qpin, sizeof qpin, &qp, sizeof qp) == 0, "create qp");

    IvCreateSrqIn srqin;
    memset(&srqin, 0, sizeof srqin);
    srqin.pd = pd.pd;
    srqin.max_wr = 4;
    srqin.max_sge = 1;
    IvCreateSrqOut srq;
    CHECK(ioctl(IOCTL_IV_CREATE_SRQ, &srqin, sizeof srqin, &srq, sizeof srq) == 0, "create srq");

    /* The creates gave the geometry; IOCTL_IV_MAP_RINGS the addresses, the
     * same ones every time. */
    CHECK(qp.sq.control_addr == 0 && qp.sq.entries != 0 && spare.ring.entries_addr == 0,
          "geometry only");
    IvMapRingsOut qm = map_rings(qp.qp);
    CHECK(qm.ring.entries == qp.sq.entries && qm.rq.entries == qp.rq.entries &&
              qm.ring.control_addr != 0 && qm.rq.control_addr != 0,
          "qp rings mapped");
    IvMapRingsOut again = map_rings(qp.qp);
    CHECK(memcmp(&again, &qm, sizeof qm) == 0, "mapped once");
    IvMapRingsOut sm = map_rings(srq.srq);
    CHECK(qm.ring_doorbell < IV_DOORBELL_SLOTS && qm.rq_doorbell < IV_DOORBELL_SLOTS &&
              sm.ring_doorbell < IV_DOORBELL_SLOTS && sm.rq_doorbell == IV_DOORBELL_NONE &&
              qm.ring_doorbell != qm.rq_doorbell && sm.ring_doorbell != qm.ring_doorbell &&
              sm.ring_doorbell != qm.rq_doorbell,
          "a doorbell slot per queue: %u %u %u", (unsigned)qm.ring_doorbell,
          (unsigned)qm.rq_doorbell, (unsigned)sm.ring_doorbell);
    qp.sq = qm.ring;
    qp.rq = qm.rq;
    spare.ring = map_rings(spare.cq).ring;
    srq.ring = map_rings(srq.srq).ring;

    /* Open them in the library. */
    IvUserQp *uqp = IvUserQpOpen(dev, &qp);
    IvUserCq *ucq = IvUserCqOpen(dev, &spare);
    IvUserSrq *usrq = IvUserSrqOpen(dev, &srq);
    CHECK(uqp && ucq && usrq, "open: %u", (unsigned)GetLastError());
    if (!uqp || !ucq || !usrq) return 1;
    CHECK(IvUserQpNumber(uqp) == qp.qpn && IvUserCqNumber(ucq) == spare.cqn &&
              IvUserSrqNumber(usrq) == srq.srqn,
          "object numbers");
    CHECK(IvUserQpOpen((HANDLE)(intptr_t)0x4321, &qp) == NULL &&
              GetLastError() == ERROR_INVALID_HANDLE,
          "open on a bad handle");
    CHECK(IvUserQpOpen(dev, NULL) == NULL && GetLastError() == ERROR_INVALID_PARAMETER,
          "open of NULL");

    /* post_send with a gather list: the WQE is in the send ring. */
    IvSge sg[2] = {{0x1000, 16, 0x33}, {0x2000, 32, 0x33}};
    IvUserSendWr wr;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 0xC0DE;
    wr.opcode = IV_WR_RDMA_WRITE;
    wr.flags = IV_SEND_SIGNALED;
    wr.num_sge = 2;
    wr.sg_list = sg;
    wr.remote_addr = 0xABCD0000u;
    wr.rkey = 0x44;
    CHECK(control(&qp.sq)->producer.value == 0, "fresh send queue");
    CHECK(IvUserPostSend(uqp, &wr) == ST(STATUS_SUCCESS), "post send");
    CHECK(control(&qp.sq)->producer.value == 1, "producer index after one post");
    IvSendWqe wqe;
    memcpy(&wqe, slot(&qp.sq, 0), sizeof wqe);
    CHECK(wqe.wr_id == 0xC0DE && wqe.opcode == IV_WR_RDMA_WRITE && wqe.num_sge == 2 &&
              wqe.remote_addr == 0xABCD0000u && wqe.rkey == 0x44 && wqe.flags == IV_SEND_SIGNALED,
          "send WQE header");
    IvSge got[2];
    memcpy(got, slot(&qp.sq, 0) + sizeof(IvSendWqe), sizeof got);
    CHECK(memcmp(got, sg, sizeof sg) == 0, "send WQE gather list");

    /* Inline data is copied into the WQE. */
    static const char msg[] = "inline from C";
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 2;
    wr.opcode = IV_WR_SEND;
    wr.flags = IV_SEND_INLINE;
    wr.inline_len = sizeof msg;
    wr.inline_data = msg;
    CHECK(IvUserPostSend(uqp, &wr) == ST(STATUS_SUCCESS), "post inline");
    memcpy(&wqe, slot(&qp.sq, 1), sizeof wqe);
    CHECK(wqe.inline_len == sizeof msg && (wqe.flags & IV_SEND_INLINE), "inline WQE");
    CHECK(memcmp(slot(&qp.sq, 1) + sizeof(IvSendWqe), msg, sizeof msg) == 0, "inline bytes");

    /* Refusals: nothing is written. */
    IvSge three[3];
    memset(three, 0, sizeof three);
    memset(&wr, 0, sizeof wr);
    wr.num_sge = 3;
    wr.sg_list = three;
    CHECK(IvUserPostSend(uqp, &wr) == ST(STATUS_INVALID_PARAMETER), "3 SGEs on a 2-SGE QP");
    memset(&wr, 0, sizeof wr);
    wr.flags = IV_SEND_INLINE;
    wr.inline_len = 33;
    wr.inline_data = three;
    CHECK(IvUserPostSend(uqp, &wr) == ST(STATUS_INVALID_PARAMETER), "33 inline bytes");
    memset(&wr, 0, sizeof wr);
    wr.opcode = 99;
    CHECK(IvUserPostSend(uqp, &wr) == ST(STATUS_INVALID_PARAMETER), "unknown opcode");
    CHECK(IvUserPostSend(NULL, &wr) == ST(STATUS_INVALID_PARAMETER), "NULL QP");
    CHECK(control(&qp.sq)->producer.value == 2, "refused posts wrote nothing");

    /* The queue holds its depth (max_send_wr: one less than the ring's
     * slots), then reports full. */
    memset(&wr, 0, sizeof wr);
    uint32_t posted = 2;
    NtStatus st;
    while ((st = IvUserPostSend(uqp, &wr)) == ST(STATUS_SUCCESS)) posted++;
    CHECK(st == ST(STATUS_INSUFFICIENT_RESOURCES) && posted == qp.cap.max_send_wr &&
              posted == qp.sq.entries - 1,
          "full at %u (depth %u, %u slots)", (unsigned)posted, (unsigned)qp.cap.max_send_wr,
          (unsigned)qp.sq.entries);

    /* post_recv and post_srq_recv. */
    IvUserRecvWr rwr;
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = 0xEE;
    rwr.sg_list = sg;
    rwr.num_sge = 2;
    CHECK(IvUserPostRecv(uqp, &rwr) == ST(STATUS_SUCCESS), "post recv");
    IvRecvWqe rwqe;
    memcpy(&rwqe, slot(&qp.rq, 0), sizeof rwqe);
    CHECK(rwqe.wr_id == 0xEE && rwqe.num_sge == 2 && control(&qp.rq)->producer.value == 1,
          "recv WQE");
    rwr.num_sge = 1;
    rwr.wr_id = 0xEF;
    CHECK(IvUserPostSrqRecv(usrq, &rwr) == ST(STATUS_SUCCESS), "post srq recv");
    memcpy(&rwqe, slot(&srq.ring, 0), sizeof rwqe);
    CHECK(rwqe.wr_id == 0xEF && control(&srq.ring)->producer.value == 1, "srq WQE");

    /* poll_cq: the test writes CQEs as the HCA would, on the spare CQ. */
    IvCqe wc[4];
    CHECK(IvUserPollCq(ucq, wc, 4) == 0, "empty CQ");
    for (uint32_t i = 0; i < 3; i++) {
        IvCqe e;
        memset(&e, 0, sizeof e);
        e.wr_id = 100 + i;
        e.opcode = IV_WC_OP_RECV;
        e.byte_len = 10 * i;
        memcpy(slot(&spare.ring, i), &e, sizeof e);
    }
    control(&spare.ring)->producer.value = 3;
    CHECK(IvUserPollCq(ucq, wc, 2) == 2 && wc[0].wr_id == 100 && wc[1].wr_id == 101, "poll 2");
    CHECK(IvUserPollCq(ucq, wc, 4) == 1 && wc[0].wr_id == 102 && wc[0].byte_len == 20, "poll 1");
    CHECK(IvUserPollCq(ucq, wc, 4) == 0 && control(&spare.ring)->consumer.value == 3, "drained");
    CHECK(IvUserPollCq(ucq, NULL, 0) == 0, "max 0");
    control(&spare.ring)->producer.value = 1000; /* more than the ring holds */
    CHECK(IvUserPollCq(ucq, wc, 4) == ST(STATUS_DEVICE_HARDWARE_ERROR), "corrupt producer");
    control(&spare.ring)->producer.value = 3;

    /* req_notify_cq writes the arm word. */
    CHECK(IvUserReqNotifyCq(ucq, 1) == ST(STATUS_SUCCESS), "arm");
    uint32_t arm = control(&spare.ring)->arm.value;
    CHECK((arm & IV_CQ_ARM_NEXT) && (arm & IV_CQ_ARM_SOLICITED), "arm word %#x", (unsigned)arm);

#ifndef _WIN32
    /* Host only: an object open in the library cannot be destroyed (its
     * rings must stay mapped). On Windows the destroy would unmap them. */
    IvHandleIn h = {qp.qp};
    CHECK(ioctl(IOCTL_IV_DESTROY_QP, &h, sizeof h, NULL, 0) == ST(STATUS_DEVICE_BUSY),
          "destroy of an open QP");
    IvResizeCqIn rs = {spare.cq, 32, 0};
    IvResizeCqOut rso;
    CHECK(ioctl(IOCTL_IV_RESIZE_CQ, &rs, sizeof rs, &rso, sizeof rso) == ST(STATUS_DEVICE_BUSY),
          "resize of an open CQ");
    /* Closed, the CQ resizes; reopened on the new ring, it polls there. */
    IvUserCqClose(ucq);
    CHECK(ioctl(IOCTL_IV_RESIZE_CQ, &rs, sizeof rs, &rso, sizeof rso) == 0, "resize");
    spare.cqe = rso.cqe;
    spare.ring = rso.ring;
    CHECK(spare.ring.control_addr == 0, "the new ring: geometry only");
    ucq = IvUserCqOpen(dev, &spare);
    CHECK(ucq != NULL && IvUserPollCq(ucq, wc, 4) == 0, "reopened after resize");
#endif

    /* Close in the library, then destroy. */
    IvUserQpClose(uqp);
    IvUserSrqClose(usrq);
    IvUserCqClose(ucq);
    IvUserQpClose(NULL);
    IvHandleIn qh = {qp.qp}, sh = {srq.srq}, ch = {cq.cq}, sph = {spare.cq}, ph = {pd.pd};
    CHECK(ioctl(IOCTL_IV_DESTROY_QP, &qh, sizeof qh, NULL, 0) == 0, "destroy qp");
    CHECK(ioctl(IOCTL_IV_DESTROY_SRQ, &sh, sizeof sh, NULL, 0) == 0, "destroy srq");
    CHECK(ioctl(IOCTL_IV_DESTROY_CQ, &ch, sizeof ch, NULL, 0) == 0, "destroy cq");
    CHECK(ioctl(IOCTL_IV_DESTROY_CQ, &sph, sizeof sph, NULL, 0) == 0, "destroy spare cq");
    CHECK(ioctl(IOCTL_IV_DEALLOC_PD, &ph, sizeof ph, NULL, 0) == 0, "dealloc pd");

#ifndef _WIN32
    /* Host only: closing the device under an open object runs the object
     * down; the library then refuses to touch its (freed) ring. */
    CHECK(ioctl(IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq, sizeof cq) == 0, "create cq again");
    ucq = IvUserCqOpen(dev, &cq);
    CHECK(ucq != NULL, "open");
    CHECK(CloseHandle(dev), "close device");
    CHECK(IvUserPollCq(ucq, wc, 4) == ST(STATUS_INVALID_HANDLE), "poll after close");
    CHECK(IvUserReqNotifyCq(ucq, 0) == ST(STATUS_INVALID_HANDLE), "arm after close");
    IvUserCqClose(ucq);
    CHECK(CloseHandle(port), "close port");
    CHECK(IrpverbsHostQuiesce(10000), "driver still holds objects after close");
#else
    CHECK(CloseHandle(dev), "close device");
    CHECK(CloseHandle(port), "close port");
#endif

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
