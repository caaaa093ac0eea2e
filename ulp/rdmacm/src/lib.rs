//! # irpverbs librdmacm
//!
//! `librdmacm.so.1` over irpverbs: rdma-core's librdmacm ABI — the
//! structures of `<rdma/rdma_cma.h>` ([`abi`]), the exported functions
//! with rdma-core's symbol versions (`librdmacm.map`) — implemented over
//! the driver's connection manager:
//!
//! - the device is the one `libibverbs.so.1` of this repository
//!   (`ulp/ibverbs`) opens: this library is linked against it
//!   (`DT_NEEDED`, as rdma-core's is), opens `irpverbs0` with
//!   `ibv_open_device`, creates QPs, CQs and channels with its functions,
//!   and issues the CM's IOCTLs (`IOCTL_IV_CREATE_CEP`,
//!   `IOCTL_IV_RESOLVE_ADDR`, `IOCTL_IV_LISTEN_ADDR`, `IOCTL_IV_CM_*`,
//!   `IOCTL_IV_SIDR_*`, `IOCTL_IV_GET_CEP_EVENT`) on that context's device
//!   file through its private `irpverbs_ioctl`;
//! - an event channel's `fd` is an eventfd in semaphore mode: it works with
//!   `poll`, `epoll` and `O_NONBLOCK`; each event counts one;
//! - the driver's CM requests are multi-phase and wait (a connect completes
//!   when the connection is established); each id runs its waiting
//!   requests on a thread of its own, which turns their completions and
//!   the CEP's events into rdma_cm's events on the id's channel, in
//!   rdma_cm's order (`docs/rdmacm.md`).
//!
//! Service IDs come from ports as IBTA's IP CM annex (A11) defines them
//! (`RDMA_PS_TCP`: `0x0000_0000_0106_0000 | port`), and the REQ's (and
//! SIDR_REQ's) private data starts with the annex's IP CM header, so the
//! listener learns the peer's address (`irpverbs_verbs::rdma_cm`).
//!
//! Errors follow rdma-core: `int` functions return 0, or -1 with `errno`
//! (`EINVAL` for NULL or out-of-sequence calls, `EADDRINUSE` for a port
//! with a listener, ...); none crashes on a NULL it is given.
#![allow(unsafe_code, clippy::missing_safety_doc)]

/// rdma-core's structures of `<rdma/rdma_cma.h>` and the verbs ones they
/// embed (`irpverbs-rdma-abi`, shared with libibverbs).
pub mod abi {
    pub use irpverbs_rdma_abi::cma::*;
    pub use irpverbs_rdma_abi::verbs::*;
}
mod addrinfo;
mod channel;
mod device;
mod id;
mod os;
mod qp;

use std::ffi::c_int;

pub(crate) use os::set_errno;

/// -1 with `errno` = `e`, as rdma-core's `ERR(e)`.
pub(crate) fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

/// 0, or -1 with `errno`.
pub(crate) fn ret(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}
