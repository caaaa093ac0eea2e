//! The verbs table: every IOCTL's parsed input ([`Verb`], [`parse`]), and
//! for the verbs that post a command to the HCA, the handler that
//! validates the input and builds the command ([`Device::command`]) and the
//! handler that applies the command's completion and writes the IOCTL's
//! output ([`Device::finish`]).
//!
//! A verb's handlers live together, in the file of its object:
//!
//! | IOCTL | file | start | finish |
//! |---|---|---|---|
//! | `QUERY_PORT`, `QUERY_GID` | `port.rs` | `query_port`, `query_gid` | `query_port_done`, `query_gid_done` |
//! | `ALLOC_PD` | `pd.rs` | `alloc_pd` | `alloc_pd_done` |
//! | `REG_MR`, `REG_PHYS_MR`, `ALLOC_MR` | `mr.rs` | `reg_mr`, `alloc_mr` | `reg_mr_done` |
//! | `ALLOC_MW`, `BIND_MW` | `mw.rs` | `alloc_mw`, `bind_mw` | `alloc_mw_done`, `bind_mw_done` |
//! | `CREATE_CQ`, `RESIZE_CQ` | `cq.rs` | `create_cq`, `resize_cq` | `create_cq_done`, `resize_cq_done` |
//! | `CREATE_QP`, `MODIFY_QP`, `QUERY_QP` | `qp.rs` | `create_qp`, `modify_qp`, `query_qp` | `create_qp_done`, `modify_qp_done`, `query_qp_done` |
//! | `CREATE_SRQ`, `MODIFY_SRQ`, `QUERY_SRQ` | `srq.rs` | `create_srq`, `modify_srq`, `query_srq` | `create_srq_done`, `modify_srq_done`, `query_srq_done` |
//! | `CREATE_AH` | `ah.rs` | `create_ah` | `create_ah_done` |
//! | `DEALLOC_PD`, `DEREG_MR`, `DEALLOC_MW`, `DESTROY_*` | `destroy.rs` | `destroy` | `destroy_done` |
//! | `RESOLVE_ADDR` | `crate::resolve` | `Resolve::start` | `Resolve::step` (a GID query per step) |
//!
//! What every command verb does when the device is removed while its
//! command is in flight is [`Device::removed_op`]. The other verbs post no
//! command of their own: the notification verbs (`crate::notify`), the
//! connection manager's (`crate::cm`, which posts QP modifies and GID
//! queries through [`Op::CmStep`], [`Op::CmCheckGid`] and [`Op::Resolve`])
//! and the mappings (`crate::maps`). docs/verb-path.md follows `CREATE_QP`
//! from the IOCTL's bytes to its output.

pub(crate) mod ah;
pub(crate) mod cq;
pub(crate) mod destroy;
pub(crate) mod mr;
pub(crate) mod mw;
pub(crate) mod pd;
pub(crate) mod port;
pub(crate) mod qp;
pub(crate) mod srq;

use irpverbs_abi::*;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::cm::CmOp;
use crate::device::{Device, Response, State};
use crate::notify::Done;
use crate::object::{Kind, Life, Object};
use crate::platform::{FileKey, MajorFunction, Platform, Request, RequestorMode};
use crate::{Command, CommandOut, Hca};

/// A parsed, length-checked request.
#[derive(Debug)]
pub(crate) enum Verb {
    /// Answered at once from the driver's version.
    GetVersion,
    /// Answered at once from the HCA's capabilities.
    QueryDevice,
    QueryPort(IvQueryPortIn),
    QueryGid(IvQueryGidIn),
    AllocPd(IvAllocPdIn),
    /// The request, whether physical, and the pinned region (taken from the
    /// request, or pinned at dispatch for a kernel caller).
    RegMr(
        IvRegMrIn,
        bool,
        Option<irpverbs_ring::Shared<irpverbs_ring::Region>>,
    ),
    AllocMr(IvAllocMrIn),
    AllocMw(IvAllocMwIn),
    BindMw(IvBindMwIn),
    CreateCq(IvCreateCqIn),
    ResizeCq(IvResizeCqIn),
    CreateQp(IvCreateQpIn),
    ModifyQp(IvModifyQpIn),
    QueryQp(IvHandleIn),
    CreateSrq(IvCreateSrqIn),
    ModifySrq(IvModifySrqIn),
    QuerySrq(IvHandleIn),
    CreateAh(IvCreateAhIn),
    Destroy(IvHandleIn, Kind),
    CqNotify(IvCqNotifyIn),
    CreateChannel(IvAllocPdIn),
    GetCqEvent(IvHandleIn),
    AckCqEvents(IvAckIn),
    GetAsyncEvent,
    AckAsyncEvent(IvAckIn),
    MapRings(IvHandleIn),
    MapDoorbells,
    RingDoorbells,
    CreateCep(IvCreateCepIn),
    Listen(IvListenIn),
    GetCepEvent(IvHandleIn),
    /// A connection-manager request (its large input is read again from
    /// the request by `Device::cm_request`, so that it stays out of this
    /// enum, which every IOCTL moves).
    Cm(CmOp),
    ResolveAddr(IvResolveAddrIn),
    ListenAddr(IvListenAddrIn),
}

impl Verb {
    /// The connection manager's verbs (`crate::cm`).
    pub(crate) fn is_cep(&self) -> bool {
        matches!(
            self,
            Verb::CreateCep(_)
                | Verb::Listen(_)
                | Verb::GetCepEvent(_)
                | Verb::Destroy(_, Kind::Cep)
                | Verb::Cm(_)
                | Verb::ListenAddr(_)
        )
    }

    /// Verbs that pend on events (or answer at once) instead of posting a
    /// command.
    pub(crate) fn is_notification(&self) -> bool {
        matches!(
            self,
            Verb::CqNotify(_)
                | Verb::CreateChannel(_)
                | Verb::GetCqEvent(_)
                | Verb::AckCqEvents(_)
                | Verb::GetAsyncEvent
                | Verb::AckAsyncEvent(_)
                | Verb::Destroy(_, Kind::Channel)
                | Verb::CreateCep(_)
                | Verb::Listen(_)
                | Verb::GetCepEvent(_)
                | Verb::Destroy(_, Kind::Cep)
        )
    }
}

/// Checks the code, caller, lengths and alignment of `request`, and parses
/// its input.
///
/// IRQL: <= DISPATCH_LEVEL.
///
/// # Errors
/// `STATUS_INVALID_DEVICE_REQUEST` for an unknown code;
/// `STATUS_ACCESS_DENIED` for a user-mode caller of a kernel-only code or
/// of an internal device control; `STATUS_INFO_LENGTH_MISMATCH` for an
/// input of the wrong length; `STATUS_DATATYPE_MISALIGNMENT_ERROR` for an
/// input not 8-byte aligned.
pub(crate) fn parse<R: Request>(request: &R) -> Result<Verb, NtStatus> {
    let code = request.ioctl_code();
    let info = ioctl_info(code).ok_or(STATUS_INVALID_DEVICE_REQUEST)?;
    let mode = request.requestor_mode();
    if mode == RequestorMode::User
        && (info.kernel_only || request.major_function() == MajorFunction::InternalDeviceControl)
    {
        return Err(STATUS_ACCESS_DENIED);
    }
    let input = request.input();
    if input.len() != info.input_len {
        return Err(STATUS_INFO_LENGTH_MISMATCH);
    }
    if !input.is_empty() && (input.as_ptr() as usize) % 8 != 0 {
        return Err(STATUS_DATATYPE_MISALIGNMENT_ERROR);
    }
    fn read<T: FromBytes>(input: &[u8]) -> Result<T, NtStatus> {
        T::read_from_bytes(input).map_err(|_| STATUS_INFO_LENGTH_MISMATCH)
    }
    Ok(match code {
        IOCTL_IV_GET_VERSION => Verb::GetVersion,
        IOCTL_IV_QUERY_DEVICE => Verb::QueryDevice,
        IOCTL_IV_QUERY_PORT => Verb::QueryPort(read(input)?),
        IOCTL_IV_QUERY_GID => Verb::QueryGid(read(input)?),
        IOCTL_IV_ALLOC_PD => Verb::AllocPd(read(input)?),
        IOCTL_IV_DEALLOC_PD => Verb::Destroy(read(input)?, Kind::Pd),
        IOCTL_IV_REG_MR => Verb::RegMr(read(input)?, false, None),
        IOCTL_IV_REG_PHYS_MR => Verb::RegMr(read(input)?, true, None),
        IOCTL_IV_DEREG_MR => Verb::Destroy(read(input)?, Kind::Mr),
        IOCTL_IV_ALLOC_MR => Verb::AllocMr(read(input)?),
        IOCTL_IV_ALLOC_MW => Verb::AllocMw(read(input)?),
        IOCTL_IV_DEALLOC_MW => Verb::Destroy(read(input)?, Kind::Mw),
        IOCTL_IV_BIND_MW => Verb::BindMw(read(input)?),
        IOCTL_IV_CREATE_CQ => Verb::CreateCq(read(input)?),
        IOCTL_IV_RESIZE_CQ => Verb::ResizeCq(read(input)?),
        IOCTL_IV_DESTROY_CQ => Verb::Destroy(read(input)?, Kind::Cq),
        IOCTL_IV_CREATE_QP => Verb::CreateQp(read(input)?),
        IOCTL_IV_MODIFY_QP => Verb::ModifyQp(read(input)?),
        IOCTL_IV_QUERY_QP => Verb::QueryQp(read(input)?),
        IOCTL_IV_DESTROY_QP => Verb::Destroy(read(input)?, Kind::Qp),
        IOCTL_IV_CREATE_SRQ => Verb::CreateSrq(read(input)?),
        IOCTL_IV_MODIFY_SRQ => Verb::ModifySrq(read(input)?),
        IOCTL_IV_QUERY_SRQ => Verb::QuerySrq(read(input)?),
        IOCTL_IV_DESTROY_SRQ => Verb::Destroy(read(input)?, Kind::Srq),
        IOCTL_IV_CREATE_AH => Verb::CreateAh(read(input)?),
        IOCTL_IV_DESTROY_AH => Verb::Destroy(read(input)?, Kind::Ah),
        IOCTL_IV_CQ_NOTIFY => Verb::CqNotify(read(input)?),
        IOCTL_IV_CREATE_CHANNEL => Verb::CreateChannel(read(input)?),
        IOCTL_IV_DESTROY_CHANNEL => Verb::Destroy(read(input)?, Kind::Channel),
        IOCTL_IV_CREATE_CEP => Verb::CreateCep(read(input)?),
        IOCTL_IV_LISTEN => Verb::Listen(read(input)?),
        IOCTL_IV_GET_CEP_EVENT => Verb::GetCepEvent(read(input)?),
        IOCTL_IV_DESTROY_CEP => Verb::Destroy(read(input)?, Kind::Cep),
        IOCTL_IV_CM_CONNECT => Verb::Cm(CmOp::Connect),
        IOCTL_IV_CM_ACCEPT => Verb::Cm(CmOp::Accept),
        IOCTL_IV_CM_REJECT => Verb::Cm(CmOp::Reject),
        IOCTL_IV_CM_DISCONNECT => Verb::Cm(CmOp::Disconnect),
        IOCTL_IV_CM_MRA => Verb::Cm(CmOp::Mra),
        IOCTL_IV_CM_LAP => Verb::Cm(CmOp::Lap),
        IOCTL_IV_CM_APR => Verb::Cm(CmOp::Apr),
        IOCTL_IV_SIDR_REQUEST => Verb::Cm(CmOp::SidrRequest),
        IOCTL_IV_SIDR_REPLY => Verb::Cm(CmOp::SidrReply),
        IOCTL_IV_CM_INIT_QP_ATTR => Verb::Cm(CmOp::InitQpAttr),
        IOCTL_IV_CM_ESTABLISH => Verb::Cm(CmOp::Establish),
        IOCTL_IV_GET_CQ_EVENT => Verb::GetCqEvent(read(input)?),
        IOCTL_IV_ACK_CQ_EVENTS => Verb::AckCqEvents(read(input)?),
        IOCTL_IV_GET_ASYNC_EVENT => Verb::GetAsyncEvent,
        IOCTL_IV_ACK_ASYNC_EVENT => Verb::AckAsyncEvent(read(input)?),
        IOCTL_IV_MAP_RINGS => Verb::MapRings(read(input)?),
        IOCTL_IV_MAP_DOORBELLS => Verb::MapDoorbells,
        IOCTL_IV_RING_DOORBELLS => Verb::RingDoorbells,
        IOCTL_IV_RESOLVE_ADDR => Verb::ResolveAddr(read(input)?),
        IOCTL_IV_LISTEN_ADDR => Verb::ListenAddr(read(input)?),
        _ => return Err(STATUS_INVALID_DEVICE_REQUEST),
    })
}

/// A command in flight: the verb that posted it, with what its completion
/// needs (the index of its object in the file's table, the state a modify
/// moves to, ...). [`Device::finish`] hands it to the verb's `_done`
/// handler.
#[derive(Debug)]
pub(crate) enum Op {
    QueryPort,
    QueryGid,
    AllocPd(u32),
    RegMr(u32),
    AllocMw(u32),
    /// A type 1 window's bind (the window, busy until it completes).
    BindMw(u32),
    CreateCq(u32),
    ResizeCq(u32),
    CreateQp(u32),
    ModifyQp {
        qp: u32,
        next: u32,
    },
    QueryQp(u32),
    CreateSrq(u32),
    ModifySrq {
        srq: u32,
        mask: u32,
        max_wr: u32,
    },
    QuerySrq(u32),
    CreateAh(u32),
    /// A destroy of any kind of object.
    Destroy(u32),
    /// A destroy issued by file cleanup: no request waits for it.
    Rundown(u32),
    /// A QP modify of a multi-phase CM request (`crate::cm`).
    CmStep {
        qp: u32,
        next: u32,
        cep: irpverbs_cm::CepId,
        phase: crate::cm::Phase,
        /// Not the last of a chain of modifies (it carries no request and
        /// leaves the QP busy).
        more: bool,
    },
    /// An address resolution walking the ports' GID tables
    /// (`crate::resolve`), or a `LISTEN_ADDR`'s check that its GID is
    /// the device's.
    Resolve(alloc::boxed::Box<crate::resolve::Resolve>),
    /// A `CM_CONNECT` (`CM_LAP`): the GID table entry its `sgid_index`
    /// (`alt_sgid_index`) names is read to check it is the request's
    /// local GID before the QP moves (the LAP leaves).
    CmCheckGid {
        cep: irpverbs_cm::CepId,
        gid: [u8; 16],
    },
}

impl Op {
    /// The object a create in flight reserved.
    fn creating(&self) -> Option<u32> {
        match *self {
            Op::AllocPd(idx)
            | Op::RegMr(idx)
            | Op::AllocMw(idx)
            | Op::CreateCq(idx)
            | Op::CreateQp(idx)
            | Op::CreateSrq(idx)
            | Op::CreateAh(idx) => Some(idx),
            _ => None,
        }
    }
}

/// How a ring is shown to the requestor: kernel callers view the rings at
/// their kernel addresses; a user process maps them with
/// `IOCTL_IV_MAP_RINGS` (`crate::maps`) and is told their geometry.
pub(crate) fn ring_map(mode: RequestorMode, ring: &irpverbs_ring::Ring) -> IvRingMap {
    match mode {
        RequestorMode::Kernel => ring.map(),
        RequestorMode::User => crate::maps::geometry(ring),
    }
}

/// A failed command with a success status and no output is a firmware bug:
/// report it as a hardware error rather than success.
pub(crate) fn fail_status(status: NtStatus) -> NtStatus {
    if nt_success(status) {
        STATUS_DEVICE_HARDWARE_ERROR
    } else {
        status
    }
}

/// A command's completion as its request ends: `output`, the verb's IOCTL
/// output when the command succeeded with the output it should have,
/// written into `request` (if one waits); otherwise the failure.
fn reply<R: Request, T: IntoBytes + Immutable + ?Sized>(
    request: Option<&mut R>,
    status: NtStatus,
    output: Option<&T>,
) -> (NtStatus, Response) {
    match output {
        Some(o) if nt_success(status) => (
            status,
            request.map_or(Response::None, |r| Response::write(r, o.as_bytes())),
        ),
        _ => (fail_status(status), Response::None),
    }
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// Starts a command verb: its handler validates it and builds its
    /// command ([`Device::command`]), which is posted with the request;
    /// or the request is answered now (returned) with the reason it was
    /// refused, nothing changed.
    ///
    /// Out of line: the command is built in this frame, not in that of the
    /// queue callback's lock hold, which the CM's verbs also run in
    /// (docs/stack-budget.md).
    ///
    /// IRQL: DISPATCH_LEVEL, under the device lock.
    #[inline(never)]
    pub(crate) fn start(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        verb: Verb,
        request: P::Request,
    ) -> Option<Done<P::Request>> {
        let mode = request.requestor_mode();
        match self.command(s, file, mode, verb) {
            Ok((op, cmd)) => {
                self.post(s, file, Some(request), op, cmd);
                None
            }
            Err(st) => Some((request, st, Response::None)),
        }
    }

    /// Validates a command verb against the file's objects and builds its
    /// command (the verb's handler, named in the table above).
    ///
    /// IRQL: DISPATCH_LEVEL, under the device lock.
    fn command(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        mode: RequestorMode,
        verb: Verb,
    ) -> Result<(Op, Command), NtStatus> {
        s.file(file)?;
        let caps = self.hca.caps();
        match verb {
            Verb::QueryPort(i) => port::query_port(&i, caps),
            Verb::QueryGid(i) => port::query_gid(&i, caps),
            Verb::ResolveAddr(i) => {
                crate::resolve::Resolve::start(&i, caps).and_then(|(r, cmd)| {
                    let r = irpverbs_ring::try_box(r).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
                    Ok((Op::Resolve(r), cmd))
                })
            }
            Verb::Destroy(h, kind) => destroy::destroy(s, file, h.handle, kind),
            Verb::AllocPd(i) => pd::alloc_pd(self, s, file, &i),
            Verb::RegMr(i, physical, pinned) => {
                mr::reg_mr(self, s, file, mode, &i, physical, pinned)
            }
            Verb::AllocMr(i) => mr::alloc_mr(self, s, file, &i),
            Verb::AllocMw(i) => mw::alloc_mw(self, s, file, &i),
            Verb::BindMw(i) => mw::bind_mw(s, file, &i),
            Verb::CreateCq(i) => cq::create_cq(self, s, file, &i),
            Verb::ResizeCq(i) => cq::resize_cq(self, s, file, &i),
            Verb::CreateQp(i) => qp::create_qp(self, s, file, &i),
            Verb::ModifyQp(i) => qp::modify_qp(self, s, file, mode, &i),
            Verb::QueryQp(i) => qp::query_qp(s, file, &i),
            Verb::CreateSrq(i) => srq::create_srq(self, s, file, &i),
            Verb::ModifySrq(i) => srq::modify_srq(self, s, file, &i),
            Verb::QuerySrq(i) => srq::query_srq(s, file, &i),
            Verb::CreateAh(i) => ah::create_ah(self, s, file, &i),
            // The other verbs never reach here (`Device::dispatch_ioctl`
            // gives them to `crate::notify`, `crate::cm`, `crate::maps`).
            _ => Err(STATUS_INVALID_DEVICE_REQUEST),
        }
    }

    /// Applies a command's completion to the driver's objects and writes
    /// the verb's output into `request` (the verb's `_done` handler, named
    /// in the table above). `mode` is the requestor's (the rings a create
    /// returns are shown to it as [`ring_map`] says).
    ///
    /// IRQL: DISPATCH_LEVEL, under the device lock (from the DPC).
    pub(crate) fn finish(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        op: Op,
        (status, out): (NtStatus, CommandOut),
        mode: RequestorMode,
        request: Option<&mut P::Request>,
    ) -> (NtStatus, Response) {
        let map = |r: &irpverbs_ring::Ring| ring_map(mode, r);
        let ok = nt_success(status);
        match op {
            Op::QueryPort => reply(request, status, port::query_port_done(out).as_ref()),
            Op::QueryGid => reply(request, status, port::query_gid_done(out).as_ref()),
            Op::AllocPd(idx) => self.created(s, file, idx, status, request, |o, h| {
                pd::alloc_pd_done(o, h, out)
            }),
            Op::RegMr(idx) => self.created(s, file, idx, status, request, |o, h| {
                mr::reg_mr_done(o, h, out)
            }),
            Op::AllocMw(idx) => self.created(s, file, idx, status, request, |o, h| {
                mw::alloc_mw_done(o, h, out)
            }),
            Op::BindMw(idx) => {
                let done = mw::bind_mw_done(s, file, idx, if ok { out } else { CommandOut::None });
                reply(request, status, done.as_ref())
            }
            Op::CreateCq(idx) => self.created(s, file, idx, status, request, |o, h| {
                cq::create_cq_done(o, h, out, &map)
            }),
            Op::ResizeCq(idx) => {
                let done = cq::resize_cq_done(s, file, idx, ok, out, &map);
                reply(request, status, done.as_ref())
            }
            Op::CreateQp(idx) => self.created(s, file, idx, status, request, |o, h| {
                qp::create_qp_done(o, h, out, &map)
            }),
            Op::ModifyQp { qp, next } => {
                qp::modify_qp_done(s, file, qp, next, ok);
                (status, Response::None)
            }
            Op::QueryQp(idx) => {
                let done = qp::query_qp_done(s, file, idx, ok, out);
                reply(request, status, done.as_deref())
            }
            Op::CreateSrq(idx) => self.created(s, file, idx, status, request, |o, h| {
                srq::create_srq_done(o, h, out, &map)
            }),
            Op::ModifySrq { srq, mask, max_wr } => {
                srq::modify_srq_done(s, file, srq, mask, max_wr, ok);
                (status, Response::None)
            }
            Op::QuerySrq(idx) => {
                let done = srq::query_srq_done(s, file, idx, out);
                reply(request, status, done.as_ref())
            }
            Op::CreateAh(idx) => self.created(s, file, idx, status, request, |o, h| {
                ah::create_ah_done(o, h, out)
            }),
            Op::Destroy(idx) => {
                destroy::destroy_done(self, s, file, (idx, false), ok);
                (status, Response::None)
            }
            Op::Rundown(idx) => {
                destroy::destroy_done(self, s, file, (idx, true), ok);
                (status, Response::None)
            }
            // `Device::command_done` gives these to `cm_step_done`.
            Op::CmStep { qp, next, .. } => {
                qp::modify_qp_done(s, file, qp, next, ok);
                (status, Response::None)
            }
            // `Device::command_done` walks these (`crate::resolve`,
            // `crate::cm`).
            Op::Resolve(_) | Op::CmCheckGid { .. } => (STATUS_INVALID_DEVICE_STATE, Response::None),
        }
    }

    /// A create command completed: the object at `idx` takes what the HCA
    /// assigned (`fill`, the verb's `_done` handler, which gives the
    /// IOCTL's output) and goes live, findable by its HCA number; a failed
    /// create (or one with output of the wrong shape, a firmware bug
    /// treated as failure) frees the object it reserved.
    #[inline(never)]
    fn created<T: IntoBytes + Immutable>(
        &self,
        s: &mut State<P::Request>,
        file: FileKey,
        idx: u32,
        status: NtStatus,
        request: Option<&mut P::Request>,
        fill: impl FnOnce(&mut Object, IvHandle) -> Option<T>,
    ) -> (NtStatus, Response) {
        let Some(f) = s.files.get_mut(&file) else {
            return (status, Response::None);
        };
        let handle = f.objects.handle_of(idx);
        let o = f.objects.get_mut(idx);
        let output = if nt_success(status) {
            fill(o, handle)
        } else {
            None
        };
        if output.is_some() {
            o.life = Life::Live;
            if let Some(key) = o.number_key() {
                // Room taken when the object was created.
                let recorded = s.by_number.insert_reserved(key, (file, idx));
                debug_assert!(recorded.is_ok());
            }
        } else {
            self.free_object(s, file, idx);
        }
        reply(request, status, output.as_ref())
    }

    /// Ends a command in flight on a removed device ([`Device::remove`]):
    /// undoes what its start did and gives the status its request
    /// completes with (destroys succeed, everything else fails with
    /// `STATUS_DEVICE_REMOVED`).
    pub(crate) fn removed_op(&self, s: &mut State<P::Request>, file: FileKey, op: Op) -> NtStatus {
        if let Some(idx) = op.creating() {
            self.free_object(s, file, idx);
            return STATUS_DEVICE_REMOVED;
        }
        match op {
            Op::Destroy(idx) | Op::Rundown(idx) => {
                self.free_object(s, file, idx);
                STATUS_SUCCESS
            }
            Op::BindMw(idx) => {
                if let Some(f) = s.files.get_mut(&file) {
                    f.objects.get_mut(idx).busy = false;
                }
                STATUS_DEVICE_REMOVED
            }
            Op::ModifyQp { qp: idx, .. } | Op::ResizeCq(idx) | Op::ModifySrq { srq: idx, .. } => {
                if let Some(f) = s.files.get_mut(&file) {
                    let o = f.objects.get_mut(idx);
                    o.busy = false;
                    crate::quota::end_resize(&mut f.usage, o, false);
                }
                STATUS_DEVICE_REMOVED
            }
            Op::QueryQp(idx) | Op::QuerySrq(idx) => {
                s.end_query(file, idx);
                STATUS_DEVICE_REMOVED
            }
            Op::CmStep { qp, cep, .. } => {
                if let Some(f) = s.files.get_mut(&file) {
                    f.objects.get_mut(qp).busy = false;
                }
                s.cm_ops.remove(&cep);
                STATUS_DEVICE_REMOVED
            }
            Op::CmCheckGid { cep, .. } => {
                s.cm_ops.remove(&cep);
                STATUS_DEVICE_REMOVED
            }
            Op::QueryPort
            | Op::QueryGid
            | Op::Resolve(_)
            | Op::AllocPd(_)
            | Op::RegMr(_)
            | Op::AllocMw(_)
            | Op::CreateCq(_)
            | Op::CreateQp(_)
            | Op::CreateSrq(_)
            | Op::CreateAh(_) => STATUS_DEVICE_REMOVED,
        }
    }
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// `IOCTL_IV_GET_VERSION` and `IOCTL_IV_QUERY_DEVICE`: answered at once
    /// from the driver's version and the HCA's capabilities, with no
    /// command. Out of line: the capabilities are not on the queue
    /// callback's frame.
    ///
    /// IRQL: DISPATCH_LEVEL.
    #[inline(never)]
    pub(crate) fn answer(&self, mut request: P::Request, verb: &Verb) {
        let response = if let Verb::GetVersion = verb {
            let out = IvGetVersionOut {
                abi_version: IV_ABI_VERSION,
                driver_version: crate::DRIVER_VERSION,
            };
            Response::write(&mut request, out.as_bytes())
        } else {
            let caps = IvQueryDeviceOut {
                abi_version: IV_ABI_VERSION,
                ..*self.hca.caps()
            };
            Response::write(&mut request, caps.as_bytes())
        };
        self.complete(request, STATUS_SUCCESS, &response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use irpverbs_ring::{Region, Shared};

    /// A request that only carries an IOCTL: what [`parse`] reads.
    struct Parsed {
        code: u32,
        mode: RequestorMode,
        input: [u64; 64],
        input_len: usize,
    }

    impl Request for Parsed {
        fn ioctl_code(&self) -> u32 {
            self.code
        }
        fn major_function(&self) -> MajorFunction {
            MajorFunction::DeviceControl
        }
        fn requestor_mode(&self) -> RequestorMode {
            self.mode
        }
        fn file(&self) -> FileKey {
            1
        }
        fn input(&self) -> &[u8] {
            &self.input.as_bytes()[..self.input_len]
        }
        fn output(&mut self) -> &mut [u8] {
            &mut []
        }
        fn complete(self, _: NtStatus, _: usize) {}
        fn mark_cancelable(&mut self, _: u64) -> Result<(), NtStatus> {
            Ok(())
        }
        fn unmark_cancelable(&mut self) -> Result<(), NtStatus> {
            Ok(())
        }
        fn address_space(&self) -> u64 {
            0
        }
        fn attach_pin(&mut self, _: Shared<Region>) {}
        fn take_pin(&mut self) -> Option<Shared<Region>> {
            None
        }
    }

    /// Every IOCTL the ABI defines has its row in the table: a request of
    /// the right length parses (a kernel-only code from a kernel caller;
    /// user mode is refused it before the table), and an unknown code does
    /// not.
    #[test]
    fn every_ioctl_of_the_abi_parses() {
        for info in IOCTLS {
            assert!(info.input_len <= 64 * 8, "{}", info.name);
            let request = |mode| Parsed {
                code: info.code,
                mode,
                input: [0; 64],
                input_len: info.input_len,
            };
            let parsed = parse(&request(RequestorMode::Kernel));
            assert!(parsed.is_ok(), "{}: {parsed:?}", info.name);
            let user = parse(&request(RequestorMode::User));
            if info.kernel_only {
                assert_eq!(user.err(), Some(STATUS_ACCESS_DENIED), "{}", info.name);
            } else {
                assert!(user.is_ok(), "{}: {user:?}", info.name);
            }
        }
        let unknown = Parsed {
            code: IOCTL_IV_CREATE_QP + 0x1000,
            mode: RequestorMode::Kernel,
            input: [0; 64],
            input_len: 0,
        };
        assert_eq!(parse(&unknown).err(), Some(STATUS_INVALID_DEVICE_REQUEST));
    }
}
