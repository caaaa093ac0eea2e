//! `QUERY_PORT` and `QUERY_GID`, and the port number check the other
//! verbs share.

use irpverbs_abi::*;

use super::Op;
use crate::{Command, CommandOut};

/// `IOCTL_IV_QUERY_PORT`: the port must exist; the HCA reads its
/// attributes.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a reserved field set or a port number
/// out of range.
pub(crate) fn query_port(
    i: &IvQueryPortIn,
    caps: &IvQueryDeviceOut,
) -> Result<(Op, Command), NtStatus> {
    if i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    check_port(i.port_num, caps)?;
    let port = i.port_num as u8;
    Ok((Op::QueryPort, Command::QueryPort { port }))
}

/// `IOCTL_IV_QUERY_PORT`'s completion: the port's attributes are the
/// output (`None`: not what the command returns).
pub(crate) fn query_port_done(out: CommandOut) -> Option<IvQueryPortOut> {
    match out {
        CommandOut::Port(p) => Some(p),
        _ => None,
    }
}

/// `IOCTL_IV_QUERY_GID`. The table length is the HCA's to check (it is a
/// port attribute).
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for a port number or an index out of range.
pub(crate) fn query_gid(
    i: &IvQueryGidIn,
    caps: &IvQueryDeviceOut,
) -> Result<(Op, Command), NtStatus> {
    check_port(i.port_num, caps)?;
    if i.index > 0xFFFF {
        return Err(STATUS_INVALID_PARAMETER);
    }
    let port = i.port_num as u8;
    Ok((
        Op::QueryGid,
        Command::QueryGid {
            port,
            index: i.index,
        },
    ))
}

/// `IOCTL_IV_QUERY_GID`'s completion: the GID is the output.
pub(crate) fn query_gid_done(out: CommandOut) -> Option<IvQueryGidOut> {
    match out {
        CommandOut::Gid(gid) => Some(IvQueryGidOut { gid }),
        _ => None,
    }
}

/// A port number must be 1 to `phys_port_cnt`.
pub(crate) fn check_port(port: u32, caps: &IvQueryDeviceOut) -> Result<(), NtStatus> {
    if port == 0 || port > u32::from(caps.phys_port_cnt) {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}
