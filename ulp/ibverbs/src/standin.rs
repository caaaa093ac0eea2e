//! Stand-ins for the provider libraries Debian's perftest is linked
//! against, `libmlx5.so.1` and `libefa.so.1` (`link.sh` links them from
//! this crate with `mlx5.map` and `efa.map`): every program that needs
//! them binds their direct-verbs functions at load (`BIND_NOW`), but calls
//! them only for an mlx5 or EFA device, which `irpverbs0` is not. Each
//! fails as the real one does on a device of another vendor: NULL or
//! `EOPNOTSUPP`.

use std::ffi::{c_int, c_void};

use crate::null_with;

/// `mlx5dv_open_device`: not an mlx5 device.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_open_device(_device: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    null_with(libc::EOPNOTSUPP)
}

/// `mlx5dv_create_qp`.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_create_qp(
    _context: *mut c_void,
    _qp_attr: *mut c_void,
    _mlx5_qp_attr: *mut c_void,
) -> *mut c_void {
    null_with(libc::EOPNOTSUPP)
}

/// `mlx5dv_qp_ex_from_ibv_qp_ex`: no QP of this library is an mlx5 QP.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut c_void) -> *mut c_void {
    null_with(libc::EOPNOTSUPP)
}

/// `mlx5dv_create_mkey`.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_create_mkey(_attr: *mut c_void) -> *mut c_void {
    null_with(libc::EOPNOTSUPP)
}

/// `mlx5dv_destroy_mkey`.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_destroy_mkey(_mkey: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `mlx5dv_devx_general_cmd`.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_devx_general_cmd(
    _context: *mut c_void,
    _input: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `mlx5dv_crypto_login`.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_crypto_login(_context: *mut c_void, _attr: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `mlx5dv_dek_create`.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_dek_create(_context: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    null_with(libc::EOPNOTSUPP)
}

/// `mlx5dv_dek_destroy`.
#[unsafe(no_mangle)]
pub extern "C" fn mlx5dv_dek_destroy(_dek: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `efadv_query_device`: not an EFA device.
#[unsafe(no_mangle)]
pub extern "C" fn efadv_query_device(
    _context: *mut c_void,
    _attr: *mut c_void,
    _inlen: u32,
) -> c_int {
    libc::EOPNOTSUPP
}

/// `efadv_create_qp_ex`.
#[unsafe(no_mangle)]
pub extern "C" fn efadv_create_qp_ex(
    _context: *mut c_void,
    _attr_ex: *mut c_void,
    _efa_attr: *mut c_void,
    _inlen: u32,
) -> *mut c_void {
    null_with(libc::EOPNOTSUPP)
}
