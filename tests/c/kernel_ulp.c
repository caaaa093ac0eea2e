/*
 * A kernel-mode ULP's use of irpverbs, in C, in host mode: the control verbs
 * as internal device control requests on a kernel file object, and the
 * speed path through the direct-call table of irpverbs_kernel.h obtained by
 * (the host's stand-in for) IRP_MN_QUERY_INTERFACE. No data moves: the test
 * checks what each table call does to the rings (and plays the HCA on a CQ
 * no QP uses to check poll_cq).
 *
 * Host only (IrpverbsHostCreateKernelFile and IrpverbsHostQueryInterface
 * stand in for IoGetDeviceObjectPointer and the PnP IRP). Exit code 0 means
 * every check held.
 */
#include <stdio.h>
#include <string.h>

#include "irpverbs.h"
#include "irpverbs_host.h"
#include "irpverbs_kernel.h"

#include "check.h"

static HANDLE kfile;

/* An internal device control request, synchronously: the NTSTATUS. */
static NTSTATUS internal_ioctl(DWORD code, const void *in, DWORD in_len, void *out,
                               DWORD out_len) {
    DWORD bytes = 0;
    if (DeviceIoControl(kfile, code, (LPVOID)in, in_len, out, out_len, &bytes, NULL)) return 0;
    DWORD e = GetLastError();
    return e == ERROR_BUSY ? STATUS_DEVICE_BUSY : (NTSTATUS)0xC0000001u;
}

static volatile IvRingControl *control(const IvRingMap *m) {
    return (volatile IvRingControl *)(uintptr_t)m->control_addr;
}
static unsigned char *slot(const IvRingMap *m, uint32_t index) {
    return (unsigned char *)(uintptr_t)m->entries_addr + (size_t)(index & (m->entries - 1)) * m->stride;
}

int main(void) {
    kfile = IrpverbsHostCreateKernelFile(0);
    CHECK(kfile != INVALID_HANDLE_VALUE, "kernel file: %u", (unsigned)GetLastError());
    if (kfile == INVALID_HANDLE_VALUE) return 1;

    /* The table. */
    IvKernelInterface t;
    memset(&t, 0, sizeof t);
    IvGuid type = IV_KERNEL_INTERFACE_GUID_INIT;
    IvGuid other = IV_KERNEL_INTERFACE_GUID_INIT;
    other.Data1 ^= 1;
    CHECK(IrpverbsHostQueryInterface(kfile, &other, sizeof t, IV_KERNEL_INTERFACE_VERSION, &t) ==
              STATUS_NOT_SUPPORTED,
          "another interface type");
    CHECK(IrpverbsHostQueryInterface(kfile, &type, sizeof t, IV_KERNEL_INTERFACE_VERSION + 1,
                                     &t) == STATUS_INVALID_PARAMETER,
          "a version it does not serve");
    CHECK(IrpverbsHostQueryInterface(kfile, &type, sizeof t - 8, IV_KERNEL_INTERFACE_VERSION,
                                     &t) == STATUS_INVALID_PARAMETER,
          "a buffer too small");
    CHECK(IrpverbsHostQueryInterface(kfile, &type, sizeof t, IV_KERNEL_INTERFACE_VERSION, &t) ==
              STATUS_SUCCESS,
          "query interface");
    CHECK(t.size == sizeof t && t.version == IV_KERNEL_INTERFACE_VERSION && t.context != NULL &&
              t.post_send && t.poll_cq && t.req_notify_cq,
          "table filled");
    t.interface_reference(t.context);
    t.interface_dereference(t.context);

    /* Objects, created with internal IOCTLs. */
    IvAllocPdIn pdin;
    memset(&pdin, 0, sizeof pdin);
    IvAllocPdOut pd;
    CHECK(internal_ioctl(IOCTL_IV_ALLOC_PD, &pdin, sizeof pdin, &pd, sizeof pd) == 0, "pd");
    IvCreateCqIn cqin;
    memset(&cqin, 0, sizeof cqin);
    cqin.cqe = 8;
    IvCreateCqOut cq, spare;
    CHECK(internal_ioctl(IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &cq, sizeof cq) == 0, "cq");
    CHECK(internal_ioctl(IOCTL_IV_CREATE_CQ, &cqin, sizeof cqin, &spare, sizeof spare) == 0,
          "spare cq");
    IvCreateSrqIn srqin;
    memset(&srqin, 0, sizeof srqin);
    srqin.pd = pd.pd;
    srqin.max_wr = 4;
    srqin.max_sge = 1;
    IvCreateSrqOut srq;
    CHECK(internal_ioctl(IOCTL_IV_CREATE_SRQ, &srqin, sizeof srqin, &srq, sizeof srq) == 0, "srq");
    IvCreateQpIn qpin;
    memset(&qpin, 0, sizeof qpin);
    qpin.pd = pd.pd;
    qpin.send_cq = cq.cq;
    qpin.recv_cq = cq.cq;
    qpin.qp_type = IV_QPT_RC;
    qpin.cap.max_send_wr = 4;
    qpin.cap.max_recv_wr = 4;
    qpin.cap.max_send_sge = 1;
    qpin.cap.max_recv_sge = 1;
    qpin.cap.max_inline_data = 16;
    IvCreateQpOut qp;
    CHECK(internal_ioctl(IOCTL_IV_CREATE_QP, &qpin, sizeof qpin, &qp, sizeof qp) == 0, "qp");

    /* Open them in the table. */
    IvKernelQp *kqp = NULL;
    IvKernelCq *kcq = NULL;
    IvKernelSrq *ksrq = NULL;
    CHECK(t.open_qp(t.context, &qp, &kqp) == STATUS_SUCCESS && kqp, "open qp");
    CHECK(t.open_cq(t.context, spare.cqn, &spare.ring, &kcq) == STATUS_SUCCESS && kcq, "open cq");
    CHECK(t.open_srq(t.context, &srq, &ksrq) == STATUS_SUCCESS && ksrq, "open srq");
    CHECK(t.open_qp(t.context, NULL, &kqp) == STATUS_INVALID_PARAMETER, "open NULL");

    /* post_send */
    IvSge sg = {0x7000, 64, 0x21};
    IvKernelSendWr wr;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = 0xF00D;
    wr.opcode = IV_WR_ATOMIC_CMP_AND_SWP;
    wr.flags = IV_SEND_SIGNALED | IV_SEND_FENCE;
    wr.num_sge = 1;
    wr.sg_list = &sg;
    wr.remote_addr = 0x8000;
    wr.rkey = 0x99;
    wr.compare_add = 1;
    wr.swap = 2;
    CHECK(t.post_send(t.context, kqp, &wr) == STATUS_SUCCESS, "post send");
    IvSendWqe wqe;
    memcpy(&wqe, slot(&qp.sq, 0), sizeof wqe);
    CHECK(wqe.wr_id == 0xF00D && wqe.opcode == IV_WR_ATOMIC_CMP_AND_SWP && wqe.compare_add == 1 &&
              wqe.swap == 2 && wqe.rkey == 0x99 && wqe.num_sge == 1,
          "send WQE");
    CHECK(control(&qp.sq)->producer.value == 1, "send producer");
    wr.num_sge = 2;
    CHECK(t.post_send(t.context, kqp, &wr) == STATUS_INVALID_PARAMETER, "2 SGEs on a 1-SGE QP");
    CHECK(control(&qp.sq)->producer.value == 1, "nothing written");

    /* post_recv, post_srq_recv */
    IvKernelRecvWr rwr;
    memset(&rwr, 0, sizeof rwr);
    rwr.wr_id = 0xBEE;
    rwr.sg_list = &sg;
    rwr.num_sge = 1;
    CHECK(t.post_recv(t.context, kqp, &rwr) == STATUS_SUCCESS, "post recv");
    IvRecvWqe rwqe;
    memcpy(&rwqe, slot(&qp.rq, 0), sizeof rwqe);
    CHECK(rwqe.wr_id == 0xBEE && control(&qp.rq)->producer.value == 1, "recv WQE");
    CHECK(t.post_srq_recv(t.context, ksrq, &rwr) == STATUS_SUCCESS, "post srq recv");
    CHECK(control(&srq.ring)->producer.value == 1, "srq producer");

    /* poll_cq, with the test as the HCA on the spare CQ. */
    IvCqe wc[4];
    CHECK(t.poll_cq(t.context, kcq, wc, 4) == 0, "empty");
    IvCqe e;
    memset(&e, 0, sizeof e);
    e.wr_id = 77;
    e.status = IV_WC_WR_FLUSH_ERR;
    memcpy(slot(&spare.ring, 0), &e, sizeof e);
    control(&spare.ring)->producer.value = 1;
    CHECK(t.poll_cq(t.context, kcq, wc, 4) == 1 && wc[0].wr_id == 77 &&
              wc[0].status == IV_WC_WR_FLUSH_ERR,
          "poll");
    CHECK(t.poll_cq(t.context, kcq, NULL, 4) == STATUS_INVALID_PARAMETER, "NULL array");

    /* req_notify_cq */
    CHECK(t.req_notify_cq(t.context, kcq, 0) == STATUS_SUCCESS, "arm");
    uint32_t arm = control(&spare.ring)->arm.value;
    CHECK((arm & IV_CQ_ARM_NEXT) && !(arm & IV_CQ_ARM_SOLICITED), "arm word %#x", (unsigned)arm);

    /* Close in the table, then destroy; release the interface. */
    t.close_qp(t.context, kqp);
    t.close_cq(t.context, kcq);
    t.close_srq(t.context, ksrq);
    IvHandleIn qh = {qp.qp}, sh = {srq.srq}, ch = {cq.cq}, sph = {spare.cq}, ph = {pd.pd};
    CHECK(internal_ioctl(IOCTL_IV_DESTROY_QP, &qh, sizeof qh, NULL, 0) == 0, "destroy qp");
    CHECK(internal_ioctl(IOCTL_IV_DESTROY_SRQ, &sh, sizeof sh, NULL, 0) == 0, "destroy srq");
    CHECK(internal_ioctl(IOCTL_IV_DESTROY_CQ, &ch, sizeof ch, NULL, 0) == 0, "destroy cq");
    CHECK(internal_ioctl(IOCTL_IV_DESTROY_CQ, &sph, sizeof sph, NULL, 0) == 0, "destroy spare");
    CHECK(internal_ioctl(IOCTL_IV_DEALLOC_PD, &ph, sizeof ph, NULL, 0) == 0, "dealloc pd");
    t.interface_dereference(t.context);
    CHECK(CloseHandle(kfile), "close");
    CHECK(IrpverbsHostQuiesce(10000), "driver still holds objects after close");

    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
