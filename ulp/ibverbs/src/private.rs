//! What this library gives its companion `librdmacm.so.1` (`ulp/rdmacm`),
//! under the private version `IRPVERBS_PRIVATE_1`: the device file of a
//! context, as an IOCTL entry point, and the driver's handle of a QP. The
//! two libraries then share one open device per process (the CM's
//! requests move the QPs this library created), as rdma-core's librdmacm
//! shares libibverbs' contexts.

use std::ffi::{c_int, c_void};

use irpverbs_abi::*;

use crate::abi::{ibv_context, ibv_qp};
use crate::context;

/// Issues the IOCTL `code` on the device file of `ctx` and waits for it:
/// `in_len` bytes at `input` in, at most `out_len` bytes out at `output`,
/// their count in `*out_bytes`. Returns the request's NTSTATUS
/// (`STATUS_INVALID_PARAMETER` for a NULL context or buffer).
///
/// # Safety
/// `ctx` is NULL or an open context of this library; the buffers are
/// valid for their lengths; `out_bytes` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn irpverbs_ioctl(
    ctx: *mut ibv_context,
    code: u32,
    input: *const c_void,
    in_len: usize,
    output: *mut c_void,
    out_len: usize,
    out_bytes: *mut usize,
) -> c_int {
    // SAFETY: an open context or NULL (caller).
    let Some(c) = (unsafe { context(ctx) }) else {
        return STATUS_INVALID_PARAMETER;
    };
    if (input.is_null() && in_len != 0) || (output.is_null() && out_len != 0) {
        return STATUS_INVALID_PARAMETER;
    }
    let input = if in_len == 0 {
        &[][..]
    } else {
        // SAFETY: `in_len` readable bytes (caller).
        unsafe { std::slice::from_raw_parts(input.cast::<u8>(), in_len) }
    };
    let (status, out) = c.client.raw(code, input, out_len);
    let n = out.len().min(out_len);
    if n != 0 {
        // SAFETY: `out_len` >= `n` writable bytes (caller), not `out`'s.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), output.cast::<u8>(), n) };
    }
    if !out_bytes.is_null() {
        // SAFETY: writable (caller).
        unsafe { *out_bytes = n };
    }
    status
}

/// The driver's handle of the QP `qp` (0 for NULL).
///
/// # Safety
/// `qp` is NULL or a live QP of this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn irpverbs_qp_handle(qp: *mut ibv_qp) -> u64 {
    // SAFETY: forwarded (caller).
    unsafe { crate::qp::qp_handle(qp) }.map_or(0, |(h, _)| h)
}
