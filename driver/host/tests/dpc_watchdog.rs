//! The DPC watchdog (`DPC_WATCHDOG_VIOLATION`, 0x133) over the soft HCA's
//! bounded data path: a kernel ULP moves 64 MiB through one RC QP, as RDMA
//! WRITEs and as SENDs, posted as one list from a dispatch-level callback,
//! with the verifier's watchdog set to a few times the soft HCA's budget per
//! call (`SoftConfig::dpc_budget`). The soft HCA does one budget in the
//! callback and requeues the rest to its DPC, one budget per run; a data
//! path that ran until no work was left would do all 64 MiB in the
//! callback and bugcheck.
//!
//! The watchdog counts work (packets), not time, so the test does not
//! depend on how busy the machine is; its wall-clock allotment is a
//! generous backstop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_host::platform::{
    DpcWatchdog, HostConfig, VerifierConfig, catch_bugcheck, codes, dpc_watchdog,
};
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_soft::{DEFAULT_DPC_BUDGET, SoftConfig};
use irpverbs_verbs::{Cq, IntoClient, RecvWr, SendWr};

mod common;

crate::on_each_backend!(
    sixty_four_mib_through_one_qp_stay_within_the_dpc_watchdog,
    a_budget_past_the_allotment_bugchecks_0x133,
);

const MIB: usize = 1 << 20;
/// 64 messages of 1 MiB: 64 MiB.
const MESSAGES: u64 = 64;
/// The watchdog's allotment: four budgets (a step may cross the budget by
/// at most one message, 2 × 1024 packets here).
const ALLOTMENT: u64 = 4 * DEFAULT_DPC_BUDGET as u64;

fn device(backend: Backend, budget: u32) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        platform: HostConfig {
            verifier: VerifierConfig {
                dpc_watchdog: Some(DpcWatchdog {
                    max_work: ALLOTMENT,
                    max_time: Some(Duration::from_secs(120)),
                }),
                ..VerifierConfig::default()
            },
            ..HostConfig::default()
        },
        soft: SoftConfig {
            dpc_budget: budget,
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

fn qp_in(pd: IvHandle, cq: IvHandle) -> IvCreateQpIn {
    IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: IV_QPT_RC,
        cap: IvQpCap {
            max_send_wr: 127,
            max_recv_wr: 127,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            reserved: 0,
        },
        ..IvCreateQpIn::default()
    }
}

/// Takes `n` completions from `cq`, each successful with opcode `opcode`.
fn completions(cq: &Cq<'_>, n: u64, opcode: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = 0;
    let mut wc = [IvCqe::default(); 16];
    while got < n {
        let k = cq.poll(&mut wc).expect("poll");
        for c in &wc[..k] {
            assert_eq!((c.status, c.opcode), (IV_WC_SUCCESS, opcode), "{c:?}");
        }
        got += k as u64;
        assert!(Instant::now() < deadline, "{got} of {n} completions");
    }
}

/// What a bugcheck in `f` was: (code, parameters).
fn no_bugcheck<R>(dev: &HostDevice, f: impl FnOnce() -> R) -> R {
    match catch_bugcheck(|| dev.platform().run_at_dispatch(f)) {
        Ok(r) => r,
        Err(b) => panic!("bugcheck {:#x} {:x?}: {}", b.code, b.params, b.reason),
    }
}

fn sixty_four_mib_through_one_qp_stay_within_the_dpc_watchdog(backend: Backend) {
    let dev = device(backend, DEFAULT_DPC_BUDGET);
    let c = dev.open_kernel().unwrap().into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let mut src = vec![0u8; MIB];
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    let mut dst = vec![0u8; MIB];
    let src_mr = c
        .reg_mr(
            pd,
            src.as_mut_ptr() as u64,
            MIB as u64,
            IV_ACCESS_LOCAL_WRITE,
        )
        .unwrap();
    let dst_base = dst.as_mut_ptr() as u64;
    let dst_mr = c
        .reg_mr(
            pd,
            dst_base,
            MIB as u64,
            IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE,
        )
        .unwrap();
    let cqa = c
        .new_cq(&IvCreateCqIn {
            cqe: 255,
            ..IvCreateCqIn::default()
        })
        .unwrap();
    let cqb = c
        .new_cq(&IvCreateCqIn {
            cqe: 255,
            ..IvCreateCqIn::default()
        })
        .unwrap();
    let a = c.new_qp(&qp_in(pd, cqa.handle())).unwrap();
    let b = c.new_qp(&qp_in(pd, cqb.handle())).unwrap();
    let gid = c.query_gid(1, 0).unwrap();
    a.connect(b.qpn(), gid).unwrap();
    b.connect(a.qpn(), gid).unwrap();
    let src_sge = [IvSge {
        addr: src.as_ptr() as u64,
        length: MIB as u32,
        lkey: src_mr.lkey,
    }];
    let dst_sge = [IvSge {
        addr: dst_base,
        length: MIB as u32,
        lkey: dst_mr.lkey,
    }];
    let sent_before = dev.soft().stats().packets_sent;

    // RDMA WRITE: 64 × 1 MiB, one list, one doorbell, from a
    // dispatch-level callback.
    let writes: Vec<SendWr<'_>> = (0..MESSAGES)
        .map(|i| SendWr {
            wr_id: i,
            opcode: IV_WR_RDMA_WRITE,
            flags: IV_SEND_SIGNALED,
            sges: &src_sge,
            remote_addr: dst_base,
            rkey: dst_mr.rkey,
            ..SendWr::default()
        })
        .collect();
    no_bugcheck(&dev, || a.post_send_list(&writes)).expect("posted");
    completions(&cqa, MESSAGES, IV_WC_OP_RDMA_WRITE);
    assert!(dst == src, "the WRITEs' data");

    // SEND: 64 receives, then 64 × 1 MiB SENDs as one list.
    dst.fill(0);
    let recvs: Vec<RecvWr<'_>> = (0..MESSAGES)
        .map(|i| RecvWr {
            wr_id: 100 + i,
            sges: &dst_sge,
        })
        .collect();
    b.post_recv_list(&recvs).expect("receives");
    let sends: Vec<SendWr<'_>> = (0..MESSAGES)
        .map(|i| SendWr {
            wr_id: 200 + i,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            sges: &src_sge,
            ..SendWr::default()
        })
        .collect();
    no_bugcheck(&dev, || a.post_send_list(&sends)).expect("posted");
    completions(&cqa, MESSAGES, IV_WC_OP_SEND);
    completions(&cqb, MESSAGES, IV_WC_OP_RECV);
    assert!(dst == src, "the SENDs' data");

    // 64 MiB each way at the 1024-byte MTU.
    let sent = dev.soft().stats().packets_sent - sent_before;
    assert!(sent >= 2 * 64 * 1024, "{sent} packets");
    assert_eq!(dev.platform().background_bugcheck(), None);

    drop((a, b, cqa, cqb));
    c.dereg_mr(src_mr.mr).unwrap();
    c.dereg_mr(dst_mr.mr).unwrap();
    c.dealloc_pd(pd).unwrap();
    drop(c);
    dev.quiesce(Duration::from_secs(10)).expect("quiescent");
    dev.unload();
}

/// A budget larger than the watchdog's allotment: the same transfer runs
/// past it in one call, and the verifier stops it with 0x133 (parameter 1:
/// 1, a dispatch-level callback; parameter 4: 0, counted in work units).
fn a_budget_past_the_allotment_bugchecks_0x133(backend: Backend) {
    let dev = device(backend, u32::MAX);
    let c = dev.open_kernel().unwrap().into_client();
    let pd = c.alloc_pd().unwrap().pd;
    let mut src = vec![0u8; MIB];
    let mut dst = vec![0u8; MIB];
    let src_mr = c
        .reg_mr(
            pd,
            src.as_mut_ptr() as u64,
            MIB as u64,
            IV_ACCESS_LOCAL_WRITE,
        )
        .unwrap();
    let dst_base = dst.as_mut_ptr() as u64;
    let dst_mr = c
        .reg_mr(
            pd,
            dst_base,
            MIB as u64,
            IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE,
        )
        .unwrap();
    let cqa = c
        .new_cq(&IvCreateCqIn {
            cqe: 255,
            ..IvCreateCqIn::default()
        })
        .unwrap();
    let cqb = c
        .new_cq(&IvCreateCqIn {
            cqe: 255,
            ..IvCreateCqIn::default()
        })
        .unwrap();
    let a = c.new_qp(&qp_in(pd, cqa.handle())).unwrap();
    let b = c.new_qp(&qp_in(pd, cqb.handle())).unwrap();
    let gid = c.query_gid(1, 0).unwrap();
    a.connect(b.qpn(), gid).unwrap();
    b.connect(a.qpn(), gid).unwrap();
    let src_sge = [IvSge {
        addr: src.as_ptr() as u64,
        length: MIB as u32,
        lkey: src_mr.lkey,
    }];
    let writes: Vec<SendWr<'_>> = (0..MESSAGES)
        .map(|i| SendWr {
            wr_id: i,
            opcode: IV_WR_RDMA_WRITE,
            flags: IV_SEND_SIGNALED,
            sges: &src_sge,
            remote_addr: dst_base,
            rkey: dst_mr.rkey,
            ..SendWr::default()
        })
        .collect();
    let check = catch_bugcheck(|| dev.platform().run_at_dispatch(|| a.post_send_list(&writes)))
        .expect_err("the watchdog fires");
    assert_eq!(check.code, codes::DPC_WATCHDOG_VIOLATION, "{check:?}");
    assert_eq!(
        (check.params[0], check.params[1], check.params[3]),
        (dpc_watchdog::CUMULATIVE, ALLOTMENT, dpc_watchdog::UNIT_WORK),
        "{check:?}"
    );
    assert!(check.params[2] > ALLOTMENT, "{check:?}");
    // The device is left as the bugcheck left it: not unloaded.
    std::mem::forget((a, b, cqa, cqb));
    std::mem::forget(c);
    std::mem::forget((src, dst));
}
