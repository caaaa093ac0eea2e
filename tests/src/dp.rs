//! The data-path tests: IOCTLs for the objects, the speed path (post, poll,
//! doorbells on the mapped rings) for the work. Each checks every completion
//! (status, opcode, byte length, work request id, flags, QP number), the
//! data byte for byte, and — where the IBTA has a fatal error move a QP to
//! ERR — the QP's state (`QUERY_QP`) and its async event
//! (`GET_ASYNC_EVENT`, then `ACK_ASYNC_EVENT` so that teardown is not
//! busy). Teardown destroys every QP explicitly: a destroy refused as busy
//! there is an async event the test did not expect.
//!
//! Buffers are [`Mem`]s: words of atomics, so the HCA may write them (DMA)
//! while the test holds them, without `unsafe`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_verbs::speed::wc_status_name;
use irpverbs_verbs::{
    Client, Cq, PostError, Qp, RecvWr, SendWr, Srq, Wc, bind_mw_wr, next_rkey, rts_steps,
};
use zerocopy::{FromBytes, IntoBytes};

use crate::Dut;
use crate::suite::{busy, expect, ok};

/// How long a test waits for a completion that must come.
const DEADLINE: Duration = Duration::from_secs(5);
/// How long a test watches for a completion that must not come.
const QUIET: Duration = Duration::from_millis(20);

/// `user_context` of every QP, CQ and SRQ the tests create (async events
/// return it).
const QP_CONTEXT: u64 = 0x0000_0A0A_0000_0001;
const CQ_CONTEXT: u64 = 0x0000_0C0C_0000_0002;
const SRQ_CONTEXT: u64 = 0x0000_050A_0000_0003;

/// The Q_Key `rts_steps` gives UD QPs.
const QKEY: u32 = 0x1111_1111;

// ---- memory -------------------------------------------------------------

/// A buffer the HCA reads and writes: 8-byte words of atomics (so it is
/// 8-byte aligned, for atomics, and shared mutability is sound).
pub(crate) struct Mem {
    words: Box<[AtomicU64]>,
}

impl Mem {
    fn new(len: usize) -> Self {
        Self {
            words: (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn addr(&self) -> u64 {
        self.words.as_ptr() as u64
    }

    fn len(&self) -> u64 {
        (self.words.len() * 8) as u64
    }

    fn words(&self, off: usize, len: usize) -> (usize, Vec<u8>) {
        let first = off / 8;
        let last = (off + len).div_ceil(8);
        let bytes = self.words[first..last]
            .iter()
            .flat_map(|w| w.load(Ordering::Acquire).to_ne_bytes())
            .collect();
        (first, bytes)
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let (first, bytes) = self.words(off, len);
        let at = off - first * 8;
        bytes[at..at + len].to_vec()
    }

    fn write(&self, off: usize, data: &[u8]) {
        let (first, mut bytes) = self.words(off, data.len());
        let at = off - first * 8;
        bytes[at..at + data.len()].copy_from_slice(data);
        for (w, chunk) in self.words[first..].iter().zip(bytes.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_ne_bytes(b), Ordering::Release);
        }
    }

    fn u64_at(&self, off: usize) -> u64 {
        assert!(off % 8 == 0, "unaligned u64");
        self.words[off / 8].load(Ordering::Acquire)
    }

    fn set_u64(&self, off: usize, v: u64) {
        assert!(off % 8 == 0, "unaligned u64");
        self.words[off / 8].store(v, Ordering::Release);
    }
}

/// A registered [`Mem`].
#[derive(Clone, Copy, Debug)]
struct Mr {
    handle: IvHandle,
    lkey: u32,
    rkey: u32,
    addr: u64,
    len: u64,
}

impl Mr {
    fn sge(&self, off: u64, length: u32) -> IvSge {
        IvSge {
            addr: self.addr + off,
            length,
            lkey: self.lkey,
        }
    }

    fn at(&self, off: u64) -> u64 {
        self.addr + off
    }
}

/// `len` bytes that differ from the bytes of another `seed`.
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 131 + seed * 17 + 7) % 251) as u8 + 1)
        .collect()
}

// ---- completions --------------------------------------------------------

/// An expected completion. `None` fields are not checked (the IBTA leaves
/// them undefined: the opcode and length of an error completion, the length
/// of a SEND or WRITE completion).
#[derive(Clone, Copy, Debug)]
struct W {
    wr_id: u64,
    status: u32,
    opcode: Option<u32>,
    byte_len: Option<u32>,
    qpn: u32,
    flags: Option<u32>,
    imm_or_inv: Option<u32>,
    src_qp: Option<u32>,
}

/// A successful send-side completion.
fn sent(wr_id: u64, opcode: u32, qpn: u32) -> W {
    W {
        wr_id,
        status: IV_WC_SUCCESS,
        opcode: Some(opcode),
        byte_len: None,
        qpn,
        flags: Some(0),
        imm_or_inv: None,
        src_qp: None,
    }
}

/// A successful receive of `byte_len` bytes.
fn recvd(wr_id: u64, byte_len: u32, qpn: u32) -> W {
    W {
        opcode: Some(IV_WC_OP_RECV),
        byte_len: Some(byte_len),
        ..sent(wr_id, IV_WC_OP_RECV, qpn)
    }
}

/// A completion in error.
fn failed(wr_id: u64, status: u32, qpn: u32) -> W {
    W {
        wr_id,
        status,
        opcode: None,
        byte_len: None,
        qpn,
        flags: None,
        imm_or_inv: None,
        src_qp: None,
    }
}

impl W {
    fn len(self, n: u32) -> Self {
        Self {
            byte_len: Some(n),
            ..self
        }
    }

    fn op(self, opcode: u32) -> Self {
        Self {
            opcode: Some(opcode),
            ..self
        }
    }

    fn imm(self, imm: u32) -> Self {
        Self {
            flags: Some(self.flags.unwrap_or(0) | IV_WC_WITH_IMM),
            imm_or_inv: Some(imm),
            ..self
        }
    }

    fn inv(self, rkey: u32) -> Self {
        Self {
            flags: Some(self.flags.unwrap_or(0) | IV_WC_WITH_INV),
            imm_or_inv: Some(rkey),
            ..self
        }
    }

    fn grh(self, src_qp: u32) -> Self {
        Self {
            flags: Some(self.flags.unwrap_or(0) | IV_WC_GRH),
            src_qp: Some(src_qp),
            ..self
        }
    }
}

fn show(cqes: &[IvCqe]) -> String {
    let all: Vec<String> = cqes.iter().map(|c| format!("[{}]", Wc::new(c))).collect();
    if all.is_empty() {
        "none".into()
    } else {
        all.join(" ")
    }
}

fn check_wc(what: &str, got: &IvCqe, w: &W) -> Result<(), String> {
    let mut bad = Vec::new();
    if got.wr_id != w.wr_id {
        bad.push(format!("wr_id {:#x} (want {:#x})", got.wr_id, w.wr_id));
    }
    if got.status != w.status {
        bad.push(format!(
            "status {} (want {})",
            wc_status_name(got.status),
            wc_status_name(w.status)
        ));
    }
    if got.qp_num != w.qpn {
        bad.push(format!("qp_num {:#x} (want {:#x})", got.qp_num, w.qpn));
    }
    if let Some(op) = w.opcode.filter(|op| got.opcode != *op) {
        bad.push(format!("opcode {} (want {op})", got.opcode));
    }
    if let Some(n) = w.byte_len.filter(|n| got.byte_len != *n) {
        bad.push(format!("byte_len {} (want {n})", got.byte_len));
    }
    if let Some(f) = w.flags.filter(|f| got.wc_flags != *f) {
        bad.push(format!("wc_flags {:#x} (want {f:#x})", got.wc_flags));
    }
    if let Some(v) = w.imm_or_inv.filter(|v| got.imm_or_inv != *v) {
        bad.push(format!("imm_or_inv {:#x} (want {v:#x})", got.imm_or_inv));
    }
    if let Some(q) = w.src_qp.filter(|q| got.src_qp != *q) {
        bad.push(format!("src_qp {:#x} (want {q:#x})", got.src_qp));
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{what}: completion [{}]: {}",
            Wc::new(got),
            bad.join(", ")
        ))
    }
}

fn check_wcs(what: &str, got: &[IvCqe], want: &[W]) -> Result<(), String> {
    check!(
        got.len() == want.len(),
        "{what}: {} completions ({}), want {}",
        got.len(),
        show(got),
        want.len()
    );
    for (g, w) in got.iter().zip(want) {
        check_wc(what, g, w)?;
    }
    Ok(())
}

/// Polls `cq` until it has given exactly `n` completions (more already
/// there are an error), or fails after [`DEADLINE`].
fn cqes(cq: &Cq<'_>, n: usize, what: &str) -> Result<Vec<IvCqe>, String> {
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    let mut buf = [IvCqe::default(); 16];
    let mut poll = |got: &mut Vec<IvCqe>| -> Result<usize, String> {
        let k = cq
            .poll(&mut buf)
            .map_err(|_| format!("{what}: the CQ's producer index is impossible"))?;
        got.extend_from_slice(&buf[..k]);
        Ok(k)
    };
    while got.len() < n {
        if poll(&mut got)? == 0 {
            check!(
                Instant::now() < deadline,
                "{what}: {} of {n} completions after {DEADLINE:?}: {}",
                got.len(),
                show(&got)
            );
            std::thread::yield_now();
        }
    }
    poll(&mut got)?;
    check!(
        got.len() == n,
        "{what}: {} completions, want {n}: {}",
        got.len(),
        show(&got)
    );
    Ok(got)
}

/// Waits for one completion on `cq` and checks it.
fn one(cq: &Cq<'_>, what: &str, want: W) -> Result<IvCqe, String> {
    let c = cqes(cq, 1, what)?;
    check_wc(what, &c[0], &want)?;
    Ok(c[0])
}

/// Checks that `cq` gives no completion for a while.
fn quiet(cq: &Cq<'_>, what: &str) -> Result<(), String> {
    let until = Instant::now() + QUIET;
    let mut buf = [IvCqe::default(); 4];
    while Instant::now() < until {
        let k = cq
            .poll(&mut buf)
            .map_err(|_| format!("{what}: the CQ's producer index is impossible"))?;
        check!(k == 0, "{what}: unexpected completion {}", show(&buf[..k]));
        std::thread::yield_now();
    }
    Ok(())
}

// ---- events and states --------------------------------------------------

fn event_name(t: u32) -> &'static str {
    match t {
        IV_EVENT_CQ_ERR => "CQ_ERR",
        IV_EVENT_QP_FATAL => "QP_FATAL",
        IV_EVENT_QP_REQ_ERR => "QP_REQ_ERR",
        IV_EVENT_QP_ACCESS_ERR => "QP_ACCESS_ERR",
        IV_EVENT_COMM_EST => "COMM_EST",
        IV_EVENT_SQ_DRAINED => "SQ_DRAINED",
        IV_EVENT_PATH_MIG => "PATH_MIG",
        IV_EVENT_PATH_MIG_ERR => "PATH_MIG_ERR",
        IV_EVENT_SRQ_ERR => "SRQ_ERR",
        IV_EVENT_SRQ_LIMIT_REACHED => "SRQ_LIMIT_REACHED",
        IV_EVENT_QP_LAST_WQE_REACHED => "QP_LAST_WQE_REACHED",
        _ => "other",
    }
}

/// The next async event must be `event_type` on `handle` (with the user
/// context the tests give objects of its kind); acknowledges it.
fn event(c: &Client, event_type: u32, handle: IvHandle, what: &str) -> Result<(), String> {
    let ev = ok(&format!("{what}: GET_ASYNC_EVENT"), c.get_async_event())?;
    check!(
        ev.event_type == event_type && ev.handle == handle,
        "{what}: async event {} on {:#x}, want {} on {:#x}",
        event_name(ev.event_type),
        ev.handle,
        event_name(event_type),
        handle
    );
    let context = match event_type {
        IV_EVENT_CQ_ERR => CQ_CONTEXT,
        IV_EVENT_SRQ_ERR | IV_EVENT_SRQ_LIMIT_REACHED => SRQ_CONTEXT,
        _ => QP_CONTEXT,
    };
    check!(
        ev.user_context == context,
        "{what}: {} event with user context {:#x}, want {context:#x}",
        event_name(event_type),
        ev.user_context
    );
    ok(
        &format!("{what}: ACK_ASYNC_EVENT"),
        c.ack_async_event(handle, event_type),
    )
}

fn state_name(s: u32) -> &'static str {
    match s {
        IV_QPS_RESET => "RESET",
        IV_QPS_INIT => "INIT",
        IV_QPS_RTR => "RTR",
        IV_QPS_RTS => "RTS",
        IV_QPS_SQD => "SQD",
        IV_QPS_SQE => "SQE",
        IV_QPS_ERR => "ERR",
        _ => "?",
    }
}

/// `QUERY_QP` must report `want`.
fn state(qp: &Qp<'_>, want: u32, what: &str) -> Result<(), String> {
    let got = ok(&format!("{what}: QUERY_QP"), qp.query())?.attr.qp_state;
    check!(
        got == want,
        "{what}: QP {:#x} is in {}, want {}",
        qp.qpn(),
        state_name(got),
        state_name(want)
    );
    Ok(())
}

fn post(qp: &Qp<'_>, wr: &SendWr<'_>, what: &str) -> Result<(), String> {
    qp.post_send(wr)
        .map_err(|e| format!("{what}: post_send: {e:?}"))
}

fn recv(qp: &Qp<'_>, wr_id: u64, sges: &[IvSge], what: &str) -> Result<(), String> {
    qp.post_recv(wr_id, sges)
        .map_err(|e| format!("{what}: post_recv: {e:?}"))
}

/// A signaled work request.
fn wr(wr_id: u64, opcode: u8) -> SendWr<'static> {
    SendWr {
        wr_id,
        opcode,
        flags: IV_SEND_SIGNALED,
        ..SendWr::default()
    }
}

// ---- objects ------------------------------------------------------------

/// How a pair of QPs is connected.
#[derive(Clone, Copy, Debug)]
struct Conn {
    /// The QP's remote access flags (RC, UC).
    access: u32,
    /// RNR retries (7: forever).
    rnr_retry: u8,
    /// Incoming RDMA READs and atomics the QP takes at once.
    max_dest_rd_atomic: u8,
    /// Local ACK timeout (4.096 us x 2^timeout) and transport retries (RC).
    timeout: u8,
    retry_cnt: u8,
    /// The RNR timer the responder asks for (IBTA's 5-bit code).
    min_rnr_timer: u8,
}

impl Default for Conn {
    fn default() -> Self {
        Self {
            access: IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC,
            rnr_retry: 7,
            max_dest_rd_atomic: 4,
            timeout: 14,
            retry_cnt: 7,
            min_rnr_timer: 12,
        }
    }
}

/// One open of the device with the speed path, a PD, the port's GID.
struct Env {
    c: Client,
    pd: IvHandle,
    gid: [u8; 16],
}

/// Two connected QPs and their CQs (dropped in this order).
struct Pair<'c> {
    a: Qp<'c>,
    b: Qp<'c>,
    cqa: Cq<'c>,
    cqb: Cq<'c>,
}

fn destroy_qp(q: Qp<'_>, what: &str) -> Result<(), String> {
    let qpn = q.qpn();
    q.destroy().map_err(|(_, st)| {
        format!(
            "{what}: destroy QP {qpn:#x}: {} (an unacknowledged async event?)",
            status_name(st)
        )
    })
}

fn destroy_cq(q: Cq<'_>, what: &str) -> Result<(), String> {
    q.destroy()
        .map_err(|(_, st)| format!("{what}: destroy CQ: {}", status_name(st)))
}

impl Pair<'_> {
    /// Destroys both QPs, then both CQs: none may be busy.
    fn close(self, what: &str) -> Result<(), String> {
        let Pair { a, b, cqa, cqb } = self;
        destroy_qp(a, what)?;
        destroy_qp(b, what)?;
        destroy_cq(cqa, what)?;
        destroy_cq(cqb, what)
    }
}

impl Env {
    fn open(d: &dyn Dut) -> Result<Self, String> {
        let c = d
            .open_speed()
            .map_err(|s| format!("open with the speed path: {}", status_name(s)))?;
        let pd = ok("alloc_pd", c.alloc_pd())?.pd;
        let gid = ok("query_gid", c.query_gid(1, 0))?;
        Ok(Self { c, pd, gid })
    }

    fn reg(&self, mem: &Mem, access: u32) -> Result<Mr, String> {
        self.reg_in(self.pd, mem, access)
    }

    fn reg_in(&self, pd: IvHandle, mem: &Mem, access: u32) -> Result<Mr, String> {
        let out = ok("reg_mr", self.c.reg_mr(pd, mem.addr(), mem.len(), access))?;
        Ok(Mr {
            handle: out.mr,
            lkey: out.lkey,
            rkey: out.rkey,
            addr: mem.addr(),
            len: mem.len(),
        })
    }

    fn cq(&self, cqe: u32) -> Result<Cq<'_>, String> {
        ok(
            "create CQ",
            self.c.new_cq(&IvCreateCqIn {
                cqe,
                comp_vector: 0,
                channel: 0,
                user_context: CQ_CONTEXT,
            }),
        )
    }

    fn qp(
        &self,
        qp_type: u32,
        send_cq: &Cq<'_>,
        recv_cq: &Cq<'_>,
        srq: Option<&Srq<'_>>,
    ) -> Result<Qp<'_>, String> {
        let (max_recv_wr, max_recv_sge) = if srq.is_some() { (0, 0) } else { (32, 4) };
        ok(
            "create QP",
            self.c.new_qp(&IvCreateQpIn {
                pd: self.pd,
                send_cq: send_cq.handle(),
                recv_cq: recv_cq.handle(),
                srq: srq.map_or(0, Srq::handle),
                user_context: QP_CONTEXT,
                qp_type,
                sq_sig_all: 0,
                cap: IvQpCap {
                    max_send_wr: 32,
                    max_recv_wr,
                    max_send_sge: 4,
                    max_recv_sge,
                    max_inline_data: 64,
                    reserved: 0,
                },
            }),
        )
    }

    /// Walks `qp` to RTS against `dest_qpn` (ignored for UD).
    fn connect(&self, qp: &Qp<'_>, dest_qpn: u32, conn: Conn) -> Result<(), String> {
        for (mask, mut attr) in rts_steps(qp.qp_type(), dest_qpn, self.gid) {
            match attr.qp_state {
                IV_QPS_INIT if qp.qp_type() != IV_QPT_UD => attr.qp_access_flags = conn.access,
                IV_QPS_RTR => {
                    attr.max_dest_rd_atomic = conn.max_dest_rd_atomic;
                    attr.min_rnr_timer = conn.min_rnr_timer;
                }
                IV_QPS_RTS => {
                    attr.rnr_retry = conn.rnr_retry;
                    attr.timeout = conn.timeout;
                    attr.retry_cnt = conn.retry_cnt;
                }
                _ => {}
            }
            ok(
                &format!("modify QP {:#x} to {}", qp.qpn(), state_name(attr.qp_state)),
                qp.modify(mask, &attr),
            )?;
        }
        Ok(())
    }

    /// Two QPs of `qp_type` on the given CQs, connected to each other
    /// (loopback): `conn` for both.
    fn qps<'c>(
        &'c self,
        qp_type: u32,
        cqa: &Cq<'_>,
        cqb: &Cq<'_>,
        conn: Conn,
    ) -> Result<(Qp<'c>, Qp<'c>), String> {
        let a = self.qp(qp_type, cqa, cqa, None)?;
        let b = self.qp(qp_type, cqb, cqb, None)?;
        self.connect(&a, b.qpn(), conn)?;
        self.connect(&b, a.qpn(), conn)?;
        Ok((a, b))
    }

    /// A connected pair, each QP with its own CQ.
    fn pair(&self, qp_type: u32, conn: Conn) -> Result<Pair<'_>, String> {
        let cqa = self.cq(64)?;
        let cqb = self.cq(64)?;
        let (a, b) = self.qps(qp_type, &cqa, &cqb, conn)?;
        Ok(Pair { a, b, cqa, cqb })
    }

    fn doorbells(&self) -> Result<&dyn irpverbs_verbs::Doorbells, String> {
        self.c
            .doorbells()
            .ok_or_else(|| "the client has no speed path".to_owned())
    }

    /// Writes raw bytes as the next send WQE of `qp` (what a buggy or
    /// hostile ULP can do to its mapped ring), publishes it and rings the
    /// doorbell.
    fn post_raw_send(&self, qp: &Qp<'_>, wqe: &IvSendWqe) -> Result<(), String> {
        let ring = qp.rings().sq().ring();
        let p = ring.producer();
        let i = p.next_free().ok_or("send queue full")?;
        ring.region()
            .write(ring.slot_offset(i), wqe.as_bytes())
            .map_err(|_| "the WQE does not fit its slot")?;
        p.publish(i.wrapping_add(1));
        self.doorbells()?.sq(qp.rings().sq_bell());
        Ok(())
    }

    /// The same for a receive WQE.
    fn post_raw_recv(&self, qp: &Qp<'_>, wqe: &IvRecvWqe) -> Result<(), String> {
        let ring = qp.rings().rq().ok_or("no receive queue")?.ring();
        let p = ring.producer();
        let i = p.next_free().ok_or("receive queue full")?;
        ring.region()
            .write(ring.slot_offset(i), wqe.as_bytes())
            .map_err(|_| "the WQE does not fit its slot")?;
        p.publish(i.wrapping_add(1));
        self.doorbells()?.rq(qp.rings().rq_bell());
        Ok(())
    }
}

/// `IOCTL_IV_CQ_NOTIFY`: its status and, on success, the event.
fn cq_notify(c: &Client, cq: IvHandle, arm: u32) -> (NtStatus, Option<IvCqEventOut>) {
    let (st, out) = c.raw(
        IOCTL_IV_CQ_NOTIFY,
        IvCqNotifyIn {
            cq,
            arm,
            reserved: 0,
        }
        .as_bytes(),
        size_of::<IvCqEventOut>(),
    );
    (st, IvCqEventOut::read_from_bytes(&out).ok())
}

// ---- success paths ------------------------------------------------------

const BUF: usize = 64 * 1024;

pub(crate) fn dp_rc_send_recv_sgl(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    // 3501 bytes (four packets at MTU 1024) gathered from three pieces,
    // scattered into three others.
    let data = pattern(3501, 1);
    ma.write(0, &data[..3000]);
    ma.write(4000, &data[3000..3500]);
    ma.write(6000, &data[3500..]);
    recv(
        &p.b,
        0xB1,
        &[
            rb.sge(10_000, 10),
            rb.sge(11_000, 2000),
            rb.sge(14_000, 2000),
        ],
        "recv",
    )?;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 3000), ra.sge(4000, 500), ra.sge(6000, 1)],
            ..wr(0xA1, IV_WR_SEND)
        },
        "send",
    )?;
    one(&p.cqa, "SEND", sent(0xA1, IV_WC_OP_SEND, p.a.qpn()))?;
    one(&p.cqb, "RECV", recvd(0xB1, 3501, p.b.qpn()))?;
    check!(mb.read(10_000, 10) == data[..10], "first scatter piece");
    check!(
        mb.read(11_000, 2000) == data[10..2010],
        "second scatter piece"
    );
    check!(mb.read(14_000, 1491) == data[2010..], "third scatter piece");
    check!(
        mb.read(14_000 + 1491, 509) == [0; 509],
        "bytes past the message were written"
    );
    check!(
        mb.read(10_010, 990) == [0; 990],
        "bytes between pieces written"
    );
    // A message that fills its receive buffer exactly.
    recv(&p.b, 0xB2, &[rb.sge(20_000, 64)], "recv")?;
    ma.write(100, &pattern(64, 2));
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(100, 64)],
            ..wr(0xA2, IV_WR_SEND)
        },
        "send",
    )?;
    one(&p.cqa, "SEND", sent(0xA2, IV_WC_OP_SEND, p.a.qpn()))?;
    one(&p.cqb, "RECV", recvd(0xB2, 64, p.b.qpn()))?;
    check!(mb.read(20_000, 64) == pattern(64, 2), "exact-fit data");
    state(&p.a, IV_QPS_RTS, "after sends")?;
    state(&p.b, IV_QPS_RTS, "after receives")?;
    p.close("teardown")
}

pub(crate) fn dp_rc_send_with_imm_and_unsignaled(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    ma.write(0, &pattern(100, 3));
    recv(&p.b, 1, &[rb.sge(0, 4096)], "recv")?;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 100)],
            imm_or_inv: 0xDEAD_BEEF,
            ..wr(10, IV_WR_SEND_WITH_IMM)
        },
        "send with imm",
    )?;
    one(&p.cqa, "SEND with imm", sent(10, IV_WC_OP_SEND, p.a.qpn()))?;
    one(
        &p.cqb,
        "RECV with imm",
        recvd(1, 100, p.b.qpn()).imm(0xDEAD_BEEF),
    )?;
    check!(mb.read(0, 100) == pattern(100, 3), "data");
    // An unsignaled SEND: the receiver completes, the sender does not; the
    // next signaled one completes alone.
    recv(&p.b, 2, &[rb.sge(200, 16)], "recv")?;
    recv(&p.b, 3, &[rb.sge(300, 16)], "recv")?;
    post(
        &p.a,
        &SendWr {
            wr_id: 11,
            opcode: IV_WR_SEND,
            flags: 0,
            sges: &[ra.sge(0, 16)],
            ..SendWr::default()
        },
        "unsignaled send",
    )?;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(16, 16)],
            ..wr(12, IV_WR_SEND)
        },
        "signaled send",
    )?;
    let r = cqes(&p.cqb, 2, "two receives")?;
    check_wcs(
        "two receives",
        &r,
        &[recvd(2, 16, p.b.qpn()), recvd(3, 16, p.b.qpn())],
    )?;
    one(
        &p.cqa,
        "only the signaled SEND",
        sent(12, IV_WC_OP_SEND, p.a.qpn()),
    )?;
    check!(mb.read(200, 16) == ma.read(0, 16), "unsignaled data");
    check!(mb.read(300, 16) == ma.read(16, 16), "signaled data");
    quiet(&p.cqa, "no completion for the unsignaled SEND")?;
    p.close("teardown")
}

/// A type 2 memory window bound by the responder QP's `IV_WR_BIND_MW`:
/// an RDMA WRITE through its rkey lands, a SEND with invalidate of it
/// completes with the key, and the rkey then grants nothing (REM_ACCESS_ERR,
/// both QPs in ERR, the responder's access error event). Its MR is busy
/// while it is bound.
pub(crate) fn dp_rc_send_with_invalidate(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb, victim) = (Mem::new(BUF), Mem::new(BUF), Mem::new(4096));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let rv = e.reg(&victim, IV_ACCESS_ALL)?;
    let mw = ok("alloc_mw", e.c.alloc_mw(e.pd, IV_MW_TYPE_2))?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    let rkey = next_rkey(mw.rkey);
    post(
        &p.b,
        &bind_mw_wr(5, rkey, rv.lkey, rv.at(0), 4096, IV_ACCESS_REMOTE_WRITE),
        "bind",
    )?;
    one(&p.cqb, "BIND_MW", sent(5, IV_WC_OP_BIND_MW, p.b.qpn()))?;
    expect(
        "dereg an MR with a bound window",
        e.c.dereg_mr(rv.handle),
        STATUS_DEVICE_BUSY,
    )?;
    // The window's rkey works.
    ma.write(0, b"live");
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 4)],
            remote_addr: rv.at(0),
            rkey,
            ..wr(1, IV_WR_RDMA_WRITE)
        },
        "write",
    )?;
    one(&p.cqa, "WRITE", sent(1, IV_WC_OP_RDMA_WRITE, p.a.qpn()))?;
    check!(victim.read(0, 4) == b"live", "write before invalidate");
    // SEND with invalidate.
    recv(&p.b, 3, &[rb.sge(0, 64)], "recv")?;
    ma.write(8, b"inv!");
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(8, 4)],
            imm_or_inv: rkey,
            ..wr(2, IV_WR_SEND_WITH_INV)
        },
        "send with invalidate",
    )?;
    one(&p.cqa, "SEND with inv", sent(2, IV_WC_OP_SEND, p.a.qpn()))?;
    one(&p.cqb, "RECV with inv", recvd(3, 4, p.b.qpn()).inv(rkey))?;
    check!(mb.read(0, 4) == b"inv!", "data");
    // The invalidated rkey no longer works: REM_ACCESS_ERR, both QPs in
    // ERR, the responder's access error event.
    ma.write(16, b"dead");
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(16, 4)],
            remote_addr: rv.at(0),
            rkey,
            ..wr(4, IV_WR_RDMA_WRITE)
        },
        "write after invalidate",
    )?;
    one(
        &p.cqa,
        "WRITE to the invalidated rkey",
        failed(4, IV_WC_REM_ACCESS_ERR, p.a.qpn()),
    )?;
    check!(victim.read(0, 4) == b"live", "written after invalidation");
    state(&p.a, IV_QPS_ERR, "requester")?;
    state(&p.b, IV_QPS_ERR, "responder")?;
    event(&e.c, IV_EVENT_QP_ACCESS_ERR, p.b.handle(), "responder")?;
    p.close("teardown")?;
    // Unbound: the MR goes.
    ok("dereg the window's MR", e.c.dereg_mr(rv.handle))?;
    ok("dealloc_mw", e.c.dealloc_mw(mw.mw))
}

/// A SEND with invalidate of an MR's rkey is refused (REM_INV_REQ_ERR at
/// both ends) and the MR keeps its keys: an RDMA WRITE on a new
/// connection still lands.
pub(crate) fn dp_rc_send_with_invalidate_of_an_mr(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb, victim) = (Mem::new(BUF), Mem::new(BUF), Mem::new(4096));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let rv = e.reg(&victim, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE)?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    recv(&p.b, 3, &[rb.sge(0, 64)], "recv")?;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(8, 4)],
            imm_or_inv: rv.rkey,
            ..wr(2, IV_WR_SEND_WITH_INV)
        },
        "send with invalidate",
    )?;
    one(
        &p.cqa,
        "SEND with inv",
        failed(2, IV_WC_REM_INV_REQ_ERR, p.a.qpn()),
    )?;
    one(&p.cqb, "RECV", failed(3, IV_WC_REM_INV_REQ_ERR, p.b.qpn()))?;
    event(&e.c, IV_EVENT_QP_REQ_ERR, p.b.handle(), "responder")?;
    p.close("teardown")?;
    let q = e.pair(IV_QPT_RC, Conn::default())?;
    ma.write(0, b"survives");
    post(
        &q.a,
        &SendWr {
            sges: &[ra.sge(0, 8)],
            remote_addr: rv.at(0),
            rkey: rv.rkey,
            ..wr(1, IV_WR_RDMA_WRITE)
        },
        "write",
    )?;
    one(&q.cqa, "WRITE", sent(1, IV_WC_OP_RDMA_WRITE, q.a.qpn()))?;
    check!(
        victim.read(0, 8) == b"survives",
        "the MR still takes a WRITE"
    );
    q.close("teardown")?;
    ok("dereg", e.c.dereg_mr(rv.handle))
}

/// A type 1 memory window bound by `IOCTL_IV_BIND_MW`: RDMA WRITE and
/// READ inside it succeed; one byte past it, the WRITE fails with
/// REM_ACCESS_ERR; its MR is busy while it is bound; bad binds get their
/// statuses.
pub(crate) fn dp_rc_memory_window_type_1(d: &dyn Dut) -> Result<(), String> {
    let (ma, mw_mem) = (Mem::new(BUF), Mem::new(8192));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rm = e.reg(&mw_mem, IV_ACCESS_ALL)?;
    let plain = e.reg(&mw_mem, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_READ)?;
    let mw = ok("alloc_mw", e.c.alloc_mw(e.pd, IV_MW_TYPE_1))?;
    expect(
        "bind to an MR without MW_BIND",
        e.c.bind_mw(mw.mw, plain.handle, plain.at(0), 8, IV_ACCESS_REMOTE_READ),
        STATUS_ACCESS_DENIED,
    )?;
    expect(
        "bind past the MR",
        e.c.bind_mw(mw.mw, rm.handle, rm.at(8190), 8, IV_ACCESS_REMOTE_READ),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "bind with local access",
        e.c.bind_mw(mw.mw, rm.handle, rm.at(0), 8, IV_ACCESS_LOCAL_WRITE),
        STATUS_INVALID_PARAMETER,
    )?;
    let rkey = ok(
        "bind",
        e.c.bind_mw(
            mw.mw,
            rm.handle,
            rm.at(4096),
            64,
            IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ,
        ),
    )?;
    check!(rkey != mw.rkey, "a bind gives a new rkey");
    expect(
        "dereg a bound MR",
        e.c.dereg_mr(rm.handle),
        STATUS_DEVICE_BUSY,
    )?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    ma.write(0, b"window 1");
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 8)],
            remote_addr: rm.at(4096 + 56),
            rkey,
            ..wr(1, IV_WR_RDMA_WRITE)
        },
        "write",
    )?;
    one(&p.cqa, "WRITE", sent(1, IV_WC_OP_RDMA_WRITE, p.a.qpn()))?;
    check!(mw_mem.read(4096 + 56, 8) == b"window 1", "written");
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(64, 8)],
            remote_addr: rm.at(4096 + 56),
            rkey,
            ..wr(2, IV_WR_RDMA_READ)
        },
        "read",
    )?;
    one(&p.cqa, "READ", sent(2, IV_WC_OP_RDMA_READ, p.a.qpn()))?;
    check!(ma.read(64, 8) == b"window 1", "read back");
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 8)],
            remote_addr: rm.at(4096 + 57),
            rkey,
            ..wr(3, IV_WR_RDMA_WRITE)
        },
        "write past the window",
    )?;
    one(
        &p.cqa,
        "WRITE past the window",
        failed(3, IV_WC_REM_ACCESS_ERR, p.a.qpn()),
    )?;
    state(&p.b, IV_QPS_ERR, "responder")?;
    event(&e.c, IV_EVENT_QP_ACCESS_ERR, p.b.handle(), "responder")?;
    p.close("teardown")?;
    ok("unbind", e.c.bind_mw(mw.mw, rm.handle, rm.at(0), 0, 0))?;
    ok("dereg", e.c.dereg_mr(rm.handle))?;
    ok("dealloc_mw", e.c.dealloc_mw(mw.mw))?;
    ok("dereg", e.c.dereg_mr(plain.handle))
}

pub(crate) fn dp_rc_rdma_write_and_write_with_imm(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(
        &mb,
        IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ,
    )?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    // WRITE gathered from two pieces: no receive consumed.
    let data = pattern(3000, 4);
    ma.write(1000, &data[..1000]);
    ma.write(8000, &data[1000..]);
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(1000, 1000), ra.sge(8000, 2000)],
            remote_addr: rb.at(5000),
            rkey: rb.rkey,
            ..wr(11, IV_WR_RDMA_WRITE)
        },
        "write",
    )?;
    one(&p.cqa, "WRITE", sent(11, IV_WC_OP_RDMA_WRITE, p.a.qpn()))?;
    check!(mb.read(5000, 3000) == data, "written data");
    check!(
        mb.read(4992, 8) == [0; 8] && mb.read(8000, 8) == [0; 8],
        "bytes around the write"
    );
    // WRITE with immediate: consumes a receive (its buffer untouched).
    recv(&p.b, 2, &[rb.sge(0, 16)], "recv")?;
    ma.write(9000, b"0123456789");
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(9000, 10)],
            remote_addr: rb.at(9100),
            rkey: rb.rkey,
            imm_or_inv: 77,
            ..wr(12, IV_WR_RDMA_WRITE_WITH_IMM)
        },
        "write with imm",
    )?;
    one(
        &p.cqa,
        "WRITE with imm",
        sent(12, IV_WC_OP_RDMA_WRITE, p.a.qpn()),
    )?;
    one(
        &p.cqb,
        "the receive WRITE with imm consumed (and no completion for the plain WRITE)",
        recvd(2, 10, p.b.qpn())
            .op(IV_WC_OP_RECV_RDMA_WITH_IMM)
            .imm(77),
    )?;
    check!(mb.read(9100, 10) == b"0123456789", "written data");
    check!(mb.read(0, 16) == [0; 16], "the receive buffer was written");
    // A zero-length WRITE with immediate.
    recv(&p.b, 3, &[rb.sge(0, 16)], "recv")?;
    post(
        &p.a,
        &SendWr {
            remote_addr: rb.at(0),
            rkey: rb.rkey,
            imm_or_inv: 78,
            ..wr(13, IV_WR_RDMA_WRITE_WITH_IMM)
        },
        "zero-length write with imm",
    )?;
    one(
        &p.cqa,
        "zero-length WRITE with imm",
        sent(13, IV_WC_OP_RDMA_WRITE, p.a.qpn()),
    )?;
    one(
        &p.cqb,
        "zero-length WRITE with imm",
        recvd(3, 0, p.b.qpn())
            .op(IV_WC_OP_RECV_RDMA_WITH_IMM)
            .imm(78),
    )?;
    p.close("teardown")
}

pub(crate) fn dp_rc_rdma_read(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_READ)?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    let data = pattern(5000, 5);
    mb.write(20_000, &data);
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(10_000, 1000), ra.sge(20_000, 4000)],
            remote_addr: rb.at(20_000),
            rkey: rb.rkey,
            ..wr(13, IV_WR_RDMA_READ)
        },
        "read",
    )?;
    one(
        &p.cqa,
        "READ",
        sent(13, IV_WC_OP_RDMA_READ, p.a.qpn()).len(5000),
    )?;
    check!(ma.read(10_000, 1000) == data[..1000], "first piece read");
    check!(ma.read(20_000, 4000) == data[1000..], "second piece read");
    check!(ma.read(11_000, 8) == [0; 8], "past the first piece");
    // A small one, and several outstanding at once.
    for i in 0..4u64 {
        post(
            &p.a,
            &SendWr {
                sges: &[ra.sge(40_000 + i * 100, 8)],
                remote_addr: rb.at(20_000 + i * 8),
                rkey: rb.rkey,
                ..wr(20 + i, IV_WR_RDMA_READ)
            },
            "read",
        )?;
    }
    let got = cqes(&p.cqa, 4, "four READs")?;
    let want: Vec<W> = (0..4)
        .map(|i| sent(20 + i, IV_WC_OP_RDMA_READ, p.a.qpn()).len(8))
        .collect();
    check_wcs("four READs", &got, &want)?;
    for i in 0..4 {
        check!(
            ma.read(40_000 + i * 100, 8) == data[i * 8..i * 8 + 8],
            "READ {i}"
        );
    }
    quiet(&p.cqb, "a READ completes nothing at the responder")?;
    p.close("teardown")
}

pub(crate) fn dp_rc_atomics(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_ALL)?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    let (target, result) = (40_000usize, 41_000usize);
    mb.set_u64(target, 5);
    mb.set_u64(target + 8, 0x5A5A);
    let atomic = |wr_id, opcode, compare_add, swap| SendWr {
        sges: &[],
        remote_addr: rb.at(target as u64),
        rkey: rb.rkey,
        compare_add,
        swap,
        ..wr(wr_id, opcode)
    };
    let res = [ra.sge(result as u64, 8)];
    let cases: [(u64, u8, u64, u64, u32, u64, u64); 4] = [
        // (wr_id, opcode, compare/add, swap, wc opcode, returned, after)
        (14, IV_WR_ATOMIC_CMP_AND_SWP, 5, 9, IV_WC_OP_COMP_SWAP, 5, 9),
        (
            15,
            IV_WR_ATOMIC_CMP_AND_SWP,
            5,
            11,
            IV_WC_OP_COMP_SWAP,
            9,
            9,
        ),
        (
            16,
            IV_WR_ATOMIC_FETCH_AND_ADD,
            3,
            0,
            IV_WC_OP_FETCH_ADD,
            9,
            12,
        ),
        (
            17,
            IV_WR_ATOMIC_FETCH_AND_ADD,
            u64::MAX,
            0,
            IV_WC_OP_FETCH_ADD,
            12,
            11,
        ),
    ];
    for (wr_id, opcode, compare_add, swap, wc_op, returned, after) in cases {
        ma.set_u64(result, 0xFFFF_FFFF_FFFF_FFFF);
        post(
            &p.a,
            &SendWr {
                sges: &res,
                ..atomic(wr_id, opcode, compare_add, swap)
            },
            "atomic",
        )?;
        one(&p.cqa, "atomic", sent(wr_id, wc_op, p.a.qpn()).len(8))?;
        check!(
            ma.u64_at(result) == returned,
            "wr {wr_id}: returned {:#x}, want the old value {returned:#x}",
            ma.u64_at(result)
        );
        check!(
            mb.u64_at(target) == after,
            "wr {wr_id}: memory {:#x}, want {after:#x}",
            mb.u64_at(target)
        );
    }
    check!(mb.u64_at(target + 8) == 0x5A5A, "the next word changed");
    quiet(&p.cqb, "an atomic completes nothing at the responder")?;
    p.close("teardown")
}

pub(crate) fn dp_inline_data(d: &dyn Dut) -> Result<(), String> {
    let mb = Mem::new(BUF);
    let e = Env::open(d)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE)?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    let max = p.a.cap().max_inline_data;
    check!(max >= 64, "max_inline_data {max}, asked 64");
    // Inline data needs no MR on the sender's side.
    let data = pattern(64, 6);
    recv(&p.b, 1, &[rb.sge(3000, 256)], "recv")?;
    post(
        &p.a,
        &SendWr {
            inline: Some(&data),
            ..wr(2, IV_WR_SEND)
        },
        "inline send",
    )?;
    one(&p.cqa, "inline SEND", sent(2, IV_WC_OP_SEND, p.a.qpn()))?;
    one(&p.cqb, "RECV", recvd(1, 64, p.b.qpn()))?;
    check!(mb.read(3000, 64) == data, "inline data received");
    post(
        &p.a,
        &SendWr {
            inline: Some(b"inline write"),
            remote_addr: rb.at(4000),
            rkey: rb.rkey,
            ..wr(3, IV_WR_RDMA_WRITE)
        },
        "inline write",
    )?;
    one(
        &p.cqa,
        "inline WRITE",
        sent(3, IV_WC_OP_RDMA_WRITE, p.a.qpn()),
    )?;
    check!(mb.read(4000, 12) == b"inline write", "inline data written");
    // Inline SEND with immediate, solicited.
    recv(&p.b, 4, &[rb.sge(5000, 256)], "recv")?;
    post(
        &p.a,
        &SendWr {
            inline: Some(b"x"),
            imm_or_inv: 0x1234_5678,
            flags: IV_SEND_SIGNALED | IV_SEND_SOLICITED,
            ..wr(5, IV_WR_SEND_WITH_IMM)
        },
        "inline send with imm",
    )?;
    one(&p.cqa, "inline SEND imm", sent(5, IV_WC_OP_SEND, p.a.qpn()))?;
    one(&p.cqb, "RECV imm", recvd(4, 1, p.b.qpn()).imm(0x1234_5678))?;
    check!(mb.read(5000, 1) == b"x", "inline data received");
    // More than the QP takes inline: refused by the post itself.
    let long = vec![0u8; max as usize + 1];
    check!(
        p.a.post_send(&SendWr {
            inline: Some(&long),
            ..wr(6, IV_WR_SEND)
        }) == Err(PostError::InlineTooLong),
        "inline data over max_inline_data was posted"
    );
    quiet(&p.cqa, "the refused post")?;
    p.close("teardown")
}

pub(crate) fn dp_ud_send_grh_src_qp(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let p = e.pair(IV_QPT_UD, Conn::default())?;
    let ah = ok("create_ah", e.c.create_ah(e.pd, &irpverbs_verbs::av(e.gid)))?;
    let ud = |qkey| Some((ah.ahn, p.b.qpn(), qkey));
    // GRH in the first 40 bytes of the scatter list, the payload after.
    let data = pattern(1000, 7);
    ma.write(0, &data);
    recv(&p.b, 1, &[rb.sge(0, 40), rb.sge(1000, 2000)], "recv")?;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 1000)],
            ud: ud(QKEY),
            imm_or_inv: 0x0102_0304,
            ..wr(1, IV_WR_SEND_WITH_IMM)
        },
        "UD send",
    )?;
    one(&p.cqa, "UD SEND", sent(1, IV_WC_OP_SEND, p.a.qpn()))?;
    one(
        &p.cqb,
        "UD RECV",
        recvd(1, IV_GRH_LEN + 1000, p.b.qpn())
            .grh(p.a.qpn())
            .imm(0x0102_0304),
    )?;
    check!(mb.read(1000, 1000) == data, "UD payload");
    let grh = mb.read(0, 40);
    let v4 = e.gid[..10] == [0; 10] && e.gid[10..12] == [0xFF, 0xFF];
    if v4 {
        // RoCEv2 over IPv4: the IPv4 header in the GRH's last 20 bytes.
        check!(grh[20] >> 4 == 4, "GRH: IP version {:#x}", grh[20]);
        check!(grh[32..36] == e.gid[12..], "GRH: source address");
        check!(grh[36..40] == e.gid[12..], "GRH: destination address");
    } else {
        check!(grh[0] >> 4 == 6, "GRH: IP version {:#x}", grh[0]);
        check!(grh[8..24] == e.gid, "GRH: source GID");
        check!(grh[24..40] == e.gid, "GRH: destination GID");
    }
    // The wrong Q_Key is dropped: the next receive gets the next datagram.
    recv(&p.b, 2, &[rb.sge(4000, 2048)], "recv")?;
    post(
        &p.a,
        &SendWr {
            inline: Some(b"no"),
            ud: ud(0x1234),
            ..wr(2, IV_WR_SEND)
        },
        "UD send, wrong qkey",
    )?;
    post(
        &p.a,
        &SendWr {
            inline: Some(b"yes"),
            ud: ud(QKEY),
            ..wr(3, IV_WR_SEND)
        },
        "UD send",
    )?;
    let s = cqes(&p.cqa, 2, "UD SENDs")?;
    check_wcs(
        "UD SENDs (the sender never knows)",
        &s,
        &[
            sent(2, IV_WC_OP_SEND, p.a.qpn()),
            sent(3, IV_WC_OP_SEND, p.a.qpn()),
        ],
    )?;
    one(
        &p.cqb,
        "the datagram with the right Q_Key",
        recvd(2, IV_GRH_LEN + 3, p.b.qpn()).grh(p.a.qpn()),
    )?;
    check!(mb.read(4040, 3) == b"yes", "UD payload");
    // Over the path MTU: LOC_LEN_ERR, the QP goes to SQE; SQE -> RTS.
    let port = ok("query_port", e.c.query_port(1))?;
    let mtu = 128u32 << port.active_mtu;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, mtu + 1)],
            ud: ud(QKEY),
            ..wr(4, IV_WR_SEND)
        },
        "UD send over the MTU",
    )?;
    one(
        &p.cqa,
        "UD SEND over the MTU",
        failed(4, IV_WC_LOC_LEN_ERR, p.a.qpn()),
    )?;
    state(&p.a, IV_QPS_SQE, "UD after a send error")?;
    ok(
        "SQE -> RTS",
        p.a.modify(
            IV_QP_STATE,
            &IvQpAttr {
                qp_state: IV_QPS_RTS,
                ..IvQpAttr::default()
            },
        ),
    )?;
    recv(&p.b, 5, &[rb.sge(8000, 2048)], "recv")?;
    post(
        &p.a,
        &SendWr {
            inline: Some(b"again"),
            ud: ud(QKEY),
            ..wr(5, IV_WR_SEND)
        },
        "UD send after SQE",
    )?;
    one(&p.cqa, "UD SEND", sent(5, IV_WC_OP_SEND, p.a.qpn()))?;
    one(
        &p.cqb,
        "UD RECV",
        recvd(5, IV_GRH_LEN + 5, p.b.qpn()).grh(p.a.qpn()),
    )?;
    check!(mb.read(8040, 5) == b"again", "UD payload");
    p.close("teardown")?;
    ok("destroy AH", e.c.destroy_ah(ah.ah))
}

pub(crate) fn dp_uc_send_and_write(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE)?;
    let p = e.pair(
        IV_QPT_UC,
        Conn {
            access: IV_ACCESS_REMOTE_WRITE,
            ..Conn::default()
        },
    )?;
    // A multi-packet SEND.
    let data = pattern(5000, 8);
    ma.write(0, &data);
    recv(&p.b, 1, &[rb.sge(0, 8192)], "recv")?;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 2500), ra.sge(2500, 2500)],
            ..wr(1, IV_WR_SEND)
        },
        "UC send",
    )?;
    one(&p.cqa, "UC SEND", sent(1, IV_WC_OP_SEND, p.a.qpn()))?;
    one(&p.cqb, "UC RECV", recvd(1, 5000, p.b.qpn()))?;
    check!(mb.read(0, 5000) == data, "UC SEND data");
    // WRITE, then WRITE with immediate.
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 5000)],
            remote_addr: rb.at(10_000),
            rkey: rb.rkey,
            ..wr(2, IV_WR_RDMA_WRITE)
        },
        "UC write",
    )?;
    one(&p.cqa, "UC WRITE", sent(2, IV_WC_OP_RDMA_WRITE, p.a.qpn()))?;
    check!(mb.read(10_000, 5000) == data, "UC WRITE data");
    recv(&p.b, 3, &[rb.sge(0, 8)], "recv")?;
    post(
        &p.a,
        &SendWr {
            sges: &[ra.sge(0, 3000)],
            remote_addr: rb.at(20_000),
            rkey: rb.rkey,
            imm_or_inv: 5,
            ..wr(3, IV_WR_RDMA_WRITE_WITH_IMM)
        },
        "UC write with imm",
    )?;
    one(
        &p.cqa,
        "UC WRITE imm",
        sent(3, IV_WC_OP_RDMA_WRITE, p.a.qpn()),
    )?;
    one(
        &p.cqb,
        "UC RECV imm (and none for the plain WRITE)",
        recvd(3, 3000, p.b.qpn())
            .op(IV_WC_OP_RECV_RDMA_WITH_IMM)
            .imm(5),
    )?;
    check!(mb.read(20_000, 3000) == data[..3000], "UC WRITE imm data");
    // What RC would NAK, UC drops and the sender completes: a SEND with no
    // receive posted, a WRITE with a bad rkey. The next receive gets the
    // next message.
    post(
        &p.a,
        &SendWr {
            inline: Some(b"lost"),
            ..wr(4, IV_WR_SEND)
        },
        "UC send, no receive",
    )?;
    post(
        &p.a,
        &SendWr {
            inline: Some(b"lost"),
            remote_addr: rb.at(30_000),
            rkey: rb.rkey ^ 0x00FF_FF00,
            ..wr(5, IV_WR_RDMA_WRITE)
        },
        "UC write, bad rkey",
    )?;
    let s = cqes(&p.cqa, 2, "dropped UC messages")?;
    check_wcs(
        "dropped UC messages",
        &s,
        &[
            sent(4, IV_WC_OP_SEND, p.a.qpn()),
            sent(5, IV_WC_OP_RDMA_WRITE, p.a.qpn()),
        ],
    )?;
    recv(&p.b, 6, &[rb.sge(40_000, 64)], "recv")?;
    post(
        &p.a,
        &SendWr {
            inline: Some(b"fits"),
            ..wr(6, IV_WR_SEND)
        },
        "UC send",
    )?;
    one(&p.cqa, "UC SEND", sent(6, IV_WC_OP_SEND, p.a.qpn()))?;
    one(&p.cqb, "UC RECV", recvd(6, 4, p.b.qpn()))?;
    check!(mb.read(40_000, 4) == b"fits", "UC data");
    check!(mb.read(30_000, 4) == [0; 4], "a bad rkey wrote");
    state(&p.b, IV_QPS_RTS, "UC receiver after drops")?;
    p.close("teardown")
}

pub(crate) fn dp_srq_receive_and_limit_event(d: &dyn Dut) -> Result<(), String> {
    let mb = Mem::new(BUF);
    let e = Env::open(d)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let srq = ok(
        "create SRQ",
        e.c.new_srq(&IvCreateSrqIn {
            pd: e.pd,
            user_context: SRQ_CONTEXT,
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
            reserved: 0,
        }),
    )?;
    let cqa = e.cq(64)?;
    let cqb = e.cq(64)?;
    let conn = Conn::default();
    let a1 = e.qp(IV_QPT_RC, &cqa, &cqa, None)?;
    let a2 = e.qp(IV_QPT_RC, &cqa, &cqa, None)?;
    let b1 = e.qp(IV_QPT_RC, &cqb, &cqb, Some(&srq))?;
    let b2 = e.qp(IV_QPT_RC, &cqb, &cqb, Some(&srq))?;
    check!(
        b1.rings().rq().is_none(),
        "a QP on an SRQ has a receive queue"
    );
    for (a, b) in [(&a1, &b1), (&a2, &b2)] {
        e.connect(a, b.qpn(), conn)?;
        e.connect(b, a.qpn(), conn)?;
    }
    // Two one at a time, three as one list (one doorbell).
    for i in 0..2u64 {
        srq.post_recv(i, &[rb.sge(i * 100, 100)])
            .map_err(|e| format!("post_srq_recv: {e:?}"))?;
    }
    let sges: Vec<[IvSge; 1]> = (2..5u64).map(|i| [rb.sge(i * 100, 100)]).collect();
    let list: Vec<RecvWr<'_>> = (2..5u64)
        .zip(&sges)
        .map(|(wr_id, sges)| RecvWr { wr_id, sges })
        .collect();
    srq.post_recv_list(&list)
        .map_err(|e| format!("post_srq_recv list: {e:?}"))?;
    check!(
        b1.post_recv_list(&list) == Err((0, PostError::Invalid)),
        "a receive list posted to a QP on an SRQ"
    );
    // Armed at 3 with 5 posted: the event when fewer than 3 are left.
    ok("arm the SRQ limit", srq.modify(IV_SRQ_LIMIT, 0, 3))?;
    let (qa, qb) = ([&a1, &a2, &a1], [&b1, &b2, &b1]);
    for n in 0..3usize {
        post(
            qa[n],
            &SendWr {
                inline: Some(&[n as u8 + 1; 5]),
                ..wr(n as u64, IV_WR_SEND)
            },
            "send to an SRQ QP",
        )?;
        one(&cqa, "SEND", sent(n as u64, IV_WC_OP_SEND, qa[n].qpn()))?;
        one(
            &cqb,
            "RECV from the SRQ, in SRQ order, on the receiving QP",
            recvd(n as u64, 5, qb[n].qpn()),
        )?;
        check!(
            mb.read(n * 100, 5) == [n as u8 + 1; 5],
            "data of message {n}"
        );
    }
    event(&e.c, IV_EVENT_SRQ_LIMIT_REACHED, srq.handle(), "SRQ limit")?;
    let q = ok("query SRQ", srq.query())?;
    check!(q.srq_limit == 0, "the limit event did not disarm: {q:?}");
    // A QP on the SRQ moving to ERR: last WQE reached; the SRQ's WQEs stay
    // for the other QP.
    ok(
        "b1 to ERR",
        b1.modify(
            IV_QP_STATE,
            &IvQpAttr {
                qp_state: IV_QPS_ERR,
                ..IvQpAttr::default()
            },
        ),
    )?;
    event(&e.c, IV_EVENT_QP_LAST_WQE_REACHED, b1.handle(), "b1 in ERR")?;
    quiet(&cqb, "nothing flushed from the SRQ")?;
    for n in 3..5u64 {
        post(
            &a2,
            &SendWr {
                inline: Some(b"late"),
                ..wr(n, IV_WR_SEND)
            },
            "send",
        )?;
        one(&cqa, "SEND", sent(n, IV_WC_OP_SEND, a2.qpn()))?;
        one(&cqb, "RECV", recvd(n, 4, b2.qpn()))?;
        check!(mb.read(n as usize * 100, 4) == b"late", "data");
    }
    for q in [a1, a2, b1, b2] {
        destroy_qp(q, "teardown")?;
    }
    srq.destroy()
        .map_err(|(_, st)| format!("destroy SRQ: {}", status_name(st)))?;
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")
}

pub(crate) fn dp_solicited_only_notification(d: &dyn Dut) -> Result<(), String> {
    let mb = Mem::new(BUF);
    let e = Env::open(d)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    for i in 0..3 {
        recv(&p.b, i, &[rb.sge(i * 64, 64)], "recv")?;
    }
    let arm_word = || p.cqb.rings().cq().ring().arm_word().load(Ordering::Acquire);
    // Waits until the driver armed the CQ for a CQ_NOTIFY (the arm word
    // moved on from `before` with the bits `want`).
    let armed = |before: u32, want: u32| -> Result<(), String> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let w = arm_word();
            if w != before && w & (IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED) == want {
                return Ok(());
            }
            check!(
                Instant::now() < deadline,
                "CQ_NOTIFY did not arm the CQ: arm word {w:#x}"
            );
            std::thread::yield_now();
        }
    };
    let cq = p.cqb.handle();
    let c = &e.c;
    let send = |wr_id: u64, flags: u8, data: &'static [u8]| -> Result<(), String> {
        post(
            &p.a,
            &SendWr {
                inline: Some(data),
                flags,
                ..wr(wr_id, IV_WR_SEND)
            },
            "send",
        )?;
        one(&p.cqa, "SEND", sent(wr_id, IV_WC_OP_SEND, p.a.qpn()))?;
        Ok(())
    };
    std::thread::scope(|s| -> Result<(), String> {
        // Solicited only: an unsolicited message does not complete it.
        let (tx, rx) = mpsc::channel();
        let before = arm_word();
        s.spawn(move || tx.send(cq_notify(c, cq, IV_NOTIFY_SOLICITED)));
        armed(before, IV_CQ_ARM_NEXT | IV_CQ_ARM_SOLICITED)?;
        send(10, IV_SEND_SIGNALED, b"plain")?;
        one(&p.cqb, "unsolicited RECV", recvd(0, 5, p.b.qpn()))?;
        if let Ok((st, _)) = rx.recv_timeout(Duration::from_millis(50)) {
            return Err(format!(
                "CQ_NOTIFY(solicited) completed ({}) for an unsolicited message",
                status_name(st)
            ));
        }
        // A solicited one does.
        send(11, IV_SEND_SIGNALED | IV_SEND_SOLICITED, b"urgent")?;
        one(&p.cqb, "solicited RECV", recvd(1, 6, p.b.qpn()))?;
        let (st, out) = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "CQ_NOTIFY(solicited) never completed".to_owned())?;
        check!(
            st == STATUS_SUCCESS,
            "CQ_NOTIFY(solicited): {}",
            status_name(st)
        );
        let out = out.ok_or("CQ_NOTIFY: short output")?;
        check!(
            out.cq == cq && out.user_context == CQ_CONTEXT,
            "CQ_NOTIFY returned {out:?}"
        );
        // Next completion: any message completes it.
        let (tx, rx) = mpsc::channel();
        let before = arm_word();
        s.spawn(move || tx.send(cq_notify(c, cq, IV_NOTIFY_NEXT)));
        armed(before, IV_CQ_ARM_NEXT)?;
        send(12, IV_SEND_SIGNALED, b"plain")?;
        one(&p.cqb, "unsolicited RECV", recvd(2, 5, p.b.qpn()))?;
        let (st, out) = rx
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "CQ_NOTIFY(next) never completed".to_owned())?;
        check!(
            st == STATUS_SUCCESS && out.is_some_and(|o| o.cq == cq),
            "CQ_NOTIFY(next): {} {out:?}",
            status_name(st)
        );
        Ok(())
    })?;
    check!(mb.read(64, 6) == b"urgent", "data");
    p.close("teardown")
}

// ---- completion channels ------------------------------------------------

/// Completion channels as libibverbs defines them: a CQ created on a
/// channel reports an event there only while armed (`req_notify_cq`), one
/// per arming, carrying its user context, in order; `ack_cq_events` takes
/// at least one and no more than were delivered; a CQ with unacknowledged
/// events cannot be destroyed, nor a channel with CQs on it.
pub(crate) fn dp_completion_channel_events(d: &dyn Dut) -> Result<(), String> {
    let mb = Mem::new(BUF);
    let e = Env::open(d)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let ch = ok("create_comp_channel", e.c.create_comp_channel())?;
    let on_channel = |user_context| {
        ok(
            "create CQ on the channel",
            e.c.new_cq(&IvCreateCqIn {
                cqe: 64,
                comp_vector: 0,
                channel: ch.handle(),
                user_context,
            }),
        )
    };
    let (ctx_a, ctx_b) = (CQ_CONTEXT, CQ_CONTEXT + 1);
    let cqa = on_channel(ctx_a)?;
    let cqb = on_channel(ctx_b)?;
    let (a, b) = e.qps(IV_QPT_RC, &cqa, &cqb, Conn::default())?;
    let p = Pair { a, b, cqa, cqb };
    // One message from A to B: a completion on each CQ, both polled.
    let round = |i: u64| -> Result<(), String> {
        recv(&p.b, i, &[rb.sge(i * 64, 64)], "recv")?;
        post(
            &p.a,
            &SendWr {
                inline: Some(b"event"),
                flags: IV_SEND_SIGNALED,
                ..wr(0x100 + i, IV_WR_SEND)
            },
            "send",
        )?;
        one(&p.cqa, "SEND", sent(0x100 + i, IV_WC_OP_SEND, p.a.qpn()))?;
        one(&p.cqb, "RECV", recvd(i, 5, p.b.qpn()))?;
        Ok(())
    };
    let next_event = |what: &str, cq: &Cq<'_>, ctx: u64| -> Result<(), String> {
        let ev = ok(what, ch.get_cq_event())?;
        check!(
            ev.cq == cq.handle() && ev.user_context == ctx,
            "{what}: the event names CQ {:#x} (context {:#x}), want {:#x} ({ctx:#x})",
            ev.cq,
            ev.user_context,
            cq.handle()
        );
        Ok(())
    };
    // Neither CQ armed: completions, no event (one would come first below).
    round(0)?;
    // B armed: one event, B's.
    p.cqb.req_notify(false);
    round(1)?;
    next_event("the armed CQ's event", &p.cqb, ctx_b)?;
    // A armed, B not again: the next event is A's (an arming fires once).
    p.cqa.req_notify(false);
    round(2)?;
    next_event("the newly armed CQ's event", &p.cqa, ctx_a)?;
    p.cqb.req_notify(false);
    round(3)?;
    next_event("the re-armed CQ's event", &p.cqb, ctx_b)?;
    let c = &e.c;
    expect(
        "ack no event",
        c.ack_cq_events(p.cqb.handle(), 0),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "ack more events than were delivered",
        c.ack_cq_events(p.cqb.handle(), 3),
        STATUS_INVALID_PARAMETER,
    )?;
    let Pair { a, b, cqa, cqb } = p;
    destroy_qp(a, "channel teardown")?;
    destroy_qp(b, "channel teardown")?;
    // B has two unacknowledged events: busy until both are acknowledged.
    let cqb = busy("destroy a CQ with unacknowledged events", cqb.destroy())?;
    ok("ack B's two events", c.ack_cq_events(cqb.handle(), 2))?;
    expect(
        "ack an event again",
        c.ack_cq_events(cqb.handle(), 1),
        STATUS_INVALID_PARAMETER,
    )?;
    destroy_cq(cqb, "after its acks")?;
    // The channel still has A on it: busy.
    let ch = busy("destroy a channel with a CQ on it", ch.destroy())?;
    ok("ack A's event", cqa.ack_events(1))?;
    destroy_cq(cqa, "after its ack")?;
    ch.destroy()
        .map_err(|(_, st)| format!("destroy the empty channel: {}", status_name(st)))
}

// ---- completion errors --------------------------------------------------

/// Two fresh QPs for one error case on shared CQs; the case runs, then both
/// QPs are destroyed (none may be busy: every event was acknowledged).
fn case<'c>(
    e: &'c Env,
    cqa: &Cq<'_>,
    cqb: &Cq<'_>,
    conn: Conn,
    what: &str,
    body: impl FnOnce(&Qp<'c>, &Qp<'c>) -> Result<(), String>,
) -> Result<(), String> {
    let (a, b) = e.qps(IV_QPT_RC, cqa, cqb, conn)?;
    body(&a, &b).map_err(|m| format!("{what}: {m}"))?;
    destroy_qp(a, what)?;
    destroy_qp(b, what)
}

/// The requester's work request `wr_id` failed with `status`, the next one
/// (`wr_id + 1`) was flushed, the requester is in ERR.
fn requester_failed(a: &Qp<'_>, cqa: &Cq<'_>, wr_id: u64, status: u32) -> Result<(), String> {
    let got = cqes(cqa, 2, "requester")?;
    check_wcs(
        "requester",
        &got,
        &[
            failed(wr_id, status, a.qpn()),
            failed(wr_id + 1, IV_WC_WR_FLUSH_ERR, a.qpn()),
        ],
    )?;
    state(a, IV_QPS_ERR, "requester")
}

/// Posts `wr` and a SEND after it (`wr.wr_id + 1`).
fn post_two(a: &Qp<'_>, wr: &SendWr<'_>) -> Result<(), String> {
    post(a, wr, "first")?;
    post(
        a,
        &SendWr {
            inline: Some(b"next"),
            ..self::wr(wr.wr_id + 1, IV_WR_SEND)
        },
        "second",
    )
}

pub(crate) fn dp_loc_len_err(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_ALL)?;
    let (cqa, cqb) = (e.cq(64)?, e.cq(64)?);
    let c = &e.c;
    // A receive buffer too small: the responder's receive completes with
    // LOC_LEN_ERR, the requester's SEND with REM_INV_REQ_ERR; both QPs in
    // ERR, the responder's request error event; the rest flushed.
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "receive too small",
        |a, b| {
            recv(b, 1, &[rb.sge(0, 4)], "recv")?;
            recv(b, 2, &[rb.sge(8, 4)], "recv")?;
            post_two(
                a,
                &SendWr {
                    sges: &[ra.sge(0, 8)],
                    ..wr(10, IV_WR_SEND)
                },
            )?;
            let got = cqes(&cqb, 2, "responder")?;
            check_wcs(
                "responder",
                &got,
                &[
                    failed(1, IV_WC_LOC_LEN_ERR, b.qpn()),
                    failed(2, IV_WC_WR_FLUSH_ERR, b.qpn()),
                ],
            )?;
            requester_failed(a, &cqa, 10, IV_WC_REM_INV_REQ_ERR)?;
            state(b, IV_QPS_ERR, "responder")?;
            event(c, IV_EVENT_QP_REQ_ERR, b.handle(), "responder")
        },
    )?;
    // An atomic whose local buffer is not 8 bytes: LOC_LEN_ERR at the
    // requester, nothing sent.
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "atomic into 4 bytes",
        |a, b| {
            post_two(
                a,
                &SendWr {
                    sges: &[ra.sge(0, 4)],
                    remote_addr: rb.at(0),
                    rkey: rb.rkey,
                    compare_add: 1,
                    ..wr(20, IV_WR_ATOMIC_FETCH_AND_ADD)
                },
            )?;
            requester_failed(a, &cqa, 20, IV_WC_LOC_LEN_ERR)?;
            state(b, IV_QPS_RTS, "responder (never reached)")?;
            check!(mb.u64_at(0) == 0, "the atomic executed");
            Ok(())
        },
    )?;
    quiet(&cqb, "responder CQ")?;
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")
}

pub(crate) fn dp_loc_prot_err(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb, other, ro) = (Mem::new(BUF), Mem::new(BUF), Mem::new(4096), Mem::new(4096));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_ALL)?;
    let pd2 = ok("alloc_pd", e.c.alloc_pd())?.pd;
    let foreign = e.reg_in(pd2, &other, IV_ACCESS_ALL)?;
    let read_only = e.reg(&ro, IV_ACCESS_REMOTE_READ)?;
    let (cqa, cqb) = (e.cq(64)?, e.cq(64)?);
    let c = &e.c;
    type Case = (&'static str, u8, IvSge);
    let cases: [Case; 4] = [
        (
            "an lkey no MR has",
            IV_WR_SEND,
            IvSge {
                lkey: 0xFFFF_FF7E,
                ..ra.sge(0, 8)
            },
        ),
        ("beyond the MR", IV_WR_SEND, ra.sge(ra.len - 4, 8)),
        ("the lkey of another PD's MR", IV_WR_SEND, foreign.sge(0, 8)),
        (
            "READ into an MR without LOCAL_WRITE",
            IV_WR_RDMA_READ,
            read_only.sge(0, 8),
        ),
    ];
    for (what, opcode, sge) in cases {
        case(&e, &cqa, &cqb, Conn::default(), what, |a, b| {
            recv(b, 1, &[rb.sge(0, 64)], "recv")?;
            post_two(
                a,
                &SendWr {
                    sges: &[sge],
                    remote_addr: rb.at(0),
                    rkey: rb.rkey,
                    ..wr(5, opcode)
                },
            )?;
            requester_failed(a, &cqa, 5, IV_WC_LOC_PROT_ERR)?;
            state(b, IV_QPS_RTS, "responder (nothing sent)")
        })?;
    }
    // The responder's side: a receive into an MR without LOCAL_WRITE. Its
    // receive completes with LOC_PROT_ERR, the requester's SEND with
    // REM_OP_ERR; the responder's QP fatal event.
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "receive into an MR without LOCAL_WRITE",
        |a, b| {
            recv(b, 2, &[read_only.sge(0, 64)], "recv")?;
            post_two(
                a,
                &SendWr {
                    inline: Some(b"hello"),
                    ..wr(6, IV_WR_SEND)
                },
            )?;
            one(&cqb, "responder", failed(2, IV_WC_LOC_PROT_ERR, b.qpn()))?;
            requester_failed(a, &cqa, 6, IV_WC_REM_OP_ERR)?;
            state(b, IV_QPS_ERR, "responder")?;
            event(c, IV_EVENT_QP_FATAL, b.handle(), "responder")?;
            check!(ro.read(0, 5) == [0; 5], "written without LOCAL_WRITE");
            Ok(())
        },
    )?;
    quiet(&cqb, "responder CQ")?;
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")?;
    ok("dereg", e.c.dereg_mr(foreign.handle))?;
    ok("dealloc the other PD", e.c.dealloc_pd(pd2))
}

pub(crate) fn dp_loc_qp_op_err_garbage_wqe(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_ALL)?;
    let (cqa, cqb) = (e.cq(64)?, e.cq(64)?);
    let c = &e.c;
    // Raw WQEs no post_send would write.
    type Garbage = (&'static str, fn(u16) -> IvSendWqe);
    let garbage: [Garbage; 6] = [
        ("unknown opcode", |_| IvSendWqe {
            opcode: 99,
            ..IvSendWqe::default()
        }),
        ("unknown flag", |_| IvSendWqe {
            flags: 0x80,
            ..IvSendWqe::default()
        }),
        ("reserved field set", |_| IvSendWqe {
            reserved: 1,
            ..IvSendWqe::default()
        }),
        ("more SGEs than the QP has", |max| IvSendWqe {
            num_sge: max + 1,
            ..IvSendWqe::default()
        }),
        ("SGE count far beyond the slot", |_| IvSendWqe {
            num_sge: 0xFFFF,
            ..IvSendWqe::default()
        }),
        ("inline data beyond the slot", |_| IvSendWqe {
            flags: IV_SEND_INLINE,
            inline_len: 100_000,
            ..IvSendWqe::default()
        }),
    ];
    for (what, make) in garbage {
        case(&e, &cqa, &cqb, Conn::default(), what, |a, b| {
            let max = u16::try_from(a.cap().max_send_sge).unwrap_or(u16::MAX - 1);
            let wqe = IvSendWqe {
                wr_id: 0x1234,
                ..make(max)
            };
            e.post_raw_send(a, &wqe)?;
            one(
                &cqa,
                "garbage WQE",
                failed(0x1234, IV_WC_LOC_QP_OP_ERR, a.qpn()),
            )?;
            state(a, IV_QPS_ERR, "requester")?;
            state(b, IV_QPS_RTS, "responder (nothing sent)")
        })?;
    }
    // Inline data on a READ: well-formed, but not an operation there is.
    case(&e, &cqa, &cqb, Conn::default(), "inline READ", |a, _| {
        post_two(
            a,
            &SendWr {
                inline: Some(b"12345678"),
                remote_addr: rb.at(0),
                rkey: rb.rkey,
                ..wr(3, IV_WR_RDMA_READ)
            },
        )?;
        requester_failed(a, &cqa, 3, IV_WC_LOC_QP_OP_ERR)
    })?;
    // An impossible producer index: the QP goes to ERR with the QP fatal
    // event (there is no WQE to complete).
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "impossible producer index",
        |a, _| {
            let ring = a.rings().sq().ring();
            ring.producer().publish(ring.entries() + 5);
            e.doorbells()?.sq(a.rings().sq_bell());
            event(c, IV_EVENT_QP_FATAL, a.handle(), "requester")?;
            state(a, IV_QPS_ERR, "requester")?;
            quiet(&cqa, "nothing to complete")
        },
    )?;
    // None of that touched another QP.
    case(&e, &cqa, &cqb, Conn::default(), "a healthy QP", |a, b| {
        ma.write(0, b"fine");
        recv(b, 7, &[rb.sge(0, 64)], "recv")?;
        post(
            a,
            &SendWr {
                sges: &[ra.sge(0, 4)],
                ..wr(7, IV_WR_SEND)
            },
            "send",
        )?;
        one(&cqa, "SEND", sent(7, IV_WC_OP_SEND, a.qpn()))?;
        one(&cqb, "RECV", recvd(7, 4, b.qpn()))?;
        check!(mb.read(0, 4) == b"fine", "data");
        Ok(())
    })?;
    quiet(&cqb, "responder CQ")?;
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")
}

pub(crate) fn dp_rem_access_err(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb, no_w, no_r, no_a, other) = (
        Mem::new(BUF),
        Mem::new(BUF),
        Mem::new(4096),
        Mem::new(4096),
        Mem::new(4096),
        Mem::new(4096),
    );
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_ALL)?;
    let no_write = e.reg(&no_w, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_READ)?;
    let no_read = e.reg(&no_r, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE)?;
    let no_atomic = e.reg(
        &no_a,
        IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ,
    )?;
    let pd2 = ok("alloc_pd", e.c.alloc_pd())?.pd;
    let foreign = e.reg_in(pd2, &other, IV_ACCESS_ALL)?;
    let (cqa, cqb) = (e.cq(64)?, e.cq(64)?);
    let c = &e.c;
    let all = Conn::default().access;
    // (what, responder QP access, opcode, remote address, rkey)
    let cases: [(&str, u32, u8, u64, u32); 9] = [
        (
            "an rkey no MR has",
            all,
            IV_WR_RDMA_WRITE,
            rb.at(0),
            rb.rkey ^ 0x00FF_FF00,
        ),
        (
            "beyond the MR",
            all,
            IV_WR_RDMA_WRITE,
            rb.at(rb.len - 4),
            rb.rkey,
        ),
        (
            "WRITE to an MR without REMOTE_WRITE",
            all,
            IV_WR_RDMA_WRITE,
            no_write.at(0),
            no_write.rkey,
        ),
        (
            "READ of an MR without REMOTE_READ",
            all,
            IV_WR_RDMA_READ,
            no_read.at(0),
            no_read.rkey,
        ),
        (
            "atomic on an MR without REMOTE_ATOMIC",
            all,
            IV_WR_ATOMIC_CMP_AND_SWP,
            no_atomic.at(0),
            no_atomic.rkey,
        ),
        (
            "the rkey of another PD's MR",
            all,
            IV_WR_RDMA_WRITE,
            foreign.at(0),
            foreign.rkey,
        ),
        (
            "WRITE to a QP without REMOTE_WRITE",
            IV_ACCESS_REMOTE_READ,
            IV_WR_RDMA_WRITE,
            rb.at(0),
            rb.rkey,
        ),
        (
            "READ from a QP without REMOTE_READ",
            IV_ACCESS_REMOTE_WRITE,
            IV_WR_RDMA_READ,
            rb.at(0),
            rb.rkey,
        ),
        (
            "atomic on a QP without REMOTE_ATOMIC",
            IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ,
            IV_WR_ATOMIC_FETCH_AND_ADD,
            rb.at(0),
            rb.rkey,
        ),
    ];
    ma.write(0, b"12345678");
    for (what, access, opcode, remote_addr, rkey) in cases {
        let conn = Conn {
            access,
            ..Conn::default()
        };
        // The requester's own QP allows everything; the responder's does not.
        let (a, b) = (
            e.qp(IV_QPT_RC, &cqa, &cqa, None)?,
            e.qp(IV_QPT_RC, &cqb, &cqb, None)?,
        );
        e.connect(&a, b.qpn(), Conn::default())?;
        e.connect(&b, a.qpn(), conn)?;
        let run = || -> Result<(), String> {
            post_two(
                &a,
                &SendWr {
                    sges: &[ra.sge(8, 8)],
                    remote_addr,
                    rkey,
                    compare_add: 0,
                    swap: 1,
                    ..wr(1, opcode)
                },
            )?;
            requester_failed(&a, &cqa, 1, IV_WC_REM_ACCESS_ERR)?;
            state(&b, IV_QPS_ERR, "responder")?;
            event(c, IV_EVENT_QP_ACCESS_ERR, b.handle(), "responder")
        };
        run().map_err(|m| format!("{what}: {m}"))?;
        destroy_qp(a, what)?;
        destroy_qp(b, what)?;
    }
    for m in [&mb, &no_w, &no_r, &no_a, &other] {
        check!(
            m.read(0, 8) == [0; 8] && m.read(m.len() as usize - 8, 8) == [0; 8],
            "memory changed by a refused access"
        );
    }
    quiet(&cqb, "responder CQ")?;
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")?;
    ok("dereg", e.c.dereg_mr(foreign.handle))?;
    ok("dealloc the other PD", e.c.dealloc_pd(pd2))
}

pub(crate) fn dp_rem_inv_req_err(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_ALL)?;
    let (cqa, cqb) = (e.cq(64)?, e.cq(64)?);
    let c = &e.c;
    // A READ to a responder that takes no RDMA READs or atomics.
    let (a, b) = (
        e.qp(IV_QPT_RC, &cqa, &cqa, None)?,
        e.qp(IV_QPT_RC, &cqb, &cqb, None)?,
    );
    e.connect(&a, b.qpn(), Conn::default())?;
    e.connect(
        &b,
        a.qpn(),
        Conn {
            max_dest_rd_atomic: 0,
            ..Conn::default()
        },
    )?;
    let run = || -> Result<(), String> {
        post_two(
            &a,
            &SendWr {
                sges: &[ra.sge(0, 8)],
                remote_addr: rb.at(0),
                rkey: rb.rkey,
                ..wr(1, IV_WR_RDMA_READ)
            },
        )?;
        requester_failed(&a, &cqa, 1, IV_WC_REM_INV_REQ_ERR)?;
        state(&b, IV_QPS_ERR, "responder")?;
        event(c, IV_EVENT_QP_REQ_ERR, b.handle(), "responder")
    };
    run().map_err(|m| format!("READ with max_dest_rd_atomic 0: {m}"))?;
    destroy_qp(a, "teardown")?;
    destroy_qp(b, "teardown")?;
    // A misaligned atomic.
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "misaligned atomic",
        |a, b| {
            post_two(
                a,
                &SendWr {
                    sges: &[ra.sge(0, 8)],
                    remote_addr: rb.at(4),
                    rkey: rb.rkey,
                    compare_add: 0,
                    swap: 1,
                    ..wr(2, IV_WR_ATOMIC_CMP_AND_SWP)
                },
            )?;
            requester_failed(a, &cqa, 2, IV_WC_REM_INV_REQ_ERR)?;
            state(b, IV_QPS_ERR, "responder")?;
            event(c, IV_EVENT_QP_REQ_ERR, b.handle(), "responder")?;
            check!(mb.read(0, 16) == [0; 16], "the misaligned atomic executed");
            Ok(())
        },
    )?;
    // SEND with invalidate of an rkey that names nothing: the receive too
    // completes with REM_INV_REQ_ERR.
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "invalidate of an unknown rkey",
        |a, b| {
            recv(b, 9, &[rb.sge(0, 64)], "recv")?;
            post_two(
                a,
                &SendWr {
                    inline: Some(b"x"),
                    imm_or_inv: 0xFFFF_FF7E,
                    ..wr(3, IV_WR_SEND_WITH_INV)
                },
            )?;
            one(&cqb, "responder", failed(9, IV_WC_REM_INV_REQ_ERR, b.qpn()))?;
            requester_failed(a, &cqa, 3, IV_WC_REM_INV_REQ_ERR)?;
            state(b, IV_QPS_ERR, "responder")?;
            event(c, IV_EVENT_QP_REQ_ERR, b.handle(), "responder")
        },
    )?;
    quiet(&cqb, "responder CQ")?;
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")
}

pub(crate) fn dp_rem_op_err(d: &dyn Dut) -> Result<(), String> {
    let mb = Mem::new(BUF);
    let e = Env::open(d)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let (cqa, cqb) = (e.cq(64)?, e.cq(64)?);
    let c = &e.c;
    // The responder's receive fails its protection check (bad lkey):
    // LOC_PROT_ERR there, REM_OP_ERR at the requester, QP fatal event.
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "receive with a bad lkey",
        |a, b| {
            recv(
                b,
                1,
                &[IvSge {
                    lkey: 0xFFFF_FF7E,
                    ..rb.sge(0, 64)
                }],
                "recv",
            )?;
            post_two(
                a,
                &SendWr {
                    inline: Some(b"hello"),
                    ..wr(1, IV_WR_SEND)
                },
            )?;
            one(&cqb, "responder", failed(1, IV_WC_LOC_PROT_ERR, b.qpn()))?;
            requester_failed(a, &cqa, 1, IV_WC_REM_OP_ERR)?;
            state(b, IV_QPS_ERR, "responder")?;
            event(c, IV_EVENT_QP_FATAL, b.handle(), "responder")
        },
    )?;
    // A malformed receive WQE (written raw into the ring): LOC_QP_OP_ERR
    // there, REM_OP_ERR at the requester, QP fatal event.
    case(
        &e,
        &cqa,
        &cqb,
        Conn::default(),
        "malformed receive WQE",
        |a, b| {
            let num_sge = b.cap().max_recv_sge + 1;
            e.post_raw_recv(
                b,
                &IvRecvWqe {
                    wr_id: 3,
                    num_sge,
                    reserved: 0,
                },
            )?;
            post_two(
                a,
                &SendWr {
                    inline: Some(b"hello"),
                    ..wr(3, IV_WR_SEND)
                },
            )?;
            one(&cqb, "responder", failed(3, IV_WC_LOC_QP_OP_ERR, b.qpn()))?;
            requester_failed(a, &cqa, 3, IV_WC_REM_OP_ERR)?;
            state(b, IV_QPS_ERR, "responder")?;
            event(c, IV_EVENT_QP_FATAL, b.handle(), "responder")
        },
    )?;
    check!(mb.read(0, 64) == [0; 64], "data landed");
    quiet(&cqb, "responder CQ")?;
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")
}

pub(crate) fn dp_rnr_retry_exc_err(d: &dyn Dut) -> Result<(), String> {
    let e = Env::open(d)?;
    let p = e.pair(
        IV_QPT_RC,
        Conn {
            rnr_retry: 0,
            ..Conn::default()
        },
    )?;
    // No receive posted, no RNR retry: the first SEND fails, the second is
    // flushed; the requester is in ERR; the responder is not (RNR is no
    // responder error) and raises nothing.
    post_two(
        &p.a,
        &SendWr {
            inline: Some(b"a"),
            ..wr(1, IV_WR_SEND)
        },
    )?;
    requester_failed(&p.a, &p.cqa, 1, IV_WC_RNR_RETRY_EXC_ERR)?;
    state(&p.b, IV_QPS_RTS, "responder")?;
    quiet(&p.cqb, "responder CQ")?;
    p.close("teardown")
}

/// The transport keeps time on every device, with or without a wire: a
/// SEND that meets RNR NAKs with `rnr_retry` 1–6 completes
/// RNR_RETRY_EXC_ERR after that many RNR waits (the RNR timer, 1.28 ms
/// here, runs on the device's clock); with 7 it waits until a receive is
/// posted and succeeds.
pub(crate) fn dp_rnr_retries_run_on_the_devices_clock(d: &dyn Dut) -> Result<(), String> {
    let mb = Mem::new(BUF);
    let e = Env::open(d)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    let cqa = e.cq(64)?;
    let cqb = e.cq(64)?;
    for rnr_retry in 1..=7u8 {
        let conn = Conn {
            rnr_retry,
            min_rnr_timer: 14,
            ..Conn::default()
        };
        let what = format!("rnr_retry {rnr_retry}");
        case(&e, &cqa, &cqb, conn, &what, |a, b| {
            let start = Instant::now();
            post(
                a,
                &SendWr {
                    inline: Some(b"late"),
                    ..wr(1, IV_WR_SEND)
                },
                "send",
            )?;
            if rnr_retry < 7 {
                let got = cqes(&cqa, 1, "requester")?;
                check_wcs(
                    "requester",
                    &got,
                    &[failed(1, IV_WC_RNR_RETRY_EXC_ERR, a.qpn())],
                )?;
                let waited = Duration::from_micros(1280) * u32::from(rnr_retry);
                check!(
                    start.elapsed() >= waited,
                    "RNR_RETRY_EXC_ERR after {:?}, before {waited:?} of RNR waits",
                    start.elapsed()
                );
                return state(a, IV_QPS_ERR, "requester");
            }
            std::thread::sleep(Duration::from_millis(20));
            quiet(&cqa, "rnr_retry 7 waits")?;
            recv(b, 2, &[rb.sge(0, 64)], "recv")?;
            one(&cqa, "requester", sent(1, IV_WC_OP_SEND, a.qpn()))?;
            one(&cqb, "responder", recvd(2, 4, b.qpn()))?;
            check!(mb.read(0, 4) == b"late", "payload {:?}", mb.read(0, 4));
            Ok(())
        })?;
    }
    destroy_cq(cqa, "teardown")?;
    destroy_cq(cqb, "teardown")
}

/// A SEND to a QP that does not exist completes RETRY_EXC_ERR after
/// `retry_cnt` + 1 local ACK timeouts (4.096 us x 2^10 each here), the
/// next WQE flushed: the device's clock fires the ACK timer with or
/// without a wire.
pub(crate) fn dp_retry_exc_err_missing_qp(d: &dyn Dut) -> Result<(), String> {
    let e = Env::open(d)?;
    let cqa = e.cq(64)?;
    let a = e.qp(IV_QPT_RC, &cqa, &cqa, None)?;
    let conn = Conn {
        timeout: 10,
        retry_cnt: 3,
        ..Conn::default()
    };
    e.connect(&a, 0xAB_CDEF, conn)?;
    let start = Instant::now();
    post_two(
        &a,
        &SendWr {
            inline: Some(b"anyone?"),
            ..wr(1, IV_WR_SEND)
        },
    )?;
    requester_failed(&a, &cqa, 1, IV_WC_RETRY_EXC_ERR)?;
    let waited = Duration::from_nanos(4096 << 10) * 4;
    check!(
        start.elapsed() >= waited,
        "RETRY_EXC_ERR after {:?}, before {waited:?} of timeouts",
        start.elapsed()
    );
    destroy_qp(a, "teardown")?;
    destroy_cq(cqa, "teardown")
}

pub(crate) fn dp_wr_flush_err_exactly_once(d: &dyn Dut) -> Result<(), String> {
    let (ma, mb) = (Mem::new(BUF), Mem::new(BUF));
    let e = Env::open(d)?;
    let ra = e.reg(&ma, IV_ACCESS_LOCAL_WRITE)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE)?;
    // RNR retried forever: the SENDs stay outstanding (the responder has no
    // receive) until the requester is moved to ERR.
    let p = e.pair(IV_QPT_RC, Conn::default())?;
    recv(&p.a, 100, &[ra.sge(0, 8)], "recv")?;
    recv(&p.a, 101, &[ra.sge(8, 8)], "recv")?;
    for i in 1..=3 {
        post(
            &p.a,
            &SendWr {
                inline: Some(b"x"),
                ..wr(i, IV_WR_SEND)
            },
            "send",
        )?;
    }
    post(
        &p.a,
        &SendWr {
            wr_id: 4,
            opcode: IV_WR_SEND,
            flags: 0,
            sges: &[ra.sge(16, 8)],
            ..SendWr::default()
        },
        "unsignaled send",
    )?;
    quiet(&p.cqa, "SENDs waiting on RNR")?;
    let to_err = IvQpAttr {
        qp_state: IV_QPS_ERR,
        ..IvQpAttr::default()
    };
    ok("requester to ERR", p.a.modify(IV_QP_STATE, &to_err))?;
    state(&p.a, IV_QPS_ERR, "requester")?;
    // Every outstanding WQE, send and receive, signaled or not, exactly once.
    let mut got = cqes(&p.cqa, 6, "flushed")?;
    got.sort_by_key(|c| c.wr_id);
    let q = p.a.qpn();
    let want: Vec<W> = [1, 2, 3, 4, 100, 101]
        .into_iter()
        .map(|id| failed(id, IV_WC_WR_FLUSH_ERR, q))
        .collect();
    check_wcs("flushed", &got, &want)?;
    // Posted after ERR: flushed at once.
    post(&p.a, &wr(5, IV_WR_RDMA_WRITE), "send in ERR")?;
    recv(&p.a, 102, &[ra.sge(0, 8)], "recv in ERR")?;
    let mut got = cqes(&p.cqa, 2, "posted in ERR")?;
    got.sort_by_key(|c| c.wr_id);
    check_wcs(
        "posted in ERR",
        &got,
        &[
            failed(5, IV_WC_WR_FLUSH_ERR, q),
            failed(102, IV_WC_WR_FLUSH_ERR, q),
        ],
    )?;
    // Doorbells again, ERR -> ERR: nothing twice.
    let bells = e.doorbells()?;
    bells.sq(p.a.rings().sq_bell());
    bells.rq(p.a.rings().rq_bell());
    ok("ERR -> ERR", p.a.modify(IV_QP_STATE, &to_err))?;
    quiet(&p.cqa, "nothing flushed twice")?;
    // The responder's receive side: posted, then the QP moved to ERR.
    state(&p.b, IV_QPS_RTS, "responder (only ever RNR-NAKed)")?;
    recv(&p.b, 200, &[rb.sge(0, 8)], "recv")?;
    recv(&p.b, 201, &[rb.sge(8, 8)], "recv")?;
    quiet(&p.cqb, "nothing arrives from a requester in ERR")?;
    ok("responder to ERR", p.b.modify(IV_QP_STATE, &to_err))?;
    let got = cqes(&p.cqb, 2, "responder flushed")?;
    check_wcs(
        "responder flushed",
        &got,
        &[
            failed(200, IV_WC_WR_FLUSH_ERR, p.b.qpn()),
            failed(201, IV_WC_WR_FLUSH_ERR, p.b.qpn()),
        ],
    )?;
    check!(
        mb.read(0, 16) == [0; 16],
        "data landed in a flushed receive"
    );
    // ERR -> RESET empties the queues without completions.
    ok(
        "ERR -> RESET",
        p.a.modify(IV_QP_STATE, &IvQpAttr::default()),
    )?;
    state(&p.a, IV_QPS_RESET, "requester")?;
    quiet(&p.cqa, "after RESET")?;
    p.close("teardown")
}

pub(crate) fn dp_cq_overrun_cq_error(d: &dyn Dut) -> Result<(), String> {
    let mb = Mem::new(BUF);
    let e = Env::open(d)?;
    let rb = e.reg(&mb, IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE)?;
    let small = e.cq(1)?;
    let big = e.cq(64)?;
    let n = small.cqe();
    check!(n >= 1, "CQ of {n} entries");
    let a = e.qp(IV_QPT_RC, &small, &big, None)?;
    let b = e.qp(IV_QPT_RC, &big, &big, None)?;
    e.connect(&a, b.qpn(), Conn::default())?;
    e.connect(&b, a.qpn(), Conn::default())?;
    let c = &e.c;
    let cq = small.handle();
    std::thread::scope(|s| -> Result<(), String> {
        // A wait on the CQ (not arming it): it ends when the CQ overruns.
        let waiter = s.spawn(move || cq_notify(c, cq, IV_NOTIFY_NO_ARM));
        // One more signaled WRITE than the CQ holds, none polled.
        for i in 0..=u64::from(n) {
            post(
                &a,
                &SendWr {
                    inline: Some(&[i as u8; 8]),
                    remote_addr: rb.at(i * 8),
                    rkey: rb.rkey,
                    ..wr(i + 1, IV_WR_RDMA_WRITE)
                },
                "write",
            )?;
        }
        event(c, IV_EVENT_CQ_ERR, cq, "overrun")?;
        let (st, _) = waiter.join().map_err(|_| "the waiter panicked")?;
        check!(
            st == STATUS_DATA_OVERRUN,
            "a CQ_NOTIFY pending at the overrun completed with {}",
            status_name(st)
        );
        Ok(())
    })?;
    // What fit is there, in order; nothing after it.
    let got = cqes(&small, n as usize, "the full CQ")?;
    let want: Vec<W> = (1..=u64::from(n))
        .map(|i| sent(i, IV_WC_OP_RDMA_WRITE, a.qpn()))
        .collect();
    check_wcs("the full CQ", &got, &want)?;
    // The QP completing on it is in ERR; its peer is not.
    state(&a, IV_QPS_ERR, "QP on the overrun CQ")?;
    state(&b, IV_QPS_RTS, "its peer")?;
    // A CQ_NOTIFY on the failed CQ completes at once, whatever it asks.
    for arm in [IV_NOTIFY_NO_ARM, IV_NOTIFY_NEXT, IV_NOTIFY_SOLICITED] {
        let (st, _) = cq_notify(c, cq, arm);
        check!(
            st == STATUS_DATA_OVERRUN,
            "CQ_NOTIFY({arm}) on an overrun CQ: {}",
            status_name(st)
        );
    }
    // Nothing more is written to it.
    post(&a, &wr(100, IV_WR_RDMA_WRITE), "send in ERR")?;
    quiet(&small, "the CQ in error")?;
    quiet(&big, "the other CQ")?;
    destroy_qp(a, "teardown")?;
    destroy_qp(b, "teardown")?;
    destroy_cq(small, "teardown")?;
    destroy_cq(big, "teardown")?;
    expect(
        "CQ_NOTIFY on the destroyed CQ",
        match cq_notify(c, cq, IV_NOTIFY_NO_ARM) {
            (st, _) if st == STATUS_SUCCESS => Ok(()),
            (st, _) => Err(st),
        },
        STATUS_INVALID_HANDLE,
    )
}

/// A work queue takes as many work requests as the depth its create
/// reported, and no more: a send queue and a receive queue created with
/// depth 0 (capacity 0) refuse every post; queues of depth 1 and of a
/// rounded-up depth take exactly that many; an SRQ likewise. Nothing was
/// rung for a refused post and the QP stays in RESET.
pub(crate) fn dp_work_queues_take_their_reported_depth(d: &dyn Dut) -> Result<(), String> {
    let e = Env::open(d)?;
    let cq = e.cq(256)?;
    let create = |send: u32, recv: u32| {
        ok(
            "create QP",
            e.c.new_qp(&IvCreateQpIn {
                pd: e.pd,
                send_cq: cq.handle(),
                recv_cq: cq.handle(),
                srq: 0,
                user_context: QP_CONTEXT,
                qp_type: IV_QPT_RC,
                sq_sig_all: 0,
                cap: IvQpCap {
                    max_send_wr: send,
                    max_recv_wr: recv,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                    reserved: 0,
                },
            }),
        )
    };
    // Posts until one is refused: how many were taken, and why it stopped.
    let fill = |what: &str, post: &dyn Fn(u64) -> Result<(), PostError>| {
        let mut n = 0u64;
        loop {
            match post(n) {
                Ok(()) => n += 1,
                Err(PostError::Full) => return Ok(n),
                Err(e) => return Err(format!("{what}: post {n} refused with {e:?}, not Full")),
            }
            if n > 1 << 16 {
                return Err(format!("{what}: never full"));
            }
        }
    };
    for (send, recv) in [(0, 0), (0, 1), (1, 0), (5, 3)] {
        let qp = create(send, recv)?;
        let cap = qp.cap();
        let what = format!("QP asked ({send}, {recv}), created {cap:?}");
        check!(
            (cap.max_send_wr == 0) == (send == 0)
                && (cap.max_recv_wr == 0) == (recv == 0)
                && cap.max_send_wr >= send
                && cap.max_recv_wr >= recv,
            "{what}: depths"
        );
        let sends = fill(&what, &|i| qp.post_send(&wr(i, IV_WR_SEND)))?;
        let recvs = fill(&what, &|i| qp.post_recv(i, &[]))?;
        check!(
            (sends, recvs) == (u64::from(cap.max_send_wr), u64::from(cap.max_recv_wr)),
            "{what}: took {sends} sends and {recvs} receives"
        );
        if cap.max_send_wr == 0 {
            let list = [wr(1, IV_WR_SEND)];
            check!(
                matches!(qp.post_send_list(&list), Err((0, PostError::Full))),
                "{what}: a list posted to a send queue of depth 0"
            );
        }
        state(&qp, IV_QPS_RESET, &what)?;
        destroy_qp(qp, &what)?;
    }
    for depth in [1, 6] {
        let srq = ok(
            "create SRQ",
            e.c.new_srq(&IvCreateSrqIn {
                pd: e.pd,
                user_context: SRQ_CONTEXT,
                max_wr: depth,
                max_sge: 1,
                srq_limit: 0,
                reserved: 0,
            }),
        )?;
        let q = ok("query SRQ", e.c.query_srq(srq.handle()))?;
        let what = format!("SRQ of depth {depth} (reported {})", q.max_wr);
        let n = fill(&what, &|i| srq.post_recv(i, &[]))?;
        check!(
            n == u64::from(q.max_wr) && q.max_wr >= depth,
            "{what}: took {n}"
        );
        srq.destroy()
            .map_err(|(_, st)| format!("{what}: destroy: {}", status_name(st)))?;
    }
    destroy_cq(cq, "teardown")
}
