//! MOCK of wdk-sys 0.5.2 for type-checking irpverbs-kmdf on Linux. Types and
//! signatures transcribed from the KMDF/WDM headers the way bindgen renders
//! them (ModuleConsts enums, Option<unsafe extern "C" fn> callbacks). Never run.
#![no_std]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs, clippy::all)]
use core::ffi::{c_char, c_int, c_void};

pub type NTSTATUS = i32;
pub type ULONG = u32;
pub type USHORT = u16;
pub type UCHAR = u8;
pub type BOOLEAN = u8;
pub type KIRQL = u8;
pub type CCHAR = c_char;
pub type KPROCESSOR_MODE = CCHAR;
pub type ULONG_PTR = u64;
pub type SIZE_T = ULONG_PTR;
pub type ULONG64 = u64;
pub type PULONG64 = *mut ULONG64;
pub type PVOID = *mut c_void;
pub type HANDLE = PVOID;
pub type WCHAR = u16;
pub type PWCH = *mut WCHAR;
pub type LPCSTR = *const c_char;
pub type KSPIN_LOCK = ULONG_PTR;
pub type PKSPIN_LOCK = *mut KSPIN_LOCK;
pub type POOL_FLAGS = ULONG64;
pub type DEVICE_TYPE = ULONG;
pub type LONG = i32;
pub type LONGLONG = i64;
pub type ULONGLONG = u64;
pub type PULONGLONG = *mut ULONGLONG;
pub type KAFFINITY = ULONG_PTR;
pub type LONG_PTR = i64;
pub type CSHORT = i16;
pub type KPRIORITY = LONG;

macro_rules! zeroed_default { ($($t:ty),*) => { $(impl Default for $t { fn default() -> Self { unsafe { core::mem::zeroed() } } })* } }

#[repr(C)] #[derive(Debug, Default, Copy, Clone)]
pub struct GUID { pub Data1: u32, pub Data2: u16, pub Data3: u16, pub Data4: [u8; 8] }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct UNICODE_STRING { pub Length: USHORT, pub MaximumLength: USHORT, pub Buffer: PWCH }
pub type PCUNICODE_STRING = *const UNICODE_STRING;
#[repr(C)] pub struct DRIVER_OBJECT { _p: [u8; 0] }
pub type PDRIVER_OBJECT = *mut DRIVER_OBJECT;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct KSPIN_LOCK_QUEUE { pub Next: *mut KSPIN_LOCK_QUEUE, pub Lock: PKSPIN_LOCK }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct KLOCK_QUEUE_HANDLE { pub LockQueue: KSPIN_LOCK_QUEUE, pub OldIrql: KIRQL }
pub type PKLOCK_QUEUE_HANDLE = *mut KLOCK_QUEUE_HANDLE;
zeroed_default!(UNICODE_STRING, KSPIN_LOCK_QUEUE, KLOCK_QUEUE_HANDLE);

// wdm.h: processes, MDLs, APC state, dispatcher objects. Opaque kernel
// objects (bindgen sees only their forward declarations) are zero-sized.
#[repr(C)] pub struct _KPROCESS { _p: [u8; 0] }
pub type PEPROCESS = *mut _KPROCESS;
pub type PKPROCESS = *mut _KPROCESS;
pub type PRKPROCESS = *mut _KPROCESS;
// ntddk.h: the process-notify routine PsSetCreateProcessNotifyRoutineEx
// registers: `typedef VOID (*PCREATE_PROCESS_NOTIFY_ROUTINE_EX)(_Inout_
// PEPROCESS Process, _In_ HANDLE ProcessId, _Inout_opt_
// PPS_CREATE_NOTIFY_INFO CreateInfo);` (CreateInfo is NULL when the process
// exits). ntddk.h's PS_CREATE_NOTIFY_INFO has fields; the driver only tests
// the pointer for null, so it stays opaque here.
#[repr(C)] pub struct _PS_CREATE_NOTIFY_INFO { _p: [u8; 0] }
pub type PS_CREATE_NOTIFY_INFO = _PS_CREATE_NOTIFY_INFO;
pub type PPS_CREATE_NOTIFY_INFO = *mut _PS_CREATE_NOTIFY_INFO;
pub type PCREATE_PROCESS_NOTIFY_ROUTINE_EX = Option<unsafe extern "C" fn(Process: PEPROCESS, ProcessId: HANDLE, CreateInfo: PPS_CREATE_NOTIFY_INFO)>;
// wdm.h's DEVICE_OBJECT has fields; the driver only passes the pointer
// (WdfDeviceWdmGetDeviceObject, ObReferenceObject), so it stays opaque here.
#[repr(C)] pub struct _DEVICE_OBJECT { _p: [u8; 0] }
// wdm.h's FILE_OBJECT likewise: a kernel ULP's file object, only passed
// (WdfDeviceGetFileObject).
#[repr(C)] pub struct _FILE_OBJECT { _p: [u8; 0] }
pub type FILE_OBJECT = _FILE_OBJECT;
pub type PFILE_OBJECT = *mut _FILE_OBJECT;
pub type DEVICE_OBJECT = _DEVICE_OBJECT;
pub type PDEVICE_OBJECT = *mut _DEVICE_OBJECT;
// wdm.h: IRP, IO_STACK_LOCATION, IO_STATUS_BLOCK, in bindgen's rendering
// (anonymous members as __bindgen_anon_N). Only the members the glue
// reaches are spelled out; the others keep their size as opaque blobs.
#[repr(C)] #[derive(Copy, Clone)]
pub union _IO_STATUS_BLOCK__bindgen_ty_1 { pub Status: NTSTATUS, pub Pointer: PVOID }
#[repr(C)] #[derive(Copy, Clone)]
pub struct _IO_STATUS_BLOCK { pub __bindgen_anon_1: _IO_STATUS_BLOCK__bindgen_ty_1, pub Information: ULONG_PTR }
pub type IO_STATUS_BLOCK = _IO_STATUS_BLOCK;
pub type PIO_STATUS_BLOCK = *mut _IO_STATUS_BLOCK;
pub type IO_COMPLETION_ROUTINE = Option<unsafe extern "C" fn(DeviceObject: PDEVICE_OBJECT, Irp: PIRP, Context: PVOID) -> NTSTATUS>;
pub type PIO_COMPLETION_ROUTINE = IO_COMPLETION_ROUTINE;
// wdm.h's IO_STACK_LOCATION.Parameters.QueryInterface (IRP_MN_QUERY_INTERFACE):
// `struct { CONST GUID *InterfaceType; USHORT Size; USHORT Version;
// PINTERFACE Interface; PVOID InterfaceSpecificData; } QueryInterface;`
// (learn.microsoft.com, ns-wdm-_io_stack_location). The union's other
// members are kept as a blob of the union's size (four pointers on x64).
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _IO_STACK_LOCATION__bindgen_ty_1__QueryInterface { pub InterfaceType: *const GUID, pub Size: USHORT, pub Version: USHORT, pub Interface: PINTERFACE, pub InterfaceSpecificData: PVOID }
#[repr(C)] #[derive(Copy, Clone)]
pub union _IO_STACK_LOCATION__bindgen_ty_1 { pub QueryInterface: _IO_STACK_LOCATION__bindgen_ty_1__QueryInterface, pub __others: [u64; 4] }
#[repr(C)]
pub struct _IO_STACK_LOCATION { pub MajorFunction: UCHAR, pub MinorFunction: UCHAR, pub Flags: UCHAR, pub Control: UCHAR, pub Parameters: _IO_STACK_LOCATION__bindgen_ty_1, pub DeviceObject: PDEVICE_OBJECT, pub FileObject: PVOID, pub CompletionRoutine: PIO_COMPLETION_ROUTINE, pub Context: PVOID }
pub type IO_STACK_LOCATION = _IO_STACK_LOCATION;
pub type PIO_STACK_LOCATION = *mut _IO_STACK_LOCATION;
#[repr(C)] #[derive(Copy, Clone)]
pub union _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2__bindgen_ty_1 { pub CurrentStackLocation: *mut _IO_STACK_LOCATION, pub PacketType: ULONG }
#[repr(C)] #[derive(Copy, Clone)]
pub struct _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2 { pub ListEntry: LIST_ENTRY, pub __bindgen_anon_1: _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2__bindgen_ty_1 }
#[repr(C)] #[derive(Copy, Clone)]
pub struct _IRP__bindgen_ty_4__bindgen_ty_1 { pub __bindgen_anon_1: [PVOID; 4], pub Thread: PVOID, pub AuxiliaryBuffer: *mut c_char, pub __bindgen_anon_2: _IRP__bindgen_ty_4__bindgen_ty_1__bindgen_ty_2, pub OriginalFileObject: PVOID }
#[repr(C)] #[derive(Copy, Clone)]
pub union _IRP__bindgen_ty_4 { pub Overlay: _IRP__bindgen_ty_4__bindgen_ty_1, pub Apc: [u64; 11], pub CompletionKey: PVOID }
#[repr(C)]
pub struct _IRP { pub Type: CSHORT, pub Size: USHORT, pub AllocationProcessorNumber: USHORT, pub Reserved: USHORT, pub MdlAddress: PMDL, pub Flags: ULONG, pub AssociatedIrp: PVOID, pub ThreadListEntry: LIST_ENTRY, pub IoStatus: IO_STATUS_BLOCK, pub RequestorMode: KPROCESSOR_MODE, pub PendingReturned: BOOLEAN, pub StackCount: CCHAR, pub CurrentLocation: CCHAR, pub Cancel: BOOLEAN, pub CancelIrql: KIRQL, pub ApcEnvironment: CCHAR, pub AllocationFlags: UCHAR, pub __bindgen_anon_1: PVOID, pub UserEvent: PKEVENT, pub Overlay: [u64; 2], pub CancelRoutine: PVOID, pub UserBuffer: PVOID, pub Tail: _IRP__bindgen_ty_4 }
pub type IRP = _IRP;
pub type PIRP = *mut _IRP;
pub const STATUS_MORE_PROCESSING_REQUIRED: NTSTATUS = -1073741802;
pub type PULONG = *mut ULONG;
pub type PUCHAR = *mut UCHAR;
// wdm.h: `#define IRP_MJ_PNP 0x1b`, `#define IRP_MN_QUERY_INTERFACE 0x08`,
// `#define IO_NO_INCREMENT 0` (bindgen renders object-like macros as u32).
pub const IRP_MJ_PNP: u32 = 27;
pub const IRP_MN_QUERY_INTERFACE: u32 = 8;
pub const IO_NO_INCREMENT: u32 = 0;
pub type PUSHORT = *mut USHORT;
// wdm.h: PLUGPLAY_REGKEY_DEVICE, KEY_READ.
pub const PLUGPLAY_REGKEY_DEVICE: u32 = 1;
pub const KEY_READ: u32 = 131097;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _MDL { pub Next: *mut _MDL, pub Size: CSHORT, pub MdlFlags: CSHORT, pub Process: *mut _KPROCESS, pub MappedSystemVa: PVOID, pub StartVa: PVOID, pub ByteCount: ULONG, pub ByteOffset: ULONG }
pub type MDL = _MDL;
pub type PMDL = *mut _MDL;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _LIST_ENTRY { pub Flink: *mut _LIST_ENTRY, pub Blink: *mut _LIST_ENTRY }
pub type LIST_ENTRY = _LIST_ENTRY;
// bitfields as bindgen's __BindgenBitfieldUnit<[u8; 1]>, here a plain byte.
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _KAPC_STATE__bindgen_ty_1__bindgen_ty_1 { pub _bitfield_align_1: [u8; 0], pub _bitfield_1: [u8; 1] }
#[repr(C)] #[derive(Copy, Clone)]
pub union _KAPC_STATE__bindgen_ty_1 { pub InProgressFlags: UCHAR, pub __bindgen_anon_1: _KAPC_STATE__bindgen_ty_1__bindgen_ty_1 }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _KAPC_STATE__bindgen_ty_2__bindgen_ty_1 { pub _bitfield_align_1: [u8; 0], pub _bitfield_1: [u8; 1] }
#[repr(C)] #[derive(Copy, Clone)]
pub union _KAPC_STATE__bindgen_ty_2 { pub UserApcPendingAll: BOOLEAN, pub __bindgen_anon_1: _KAPC_STATE__bindgen_ty_2__bindgen_ty_1 }
#[repr(C)] #[derive(Copy, Clone)]
pub struct _KAPC_STATE { pub ApcListHead: [LIST_ENTRY; 2], pub Process: *mut _KPROCESS, pub __bindgen_anon_1: _KAPC_STATE__bindgen_ty_1, pub KernelApcPending: BOOLEAN, pub __bindgen_anon_2: _KAPC_STATE__bindgen_ty_2 }
pub type KAPC_STATE = _KAPC_STATE;
pub type PKAPC_STATE = *mut _KAPC_STATE;
pub type PRKAPC_STATE = *mut _KAPC_STATE;
// The dispatcher header's first member is a union of the object types'
// layouts (Lock / LockNV and byte-wise views); the byte views are elided
// here, the union's size is theirs (a LONG).
#[repr(C)] #[derive(Copy, Clone)]
pub union _DISPATCHER_HEADER__bindgen_ty_1 { pub Lock: LONG, pub LockNV: LONG }
#[repr(C)] #[derive(Copy, Clone)]
pub struct _DISPATCHER_HEADER { pub __bindgen_anon_1: _DISPATCHER_HEADER__bindgen_ty_1, pub SignalState: LONG, pub WaitListHead: LIST_ENTRY }
pub type DISPATCHER_HEADER = _DISPATCHER_HEADER;
#[repr(C)] #[derive(Copy, Clone)]
pub struct _KEVENT { pub Header: DISPATCHER_HEADER }
pub type KEVENT = _KEVENT;
pub type PKEVENT = *mut _KEVENT;
pub type PRKEVENT = *mut _KEVENT;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _LARGE_INTEGER__bindgen_ty_1 { pub LowPart: ULONG, pub HighPart: LONG }
#[repr(C)] #[derive(Copy, Clone)]
pub union _LARGE_INTEGER { pub __bindgen_anon_1: _LARGE_INTEGER__bindgen_ty_1, pub u: _LARGE_INTEGER__bindgen_ty_1, pub QuadPart: LONGLONG }
pub type LARGE_INTEGER = _LARGE_INTEGER;
pub type PLARGE_INTEGER = *mut _LARGE_INTEGER;
zeroed_default!(_MDL, _LIST_ENTRY, _KAPC_STATE, _DISPATCHER_HEADER, _KEVENT, _LARGE_INTEGER);

// wdm.h: the DPC object (opaque here: the glue only passes pointers to it).
#[repr(C)] pub struct _KDPC { _p: [u8; 0] }
pub type KDPC = _KDPC;
pub type PKDPC = *mut _KDPC;
pub type PRKDPC = *mut _KDPC;
// winnt.h / wdm.h: `typedef struct _PROCESSOR_NUMBER { USHORT Group;
// UCHAR Number; UCHAR Reserved; } PROCESSOR_NUMBER, *PPROCESSOR_NUMBER;`
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _PROCESSOR_NUMBER { pub Group: USHORT, pub Number: UCHAR, pub Reserved: UCHAR }
pub type PROCESSOR_NUMBER = _PROCESSOR_NUMBER;
pub type PPROCESSOR_NUMBER = *mut _PROCESSOR_NUMBER;
zeroed_default!(_PROCESSOR_NUMBER);
// wdm.h: `#define ALL_PROCESSOR_GROUPS 0xffff`.
pub const ALL_PROCESSOR_GROUPS: u32 = 65535;

// wdm.h: EX_TIMER objects (Windows 8.1 and later). EX_TIMER is opaque
// (`typedef struct _EX_TIMER *PEX_TIMER;`); EXT_CALLBACK and
// EXT_DELETE_CALLBACK are function typedefs, rendered as Option<fn>.
#[repr(C)] pub struct _EX_TIMER { _p: [u8; 0] }
pub type PEX_TIMER = *mut _EX_TIMER;
pub type EXT_CALLBACK = Option<unsafe extern "C" fn(Timer: PEX_TIMER, Context: PVOID)>;
pub type PEXT_CALLBACK = EXT_CALLBACK;
pub type EXT_DELETE_CALLBACK = Option<unsafe extern "C" fn(Context: PVOID)>;
pub type PEXT_DELETE_CALLBACK = EXT_DELETE_CALLBACK;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _EXT_SET_PARAMETERS_V0 { pub Version: ULONG, pub Reserved: ULONG, pub NoWakeTolerance: LONGLONG }
pub type EXT_SET_PARAMETERS = _EXT_SET_PARAMETERS_V0;
pub type PEXT_SET_PARAMETERS = *mut _EXT_SET_PARAMETERS_V0;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _EXT_CANCEL_PARAMETERS { pub Version: ULONG, pub Reserved: ULONG, pub Reserved2: PVOID }
pub type EXT_CANCEL_PARAMETERS = _EXT_CANCEL_PARAMETERS;
pub type PEXT_CANCEL_PARAMETERS = *mut _EXT_CANCEL_PARAMETERS;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _EXT_DELETE_PARAMETERS { pub Version: ULONG, pub Reserved: ULONG, pub DeleteCallback: PEXT_DELETE_CALLBACK, pub DeleteContext: PVOID }
pub type EXT_DELETE_PARAMETERS = _EXT_DELETE_PARAMETERS;
pub type PEXT_DELETE_PARAMETERS = *mut _EXT_DELETE_PARAMETERS;
// `#define EX_TIMER_HIGH_RESOLUTION 0x4` (also EX_TIMER_NO_WAKE 0x8,
// EX_TIMER_NOTIFICATION (1UL << 31)).
pub const EX_TIMER_HIGH_RESOLUTION: u32 = 4;

// wdm.h: system threads and object references.
pub type ACCESS_MASK = ULONG;
pub type PHANDLE = *mut HANDLE;
pub type PUNICODE_STRING = *mut UNICODE_STRING;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _OBJECT_ATTRIBUTES { pub Length: ULONG, pub RootDirectory: HANDLE, pub ObjectName: PUNICODE_STRING, pub Attributes: ULONG, pub SecurityDescriptor: PVOID, pub SecurityQualityOfService: PVOID }
pub type OBJECT_ATTRIBUTES = _OBJECT_ATTRIBUTES;
pub type POBJECT_ATTRIBUTES = *mut _OBJECT_ATTRIBUTES;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _CLIENT_ID { pub UniqueProcess: HANDLE, pub UniqueThread: HANDLE }
pub type CLIENT_ID = _CLIENT_ID;
pub type PCLIENT_ID = *mut _CLIENT_ID;
pub type KSTART_ROUTINE = Option<unsafe extern "C" fn(StartContext: PVOID)>;
pub type PKSTART_ROUTINE = KSTART_ROUTINE;
#[repr(C)] pub struct _OBJECT_TYPE { _p: [u8; 0] }
pub type POBJECT_TYPE = *mut _OBJECT_TYPE;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _OBJECT_HANDLE_INFORMATION { pub HandleAttributes: ULONG, pub GrantedAccess: ACCESS_MASK }
pub type OBJECT_HANDLE_INFORMATION = _OBJECT_HANDLE_INFORMATION;
pub type POBJECT_HANDLE_INFORMATION = *mut _OBJECT_HANDLE_INFORMATION;

macro_rules! handles { ($($h:ident $s:ident),*) => { $( #[repr(C)] #[derive(Debug, Copy, Clone)] pub struct $s { pub unused: c_int } pub type $h = *mut $s; )* } }
handles!(WDFDRIVER WDFDRIVER__, WDFDEVICE WDFDEVICE__, WDFQUEUE WDFQUEUE__, WDFREQUEST WDFREQUEST__,
         WDFFILEOBJECT WDFFILEOBJECT__, WDFDPC WDFDPC__, WDFSPINLOCK WDFSPINLOCK__, WDFKEY WDFKEY__,
         WDFDMAENABLER WDFDMAENABLER__, WDFCOMMONBUFFER WDFCOMMONBUFFER__, WDFDMATRANSACTION WDFDMATRANSACTION__,
         WDFINTERRUPT WDFINTERRUPT__, WDFWAITLOCK WDFWAITLOCK__, WDFCMRESLIST WDFCMRESLIST__);
pub type WDFOBJECT = HANDLE;
#[repr(C)] pub struct WDFDEVICE_INIT { _p: [u8; 0] }
pub type PWDFDEVICE_INIT = *mut WDFDEVICE_INIT;

macro_rules! cenum { ($m:ident, $alias:ident, $($n:ident = $v:expr),*) => {
    pub mod $m { pub type Type = ::core::ffi::c_int; $(pub const $n: Type = $v;)* }
    pub use self::$m::Type as $alias;
} }
cenum!(_WDF_EXECUTION_LEVEL, WDF_EXECUTION_LEVEL, WdfExecutionLevelInvalid = 0, WdfExecutionLevelInheritFromParent = 1, WdfExecutionLevelPassive = 2, WdfExecutionLevelDispatch = 3);
cenum!(_WDF_SYNCHRONIZATION_SCOPE, WDF_SYNCHRONIZATION_SCOPE, WdfSynchronizationScopeInvalid = 0, WdfSynchronizationScopeInheritFromParent = 1, WdfSynchronizationScopeDevice = 2, WdfSynchronizationScopeQueue = 3, WdfSynchronizationScopeNone = 4);
cenum!(_WDF_TRI_STATE, WDF_TRI_STATE, WdfFalse = 0, WdfTrue = 1, WdfUseDefault = 2);
cenum!(_WDF_FILEOBJECT_CLASS, WDF_FILEOBJECT_CLASS, WdfFileObjectInvalid = 0, WdfFileObjectNotRequired = 1, WdfFileObjectWdfCanUseFsContext = 2, WdfFileObjectWdfCanUseFsContext2 = 3, WdfFileObjectWdfCannotUseFsContexts = 4, WdfFileObjectCanBeOptional = -2147483648);
cenum!(_WDF_IO_QUEUE_DISPATCH_TYPE, WDF_IO_QUEUE_DISPATCH_TYPE, WdfIoQueueDispatchInvalid = 0, WdfIoQueueDispatchSequential = 1, WdfIoQueueDispatchParallel = 2, WdfIoQueueDispatchManual = 3, WdfIoQueueDispatchMax = 4);
cenum!(_WDF_POWER_DEVICE_STATE, WDF_POWER_DEVICE_STATE, WdfPowerDeviceInvalid = 0, WdfPowerDeviceD0 = 1, WdfPowerDeviceD1 = 2, WdfPowerDeviceD2 = 3, WdfPowerDeviceD3 = 4, WdfPowerDeviceD3Final = 5, WdfPowerDevicePrepareForHibernation = 6, WdfPowerDeviceMaximum = 7);
cenum!(_MODE, MODE, KernelMode = 0, UserMode = 1, MaximumMode = 2);
cenum!(_MEMORY_CACHING_TYPE, MEMORY_CACHING_TYPE, MmNonCached = 0, MmCached = 1, MmWriteCombined = 2, MmHardwareCoherentCached = 3, MmNonCachedUnordered = 4, MmUSWCCached = 5, MmMaximumCacheType = 6, MmNotMapped = -1);
cenum!(_MM_PAGE_PRIORITY, MM_PAGE_PRIORITY, LowPagePriority = 0, NormalPagePriority = 16, HighPagePriority = 32);
cenum!(_LOCK_OPERATION, LOCK_OPERATION, IoReadAccess = 0, IoWriteAccess = 1, IoModifyAccess = 2);
cenum!(_EVENT_TYPE, EVENT_TYPE, NotificationEvent = 0, SynchronizationEvent = 1);
cenum!(_KWAIT_REASON, KWAIT_REASON, Executive = 0, FreePage = 1, PageIn = 2, PoolAllocation = 3, DelayExecution = 4, Suspended = 5, UserRequest = 6);
// wdfrequest.h: WDF_REQUEST_TYPE values are the IRP_MJ_* codes.
cenum!(_WDF_REQUEST_TYPE, WDF_REQUEST_TYPE, WdfRequestTypeCreate = 0, WdfRequestTypeCreateNamedPipe = 1, WdfRequestTypeClose = 2, WdfRequestTypeRead = 3, WdfRequestTypeWrite = 4, WdfRequestTypeQueryInformation = 5, WdfRequestTypeSetInformation = 6, WdfRequestTypeQueryEA = 7, WdfRequestTypeSetEA = 8, WdfRequestTypeFlushBuffers = 9, WdfRequestTypeQueryVolumeInformation = 10, WdfRequestTypeSetVolumeInformation = 11, WdfRequestTypeDirectoryControl = 12, WdfRequestTypeFileSystemControl = 13, WdfRequestTypeDeviceControl = 14, WdfRequestTypeDeviceControlInternal = 15, WdfRequestTypeShutdown = 16, WdfRequestTypeLockControl = 17, WdfRequestTypeCleanup = 18, WdfRequestTypeCreateMailSlot = 19, WdfRequestTypeQuerySecurity = 20, WdfRequestTypeSetSecurity = 21, WdfRequestTypePower = 22, WdfRequestTypeSystemControl = 23, WdfRequestTypeDeviceChange = 24, WdfRequestTypeQueryQuota = 25, WdfRequestTypeSetQuota = 26, WdfRequestTypePnp = 27, WdfRequestTypeOther = 28, WdfRequestTypeUsb = 64, WdfRequestTypeNoFormat = 255, WdfRequestTypeMax = 256);

pub type PFN_WDF_DRIVER_DEVICE_ADD = Option<unsafe extern "C" fn(Driver: WDFDRIVER, DeviceInit: PWDFDEVICE_INIT) -> NTSTATUS>;
pub type PFN_WDF_DRIVER_UNLOAD = Option<unsafe extern "C" fn(Driver: WDFDRIVER)>;
pub type PFN_WDF_OBJECT_CONTEXT_CLEANUP = Option<unsafe extern "C" fn(Object: WDFOBJECT)>;
pub type PFN_WDF_OBJECT_CONTEXT_DESTROY = Option<unsafe extern "C" fn(Object: WDFOBJECT)>;
pub type PFN_GET_UNIQUE_CONTEXT_TYPE = Option<unsafe extern "C" fn() -> PCWDF_OBJECT_CONTEXT_TYPE_INFO>;
pub type PFN_WDF_DEVICE_D0_ENTRY = Option<unsafe extern "C" fn(Device: WDFDEVICE, PreviousState: WDF_POWER_DEVICE_STATE) -> NTSTATUS>;
pub type PFN_WDF_DEVICE_D0_EXIT = Option<unsafe extern "C" fn(Device: WDFDEVICE, TargetState: WDF_POWER_DEVICE_STATE) -> NTSTATUS>;
pub type PFN_WDF_DEVICE_SURPRISE_REMOVAL = Option<unsafe extern "C" fn(Device: WDFDEVICE)>;
pub type PFN_WDF_DEVICE_QUERY_STOP = Option<unsafe extern "C" fn(Device: WDFDEVICE) -> NTSTATUS>;
// wdfdevice.h: `NTSTATUS EVT_WDF_DEVICE_PREPARE_HARDWARE(_In_ WDFDEVICE
// Device, _In_ WDFCMRESLIST ResourcesRaw, _In_ WDFCMRESLIST
// ResourcesTranslated);` and `NTSTATUS EVT_WDF_DEVICE_RELEASE_HARDWARE(
// _In_ WDFDEVICE Device, _In_ WDFCMRESLIST ResourcesTranslated);`
// (learn.microsoft.com, nc-wdfdevice-evt_wdf_device_prepare_hardware,
// nc-wdfdevice-evt_wdf_device_release_hardware).
pub type PFN_WDF_DEVICE_PREPARE_HARDWARE = Option<unsafe extern "C" fn(Device: WDFDEVICE, ResourcesRaw: WDFCMRESLIST, ResourcesTranslated: WDFCMRESLIST) -> NTSTATUS>;
pub type PFN_WDF_DEVICE_RELEASE_HARDWARE = Option<unsafe extern "C" fn(Device: WDFDEVICE, ResourcesTranslated: WDFCMRESLIST) -> NTSTATUS>;
pub type PFN_WDF_DEVICE_FILE_CREATE = Option<unsafe extern "C" fn(Device: WDFDEVICE, Request: WDFREQUEST, FileObject: WDFFILEOBJECT)>;
pub type PFN_WDF_FILE_CLOSE = Option<unsafe extern "C" fn(FileObject: WDFFILEOBJECT)>;
pub type PFN_WDF_FILE_CLEANUP = Option<unsafe extern "C" fn(FileObject: WDFFILEOBJECT)>;
// wdfdevice.h: `NTSTATUS EVT_WDFDEVICE_WDM_IRP_PREPROCESS(_In_ WDFDEVICE
// Device, _Inout_ PIRP Irp);` (learn.microsoft.com,
// nc-wdfdevice-evt_wdfdevice_wdm_irp_preprocess).
pub type PFN_WDFDEVICE_WDM_IRP_PREPROCESS = Option<unsafe extern "C" fn(Device: WDFDEVICE, Irp: PIRP) -> NTSTATUS>;
pub type PFN_WDF_IO_IN_CALLER_CONTEXT = Option<unsafe extern "C" fn(Device: WDFDEVICE, Request: WDFREQUEST)>;
pub type PFN_WDF_IO_QUEUE_IO_DEVICE_CONTROL = Option<unsafe extern "C" fn(Queue: WDFQUEUE, Request: WDFREQUEST, OutputBufferLength: usize, InputBufferLength: usize, IoControlCode: ULONG)>;
pub type PFN_WDF_IO_QUEUE_IO_INTERNAL_DEVICE_CONTROL = PFN_WDF_IO_QUEUE_IO_DEVICE_CONTROL;
pub type PFN_WDF_IO_QUEUE_IO_DEFAULT = Option<unsafe extern "C" fn(Queue: WDFQUEUE, Request: WDFREQUEST)>;
pub type PFN_WDF_IO_QUEUE_IO_READ = Option<unsafe extern "C" fn(Queue: WDFQUEUE, Request: WDFREQUEST, Length: usize)>;
pub type PFN_WDF_IO_QUEUE_IO_STOP = Option<unsafe extern "C" fn(Queue: WDFQUEUE, Request: WDFREQUEST, ActionFlags: ULONG)>;
pub type PFN_WDF_REQUEST_CANCEL = Option<unsafe extern "C" fn(Request: WDFREQUEST)>;
pub type PFN_WDF_DPC = Option<unsafe extern "C" fn(Dpc: WDFDPC)>;
pub type PFN_OTHER = Option<unsafe extern "C" fn()>;
pub type LPGUID = *mut GUID;
pub type PINTERFACE_REFERENCE = Option<unsafe extern "C" fn(Context: PVOID)>;
pub type PINTERFACE_DEREFERENCE = Option<unsafe extern "C" fn(Context: PVOID)>;
pub type PFN_WDF_DEVICE_PROCESS_QUERY_INTERFACE_REQUEST = Option<unsafe extern "C" fn(Device: WDFDEVICE, InterfaceType: LPGUID, ExposedInterface: PINTERFACE, ExposedInterfaceSpecificData: PVOID) -> NTSTATUS>;

// wdm.h: the header every IRP_MN_QUERY_INTERFACE interface starts with.
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _INTERFACE { pub Size: USHORT, pub Version: USHORT, pub Context: PVOID, pub InterfaceReference: PINTERFACE_REFERENCE, pub InterfaceDereference: PINTERFACE_DEREFERENCE }
pub type INTERFACE = _INTERFACE;
pub type PINTERFACE = *mut _INTERFACE;
// wdfqueryinterface.h
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_QUERY_INTERFACE_CONFIG { pub Size: ULONG, pub Interface: PINTERFACE, pub InterfaceType: *const GUID, pub SendQueryToParentStack: BOOLEAN, pub EvtDeviceProcessQueryInterfaceRequest: PFN_WDF_DEVICE_PROCESS_QUERY_INTERFACE_REQUEST, pub ImportInterface: BOOLEAN }
pub type WDF_QUERY_INTERFACE_CONFIG = _WDF_QUERY_INTERFACE_CONFIG;
pub type PWDF_QUERY_INTERFACE_CONFIG = *mut _WDF_QUERY_INTERFACE_CONFIG;

#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct WDF_OBJECT_CONTEXT_TYPE_INFO { pub Size: ULONG, pub ContextName: LPCSTR, pub ContextSize: usize, pub UniqueType: PCWDF_OBJECT_CONTEXT_TYPE_INFO, pub EvtDriverGetUniqueContextType: PFN_GET_UNIQUE_CONTEXT_TYPE }
pub type PCWDF_OBJECT_CONTEXT_TYPE_INFO = *const WDF_OBJECT_CONTEXT_TYPE_INFO;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct WDF_OBJECT_ATTRIBUTES { pub Size: ULONG, pub EvtCleanupCallback: PFN_WDF_OBJECT_CONTEXT_CLEANUP, pub EvtDestroyCallback: PFN_WDF_OBJECT_CONTEXT_DESTROY, pub ExecutionLevel: WDF_EXECUTION_LEVEL, pub SynchronizationScope: WDF_SYNCHRONIZATION_SCOPE, pub ParentObject: WDFOBJECT, pub ContextSizeOverride: usize, pub ContextTypeInfo: PCWDF_OBJECT_CONTEXT_TYPE_INFO }
pub type PWDF_OBJECT_ATTRIBUTES = *mut WDF_OBJECT_ATTRIBUTES;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct WDF_DRIVER_CONFIG { pub Size: ULONG, pub EvtDriverDeviceAdd: PFN_WDF_DRIVER_DEVICE_ADD, pub EvtDriverUnload: PFN_WDF_DRIVER_UNLOAD, pub DriverInitFlags: ULONG, pub DriverPoolTag: ULONG }
pub type PWDF_DRIVER_CONFIG = *mut WDF_DRIVER_CONFIG;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct WDF_PNPPOWER_EVENT_CALLBACKS { pub Size: ULONG, pub EvtDeviceD0Entry: PFN_WDF_DEVICE_D0_ENTRY, pub EvtDeviceD0EntryPostInterruptsEnabled: PFN_OTHER, pub EvtDeviceD0Exit: PFN_WDF_DEVICE_D0_EXIT, pub EvtDeviceD0ExitPreInterruptsDisabled: PFN_OTHER, pub EvtDevicePrepareHardware: PFN_WDF_DEVICE_PREPARE_HARDWARE, pub EvtDeviceReleaseHardware: PFN_WDF_DEVICE_RELEASE_HARDWARE, pub EvtDeviceSelfManagedIoCleanup: PFN_OTHER, pub EvtDeviceSelfManagedIoFlush: PFN_OTHER, pub EvtDeviceSelfManagedIoInit: PFN_OTHER, pub EvtDeviceSelfManagedIoSuspend: PFN_OTHER, pub EvtDeviceSelfManagedIoRestart: PFN_OTHER, pub EvtDeviceSurpriseRemoval: PFN_WDF_DEVICE_SURPRISE_REMOVAL, pub EvtDeviceQueryRemove: PFN_OTHER, pub EvtDeviceQueryStop: PFN_WDF_DEVICE_QUERY_STOP, pub EvtDeviceUsageNotification: PFN_OTHER, pub EvtDeviceRelationsQuery: PFN_OTHER, pub EvtDeviceUsageNotificationEx: PFN_OTHER }
pub type PWDF_PNPPOWER_EVENT_CALLBACKS = *mut WDF_PNPPOWER_EVENT_CALLBACKS;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct WDF_FILEOBJECT_CONFIG { pub Size: ULONG, pub EvtDeviceFileCreate: PFN_WDF_DEVICE_FILE_CREATE, pub EvtFileClose: PFN_WDF_FILE_CLOSE, pub EvtFileCleanup: PFN_WDF_FILE_CLEANUP, pub AutoForwardCleanupClose: WDF_TRI_STATE, pub FileObjectClass: WDF_FILEOBJECT_CLASS }
pub type PWDF_FILEOBJECT_CONFIG = *mut WDF_FILEOBJECT_CONFIG;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_IO_QUEUE_CONFIG__bindgen_ty_1__bindgen_ty_1 { pub NumberOfPresentedRequests: ULONG }
#[repr(C)] #[derive(Copy, Clone)]
pub union _WDF_IO_QUEUE_CONFIG__bindgen_ty_1 { pub Parallel: _WDF_IO_QUEUE_CONFIG__bindgen_ty_1__bindgen_ty_1 }
#[repr(C)] #[derive(Copy, Clone)]
pub struct WDF_IO_QUEUE_CONFIG { pub Size: ULONG, pub DispatchType: WDF_IO_QUEUE_DISPATCH_TYPE, pub PowerManaged: WDF_TRI_STATE, pub AllowZeroLengthRequests: BOOLEAN, pub DefaultQueue: BOOLEAN, pub EvtIoDefault: PFN_WDF_IO_QUEUE_IO_DEFAULT, pub EvtIoRead: PFN_WDF_IO_QUEUE_IO_READ, pub EvtIoWrite: PFN_WDF_IO_QUEUE_IO_READ, pub EvtIoDeviceControl: PFN_WDF_IO_QUEUE_IO_DEVICE_CONTROL, pub EvtIoInternalDeviceControl: PFN_WDF_IO_QUEUE_IO_INTERNAL_DEVICE_CONTROL, pub EvtIoStop: PFN_WDF_IO_QUEUE_IO_STOP, pub EvtIoResume: PFN_WDF_IO_QUEUE_IO_DEFAULT, pub EvtIoCanceledOnQueue: PFN_WDF_IO_QUEUE_IO_DEFAULT, pub Settings: _WDF_IO_QUEUE_CONFIG__bindgen_ty_1, pub Driver: WDFDRIVER }
pub type PWDF_IO_QUEUE_CONFIG = *mut WDF_IO_QUEUE_CONFIG;
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct WDF_DPC_CONFIG { pub Size: ULONG, pub EvtDpcFunc: PFN_WDF_DPC, pub AutomaticSerialization: BOOLEAN }
pub type PWDF_DPC_CONFIG = *mut WDF_DPC_CONFIG;
// wdfrequest.h: WDF_REQUEST_PARAMETERS and its union of per-type parameters.
#[repr(C)] pub struct _IO_SECURITY_CONTEXT { _p: [u8; 0] }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_1 { pub SecurityContext: *mut _IO_SECURITY_CONTEXT, pub Options: ULONG, pub FileAttributes: USHORT, pub ShareAccess: USHORT, pub EaLength: ULONG }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_2 { pub Length: usize, pub Key: ULONG, pub DeviceOffset: LONGLONG }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_3 { pub Length: usize, pub Key: ULONG, pub DeviceOffset: LONGLONG }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_4 { pub OutputBufferLength: usize, pub InputBufferLength: usize, pub IoControlCode: ULONG, pub Type3InputBuffer: PVOID }
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_5 { pub Arg1: PVOID, pub Arg2: PVOID, pub IoControlCode: ULONG, pub Arg4: PVOID }
#[repr(C)] #[derive(Copy, Clone)]
pub union _WDF_REQUEST_PARAMETERS__bindgen_ty_1 { pub Create: _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_1, pub Read: _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_2, pub Write: _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_3, pub DeviceIoControl: _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_4, pub Others: _WDF_REQUEST_PARAMETERS__bindgen_ty_1__bindgen_ty_5 }
#[repr(C)] #[derive(Copy, Clone)]
pub struct _WDF_REQUEST_PARAMETERS { pub Size: USHORT, pub MinorFunction: UCHAR, pub Type: WDF_REQUEST_TYPE, pub Parameters: _WDF_REQUEST_PARAMETERS__bindgen_ty_1 }
pub type WDF_REQUEST_PARAMETERS = _WDF_REQUEST_PARAMETERS;
pub type PWDF_REQUEST_PARAMETERS = *mut _WDF_REQUEST_PARAMETERS;
zeroed_default!(_WDF_REQUEST_PARAMETERS);
zeroed_default!(_INTERFACE, _WDF_QUERY_INTERFACE_CONFIG, WDF_OBJECT_CONTEXT_TYPE_INFO, WDF_OBJECT_ATTRIBUTES, WDF_DRIVER_CONFIG, WDF_PNPPOWER_EVENT_CALLBACKS, WDF_FILEOBJECT_CONFIG, WDF_IO_QUEUE_CONFIG, WDF_DPC_CONFIG);

// The hardware seam (driver/kmdf/src/pci.rs). Transcribed from Microsoft's
// documentation (learn.microsoft.com, the windows-driver-docs-ddi pages of
// wdfdmaenabler.h, wdfcommonbuffer.h, wdfdmatransaction.h, wdfinterrupt.h,
// wdm.h) in bindgen's rendering, as wdk-sys 0.5 generates it.
// wdfdmaenabler.h: `typedef enum _WDF_DMA_PROFILE { WdfDmaProfileInvalid =
// 0, WdfDmaProfilePacket, WdfDmaProfileScatterGather, WdfDmaProfilePacket64,
// WdfDmaProfileScatterGather64, WdfDmaProfileScatterGatherDuplex,
// WdfDmaProfileScatterGather64Duplex, WdfDmaProfileSystem,
// WdfDmaProfileSystemDuplex, WdfDmaProfileMaximum }`.
cenum!(_WDF_DMA_PROFILE, WDF_DMA_PROFILE, WdfDmaProfileInvalid = 0, WdfDmaProfilePacket = 1, WdfDmaProfileScatterGather = 2, WdfDmaProfilePacket64 = 3, WdfDmaProfileScatterGather64 = 4, WdfDmaProfileScatterGatherDuplex = 5, WdfDmaProfileScatterGather64Duplex = 6, WdfDmaProfileSystem = 7, WdfDmaProfileSystemDuplex = 8, WdfDmaProfileMaximum = 9);
// wdfdmaenabler.h: `typedef enum _WDF_DMA_DIRECTION {
// WdfDmaDirectionReadFromDevice = FALSE, WdfDmaDirectionWriteToDevice = TRUE }`.
cenum!(_WDF_DMA_DIRECTION, WDF_DMA_DIRECTION, WdfDmaDirectionReadFromDevice = 0, WdfDmaDirectionWriteToDevice = 1);
pub type PHYSICAL_ADDRESS = LARGE_INTEGER;
pub type WDFCONTEXT = PVOID;
// The EVT_WDF_DMA_ENABLER_* callbacks: `NTSTATUS (WDFDMAENABLER DmaEnabler)`.
pub type PFN_WDF_DMA_ENABLER_FILL = Option<unsafe extern "C" fn(DmaEnabler: WDFDMAENABLER) -> NTSTATUS>;
pub type PFN_WDF_DMA_ENABLER_FLUSH = PFN_WDF_DMA_ENABLER_FILL;
pub type PFN_WDF_DMA_ENABLER_DISABLE = PFN_WDF_DMA_ENABLER_FILL;
pub type PFN_WDF_DMA_ENABLER_ENABLE = PFN_WDF_DMA_ENABLER_FILL;
pub type PFN_WDF_DMA_ENABLER_SELFMANAGED_IO_START = PFN_WDF_DMA_ENABLER_FILL;
pub type PFN_WDF_DMA_ENABLER_SELFMANAGED_IO_STOP = PFN_WDF_DMA_ENABLER_FILL;
// wdfdmaenabler.h (KMDF 1.11 and later: AddressWidthOverride,
// WdmDmaVersionOverride, Flags).
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_DMA_ENABLER_CONFIG { pub Size: ULONG, pub Profile: WDF_DMA_PROFILE, pub MaximumLength: usize, pub EvtDmaEnablerFill: PFN_WDF_DMA_ENABLER_FILL, pub EvtDmaEnablerFlush: PFN_WDF_DMA_ENABLER_FLUSH, pub EvtDmaEnablerDisable: PFN_WDF_DMA_ENABLER_DISABLE, pub EvtDmaEnablerEnable: PFN_WDF_DMA_ENABLER_ENABLE, pub EvtDmaEnablerSelfManagedIoStart: PFN_WDF_DMA_ENABLER_SELFMANAGED_IO_START, pub EvtDmaEnablerSelfManagedIoStop: PFN_WDF_DMA_ENABLER_SELFMANAGED_IO_STOP, pub AddressWidthOverride: ULONG, pub WdmDmaVersionOverride: ULONG, pub Flags: ULONG }
pub type WDF_DMA_ENABLER_CONFIG = _WDF_DMA_ENABLER_CONFIG;
pub type PWDF_DMA_ENABLER_CONFIG = *mut _WDF_DMA_ENABLER_CONFIG;
// wdm.h: `typedef struct _SCATTER_GATHER_ELEMENT { PHYSICAL_ADDRESS Address;
// ULONG Length; ULONG_PTR Reserved; }` and `typedef struct
// _SCATTER_GATHER_LIST { ULONG NumberOfElements; ULONG_PTR Reserved;
// SCATTER_GATHER_ELEMENT Elements[]; }` (bindgen: an incomplete array
// field, here a zero-length array: both give `Elements.as_ptr()`).
#[repr(C)] #[derive(Copy, Clone)]
pub struct _SCATTER_GATHER_ELEMENT { pub Address: PHYSICAL_ADDRESS, pub Length: ULONG, pub Reserved: ULONG_PTR }
pub type SCATTER_GATHER_ELEMENT = _SCATTER_GATHER_ELEMENT;
#[repr(C)]
pub struct _SCATTER_GATHER_LIST { pub NumberOfElements: ULONG, pub Reserved: ULONG_PTR, pub Elements: [_SCATTER_GATHER_ELEMENT; 0] }
pub type SCATTER_GATHER_LIST = _SCATTER_GATHER_LIST;
pub type PSCATTER_GATHER_LIST = *mut _SCATTER_GATHER_LIST;
// wdfdmatransaction.h: `BOOLEAN EVT_WDF_PROGRAM_DMA(WDFDMATRANSACTION
// Transaction, WDFDEVICE Device, WDFCONTEXT Context, WDF_DMA_DIRECTION
// Direction, PSCATTER_GATHER_LIST SgList)`.
pub type PFN_WDF_PROGRAM_DMA = Option<unsafe extern "C" fn(Transaction: WDFDMATRANSACTION, Device: WDFDEVICE, Context: WDFCONTEXT, Direction: WDF_DMA_DIRECTION, SgList: PSCATTER_GATHER_LIST) -> BOOLEAN>;
// wdfinterrupt.h: `BOOLEAN EVT_WDF_INTERRUPT_ISR(WDFINTERRUPT Interrupt,
// ULONG MessageID)`, `VOID EVT_WDF_INTERRUPT_DPC(WDFINTERRUPT Interrupt,
// WDFOBJECT AssociatedObject)`, `NTSTATUS EVT_WDF_INTERRUPT_ENABLE /
// _DISABLE(WDFINTERRUPT Interrupt, WDFDEVICE AssociatedDevice)`, `VOID
// EVT_WDF_INTERRUPT_WORKITEM(WDFINTERRUPT Interrupt, WDFOBJECT
// AssociatedObject)`.
pub type PFN_WDF_INTERRUPT_ISR = Option<unsafe extern "C" fn(Interrupt: WDFINTERRUPT, MessageID: ULONG) -> BOOLEAN>;
pub type PFN_WDF_INTERRUPT_DPC = Option<unsafe extern "C" fn(Interrupt: WDFINTERRUPT, AssociatedObject: WDFOBJECT)>;
pub type PFN_WDF_INTERRUPT_ENABLE = Option<unsafe extern "C" fn(Interrupt: WDFINTERRUPT, AssociatedDevice: WDFDEVICE) -> NTSTATUS>;
pub type PFN_WDF_INTERRUPT_DISABLE = PFN_WDF_INTERRUPT_ENABLE;
pub type PFN_WDF_INTERRUPT_WORKITEM = PFN_WDF_INTERRUPT_DPC;
// wdm.h's CM_PARTIAL_RESOURCE_DESCRIPTOR (`#include <pshpack4.h>`: packed
// to 4): Type, ShareDisposition, Flags and the union `u`. The glue reads
// Type and Flags and hands the descriptor to RtlCMDecodeMemIoResource and
// to WdfInterruptCreate; of `u` only the members it could name are
// transcribed (bindgen numbers the anonymous structs in declaration
// order: Generic is the first, Memory the fifth), the union's size being
// its largest member's (16 bytes: a PHYSICAL_ADDRESS and a ULONG, or the
// interrupt members' ULONG, ULONG and KAFFINITY).
#[repr(C, packed(4))] #[derive(Copy, Clone)]
pub struct _CM_PARTIAL_RESOURCE_DESCRIPTOR { pub Type: UCHAR, pub ShareDisposition: UCHAR, pub Flags: USHORT, pub u: _CM_PARTIAL_RESOURCE_DESCRIPTOR__bindgen_ty_1 }
#[repr(C, packed(4))] #[derive(Copy, Clone)]
pub union _CM_PARTIAL_RESOURCE_DESCRIPTOR__bindgen_ty_1 { pub Generic: _CM_PARTIAL_RESOURCE_DESCRIPTOR__bindgen_ty_1__bindgen_ty_1, pub Memory: _CM_PARTIAL_RESOURCE_DESCRIPTOR__bindgen_ty_1__bindgen_ty_5 }
#[repr(C, packed(4))] #[derive(Copy, Clone)]
pub struct _CM_PARTIAL_RESOURCE_DESCRIPTOR__bindgen_ty_1__bindgen_ty_1 { pub Start: PHYSICAL_ADDRESS, pub Length: ULONG }
#[repr(C, packed(4))] #[derive(Copy, Clone)]
pub struct _CM_PARTIAL_RESOURCE_DESCRIPTOR__bindgen_ty_1__bindgen_ty_5 { pub Start: PHYSICAL_ADDRESS, pub Length: ULONG }
pub type CM_PARTIAL_RESOURCE_DESCRIPTOR = _CM_PARTIAL_RESOURCE_DESCRIPTOR;
// wdm.h: resource types (`#define CmResourceTypeInterrupt 2`, ...) and the
// message-signalled interrupt flag of an interrupt descriptor.
pub const CmResourceTypeInterrupt: u32 = 2;
pub const CmResourceTypeMemory: u32 = 3;
pub const CmResourceTypeMemoryLarge: u32 = 7;
pub const CM_RESOURCE_INTERRUPT_MESSAGE: u32 = 2;
pub type PCM_PARTIAL_RESOURCE_DESCRIPTOR = *mut _CM_PARTIAL_RESOURCE_DESCRIPTOR;
// wdfinterrupt.h (KMDF 1.11 and later fields through CanWakeDevice).
#[repr(C)] #[derive(Debug, Copy, Clone)]
pub struct _WDF_INTERRUPT_CONFIG { pub Size: ULONG, pub SpinLock: WDFSPINLOCK, pub ShareVector: WDF_TRI_STATE, pub FloatingSave: BOOLEAN, pub AutomaticSerialization: BOOLEAN, pub EvtInterruptIsr: PFN_WDF_INTERRUPT_ISR, pub EvtInterruptDpc: PFN_WDF_INTERRUPT_DPC, pub EvtInterruptEnable: PFN_WDF_INTERRUPT_ENABLE, pub EvtInterruptDisable: PFN_WDF_INTERRUPT_DISABLE, pub EvtInterruptWorkItem: PFN_WDF_INTERRUPT_WORKITEM, pub InterruptRaw: PCM_PARTIAL_RESOURCE_DESCRIPTOR, pub InterruptTranslated: PCM_PARTIAL_RESOURCE_DESCRIPTOR, pub WaitLock: WDFWAITLOCK, pub PassiveHandling: BOOLEAN, pub ReportInactiveOnPowerDown: WDF_TRI_STATE, pub CanWakeDevice: BOOLEAN }
pub type WDF_INTERRUPT_CONFIG = _WDF_INTERRUPT_CONFIG;
pub type PWDF_INTERRUPT_CONFIG = *mut _WDF_INTERRUPT_CONFIG;
zeroed_default!(_WDF_DMA_ENABLER_CONFIG, _WDF_INTERRUPT_CONFIG);
// winnt.h memory protection constants (MmMapIoSpaceEx's Protect).
pub const PAGE_READWRITE: ULONG = 0x04;
pub const PAGE_NOCACHE: ULONG = 0x200;

pub const POOL_FLAG_NON_PAGED: POOL_FLAGS = 0x40;
pub const FILE_DEVICE_SECURE_OPEN: u32 = 256;
// wdm.h: `#define MdlMappingNoExecute 0x40000000`, ORed into a mapping's priority.
pub const MdlMappingNoExecute: u32 = 1073741824;
pub const WDF_NO_OBJECT_ATTRIBUTES: PWDF_OBJECT_ATTRIBUTES = core::ptr::null_mut();
pub const WDF_NO_HANDLE: PVOID = core::ptr::null_mut();

pub mod ntddk {
    use super::*;
    unsafe extern "C" {
        pub fn KeGetCurrentIrql() -> KIRQL;
        // wdm.h: `ULONG KeQueryActiveProcessorCountEx(_In_ USHORT GroupNumber);`
        pub fn KeQueryActiveProcessorCountEx(GroupNumber: USHORT) -> ULONG;
        // wdm.h: `NTSTATUS KeGetProcessorNumberFromIndex(_In_ ULONG ProcIndex,
        // _Out_ PPROCESSOR_NUMBER ProcNumber);`
        pub fn KeGetProcessorNumberFromIndex(ProcIndex: ULONG, ProcNumber: PPROCESSOR_NUMBER) -> NTSTATUS;
        // wdm.h: `NTSTATUS KeSetTargetProcessorDpcEx(_Inout_ PKDPC Dpc,
        // _In_ PPROCESSOR_NUMBER ProcNumber);`
        pub fn KeSetTargetProcessorDpcEx(Dpc: PKDPC, ProcNumber: PPROCESSOR_NUMBER) -> NTSTATUS;
        // wdm.h: `ULONG64 KeQueryInterruptTimePrecise(_Out_ PULONG64 QpcTimeStamp);`
        pub fn KeQueryInterruptTimePrecise(QpcTimeStamp: PULONG64) -> ULONG64;
        pub fn ExAllocatePool2(Flags: POOL_FLAGS, NumberOfBytes: SIZE_T, Tag: ULONG) -> PVOID;
        pub fn ExFreePoolWithTag(P: PVOID, Tag: ULONG);
        pub fn KeAcquireInStackQueuedSpinLock(SpinLock: PKSPIN_LOCK, LockHandle: PKLOCK_QUEUE_HANDLE);
        // wdm.h (AMD64, ARM64): `KIRQL KeAcquireSpinLockRaiseToDpc(_Inout_ PKSPIN_LOCK SpinLock);`
        pub fn KeAcquireSpinLockRaiseToDpc(SpinLock: PKSPIN_LOCK) -> KIRQL;
        // wdm.h: `VOID KeReleaseSpinLock(_Inout_ PKSPIN_LOCK SpinLock, _In_ KIRQL NewIrql);`
        pub fn KeReleaseSpinLock(SpinLock: PKSPIN_LOCK, NewIrql: KIRQL);
        pub fn KeReleaseInStackQueuedSpinLock(LockHandle: PKLOCK_QUEUE_HANDLE);
        pub fn IoAllocateMdl(VirtualAddress: PVOID, Length: ULONG, SecondaryBuffer: BOOLEAN, ChargeQuota: BOOLEAN, Irp: PIRP) -> PMDL;
        pub fn IoFreeMdl(Mdl: PMDL);
        pub fn MmBuildMdlForNonPagedPool(MemoryDescriptorList: PMDL);
        pub fn MmProbeAndLockPages(MemoryDescriptorList: PMDL, AccessMode: KPROCESSOR_MODE, Operation: LOCK_OPERATION);
        pub fn MmUnlockPages(MemoryDescriptorList: PMDL);
        pub fn MmMapLockedPagesSpecifyCache(MemoryDescriptorList: PMDL, AccessMode: KPROCESSOR_MODE, CacheType: MEMORY_CACHING_TYPE, RequestedAddress: PVOID, BugCheckOnFailure: ULONG, Priority: ULONG) -> PVOID;
        pub fn MmUnmapLockedPages(BaseAddress: PVOID, MemoryDescriptorList: PMDL);
        pub fn IoGetCurrentProcess() -> PEPROCESS;
        pub fn KeStackAttachProcess(PROCESS: PRKPROCESS, ApcState: PRKAPC_STATE);
        pub fn KeUnstackDetachProcess(ApcState: PRKAPC_STATE);
        pub fn ObfReferenceObject(Object: PVOID) -> LONG_PTR;
        pub fn ObfDereferenceObject(Object: PVOID) -> LONG_PTR;
        pub fn KeInitializeEvent(Event: PRKEVENT, Type: EVENT_TYPE, State: BOOLEAN);
        pub fn KeSetEvent(Event: PRKEVENT, Increment: KPRIORITY, Wait: BOOLEAN) -> LONG;
        pub fn KeClearEvent(Event: PRKEVENT);
        pub fn KeWaitForSingleObject(Object: PVOID, WaitReason: KWAIT_REASON, WaitMode: KPROCESSOR_MODE, Alertable: BOOLEAN, Timeout: PLARGE_INTEGER) -> NTSTATUS;
        pub fn ExAllocateTimer(Callback: PEXT_CALLBACK, CallbackContext: PVOID, Attributes: ULONG) -> PEX_TIMER;
        pub fn ExSetTimer(Timer: PEX_TIMER, DueTime: LONGLONG, Period: LONGLONG, Parameters: PEXT_SET_PARAMETERS) -> BOOLEAN;
        pub fn ExCancelTimer(Timer: PEX_TIMER, Parameters: PEXT_CANCEL_PARAMETERS) -> BOOLEAN;
        // wdm.h: system threads, handles, waits.
        pub fn PsCreateSystemThread(ThreadHandle: PHANDLE, DesiredAccess: ULONG, ObjectAttributes: POBJECT_ATTRIBUTES, ProcessHandle: HANDLE, ClientId: PCLIENT_ID, StartRoutine: PKSTART_ROUTINE, StartContext: PVOID) -> NTSTATUS;
        pub fn PsTerminateSystemThread(ExitStatus: NTSTATUS) -> NTSTATUS;
        pub fn ObReferenceObjectByHandle(Handle: HANDLE, DesiredAccess: ACCESS_MASK, ObjectType: POBJECT_TYPE, AccessMode: KPROCESSOR_MODE, Object: *mut PVOID, HandleInformation: POBJECT_HANDLE_INFORMATION) -> NTSTATUS;
        pub fn ZwClose(Handle: HANDLE) -> NTSTATUS;
        // ntddk.h: `NTSTATUS PsSetCreateProcessNotifyRoutineEx(_In_
        // PCREATE_PROCESS_NOTIFY_ROUTINE_EX NotifyRoutine, _In_ BOOLEAN Remove);`
        pub fn PsSetCreateProcessNotifyRoutineEx(NotifyRoutine: PCREATE_PROCESS_NOTIFY_ROUTINE_EX, Remove: BOOLEAN) -> NTSTATUS;
        pub fn KeDelayExecutionThread(WaitMode: KPROCESSOR_MODE, Alertable: BOOLEAN, Interval: PLARGE_INTEGER) -> NTSTATUS;
        // wdm.h: driver-allocated IRPs.
        pub fn IoAllocateIrp(StackSize: CCHAR, ChargeQuota: BOOLEAN) -> PIRP;
        pub fn IoFreeIrp(Irp: PIRP);
        pub fn IoReuseIrp(Irp: PIRP, Iostatus: NTSTATUS);
        // wdm.h: `VOID FASTCALL IofCompleteRequest(_In_ PIRP Irp, _In_ CCHAR
        // PriorityBoost);` (IoCompleteRequest is a macro for it).
        pub fn IofCompleteRequest(Irp: PIRP, PriorityBoost: CCHAR);
        pub fn ExDeleteTimer(Timer: PEX_TIMER, Cancel: BOOLEAN, Wait: BOOLEAN, Parameters: PEXT_DELETE_PARAMETERS) -> BOOLEAN;
        // wdm.h: `PVOID MmMapIoSpaceEx(PHYSICAL_ADDRESS PhysicalAddress,
        // SIZE_T NumberOfBytes, ULONG Protect);` and `VOID
        // MmUnmapIoSpace(PVOID BaseAddress, SIZE_T NumberOfBytes);`.
        pub fn MmMapIoSpaceEx(PhysicalAddress: PHYSICAL_ADDRESS, NumberOfBytes: SIZE_T, Protect: ULONG) -> PVOID;
        pub fn MmUnmapIoSpace(BaseAddress: PVOID, NumberOfBytes: SIZE_T);
        // wdm.h: `ULONGLONG RtlCMDecodeMemIoResource(_In_ struct
        // _CM_PARTIAL_RESOURCE_DESCRIPTOR *Descriptor, _Out_opt_ PULONGLONG
        // Start);` (a memory or large memory resource's length and start).
        pub fn RtlCMDecodeMemIoResource(Descriptor: *mut _CM_PARTIAL_RESOURCE_DESCRIPTOR, Start: PULONGLONG) -> ULONGLONG;
    }
}

/// The WDF functions, without the DriverGlobals argument the real macro adds.
pub mod wdf_fns {
    use super::*;
    macro_rules! f { ($($name:ident($($a:ident: $t:ty),*) $(-> $r:ty)?;)*) => { $(
        $(#[must_use] #[doc = stringify!($r)])? #[inline(always)]
        pub unsafe fn $name($($a: $t),*) $(-> $r)? { $(let _ = $a;)* unimplemented!() }
    )* } }
    f! {
        WdfDriverCreate(DriverObject: PDRIVER_OBJECT, RegistryPath: PCUNICODE_STRING, DriverAttributes: PWDF_OBJECT_ATTRIBUTES, DriverConfig: PWDF_DRIVER_CONFIG, Driver: *mut WDFDRIVER) -> NTSTATUS;
        WdfDriverOpenParametersRegistryKey(Driver: WDFDRIVER, DesiredAccess: ACCESS_MASK, KeyAttributes: PWDF_OBJECT_ATTRIBUTES, Key: *mut WDFKEY) -> NTSTATUS;
        WdfObjectGetTypedContextWorker(Handle: WDFOBJECT, TypeInfo: PCWDF_OBJECT_CONTEXT_TYPE_INFO) -> PVOID;
        WdfDpcEnqueue(Dpc: WDFDPC) -> BOOLEAN;
        WdfDpcCreate(Config: PWDF_DPC_CONFIG, Attributes: PWDF_OBJECT_ATTRIBUTES, Dpc: *mut WDFDPC) -> NTSTATUS;
        WdfDpcGetParentObject(Dpc: WDFDPC) -> WDFOBJECT;
        // wdfdpc.h: `KDPC* WdfDpcWdmGetDpc(_In_ WDFDPC Dpc);`
        WdfDpcWdmGetDpc(Dpc: WDFDPC) -> PKDPC;
        WdfDeviceInitSetPnpPowerEventCallbacks(DeviceInit: PWDFDEVICE_INIT, PnpPowerEventCallbacks: PWDF_PNPPOWER_EVENT_CALLBACKS);
        WdfDeviceInitSetDeviceType(DeviceInit: PWDFDEVICE_INIT, DeviceType: DEVICE_TYPE);
        WdfDeviceInitSetCharacteristics(DeviceInit: PWDFDEVICE_INIT, DeviceCharacteristics: ULONG, OrInValues: BOOLEAN);
        WdfDeviceInitSetFileObjectConfig(DeviceInit: PWDFDEVICE_INIT, FileObjectConfig: PWDF_FILEOBJECT_CONFIG, FileObjectAttributes: PWDF_OBJECT_ATTRIBUTES);
        WdfDeviceInitSetRequestAttributes(DeviceInit: PWDFDEVICE_INIT, RequestAttributes: PWDF_OBJECT_ATTRIBUTES);
        WdfDeviceInitSetIoInCallerContextCallback(DeviceInit: PWDFDEVICE_INIT, EvtIoInCallerContext: PFN_WDF_IO_IN_CALLER_CONTEXT);
        // wdfdevice.h: `NTSTATUS WdfDeviceInitAssignWdmIrpPreprocessCallback(
        // PWDFDEVICE_INIT DeviceInit, PFN_WDFDEVICE_WDM_IRP_PREPROCESS
        // EvtDeviceWdmIrpPreprocess, UCHAR MajorFunction, PUCHAR
        // MinorFunctions, ULONG NumMinorFunctions);` and `NTSTATUS
        // WdfDeviceWdmDispatchPreprocessedIrp(WDFDEVICE Device, PIRP Irp);`
        // (learn.microsoft.com, nf-wdfdevice-*).
        WdfDeviceInitAssignWdmIrpPreprocessCallback(DeviceInit: PWDFDEVICE_INIT, EvtDeviceWdmIrpPreprocess: PFN_WDFDEVICE_WDM_IRP_PREPROCESS, MajorFunction: UCHAR, MinorFunctions: PUCHAR, NumMinorFunctions: ULONG) -> NTSTATUS;
        WdfDeviceWdmDispatchPreprocessedIrp(Device: WDFDEVICE, Irp: PIRP) -> NTSTATUS;
        WdfDeviceCreate(DeviceInit: *mut PWDFDEVICE_INIT, DeviceAttributes: PWDF_OBJECT_ATTRIBUTES, Device: *mut WDFDEVICE) -> NTSTATUS;
        WdfDeviceCreateSymbolicLink(Device: WDFDEVICE, SymbolicLinkName: PCUNICODE_STRING) -> NTSTATUS;
        WdfDeviceCreateDeviceInterface(Device: WDFDEVICE, InterfaceClassGUID: *const GUID, ReferenceString: PCUNICODE_STRING) -> NTSTATUS;
        WdfDeviceAddQueryInterface(Device: WDFDEVICE, InterfaceConfig: PWDF_QUERY_INTERFACE_CONFIG) -> NTSTATUS;
        WdfDeviceEnqueueRequest(Device: WDFDEVICE, Request: WDFREQUEST) -> NTSTATUS;
        WdfDeviceWdmGetDeviceObject(Device: WDFDEVICE) -> PDEVICE_OBJECT;
        WdfDeviceGetFileObject(Device: WDFDEVICE, FileObject: PFILE_OBJECT) -> WDFFILEOBJECT;
        WdfIoQueueCreate(Device: WDFDEVICE, Config: PWDF_IO_QUEUE_CONFIG, QueueAttributes: PWDF_OBJECT_ATTRIBUTES, Queue: *mut WDFQUEUE) -> NTSTATUS;
        WdfIoQueueGetDevice(Queue: WDFQUEUE) -> WDFDEVICE;
        WdfFileObjectGetDevice(FileObject: WDFFILEOBJECT) -> WDFDEVICE;
        WdfRequestGetRequestorMode(Request: WDFREQUEST) -> KPROCESSOR_MODE;
        WdfRequestGetFileObject(Request: WDFREQUEST) -> WDFFILEOBJECT;
        WdfRequestGetIoQueue(Request: WDFREQUEST) -> WDFQUEUE;
        WdfRequestGetParameters(Request: WDFREQUEST, Parameters: PWDF_REQUEST_PARAMETERS);
        WdfRequestRetrieveInputBuffer(Request: WDFREQUEST, MinimumRequiredLength: usize, Buffer: *mut PVOID, Length: *mut usize) -> NTSTATUS;
        WdfRequestRetrieveOutputBuffer(Request: WDFREQUEST, MinimumRequiredSize: usize, Buffer: *mut PVOID, Length: *mut usize) -> NTSTATUS;
        WdfRequestCompleteWithInformation(Request: WDFREQUEST, Status: NTSTATUS, Information: ULONG_PTR);
        WdfRequestMarkCancelableEx(Request: WDFREQUEST, EvtRequestCancel: PFN_WDF_REQUEST_CANCEL) -> NTSTATUS;
        WdfRequestUnmarkCancelable(Request: WDFREQUEST) -> NTSTATUS;
        WdfDeviceOpenRegistryKey(Device: WDFDEVICE, DeviceInstanceKeyType: ULONG, DesiredAccess: ACCESS_MASK, KeyAttributes: PWDF_OBJECT_ATTRIBUTES, Key: *mut WDFKEY) -> NTSTATUS;
        WdfRegistryQueryULong(Key: WDFKEY, ValueName: PCUNICODE_STRING, Value: PULONG) -> NTSTATUS;
        WdfRegistryQueryUnicodeString(Key: WDFKEY, ValueName: PCUNICODE_STRING, ValueByteLength: PUSHORT, Value: PUNICODE_STRING) -> NTSTATUS;
        WdfRegistryClose(Key: WDFKEY);
        // wdfobject.h
        WdfObjectDelete(Object: WDFOBJECT);
        // wdfdmaenabler.h, wdfcommonbuffer.h, wdfdmatransaction.h
        WdfDmaEnablerCreate(Device: WDFDEVICE, Config: PWDF_DMA_ENABLER_CONFIG, Attributes: PWDF_OBJECT_ATTRIBUTES, DmaEnablerHandle: *mut WDFDMAENABLER) -> NTSTATUS;
        WdfCommonBufferCreate(DmaEnabler: WDFDMAENABLER, Length: usize, Attributes: PWDF_OBJECT_ATTRIBUTES, CommonBuffer: *mut WDFCOMMONBUFFER) -> NTSTATUS;
        WdfCommonBufferGetAlignedVirtualAddress(CommonBuffer: WDFCOMMONBUFFER) -> PVOID;
        WdfCommonBufferGetAlignedLogicalAddress(CommonBuffer: WDFCOMMONBUFFER) -> PHYSICAL_ADDRESS;
        WdfCommonBufferGetLength(CommonBuffer: WDFCOMMONBUFFER) -> usize;
        WdfDmaTransactionCreate(DmaEnabler: WDFDMAENABLER, Attributes: PWDF_OBJECT_ATTRIBUTES, DmaTransaction: *mut WDFDMATRANSACTION) -> NTSTATUS;
        WdfDmaTransactionInitialize(DmaTransaction: WDFDMATRANSACTION, EvtProgramDmaFunction: PFN_WDF_PROGRAM_DMA, DmaDirection: WDF_DMA_DIRECTION, Mdl: PMDL, VirtualAddress: PVOID, Length: usize) -> NTSTATUS;
        WdfDmaTransactionExecute(DmaTransaction: WDFDMATRANSACTION, Context: WDFCONTEXT) -> NTSTATUS;
        WdfDmaTransactionCancel(DmaTransaction: WDFDMATRANSACTION) -> BOOLEAN;
        WdfDmaTransactionDmaCompletedFinal(DmaTransaction: WDFDMATRANSACTION, FinalTransferredLength: usize, Status: *mut NTSTATUS) -> BOOLEAN;
        WdfDmaTransactionRelease(DmaTransaction: WDFDMATRANSACTION);
        // wdfinterrupt.h
        WdfInterruptCreate(Device: WDFDEVICE, Configuration: PWDF_INTERRUPT_CONFIG, Attributes: PWDF_OBJECT_ATTRIBUTES, Interrupt: *mut WDFINTERRUPT) -> NTSTATUS;
        WdfInterruptQueueDpcForIsr(Interrupt: WDFINTERRUPT) -> BOOLEAN;
        // wdfresource.h: `ULONG WdfCmResourceListGetCount(_In_ WDFCMRESLIST
        // List);` and `PCM_PARTIAL_RESOURCE_DESCRIPTOR
        // WdfCmResourceListGetDescriptor(_In_ WDFCMRESLIST List, _In_ ULONG
        // Index);`.
        WdfCmResourceListGetCount(List: WDFCMRESLIST) -> ULONG;
        WdfCmResourceListGetDescriptor(List: WDFCMRESLIST, Index: ULONG) -> PCM_PARTIAL_RESOURCE_DESCRIPTOR;
    }
}

#[macro_export]
macro_rules! call_unsafe_wdf_function_binding {
    ($name:ident $(, $arg:expr)* $(,)?) => { $crate::wdf_fns::$name($($arg),*) };
}
