//! What hardware gives the framework: the [`Hca`] trait a mini-driver
//! implements.
//!
//! Modelled on real HCAs: the driver posts a [`Command`] with a token to the
//! command interface and never waits; the HCA executes it and writes a
//! [`Event::CommandDone`] carrying the token to its event queue, then raises
//! an interrupt; the interrupt's DPC calls [`crate::Device::dpc`], which drains
//! the event queue with [`Hca::poll_event`] and completes the pending request
//! the token names. Completion events (armed CQs) and async events (QP fatal,
//! port changes, ...) arrive on the same event queue.
//!
//! Object numbers (PDN, CQN, QPN, SRQN, keys) are assigned by the HCA and
//! returned in the command's output, as modern HCAs do.

use irpverbs_ring::{Region, Ring, Shared};

use irpverbs_abi::{
    IvAhAttr, IvQpAttr, IvQpCap, IvQueryDeviceOut, IvQueryPortOut, IvQueryQpOut, IvQuerySrqOut,
    NtStatus, STATUS_NOT_SUPPORTED,
};

/// A command to the HCA's command interface.
///
/// A command of one or two numbers carries them in its variant; a larger
/// one carries a struct of its own ([`RegMr`], [`CreateCq`], [`CreateSrq`],
/// [`ModifySrq`], [`CreateQp`], [`ModifyQp`], [`CreateAh`]), which the
/// driver fills after validating the request and the HCA takes as it is:
/// no copy of its fields in between. docs/verb-path.md follows one command
/// from the IOCTL to its completion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Read a port's attributes.
    QueryPort {
        /// Port number, from 1.
        port: u8,
    },
    /// Read a GID table entry.
    QueryGid {
        /// Port number, from 1.
        port: u8,
        /// Table index.
        index: u32,
    },
    /// Allocate a protection domain.
    AllocPd,
    /// Free a protection domain.
    DeallocPd {
        /// PD number.
        pdn: u32,
    },
    /// Register a memory region.
    RegMr(RegMr),
    /// Deregister a memory region.
    DeregMr {
        /// Its lkey.
        lkey: u32,
    },
    /// Allocate a fast-register MR, free (docs/fast-registration.md): an
    /// `IV_WR_REG_MR` work request registers it later.
    AllocMr {
        /// PD number.
        pdn: u32,
        /// The longest page list a registration may map.
        max_pages: u32,
    },
    /// Allocate a memory window (unbound).
    AllocMw {
        /// PD number.
        pdn: u32,
        /// `IV_MW_TYPE_1` or `IV_MW_TYPE_2`.
        mw_type: u32,
    },
    /// Free a memory window (a bound one is unbound first).
    DeallocMw {
        /// Its rkey (any key byte: the window is named by its index).
        rkey: u32,
    },
    /// Bind (length 0: unbind) a type 1 memory window. The HCA checks the
    /// window (type 1, of the MR's PD), the MR (live, with
    /// `IV_ACCESS_MW_BIND`, and local write when the window grants remote
    /// write or atomics), the access (`IV_ACCESS_REMOTE_*` only) and the
    /// range (inside the MR).
    BindMw(BindMw),
    /// Create a CQ.
    CreateCq(CreateCq),
    /// Resize a CQ.
    ResizeCq {
        /// CQ number.
        cqn: u32,
        /// New minimum entries.
        cqe: u32,
    },
    /// Destroy a CQ.
    DestroyCq {
        /// CQ number.
        cqn: u32,
    },
    /// Create an SRQ.
    CreateSrq(CreateSrq),
    /// Modify an SRQ.
    ModifySrq(ModifySrq),
    /// Query an SRQ.
    QuerySrq {
        /// SRQ number.
        srqn: u32,
    },
    /// Destroy an SRQ.
    DestroySrq {
        /// SRQ number.
        srqn: u32,
    },
    /// Create a QP in RESET.
    CreateQp(CreateQp),
    /// Modify a QP.
    ModifyQp(ModifyQp),
    /// Query a QP.
    QueryQp {
        /// QP number.
        qpn: u32,
    },
    /// Destroy a QP.
    DestroyQp {
        /// QP number.
        qpn: u32,
    },
    /// Create an address handle.
    CreateAh(CreateAh),
    /// Destroy an address handle.
    DestroyAh {
        /// AH number.
        ahn: u32,
    },
}

/// [`Command::BindMw`]: bind a type 1 memory window to a range of an MR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindMw {
    /// The window's rkey (any key byte: the window is named by its index).
    pub rkey: u32,
    /// The MR's lkey.
    pub lkey: u32,
    /// Start of the window.
    pub addr: u64,
    /// Length in bytes (0: unbind).
    pub length: u64,
    /// `IV_ACCESS_REMOTE_*` it grants.
    pub access: u32,
}

/// [`Command::RegMr`]: register a memory region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegMr {
    /// PD number.
    pub pdn: u32,
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
    /// `IV_ACCESS_*`.
    pub access: u32,
    /// The address is physical (kernel callers only).
    pub physical: bool,
    /// The memory, pinned (probed and locked) by the platform: the HCA
    /// reaches it only through this region, bounds-checked.
    pub region: Shared<Region>,
}

/// [`Command::CreateCq`]: create a CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateCq {
    /// Minimum entries.
    pub cqe: u32,
    /// Completion vector (event queue).
    pub comp_vector: u32,
}

/// [`Command::CreateSrq`]: create an SRQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateSrq {
    /// PD number.
    pub pdn: u32,
    /// Depth.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Limit.
    pub srq_limit: u32,
}

/// [`Command::ModifySrq`]: resize an SRQ and/or arm its limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModifySrq {
    /// SRQ number.
    pub srqn: u32,
    /// `IV_SRQ_*`.
    pub mask: u32,
    /// New depth.
    pub max_wr: u32,
    /// New limit.
    pub srq_limit: u32,
}

/// [`Command::CreateQp`]: create a QP in RESET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateQp {
    /// PD number.
    pub pdn: u32,
    /// `IV_QPT_*`.
    pub qp_type: u32,
    /// Send CQ number.
    pub send_cqn: u32,
    /// Receive CQ number.
    pub recv_cqn: u32,
    /// SRQ number, if any.
    pub srqn: Option<u32>,
    /// Every send WR signaled.
    pub sq_sig_all: bool,
    /// Requested sizes.
    pub cap: IvQpCap,
}

/// [`Command::ModifyQp`]: modify a QP. The HCA checks that the QP is in
/// `cur_state` and fails with `STATUS_INVALID_DEVICE_STATE` if it moved
/// (e.g. to ERR) meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModifyQp {
    /// QP number.
    pub qpn: u32,
    /// The state the driver validated the transition from.
    pub cur_state: u32,
    /// `IV_QP_*` mask, already validated against the state machine.
    pub mask: u32,
    /// Attributes.
    pub attr: IvQpAttr,
}

/// [`Command::CreateAh`]: create an address handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CreateAh {
    /// PD number.
    pub pdn: u32,
    /// Address vector.
    pub attr: IvAhAttr,
}

/// What a successful command returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandOut {
    /// Nothing (destroys, modifies).
    None,
    /// [`Command::QueryPort`].
    Port(IvQueryPortOut),
    /// [`Command::QueryGid`].
    Gid([u8; 16]),
    /// [`Command::AllocPd`].
    Pd {
        /// PD number.
        pdn: u32,
    },
    /// [`Command::RegMr`], [`Command::AllocMr`].
    Mr {
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// [`Command::AllocMw`], [`Command::BindMw`]: the window's rkey.
    Mw {
        /// Its rkey.
        rkey: u32,
    },
    /// [`Command::CreateCq`], [`Command::ResizeCq`].
    Cq {
        /// CQ number.
        cqn: u32,
        /// Actual entries.
        cqe: u32,
        /// The CQ ring (a new one after a resize).
        ring: Ring,
    },
    /// [`Command::CreateSrq`].
    Srq {
        /// SRQ number.
        srqn: u32,
        /// Actual depth.
        max_wr: u32,
        /// Actual SGEs.
        max_sge: u32,
        /// The SRQ ring.
        ring: Ring,
    },
    /// [`Command::QuerySrq`].
    SrqAttr(IvQuerySrqOut),
    /// [`Command::CreateQp`].
    Qp {
        /// QP number.
        qpn: u32,
        /// Actual sizes.
        cap: IvQpCap,
        /// The send queue ring.
        sq: Ring,
        /// The receive queue ring (`None` with an SRQ).
        rq: Option<Ring>,
    },
    /// [`Command::QueryQp`].
    QpAttr(alloc::boxed::Box<IvQueryQpOut>),
    /// [`Command::CreateAh`].
    Ah {
        /// AH number.
        ahn: u32,
    },
}

/// An asynchronous event the HCA reports (IBTA 11.6.3), with the number of
/// the object it concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// A QP hit a fatal error and is in ERR.
    QpFatal(u32),
    /// Invalid request on a QP (responder).
    QpRequestError(u32),
    /// Access violation on a QP (responder).
    QpAccessError(u32),
    /// First packet received on a QP in RTR.
    CommEstablished(u32),
    /// The SQ of a QP in SQD is drained.
    SqDrained(u32),
    /// A QP migrated to its alternate path.
    PathMigrated(u32),
    /// An armed QP's primary path failed and it could not migrate.
    PathMigrationError(u32),
    /// Last WQE reached on a QP with an SRQ.
    LastWqeReached(u32),
    /// An SRQ dropped below its limit.
    SrqLimitReached(u32),
    /// An SRQ hit a fatal error.
    SrqError(u32),
    /// A CQ overran or hit a fatal error.
    CqError(u32),
    /// A port became active.
    PortActive(u8),
    /// A port went down.
    PortError(u8),
    /// The whole device failed.
    DeviceFatal,
}

/// An event-queue entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A command finished.
    CommandDone {
        /// The token it was posted with.
        token: u64,
        /// `STATUS_SUCCESS` or why it failed (the object is unchanged).
        status: NtStatus,
        /// Output on success.
        out: CommandOut,
    },
    /// An armed CQ got a completion.
    Completion {
        /// CQ number.
        cqn: u32,
    },
    /// An asynchronous event.
    Async(AsyncEvent),
    /// MADs arrived on the general services interface (QP1): take them
    /// with [`Hca::poll_mad`] until it returns `None`. Announced once
    /// until then: the next MAD after an empty poll announces again.
    Mad,
}

/// The general services interface's well-known Q_Key (IBTA 15.2.2.1):
/// every MAD to QP1 carries it.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The GSI's QP number.
pub const GSI_QPN: u32 = 1;

/// Bytes of a MAD (the GSI's UD payload).
pub const MAD_SIZE: usize = 256;

/// A MAD for the HCA's GSI to send: a UD SEND to `dest_qpn` (normally
/// [`GSI_QPN`]) at `dgid`, with Q_Key [`GSI_QKEY`], from QP1 of `port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadOut {
    /// Local port number, from 1.
    pub port: u8,
    /// Local source GID index.
    pub sgid_index: u8,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Destination QP (24 bits).
    pub dest_qpn: u32,
    /// IP traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
    /// IP hop limit.
    pub hop_limit: u8,
    /// The MAD.
    pub mad: [u8; MAD_SIZE],
}

/// A MAD the HCA's GSI received (announced by [`Event::Mad`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadIn {
    /// Local port number it arrived on.
    pub port: u8,
    /// Local P_Key index it matched.
    pub pkey_index: u16,
    /// Local GID index it was addressed to.
    pub dgid_index: u8,
    /// Source GID (the sender's port).
    pub sgid: [u8; 16],
    /// Source QP (DETH).
    pub src_qpn: u32,
    /// IP traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// IP hop limit.
    pub hop_limit: u8,
    /// The MAD.
    pub mad: [u8; MAD_SIZE],
}

/// A queue doorbell a slot of a doorbell page rings ([`Hca::bind_doorbell`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DoorbellTarget {
    /// The send queue of a QP (its QPN).
    Sq(u32),
    /// The receive queue of a QP (its QPN).
    Rq(u32),
    /// An SRQ (its SRQN).
    Srq(u32),
    /// The arm doorbell of a CQ (its CQN).
    CqArm(u32),
}

/// A doorbell page the HCA allocated ([`Hca::alloc_doorbell_page`]): its
/// number and its memory, which the driver maps into a user process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoorbellPageInfo {
    /// The HCA's number for the page (never reused while the HCA lives).
    pub page: u32,
    /// The page's memory: one whole page, page-aligned, nonpaged.
    pub region: Shared<Region>,
}

/// The hardware interface of an HCA.
///
/// Every method is callable at IRQL <= DISPATCH_LEVEL and never blocks.
pub trait Hca: Send + Sync + 'static {
    /// Device attributes and limits, read at initialization. The driver
    /// reports them and enforces them before it posts a command; the HCA
    /// enforces them again.
    fn caps(&self) -> &IvQueryDeviceOut;

    /// Posts a command. Its completion arrives on the event queue as
    /// [`Event::CommandDone`] with `token`.
    ///
    /// The driver validated the command against [`Hca::caps`] and the
    /// file's objects; the HCA checks it again and refuses (a failure
    /// status in the completion, nothing changed) what it cannot do. A
    /// command larger than two numbers carries a struct of its own
    /// ([`Command::CreateQp`] carries [`CreateQp`], ...), which a backend
    /// hands to its firmware as it is.
    ///
    /// # Errors
    /// Gives the command back when the command queue is full; the driver
    /// keeps it and posts it again after a completion frees a slot.
    fn post_command(&self, token: u64, command: Command) -> Result<(), Command>;

    /// Takes the next event-queue entry, if any.
    fn poll_event(&self) -> Option<Event>;

    /// Takes up to `out.len()` event-queue entries, oldest first, into
    /// `out` from its start; returns how many. Fewer than asked means the
    /// queue was empty when looked at. An HCA overrides the default (one
    /// [`Hca::poll_event`] each) to take a batch in one hold of its event
    /// queue.
    fn poll_events(&self, out: &mut [Option<Event>]) -> usize {
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(event) = self.poll_event() else {
                break;
            };
            *slot = Some(event);
            n += 1;
        }
        n
    }

    /// Re-arms the event queue's interrupt after the driver drained it. If
    /// entries arrived meanwhile the HCA interrupts again at once.
    fn arm_event_queue(&self);

    /// The completion vectors with an event queue of their own (as on
    /// mlx5: the event queue above is the async one — command completions,
    /// async events, MADs — and each completion vector has its own EQ,
    /// interrupt and DPC, to which the [`Event::Completion`]s of the CQs
    /// created on that vector go, and only those). 0 (the default): the
    /// HCA reports completion events on the async event queue.
    fn comp_event_queues(&self) -> u32 {
        0
    }

    /// Takes up to `out.len()` entries of completion vector `vector`'s
    /// event queue, as [`Hca::poll_events`]; 0 for a vector without one.
    fn poll_comp_events(&self, vector: u32, out: &mut [Option<Event>]) -> usize {
        let _ = (vector, out);
        0
    }

    /// Re-arms completion vector `vector`'s event queue after the
    /// driver drained it (its DPC); if entries arrived meanwhile the HCA
    /// raises the vector's interrupt again at once.
    fn arm_comp_event_queue(&self, vector: u32) {
        let _ = vector;
    }

    /// The send queue doorbell of `qpn`: new WQEs were published on its ring.
    /// The speed path: a direct call (an MMIO write on real hardware).
    fn sq_doorbell(&self, qpn: u32);

    /// The receive queue doorbell of `qpn`.
    fn rq_doorbell(&self, qpn: u32);

    /// The doorbell of SRQ `srqn`.
    fn srq_doorbell(&self, srqn: u32);

    /// The arm doorbell of CQ `cqn`: its arm word was written
    /// (`req_notify_cq`). If completions newer than the consumer index
    /// exist, the HCA raises the event at once.
    fn cq_arm_doorbell(&self, cqn: u32);

    /// Allocates a doorbell page (a UAR page): memory the driver maps into
    /// one user-mode file's process, whose slots ring the doorbells of that
    /// file's queues ([`Hca::bind_doorbell`]) with no system call. The HCA
    /// reads it (the soft HCA scans it); user mode may write anything into
    /// it, and the HCA then at worst looks at queues bound to the page.
    ///
    /// IRQL: <= DISPATCH_LEVEL (the driver calls it under its device lock).
    ///
    /// # Errors
    /// `STATUS_NOT_SUPPORTED` (the default) for an HCA without doorbell
    /// pages: user-mode ULPs then have no doorbells;
    /// `STATUS_INSUFFICIENT_RESOURCES` when memory is short.
    fn alloc_doorbell_page(&self) -> Result<DoorbellPageInfo, NtStatus> {
        Err(STATUS_NOT_SUPPORTED)
    }

    /// Frees doorbell page `page` (the driver calls it when the page's file
    /// is gone): its slots ring nothing from now on. The memory lives on
    /// while the driver still holds the region (a mapping not yet undone).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn free_doorbell_page(&self, page: u32) {
        let _ = page;
    }

    /// Binds `target`, a queue of the file doorbell page `page` belongs to,
    /// to a free slot of the page and returns the slot; a target bound to
    /// the page already keeps its slot. The binding ends when the queue is
    /// destroyed (the destroy command unbinds it) or the page is freed.
    /// The driver binds only live queues of the page's own file.
    ///
    /// IRQL: <= DISPATCH_LEVEL (under the driver's device lock).
    ///
    /// # Errors
    /// `STATUS_NOT_SUPPORTED` (the default) without doorbell pages;
    /// `STATUS_INVALID_PARAMETER` for a page that does not exist or a target
    /// bound to another page; `STATUS_INVALID_HANDLE` for a queue that does
    /// not exist; `STATUS_INSUFFICIENT_RESOURCES` when every slot of the
    /// page is taken.
    fn bind_doorbell(&self, page: u32, target: DoorbellTarget) -> Result<u32, NtStatus> {
        let _ = (page, target);
        Err(STATUS_NOT_SUPPORTED)
    }

    /// A user-mode ULP found the HCA not polling its doorbell page (the
    /// page's `polling` word was 0) after ringing it
    /// (`IOCTL_IV_RING_DOORBELLS`): the HCA takes what was rung in its
    /// pages now and polls them again for a while. Called with no driver
    /// lock held; never blocks.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    ///
    /// # Errors
    /// `STATUS_NOT_SUPPORTED` (the default) for an HCA without doorbell
    /// pages.
    fn ring_doorbell_pages(&self) -> Result<(), NtStatus> {
        Err(STATUS_NOT_SUPPORTED)
    }

    /// The device is gone ([`crate::Device::remove`] ran): no command will be
    /// posted again, and the driver forgot every object without destroying
    /// it. The HCA drops every reference it holds to registered memory (the
    /// MRs' regions, and commands not yet executed), so that the pins end
    /// now: on Windows a process's locked pages must be unlocked before the
    /// process exits, and its file's cleanup waits for that. Rings stay
    /// (kernel ULPs may still view them until they close their objects).
    ///
    /// The default does nothing: right for an HCA that holds no memory
    /// references of its own.
    fn device_removed(&self) {}

    /// Sends a MAD from the general services interface (QP1). Like a
    /// doorbell, it never waits: the MAD is queued for the wire (a lost
    /// MAD is the CM's to retransmit).
    ///
    /// The default refuses: an HCA without a GSI.
    ///
    /// # Errors
    /// `STATUS_NOT_SUPPORTED` without a GSI; `STATUS_INVALID_PARAMETER`
    /// for a port, GID index or QP number out of range;
    /// `STATUS_INSUFFICIENT_RESOURCES` when no memory is left for it.
    fn send_mad(&self, mad: &MadOut) -> Result<(), NtStatus> {
        let _ = mad;
        Err(irpverbs_abi::STATUS_NOT_SUPPORTED)
    }

    /// Takes the oldest MAD the GSI received, if any (see [`Event::Mad`]).
    /// The default has none.
    fn poll_mad(&self) -> Option<MadIn> {
        None
    }
}
