//! The soft HCA's RoCEv2 wire over a Winsock Kernel datagram socket: the
//! glue between WSK and `irpverbs_soft::sockwire`, which decides
//! everything (buffers, batching, resealing, the receive hand-off, timer
//! arming) and is tested in host mode through the same calls.
//!
//! - **Configuration**: the device's hardware key (`RoceEnable`,
//!   `RoceAddress`, `RocePort`, the INF's defaults), read in
//!   `EvtDriverDeviceAdd` ([`read_config`]) before the soft HCA is made
//!   with that address.
//! - **Start** (D0Entry, PASSIVE_LEVEL): `WskRegister`,
//!   `WskCaptureProviderNPI`, a `WSK_FLAG_DATAGRAM_SOCKET` UDP socket whose
//!   receive event is [`receive_from_event`], bound to the address, the
//!   event enabled (`SO_WSK_EVENT_CALLBACK`, `WSK_EVENT_RECEIVE_FROM`); one
//!   IRP and one MDL per send buffer, a one-shot `EX_TIMER`; then the link
//!   is attached to the HCA. Each control call waits for its IRP.
//! - **Send** ([`WskSocket::send`], <= DISPATCH_LEVEL, never waiting): per
//!   buffer, `IoReuseIrp`, the completion routine, `WskSendTo`; the
//!   completion ([`send_complete`], <= DISPATCH_LEVEL) gives the buffer
//!   back (`SocketLink::send_done`) and keeps the IRP
//!   (`STATUS_MORE_PROCESSING_REQUIRED`).
//! - **Receive** ([`receive_from_event`], DISPATCH_LEVEL): each indicated
//!   datagram's bytes (one MDL: its system address; a chain: copied into
//!   the wire's scratch buffer) go to `SocketLink::received`, then
//!   `end_receive`; the indications are not retained.
//! - **Timer** ([`timer_fired`], DISPATCH_LEVEL): `SocketLink::on_timer`.
//! - **Stop** (D0Exit): the link is detached, the socket closed (WSK
//!   completes the sends in flight first), the timer deleted with a wait,
//!   the provider released and the registration ended; then the IRPs and
//!   MDLs are freed.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::net::SocketAddr;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use irpverbs_abi::{STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_PARAMETER, nt_success};
use irpverbs_core::{Platform, SpinLock};
use irpverbs_ring::Shared;
use irpverbs_soft::sockwire::{
    DatagramSocket, Outgoing, REG_ADDRESS, REG_ENABLE, REG_PORT, RegValue, SLOT_BYTES,
    SOCKADDR_LEN, SocketLink, WireConfig, decode_sockaddr, encode_sockaddr,
};
use wdk_sys::ntddk::{
    ExAllocateTimer, ExDeleteTimer, ExSetTimer, IoAllocateIrp, IoAllocateMdl, IoFreeIrp, IoFreeMdl,
    IoReuseIrp, KeInitializeEvent, KeSetEvent, KeWaitForSingleObject, MmBuildMdlForNonPagedPool,
    MmMapLockedPagesSpecifyCache,
};
use wdk_sys::{
    _EVENT_TYPE, _EX_TIMER, _KWAIT_REASON, _MEMORY_CACHING_TYPE, _MM_PAGE_PRIORITY, KEVENT,
    KEY_READ, LONGLONG, MdlMappingNoExecute, NTSTATUS, PDEVICE_OBJECT, PEX_TIMER, PIRP,
    PLUGPLAY_REGKEY_DEVICE, PMDL, PVOID, SIZE_T, STATUS_MORE_PROCESSING_REQUIRED, ULONG,
    UNICODE_STRING, USHORT, WDF_NO_OBJECT_ATTRIBUTES, WDFDEVICE, WDFKEY,
    call_unsafe_wdf_function_binding,
};

use super::Hw;
use super::irp;
use super::wsk_sys::*;
use crate::platform::{KmdfPlatform, KmdfSpinLock};

/// Send buffers (and IRPs) per wire.
const SEND_SLOTS: usize = 256;
/// `STATUS_SUCCESS`.
const STATUS_SUCCESS: NTSTATUS = 0;
/// `KernelMode` as a `KPROCESSOR_MODE`.
const KERNEL_MODE: i8 = 0;
/// `MDL_MAPPED_TO_SYSTEM_VA | MDL_SOURCE_IS_NONPAGED_POOL` (wdm.h: 0x0001,
/// 0x0004).
const MDL_SYSTEM_VA: i16 = 0x0001 | 0x0004;

/// The wire's link over its socket.
type WskLink = SocketLink<KmdfPlatform, WskSocket>;

// ---------------------------------------------------------------- registry

/// The wire the device's registry values configure (`Ok(None)`: loopback
/// only). A value that cannot be read counts as absent.
///
/// IRQL: PASSIVE_LEVEL.
///
/// # Errors
/// As [`WireConfig::from_registry`]; the key cannot be opened: its status.
///
/// # Safety
/// `device` is a live WDFDEVICE.
pub(crate) unsafe fn read_config(device: WDFDEVICE) -> Result<Option<WireConfig>, NTSTATUS> {
    let mut key: WDFKEY = core::ptr::null_mut();
    // SAFETY: `device` is live (caller); the hardware key for reading, no
    // attributes; `key` receives the handle, closed below; PASSIVE_LEVEL.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDeviceOpenRegistryKey,
            device,
            PLUGPLAY_REGKEY_DEVICE,
            KEY_READ,
            WDF_NO_OBJECT_ATTRIBUTES,
            &raw mut key
        )
    };
    if !nt_success(status) {
        return Err(status);
    }
    let mut text = [0u8; 64];
    let enable = query_ulong(key, REG_ENABLE);
    let port = query_ulong(key, REG_PORT);
    let address = query_string(key, REG_ADDRESS, &mut text);
    // SAFETY: the key opened above, closed once.
    unsafe { call_unsafe_wdf_function_binding!(WdfRegistryClose, key) };
    WireConfig::from_registry(|name| match name {
        REG_ENABLE => enable.map(RegValue::Dword),
        REG_PORT => port.map(RegValue::Dword),
        REG_ADDRESS => address.map(RegValue::Sz),
        _ => None,
    })
}

/// A value name in UTF-16 (ASCII names only), for a UNICODE_STRING.
struct Name {
    buf: [u16; 32],
    len: usize,
}

impl Name {
    fn new(name: &str) -> Self {
        let mut this = Self {
            buf: [0; 32],
            len: 0,
        };
        for (slot, c) in this.buf.iter_mut().zip(name.encode_utf16()) {
            *slot = c;
            this.len += 1;
        }
        this
    }

    /// Valid while `self` is borrowed.
    fn unicode(&mut self) -> UNICODE_STRING {
        let bytes = USHORT::try_from(self.len * 2).unwrap_or(0);
        UNICODE_STRING {
            Length: bytes,
            MaximumLength: bytes,
            Buffer: self.buf.as_mut_ptr(),
        }
    }
}

fn query_ulong(key: WDFKEY, name: &str) -> Option<u32> {
    let mut name = Name::new(name);
    let name = name.unicode();
    let mut value: ULONG = 0;
    // SAFETY: `key` is open; the name is a valid UNICODE_STRING over a
    // live buffer; the value is written to `value`; PASSIVE_LEVEL.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfRegistryQueryULong,
            key,
            &raw const name,
            &raw mut value
        )
    };
    nt_success(status).then_some(value)
}

/// A REG_SZ value as ASCII in `out` (an address: anything else is refused
/// by the parser).
fn query_string<'a>(key: WDFKEY, name: &str, out: &'a mut [u8; 64]) -> Option<&'a str> {
    let mut name = Name::new(name);
    let name = name.unicode();
    let mut wide = [0u16; 64];
    let mut value = UNICODE_STRING {
        Length: 0,
        MaximumLength: (wide.len() * 2) as USHORT,
        Buffer: wide.as_mut_ptr(),
    };
    let mut needed: USHORT = 0;
    // SAFETY: `key` is open; the name and the value's buffer are valid
    // for the call; the value's MaximumLength is its buffer's size.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfRegistryQueryUnicodeString,
            key,
            &raw const name,
            &raw mut needed,
            &raw mut value
        )
    };
    if !nt_success(status) {
        return None;
    }
    let chars = (usize::from(value.Length) / 2).min(wide.len());
    let mut n = 0;
    for &c in wide.get(..chars)? {
        if c == 0 {
            break;
        }
        *out.get_mut(n)? = u8::try_from(c).ok().filter(u8::is_ascii)?;
        n += 1;
    }
    core::str::from_utf8(out.get(..n)?).ok()
}

// ---------------------------------------------------------------- IRPs

/// An event a control call's IRP completion sets.
struct Waiter(UnsafeCell<KEVENT>);

impl Waiter {
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when the pool refuses it.
    fn new() -> Result<Box<Self>, NTSTATUS> {
        let this = irpverbs_ring::try_box(Self(UnsafeCell::new(KEVENT::default())))
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        // SAFETY: the event is in nonpaged pool (the box) and not shared
        // yet; initialized at PASSIVE_LEVEL.
        unsafe { KeInitializeEvent(this.0.get(), _EVENT_TYPE::NotificationEvent, 0) };
        Ok(this)
    }
}

/// A control call's completion: sets the waiter's event, keeps the IRP.
///
/// IRQL: <= DISPATCH_LEVEL.
unsafe extern "C" fn control_complete(
    _device: PDEVICE_OBJECT,
    _irp: PIRP,
    context: PVOID,
) -> NTSTATUS {
    // SAFETY: the context is the waiter `call` boxed, which lives until
    // the event is set and waited for.
    let waiter = unsafe { &*context.cast_const().cast::<Waiter>() };
    // SAFETY: an initialized event; Wait FALSE at <= DISPATCH_LEVEL.
    let _ = unsafe { KeSetEvent(waiter.0.get(), 0, 0) };
    STATUS_MORE_PROCESSING_REQUIRED
}

/// Runs one WSK control call on a new IRP and waits for it: its status and
/// information.
///
/// IRQL: PASSIVE_LEVEL.
fn call(issue: impl FnOnce(PIRP) -> NTSTATUS) -> Result<usize, NTSTATUS> {
    let waiter = Waiter::new()?;
    // SAFETY: one stack location, no quota; PASSIVE_LEVEL.
    let irp = unsafe { IoAllocateIrp(1, 0) };
    if irp.is_null() {
        return Err(STATUS_INSUFFICIENT_RESOURCES);
    }
    // SAFETY: a new IRP of ours, one stack location; the waiter outlives
    // the completion (waited for below).
    unsafe {
        irp::set_completion(
            irp,
            Some(control_complete),
            (&raw const *waiter).cast_mut().cast(),
        )
    };
    // WSK completes the IRP whatever the call returns (pending, success
    // or failure): the IRP's status is the result.
    let _ = issue(irp);
    // SAFETY: the waiter's event; no timeout at PASSIVE_LEVEL.
    let _ = unsafe {
        KeWaitForSingleObject(
            waiter.0.get().cast(),
            _KWAIT_REASON::Executive,
            KERNEL_MODE,
            0,
            core::ptr::null_mut(),
        )
    };
    // SAFETY: the IRP completed (its routine ran) and is ours.
    let (status, information) = unsafe { irp::status(irp) };
    // SAFETY: ours, completed, not used again.
    unsafe { IoFreeIrp(irp) };
    if nt_success(status) {
        Ok(information as usize)
    } else {
        Err(status)
    }
}

// ---------------------------------------------------------------- socket

/// One send buffer's IRP, MDL and destination.
struct Slot {
    irp: PIRP,
    mdl: PMDL,
    /// The destination, as a SOCKADDR, while the send is in flight.
    to: UnsafeCell<[u8; SOCKADDR_LEN]>,
    index: u16,
    /// The wire (for the completion).
    owner: *const WskWireState,
}

/// The platform side of the link: the WSK socket, the send slots, the
/// timer.
pub(crate) struct WskSocket {
    socket: AtomicPtr<WSK_SOCKET>,
    slots: UnsafeCell<Vec<Slot>>,
    timer: AtomicPtr<_EX_TIMER>,
    /// Sends in progress (the close waits for them).
    users: AtomicUsize,
    /// The socket is being closed: sends give their buffers back.
    closing: AtomicBool,
}

// SAFETY: the socket and timer are used through atomics and WSK/kernel
// calls that are thread-safe; a slot is used only by the holder of its
// buffer (the pool hands each out once); the vector is filled before the
// link is attached and freed after it is detached and the socket closed.
unsafe impl Send for WskSocket {}
// SAFETY: as above.
unsafe impl Sync for WskSocket {}

impl DatagramSocket for WskSocket {
    /// `WskSendTo` per buffer, with the buffer's IRP; a call that fails
    /// synchronously still completes its IRP (WSK's rule), so the
    /// completion gives the buffer back either way.
    fn send(&self, batch: &[Outgoing]) {
        self.users.fetch_add(1, Ordering::SeqCst);
        let socket = self.socket.load(Ordering::Acquire);
        let closed = self.closing.load(Ordering::SeqCst) || socket.is_null();
        // SAFETY: filled before the link was attached, not resized until
        // the close, which waits for `users`.
        let slots = unsafe { &*self.slots.get() };
        for o in batch {
            let Some(slot) = slots.get(usize::from(o.slot)) else {
                continue;
            };
            if closed {
                // SAFETY: the wire outlives its slots.
                unsafe { &*slot.owner }.link.send_done(slot.index, false);
                continue;
            }
            let (to, _) = encode_sockaddr(&o.to);
            // SAFETY: the slot's buffer (and so its address) is this
            // send's until its completion.
            unsafe { *slot.to.get() = to };
            // SAFETY: the slot's IRP is ours and idle (its buffer was
            // free); reused with a fresh status.
            unsafe { IoReuseIrp(slot.irp, STATUS_INSUFFICIENT_RESOURCES) };
            // SAFETY: a reused IRP with its one stack location; the slot
            // lives until the wire is freed, after the socket is closed.
            unsafe {
                irp::set_completion(
                    slot.irp,
                    Some(send_complete),
                    (&raw const *slot).cast_mut().cast(),
                );
            };
            let mut buf = WSK_BUF {
                Mdl: slot.mdl,
                Offset: 0,
                Length: SIZE_T::from(o.len),
            };
            // SAFETY: the socket is a live WSK datagram socket (sends stop
            // before it is closed: the link is detached first); its
            // dispatch is the datagram provider dispatch.
            let dispatch = unsafe { (*socket).Dispatch.cast::<WSK_PROVIDER_DATAGRAM_DISPATCH>() };
            // SAFETY: as above.
            let Some(send_to) = (unsafe { (*dispatch).WskSendTo }) else {
                continue;
            };
            // SAFETY: the buffer's MDL describes the slot's nonpaged
            // memory, `len` bytes of it; the address lives in the slot
            // until completion; no control data; the IRP is prepared;
            // <= DISPATCH_LEVEL, never waiting.
            let _ = unsafe {
                send_to(
                    socket,
                    &raw mut buf,
                    0,
                    slot.to.get().cast(),
                    0,
                    core::ptr::null_mut(),
                    slot.irp,
                )
            };
        }
        self.users.fetch_sub(1, Ordering::SeqCst);
    }

    fn now_ns(&self) -> u64 {
        KmdfPlatform.now_ns()
    }

    /// `ExSetTimer`, one-shot, relative.
    fn arm_timer(&self, due_ns: u64) {
        let timer = self.timer.load(Ordering::Acquire);
        if timer.is_null() {
            return;
        }
        let due = (due_ns.saturating_sub(self.now_ns()) / 100).clamp(1, i64::MAX as u64);
        let due = LONGLONG::try_from(due).unwrap_or(LONGLONG::MAX);
        // SAFETY: the timer lives until the wire stops, which deletes it
        // after the link is detached (no more arming from sends) and with
        // a wait for its callback; relative due time; one-shot.
        let _ = unsafe { ExSetTimer(timer, -due, 0, core::ptr::null_mut()) };
    }
}

/// A send's completion: the buffer is free again; the IRP is kept.
///
/// IRQL: <= DISPATCH_LEVEL.
unsafe extern "C" fn send_complete(_device: PDEVICE_OBJECT, irp: PIRP, context: PVOID) -> NTSTATUS {
    // SAFETY: the context is the slot `send` prepared; slots live until
    // the socket is closed (every send completed).
    let slot = unsafe { &*context.cast_const().cast::<Slot>() };
    // SAFETY: the IRP completed.
    let (status, _) = unsafe { irp::status(irp) };
    // SAFETY: the wire outlives its slots.
    let wire = unsafe { &*slot.owner };
    wire.link.send_done(slot.index, nt_success(status));
    STATUS_MORE_PROCESSING_REQUIRED
}

// ---------------------------------------------------------------- the wire

/// What the callbacks reach: the HCA, the link, the scratch buffer for
/// chained receives.
struct WskWireState {
    hca: Hw,
    link: Shared<WskLink>,
    /// A chained datagram's bytes, gathered ([`SLOT_BYTES`]).
    scratch: KmdfSpinLock<Vec<u8>>,
    registration: UnsafeCell<WSK_REGISTRATION>,
    provider: UnsafeCell<WSK_PROVIDER_NPI>,
}

/// The client dispatch WSK registration needs (no client events).
static CLIENT_DISPATCH: WSK_CLIENT_DISPATCH = WSK_CLIENT_DISPATCH {
    Version: WSK_VERSION_1_0,
    Reserved: 0,
    WskClientEvent: None,
};

/// The socket's receive event.
static DATAGRAM_DISPATCH: WSK_CLIENT_DATAGRAM_DISPATCH = WSK_CLIENT_DATAGRAM_DISPATCH {
    WskReceiveFromEvent: Some(receive_from_event),
};

/// The device's wire: stopped (null) or running (D0).
pub(crate) struct WskWire {
    config: WireConfig,
    hca: Hw,
    running: AtomicPtr<WskWireState>,
}

// SAFETY: the running state is reached through an atomic pointer and
// created and destroyed only in D0Entry and D0Exit, which PnP serializes.
unsafe impl Send for WskWire {}
// SAFETY: as above.
unsafe impl Sync for WskWire {}

impl WskWire {
    /// A stopped wire at `config` for `hca`.
    pub(crate) fn new(config: WireConfig, hca: Hw) -> Self {
        Self {
            config,
            hca,
            running: AtomicPtr::new(core::ptr::null_mut()),
        }
    }

    /// D0Entry: registers with WSK, opens and binds the socket, enables
    /// its receive event, and attaches the link to the HCA.
    ///
    /// IRQL: PASSIVE_LEVEL.
    ///
    /// # Errors
    /// A WSK or allocation failure: nothing is left behind.
    pub(crate) fn start(&self) -> Result<(), NTSTATUS> {
        if !self.running.load(Ordering::Acquire).is_null() {
            return Ok(());
        }
        let socket = WskSocket {
            socket: AtomicPtr::new(core::ptr::null_mut()),
            slots: UnsafeCell::new(Vec::new()),
            timer: AtomicPtr::new(core::ptr::null_mut()),
            users: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
        };
        let link = SocketLink::new(&KmdfPlatform, self.config.addr, socket, SEND_SLOTS)?;
        let link = Shared::try_new(link).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut scratch = Vec::new();
        scratch
            .try_reserve_exact(SLOT_BYTES)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        scratch.resize(SLOT_BYTES, 0);
        let state = irpverbs_ring::try_box(WskWireState {
            hca: Shared::clone(&self.hca),
            link: Shared::clone(&link),
            scratch: KmdfSpinLock::new(scratch),
            registration: UnsafeCell::new(WSK_REGISTRATION {
                ReservedRegistrationState: 0,
                ReservedRegistrationContext: core::ptr::null_mut(),
                ReservedRegistrationLock: 0,
            }),
            provider: UnsafeCell::new(WSK_PROVIDER_NPI {
                Client: core::ptr::null_mut(),
                Dispatch: core::ptr::null(),
            }),
        })
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let state = Box::into_raw(state);
        // SAFETY: just made; freed by `teardown` only.
        let result = unsafe { open(state, &link, self.config.addr) };
        match result {
            Ok(()) => {
                if let Err(status) = self.hca.attach_link(link) {
                    // SAFETY: opened above, not attached: ours to undo.
                    unsafe { teardown(state) };
                    return Err(status);
                }
                self.running.store(state, Ordering::Release);
                Ok(())
            }
            Err(status) => {
                // SAFETY: as above.
                unsafe { teardown(state) };
                Err(status)
            }
        }
    }

    /// D0Exit: detaches the link and closes everything `start` opened.
    ///
    /// IRQL: PASSIVE_LEVEL.
    pub(crate) fn stop(&self) {
        let state = self.running.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if state.is_null() {
            return;
        }
        self.hca.detach_link();
        // SAFETY: the running state, swapped out: torn down once.
        unsafe { teardown(state) };
    }
}

/// Opens the wire: slots, timer, registration, provider, socket, bind,
/// receive event.
///
/// # Safety
/// `state` is a live state no one else uses yet.
unsafe fn open(state: *mut WskWireState, link: &WskLink, addr: SocketAddr) -> Result<(), NTSTATUS> {
    let socket = link.socket();
    // SAFETY: not shared yet (caller).
    let slots = unsafe { &mut *socket.slots.get() };
    slots
        .try_reserve_exact(link.buffers())
        .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
    for index in 0..link.buffers() {
        let index = u16::try_from(index).map_err(|_| STATUS_INVALID_PARAMETER)?;
        let region = link.buffer(index).ok_or(STATUS_INVALID_PARAMETER)?;
        // SAFETY: the region is nonpaged pool of SLOT_BYTES (below 4 GiB),
        // alive with the link; no IRP.
        let mdl = unsafe {
            IoAllocateMdl(
                region.addr() as usize as PVOID,
                SLOT_BYTES as ULONG,
                0,
                0,
                core::ptr::null_mut(),
            )
        };
        if mdl.is_null() {
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        // SAFETY: an MDL over nonpaged pool, just allocated.
        unsafe { MmBuildMdlForNonPagedPool(mdl) };
        // SAFETY: one stack location, no quota.
        let irp = unsafe { IoAllocateIrp(1, 0) };
        if irp.is_null() {
            // SAFETY: the MDL just built, not handed out.
            unsafe { IoFreeMdl(mdl) };
            return Err(STATUS_INSUFFICIENT_RESOURCES);
        }
        slots.push(Slot {
            irp,
            mdl,
            to: UnsafeCell::new([0; SOCKADDR_LEN]),
            index,
            owner: state,
        });
    }
    // SAFETY: `timer_fired` has the EXT_CALLBACK signature; its context is
    // the state, which outlives the timer (deleted with a wait first).
    let timer = unsafe { ExAllocateTimer(Some(timer_fired), state.cast(), 0) };
    if timer.is_null() {
        return Err(STATUS_INSUFFICIENT_RESOURCES);
    }
    socket.timer.store(timer, Ordering::Release);
    let mut client = WSK_CLIENT_NPI {
        ClientContext: core::ptr::null_mut(),
        Dispatch: &raw const CLIENT_DISPATCH,
    };
    // SAFETY: the state is live (caller).
    let registration = unsafe { (*state).registration.get() };
    // SAFETY: the client NPI is valid for the call (WSK copies it); the
    // registration lives in the state until WskDeregister; PASSIVE_LEVEL.
    let status = unsafe { WskRegister(&raw mut client, registration) };
    if !nt_success(status) {
        return Err(status);
    }
    // SAFETY: as above.
    let provider = unsafe { (*state).provider.get() };
    // SAFETY: a registered client; waits for the provider; PASSIVE_LEVEL.
    let status = unsafe { WskCaptureProviderNPI(registration, WSK_INFINITE_WAIT, provider) };
    if !nt_success(status) {
        // SAFETY: registered above, not captured: deregistered once.
        unsafe { WskDeregister(registration) };
        // The registration is marked undone by clearing the provider.
        return Err(status);
    }
    // SAFETY: captured just now.
    let client_handle = unsafe { (*provider).Client };
    // SAFETY: as above.
    let dispatch = unsafe { (*provider).Dispatch };
    // SAFETY: the provider dispatch WSK returned.
    let make_socket = unsafe { (*dispatch).WskSocket }.ok_or(STATUS_INVALID_PARAMETER)?;
    let family = if addr.is_ipv4() {
        irpverbs_soft::sockwire::AF_INET
    } else {
        irpverbs_soft::sockwire::AF_INET6
    };
    let created = call(|irp| {
        // SAFETY: the captured client; a UDP datagram socket whose context
        // is the state and whose receive event is ours; no owning process
        // or thread (the system's), no security descriptor; the IRP is
        // prepared.
        unsafe {
            make_socket(
                client_handle,
                family,
                SOCK_DGRAM,
                IPPROTO_UDP,
                WSK_FLAG_DATAGRAM_SOCKET,
                state.cast(),
                (&raw const DATAGRAM_DISPATCH).cast(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                irp,
            )
        }
    })?;
    let wsk_socket = created as PWSK_SOCKET;
    socket.socket.store(wsk_socket, Ordering::Release);
    // SAFETY: the socket WSK created: its dispatch is the datagram one.
    let dgram = unsafe {
        (*wsk_socket)
            .Dispatch
            .cast::<WSK_PROVIDER_DATAGRAM_DISPATCH>()
    };
    // SAFETY: as above.
    let bind = unsafe { (*dgram).WskBind }.ok_or(STATUS_INVALID_PARAMETER)?;
    let (mut local, _) = encode_sockaddr(&addr);
    call(|irp| {
        // SAFETY: a live socket; the address is a SOCKADDR_IN(6) valid for
        // the call; no flags; the IRP is prepared.
        unsafe { bind(wsk_socket, local.as_mut_ptr().cast(), 0, irp) }
    })?;
    // SAFETY: as above.
    let control = unsafe { (*dgram).Basic.WskControlSocket }.ok_or(STATUS_INVALID_PARAMETER)?;
    let mut events = WSK_EVENT_CALLBACK_CONTROL {
        // SAFETY: an immutable extern static of netio.
        NpiId: &raw const NPI_WSK_INTERFACE_ID,
        EventMask: WSK_EVENT_RECEIVE_FROM,
    };
    call(|irp| {
        // SAFETY: a live socket; SO_WSK_EVENT_CALLBACK at SOL_SOCKET with a
        // WSK_EVENT_CALLBACK_CONTROL valid for the call; no output; the
        // IRP is prepared.
        unsafe {
            control(
                wsk_socket,
                WskSetOption,
                SO_WSK_EVENT_CALLBACK,
                SOL_SOCKET,
                size_of::<WSK_EVENT_CALLBACK_CONTROL>() as SIZE_T,
                (&raw mut events).cast(),
                0,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                irp,
            )
        }
    })?;
    Ok(())
}

/// Closes what [`open`] opened (any prefix of it) and frees the state.
///
/// IRQL: PASSIVE_LEVEL.
///
/// # Safety
/// `state` came from `Box::into_raw` in `WskWire::start`, and its link is
/// not attached to the HCA.
unsafe fn teardown(state: *mut WskWireState) {
    // SAFETY: live until freed below (caller).
    let st = unsafe { &*state };
    {
        let socket = st.link.socket();
        socket.closing.store(true, Ordering::SeqCst);
        // A transmit that took the link before it was detached may still
        // be sending: wait for it (microseconds).
        while socket.users.load(Ordering::SeqCst) != 0 {
            let mut zero = wdk_sys::LARGE_INTEGER { QuadPart: -1 };
            // SAFETY: a kernel-mode, non-alertable 100 ns delay at
            // PASSIVE_LEVEL.
            let _ =
                unsafe { wdk_sys::ntddk::KeDelayExecutionThread(KERNEL_MODE, 0, &raw mut zero) };
        }
        let wsk_socket = socket.socket.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !wsk_socket.is_null() {
            // SAFETY: the socket WSK created; its dispatch is the datagram
            // one.
            let dgram = unsafe {
                (*wsk_socket)
                    .Dispatch
                    .cast::<WSK_PROVIDER_DATAGRAM_DISPATCH>()
            };
            // SAFETY: as above.
            if let Some(close) = unsafe { (*dgram).Basic.WskCloseSocket } {
                // SAFETY: a live socket, closed once; WSK completes the
                // sends in flight before the close; the IRP is prepared.
                let _ = call(|irp| unsafe { close(wsk_socket, irp) });
            }
        }
        let timer = socket.timer.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !timer.is_null() {
            // SAFETY: the timer `open` allocated, deleted once, cancelled
            // with a wait for its callback; PASSIVE_LEVEL.
            let _ = unsafe { ExDeleteTimer(timer, 1, 1, core::ptr::null_mut()) };
        }
        // SAFETY: nothing uses the slots any more: the socket is closed
        // (every send completed) and the link detached.
        let slots = unsafe { &mut *socket.slots.get() };
        for slot in slots.drain(..) {
            // SAFETY: the slot's IRP and MDL, idle, freed once.
            unsafe { IoFreeIrp(slot.irp) };
            // SAFETY: as above.
            unsafe { IoFreeMdl(slot.mdl) };
        }
    }
    let provider = st.provider.get();
    // SAFETY: the provider NPI, set when captured.
    if !unsafe { (*provider).Dispatch }.is_null() {
        // SAFETY: captured in `open`, released once, then deregistered.
        unsafe { WskReleaseProviderNPI(st.registration.get()) };
        // SAFETY: as above.
        unsafe { WskDeregister(st.registration.get()) };
    }
    // SAFETY: from Box::into_raw, nothing refers to it any more.
    drop(unsafe { Box::from_raw(state) });
}

/// The timer's callback (`EXT_CALLBACK`): the link's timers.
///
/// IRQL: DISPATCH_LEVEL.
unsafe extern "C" fn timer_fired(_timer: PEX_TIMER, context: PVOID) {
    // SAFETY: the context is the wire's state, which lives until the timer
    // is deleted with a wait.
    let st = unsafe { &*context.cast_const().cast::<WskWireState>() };
    st.link.on_timer(&st.hca);
}

/// The socket's receive event (`PFN_WSK_RECEIVE_FROM_EVENT`): every
/// indicated datagram to the link, then the batch's end. Nothing is
/// retained (`STATUS_SUCCESS`).
///
/// IRQL: <= DISPATCH_LEVEL.
unsafe extern "C" fn receive_from_event(
    context: PVOID,
    _flags: ULONG,
    mut indication: PWSK_DATAGRAM_INDICATION,
) -> NTSTATUS {
    // SAFETY: the socket's context is the wire's state, which outlives the
    // socket (closed before it is freed).
    let st = unsafe { &*context.cast_const().cast::<WskWireState>() };
    let link = &st.link;
    if indication.is_null() {
        // The socket is closing.
        return STATUS_SUCCESS;
    }
    while !indication.is_null() {
        // SAFETY: WSK's indication list, valid during the callback.
        let ind = unsafe { &*indication };
        // SAFETY: the remote address WSK filled: its family first.
        let family = unsafe { (*ind.RemoteAddress).sa_family };
        let len = if family == irpverbs_soft::sockwire::AF_INET {
            16
        } else {
            SOCKADDR_LEN
        };
        // SAFETY: a SOCKADDR_IN (16 bytes) or SOCKADDR_IN6 (28), by family.
        let from = unsafe { core::slice::from_raw_parts(ind.RemoteAddress.cast::<u8>(), len) };
        if let Some(from) = decode_sockaddr(from) {
            deliver(st, link, from, &ind.Buffer);
        }
        indication = ind.Next;
    }
    link.end_receive(&st.hca);
    STATUS_SUCCESS
}

/// One indicated datagram: its bytes from the MDL (mapped, or copied from a
/// chain into the scratch buffer) to the link.
///
/// IRQL: <= DISPATCH_LEVEL.
fn deliver(st: &WskWireState, link: &WskLink, from: SocketAddr, buf: &WSK_BUF) {
    let len = usize::try_from(buf.Length).unwrap_or(usize::MAX);
    if len == 0 || len > SLOT_BYTES || buf.Mdl.is_null() {
        link.received(&st.hca, from, &[]);
        return;
    }
    // SAFETY: WSK's MDL, valid during the callback.
    let mdl = unsafe { &*buf.Mdl };
    let offset = buf.Offset as usize;
    if mdl.Next.is_null() && offset + len <= mdl.ByteCount as usize {
        if let Some(base) = system_address(buf.Mdl) {
            // SAFETY: the MDL maps ByteCount bytes at `base`, of which
            // `offset..offset+len` are the datagram.
            let start = unsafe { base.cast::<u8>().add(offset) };
            // SAFETY: as above.
            let bytes = unsafe { core::slice::from_raw_parts(start, len) };
            link.received(&st.hca, from, bytes);
        }
        return;
    }
    st.scratch.lock(|scratch| {
        let mut at = 0;
        let mut skip = offset;
        let mut m = buf.Mdl;
        while !m.is_null() && at < len {
            // SAFETY: a link of WSK's MDL chain.
            let cur = unsafe { &*m };
            let count = cur.ByteCount as usize;
            if let Some(base) = system_address(m) {
                let from_here = count.saturating_sub(skip).min(len - at);
                // SAFETY: `skip..skip+from_here` is inside this MDL's bytes.
                let start = unsafe { base.cast::<u8>().add(skip) };
                // SAFETY: as above.
                let src = unsafe { core::slice::from_raw_parts(start, from_here) };
                if let Some(dst) = scratch.get_mut(at..at + from_here) {
                    dst.copy_from_slice(src);
                }
                at += from_here;
            }
            skip = skip.saturating_sub(count);
            m = cur.Next;
        }
        if at == len {
            link.received(&st.hca, from, &scratch[..len]);
        }
    });
}

/// `MmGetSystemAddressForMdlSafe(mdl, NormalPagePriority |
/// MdlMappingNoExecute)`.
///
/// IRQL: <= DISPATCH_LEVEL.
fn system_address(mdl: PMDL) -> Option<PVOID> {
    // SAFETY: a live MDL (the caller's).
    let m = unsafe { &*mdl };
    let va = if m.MdlFlags & MDL_SYSTEM_VA != 0 {
        m.MappedSystemVa
    } else {
        // SAFETY: a locked MDL (WSK's receive buffers are); a kernel
        // mapping that returns null on failure; <= DISPATCH_LEVEL.
        unsafe {
            MmMapLockedPagesSpecifyCache(
                mdl,
                KERNEL_MODE,
                _MEMORY_CACHING_TYPE::MmCached,
                core::ptr::null_mut(),
                0,
                _MM_PAGE_PRIORITY::NormalPagePriority as u32 | MdlMappingNoExecute,
            )
        }
    };
    (!va.is_null()).then_some(va)
}
