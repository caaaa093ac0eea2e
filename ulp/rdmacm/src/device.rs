//! The device: `irpverbs0`, opened once per process through
//! `libibverbs.so.1`, its protection domain for ids given none, and the
//! CM's IOCTLs on its device file (`irpverbs_ioctl`, the companion
//! library's private entry point).

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use irpverbs_abi::*;
use irpverbs_verbs::{Client, IoctlTransport};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi::*;

// The functions of `libibverbs.so.1` (ulp/ibverbs) this library calls.
unsafe extern "C" {
    pub fn ibv_get_device_list(num: *mut c_int) -> *mut *mut c_void;
    pub fn ibv_free_device_list(list: *mut *mut c_void);
    pub fn ibv_open_device(device: *mut c_void) -> *mut c_void;
    pub fn ibv_alloc_pd(ctx: *mut c_void) -> *mut c_void;
    pub fn ibv_create_comp_channel(ctx: *mut c_void) -> *mut c_void;
    pub fn ibv_destroy_comp_channel(channel: *mut c_void) -> c_int;
    pub fn ibv_create_cq(
        ctx: *mut c_void,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut c_void,
        comp_vector: c_int,
    ) -> *mut c_void;
    pub fn ibv_destroy_cq(cq: *mut c_void) -> c_int;
    pub fn ibv_create_qp(pd: *mut c_void, attr: *mut ibv_qp_init_attr) -> *mut c_void;
    pub fn ibv_modify_qp(qp: *mut c_void, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    pub fn ibv_destroy_qp(qp: *mut c_void) -> c_int;
    fn irpverbs_ioctl(
        ctx: *mut c_void,
        code: u32,
        input: *const c_void,
        in_len: usize,
        output: *mut c_void,
        out_len: usize,
        out_bytes: *mut usize,
    ) -> NtStatus;
    pub fn irpverbs_qp_handle(qp: *mut c_void) -> u64;
}

/// The open device.
pub(crate) struct Device {
    /// Its `ibv_context`.
    pub ctx: *mut c_void,
    /// The PD of ids given none (`rdma_create_qp` with a NULL PD).
    pub pd: *mut c_void,
    /// The typed verbs over its file (`irpverbs_ioctl`).
    pub client: Client,
    /// Max RDMA READs / atomics in flight per QP, as responder and as
    /// requester (what `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` mean).
    pub max_rd_atom: u8,
    pub max_init_rd_atom: u8,
}

// SAFETY: the context and PD are libibverbs objects, usable from any
// thread (its functions lock what they share).
unsafe impl Send for Device {}
// SAFETY: as for Send.
unsafe impl Sync for Device {}

/// The IOCTL transport over a context's device file.
struct Transport(usize);

impl IoctlTransport for Transport {
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        let mut out = vec![0u8; output_len];
        let mut n = 0usize;
        // SAFETY: an open context (never closed: the device lives as long
        // as the process); the buffers are valid for their lengths.
        let status = unsafe {
            irpverbs_ioctl(
                self.0 as *mut c_void,
                code,
                input.as_ptr().cast(),
                input.len(),
                out.as_mut_ptr().cast(),
                output_len,
                &mut n,
            )
        };
        out.truncate(n);
        (status, out)
    }
}

/// The device, opened on first use; `ENODEV` when `libibverbs.so.1` has
/// no device (or could not open it: the reason went to stderr).
pub(crate) fn device() -> Result<&'static Device, c_int> {
    static DEVICE: OnceLock<Result<Device, c_int>> = OnceLock::new();
    DEVICE.get_or_init(open).as_ref().map_err(|&e| e)
}

fn open() -> Result<Device, c_int> {
    let mut n = 0;
    // SAFETY: a count to write.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(libc::ENODEV);
    }
    let first = if n > 0 {
        // SAFETY: a NULL-terminated list of `n` devices.
        unsafe { *list }
    } else {
        std::ptr::null_mut()
    };
    let ctx = if first.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: a device of the list, still held.
        unsafe { ibv_open_device(first) }
    };
    // SAFETY: the list from ibv_get_device_list (the context keeps its
    // device).
    unsafe { ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err(libc::ENODEV);
    }
    // SAFETY: an open context.
    let pd = unsafe { ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    let client = Client::new(Box::new(Transport(ctx as usize)));
    let attr = client.query_device().map_err(errno_of)?;
    Ok(Device {
        ctx,
        pd,
        client,
        max_rd_atom: attr.max_qp_rd_atom.min(255) as u8,
        max_init_rd_atom: attr.max_qp_init_rd_atom.min(255) as u8,
    })
}

/// The errno rdma-core gives for what the driver completed with `status`.
pub(crate) fn errno_of(status: NtStatus) -> c_int {
    match status {
        STATUS_SUCCESS => 0,
        STATUS_DEVICE_BUSY => libc::EBUSY,
        STATUS_INSUFFICIENT_RESOURCES => libc::ENOMEM,
        STATUS_NOT_SUPPORTED | STATUS_INVALID_DEVICE_REQUEST => libc::EOPNOTSUPP,
        STATUS_ADDRESS_ALREADY_EXISTS => libc::EADDRINUSE,
        STATUS_INVALID_ADDRESS => libc::EADDRNOTAVAIL,
        STATUS_NETWORK_UNREACHABLE => libc::ENETUNREACH,
        STATUS_CONNECTION_REFUSED => libc::ECONNREFUSED,
        STATUS_IO_TIMEOUT => libc::ETIMEDOUT,
        STATUS_CANCELLED => libc::ECANCELED,
        STATUS_DEVICE_REMOVED => libc::ENODEV,
        STATUS_ACCESS_DENIED => libc::EACCES,
        STATUS_INVALID_HANDLE
        | STATUS_INVALID_PARAMETER
        | STATUS_INVALID_PARAMETER_MIX
        | STATUS_INVALID_DEVICE_STATE
        | STATUS_BUFFER_TOO_SMALL => libc::EINVAL,
        _ => libc::EIO,
    }
}

/// An IOCTL with a response struct.
pub(crate) fn call<I: IntoBytes + Immutable, O: FromBytes>(
    d: &Device,
    code: u32,
    input: &I,
) -> Result<O, NtStatus> {
    let (status, out) = d.client.raw(code, input.as_bytes(), size_of::<O>());
    if !nt_success(status) {
        return Err(status);
    }
    O::read_from_bytes(&out).map_err(|_| STATUS_BUFFER_TOO_SMALL)
}

/// An IOCTL without a response.
pub(crate) fn call_none<I: IntoBytes + Immutable>(
    d: &Device,
    code: u32,
    input: &I,
) -> Result<(), NtStatus> {
    let (status, _) = d.client.raw(code, input.as_bytes(), 0);
    if nt_success(status) {
        Ok(())
    } else {
        Err(status)
    }
}
