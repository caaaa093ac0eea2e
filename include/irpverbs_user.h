/*
 * irpverbs_user.h - the speed path for user-mode C ULPs: post send, post
 * receive, poll CQ and arm CQ with no system call, on the rings the driver
 * mapped into the process.
 *
 * The control path stays DeviceIoControl (irpverbs.h). After creating a CQ,
 * QP or SRQ, the ULP opens it here from the create response and the device
 * HANDLE it was created on. A user-mode create response carries only the
 * rings' geometry; the open maps them into the process with
 * IOCTL_IV_MAP_RINGS (which a ULP may also call itself: it returns the same
 * addresses every time):
 *
 *     IvCreateQpOut out;  ... DeviceIoControl(dev, IOCTL_IV_CREATE_QP, ...)
 *     IvUserQp *qp = IvUserQpOpen(dev, &out);
 *     IvUserPostSend(qp, &wr);            // writes the ring and the doorbell page
 *     n = IvUserPollCq(cq, wc, 16);       // reads the CQ ring
 *     IvUserQpClose(qp);                  // before IOCTL_IV_DESTROY_QP
 *
 * Close an object here before destroying it (and a CQ before resizing it:
 * close, resize, copy IvResizeCqOut's cqe and ring into the IvCreateCqOut,
 * open again). Completion notification: IvUserReqNotifyCq arms the CQ;
 * IOCTL_IV_CQ_NOTIFY (overlapped, through a completion port) or a completion
 * channel delivers the event.
 *
 * Return values: NtStatus, as in irpverbs_kernel.h (STATUS_SUCCESS;
 * STATUS_INSUFFICIENT_RESOURCES when the queue is full;
 * STATUS_INVALID_PARAMETER for a work request the queue cannot take;
 * STATUS_INVALID_HANDLE once the device HANDLE was closed). IvUserPollCq
 * returns the number of completions (>= 0) or a failure NTSTATUS (< 0). The
 * open functions return NULL with GetLastError() set on failure. Every
 * function is thread-safe; posts to different queues never contend. (On
 * Windows, <winnt.h> defines some STATUS_ codes as DWORD: compare the
 * result with (NtStatus)STATUS_x.)
 *
 * Doorbells, with no system call: each open of the device has one
 * doorbell page (IvDoorbellPage in irpverbs.h), which the library maps into
 * the process with IOCTL_IV_MAP_DOORBELLS before it maps any ring; every
 * ring mapped after it comes with the slot of its doorbell in the page
 * (IvMapRingsOut.ring_doorbell, .rq_doorbell). A post (or an arm) writes
 * the ring, publishes the producer index (or the arm word) with release
 * ordering, then sets the queue's slot bit in the page and the bit of that
 * word in the page's summary, both atomic ORs with release ordering. A
 * receive post (RQ or SRQ) sets the bits only while the ring's doorbell
 * request (IvRingControl.arm, written by the HCA) is nonzero, read after a
 * full fence: the HCA asks only when it must hear of new receives at once
 * (a QP in ERR, a responder waiting after an RNR NAK). Then,
 * after another full fence, it reads the page's polling word: while the
 * soft HCA polls the pages (a thread that keeps scanning while doorbells
 * come) it is nonzero and nothing else is needed; 0 means the HCA sleeps,
 * and the library issues IOCTL_IV_RING_DOORBELLS (no buffers), which runs
 * the doorbell in that call and wakes the HCA's poller. The HCA rings the
 * queue bound to each slot it finds; a slot of another
 * file's queue cannot be named, and garbage in the page makes the HCA look
 * at this file's queues at most. A ULP that maps its own rings must map the
 * doorbell page first, or those rings get IV_DOORBELL_NONE (no slot).
 *
 * Host mode (non-Windows, libirpverbs_host_c): the rings are the driver's
 * memory in the same process and the doorbells call the in-process soft
 * HCA's directly; with IRPVERBS_DOORBELLS=page in the environment the
 * device is opened with its doorbell page mapped and the library rings
 * through it, as on Windows, while a doorbell thread scans the pages. The
 * library also checks what Windows cannot: destroying (or resizing) an
 * object that is still open here fails with ERROR_BUSY, and a speed-path
 * call after the device HANDLE was closed fails with STATUS_INVALID_HANDLE
 * instead of touching freed rings.
 *
 * On Windows irpverbs.sys maps each ring (and the doorbell page) into the
 * process on IOCTL_IV_MAP_RINGS (IOCTL_IV_MAP_DOORBELLS): an MDL over the
 * nonpaged memory, MmMapLockedPagesSpecifyCache(UserMode) in the caller's
 * context. It unmaps a ring, in the process, at the first request after the
 * object's destroy (or the CQ's resize), and everything at the file's
 * cleanup. A post through an object left open after its destroy may then
 * fault (the host library refuses the destroy instead). What the Windows
 * build of this library needs that host mode does not: a DLL
 * (irpverbs_user.dll) exporting these functions; host mode exports them
 * from libirpverbs_host_c.
 */
#ifndef IRPVERBS_USER_H
#define IRPVERBS_USER_H

#include <stdint.h>

#include "irpverbs.h"
#include "irpverbs_host.h" /* HANDLE; <windows.h> on Windows */

#ifdef __cplusplus
extern "C" {
#endif

/* A send work request (the layout of irpverbs_kernel.h's IvKernelSendWr):
 * the fields of IvSendWqe, with the gather list or inline data pointed to
 * and copied into the ring by IvUserPostSend. */
typedef struct IvUserSendWr {
    uint64_t wr_id;       /* returned in the completion */
    uint8_t opcode;       /* IV_WR_* */
    uint8_t flags;        /* IV_SEND_*; IV_SEND_INLINE: the data is inline_data */
    uint16_t num_sge;     /* entries of sg_list, at most the QP's max_send_sge */
    uint32_t imm_or_inv;  /* immediate data, or the rkey to invalidate */
    uint64_t remote_addr; /* RDMA / atomic */
    uint32_t rkey;        /* RDMA / atomic */
    uint32_t inline_len;  /* IV_SEND_INLINE: bytes at inline_data */
    uint64_t compare_add; /* atomic compare or add operand */
    uint64_t swap;        /* atomic swap operand */
    uint32_t ahn;         /* UD: IvCreateAhOut.ahn */
    uint32_t remote_qpn;  /* UD */
    uint32_t remote_qkey; /* UD */
    uint32_t reserved;    /* zero */
    const IvSge *sg_list;    /* num_sge entries (not inline) */
    const void *inline_data; /* inline_len bytes (IV_SEND_INLINE) */
} IvUserSendWr;

/* A receive work request: a scatter list. */
typedef struct IvUserRecvWr {
    uint64_t wr_id;
    const IvSge *sg_list;
    uint32_t num_sge;
    uint32_t reserved; /* zero */
} IvUserRecvWr;

/* Opened objects (opaque). */
typedef struct IvUserQp IvUserQp;
typedef struct IvUserCq IvUserCq;
typedef struct IvUserSrq IvUserSrq;

/* Opens the QP the unmodified IOCTL_IV_CREATE_QP response `qp` describes
 * (mapping its rings with IOCTL_IV_MAP_RINGS),
 * created on `device`. NULL with ERROR_INVALID_HANDLE (not an open device),
 * ERROR_INVALID_PARAMETER (NULL, or rings that cannot hold the WQEs the
 * response's cap allows). */
IvUserQp *IvUserQpOpen(HANDLE device, const IvCreateQpOut *qp);
/* Opens the CQ of an IOCTL_IV_CREATE_CQ response. */
IvUserCq *IvUserCqOpen(HANDLE device, const IvCreateCqOut *cq);
/* Opens the SRQ of an IOCTL_IV_CREATE_SRQ response. */
IvUserSrq *IvUserSrqOpen(HANDLE device, const IvCreateSrqOut *srq);
/* Close an opened object (NULL is ignored). No IOCTL. */
void IvUserQpClose(IvUserQp *qp);
void IvUserCqClose(IvUserCq *cq);
void IvUserSrqClose(IvUserSrq *srq);

/* post_send / post_recv / post_srq_recv. */
NtStatus IvUserPostSend(IvUserQp *qp, const IvUserSendWr *wr);
NtStatus IvUserPostRecv(IvUserQp *qp, const IvUserRecvWr *wr);
NtStatus IvUserPostSrqRecv(IvUserSrq *srq, const IvUserRecvWr *wr);
/* poll_cq: up to max completions into wc, oldest first; the count or a
 * failure NTSTATUS (negative). */
int32_t IvUserPollCq(IvUserCq *cq, IvCqe *wc, uint32_t max);
/* req_notify_cq: arms the CQ for the next completion (solicited_only != 0:
 * the next solicited or error one) and rings its arm doorbell. */
NtStatus IvUserReqNotifyCq(IvUserCq *cq, int32_t solicited_only);

/* The QP / CQ / SRQ number of an opened object. */
uint32_t IvUserQpNumber(const IvUserQp *qp);
uint32_t IvUserCqNumber(const IvUserCq *cq);
uint32_t IvUserSrqNumber(const IvUserSrq *srq);

#ifdef __cplusplus
}
#endif

#endif /* IRPVERBS_USER_H */
