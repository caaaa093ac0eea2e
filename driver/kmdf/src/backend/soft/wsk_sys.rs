//! Winsock Kernel: the part of `wsk.h` (and the `ws2def.h` values it
//! needs) that [`super::wsk`] uses, transcribed by hand. wdk-sys 0.5 binds
//! no WSK header (its API subsets are gpio, hid, parallel-ports, spb,
//! storage and usb), so the declarations live here, in bindgen's rendering
//! (`Option<unsafe extern "C" fn>` callbacks, the structs' field names and
//! order as in the header), and the functions come from `netio.lib`.
//!
//! Dispatch-table members the glue never calls keep their place with a
//! plain function-pointer type ([`PfnUnused`]): only the layout matters
//! for them.
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    missing_docs,
    clippy::upper_case_acronyms,
    reason = "the names of wsk.h and ws2def.h"
)]

use core::ffi::c_void;

use wdk_sys::{GUID, KSPIN_LOCK, NTSTATUS, PEPROCESS, PIRP, PMDL, PVOID, SIZE_T, ULONG, USHORT};

/// A dispatch-table member the glue does not call.
pub type PfnUnused = Option<unsafe extern "C" fn()>;

/// `ws2def.h`: `ADDRESS_FAMILY` (`USHORT`).
pub type ADDRESS_FAMILY = USHORT;
/// `ws2def.h`: the generic socket address (its family and 14 bytes); the
/// glue builds `SOCKADDR_IN`/`SOCKADDR_IN6` bytes and passes them as this.
#[repr(C)]
pub struct SOCKADDR {
    pub sa_family: ADDRESS_FAMILY,
    pub sa_data: [u8; 14],
}
pub type PSOCKADDR = *mut SOCKADDR;
/// `ws2def.h`: a control message header (unused: no control data).
#[repr(C)]
pub struct CMSGHDR {
    pub cmsg_len: SIZE_T,
    pub cmsg_level: i32,
    pub cmsg_type: i32,
}
pub type PCMSGHDR = *mut CMSGHDR;

/// `ws2def.h`: `SOCK_DGRAM`.
pub const SOCK_DGRAM: USHORT = 2;
/// `ws2def.h`: `IPPROTO_UDP`.
pub const IPPROTO_UDP: ULONG = 17;
/// `ws2def.h`: `SOL_SOCKET`.
pub const SOL_SOCKET: ULONG = 0xFFFF;

/// `wsk.h`: `MAKE_WSK_VERSION(1, 0)`.
pub const WSK_VERSION_1_0: USHORT = 0x0100;
/// `wsk.h`: `WSK_FLAG_DATAGRAM_SOCKET`.
pub const WSK_FLAG_DATAGRAM_SOCKET: ULONG = 0x0000_0004;
/// `wsk.h`: `WSK_INFINITE_WAIT`.
pub const WSK_INFINITE_WAIT: ULONG = 0xFFFF_FFFF;
/// `wsk.h`: `SO_WSK_EVENT_CALLBACK` (`WSK_SO_BASE + 2`, `WSK_SO_BASE`
/// 0x4000).
pub const SO_WSK_EVENT_CALLBACK: ULONG = 0x4000 + 2;
/// `wsk.h`: `WSK_EVENT_RECEIVE_FROM`.
pub const WSK_EVENT_RECEIVE_FROM: ULONG = 0x0000_0100;
/// `wsk.h`: `WSK_CONTROL_SOCKET_TYPE` (`WskSetOption` 0, `WskGetOption`
/// 1, `WskIoctl` 2).
pub type WSK_CONTROL_SOCKET_TYPE = i32;
/// `WskSetOption`.
pub const WskSetOption: WSK_CONTROL_SOCKET_TYPE = 0;

/// `wsk.h`: `PWSK_CLIENT` (opaque).
pub type PWSK_CLIENT = PVOID;

/// `wsk.h`: `WSK_BUF`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct _WSK_BUF {
    pub Mdl: PMDL,
    pub Offset: ULONG,
    pub Length: SIZE_T,
}
pub type WSK_BUF = _WSK_BUF;
pub type PWSK_BUF = *mut _WSK_BUF;

/// `wsk.h`: `WSK_SOCKET`.
#[repr(C)]
pub struct _WSK_SOCKET {
    pub Dispatch: *const c_void,
}
pub type WSK_SOCKET = _WSK_SOCKET;
pub type PWSK_SOCKET = *mut _WSK_SOCKET;

/// `wsk.h`: `WSK_DATAGRAM_INDICATION`.
#[repr(C)]
pub struct _WSK_DATAGRAM_INDICATION {
    pub Next: *mut _WSK_DATAGRAM_INDICATION,
    pub Buffer: WSK_BUF,
    pub ControlInfo: PCMSGHDR,
    pub ControlInfoLength: ULONG,
    pub RemoteAddress: PSOCKADDR,
}
pub type PWSK_DATAGRAM_INDICATION = *mut _WSK_DATAGRAM_INDICATION;

/// `wsk.h`: `PFN_WSK_CLIENT_EVENT`.
pub type PFN_WSK_CLIENT_EVENT = Option<
    unsafe extern "C" fn(
        ClientContext: PVOID,
        EventType: ULONG,
        Information: PVOID,
        InformationLength: SIZE_T,
    ) -> NTSTATUS,
>;
/// `wsk.h`: `WSK_CLIENT_DISPATCH`.
#[repr(C)]
pub struct _WSK_CLIENT_DISPATCH {
    pub Version: USHORT,
    pub Reserved: USHORT,
    pub WskClientEvent: PFN_WSK_CLIENT_EVENT,
}
pub type WSK_CLIENT_DISPATCH = _WSK_CLIENT_DISPATCH;

/// `wsk.h`: `WSK_CLIENT_NPI`.
#[repr(C)]
pub struct _WSK_CLIENT_NPI {
    pub ClientContext: PVOID,
    pub Dispatch: *const WSK_CLIENT_DISPATCH,
}
pub type WSK_CLIENT_NPI = _WSK_CLIENT_NPI;
pub type PWSK_CLIENT_NPI = *mut _WSK_CLIENT_NPI;

/// `wsk.h`: `WSK_REGISTRATION` (opaque to the client).
#[repr(C)]
pub struct _WSK_REGISTRATION {
    pub ReservedRegistrationState: u64,
    pub ReservedRegistrationContext: PVOID,
    pub ReservedRegistrationLock: KSPIN_LOCK,
}
pub type WSK_REGISTRATION = _WSK_REGISTRATION;
pub type PWSK_REGISTRATION = *mut _WSK_REGISTRATION;

/// `wsk.h`: `PFN_WSK_SOCKET`.
pub type PFN_WSK_SOCKET = Option<
    unsafe extern "C" fn(
        Client: PWSK_CLIENT,
        AddressFamily: ADDRESS_FAMILY,
        SocketType: USHORT,
        Protocol: ULONG,
        Flags: ULONG,
        SocketContext: PVOID,
        Dispatch: *const c_void,
        OwningProcess: PEPROCESS,
        OwningThread: PVOID,
        SecurityDescriptor: PVOID,
        Irp: PIRP,
    ) -> NTSTATUS,
>;
/// `wsk.h`: `WSK_PROVIDER_DISPATCH`.
#[repr(C)]
pub struct _WSK_PROVIDER_DISPATCH {
    pub Version: USHORT,
    pub Reserved: USHORT,
    pub WskSocket: PFN_WSK_SOCKET,
    pub WskSocketConnect: PfnUnused,
    pub WskControlClient: PfnUnused,
    pub WskGetAddressInfo: PfnUnused,
    pub WskFreeAddressInfo: PfnUnused,
    pub WskGetNameInfo: PfnUnused,
}
pub type WSK_PROVIDER_DISPATCH = _WSK_PROVIDER_DISPATCH;

/// `wsk.h`: `WSK_PROVIDER_NPI`.
#[repr(C)]
pub struct _WSK_PROVIDER_NPI {
    pub Client: PWSK_CLIENT,
    pub Dispatch: *const WSK_PROVIDER_DISPATCH,
}
pub type WSK_PROVIDER_NPI = _WSK_PROVIDER_NPI;
pub type PWSK_PROVIDER_NPI = *mut _WSK_PROVIDER_NPI;

/// `wsk.h`: `PFN_WSK_CONTROL_SOCKET`.
pub type PFN_WSK_CONTROL_SOCKET = Option<
    unsafe extern "C" fn(
        Socket: PWSK_SOCKET,
        RequestType: WSK_CONTROL_SOCKET_TYPE,
        ControlCode: ULONG,
        Level: ULONG,
        InputSize: SIZE_T,
        InputBuffer: PVOID,
        OutputSize: SIZE_T,
        OutputBuffer: PVOID,
        OutputSizeReturned: *mut SIZE_T,
        Irp: PIRP,
    ) -> NTSTATUS,
>;
/// `wsk.h`: `PFN_WSK_CLOSE_SOCKET`.
pub type PFN_WSK_CLOSE_SOCKET =
    Option<unsafe extern "C" fn(Socket: PWSK_SOCKET, Irp: PIRP) -> NTSTATUS>;
/// `wsk.h`: `WSK_PROVIDER_BASIC_DISPATCH`.
#[repr(C)]
pub struct _WSK_PROVIDER_BASIC_DISPATCH {
    pub WskControlSocket: PFN_WSK_CONTROL_SOCKET,
    pub WskCloseSocket: PFN_WSK_CLOSE_SOCKET,
}
pub type WSK_PROVIDER_BASIC_DISPATCH = _WSK_PROVIDER_BASIC_DISPATCH;

/// `wsk.h`: `PFN_WSK_BIND`.
pub type PFN_WSK_BIND = Option<
    unsafe extern "C" fn(
        Socket: PWSK_SOCKET,
        LocalAddress: PSOCKADDR,
        Flags: ULONG,
        Irp: PIRP,
    ) -> NTSTATUS,
>;
/// `wsk.h`: `PFN_WSK_SEND_TO`.
pub type PFN_WSK_SEND_TO = Option<
    unsafe extern "C" fn(
        Socket: PWSK_SOCKET,
        Buffer: PWSK_BUF,
        Flags: ULONG,
        RemoteAddress: PSOCKADDR,
        ControlInfoLength: ULONG,
        ControlInfo: PCMSGHDR,
        Irp: PIRP,
    ) -> NTSTATUS,
>;
/// `wsk.h`: `WSK_PROVIDER_DATAGRAM_DISPATCH` (`WskSendMessages` from
/// Windows 10, version 1703, whose WDK the driver builds with).
#[repr(C)]
pub struct _WSK_PROVIDER_DATAGRAM_DISPATCH {
    pub Basic: WSK_PROVIDER_BASIC_DISPATCH,
    pub WskBind: PFN_WSK_BIND,
    pub WskSendTo: PFN_WSK_SEND_TO,
    pub WskReceiveFrom: PfnUnused,
    pub WskRelease: PfnUnused,
    pub WskGetLocalAddress: PfnUnused,
    pub WskSendMessages: PfnUnused,
}
pub type WSK_PROVIDER_DATAGRAM_DISPATCH = _WSK_PROVIDER_DATAGRAM_DISPATCH;

/// `wsk.h`: `PFN_WSK_RECEIVE_FROM_EVENT`.
pub type PFN_WSK_RECEIVE_FROM_EVENT = Option<
    unsafe extern "C" fn(
        SocketContext: PVOID,
        Flags: ULONG,
        DataIndication: PWSK_DATAGRAM_INDICATION,
    ) -> NTSTATUS,
>;
/// `wsk.h`: `WSK_CLIENT_DATAGRAM_DISPATCH`.
#[repr(C)]
pub struct _WSK_CLIENT_DATAGRAM_DISPATCH {
    pub WskReceiveFromEvent: PFN_WSK_RECEIVE_FROM_EVENT,
}
pub type WSK_CLIENT_DATAGRAM_DISPATCH = _WSK_CLIENT_DATAGRAM_DISPATCH;

/// `netioddk.h`: `NPIID` (a GUID).
pub type NPIID = GUID;
/// `wsk.h`: `WSK_EVENT_CALLBACK_CONTROL`.
#[repr(C)]
pub struct _WSK_EVENT_CALLBACK_CONTROL {
    pub NpiId: *const NPIID,
    pub EventMask: ULONG,
}
pub type WSK_EVENT_CALLBACK_CONTROL = _WSK_EVENT_CALLBACK_CONTROL;

#[link(name = "netio")]
unsafe extern "C" {
    /// `wsk.h`: the WSK NPI's identifier (`NPI_WSK_INTERFACE_ID`).
    pub static NPI_WSK_INTERFACE_ID: NPIID;
    pub fn WskRegister(
        WskClientNpi: PWSK_CLIENT_NPI,
        WskRegistration: PWSK_REGISTRATION,
    ) -> NTSTATUS;
    pub fn WskCaptureProviderNPI(
        WskRegistration: PWSK_REGISTRATION,
        WaitTimeout: ULONG,
        WskProviderNpi: PWSK_PROVIDER_NPI,
    ) -> NTSTATUS;
    pub fn WskReleaseProviderNPI(WskRegistration: PWSK_REGISTRATION);
    pub fn WskDeregister(WskRegistration: PWSK_REGISTRATION);
}
