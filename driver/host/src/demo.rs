//! `irpverbs demo`: the driver in host mode on the soft HCA doing real
//! control-path work, end to end through IOCTLs, then unloading under the
//! verifier's leak checks.

use std::fmt::Write;
use std::time::Instant;

use irpverbs_abi::*;
use irpverbs_verbs::{Client, av, qp_request, rts_steps};

use crate::device::{Engine, HostDevice, HostDeviceConfig};

fn ok<T>(what: &str, r: Result<T, NtStatus>) -> Result<T, String> {
    r.map_err(|s| format!("{what}: {}", status_name(s)))
}

fn state_name(s: u32) -> &'static str {
    ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"]
        .get(s as usize)
        .copied()
        .unwrap_or("?")
}

/// Runs the demo with `pairs` connected RC QP pairs; returns its report.
///
/// # Errors
/// The first verb that failed unexpectedly, or a leak found at unload.
pub fn run(pairs: u32, engine: Engine) -> Result<String, String> {
    let mut out = String::new();
    let w = &mut out;
    let start = Instant::now();
    let dev = HostDevice::new(HostDeviceConfig {
        engine,
        ..HostDeviceConfig::default()
    })
    .map_err(|s| format!("device: {}", status_name(s)))?;
    let file = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .map_err(|s| status_name(s).to_string())?;
    let c = Client::new(Box::new(file));
    let d = ok("query_device", c.query_device())?;
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    let _ = writeln!(
        w,
        "device: abi {}.{}, {} port, max_qp {}, max_cqe {}, gid0 {}",
        d.abi_version >> 16,
        d.abi_version & 0xFFFF,
        d.phys_port_cnt,
        d.max_qp,
        d.max_cqe,
        irpverbs_verbs::devinfo::gid_to_string(&gid)
    );
    let pd = ok("alloc_pd", c.alloc_pd())?;
    let buf = vec![0u8; 1 << 20];
    let mr = ok(
        "reg_mr",
        c.reg_mr(pd.pd, buf.as_ptr() as u64, buf.len() as u64, IV_ACCESS_ALL),
    )?;
    let cq = ok("create_cq", c.create_cq(4096))?;
    let srq = ok("create_srq", c.create_srq(pd.pd, 256, 16))?;
    let ah = ok("create_ah", c.create_ah(pd.pd, &av(gid)))?;
    let _ = writeln!(
        w,
        "pd {} | mr lkey {:#x} rkey {:#x} over 1 MiB | cq {} ({} entries) | srq {} | ah {:#x}",
        pd.pdn, mr.lkey, mr.rkey, cq.cqn, cq.cqe, srq.srqn, ah.ah
    );
    // RC pairs connected to each other.
    let mut qps = Vec::new();
    for _ in 0..pairs {
        let a = ok("create_qp", c.create_qp(pd.pd, cq.cq, IV_QPT_RC))?;
        let b = ok("create_qp", c.create_qp(pd.pd, cq.cq, IV_QPT_RC))?;
        ok("connect a", c.connect_qp(a.qp, IV_QPT_RC, b.qpn, gid))?;
        ok("connect b", c.connect_qp(b.qp, IV_QPT_RC, a.qpn, gid))?;
        qps.push((a, b));
    }
    let ud = ok(
        "create_qp ud",
        c.create_qp_with(&qp_request(pd.pd, cq.cq, srq.srq, IV_QPT_UD)),
    )?;
    for (mask, attr) in rts_steps(IV_QPT_UD, 0, gid) {
        ok("modify ud", c.modify_qp(ud.qp, mask, &attr))?;
    }
    let mut rts = 0;
    for (a, b) in &qps {
        for q in [a, b] {
            let s = ok("query_qp", c.query_qp(q.qp))?;
            rts += u32::from(s.attr.qp_state == IV_QPS_RTS);
        }
    }
    let _ = writeln!(
        w,
        "{} RC QPs connected in pairs, {rts} in RTS; UD QP {:#x} on the SRQ in RTS",
        pairs * 2,
        ud.qpn
    );
    if let Some((a, b)) = qps.first() {
        let q = ok("query_qp", c.query_qp(a.qp))?;
        let _ = writeln!(
            w,
            "qp {:#x} -> {:#x}: {} mtu {} sq_psn {:#x} rq_psn {:#x} timeout {} retry {} rnr_retry {}",
            a.qpn,
            b.qpn,
            state_name(q.attr.qp_state),
            128u32 << q.attr.path_mtu,
            q.attr.sq_psn,
            q.attr.rq_psn,
            q.attr.timeout,
            q.attr.retry_cnt,
            q.attr.rnr_retry
        );
        let sqd = IvQpAttr {
            qp_state: IV_QPS_SQD,
            ..IvQpAttr::default()
        };
        ok("rts->sqd", c.modify_qp(a.qp, IV_QP_STATE, &sqd))?;
        let back = IvQpAttr {
            qp_state: IV_QPS_RTS,
            ..IvQpAttr::default()
        };
        ok("sqd->rts", c.modify_qp(a.qp, IV_QP_STATE, &back))?;
        let bad = c.modify_qp(
            a.qp,
            IV_QP_STATE,
            &IvQpAttr {
                qp_state: IV_QPS_RTR,
                ..IvQpAttr::default()
            },
        );
        let _ = writeln!(
            w,
            "RTS->SQD->RTS ok; RTS->RTR refused: {}",
            status_name(bad.err().unwrap_or(0))
        );
    }
    let busy = [
        ("dealloc_pd with dependents", c.dealloc_pd(pd.pd)),
        ("destroy_cq with QPs", c.destroy_cq(cq.cq)),
        ("destroy_srq with a QP", c.destroy_srq(srq.srq)),
    ];
    for (what, r) in busy {
        let _ = writeln!(
            w,
            "{what}: {}",
            status_name(r.err().unwrap_or(STATUS_SUCCESS))
        );
    }
    let _ = writeln!(w, "closing the file with {} objects alive", 6 + pairs * 2);
    drop(c);
    dev.quiesce(std::time::Duration::from_secs(10))?;
    let pool = dev.platform().pool_stats();
    let commands = dev.soft().stats().commands_executed;
    dev.unload();
    drop(buf);
    let _ = writeln!(
        w,
        "ran down, unloaded: {commands} HCA commands, pool charges {} (live {}), verifier clean, {:.1} ms",
        pool.charges,
        pool.live,
        start.elapsed().as_secs_f64() * 1e3
    );
    Ok(out)
}
