//! Linux: batched sends and receives (`sendmmsg`, `recvmmsg`), with the IP
//! header's traffic class and hop limit carried as control messages both
//! ways (`IP_TOS`/`IP_TTL`, `IPV6_TCLASS`/`IPV6_HOPLIMIT`).
//!
//! Every array a system call reads or writes lives on the caller's stack
//! (sends) or in the [`Receiver`] (receives) for the whole call, and every
//! pointer in the headers is taken from those arrays after they are filled.
#![allow(unsafe_code, reason = "socket system calls and their C structs")]

use std::io;
use std::iter::Peekable;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

use libc::{c_int, c_uint, c_void};

use super::{DEFAULT_HOP_LIMIT, Datagram, Received, RecvReport, SendReport, mapped_v4};

/// Datagrams per system call.
pub(crate) const BATCH: usize = 32;

/// The largest datagram received whole (a 4096-byte MTU packet with every
/// header fits; a longer one is dropped as truncated).
pub(crate) const RECV_MAX: usize = 8192;

// SAFETY: CMSG_SPACE is arithmetic on its argument.
const INT_SPACE: usize = unsafe { libc::CMSG_SPACE(size_of::<c_int>() as c_uint) } as usize;
// SAFETY: CMSG_LEN is arithmetic on its argument.
const INT_LEN: usize = unsafe { libc::CMSG_LEN(size_of::<c_int>() as c_uint) } as usize;
// SAFETY: as above.
const HDR_LEN: usize = unsafe { libc::CMSG_LEN(0) } as usize;

/// One control message whose data is at most an `int`, laid out as the C
/// macros lay it out: `CMSG_SPACE(sizeof(int))` bytes, the data right after
/// the header. Each control message this module sends or asks for has an
/// `int` or a byte of data, so a buffer of these holds one per slot.
#[repr(C)]
#[derive(Clone, Copy)]
struct IntCmsg {
    hdr: libc::cmsghdr,
    data: [u8; INT_SPACE - HDR_LEN],
}

const _: () = assert!(size_of::<IntCmsg>() == INT_SPACE);
const _: () = assert!(size_of::<libc::cmsghdr>() == HDR_LEN);

impl IntCmsg {
    fn new(level: c_int, kind: c_int, value: c_int) -> Self {
        // SAFETY: a cmsghdr is a length, a level and a type (and, in some C
        // libraries, padding): all zeros is a valid value.
        let mut hdr: libc::cmsghdr = unsafe { std::mem::zeroed() };
        hdr.cmsg_len = INT_LEN as _;
        hdr.cmsg_level = level;
        hdr.cmsg_type = kind;
        let mut data = [0; INT_SPACE - HDR_LEN];
        data[..size_of::<c_int>()].copy_from_slice(&value.to_ne_bytes());
        Self { hdr, data }
    }

    fn int(&self) -> c_int {
        let mut b = [0; size_of::<c_int>()];
        b.copy_from_slice(&self.data[..size_of::<c_int>()]);
        c_int::from_ne_bytes(b)
    }
}

fn mmsghdr() -> libc::mmsghdr {
    // SAFETY: an mmsghdr is pointers, lengths and flags: all zeros (null
    // pointers, zero lengths) is a valid value.
    unsafe { std::mem::zeroed() }
}

const SIN_ZERO: libc::sockaddr_in = libc::sockaddr_in {
    sin_family: 0,
    sin_port: 0,
    sin_addr: libc::in_addr { s_addr: 0 },
    sin_zero: [0; 8],
};

const SIN6_ZERO: libc::sockaddr_in6 = libc::sockaddr_in6 {
    sin6_family: 0,
    sin6_port: 0,
    sin6_flowinfo: 0,
    sin6_addr: libc::in6_addr { s6_addr: [0; 16] },
    sin6_scope_id: 0,
};

const IOV_ZERO: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

fn setsockopt_int(sock: &UdpSocket, level: c_int, name: c_int, value: c_int) -> io::Result<()> {
    // SAFETY: the option value is a live c_int and its length is given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw const value).cast::<c_void>(),
            size_of::<c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_int(sock: &UdpSocket, level: c_int, name: c_int) -> io::Result<c_int> {
    let mut value: c_int = 0;
    let mut len = size_of::<c_int>() as libc::socklen_t;
    // SAFETY: the value and length are live locals of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw mut value).cast::<c_void>(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets a link socket up: receive the traffic class and hop limit of every
/// datagram, never fragment (the ICRC covers the IPv4 DF bit and the
/// identification, which Linux leaves 0 on unfragmentable datagrams of an
/// unconnected socket), and socket buffers of `buffer` bytes (beyond the
/// system's maximum where the process may: `SO_*BUFFORCE`).
pub(crate) fn configure(sock: &UdpSocket, v6: bool, buffer: usize) -> io::Result<()> {
    if v6 {
        setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
        setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)?;
        setsockopt_int(
            sock,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )?;
    } else {
        setsockopt_int(sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
        setsockopt_int(sock, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)?;
        setsockopt_int(
            sock,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )?;
    }
    let size = c_int::try_from(buffer).unwrap_or(c_int::MAX);
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt_int(sock, libc::SOL_SOCKET, force, size).is_err() {
            setsockopt_int(sock, libc::SOL_SOCKET, plain, size)?;
        }
    }
    Ok(())
}

/// The path MTU the kernel knows for the destination `sock` is connected
/// to (the outgoing interface's MTU until PMTU discovery lowers it).
pub(crate) fn path_mtu(sock: &UdpSocket, v6: bool) -> io::Result<usize> {
    let mtu = if v6 {
        getsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_MTU)?
    } else {
        getsockopt_int(sock, libc::IPPROTO_IP, libc::IP_MTU)?
    };
    usize::try_from(mtu).map_err(|_| io::Error::other("negative MTU"))
}

/// Sends the datagrams `it` yields while their source port is `src_port`
/// (a run), from `sock` (bound to that port), each to its destination GID
/// and port, `BATCH` per `sendmmsg`. Never blocks: what the socket
/// has no room for is dropped and counted.
pub(crate) fn send_run<'a, I: Iterator<Item = Datagram<'a>>>(
    sock: &UdpSocket,
    v6: bool,
    src_port: u16,
    it: &mut Peekable<I>,
    report: &mut SendReport,
) {
    loop {
        let mut iov = [IOV_ZERO; BATCH];
        let mut v4a = [SIN_ZERO; BATCH];
        let mut v6a = [SIN6_ZERO; BATCH];
        let mut ctl = [[IntCmsg::new(0, 0, 0); 2]; BATCH];
        let mut ctl_len = [0usize; BATCH];
        let mut n = 0;
        while n < BATCH {
            let Some(d) = it.next_if(|d| d.src_port == src_port) else {
                break;
            };
            let Some(ctls) = fill(&d, v6, &mut v4a[n], &mut v6a[n], &mut ctl[n]) else {
                report.failed += 1;
                continue;
            };
            iov[n] = libc::iovec {
                iov_base: d.payload.as_ptr().cast_mut().cast::<c_void>(),
                iov_len: d.payload.len(),
            };
            ctl_len[n] = ctls * INT_SPACE;
            n += 1;
        }
        if n == 0 {
            return;
        }
        let mut hdrs = [mmsghdr(); BATCH];
        let (iov_p, v4_p, v6_p, ctl_p) = (
            iov.as_mut_ptr(),
            v4a.as_mut_ptr(),
            v6a.as_mut_ptr(),
            ctl.as_mut_ptr(),
        );
        for (i, h) in hdrs[..n].iter_mut().enumerate() {
            let m = &mut h.msg_hdr;
            if v6 {
                m.msg_name = v6_p.wrapping_add(i).cast::<c_void>();
                m.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            } else {
                m.msg_name = v4_p.wrapping_add(i).cast::<c_void>();
                m.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            m.msg_iov = iov_p.wrapping_add(i);
            m.msg_iovlen = 1;
            if ctl_len[i] > 0 {
                m.msg_control = ctl_p.wrapping_add(i).cast::<c_void>();
                m.msg_controllen = ctl_len[i] as _;
            }
        }
        send_all(sock, &mut hdrs[..n], report);
        if n < BATCH {
            return;
        }
    }
}

/// Fills one message's address and control messages; how many control
/// messages, or `None` when the destination is of the other IP family.
fn fill(
    d: &Datagram<'_>,
    v6: bool,
    v4a: &mut libc::sockaddr_in,
    v6a: &mut libc::sockaddr_in6,
    ctl: &mut [IntCmsg; 2],
) -> Option<usize> {
    let tc = c_int::from(d.traffic_class);
    let hop = (d.hop_limit != 0).then_some(c_int::from(d.hop_limit));
    let (level, tc_kind, hop_kind) = match (v6, mapped_v4(&d.dgid)) {
        (false, Some(ip)) => {
            *v4a = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: d.dst_port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(ip.octets()),
                },
                sin_zero: [0; 8],
            };
            (libc::IPPROTO_IP, libc::IP_TOS, libc::IP_TTL)
        }
        (true, None) => {
            *v6a = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: d.dst_port.to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: d.dgid },
                sin6_scope_id: 0,
            };
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, libc::IPV6_HOPLIMIT)
        }
        _ => return None,
    };
    ctl[0] = IntCmsg::new(level, tc_kind, tc);
    Some(match hop {
        Some(h) => {
            ctl[1] = IntCmsg::new(level, hop_kind, h);
            2
        }
        None => 1,
    })
}

fn send_all(sock: &UdpSocket, hdrs: &mut [libc::mmsghdr], report: &mut SendReport) {
    let mut off = 0;
    while off < hdrs.len() {
        let rest = &mut hdrs[off..];
        // SAFETY: every header of `rest` points at an address, one iovec
        // (over a payload the caller borrows) and control messages, all
        // live in the caller's frame for this call; the kernel only reads
        // them (and writes each header's msg_len).
        let rc = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                rest.as_mut_ptr(),
                rest.len() as c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        report.calls += 1;
        if rc > 0 {
            off += rc as usize;
            report.sent += rc as u64;
            continue;
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EAGAIN | libc::ENOBUFS) => {
                report.dropped += (hdrs.len() - off) as u64;
                return;
            }
            _ if rc == 0 => {
                report.dropped += (hdrs.len() - off) as u64;
                return;
            }
            _ => {
                // The first message of the rest failed on its own
                // (unreachable, too long): skip it.
                report.failed += 1;
                report.last_error = err.raw_os_error();
                off += 1;
            }
        }
    }
}

/// Waits up to `timeout` for `sock` to be readable (`poll(2)`): true when
/// it is (or has an error to report), false on a timeout or an
/// interruption.
///
/// # Errors
/// `poll`'s.
pub(crate) fn wait_readable(sock: &UdpSocket, timeout: std::time::Duration) -> io::Result<bool> {
    let mut fd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    // SAFETY: one live pollfd, and the count says one.
    let rc = unsafe { libc::poll(&raw mut fd, 1, ms) };
    if rc >= 0 {
        return Ok(rc > 0);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EINTR) => Ok(false),
        _ => Err(err),
    }
}

/// Receive buffers for `BATCH` datagrams per `recvmmsg`.
pub(crate) struct Receiver {
    v6: bool,
    bufs: Vec<u8>,
    v4a: Box<[libc::sockaddr_in; BATCH]>,
    v6a: Box<[libc::sockaddr_in6; BATCH]>,
    ctl: Box<[[IntCmsg; 2]; BATCH]>,
}

impl Receiver {
    pub(crate) fn new(v6: bool) -> Self {
        Self {
            v6,
            bufs: vec![0; BATCH * RECV_MAX],
            v4a: Box::new([SIN_ZERO; BATCH]),
            v6a: Box::new([SIN6_ZERO; BATCH]),
            ctl: Box::new([[IntCmsg::new(0, 0, 0); 2]; BATCH]),
        }
    }

    /// Takes what is queued, up to `BATCH`, without waiting, and calls `f`
    /// with each non-empty datagram's facts and bytes.
    ///
    /// # Errors
    /// The socket's, but nothing queued or an interruption (nothing
    /// received).
    pub(crate) fn recv(
        &mut self,
        sock: &UdpSocket,
        f: &mut dyn FnMut(&Received, &[u8]),
    ) -> io::Result<RecvReport> {
        let mut iov = [IOV_ZERO; BATCH];
        let bufs = self.bufs.as_mut_ptr();
        for (i, v) in iov.iter_mut().enumerate() {
            *v = libc::iovec {
                iov_base: bufs.wrapping_add(i * RECV_MAX).cast::<c_void>(),
                iov_len: RECV_MAX,
            };
        }
        let mut hdrs = [mmsghdr(); BATCH];
        let (v4_p, v6_p, ctl_p) = (
            self.v4a.as_mut_ptr(),
            self.v6a.as_mut_ptr(),
            self.ctl.as_mut_ptr(),
        );
        let iov_p = iov.as_mut_ptr();
        for (i, h) in hdrs.iter_mut().enumerate() {
            let m = &mut h.msg_hdr;
            m.msg_iov = iov_p.wrapping_add(i);
            m.msg_iovlen = 1;
            if self.v6 {
                m.msg_name = v6_p.wrapping_add(i).cast::<c_void>();
                m.msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            } else {
                m.msg_name = v4_p.wrapping_add(i).cast::<c_void>();
                m.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            m.msg_control = ctl_p.wrapping_add(i).cast::<c_void>();
            m.msg_controllen = (2 * INT_SPACE) as _;
        }
        // SAFETY: every header points at a RECV_MAX-byte slice of `bufs`, an
        // address slot and a control buffer of the length given, all owned
        // by `self` (or this frame, for the iovecs) and not otherwise
        // borrowed during the call; the kernel writes within those lengths.
        let rc = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                BATCH as c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(RecvReport::default()),
                _ => Err(err),
            };
        }
        let mut report = RecvReport::default();
        for (i, h) in hdrs[..rc as usize].iter().enumerate() {
            let m = &h.msg_hdr;
            if m.msg_flags & libc::MSG_TRUNC != 0 {
                report.truncated += 1;
                continue;
            }
            let len = (h.msg_len as usize).min(RECV_MAX);
            if len == 0 {
                // A wake-up (or a stray empty datagram): nothing to deliver.
                continue;
            }
            let (sgid, src_port) = if self.v6 {
                let a = &self.v6a[i];
                (a.sin6_addr.s6_addr, u16::from_be(a.sin6_port))
            } else {
                let a = &self.v4a[i];
                let ip = std::net::Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
                (ip.to_ipv6_mapped().octets(), u16::from_be(a.sin_port))
            };
            let mut r = Received {
                sgid,
                src_port,
                traffic_class: 0,
                hop_limit: DEFAULT_HOP_LIMIT,
            };
            #[allow(
                clippy::unnecessary_cast,
                reason = "its type differs between C libraries"
            )]
            let ctl_len = m.msg_controllen as usize;
            if m.msg_flags & libc::MSG_CTRUNC == 0 {
                for c in self.ctl[i].iter().take(ctl_len / INT_SPACE) {
                    #[allow(
                        clippy::unnecessary_cast,
                        reason = "its type differs between C libraries"
                    )]
                    let clen = c.hdr.cmsg_len as usize;
                    if !(HDR_LEN + 1..=INT_LEN).contains(&clen) {
                        break;
                    }
                    match (c.hdr.cmsg_level, c.hdr.cmsg_type) {
                        (libc::IPPROTO_IP, libc::IP_TOS) => r.traffic_class = c.data[0],
                        (libc::IPPROTO_IP, libc::IP_TTL)
                        | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                            r.hop_limit = c.int() as u8;
                        }
                        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                            r.traffic_class = c.int() as u8;
                        }
                        _ => {}
                    }
                }
            }
            report.received += 1;
            f(&r, &self.bufs[i * RECV_MAX..i * RECV_MAX + len]);
        }
        Ok(report)
    }
}
