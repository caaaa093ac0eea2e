//! A Rust ULP in a few dozen lines: the driver in host mode over the soft
//! HCA, two RC QPs connected to each other, a SEND and an RDMA WRITE
//! through the speed path, the data checked, everything destroyed and the
//! device unloaded under the verifier's leak check.
//!
//! `cargo run -p irpverbs-host --example quickstart`

use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_host::HostDevice;
use irpverbs_verbs::{Cq, IntoClient, SendWr, Wc};

fn main() -> Result<(), String> {
    // The driver and its soft HCA, loaded in this process (verifier on).
    let dev = HostDevice::with_defaults();
    let client = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .map_err(|s| format!("open: {s:#x}"))?
        .into_client();
    let st = |what: &str, s: NtStatus| format!("{what}: {}", status_name(s));

    // Control verbs: each is an IOCTL the driver completes asynchronously.
    let pd = client.alloc_pd().map_err(|s| st("alloc_pd", s))?.pd;
    let mut buf = vec![0u8; 8192];
    let base = buf.as_mut_ptr() as u64;
    let access = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;
    let mr = client
        .reg_mr(pd, base, buf.len() as u64, access)
        .map_err(|s| st("reg_mr", s))?;
    let cq_in = IvCreateCqIn {
        cqe: 16,
        ..IvCreateCqIn::default()
    };
    let cq_a = client.new_cq(&cq_in).map_err(|s| st("create_cq", s))?;
    let cq_b = client.new_cq(&cq_in).map_err(|s| st("create_cq", s))?;
    let qp_in = |cq: IvHandle| IvCreateQpIn {
        pd,
        send_cq: cq,
        recv_cq: cq,
        qp_type: IV_QPT_RC,
        cap: IvQpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            ..IvQpCap::default()
        },
        ..IvCreateQpIn::default()
    };
    let a = client
        .new_qp(&qp_in(cq_a.handle()))
        .map_err(|s| st("create_qp", s))?;
    let b = client
        .new_qp(&qp_in(cq_b.handle()))
        .map_err(|s| st("create_qp", s))?;
    // INIT, RTR, RTS with each other as the remote QP.
    let gid = client.query_gid(1, 0).map_err(|s| st("query_gid", s))?;
    a.connect(b.qpn(), gid).map_err(|s| st("modify_qp a", s))?;
    b.connect(a.qpn(), gid).map_err(|s| st("modify_qp b", s))?;

    // The speed path: direct calls on the mapped rings, no IOCTL.
    let sge = |off: u64, len: u32| IvSge {
        addr: base + off,
        length: len,
        lkey: mr.lkey,
    };
    buf[..5].copy_from_slice(b"hello");
    b.post_recv(1, &[sge(4096, 64)])
        .map_err(|e| format!("{e:?}"))?;
    a.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 5)],
        ..SendWr::default()
    })
    .map_err(|e| format!("{e:?}"))?;
    wait(&cq_a)?;
    let recv = wait(&cq_b)?;
    println!("SEND: {recv}, {:?}", std::str::from_utf8(&buf[4096..4101]));

    a.post_send(&SendWr {
        wr_id: 3,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(0, 5)],
        remote_addr: base + 6000,
        rkey: mr.rkey,
        ..SendWr::default()
    })
    .map_err(|e| format!("{e:?}"))?;
    println!("RDMA WRITE: {}", wait(&cq_a)?);
    if &buf[6000..6005] != b"hello" {
        return Err("the WRITE's data did not arrive".into());
    }

    // Destroy children first (a PD with dependents would be busy), then
    // unload: the verifier bugchecks on any allocation still out.
    a.destroy().map_err(|(_, s)| st("destroy_qp", s))?;
    b.destroy().map_err(|(_, s)| st("destroy_qp", s))?;
    cq_a.destroy().map_err(|(_, s)| st("destroy_cq", s))?;
    cq_b.destroy().map_err(|(_, s)| st("destroy_cq", s))?;
    client.dereg_mr(mr.mr).map_err(|s| st("dereg_mr", s))?;
    client.dealloc_pd(pd).map_err(|s| st("dealloc_pd", s))?;
    drop(client);
    dev.quiesce(Duration::from_secs(10))?;
    dev.unload();
    println!("unloaded, nothing leaked");
    Ok(())
}

/// Polls `cq` until one completion arrives; fails on an error status.
fn wait(cq: &Cq<'_>) -> Result<String, String> {
    let mut out = [IvCqe::default(); 1];
    for _ in 0..1_000_000 {
        if cq.poll(&mut out).map_err(|e| format!("{e:?}"))? == 1 {
            let wc = Wc::new(&out[0]);
            return if wc.is_success() {
                Ok(wc.to_string())
            } else {
                Err(format!("completion failed: {wc}"))
            };
        }
        std::thread::yield_now();
    }
    Err("no completion".into())
}
