//! The soft HCA's link model in host mode, verifier on: the host takes the
//! port down and up ([`HostDevice::set_port_link`]); `QueryPort` and the
//! async events `PORT_ERR` / `PORT_ACTIVE` follow, an RC send on a down
//! port runs out its retries (`RETRY_EXC_ERR`, the QP in ERR, as on rxe
//! and mlx5) while a UD send completes with its datagram lost, and
//! traffic flows again after up on new QPs and on QPs taken through
//! RESET; every open file sees the events. A firmware error
//! injected apart from removal makes the device fatal: `DEVICE_FATAL`,
//! every QP in ERR with its work flushed, verbs but destroys failing with
//! `STATUS_DEVICE_HARDWARE_ERROR`, and a clean close and unload.

use std::sync::Arc;

use irpverbs_abi::*;
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_verbs::{Client, IntoClient};

mod common;
use common::{End, send};

crate::on_each_backend!(
    a_port_taken_down_fails_rc_sends_and_traffic_resumes_after_up,
    every_file_sees_the_port_events,
    a_firmware_error_makes_the_device_fatal_and_it_still_closes_clean,
    a_ud_send_on_a_down_port_completes_and_nothing_arrives,
);

fn client(dev: &Arc<HostDevice>) -> Client {
    dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client()
}

/// Connects `a` and `b` to each other (loopback on one port).
fn connect(dev: &HostDevice, a: &End<'_>, b: &End<'_>) {
    let gid = dev.soft().gid();
    a.qp.connect(b.qp.qpn(), gid).unwrap();
    b.qp.connect(a.qp.qpn(), gid).unwrap();
}

/// A SEND from `a` to `b` arrives: both complete with success.
fn exchange(a: &End<'_>, b: &End<'_>, id: u64) {
    b.qp.post_recv(id, &[b.sge(0, 64)]).unwrap();
    a.mem.fill(0, &[id as u8; 64]);
    send(a, id, 64);
    let (sw, rw) = (a.wc(), b.wc());
    assert_eq!((sw.wr_id, sw.status), (id, IV_WC_SUCCESS));
    assert_eq!((rw.wr_id, rw.status, rw.byte_len), (id, IV_WC_SUCCESS, 64));
    assert_eq!(b.mem.read(0, 64), vec![id as u8; 64]);
}

fn port(c: &Client) -> (u32, u32) {
    let p = c.query_port(1).unwrap();
    (p.state, p.phys_state)
}

fn a_port_taken_down_fails_rc_sends_and_traffic_resumes_after_up(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let c = client(&dev);
    let (a, b) = (End::new_rc(&c), End::new_rc(&c));
    connect(&dev, &a, &b);
    assert_eq!(port(&c), (IV_PORT_ACTIVE, 5));
    exchange(&a, &b, 1);

    // Down: the state, PORT_ERR (once), and an RC send runs out its
    // retries.
    assert!(dev.set_port_link(false));
    assert!(!dev.set_port_link(false), "already down: no change");
    assert_eq!(port(&c), (IV_PORT_DOWN, 3));
    let ev = c.get_async_event().unwrap();
    assert_eq!((ev.event_type, ev.port_num), (IV_EVENT_PORT_ERR, 1));
    b.qp.post_recv(2, &[b.sge(0, 64)]).unwrap();
    send(&a, 2, 64);
    send(&a, 3, 64);
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (2, IV_WC_RETRY_EXC_ERR));
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (3, IV_WC_WR_FLUSH_ERR));
    assert_eq!(a.qp.query().unwrap().attr.qp_state, IV_QPS_ERR);
    // Nothing reached B.
    assert_eq!(b.cq.poll(&mut [IvCqe::default(); 1]).unwrap(), 0);

    // Up: PORT_ACTIVE, and traffic on new QPs and on QPs taken through
    // RESET.
    assert!(dev.set_port_link(true));
    assert_eq!(port(&c), (IV_PORT_ACTIVE, 5));
    let ev = c.get_async_event().unwrap();
    assert_eq!((ev.event_type, ev.port_num), (IV_EVENT_PORT_ACTIVE, 1));
    let (a2, b2) = (End::new_rc(&c), End::new_rc(&c));
    connect(&dev, &a2, &b2);
    exchange(&a2, &b2, 4);
    let reset = IvQpAttr {
        qp_state: IV_QPS_RESET,
        ..IvQpAttr::default()
    };
    a.qp.modify(IV_QP_STATE, &reset).unwrap();
    b.qp.modify(IV_QP_STATE, &reset).unwrap();
    connect(&dev, &a, &b);
    exchange(&a, &b, 5);
    drop((a, b, a2, b2));
    drop(c);
    dev.quiesce(std::time::Duration::from_secs(10))
        .expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
}

/// The port's events reach every open file, user-mode and kernel-mode
/// (a kernel ULP's internal `IOCTL_IV_GET_ASYNC_EVENT`).
fn every_file_sees_the_port_events(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let (c1, c2) = (client(&dev), client(&dev));
    let k = dev.open_kernel().expect("open kernel").into_client();
    assert!(dev.set_port_link(false));
    for c in [&c1, &c2, &k] {
        let ev = c.get_async_event().unwrap();
        assert_eq!((ev.event_type, ev.port_num), (IV_EVENT_PORT_ERR, 1));
    }
    assert!(dev.set_port_link(true));
    for c in [&c1, &c2, &k] {
        let ev = c.get_async_event().unwrap();
        assert_eq!((ev.event_type, ev.port_num), (IV_EVENT_PORT_ACTIVE, 1));
    }
}

/// A firmware error: `DEVICE_FATAL` to every file, every QP in ERR with
/// its outstanding work flushed (and later work too), every verb but the
/// destroys failing with `STATUS_DEVICE_HARDWARE_ERROR`; files close and
/// the driver unloads with nothing leaked.
fn a_firmware_error_makes_the_device_fatal_and_it_still_closes_clean(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let (c, other) = (client(&dev), client(&dev));
    let (a, b) = (End::new_rc(&c), End::new_rc(&c));
    connect(&dev, &a, &b);
    exchange(&a, &b, 1);
    b.qp.post_recv(2, &[b.sge(0, 64)]).unwrap();
    b.qp.post_recv(3, &[b.sge(64, 64)]).unwrap();

    assert!(dev.inject_fatal_error());
    assert!(!dev.inject_fatal_error(), "fatal once");
    for f in [&c, &other] {
        let ev = f.get_async_event().unwrap();
        assert_eq!(ev.event_type, IV_EVENT_DEVICE_FATAL);
    }
    // B's receives are flushed; a send posted now on A is flushed too.
    for id in [2, 3] {
        let wc = b.wc();
        assert_eq!((wc.wr_id, wc.status), (id, IV_WC_WR_FLUSH_ERR));
    }
    send(&a, 4, 64);
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (4, IV_WC_WR_FLUSH_ERR));
    // Verbs fail with the documented status; the port stays down.
    assert_eq!(c.alloc_pd().unwrap_err(), STATUS_DEVICE_HARDWARE_ERROR);
    assert_eq!(c.query_port(1).unwrap_err(), STATUS_DEVICE_HARDWARE_ERROR);
    assert_eq!(
        a.qp.modify(
            IV_QP_STATE,
            &IvQpAttr {
                qp_state: IV_QPS_RESET,
                ..IvQpAttr::default()
            }
        )
        .unwrap_err(),
        STATUS_DEVICE_HARDWARE_ERROR
    );
    assert!(!dev.set_port_link(true), "a fatal device's port stays down");
    // Destroys still succeed: everything closes, nothing leaks.
    drop((a, b));
    drop((c, other));
    dev.quiesce(std::time::Duration::from_secs(10))
        .expect("quiescent");
    assert_eq!(dev.platform().pool_stats().live, 0, "pool leaked");
    dev.unload();
}

/// A UD send on a down port completes successfully (the datagram is lost
/// on the wire, as on rxe and mlx5) and nothing arrives; after up the same
/// QPs talk again (UD QPs do not go to an error state for lost datagrams).
fn a_ud_send_on_a_down_port_completes_and_nothing_arrives(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let c = client(&dev);
    let (a, b) = (End::new_ud(&c), End::new_ud(&c));
    let gid = dev.soft().gid();
    a.qp.connect(0, gid).unwrap();
    b.qp.connect(0, gid).unwrap();
    let ah = c.create_ah(a.pd, &irpverbs_verbs::av(gid)).unwrap();
    let ud_send = |id: u64| {
        a.qp.post_send(&irpverbs_verbs::SendWr {
            wr_id: id,
            opcode: IV_WR_SEND,
            flags: IV_SEND_SIGNALED,
            sges: &[a.sge(0, 32)],
            ud: Some((ah.ahn, b.qp.qpn(), 0x1111_1111)),
            ..irpverbs_verbs::SendWr::default()
        })
        .unwrap();
    };
    b.qp.post_recv(1, &[b.sge(0, 32 + 40)]).unwrap();
    assert!(dev.set_port_link(false));
    ud_send(10);
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (10, IV_WC_SUCCESS));
    assert_eq!(b.cq.poll(&mut [IvCqe::default(); 1]).unwrap(), 0);
    assert!(dev.set_port_link(true));
    ud_send(11);
    let wc = a.wc();
    assert_eq!((wc.wr_id, wc.status), (11, IV_WC_SUCCESS));
    let rw = b.wc();
    assert_eq!((rw.wr_id, rw.status), (1, IV_WC_SUCCESS));
    c.destroy_ah(ah.ah).unwrap();
}
