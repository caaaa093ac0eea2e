//! Port and GID queries.

use irpverbs_abi::*;

/// Validates `IOCTL_IV_QUERY_PORT` input.
pub(crate) fn check_query_port(i: &IvQueryPortIn, caps: &IvQueryDeviceOut) -> Result<(), NtStatus> {
    if i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    check_port(i.port_num, caps)
}

/// Validates `IOCTL_IV_QUERY_GID` input. The table length is the HCA's to
/// check (it is a port attribute).
pub(crate) fn check_query_gid(i: &IvQueryGidIn, caps: &IvQueryDeviceOut) -> Result<(), NtStatus> {
    check_port(i.port_num, caps)?;
    if i.index > 0xFFFF {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}

/// A port number must be 1 to `phys_port_cnt`.
pub(crate) fn check_port(port: u32, caps: &IvQueryDeviceOut) -> Result<(), NtStatus> {
    if port == 0 || port > u32::from(caps.phys_port_cnt) {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}
