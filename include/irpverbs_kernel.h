/*
 * irpverbs_kernel.h - the direct-call speed path for kernel-mode ULPs.
 *
 * A kernel ULP drives the control verbs (create / modify / destroy of PDs,
 * MRs, CQs, QPs, SRQs, AHs) with the IOCTLs of irpverbs.h, sent as internal
 * device control IRPs (IRP_MJ_INTERNAL_DEVICE_CONTROL, e.g. built with
 * IoBuildDeviceIoControlRequest(..., InternalDeviceIoControl = TRUE) and a
 * completion routine). The create responses carry the object's rings
 * (IvRingMap, kernel addresses). The speed path - post send, post receive,
 * poll CQ, arm CQ - is not an IRP: it is this function table, which the ULP
 * obtains once with IRP_MN_QUERY_INTERFACE:
 *
 *     IO_STACK_LOCATION: MajorFunction = IRP_MJ_PNP,
 *                        MinorFunction = IRP_MN_QUERY_INTERFACE,
 *     Parameters.QueryInterface.InterfaceType = &GUID_IV_KERNEL_INTERFACE,
 *                               Size    = sizeof(IvKernelInterface),
 *                               Version = IV_KERNEL_INTERFACE_VERSION,
 *                               Interface = (PINTERFACE)&table.
 *
 * The table starts with the INTERFACE header of wdm.h (Size, Version,
 * Context, InterfaceReference, InterfaceDereference). It is returned
 * referenced: the ULP calls interface_dereference(context) when it no longer
 * uses the table (after closing every object it opened through it).
 * In host mode (the driver running in a user process) the host library hands
 * the same table out (HostDevice::query_interface in Rust,
 * IrpverbsHostQueryInterface in irpverbs_host.h).
 *
 * Using it:
 *  1. create a CQ, a QP (and an SRQ) with internal IOCTLs;
 *  2. open them in the table: open_cq(context, out.cqn, &out.ring, &cq),
 *     open_qp(context, &qp_out, &qp), open_srq(context, &srq_out, &srq);
 *  3. post_send / post_recv / post_srq_recv / poll_cq / req_notify_cq;
 *  4. close them in the table BEFORE the destroy IOCTL (or a resize of the
 *     CQ: close, resize, open_cq with the new ring). The destroy unmaps the
 *     rings; a closed object is never touched again.
 *
 * IRQL and context: every function is callable at IRQL <= DISPATCH_LEVEL,
 * from any thread and from DPCs. The post, poll and notify functions never
 * allocate and never block. Each opened queue (a QP's send queue, its
 * receive queue, an SRQ, a CQ) has its own KSPIN_LOCK: post_send,
 * post_recv, post_srq_recv, poll_cq and req_notify_cq hold it, acquired
 * with KeAcquireSpinLockRaiseToDpc, for the time they touch the ring, and
 * return at the caller's IRQL. So one queue may be used from a thread at
 * PASSIVE_LEVEL and from a DPC on the same processor (the DPC cannot run
 * while the thread holds the lock); the caller needs no lock of its own
 * for that. Calls on different queues never contend. The doorbell is rung
 * after the lock is released. The open functions allocate a small object
 * (and its locks) from nonpaged pool. Host mode's verifier checks that the
 * rings' locks are only taken at DISPATCH_LEVEL (bugcheck 0xC4/0x40).
 *
 * Every function returns an NTSTATUS (poll_cq: a count or an NTSTATUS):
 *   STATUS_INSUFFICIENT_RESOURCES   the queue is full (nothing posted);
 *   STATUS_INVALID_PARAMETER        a NULL argument, more SGEs or inline data
 *                                   than the queue was created with, an
 *                                   unknown opcode or flag, a reserved field
 *                                   set, post_recv on a QP that has an SRQ;
 *   STATUS_DEVICE_HARDWARE_ERROR    (poll_cq) the CQ's producer index is
 *                                   impossible: the HCA is broken.
 * A WQE the HCA cannot execute (bad lkey, length, ...) is not refused here:
 * it completes in error on the CQ, as the IBTA specifies.
 *
 * CEP callbacks (version 2). A kernel ULP takes a CEP's CM events through a
 * callback instead of IOCTL_IV_GET_CEP_EVENT (the polling model):
 *  1. create the CEP (IOCTL_IV_CREATE_CEP, internal, on its file object);
 *  2. register_cep_callback(context, file_object, cep, fn, fn_context);
 *  3. when the CEP has events the driver calls fn(fn_context, cep,
 *     user_context) at DISPATCH_LEVEL. The call only says "reap now": the
 *     ULP (in the callback or later, from anywhere at <= DISPATCH_LEVEL)
 *     calls poll_cep_event until it returns 0; the callback is called
 *     again only after a poll returned 0 (and events came since);
 *  4. a listener's connect requests make new CEPs (IvCepEventOut.cep of
 *     the CONNECT_REQUEST event) that have the listener's callback and
 *     context; register another one on them if it wants;
 *  5. unregister_cep_callback before it frees fn_context or unloads.
 * file_object is the FILE_OBJECT the ULP sends its internal IOCTLs with
 * (IoGetDeviceObjectPointer's; in host mode IrpverbsHostGetFileObject's).
 * The callback runs at DISPATCH_LEVEL with no lock of the driver's held,
 * one at a time per device (never two at once, never inside one another);
 * it may call poll_cep_event and the speed path, send IRPs (IoAllocateIrp,
 * IoCallDriver), register or unregister the callback of ANOTHER CEP; it
 * must not block, and must not unregister (or re-register) its own CEP's
 * callback (that waits for the callback to return: a deadlock).
 * Unregistering is a rundown: when unregister_cep_callback returns, the
 * function is not running (it waited for a call running on another
 * processor) and is never called again for that CEP. Destroying the CEP
 * (or closing the file) also ends the calls, but a call already running
 * may still be: unregister first to know that it returned.
 * Errors of the CEP functions: STATUS_INVALID_HANDLE (file_object is not a
 * file of the device, or cep is not a CEP of that file),
 * STATUS_DEVICE_BUSY (an IOCTL_IV_GET_CEP_EVENT is pended on the CEP),
 * STATUS_INVALID_PARAMETER (a NULL function or event pointer),
 * STATUS_NOT_SUPPORTED (a table without a CM).
 *
 * Versions: IV_KERNEL_INTERFACE_VERSION is 2. Version 1 is the table up to
 * req_notify_cq (IV_KERNEL_INTERFACE_V1_SIZE bytes); later versions only
 * append fields. The query is served for Version 1 or 2 when Size holds
 * that version's table: a ULP built against version 1 asks for Version 1
 * with its sizeof(IvKernelInterface) and gets the version 1 table.
 */
#ifndef IRPVERBS_KERNEL_H
#define IRPVERBS_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#include "irpverbs.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The interface's version (IvKernelInterface.version). */
#define IV_KERNEL_INTERFACE_VERSION 2

/* {17EE45AE-E023-4F3B-81FC-6784694953D3}: the interface type a kernel ULP
 * asks IRP_MN_QUERY_INTERFACE for. Initializer for a GUID (or IvGuid). */
#define IV_KERNEL_INTERFACE_GUID_INIT \
    { 0x17EE45AEu, 0xE023u, 0x4F3Bu, { 0x81u, 0xFCu, 0x67u, 0x84u, 0x69u, 0x49u, 0x53u, 0xD3u } }

#ifdef DEFINE_GUID
/* With the WDK's <guiddef.h> (include <initguid.h> first in one file). */
DEFINE_GUID(GUID_IV_KERNEL_INTERFACE, 0x17EE45AE, 0xE023, 0x4F3B, 0x81, 0xFC, 0x67, 0x84, 0x69,
            0x49, 0x53, 0xD3);
#endif

/* A GUID, laid out as the Windows GUID (for host mode, without <guiddef.h>). */
typedef struct IvGuid {
    uint32_t Data1;
    uint16_t Data2;
    uint16_t Data3;
    uint8_t Data4[8];
} IvGuid;

/* A send work request. The fields are those of IvSendWqe (irpverbs.h); the
 * gather list or the inline data are pointed to and copied into the ring by
 * post_send (the caller's arrays may be reused when it returns). */
typedef struct IvKernelSendWr {
    uint64_t wr_id;       /* returned in the completion */
    uint8_t opcode;       /* IV_WR_* */
    uint8_t flags;        /* IV_SEND_*; IV_SEND_INLINE: the data is inline_data */
    uint16_t num_sge;     /* entries of sg_list, at most the QP's max_send_sge */
    uint32_t imm_or_inv;  /* immediate data (as the ULP wants it on the wire), or
                             the rkey to invalidate */
    uint64_t remote_addr; /* RDMA / atomic */
    uint32_t rkey;        /* RDMA / atomic */
    uint32_t inline_len;  /* IV_SEND_INLINE: bytes at inline_data */
    uint64_t compare_add; /* atomic compare (CMP_AND_SWP) or add (FETCH_AND_ADD) */
    uint64_t swap;        /* atomic swap (CMP_AND_SWP) */
    uint32_t ahn;         /* UD: IvCreateAhOut.ahn */
    uint32_t remote_qpn;  /* UD */
    uint32_t remote_qkey; /* UD */
    uint32_t reserved;    /* zero */
    const IvSge *sg_list;    /* num_sge entries (not inline) */
    const void *inline_data; /* inline_len bytes (IV_SEND_INLINE) */
} IvKernelSendWr;

/* A receive work request: a scatter list. */
typedef struct IvKernelRecvWr {
    uint64_t wr_id;        /* returned in the completion */
    const IvSge *sg_list;  /* num_sge entries, at most the queue's max SGEs */
    uint32_t num_sge;
    uint32_t reserved;     /* zero */
} IvKernelRecvWr;

/* Objects opened in the table (opaque). */
typedef struct IvKernelQp IvKernelQp;
typedef struct IvKernelCq IvKernelCq;
typedef struct IvKernelSrq IvKernelSrq;

/* INTERFACE.InterfaceReference / InterfaceDereference. */
typedef void (*IvInterfaceReferenceFn)(void *context);

/* Opens a QP from the unmodified response of IOCTL_IV_CREATE_QP; stores the
 * object at *qp. STATUS_INVALID_PARAMETER if a ring cannot hold the WQEs the
 * response's cap allows. Allocates (nonpaged). */
typedef NtStatus (*IvKernelOpenQpFn)(void *context, const IvCreateQpOut *create, IvKernelQp **qp);
/* Closes an opened QP. Call it before destroying the QP. */
typedef void (*IvKernelCloseQpFn)(void *context, IvKernelQp *qp);
/* Opens a CQ from its number and ring (IvCreateCqOut.cqn / .ring, or the ring
 * of IvResizeCqOut after a resize). */
typedef NtStatus (*IvKernelOpenCqFn)(void *context, uint32_t cqn, const IvRingMap *ring,
                                     IvKernelCq **cq);
/* Closes an opened CQ. Call it before destroying or resizing the CQ. */
typedef void (*IvKernelCloseCqFn)(void *context, IvKernelCq *cq);
/* Opens an SRQ from the unmodified response of IOCTL_IV_CREATE_SRQ. */
typedef NtStatus (*IvKernelOpenSrqFn)(void *context, const IvCreateSrqOut *create,
                                      IvKernelSrq **srq);
/* Closes an opened SRQ. Call it before destroying the SRQ. */
typedef void (*IvKernelCloseSrqFn)(void *context, IvKernelSrq *srq);

/* post_send: writes the WQE at the send queue's producer slot, publishes it
 * and rings the QP's send doorbell. */
typedef NtStatus (*IvKernelPostSendFn)(void *context, IvKernelQp *qp, const IvKernelSendWr *wr);
/* post_recv: the same on the QP's receive queue, but it rings the receive
 * doorbell only while the HCA asks for it (the ring's doorbell request,
 * IvRingControl.arm: a QP in ERR, or a responder waiting for a receive after
 * an RNR NAK); otherwise the HCA finds the receive when a message needs one,
 * as a hardware HCA reads its doorbell record. post_srq_recv likewise. */
typedef NtStatus (*IvKernelPostRecvFn)(void *context, IvKernelQp *qp, const IvKernelRecvWr *wr);
/* post_srq_recv: the same on an SRQ. */
typedef NtStatus (*IvKernelPostSrqRecvFn)(void *context, IvKernelSrq *srq,
                                          const IvKernelRecvWr *wr);
/* poll_cq: copies up to max completions, oldest first, into wc and returns
 * how many (0: the CQ is empty), or a failure NTSTATUS (negative). */
typedef int32_t (*IvKernelPollCqFn)(void *context, IvKernelCq *cq, IvCqe *wc, uint32_t max);
/* req_notify_cq: arms the CQ for its next completion (solicited_only != 0:
 * the next solicited or error completion) and rings its arm doorbell. The
 * HCA then raises one completion event (completing an IOCTL_IV_CQ_NOTIFY or
 * queueing a completion-channel event) and disarms. Completions already in
 * the CQ raise the event at once, so "arm, then poll once more" loses none. */
typedef NtStatus (*IvKernelReqNotifyCqFn)(void *context, IvKernelCq *cq, int32_t solicited_only);

/* A CEP callback: the CEP has events; reap them with poll_cep_event until
 * it returns 0. IRQL: DISPATCH_LEVEL. Must not block, nor unregister its
 * own CEP's callback. */
typedef void (*IvKernelCepCallbackFn)(void *callback_context, IvHandle cep, uint64_t user_context);
/* register_cep_callback: from now on the CEP's events are signalled to
 * callback(callback_context, ...) (and IOCTL_IV_GET_CEP_EVENT on it fails
 * with STATUS_INVALID_DEVICE_STATE); called at once if it already has
 * events. Replaces a callback the CEP had, with the rundown of
 * unregister_cep_callback. IRQL <= DISPATCH_LEVEL. */
typedef NtStatus (*IvKernelRegisterCepCallbackFn)(void *context, void *file_object, IvHandle cep,
                                                  IvKernelCepCallbackFn callback,
                                                  void *callback_context);
/* unregister_cep_callback: the CEP's events go back to
 * IOCTL_IV_GET_CEP_EVENT. Returns when the callback is not running and will
 * never be called again for the CEP (it spins while a call runs on another
 * processor). IRQL <= DISPATCH_LEVEL; not from the CEP's own callback. */
typedef NtStatus (*IvKernelUnregisterCepCallbackFn)(void *context, void *file_object,
                                                    IvHandle cep);
/* poll_cep_event: 1 and the CEP's oldest event in *event; 0 when it has
 * none (the callback is re-armed); or a failure NTSTATUS (negative). Never
 * allocates nor blocks. IRQL <= DISPATCH_LEVEL. */
typedef int32_t (*IvKernelPollCepEventFn)(void *context, void *file_object, IvHandle cep,
                                          IvCepEventOut *event);

/* The table. Every function takes `context` first. */
typedef struct IvKernelInterface {
    /* INTERFACE header (wdm.h). */
    uint16_t size;    /* sizeof(IvKernelInterface) */
    uint16_t version; /* IV_KERNEL_INTERFACE_VERSION */
    void *context;
    IvInterfaceReferenceFn interface_reference;
    IvInterfaceReferenceFn interface_dereference;
    /* Objects. */
    IvKernelOpenQpFn open_qp;
    IvKernelCloseQpFn close_qp;
    IvKernelOpenCqFn open_cq;
    IvKernelCloseCqFn close_cq;
    IvKernelOpenSrqFn open_srq;
    IvKernelCloseSrqFn close_srq;
    /* The speed path. */
    IvKernelPostSendFn post_send;
    IvKernelPostRecvFn post_recv;
    IvKernelPostSrqRecvFn post_srq_recv;
    IvKernelPollCqFn poll_cq;
    IvKernelReqNotifyCqFn req_notify_cq;
    /* Version 2: CEP callbacks. */
    IvKernelRegisterCepCallbackFn register_cep_callback;
    IvKernelUnregisterCepCallbackFn unregister_cep_callback;
    IvKernelPollCepEventFn poll_cep_event;
} IvKernelInterface;

/* The size of version 1's table (the fields up to req_notify_cq). */
#define IV_KERNEL_INTERFACE_V1_SIZE ((uint16_t)offsetof(IvKernelInterface, register_cep_callback))

#if defined(_WDMDDK_) || defined(_NTDDK_)
/* Built with the WDK: the table is an INTERFACE. */
C_ASSERT(FIELD_OFFSET(IvKernelInterface, context) == FIELD_OFFSET(INTERFACE, Context));
C_ASSERT(FIELD_OFFSET(IvKernelInterface, interface_dereference) ==
         FIELD_OFFSET(INTERFACE, InterfaceDereference));
#endif

#ifdef __cplusplus
}
#endif

#endif /* IRPVERBS_KERNEL_H */
