//! # irpverbs verbs
//!
//! Verbs for ULPs, in three parts:
//! - typed control verbs ([`Client`]: `alloc_pd`, `create_qp`, `modify_qp`,
//!   ...) over any transport that carries an irpverbs IOCTL:
//!   `DeviceIoControl` on Windows, the in-process host device, or a test
//!   double. One method per IOCTL; each returns the response struct or the
//!   NTSTATUS the driver completed with;
//! - the speed path ([`speed`]): over a [`SpeedPath`] transport, the client
//!   also creates [`Qp`], [`Cq`] and [`Srq`] objects whose `post_send`,
//!   `post_recv`, `poll` and `req_notify` are direct calls on the rings the
//!   driver mapped into the caller (`IOCTL_IV_MAP_RINGS`, right after the
//!   create), plus a doorbell: no IOCTL per message;
//! - completion channels ([`CompChannel`]): the CQ events of armed CQs
//!   created on a channel, taken in order and acknowledged, as libibverbs'
//!   `ibv_comp_channel`;
//! - the kernel ULPs' direct-call function table ([`kernel`],
//!   `include/irpverbs_kernel.h`), which a driver hands out through query
//!   interface.
//!
//! The ring views and the kernel table are `irpverbs-kernel-table`'s
//! (`no_std`, shared with the drivers), re-exported here. `unsafe` appears
//! here only where the safe objects turn their mapped rings into views (the
//! views' `from_create` / `from_map` constructors, called under the
//! [`SpeedPath`] contract).
#![deny(unsafe_code)]

mod channel;
pub mod devinfo;
pub use irpverbs_kernel_table::kernel;
mod objects;
pub mod rdma_cm;
pub mod speed;

use std::sync::{Mutex, PoisonError};

use irpverbs_abi::*;
use zerocopy::{FromBytes, Immutable, IntoBytes};

pub use channel::CompChannel;
pub use objects::{Cq, Qp, Srq};
pub use speed::{
    AsNtStatus, Bell, CqRings, Doorbells, PageDoorbells, PostError, QpRings, RecvWr, SendWr,
    SpeedPath, SrqRings, WakeHca, Wc, bind_mw_wr, local_inv_wr, next_rkey, reg_mr_wr,
};

pub use irpverbs_kernel_table::IoctlTransport;

/// A verb's outcome: the response struct, or the failure status.
pub type IoctlResult<T> = Result<T, NtStatus>;

/// The open file under a [`Client`]: control only, or with the speed path.
enum File {
    Control(Box<dyn IoctlTransport>),
    Speed(Box<dyn SpeedPath>),
}

impl IoctlTransport for File {
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        match self {
            File::Control(t) => t.ioctl(code, input, output_len),
            File::Speed(t) => t.ioctl(code, input, output_len),
        }
    }
}

/// What a speed-path object is, for the destroy guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Qp,
    Cq,
    Srq,
}

/// The object kind and handle an IOCTL would destroy or re-map, if it is
/// one that does.
fn unmaps(code: u32, input: &[u8]) -> Option<(Kind, IvHandle)> {
    let kind = match code {
        IOCTL_IV_DESTROY_QP => Kind::Qp,
        IOCTL_IV_DESTROY_CQ | IOCTL_IV_RESIZE_CQ => Kind::Cq,
        IOCTL_IV_DESTROY_SRQ => Kind::Srq,
        _ => return None,
    };
    // Every one of them starts with the object's handle.
    let handle = IvHandle::read_from_prefix(input).ok()?.0;
    Some((kind, handle))
}

/// Typed verbs over one open file.
///
/// Over a [`SpeedPath`] transport ([`Client::with_speed_path`]) it also
/// creates speed-path objects ([`Client::new_qp`], [`Client::new_cq`],
/// [`Client::new_srq`]). Those borrow the client, and while one lives the
/// client refuses to destroy (or resize) its driver object by any other
/// route (the typed destroy methods, [`Client::raw`], [`Client::file`]) with
/// `STATUS_DEVICE_BUSY`: the object's own `destroy` drops its ring views
/// first, so no view ever outlives its mapping.
pub struct Client {
    file: File,
    held: Mutex<Vec<(Kind, IvHandle)>>,
}

/// The typed verbs over a file that reaches the HCA's doorbells:
/// `file.into_client()` is [`Client::with_speed_path`] of it (for every
/// [`SpeedPath`] transport, such as a host-mode file).
pub trait IntoClient: SpeedPath + Sized + 'static {
    /// The typed verbs over this file, with the speed path.
    fn into_client(self) -> Client {
        Client::with_speed_path(Box::new(self))
    }
}

impl<T: SpeedPath + 'static> IntoClient for T {}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("speed_path", &self.doorbells().is_some())
            .finish_non_exhaustive()
    }
}

impl IoctlTransport for Client {
    /// The file's transport, with the speed-path guard: destroying or
    /// resizing an object a speed-path object of this client views fails
    /// with `STATUS_DEVICE_BUSY` without reaching the driver.
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        if let Some(object) = unmaps(code, input) {
            if self.is_held(object) {
                return (STATUS_DEVICE_BUSY, Vec::new());
            }
        }
        self.file.ioctl(code, input, output_len)
    }
}

pub(crate) fn call<I: IntoBytes + Immutable, O: FromBytes>(
    file: &dyn IoctlTransport,
    code: u32,
    input: &I,
) -> IoctlResult<O> {
    let (status, out) = file.ioctl(code, input.as_bytes(), size_of::<O>());
    if !nt_success(status) {
        return Err(status);
    }
    O::read_from_bytes(&out).map_err(|_| STATUS_BUFFER_TOO_SMALL)
}

pub(crate) fn call_none<I: IntoBytes + Immutable>(
    file: &dyn IoctlTransport,
    code: u32,
    input: &I,
) -> IoctlResult<()> {
    let (status, out) = file.ioctl(code, input.as_bytes(), 0);
    if !nt_success(status) {
        return Err(status);
    }
    if !out.is_empty() {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}

impl Client {
    /// Wraps an open file (control verbs only).
    pub fn new(file: Box<dyn IoctlTransport>) -> Self {
        Self {
            file: File::Control(file),
            held: Mutex::new(Vec::new()),
        }
    }

    /// Wraps an open file that also reaches the HCA's doorbells: the client
    /// can create speed-path objects.
    pub fn with_speed_path(file: Box<dyn SpeedPath>) -> Self {
        Self {
            file: File::Speed(file),
            held: Mutex::new(Vec::new()),
        }
    }

    /// The doorbells, when the client has the speed path.
    pub fn doorbells(&self) -> Option<&dyn Doorbells> {
        match &self.file {
            File::Control(_) => None,
            File::Speed(t) => Some(t.doorbells()),
        }
    }

    /// The file, as a transport (with the client's speed-path guard).
    pub fn file(&self) -> &dyn IoctlTransport {
        self
    }

    /// Raw IOCTL (with the client's speed-path guard).
    pub fn raw(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        self.ioctl(code, input, output_len)
    }

    /// The transport without the guard: for the speed-path objects' own
    /// destroy and resize.
    pub(crate) fn unguarded(&self) -> &dyn IoctlTransport {
        &self.file
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<(Kind, IvHandle)>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_held(&self, object: (Kind, IvHandle)) -> bool {
        self.held().contains(&object)
    }

    /// A speed-path object now views `object`'s rings.
    pub(crate) fn hold(&self, kind: Kind, handle: IvHandle) {
        self.held().push((kind, handle));
    }

    /// No speed-path object views `object`'s rings any more.
    pub(crate) fn release(&self, kind: Kind, handle: IvHandle) {
        let mut held = self.held();
        if let Some(i) = held.iter().position(|o| *o == (kind, handle)) {
            held.swap_remove(i);
        }
    }

    /// `IOCTL_IV_GET_VERSION`.
    pub fn get_version(&self) -> IoctlResult<IvGetVersionOut> {
        let (status, out) = self.ioctl(IOCTL_IV_GET_VERSION, &[], size_of::<IvGetVersionOut>());
        if !nt_success(status) {
            return Err(status);
        }
        IvGetVersionOut::read_from_bytes(&out).map_err(|_| STATUS_BUFFER_TOO_SMALL)
    }

    /// `IOCTL_IV_QUERY_DEVICE`.
    pub fn query_device(&self) -> IoctlResult<IvQueryDeviceOut> {
        let (status, out) = self.ioctl(IOCTL_IV_QUERY_DEVICE, &[], size_of::<IvQueryDeviceOut>());
        if !nt_success(status) {
            return Err(status);
        }
        IvQueryDeviceOut::read_from_bytes(&out).map_err(|_| STATUS_BUFFER_TOO_SMALL)
    }

    /// `IOCTL_IV_QUERY_PORT`.
    pub fn query_port(&self, port_num: u32) -> IoctlResult<IvQueryPortOut> {
        call(
            self,
            IOCTL_IV_QUERY_PORT,
            &IvQueryPortIn {
                port_num,
                reserved: 0,
            },
        )
    }

    /// `IOCTL_IV_QUERY_GID`.
    pub fn query_gid(&self, port_num: u32, index: u32) -> IoctlResult<[u8; 16]> {
        call::<_, IvQueryGidOut>(self, IOCTL_IV_QUERY_GID, &IvQueryGidIn { port_num, index })
            .map(|g| g.gid)
    }

    /// `IOCTL_IV_ALLOC_PD`.
    pub fn alloc_pd(&self) -> IoctlResult<IvAllocPdOut> {
        call(self, IOCTL_IV_ALLOC_PD, &IvAllocPdIn::default())
    }

    /// `IOCTL_IV_DEALLOC_PD`.
    pub fn dealloc_pd(&self, pd: IvHandle) -> IoctlResult<()> {
        call_none(self, IOCTL_IV_DEALLOC_PD, &IvHandleIn { handle: pd })
    }

    /// `IOCTL_IV_REG_MR`.
    pub fn reg_mr(
        &self,
        pd: IvHandle,
        addr: u64,
        length: u64,
        access: u32,
    ) -> IoctlResult<IvRegMrOut> {
        call(
            self,
            IOCTL_IV_REG_MR,
            &IvRegMrIn {
                pd,
                addr,
                length,
                access,
                reserved: 0,
            },
        )
    }

    /// `IOCTL_IV_DEREG_MR`.
    pub fn dereg_mr(&self, mr: IvHandle) -> IoctlResult<()> {
        call_none(self, IOCTL_IV_DEREG_MR, &IvHandleIn { handle: mr })
    }

    /// `IOCTL_IV_ALLOC_MR` (kernel callers only): a free fast-register MR
    /// of `pd` whose registrations map up to `max_num_sg` pages, as
    /// `ib_alloc_mr` with `IB_MR_TYPE_MEM_REG` (docs/fast-registration.md).
    /// [`reg_mr_wr`] registers it; [`Client::dereg_mr`] frees it.
    pub fn alloc_mr(&self, pd: IvHandle, max_num_sg: u32) -> IoctlResult<IvRegMrOut> {
        call(
            self,
            IOCTL_IV_ALLOC_MR,
            &IvAllocMrIn {
                pd,
                max_num_sg,
                reserved: 0,
            },
        )
    }

    /// `IOCTL_IV_ALLOC_MW`: a memory window of `mw_type` (`IV_MW_TYPE_1`
    /// or `IV_MW_TYPE_2`) on `pd` (docs/memory-windows.md).
    pub fn alloc_mw(&self, pd: IvHandle, mw_type: u32) -> IoctlResult<IvAllocMwOut> {
        call(
            self,
            IOCTL_IV_ALLOC_MW,
            &IvAllocMwIn {
                pd,
                mw_type,
                reserved: 0,
            },
        )
    }

    /// `IOCTL_IV_DEALLOC_MW`.
    pub fn dealloc_mw(&self, mw: IvHandle) -> IoctlResult<()> {
        call_none(self, IOCTL_IV_DEALLOC_MW, &IvHandleIn { handle: mw })
    }

    /// `IOCTL_IV_BIND_MW`: binds the type 1 window `mw` to `length` bytes
    /// at `addr` of `mr` with `access` (`IV_ACCESS_REMOTE_*`); length 0
    /// unbinds. Returns the window's new rkey.
    pub fn bind_mw(
        &self,
        mw: IvHandle,
        mr: IvHandle,
        addr: u64,
        length: u64,
        access: u32,
    ) -> IoctlResult<u32> {
        let out: IvBindMwOut = call(
            self,
            IOCTL_IV_BIND_MW,
            &IvBindMwIn {
                mw,
                mr,
                addr,
                length,
                access,
                reserved: 0,
            },
        )?;
        Ok(out.rkey)
    }

    /// `IOCTL_IV_CREATE_CQ`.
    pub fn create_cq(&self, cqe: u32) -> IoctlResult<IvCreateCqOut> {
        let i = IvCreateCqIn {
            cqe,
            comp_vector: 0,
            channel: 0,
            user_context: 0x5151,
        };
        call(self, IOCTL_IV_CREATE_CQ, &i)
    }

    /// `IOCTL_IV_RESIZE_CQ`.
    pub fn resize_cq(&self, cq: IvHandle, cqe: u32) -> IoctlResult<IvResizeCqOut> {
        call(
            self,
            IOCTL_IV_RESIZE_CQ,
            &IvResizeCqIn {
                cq,
                cqe,
                reserved: 0,
            },
        )
    }

    /// `IOCTL_IV_DESTROY_CQ`.
    pub fn destroy_cq(&self, cq: IvHandle) -> IoctlResult<()> {
        call_none(self, IOCTL_IV_DESTROY_CQ, &IvHandleIn { handle: cq })
    }

    /// `IOCTL_IV_MAP_RINGS`: the rings of the CQ, QP or SRQ `handle` in
    /// this address space (the same addresses every time). The speed-path
    /// objects ([`Client::new_cq`] and its siblings) call it themselves.
    pub fn map_rings(&self, handle: IvHandle) -> IoctlResult<IvMapRingsOut> {
        call(self, IOCTL_IV_MAP_RINGS, &IvHandleIn { handle })
    }

    /// `IOCTL_IV_CREATE_QP` with the given request.
    pub fn create_qp_with(&self, i: &IvCreateQpIn) -> IoctlResult<IvCreateQpOut> {
        call(self, IOCTL_IV_CREATE_QP, i)
    }

    /// `IOCTL_IV_CREATE_QP`: a QP of `qp_type` with modest queues.
    pub fn create_qp(
        &self,
        pd: IvHandle,
        cq: IvHandle,
        qp_type: u32,
    ) -> IoctlResult<IvCreateQpOut> {
        self.create_qp_with(&qp_request(pd, cq, 0, qp_type))
    }

    /// `IOCTL_IV_MODIFY_QP`.
    pub fn modify_qp(&self, qp: IvHandle, attr_mask: u32, attr: &IvQpAttr) -> IoctlResult<()> {
        call_none(
            self,
            IOCTL_IV_MODIFY_QP,
            &IvModifyQpIn {
                qp,
                attr_mask,
                reserved: 0,
                attr: *attr,
            },
        )
    }

    /// `IOCTL_IV_QUERY_QP`.
    pub fn query_qp(&self, qp: IvHandle) -> IoctlResult<IvQueryQpOut> {
        call(self, IOCTL_IV_QUERY_QP, &IvHandleIn { handle: qp })
    }

    /// `IOCTL_IV_DESTROY_QP`.
    pub fn destroy_qp(&self, qp: IvHandle) -> IoctlResult<()> {
        call_none(self, IOCTL_IV_DESTROY_QP, &IvHandleIn { handle: qp })
    }

    /// `IOCTL_IV_CREATE_SRQ`.
    pub fn create_srq(
        &self,
        pd: IvHandle,
        max_wr: u32,
        srq_limit: u32,
    ) -> IoctlResult<IvCreateSrqOut> {
        let i = IvCreateSrqIn {
            pd,
            user_context: 7,
            max_wr,
            max_sge: 1,
            srq_limit,
            reserved: 0,
        };
        call(self, IOCTL_IV_CREATE_SRQ, &i)
    }

    /// `IOCTL_IV_MODIFY_SRQ`.
    pub fn modify_srq(
        &self,
        srq: IvHandle,
        attr_mask: u32,
        max_wr: u32,
        srq_limit: u32,
    ) -> IoctlResult<()> {
        let i = IvModifySrqIn {
            srq,
            attr_mask,
            max_wr,
            srq_limit,
            reserved: 0,
        };
        call_none(self, IOCTL_IV_MODIFY_SRQ, &i)
    }

    /// `IOCTL_IV_QUERY_SRQ`.
    pub fn query_srq(&self, srq: IvHandle) -> IoctlResult<IvQuerySrqOut> {
        call(self, IOCTL_IV_QUERY_SRQ, &IvHandleIn { handle: srq })
    }

    /// `IOCTL_IV_DESTROY_SRQ`.
    pub fn destroy_srq(&self, srq: IvHandle) -> IoctlResult<()> {
        call_none(self, IOCTL_IV_DESTROY_SRQ, &IvHandleIn { handle: srq })
    }

    /// `IOCTL_IV_CREATE_AH`.
    pub fn create_ah(&self, pd: IvHandle, attr: &IvAhAttr) -> IoctlResult<IvCreateAhOut> {
        call(self, IOCTL_IV_CREATE_AH, &IvCreateAhIn { pd, attr: *attr })
    }

    /// `IOCTL_IV_DESTROY_AH`.
    pub fn destroy_ah(&self, ah: IvHandle) -> IoctlResult<()> {
        call_none(self, IOCTL_IV_DESTROY_AH, &IvHandleIn { handle: ah })
    }

    /// `IOCTL_IV_GET_ASYNC_EVENT` (waits while none is queued).
    pub fn get_async_event(&self) -> IoctlResult<IvAsyncEventOut> {
        let (status, out) = self.ioctl(IOCTL_IV_GET_ASYNC_EVENT, &[], size_of::<IvAsyncEventOut>());
        if !nt_success(status) {
            return Err(status);
        }
        IvAsyncEventOut::read_from_bytes(&out).map_err(|_| STATUS_BUFFER_TOO_SMALL)
    }

    /// `IOCTL_IV_ACK_ASYNC_EVENT`.
    pub fn ack_async_event(&self, handle: IvHandle, event_type: u32) -> IoctlResult<()> {
        call_none(
            self,
            IOCTL_IV_ACK_ASYNC_EVENT,
            &IvAckIn {
                handle,
                count: 1,
                event_type,
            },
        )
    }

    /// Walks an RC or UC QP from RESET to RTS against `dest_qpn` (or a UD
    /// QP, which needs no remote), with the attributes each transition
    /// requires.
    pub fn connect_qp(
        &self,
        qp: IvHandle,
        qp_type: u32,
        dest_qpn: u32,
        gid: [u8; 16],
    ) -> IoctlResult<()> {
        for (mask, attr) in rts_steps(qp_type, dest_qpn, gid) {
            self.modify_qp(qp, mask, &attr)?;
        }
        Ok(())
    }
}

/// A create-QP request with modest queues.
pub fn qp_request(pd: IvHandle, cq: IvHandle, srq: IvHandle, qp_type: u32) -> IvCreateQpIn {
    IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq,
        user_context: 0xC0FFEE,
        qp_type,
        sq_sig_all: 0,
        cap: IvQpCap {
            max_send_wr: 16,
            max_recv_wr: if srq == 0 { 16 } else { 0 },
            max_send_sge: 1,
            max_recv_sge: if srq == 0 { 1 } else { 0 },
            max_inline_data: 0,
            reserved: 0,
        },
    }
}

/// An address vector to `gid` on port 1.
pub fn av(gid: [u8; 16]) -> IvAhAttr {
    IvAhAttr {
        dgid: gid,
        is_global: 1,
        port_num: 1,
        hop_limit: 64,
        ..IvAhAttr::default()
    }
}

/// The starting PSN (both directions) [`rts_steps`] sets.
pub const RTS_PSN: u32 = 0x4321;

/// The (mask, attributes) of each modify from RESET to RTS, per the IBTA
/// required-attribute table. The send and receive PSNs are equal, so two
/// QPs walked to RTS against each other with these steps can talk.
pub fn rts_steps(qp_type: u32, dest_qpn: u32, gid: [u8; 16]) -> Vec<(u32, IvQpAttr)> {
    let init_mask = if qp_type == IV_QPT_UD {
        IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_QKEY
    } else {
        IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS
    };
    let init = IvQpAttr {
        qp_state: IV_QPS_INIT,
        port_num: 1,
        qkey: 0x1111_1111,
        qp_access_flags: if qp_type == IV_QPT_UD {
            0
        } else {
            IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ
        },
        ..IvQpAttr::default()
    };
    let (rtr_mask, rtr) = match qp_type {
        IV_QPT_UD => (
            IV_QP_STATE,
            IvQpAttr {
                qp_state: IV_QPS_RTR,
                ..IvQpAttr::default()
            },
        ),
        t => {
            let mut m = IV_QP_STATE | IV_QP_AV | IV_QP_PATH_MTU | IV_QP_DEST_QPN | IV_QP_RQ_PSN;
            if t == IV_QPT_RC {
                m |= IV_QP_MAX_DEST_RD_ATOMIC | IV_QP_MIN_RNR_TIMER;
            }
            (
                m,
                IvQpAttr {
                    qp_state: IV_QPS_RTR,
                    ah_attr: av(gid),
                    path_mtu: IV_MTU_1024,
                    dest_qp_num: dest_qpn,
                    rq_psn: RTS_PSN,
                    max_dest_rd_atomic: 4,
                    min_rnr_timer: 12,
                    ..IvQpAttr::default()
                },
            )
        }
    };
    let rts_mask = if qp_type == IV_QPT_RC {
        IV_QP_STATE
            | IV_QP_TIMEOUT
            | IV_QP_RETRY_CNT
            | IV_QP_RNR_RETRY
            | IV_QP_SQ_PSN
            | IV_QP_MAX_QP_RD_ATOMIC
    } else {
        IV_QP_STATE | IV_QP_SQ_PSN
    };
    let rts = IvQpAttr {
        qp_state: IV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: RTS_PSN,
        max_rd_atomic: 4,
        ..IvQpAttr::default()
    };
    vec![(init_mask, init), (rtr_mask, rtr), (rts_mask, rts)]
}
