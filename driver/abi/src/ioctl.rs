//! IOCTL codes, built as `CTL_CODE(DeviceType, Function, Method, Access)`
//! builds them: `(DeviceType << 16) | (Access << 14) | (Function << 2) | Method`.
//!
//! All codes use device type [`FILE_DEVICE_INFINIBAND`], functions from 0x800
//! (the vendor range) and `METHOD_BUFFERED`. The required access is stated per
//! code: queries need read access, everything that creates, changes or
//! destroys an object needs read and write access. The I/O manager (the host
//! platform, in host mode) checks it against the access the file was opened
//! with before the driver sees the request.
//!
//! The same codes are accepted as `IRP_MJ_DEVICE_CONTROL` (user and kernel
//! callers) and `IRP_MJ_INTERNAL_DEVICE_CONTROL` (kernel callers only).

#[allow(clippy::wildcard_imports)]
use crate::types::*;

/// `FILE_DEVICE_INFINIBAND` from `devioctl.h`.
pub const FILE_DEVICE_INFINIBAND: u32 = 0x0000_003B;
/// `METHOD_BUFFERED`: the I/O manager copies input and output through a system buffer.
pub const METHOD_BUFFERED: u32 = 0;
/// `FILE_ANY_ACCESS`.
pub const FILE_ANY_ACCESS: u32 = 0;
/// `FILE_READ_ACCESS`.
pub const FILE_READ_ACCESS: u32 = 1;
/// `FILE_WRITE_ACCESS`.
pub const FILE_WRITE_ACCESS: u32 = 2;

/// `CTL_CODE` as a const fn, for tools and tests.
#[must_use]
pub const fn ctl_code(device_type: u32, function: u32, method: u32, access: u32) -> u32 {
    (device_type << 16) | (access << 14) | (function << 2) | method
}

/// The device type field of an IOCTL code.
#[must_use]
pub const fn ioctl_device_type(code: u32) -> u32 {
    code >> 16
}

/// The required-access field of an IOCTL code.
#[must_use]
pub const fn ioctl_access(code: u32) -> u32 {
    (code >> 14) & 3
}

/// The function field of an IOCTL code.
#[must_use]
pub const fn ioctl_function(code: u32) -> u32 {
    (code >> 2) & 0xFFF
}

/// The transfer method field of an IOCTL code.
#[must_use]
pub const fn ioctl_method(code: u32) -> u32 {
    code & 3
}

/// Report the ABI version and driver version. In: none. Out: [`IvGetVersionOut`].
pub const IOCTL_IV_GET_VERSION: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | ((FILE_ANY_ACCESS) << 14) | (0x800 << 2) | METHOD_BUFFERED;

/// Query device attributes and limits. In: none. Out: [`IvQueryDeviceOut`].
pub const IOCTL_IV_QUERY_DEVICE: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | ((FILE_READ_ACCESS) << 14) | (0x801 << 2) | METHOD_BUFFERED;

/// Query one port (a command to the HCA). In: [`IvQueryPortIn`]. Out: [`IvQueryPortOut`].
pub const IOCTL_IV_QUERY_PORT: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | ((FILE_READ_ACCESS) << 14) | (0x802 << 2) | METHOD_BUFFERED;

/// Read one GID table entry. In: [`IvQueryGidIn`]. Out: [`IvQueryGidOut`].
pub const IOCTL_IV_QUERY_GID: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | ((FILE_READ_ACCESS) << 14) | (0x803 << 2) | METHOD_BUFFERED;

/// Allocate a protection domain. In: [`IvAllocPdIn`]. Out: [`IvAllocPdOut`].
pub const IOCTL_IV_ALLOC_PD: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x810 << 2)
    | METHOD_BUFFERED;

/// Free a PD; busy while MRs, QPs, SRQs or AHs use it. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DEALLOC_PD: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x811 << 2)
    | METHOD_BUFFERED;

/// Register a virtual memory region. From user mode the range is the
/// caller's memory, locked until the MR is deregistered; only the process
/// that opened the file may register user memory through it
/// (`STATUS_ACCESS_DENIED` for any other, which pins nothing). When that
/// process exits the file is run down, its MRs with it, and every request
/// on the file then fails with `STATUS_PROCESS_IS_TERMINATING`.
/// In: [`IvRegMrIn`]. Out: [`IvRegMrOut`].
pub const IOCTL_IV_REG_MR: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x818 << 2)
    | METHOD_BUFFERED;

/// Deregister an MR. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DEREG_MR: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x819 << 2)
    | METHOD_BUFFERED;

/// Register a physical (bus) address range. Kernel callers only. In: [`IvRegMrIn`]. Out: [`IvRegMrOut`].
pub const IOCTL_IV_REG_PHYS_MR: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x81A << 2)
    | METHOD_BUFFERED;

/// Allocate a memory window (docs/memory-windows.md). In: [`IvAllocMwIn`].
/// Out: [`IvAllocMwOut`].
pub const IOCTL_IV_ALLOC_MW: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x81B << 2)
    | METHOD_BUFFERED;

/// Deallocate a memory window (a bound one is unbound). In: [`IvHandleIn`].
/// Out: none.
pub const IOCTL_IV_DEALLOC_MW: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x81C << 2)
    | METHOD_BUFFERED;

/// Bind (or, with length 0, unbind) a type 1 memory window. In:
/// [`IvBindMwIn`]. Out: [`IvBindMwOut`].
pub const IOCTL_IV_BIND_MW: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x81D << 2)
    | METHOD_BUFFERED;

/// Allocate an MR for fast registration (docs/fast-registration.md):
/// free, with keys whose low 8 bits an `IV_WR_REG_MR` work request
/// chooses. Kernel callers only (its page lists name physical or logical
/// addresses, as `IOCTL_IV_REG_PHYS_MR`'s ranges). `STATUS_INVALID_PARAMETER`
/// for a `max_num_sg` of 0 or above `max_fast_reg_page_list_len`, or a
/// reserved field set; `STATUS_INVALID_HANDLE` for a bad PD. Deregistered
/// by `IOCTL_IV_DEREG_MR`. In: [`IvAllocMrIn`]. Out: [`IvRegMrOut`].
pub const IOCTL_IV_ALLOC_MR: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x81E << 2)
    | METHOD_BUFFERED;

/// Create a completion queue. In: [`IvCreateCqIn`]. Out: [`IvCreateCqOut`].
pub const IOCTL_IV_CREATE_CQ: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x820 << 2)
    | METHOD_BUFFERED;

/// Resize a CQ. In: [`IvResizeCqIn`]. Out: [`IvResizeCqOut`].
pub const IOCTL_IV_RESIZE_CQ: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x821 << 2)
    | METHOD_BUFFERED;

/// Destroy a CQ; busy while a QP uses it. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DESTROY_CQ: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x822 << 2)
    | METHOD_BUFFERED;

/// Create a queue pair (RC, UC, UD). In: [`IvCreateQpIn`]. Out: [`IvCreateQpOut`].
pub const IOCTL_IV_CREATE_QP: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x828 << 2)
    | METHOD_BUFFERED;

/// Move a QP through the IBTA state machine. In: [`IvModifyQpIn`]. Out: none.
pub const IOCTL_IV_MODIFY_QP: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x829 << 2)
    | METHOD_BUFFERED;

/// Query a QP's state and attributes (a command to the HCA). In: [`IvHandleIn`]. Out: [`IvQueryQpOut`].
pub const IOCTL_IV_QUERY_QP: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | ((FILE_READ_ACCESS) << 14) | (0x82A << 2) | METHOD_BUFFERED;

/// Destroy a QP. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DESTROY_QP: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x82B << 2)
    | METHOD_BUFFERED;

/// Create a shared receive queue. In: [`IvCreateSrqIn`]. Out: [`IvCreateSrqOut`].
pub const IOCTL_IV_CREATE_SRQ: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x830 << 2)
    | METHOD_BUFFERED;

/// Resize an SRQ or set its limit. In: [`IvModifySrqIn`]. Out: none.
pub const IOCTL_IV_MODIFY_SRQ: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x831 << 2)
    | METHOD_BUFFERED;

/// Query an SRQ. In: [`IvHandleIn`]. Out: [`IvQuerySrqOut`].
pub const IOCTL_IV_QUERY_SRQ: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | ((FILE_READ_ACCESS) << 14) | (0x832 << 2) | METHOD_BUFFERED;

/// Destroy an SRQ; busy while a QP uses it. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DESTROY_SRQ: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x833 << 2)
    | METHOD_BUFFERED;

/// Create an address handle. In: [`IvCreateAhIn`]. Out: [`IvCreateAhOut`].
pub const IOCTL_IV_CREATE_AH: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x838 << 2)
    | METHOD_BUFFERED;

/// Destroy an AH. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DESTROY_AH: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x839 << 2)
    | METHOD_BUFFERED;

/// Wait for an event on one CQ (arming it first if asked). Pended; cancelable. Completes with `STATUS_DELETE_PENDING` if the CQ is destroyed, `STATUS_DATA_OVERRUN` if it fails. In: [`IvCqNotifyIn`]. Out: [`IvCqEventOut`].
pub const IOCTL_IV_CQ_NOTIFY: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x824 << 2)
    | METHOD_BUFFERED;

/// Create a completion channel. In: [`IvAllocPdIn`]. Out: [`IvCreateChannelOut`].
pub const IOCTL_IV_CREATE_CHANNEL: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x840 << 2)
    | METHOD_BUFFERED;

/// Destroy a completion channel; busy while CQs are bound to it. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DESTROY_CHANNEL: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x841 << 2)
    | METHOD_BUFFERED;

/// Take the next CQ event of a channel. Pended until there is one; cancelable. In: [`IvHandleIn`] (the channel). Out: [`IvCqEventOut`].
pub const IOCTL_IV_GET_CQ_EVENT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x842 << 2)
    | METHOD_BUFFERED;

/// Acknowledge CQ events; a CQ with unacknowledged events cannot be destroyed. In: [`IvAckIn`]. Out: none.
pub const IOCTL_IV_ACK_CQ_EVENTS: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x843 << 2)
    | METHOD_BUFFERED;

/// Take the next async event of this file. Pended until there is one; cancelable. In: none. Out: [`IvAsyncEventOut`].
pub const IOCTL_IV_GET_ASYNC_EVENT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x848 << 2)
    | METHOD_BUFFERED;

/// Acknowledge async events; an object with unacknowledged events cannot be destroyed. In: [`IvAckIn`]. Out: none.
pub const IOCTL_IV_ACK_ASYNC_EVENT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x849 << 2)
    | METHOD_BUFFERED;

/// Map the rings of a CQ, QP or SRQ into the caller's address space: a
/// user-mode caller's create (and resize) responses carry the rings'
/// geometry with zero addresses, and this returns the addresses, the same
/// ones on every call for the same ring. The mapping lasts until the object
/// is destroyed (or, for a CQ, resized) and the caller's next request on the
/// file, or until the file's cleanup or its opener's exit; only the process
/// that opened the file may map (`STATUS_ACCESS_DENIED` for any other).
/// Kernel callers get the kernel addresses their create responses carry.
/// In: [`IvHandleIn`] (a CQ, QP or SRQ). Out: [`IvMapRingsOut`].
pub const IOCTL_IV_MAP_RINGS: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x850 << 2)
    | METHOD_BUFFERED;

/// Map the file's doorbell page (`IvDoorbellPage`) into the caller's
/// address space: the page through which a user-mode ULP rings its queues'
/// doorbells with no system call. Served in the caller's context for
/// user-mode callers only (kernel ULPs ring the direct-call table's
/// doorbells: `STATUS_NOT_SUPPORTED`), as `IOCTL_IV_MAP_RINGS` is, with the
/// same process binding and lifetime: one page per file, the same address on
/// every call, mapped until the file's cleanup. Rings mapped after it come
/// with their doorbell slots in the page; map it first.
/// `STATUS_NOT_SUPPORTED` from an HCA without doorbell pages. In: none.
/// Out: [`IvMapDoorbellsOut`].
pub const IOCTL_IV_MAP_DOORBELLS: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x851 << 2)
    | METHOD_BUFFERED;

/// Ring the file's doorbell page now: the HCA takes every slot rung in the
/// page (and in every other page) at once, as its poller would, and its
/// poller starts polling the pages again. A user-mode ULP issues it after
/// ringing a slot when the page's `polling` word reads 0 (after a full
/// fence): the HCA is not polling, and without this call would see the
/// doorbell only when it next looks. While `polling` is nonzero no call is
/// needed. Completed in the caller's context, with no buffers: the cheapest
/// IOCTL. `STATUS_NOT_SUPPORTED` from kernel callers (they ring the
/// direct-call doorbells) and from an HCA without doorbell pages;
/// `STATUS_INVALID_DEVICE_STATE` when the file has no doorbell page
/// (`IOCTL_IV_MAP_DOORBELLS` first). In: none. Out: none.
pub const IOCTL_IV_RING_DOORBELLS: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x852 << 2)
    | METHOD_BUFFERED;

/// Create a connection endpoint (CEP) of the device's connection manager. In: [`IvCreateCepIn`]. Out: [`IvCreateCepOut`].
pub const IOCTL_IV_CREATE_CEP: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x860 << 2)
    | METHOD_BUFFERED;

/// Listen on a service ID with an idle CEP; `STATUS_INVALID_DEVICE_STATE` if the CEP is not idle, `STATUS_DEVICE_BUSY` if the service ID has a listener. In: [`IvListenIn`]. Out: none.
pub const IOCTL_IV_LISTEN: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x861 << 2)
    | METHOD_BUFFERED;

/// Take the next event of a CEP. Pended until there is one; cancelable; one at a time per CEP (a second gets `STATUS_DEVICE_BUSY`); completes with `STATUS_CANCELLED` if the CEP is destroyed. In: [`IvHandleIn`] (the CEP). Out: [`IvCepEventOut`].
pub const IOCTL_IV_GET_CEP_EVENT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x862 << 2)
    | METHOD_BUFFERED;

/// Destroy a CEP: its connection is abandoned (a REJ or DREQ goes out as the state asks) and its pended request completes with `STATUS_CANCELLED`. In: [`IvHandleIn`]. Out: none.
pub const IOCTL_IV_DESTROY_CEP: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x863 << 2)
    | METHOD_BUFFERED;

/// Connect an RC QP through the CM, as one request: the QP to INIT, the REQ; on the REP the QP to RTR and RTS, the RTU; then it completes (the REP is also queued as `IV_CEP_EVENT_REPLY`, a REJ as `IV_CEP_EVENT_REJECTED`, with their private data). The REQ carries the request's private data and parameters; bad values, non-zero reserved fields or a QP that is not RC: `STATUS_INVALID_PARAMETER`; a CEP that is not idle or a QP that is not in RESET: `STATUS_INVALID_DEVICE_STATE` (a QP with a modify in flight: `STATUS_DEVICE_BUSY`); a `local_gid` that is not entry `sgid_index` of port 1's GID table (whatever the index): `STATUS_INVALID_ADDRESS`; each changes nothing. `STATUS_CONNECTION_REFUSED` on a REJ, `STATUS_IO_TIMEOUT` when the CM gave up, `STATUS_CANCELLED` when the CEP is destroyed, a QP modify's status if one fails. Without a QP handle (`qp` zero, the QP's number in `qpn`), the caller moves its QP itself (`IOCTL_IV_CM_INIT_QP_ATTR`): no QP is touched, the request completes on the REP (queued as `IV_CEP_EVENT_REPLY`), and `IOCTL_IV_CM_ESTABLISH` sends the RTU once the caller's QP is in RTS. In: [`IvCmConnectIn`]. Out: none.
pub const IOCTL_IV_CM_CONNECT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x864 << 2)
    | METHOD_BUFFERED;

/// Accept a connect request, as one request: the QP to INIT, RTR and RTS with the REQ's attributes, the REP (with the request's private data and parameters); completes on the RTU. Fails as `IOCTL_IV_CM_CONNECT` (the QP must be an RC QP in RESET; a CEP without an unanswered connect request: `STATUS_INVALID_DEVICE_STATE`). Without a QP handle (`qp` zero, the QP's number in `qpn`), the caller moves its QP itself (`IOCTL_IV_CM_INIT_QP_ATTR`, before or after this request): the REP goes at once and the request completes on the RTU; no QP is touched. In: [`IvCmAcceptIn`]. Out: none.
pub const IOCTL_IV_CM_ACCEPT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x865 << 2)
    | METHOD_BUFFERED;

/// Reject a connect request (or a REP) with a reason, additional rejection information and private data; completes at once. `STATUS_INVALID_PARAMETER` for a reason above 0xFFFF, too much ARI or private data, or non-zero reserved fields. In: [`IvCmRejectIn`]. Out: none.
pub const IOCTL_IV_CM_REJECT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x866 << 2)
    | METHOD_BUFFERED;

/// Disconnect, as one request. Established: the DREQ (with the private data), the QP to ERR (flushing it); completes on the DREP (`STATUS_IO_TIMEOUT` when the DREQ's retries ran out). After `IV_CEP_EVENT_DISCONNECT_REQUEST`: the QP to ERR, the DREP (with the private data); then it completes. A connection whose QP the caller moves itself: the same without the QP (the caller moves it to ERR). `STATUS_INVALID_PARAMETER` for too much private data or non-zero reserved fields. In: [`IvCmDisconnectIn`]. Out: none.
pub const IOCTL_IV_CM_DISCONNECT: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x867 << 2)
    | METHOD_BUFFERED;

/// Send an MRA for a connect request not yet answered (`IV_CEP_EVENT_CONNECT_REQUEST`): the requester waits up to 4.096 us * 2^`service_timeout` more for the REP (its connect does not time out meanwhile; the MRA goes again if the REQ comes again). Completes at once. `STATUS_INVALID_DEVICE_STATE` if the CEP has no unanswered connect request, `STATUS_INVALID_PARAMETER` for a bad value. In: [`IvCmMraIn`]. Out: none.
pub const IOCTL_IV_CM_MRA: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x870 << 2)
    | METHOD_BUFFERED;

/// Service ID resolution (SIDR), as one request: sends the SIDR_REQ from an idle CEP and completes with the SIDR_REP (`STATUS_SUCCESS`; its status says whether the QP serves the service); `STATUS_IO_TIMEOUT` when the retries ran out, `STATUS_CANCELLED` when the CEP is destroyed; cancelable. In: [`IvSidrRequestIn`]. Out: [`IvSidrRequestOut`].
pub const IOCTL_IV_SIDR_REQUEST: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x871 << 2)
    | METHOD_BUFFERED;

/// Answer a SIDR request (`IV_CEP_EVENT_SIDR_REQUEST`) with the UD QP and Q_Key that serve the service, or a status; completes at once (the CEP is idle again). In: [`IvSidrReplyIn`]. Out: none.
pub const IOCTL_IV_SIDR_REPLY: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x872 << 2)
    | METHOD_BUFFERED;

/// Propose an alternate path for an established connection (a LAP), as
/// one request (docs/path-migration.md): the LAP goes (retransmitted as
/// the CM's timeouts say) and the request waits for the APR; accepted, the
/// CEP's QP loads the alternate path and arms it (RTS to RTS with
/// `IV_QP_ALT_PATH` and REARM), then it completes with `STATUS_SUCCESS`;
/// rejected, `STATUS_CONNECTION_REFUSED`. The APR is queued as
/// `IV_CEP_EVENT_APR` either way (its status and information).
/// `STATUS_IO_TIMEOUT` when the LAP's retries ran out, `STATUS_CANCELLED`
/// when the CEP is destroyed; cancelable. `STATUS_INVALID_DEVICE_STATE` for
/// a CEP that is not established with a QP or has a LAP in progress,
/// `STATUS_INVALID_PARAMETER` for a bad value, too much private data or
/// non-zero reserved fields, `STATUS_INVALID_ADDRESS` when the port's GID
/// table entry `alt_sgid_index` is not `alt_local_gid` (no LAP leaves);
/// each changes nothing. In: [`IvCmLapIn`].
/// Out: none.
pub const IOCTL_IV_CM_LAP: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x873 << 2)
    | METHOD_BUFFERED;

/// Answer a LAP (`IV_CEP_EVENT_LAP`) with an APR. Accepted: the CEP's QP
/// loads the alternate path and arms it first, then the APR goes and the
/// request completes (a modify that fails sends a rejecting APR and is the
/// request's status); rejected: the APR with the status goes at once.
/// `STATUS_INVALID_DEVICE_STATE` for a CEP with no LAP to answer,
/// `STATUS_INVALID_PARAMETER` for a status past `IV_CM_APR_MAX_STATUS`,
/// information with an acceptance, too much information or private data,
/// or non-zero reserved fields; each changes nothing. In: [`IvCmAprIn`].
/// Out: none.
pub const IOCTL_IV_CM_APR: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x874 << 2)
    | METHOD_BUFFERED;

/// The attributes and mask that move the QP of a CEP's connection to
/// INIT, RTR or RTS, for a caller that moves its QP itself (a
/// `CM_CONNECT` or `CM_ACCEPT` without a QP handle), as the IB CM's
/// `ib_cm_init_qp_attr` gives them: INIT once the CEP sent or received a
/// REQ; RTR and RTS once the REP arrived (active side) or from the REQ
/// received (passive side; RTS's send PSN is the request's
/// `starting_psn` until the CEP accepted, then its accept's), until the
/// CEP leaves the connection. Answered at once, also while a request is
/// in progress on the CEP; changes nothing. `STATUS_INVALID_PARAMETER` for
/// another state or a PSN above 24 bits, `STATUS_INVALID_DEVICE_STATE`
/// when the CEP's state does not give the attributes (idle, listening,
/// disconnected). IRQL: <= DISPATCH_LEVEL. In: [`IvCmInitQpAttrIn`].
/// Out: [`IvCmInitQpAttrOut`].
pub const IOCTL_IV_CM_INIT_QP_ATTR: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | (FILE_READ_ACCESS << 14) | (0x875 << 2) | METHOD_BUFFERED;

/// Completes an active connection whose QP the caller moves itself: after
/// its `CM_CONNECT` (without a QP handle) completed on the REP and the
/// caller moved its QP to RTS, sends the RTU (the connection is
/// established; the remote's accept completes on it). Completes at once.
/// `STATUS_INVALID_DEVICE_STATE` for a CEP that did not receive a REP it
/// has not answered, or whose connect moves a QP of its own (that one
/// sends the RTU itself); `STATUS_DEVICE_BUSY` while a request is in
/// progress on the CEP; each changes nothing. IRQL: <= DISPATCH_LEVEL.
/// In: [`IvHandleIn`] (the CEP). Out: none.
pub const IOCTL_IV_CM_ESTABLISH: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x876 << 2)
    | METHOD_BUFFERED;

/// Resolve an IP address (IPv4 or IPv6) to the local port, source GID and
/// path that reach it, as rdma_cm's address and route resolution do for
/// RoCEv2: the device reads its ports and GID tables from the HCA (one
/// command after another, asynchronously) and answers. The source is the
/// GID equal to the source address if one is given, else the GID equal to
/// the destination (loopback), else the first GID of the destination's
/// family; only active Ethernet ports count. Changes nothing.
/// `STATUS_INVALID_PARAMETER` (a bad family, non-zero reserved bytes or
/// address padding, an unspecified, multicast or broadcast destination, a
/// source of the other family), `STATUS_INVALID_ADDRESS` (no port owns the
/// source), `STATUS_NETWORK_UNREACHABLE` (no address of the family).
/// IRQL: <= DISPATCH_LEVEL. In: [`IvResolveAddrIn`]. Out: [`IvResolveAddrOut`].
pub const IOCTL_IV_RESOLVE_ADDR: u32 =
    (FILE_DEVICE_INFINIBAND << 16) | (FILE_READ_ACCESS << 14) | (0x880 << 2) | METHOD_BUFFERED;

/// Listen on a service ID with an idle CEP for REQs addressed to one GID
/// (rdma_cm's listen on a bound address; all zero: any of the device's).
/// Listeners on different GIDs share a service ID: a REQ goes to the one
/// bound to the GID its primary path names as the passive side's, else to
/// the one on any GID, else it is rejected (REJ reason 8, invalid service
/// ID) and seen by none. `STATUS_ADDRESS_ALREADY_EXISTS` if the service ID
/// has a listener on that GID, or (all zero) any listener, or a listener on
/// any GID (as a wildcard and a specific socket address conflict),
/// `STATUS_INVALID_ADDRESS` if the GID is not in the GID table of an
/// active port of the device (the tables are read, one command per entry,
/// before the listen), `STATUS_INVALID_DEVICE_STATE` if the CEP is not
/// idle, `STATUS_INVALID_HANDLE`. IRQL: <= DISPATCH_LEVEL.
/// In: [`IvListenAddrIn`]. Out: none.
pub const IOCTL_IV_LISTEN_ADDR: u32 = (FILE_DEVICE_INFINIBAND << 16)
    | ((FILE_READ_ACCESS | FILE_WRITE_ACCESS) << 14)
    | (0x881 << 2)
    | METHOD_BUFFERED;

/// What the driver knows of one IOCTL: its name, code, exact input size,
/// minimum output size, and whether user-mode callers are refused.
///
/// cbindgen:ignore
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoctlInfo {
    /// Symbolic name without the `IOCTL_IV_` prefix.
    pub name: &'static str,
    /// The IOCTL code.
    pub code: u32,
    /// Exact input buffer length the request takes.
    pub input_len: usize,
    /// Minimum output buffer length (the response struct's size).
    pub output_len: usize,
    /// Kernel callers only; a user-mode caller gets `STATUS_ACCESS_DENIED`.
    pub kernel_only: bool,
}

/// Every IOCTL this ABI version defines.
///
/// cbindgen:ignore
pub const IOCTLS: &[IoctlInfo] = &[
    IoctlInfo {
        name: "GET_VERSION",
        code: IOCTL_IV_GET_VERSION,
        input_len: core::mem::size_of::<()>(),
        output_len: core::mem::size_of::<IvGetVersionOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "QUERY_DEVICE",
        code: IOCTL_IV_QUERY_DEVICE,
        input_len: core::mem::size_of::<()>(),
        output_len: core::mem::size_of::<IvQueryDeviceOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "QUERY_PORT",
        code: IOCTL_IV_QUERY_PORT,
        input_len: core::mem::size_of::<IvQueryPortIn>(),
        output_len: core::mem::size_of::<IvQueryPortOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "QUERY_GID",
        code: IOCTL_IV_QUERY_GID,
        input_len: core::mem::size_of::<IvQueryGidIn>(),
        output_len: core::mem::size_of::<IvQueryGidOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "ALLOC_PD",
        code: IOCTL_IV_ALLOC_PD,
        input_len: core::mem::size_of::<IvAllocPdIn>(),
        output_len: core::mem::size_of::<IvAllocPdOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DEALLOC_PD",
        code: IOCTL_IV_DEALLOC_PD,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "REG_MR",
        code: IOCTL_IV_REG_MR,
        input_len: core::mem::size_of::<IvRegMrIn>(),
        output_len: core::mem::size_of::<IvRegMrOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DEREG_MR",
        code: IOCTL_IV_DEREG_MR,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "REG_PHYS_MR",
        code: IOCTL_IV_REG_PHYS_MR,
        input_len: core::mem::size_of::<IvRegMrIn>(),
        output_len: core::mem::size_of::<IvRegMrOut>(),
        kernel_only: true,
    },
    IoctlInfo {
        name: "ALLOC_MW",
        code: IOCTL_IV_ALLOC_MW,
        input_len: core::mem::size_of::<IvAllocMwIn>(),
        output_len: core::mem::size_of::<IvAllocMwOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DEALLOC_MW",
        code: IOCTL_IV_DEALLOC_MW,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "BIND_MW",
        code: IOCTL_IV_BIND_MW,
        input_len: core::mem::size_of::<IvBindMwIn>(),
        output_len: core::mem::size_of::<IvBindMwOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "ALLOC_MR",
        code: IOCTL_IV_ALLOC_MR,
        input_len: core::mem::size_of::<IvAllocMrIn>(),
        output_len: core::mem::size_of::<IvRegMrOut>(),
        kernel_only: true,
    },
    IoctlInfo {
        name: "CREATE_CQ",
        code: IOCTL_IV_CREATE_CQ,
        input_len: core::mem::size_of::<IvCreateCqIn>(),
        output_len: core::mem::size_of::<IvCreateCqOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "RESIZE_CQ",
        code: IOCTL_IV_RESIZE_CQ,
        input_len: core::mem::size_of::<IvResizeCqIn>(),
        output_len: core::mem::size_of::<IvResizeCqOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DESTROY_CQ",
        code: IOCTL_IV_DESTROY_CQ,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CREATE_QP",
        code: IOCTL_IV_CREATE_QP,
        input_len: core::mem::size_of::<IvCreateQpIn>(),
        output_len: core::mem::size_of::<IvCreateQpOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "MODIFY_QP",
        code: IOCTL_IV_MODIFY_QP,
        input_len: core::mem::size_of::<IvModifyQpIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "QUERY_QP",
        code: IOCTL_IV_QUERY_QP,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<IvQueryQpOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DESTROY_QP",
        code: IOCTL_IV_DESTROY_QP,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CREATE_SRQ",
        code: IOCTL_IV_CREATE_SRQ,
        input_len: core::mem::size_of::<IvCreateSrqIn>(),
        output_len: core::mem::size_of::<IvCreateSrqOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "MODIFY_SRQ",
        code: IOCTL_IV_MODIFY_SRQ,
        input_len: core::mem::size_of::<IvModifySrqIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "QUERY_SRQ",
        code: IOCTL_IV_QUERY_SRQ,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<IvQuerySrqOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DESTROY_SRQ",
        code: IOCTL_IV_DESTROY_SRQ,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CREATE_AH",
        code: IOCTL_IV_CREATE_AH,
        input_len: core::mem::size_of::<IvCreateAhIn>(),
        output_len: core::mem::size_of::<IvCreateAhOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DESTROY_AH",
        code: IOCTL_IV_DESTROY_AH,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CQ_NOTIFY",
        code: IOCTL_IV_CQ_NOTIFY,
        input_len: core::mem::size_of::<IvCqNotifyIn>(),
        output_len: core::mem::size_of::<IvCqEventOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CREATE_CHANNEL",
        code: IOCTL_IV_CREATE_CHANNEL,
        input_len: core::mem::size_of::<IvAllocPdIn>(),
        output_len: core::mem::size_of::<IvCreateChannelOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DESTROY_CHANNEL",
        code: IOCTL_IV_DESTROY_CHANNEL,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "GET_CQ_EVENT",
        code: IOCTL_IV_GET_CQ_EVENT,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<IvCqEventOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "ACK_CQ_EVENTS",
        code: IOCTL_IV_ACK_CQ_EVENTS,
        input_len: core::mem::size_of::<IvAckIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "GET_ASYNC_EVENT",
        code: IOCTL_IV_GET_ASYNC_EVENT,
        input_len: core::mem::size_of::<()>(),
        output_len: core::mem::size_of::<IvAsyncEventOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "ACK_ASYNC_EVENT",
        code: IOCTL_IV_ACK_ASYNC_EVENT,
        input_len: core::mem::size_of::<IvAckIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "MAP_RINGS",
        code: IOCTL_IV_MAP_RINGS,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<IvMapRingsOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "MAP_DOORBELLS",
        code: IOCTL_IV_MAP_DOORBELLS,
        input_len: core::mem::size_of::<()>(),
        output_len: core::mem::size_of::<IvMapDoorbellsOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "RING_DOORBELLS",
        code: IOCTL_IV_RING_DOORBELLS,
        input_len: core::mem::size_of::<()>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CREATE_CEP",
        code: IOCTL_IV_CREATE_CEP,
        input_len: core::mem::size_of::<IvCreateCepIn>(),
        output_len: core::mem::size_of::<IvCreateCepOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "LISTEN",
        code: IOCTL_IV_LISTEN,
        input_len: core::mem::size_of::<IvListenIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "GET_CEP_EVENT",
        code: IOCTL_IV_GET_CEP_EVENT,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<IvCepEventOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_CONNECT",
        code: IOCTL_IV_CM_CONNECT,
        input_len: core::mem::size_of::<IvCmConnectIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_ACCEPT",
        code: IOCTL_IV_CM_ACCEPT,
        input_len: core::mem::size_of::<IvCmAcceptIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_REJECT",
        code: IOCTL_IV_CM_REJECT,
        input_len: core::mem::size_of::<IvCmRejectIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_DISCONNECT",
        code: IOCTL_IV_CM_DISCONNECT,
        input_len: core::mem::size_of::<IvCmDisconnectIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "DESTROY_CEP",
        code: IOCTL_IV_DESTROY_CEP,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_MRA",
        code: IOCTL_IV_CM_MRA,
        input_len: core::mem::size_of::<IvCmMraIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "SIDR_REQUEST",
        code: IOCTL_IV_SIDR_REQUEST,
        input_len: core::mem::size_of::<IvSidrRequestIn>(),
        output_len: core::mem::size_of::<IvSidrRequestOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "SIDR_REPLY",
        code: IOCTL_IV_SIDR_REPLY,
        input_len: core::mem::size_of::<IvSidrReplyIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_LAP",
        code: IOCTL_IV_CM_LAP,
        input_len: core::mem::size_of::<IvCmLapIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_APR",
        code: IOCTL_IV_CM_APR,
        input_len: core::mem::size_of::<IvCmAprIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_INIT_QP_ATTR",
        code: IOCTL_IV_CM_INIT_QP_ATTR,
        input_len: core::mem::size_of::<IvCmInitQpAttrIn>(),
        output_len: core::mem::size_of::<IvCmInitQpAttrOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "CM_ESTABLISH",
        code: IOCTL_IV_CM_ESTABLISH,
        input_len: core::mem::size_of::<IvHandleIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "RESOLVE_ADDR",
        code: IOCTL_IV_RESOLVE_ADDR,
        input_len: core::mem::size_of::<IvResolveAddrIn>(),
        output_len: core::mem::size_of::<IvResolveAddrOut>(),
        kernel_only: false,
    },
    IoctlInfo {
        name: "LISTEN_ADDR",
        code: IOCTL_IV_LISTEN_ADDR,
        input_len: core::mem::size_of::<IvListenAddrIn>(),
        output_len: core::mem::size_of::<()>(),
        kernel_only: false,
    },
];

/// The first function code of this ABI's IOCTLs.
const FUNCTION_BASE: u32 = 0x800;

/// Function codes `FUNCTION_BASE..FUNCTION_BASE + 256` to their index in
/// [`IOCTLS`] (`u8::MAX`: none), built at compile time; a code outside the
/// range or a duplicate function fails the build.
const BY_FUNCTION: [u8; 256] = {
    let mut table = [u8::MAX; 256];
    assert!(IOCTLS.len() < u8::MAX as usize);
    let mut i = 0;
    while i < IOCTLS.len() {
        let f = ioctl_function(IOCTLS[i].code);
        assert!(f >= FUNCTION_BASE && f < FUNCTION_BASE + 256);
        let slot = (f - FUNCTION_BASE) as usize;
        assert!(table[slot] == u8::MAX, "two IOCTLs share a function code");
        table[slot] = i as u8;
        i += 1;
    }
    table
};

/// Looks up an IOCTL by code (by its function code, in constant time; the
/// whole code must match: device type, method and access too).
#[must_use]
pub fn ioctl_info(code: u32) -> Option<&'static IoctlInfo> {
    let slot = ioctl_function(code).checked_sub(FUNCTION_BASE)? as usize;
    let index = *BY_FUNCTION.get(slot)?;
    IOCTLS
        .get(usize::from(index))
        .filter(|info| info.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constant-time lookup answers as a search of the table does,
    /// for every defined code and for codes that differ from one in any
    /// field.
    #[test]
    fn lookup_by_function_matches_the_table() {
        for info in IOCTLS {
            assert_eq!(ioctl_info(info.code).map(|i| i.name), Some(info.name));
            for bit in 0..32 {
                let other = info.code ^ (1 << bit);
                let want = IOCTLS.iter().find(|i| i.code == other).map(|i| i.name);
                assert_eq!(ioctl_info(other).map(|i| i.name), want, "{other:#x}");
            }
        }
        for code in [
            0,
            u32::MAX,
            0x0022_2000,
            ctl_code(FILE_DEVICE_INFINIBAND, 0x7FF, 0, 0),
        ] {
            assert_eq!(ioctl_info(code).map(|i| i.name), None);
        }
    }

    #[test]
    fn codes_are_ctl_codes_of_the_infiniband_device_type() {
        for info in IOCTLS {
            assert_eq!(
                ioctl_device_type(info.code),
                FILE_DEVICE_INFINIBAND,
                "{}",
                info.name
            );
            assert_eq!(ioctl_method(info.code), METHOD_BUFFERED, "{}", info.name);
            assert!(ioctl_function(info.code) >= 0x800, "{}", info.name);
            let rebuilt = ctl_code(
                FILE_DEVICE_INFINIBAND,
                ioctl_function(info.code),
                METHOD_BUFFERED,
                ioctl_access(info.code),
            );
            assert_eq!(rebuilt, info.code, "{}", info.name);
        }
    }

    #[test]
    fn codes_are_unique_and_access_matches_the_verb() {
        for (i, a) in IOCTLS.iter().enumerate() {
            for b in &IOCTLS[i + 1..] {
                assert_ne!(a.code, b.code, "{} and {}", a.name, b.name);
            }
            let writes = !(a.name.starts_with("QUERY")
                || a.name == "GET_VERSION"
                || a.name == "RESOLVE_ADDR"
                || a.name == "CM_INIT_QP_ATTR");
            let want = if a.name == "GET_VERSION" {
                FILE_ANY_ACCESS
            } else if writes {
                FILE_READ_ACCESS | FILE_WRITE_ACCESS
            } else {
                FILE_READ_ACCESS
            };
            assert_eq!(ioctl_access(a.code), want, "{}", a.name);
        }
    }

    #[test]
    fn known_code_value() {
        // CTL_CODE(0x3B, 0x810, METHOD_BUFFERED, FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        assert_eq!(IOCTL_IV_ALLOC_PD, 0x003B_E040);
        assert_eq!(
            ioctl_info(IOCTL_IV_ALLOC_PD).map(|i| i.name),
            Some("ALLOC_PD")
        );
        assert!(ioctl_info(0x0022_0000).is_none());
    }
}
