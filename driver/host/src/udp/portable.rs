//! Other systems: one datagram per system call through `std::net`. The
//! traffic class and hop limit are the socket's (sent) and the defaults
//! (received): without `IP_RECVTOS`-style control messages `std` cannot
//! read them, and the ICRC masks both.

use std::io;
use std::iter::Peekable;
use std::net::{SocketAddr, UdpSocket};

use super::{DEFAULT_HOP_LIMIT, Datagram, Received, RecvReport, SendReport, gid_ip};

/// Datagrams per receive loop turn.
pub(crate) const BATCH: usize = 32;

/// The largest datagram received whole.
pub(crate) const RECV_MAX: usize = 8192;

/// Nothing to set beyond `std`'s defaults.
pub(crate) fn configure(_sock: &UdpSocket, _v6: bool, _buffer: usize) -> io::Result<()> {
    Ok(())
}

/// Without a portable query, the Ethernet MTU.
pub(crate) fn path_mtu(_sock: &UdpSocket, _v6: bool) -> io::Result<usize> {
    Ok(1500)
}

/// Sends the run of datagrams from `src_port`, one `send_to` each (a
/// blocking socket: `std` has no per-call non-blocking send).
pub(crate) fn send_run<'a, I: Iterator<Item = Datagram<'a>>>(
    sock: &UdpSocket,
    v6: bool,
    src_port: u16,
    it: &mut Peekable<I>,
    report: &mut SendReport,
) {
    while let Some(d) = it.next_if(|d| d.src_port == src_port) {
        let ip = gid_ip(&d.dgid);
        if ip.is_ipv6() != v6 {
            report.failed += 1;
            continue;
        }
        report.calls += 1;
        match sock.send_to(d.payload, SocketAddr::new(ip, d.dst_port)) {
            Ok(_) => report.sent += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => report.dropped += 1,
            Err(e) => {
                report.failed += 1;
                report.last_error = e.raw_os_error();
            }
        }
    }
}

/// Waits up to the socket's read timeout for a datagram (a peek, which
/// leaves it queued): true when one is queued (or the peek failed
/// otherwise, which the receive then reports), false on a timeout, an
/// interruption, or while a polling thread has the socket non-blocking.
///
/// # Errors
/// None: the receive reports the socket's errors.
pub(crate) fn wait_readable(sock: &UdpSocket, _timeout: std::time::Duration) -> io::Result<bool> {
    let mut buf = [0u8; RECV_MAX + 1];
    match sock.peek_from(&mut buf) {
        Ok(_) => Ok(true),
        Err(e) => Ok(!matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
        )),
    }
}

/// One receive buffer.
pub(crate) struct Receiver {
    buf: Vec<u8>,
}

impl Receiver {
    pub(crate) fn new(_v6: bool) -> Self {
        Self {
            buf: vec![0; RECV_MAX + 1],
        }
    }

    /// Takes what is queued, up to `BATCH`, without waiting (the socket is
    /// non-blocking for the call).
    pub(crate) fn recv(
        &mut self,
        sock: &UdpSocket,
        f: &mut dyn FnMut(&Received, &[u8]),
    ) -> io::Result<RecvReport> {
        let mut report = RecvReport::default();
        sock.set_nonblocking(true)?;
        for _ in 0..BATCH {
            match sock.recv_from(&mut self.buf) {
                Ok((0, _)) => {}
                Ok((len, _)) if len > RECV_MAX => report.truncated += 1,
                Ok((len, from)) => {
                    let r = Received {
                        sgid: super::ip_gid(from.ip()),
                        src_port: from.port(),
                        traffic_class: 0,
                        hop_limit: DEFAULT_HOP_LIMIT,
                    };
                    report.received += 1;
                    f(&r, &self.buf[..len]);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    break;
                }
                Err(e) => {
                    sock.set_nonblocking(false)?;
                    return Err(e);
                }
            }
        }
        sock.set_nonblocking(false)?;
        Ok(report)
    }
}
