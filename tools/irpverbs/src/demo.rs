//! `irpverbs demo`: the driver in host mode on the soft HCA doing real
//! control-path work, end to end through IOCTLs, then unloading under the
//! verifier's leak checks.

use std::fmt::Write;
use std::time::Instant;

use irpverbs_abi::*;
use irpverbs_verbs::{Client, IntoClient, av, qp_request, rts_steps};

use irpverbs_host::device::{Engine, HostDevice, HostDeviceConfig};

fn ok<T>(what: &str, r: Result<T, NtStatus>) -> Result<T, String> {
    r.map_err(|s| format!("{what}: {}", status_name(s)))
}

fn state_name(s: u32) -> &'static str {
    ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"]
        .get(s as usize)
        .copied()
        .unwrap_or("?")
}

/// Moves data between two connected RC QPs through the speed path (rings
/// and doorbells, no IOCTL per message) and checks every byte.
fn data_path(c: &Client, pd: IvHandle, gid: [u8; 16], w: &mut String) -> Result<(), String> {
    use irpverbs_ring::SendWr;
    let post = |r: Result<(), irpverbs_ring::PostError>| r.map_err(|e| format!("post: {e:?}"));
    let cq = ok(
        "create_cq",
        c.new_cq(&IvCreateCqIn {
            cqe: 64,
            ..Default::default()
        }),
    )?;
    let req = qp_request(pd, cq.handle(), 0, IV_QPT_RC);
    let a = ok("create_qp", c.new_qp(&req))?;
    let b = ok("create_qp", c.new_qp(&req))?;
    for (qp, dest) in [(&a, b.qpn()), (&b, a.qpn())] {
        for (mask, mut attr) in rts_steps(IV_QPT_RC, dest, gid) {
            if attr.qp_state == IV_QPS_INIT {
                attr.qp_access_flags |= IV_ACCESS_REMOTE_ATOMIC;
            }
            ok("modify_qp", qp.modify(mask, &attr))?;
        }
    }
    let mut abuf = vec![0u8; 4096];
    let bbuf = vec![0u8; 4096];
    for (i, x) in abuf.iter_mut().enumerate() {
        *x = (i * 7 % 251) as u8;
    }
    let am = ok(
        "reg_mr",
        c.reg_mr(pd, abuf.as_ptr() as u64, 4096, IV_ACCESS_ALL),
    )?;
    let bm = ok(
        "reg_mr",
        c.reg_mr(pd, bbuf.as_ptr() as u64, 4096, IV_ACCESS_ALL),
    )?;
    let sge = |buf: &Vec<u8>, mr: &IvRegMrOut, off: u64, len: u32| IvSge {
        addr: buf.as_ptr() as u64 + off,
        length: len,
        lkey: mr.lkey,
    };
    let mut cqes = [IvCqe::default(); 8];
    let mut wait = |n: usize| -> Result<Vec<IvCqe>, String> {
        let mut got = Vec::new();
        for _ in 0..1_000_000 {
            let k = cq.poll(&mut cqes).map_err(|_| "corrupt CQ".to_string())?;
            got.extend_from_slice(&cqes[..k]);
            if got.len() >= n {
                break;
            }
        }
        match got.iter().find(|c| c.status != IV_WC_SUCCESS) {
            Some(bad) => Err(format!(
                "completion failed: {}",
                irpverbs_verbs::speed::wc_status_name(bad.status)
            )),
            None if got.len() < n => Err("completions missing".into()),
            None => Ok(got),
        }
    };
    // SEND 1 KiB from A into a receive buffer of B.
    post(b.post_recv(1, &[sge(&bbuf, &bm, 0, 1024)]))?;
    post(a.post_send(&SendWr {
        wr_id: 2,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(&abuf, &am, 0, 1024)],
        ..SendWr::default()
    }))?;
    let got = wait(2)?;
    let recv = got
        .iter()
        .find(|c| c.opcode == IV_WC_OP_RECV)
        .ok_or("no receive completion")?;
    let same = |boff: usize, aoff: usize, len: usize| {
        read_back(&bbuf, boff, len) == abuf[aoff..aoff + len]
    };
    if recv.byte_len != 1024 || !same(0, 0, 1024) {
        return Err("SEND data differs".into());
    }
    // RDMA WRITE 2 KiB into B at offset 1 KiB, then READ it back into A.
    post(a.post_send(&SendWr {
        wr_id: 3,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(&abuf, &am, 1024, 2048)],
        remote_addr: bbuf.as_ptr() as u64 + 1024,
        rkey: bm.rkey,
        ..SendWr::default()
    }))?;
    wait(1)?;
    if !same(1024, 1024, 2048) {
        return Err("RDMA WRITE data differs".into());
    }
    post(a.post_send(&SendWr {
        wr_id: 4,
        opcode: IV_WR_RDMA_READ,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(&abuf, &am, 3072, 512)],
        remote_addr: bbuf.as_ptr() as u64 + 1024,
        rkey: bm.rkey,
        ..SendWr::default()
    }))?;
    wait(1)?;
    if read_back(&abuf, 3072, 512) != read_back(&bbuf, 1024, 512) {
        return Err("RDMA READ data differs".into());
    }
    // Fetch-and-add on an 8-byte counter in B.
    for _ in 0..3 {
        post(a.post_send(&SendWr {
            wr_id: 5,
            opcode: IV_WR_ATOMIC_FETCH_AND_ADD,
            flags: IV_SEND_SIGNALED,
            sges: &[sge(&abuf, &am, 4088, 8)],
            remote_addr: bbuf.as_ptr() as u64 + 4088,
            rkey: bm.rkey,
            compare_add: 5,
            ..SendWr::default()
        }))?;
        wait(1)?;
    }
    let counter = u64::from_le_bytes(read_back(&bbuf, 4088, 8).try_into().unwrap_or([0; 8]));
    if counter != 15 {
        return Err(format!("fetch-and-add counter {counter}, want 15"));
    }
    let _ = writeln!(
        w,
        "data path: SEND 1 KiB, RDMA WRITE 2 KiB, RDMA READ 512 B, 3 fetch-and-adds between QPs {:#x} and {:#x}: every byte checked",
        a.qpn(),
        b.qpn()
    );
    drop((a, b, cq));
    ok("dereg_mr", c.dereg_mr(am.mr))?;
    ok("dereg_mr", c.dereg_mr(bm.mr))?;
    drop((abuf, bbuf));
    Ok(())
}

/// Reads registered memory the HCA wrote behind Rust's back: volatile, so
/// the compiler cannot assume the buffer still holds what Rust last wrote.
#[allow(unsafe_code)]
fn read_back(buf: &[u8], off: usize, len: usize) -> Vec<u8> {
    buf[off..off + len]
        .iter()
        .map(|b| {
            // SAFETY: `b` is a valid reference into a live buffer; the read
            // is volatile because the HCA writes registered memory.
            unsafe { std::ptr::read_volatile(b) }
        })
        .collect()
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
    let c = file.into_client();
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
    data_path(&c, pd.pd, gid, w)?;
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
    // The connection manager: RC connections between two more host
    // devices on a (fault-free) simulated wire, each made by one
    // CM_CONNECT request and one CM_ACCEPT request.
    let cm = crate::bench::cm_connect_one_thread(256, 64, true)?;
    let _ = writeln!(
        w,
        "connection manager: {} RC connections between two host devices (REQ, REP, RTU as RoCEv2 MADs on their GSIs; each one CM_CONNECT and one CM_ACCEPT request, {} in flight), all established, verifier clean, {:.1} ms",
        cm.connections,
        cm.window,
        cm.elapsed.as_secs_f64() * 1e3
    );
    Ok(out)
}
