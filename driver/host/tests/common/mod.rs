//! Helpers shared by the host tests: memory a ULP registers, one side of a
//! connection, and each test run over each backend ([`on_each_backend`]).
#![allow(dead_code, reason = "each test crate uses its part")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use irpverbs_host::HostFile;
use irpverbs_kernel_table::speed::Doorbells;
use irpverbs_kernel_table::{IoctlTransport, SpeedPath};

use irpverbs_abi::*;
use irpverbs_verbs::{Client, Cq, Qp, SendWr, qp_request};

/// Memory a ULP registers (bytes the HCA may write while the test reads).
pub struct Mem(Box<[AtomicU8]>);

impl Mem {
    pub fn new(len: usize) -> Self {
        Self((0..len).map(|_| AtomicU8::new(0)).collect())
    }
    pub fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
    pub fn fill(&self, at: usize, bytes: &[u8]) {
        for (i, b) in bytes.iter().enumerate() {
            self.0[at + i].store(*b, Ordering::Relaxed);
        }
    }
    pub fn read(&self, at: usize, len: usize) -> Vec<u8> {
        self.0[at..at + len]
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }
}

/// One side: a PD, `mem_len` bytes of registered memory, a CQ of `cqe`
/// entries and an RC QP (in RESET), its queues `depth` deep when given.
pub struct End<'c> {
    pub c: &'c Client,
    pub pd: IvHandle,
    pub mem: Mem,
    pub mr: IvRegMrOut,
    pub cq: Cq<'c>,
    pub qp: Qp<'c>,
}

impl<'c> End<'c> {
    pub fn with(c: &'c Client, mem_len: usize, cqe: u32, depth: Option<u32>) -> Self {
        Self::of_type(c, mem_len, cqe, depth, IV_QPT_RC)
    }

    /// 64 KiB, a CQ of 64 and an RC QP.
    pub fn new_rc(c: &'c Client) -> Self {
        Self::of_type(c, 1 << 16, 64, None, IV_QPT_RC)
    }

    /// 64 KiB, a CQ of 64 and a UD QP.
    pub fn new_ud(c: &'c Client) -> Self {
        Self::of_type(c, 1 << 16, 64, None, IV_QPT_UD)
    }

    /// As [`End::with`], with a QP of `qp_type`.
    pub fn of_type(
        c: &'c Client,
        mem_len: usize,
        cqe: u32,
        depth: Option<u32>,
        qp_type: u32,
    ) -> Self {
        let pd = c.alloc_pd().unwrap().pd;
        let mem = Mem::new(mem_len);
        let mr = c
            .reg_mr(pd, mem.addr(), mem_len as u64, IV_ACCESS_ALL)
            .unwrap();
        let cq = c
            .new_cq(&IvCreateCqIn {
                cqe,
                ..IvCreateCqIn::default()
            })
            .unwrap();
        let mut req = qp_request(pd, cq.handle(), 0, qp_type);
        if let Some(d) = depth {
            req.cap.max_send_wr = d;
            req.cap.max_recv_wr = d;
        }
        let qp = c.new_qp(&req).unwrap();
        Self {
            c,
            pd,
            mem,
            mr,
            cq,
            qp,
        }
    }

    /// Waits for one completion (a minute at most: the condition is what
    /// is tested, not the time).
    pub fn wc(&self) -> IvCqe {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut buf = [IvCqe::default(); 1];
        while std::time::Instant::now() < deadline {
            if self.cq.poll(&mut buf).unwrap() == 1 {
                return buf[0];
            }
            std::thread::yield_now();
        }
        panic!("no completion");
    }

    /// `len` bytes at `at` of the registered memory.
    pub fn sge(&self, at: usize, len: usize) -> IvSge {
        IvSge {
            addr: self.mem.addr() + at as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }
}

/// A connect request's usual values (the caller sets the CEP, QP, service
/// and addresses): 4 reads in flight each way, 7 transport and RNR
/// retries, flow control.
pub fn connect_defaults() -> IvCmConnectIn {
    IvCmConnectIn {
        cm_response_timeout: 16,
        max_cm_retries: 5,
        local_ack_timeout: 14,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        min_rnr_timer: 12,
        flags: IV_CM_FLOW_CONTROL as u8,
        ..IvCmConnectIn::default()
    }
}

/// Waits (a minute at most: the condition is what is tested) for `done`.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A signaled SEND of `len` bytes of `end`'s memory.
pub fn send(end: &End<'_>, wr_id: u64, len: usize) {
    end.qp
        .post_send(&SendWr {
            wr_id,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            sges: &[end.sge(0, len)],
            ..SendWr::default()
        })
        .unwrap();
}

/// One open of a device shared by a [`Client`] (its IOCTLs and, given to
/// `Client::with_speed_path`, its speed path) and the test's own
/// asynchronous requests (`HostFile::submit`, as a kernel ULP issues them
/// from a DPC).
pub struct SharedFile(pub Arc<HostFile>);

impl IoctlTransport for SharedFile {
    fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
        self.0.ioctl(code, input, output_len)
    }
}

// SAFETY: the tests that give a `SharedFile` to `Client::with_speed_path`
// (comp_vectors.rs, model.rs) issue only CQ_NOTIFY requests and queries
// of their own on the file, never a destroy or a resize: the client alone
// destroys objects.
#[allow(unsafe_code, reason = "a SpeedPath over a shared HostFile")]
unsafe impl SpeedPath for SharedFile {
    fn doorbells(&self) -> &dyn Doorbells {
        self.0.doorbells()
    }
}

/// Runs each named test once per backend: for `fn name(backend: Backend)`
/// (no `#[test]` of its own), `name::soft` and `name::model`, the soft HCA
/// and the model HCA (a mini-driver reaching its device only through the
/// PCI seam). `cargo test name` runs both.
#[macro_export]
macro_rules! on_each_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn soft() {
                super::$name(irpverbs_host::Backend::Soft);
            }
            #[test]
            fn model() {
                super::$name(irpverbs_host::Backend::Model);
            }
        }
    )*};
}
