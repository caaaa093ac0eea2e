//! Captures of the wire: RoCEv2 packets as Ethernet frames in a classic
//! pcap file (LINKTYPE_ETHERNET, microsecond timestamps), which Wireshark
//! and tshark decode as InfiniBand (UDP port 4791).
//!
//! The soft HCA has no MAC addresses: a frame's are made up from its IP
//! addresses ([`mac_of`]). Timestamps are the caller's (a capture records
//! whatever clock the caller runs on, real or simulated).

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use irpverbs_soft::link::{Datagram, Direction, Tap};
use irpverbs_soft::packet::{Gid, Packet};
use irpverbs_soft::wire::{self, EmitError, EthAddrs, IpUdp};
use pcap_file::DataLink;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{Endianness, PcapError, TsResolution};

/// The largest frame recorded whole: an Ethernet header with a VLAN tag
/// and the largest IP datagram.
pub const SNAPLEN: u32 = 18 + 0xFFFF;

/// The locally administered MAC address a capture gives an IP address:
/// `02:00` and the address's last four bytes (the IPv4 address, for an
/// IPv4-mapped GID).
#[must_use]
pub fn mac_of(gid: &Gid) -> [u8; 6] {
    [0x02, 0x00, gid[12], gid[13], gid[14], gid[15]]
}

/// Why a packet was not recorded.
#[derive(Debug)]
pub enum CaptureError {
    /// The packet cannot be put on the wire (see [`wire::emit_frame`]).
    Emit(EmitError),
    /// Writing the file failed.
    Pcap(PcapError),
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureError::Emit(e) => write!(f, "cannot emit the packet: {e}"),
            CaptureError::Pcap(e) => write!(f, "cannot write the capture: {e}"),
        }
    }
}

impl std::error::Error for CaptureError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CaptureError::Emit(e) => Some(e),
            CaptureError::Pcap(e) => Some(e),
        }
    }
}

impl From<PcapError> for CaptureError {
    fn from(e: PcapError) -> Self {
        CaptureError::Pcap(e)
    }
}

/// A pcap file being written.
pub struct Capture<W: Write> {
    out: PcapWriter<W>,
    /// The frame being built (reused: one allocation per capture).
    frame: Vec<u8>,
}

impl<W: Write> Capture<W> {
    /// Starts a capture on `out`, writing the file header.
    ///
    /// # Errors
    ///
    /// [`PcapError::IoError`] when `out` fails.
    pub fn new(out: W) -> Result<Self, PcapError> {
        let header = PcapHeader {
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::MicroSecond,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        Ok(Self {
            out: PcapWriter::with_header(out, header)?,
            frame: vec![0; SNAPLEN as usize],
        })
    }

    /// Records an Ethernet frame as it is, at time `ts` (since the Unix
    /// epoch, or since whatever the caller's clock counts from).
    ///
    /// # Errors
    ///
    /// [`PcapError::IoError`] when the output fails;
    /// [`PcapError::InvalidField`] for a frame longer than [`SNAPLEN`].
    pub fn write_frame(&mut self, ts: Duration, frame: &[u8]) -> Result<(), PcapError> {
        let len = u32::try_from(frame.len())
            .ok()
            .filter(|&n| n <= SNAPLEN)
            .ok_or(PcapError::InvalidField("frame longer than the snaplen"))?;
        self.out.write_packet(&PcapPacket::new(ts, len, frame))?;
        Ok(())
    }

    /// Records `pkt` with its payload (pieces in order) as the RoCEv2 frame
    /// [`wire::emit_frame`] makes of it in the datagram `ip`, from
    /// [`mac_of`] its source address to [`mac_of`] its destination, at time
    /// `ts`.
    ///
    /// # Errors
    ///
    /// [`CaptureError::Emit`] for a packet that cannot be emitted,
    /// [`CaptureError::Pcap`] when the output fails.
    pub fn write_packet(
        &mut self,
        ts: Duration,
        pkt: &Packet,
        payload: &[&[u8]],
        ip: &IpUdp,
    ) -> Result<(), CaptureError> {
        let eth = EthAddrs {
            src: mac_of(&ip.src),
            dst: mac_of(&ip.dst),
        };
        let n = wire::emit_frame(pkt, payload, ip, &eth, &mut self.frame)
            .map_err(CaptureError::Emit)?;
        let len = u32::try_from(n).unwrap_or(SNAPLEN);
        let frame = self.frame.get(..n).unwrap_or_default();
        self.out.write_packet(&PcapPacket::new(ts, len, frame))?;
        Ok(())
    }

    /// Records a RoCEv2 UDP payload as it went over the wire (valid or
    /// not), in the IP and UDP headers of `ip`, at time `ts`.
    ///
    /// # Errors
    ///
    /// As [`Capture::write_packet`].
    pub fn write_datagram(
        &mut self,
        ts: Duration,
        ip: &IpUdp,
        transport: &[u8],
    ) -> Result<(), CaptureError> {
        let eth = EthAddrs {
            src: mac_of(&ip.src),
            dst: mac_of(&ip.dst),
        };
        let n = wire::emit_frame_raw(ip, transport, &eth, &mut self.frame)
            .map_err(CaptureError::Emit)?;
        let len = u32::try_from(n).unwrap_or(SNAPLEN);
        let frame = self.frame.get(..n).unwrap_or_default();
        self.out.write_packet(&PcapPacket::new(ts, len, frame))?;
        Ok(())
    }

    /// Flushes and returns the output.
    ///
    /// # Errors
    ///
    /// The output's flush error.
    pub fn finish(self) -> std::io::Result<W> {
        let mut out = self.out.into_writer();
        out.flush()?;
        Ok(out)
    }
}

/// A [`Tap`] that records every datagram a soft HCA sends and receives
/// (`--pcap FILE`), stamped with the wall clock. Buffered: call
/// [`PcapTap::flush`] (or drop the last reference) to get it all on disk.
pub struct PcapTap {
    capture: Mutex<Option<Capture<BufWriter<File>>>>,
    errors: AtomicU64,
}

impl fmt::Debug for PcapTap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PcapTap")
            .field("errors", &self.errors.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl PcapTap {
    /// Creates (truncates) `path` and writes the pcap header.
    ///
    /// # Errors
    ///
    /// Creating or writing the file failed.
    pub fn create(path: &Path) -> Result<Arc<Self>, CaptureError> {
        let file = File::create(path).map_err(|e| CaptureError::Pcap(PcapError::IoError(e)))?;
        Ok(Arc::new(Self {
            capture: Mutex::new(Some(Capture::new(BufWriter::new(file))?)),
            errors: AtomicU64::new(0),
        }))
    }

    /// Datagrams that could not be recorded.
    #[must_use]
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Ends the capture: writes what is buffered to the file. Datagrams
    /// tapped afterwards count as [`PcapTap::errors`].
    ///
    /// # Errors
    ///
    /// The file's write error.
    pub fn finish(&self) -> std::io::Result<()> {
        let c = self
            .capture
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match c {
            Some(c) => c.finish().map(drop),
            None => Ok(()),
        }
    }
}

impl Tap for PcapTap {
    fn tap(&self, _direction: Direction, d: &Datagram<'_>) {
        let ts = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut c = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
        let ok = c
            .as_mut()
            .is_some_and(|c| c.write_datagram(ts, &d.ip(), d.payload).is_ok());
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use irpverbs_soft::packet::{Aeth, AtomicEth, Deth, Reth, aeth, op};
    use irpverbs_soft::wire::ROCE_PORT;
    use pcap_file::pcap::PcapReader;
    use std::process::Command;

    fn v4(last: u8) -> Gid {
        let mut g = [0u8; 16];
        g[10..12].fill(0xFF);
        g[12..].copy_from_slice(&[10, 0, 0, last]);
        g
    }

    fn v6(last: u8) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xFD;
        g[15] = last;
        g
    }

    /// A conversation: an RC SEND, its ACK, a WRITE with immediate, a
    /// READ and its response, an atomic and its ACK over IPv4; a UD SEND
    /// over IPv6.
    fn packets() -> Vec<(Packet, Vec<u8>)> {
        let a = |opcode, psn| Packet {
            opcode,
            pkey: 0xFFFF,
            dest_qpn: 0x11,
            psn,
            sgid: v4(1),
            dgid: v4(2),
            hop_limit: 64,
            ..Packet::default()
        };
        let b = |opcode, psn| Packet {
            dest_qpn: 0x12,
            sgid: v4(2),
            dgid: v4(1),
            ..a(opcode, psn)
        };
        let ack = |opcode, psn| Packet {
            aeth: Aeth {
                syndrome: aeth::ACK_UNLIMITED,
                msn: 1,
            },
            ..b(opcode, psn)
        };
        let reth = Reth {
            va: 0x1000,
            rkey: 0x42,
            len: 5,
        };
        vec![
            (
                Packet {
                    ack_req: true,
                    payload_len: 5,
                    ..a(op::RC_SEND_ONLY, 1)
                },
                b"hello".to_vec(),
            ),
            (ack(op::RC_ACKNOWLEDGE, 1), vec![]),
            (
                Packet {
                    reth,
                    imm: 7,
                    payload_len: 5,
                    ..a(op::RC_WRITE_ONLY_IMM, 2)
                },
                b"world".to_vec(),
            ),
            (
                Packet {
                    reth,
                    ..a(op::RC_READ_REQUEST, 3)
                },
                vec![],
            ),
            (
                Packet {
                    payload_len: 5,
                    ..ack(op::RC_READ_RESPONSE_ONLY, 3)
                },
                b"world".to_vec(),
            ),
            (
                Packet {
                    atomic: AtomicEth {
                        va: 0x2000,
                        rkey: 0x43,
                        swap_add: 1,
                        compare: 0,
                    },
                    ..a(op::RC_FETCH_ADD, 4)
                },
                vec![],
            ),
            (
                Packet {
                    atomic_orig: 41,
                    ..ack(op::RC_ATOMIC_ACKNOWLEDGE, 4)
                },
                vec![],
            ),
            (
                Packet {
                    sgid: v6(1),
                    dgid: v6(2),
                    flow_label: 0x12345,
                    deth: Deth {
                        qkey: 0x1111_1111,
                        src_qpn: 0x13,
                    },
                    payload_len: 8,
                    ..a(op::UD_SEND_ONLY, 9)
                },
                b"datagram".to_vec(),
            ),
        ]
    }

    fn capture() -> Vec<u8> {
        let mut cap = Capture::new(Vec::new()).unwrap();
        for (i, (pkt, payload)) in packets().iter().enumerate() {
            let ip = IpUdp::of(pkt, 0xC000 | u16::try_from(i).unwrap(), 1);
            let ts = Duration::from_micros(1_000_000 + 10 * i as u64);
            cap.write_packet(ts, pkt, &[payload], &ip).unwrap();
        }
        cap.finish().unwrap()
    }

    /// The tap records datagrams as they were, valid or not: each reads
    /// back as a frame around the same UDP payload.
    #[test]
    fn the_tap_records_datagrams_as_they_went() {
        let dir = std::env::temp_dir().join(format!("irpverbs-tap-{}.pcap", std::process::id()));
        let tap = PcapTap::create(&dir).unwrap();
        let mut sent = Vec::new();
        for (i, (pkt, payload)) in packets().iter().enumerate() {
            let ip = IpUdp::of(pkt, 0xC000, 0);
            let mut buf = vec![0; 9000];
            let n = wire::emit_transport(pkt, &[payload], &ip, &mut buf).unwrap();
            buf.truncate(n);
            if i == 1 {
                buf[8] ^= 0x10; // a corrupted one (its PSN) is recorded too
            }
            let d = Datagram {
                sgid: pkt.sgid,
                dgid: pkt.dgid,
                src_port: 0xC000,
                dst_port: ROCE_PORT,
                traffic_class: pkt.traffic_class,
                flow_label: pkt.flow_label,
                hop_limit: pkt.hop_limit,
                payload: &buf,
            };
            tap.tap(Direction::Sent, &d);
            sent.push(buf);
        }
        tap.finish().unwrap();
        assert_eq!(tap.errors(), 0);
        let file = std::fs::read(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        let mut r = PcapReader::new(&file[..]).unwrap();
        let mut n = 0;
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            let parsed = wire::parse_frame(&p.data);
            if n == 1 {
                assert_eq!(parsed.unwrap_err(), wire::WireError::BadIcrc);
            } else {
                assert_eq!(parsed.unwrap().pkt, packets()[n].0);
            }
            assert!(p.data.ends_with(&sent[n]), "the UDP payload as it went");
            n += 1;
        }
        assert_eq!(n, sent.len());
    }

    #[test]
    fn a_capture_reads_back_and_parses() {
        let file = capture();
        let mut r = PcapReader::new(&file[..]).unwrap();
        assert_eq!(r.header().datalink, DataLink::ETHERNET);
        let mut n = 0;
        let want = packets();
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            let (pkt, payload) = &want[n];
            assert_eq!(
                p.timestamp,
                Duration::from_micros(1_000_000 + 10 * n as u64)
            );
            assert_eq!(p.orig_len as usize, p.data.len());
            assert_eq!(p.data[..6], mac_of(&pkt.dgid));
            assert_eq!(p.data[6..12], mac_of(&pkt.sgid));
            let parsed = wire::parse_frame(&p.data).unwrap();
            assert_eq!(parsed.pkt, *pkt);
            assert_eq!(parsed.payload, &payload[..]);
            assert_eq!(parsed.ip.dst_port, ROCE_PORT);
            n += 1;
        }
        assert_eq!(n, want.len());
    }

    #[test]
    fn the_test_vectors_capture_reads_with_pcap_file() {
        let file: &[u8] = include_bytes!("../../../driver/soft/tests/vectors/rocev2/vectors.pcap");
        let mut r = PcapReader::new(file).unwrap();
        let mut n = 0;
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            let parsed = wire::parse_frame(&p.data).unwrap();
            // Re-recorded, a vector's frame is the same bytes.
            let mut cap = Capture::new(Vec::new()).unwrap();
            cap.write_frame(p.timestamp, &p.data).unwrap();
            let again = cap.finish().unwrap();
            let mut r2 = PcapReader::new(&again[..]).unwrap();
            let q = r2.next_packet().unwrap().unwrap();
            assert_eq!(q.data, p.data);
            assert!(parsed.ip.family().is_some());
            n += 1;
        }
        assert_eq!(n, 4);
    }

    #[test]
    fn refusals_are_errors() {
        let mut cap = Capture::new(Vec::new()).unwrap();
        let pkt = Packet {
            opcode: 0x15,
            sgid: v4(1),
            dgid: v4(2),
            ..Packet::default()
        };
        let ip = IpUdp::of(&pkt, 1, 1);
        let e = cap
            .write_packet(Duration::ZERO, &pkt, &[], &ip)
            .unwrap_err();
        assert!(matches!(e, CaptureError::Emit(EmitError::UnknownOpcode)));
        assert!(e.to_string().contains("unknown opcode"));
        let big = vec![0u8; SNAPLEN as usize + 1];
        assert!(cap.write_frame(Duration::ZERO, &big).is_err());
    }

    /// tshark, when installed, decodes every frame as InfiniBand with the
    /// opcode sent.
    #[test]
    fn tshark_decodes_a_capture_as_infiniband() {
        let Ok(out) = Command::new("tshark").arg("--version").output() else {
            assert!(
                std::env::var_os("IRPVERBS_REQUIRE_TSHARK").is_none(),
                "tshark is required (IRPVERBS_REQUIRE_TSHARK) but not installed"
            );
            println!("tshark is not installed: skipping the dissector check");
            return;
        };
        assert!(out.status.success());
        let path =
            std::env::temp_dir().join(format!("irpverbs-capture-{}.pcap", std::process::id()));
        std::fs::write(&path, capture()).unwrap();
        let out = Command::new("tshark")
            .arg("-r")
            .arg(&path)
            .args(["-d", "udp.port==4791,infiniband"])
            .args(["-Y", "infiniband.bth"])
            .args(["-T", "fields", "-e", "infiniband.bth.opcode"])
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let opcodes: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        let want: Vec<String> = packets()
            .iter()
            .map(|(p, _)| p.opcode.to_string())
            .collect();
        assert_eq!(opcodes, want);
    }
}
