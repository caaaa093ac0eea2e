//! The documented preconditions of the IOCTLs (`include/irpverbs.h`) that
//! the other tests of the suite do not reach, one test per IOCTL group:
//! each precondition broken once, the documented status checked, and the
//! device shown unchanged (the object still works, nothing was created).
//!
//! Together with the rest of the suite (`qp_create_checks`, `mr_checks`,
//! `reserved_fields_must_be_zero`, `cq_create_resize_limits`,
//! `srq_modify_query`, `ah_checks`, the busy rules, the handle rules and
//! `dp_work_queues_take_their_reported_depth`) and the host's CM scenarios
//! (`driver/host/tests/cm_scenarios.rs`), every precondition the header
//! states has a test.

use irpverbs_abi::*;
use zerocopy::{FromBytes, IntoBytes};

use crate::Dut;
use crate::suite::{expect, ok};
use irpverbs_verbs::Client;

fn open(d: &dyn Dut) -> Result<Client, String> {
    d.open()
        .map(Client::new)
        .map_err(|s| format!("open: {}", status_name(s)))
}

/// An IOCTL whose response (if any) is `O`: its status and response.
fn call<O: FromBytes>(
    c: &Client,
    code: u32,
    i: &(impl IntoBytes + zerocopy::Immutable),
) -> Result<O, NtStatus> {
    let (st, out) = c.raw(code, i.as_bytes(), size_of::<O>());
    if st != STATUS_SUCCESS {
        return Err(st);
    }
    O::read_from_bytes(&out[..size_of::<O>()]).map_err(|_| STATUS_BUFFER_TOO_SMALL)
}

/// An IOCTL without a response.
fn status(
    c: &Client,
    code: u32,
    i: &(impl IntoBytes + zerocopy::Immutable),
) -> Result<(), NtStatus> {
    match c.raw(code, i.as_bytes(), 0).0 {
        STATUS_SUCCESS => Ok(()),
        st => Err(st),
    }
}

/// `IOCTL_IV_QUERY_GID`: a port of the device (1 to `phys_port_cnt`), an
/// index in its table.
pub(crate) fn pre_query_gid(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let ports = u32::from(ok("query_device", c.query_device())?.phys_port_cnt);
    let len = ok("query_port", c.query_port(1))?.gid_tbl_len;
    expect("port 0", c.query_gid(0, 0), STATUS_INVALID_PARAMETER)?;
    expect(
        "past the last port",
        c.query_gid(ports + 1, 0),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "past the table",
        c.query_gid(1, len),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "index u32::MAX",
        c.query_gid(1, u32::MAX),
        STATUS_INVALID_PARAMETER,
    )?;
    ok("the last entry", c.query_gid(1, len - 1)).map(|_| ())
}

/// `IOCTL_IV_CREATE_SRQ`: depth 1 to `max_srq_wr`, SGEs 1 to
/// `max_srq_sge`, a limit below the depth.
pub(crate) fn pre_create_srq(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let dev = ok("query_device", c.query_device())?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let good = IvCreateSrqIn {
        pd,
        user_context: 0,
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
        reserved: 0,
    };
    let cases = [
        ("max_sge 0", IvCreateSrqIn { max_sge: 0, ..good }),
        (
            "max_sge over max_srq_sge",
            IvCreateSrqIn {
                max_sge: dev.max_srq_sge + 1,
                ..good
            },
        ),
        (
            "limit at the depth",
            IvCreateSrqIn {
                srq_limit: 8,
                ..good
            },
        ),
    ];
    for (what, i) in cases {
        expect(
            what,
            call::<IvCreateSrqOut>(&c, IOCTL_IV_CREATE_SRQ, &i),
            STATUS_INVALID_PARAMETER,
        )?;
    }
    expect(
        "a CQ as the PD",
        call::<IvCreateSrqOut>(
            &c,
            IOCTL_IV_CREATE_SRQ,
            &IvCreateSrqIn {
                pd: ok("create_cq", c.create_cq(1))?.cq,
                ..good
            },
        ),
        STATUS_INVALID_HANDLE,
    )?;
    // Nothing was created: the PD has no dependents.
    let srq = ok(
        "the good one",
        call::<IvCreateSrqOut>(&c, IOCTL_IV_CREATE_SRQ, &good),
    )?;
    ok("destroy srq", c.destroy_srq(srq.srq))?;
    ok("dealloc pd", c.dealloc_pd(pd))
}

/// `IOCTL_IV_CREATE_CHANNEL` (flags and reserved zero),
/// `IOCTL_IV_DESTROY_CHANNEL` (busy while CQs are bound to it), and a CQ
/// created on a channel of another file.
pub(crate) fn pre_channels(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let other = open(d)?;
    for (what, i) in [
        (
            "flags",
            IvAllocPdIn {
                flags: 1,
                reserved: 0,
            },
        ),
        (
            "reserved",
            IvAllocPdIn {
                flags: 0,
                reserved: 1,
            },
        ),
    ] {
        expect(
            what,
            call::<IvCreateChannelOut>(&c, IOCTL_IV_CREATE_CHANNEL, &i),
            STATUS_INVALID_PARAMETER,
        )?;
    }
    let ch = ok(
        "create_channel",
        call::<IvCreateChannelOut>(&c, IOCTL_IV_CREATE_CHANNEL, &IvAllocPdIn::default()),
    )?
    .channel;
    let cq_in = IvCreateCqIn {
        cqe: 4,
        comp_vector: 0,
        channel: ch,
        user_context: 0,
    };
    expect(
        "a CQ on another file's channel",
        call::<IvCreateCqOut>(&other, IOCTL_IV_CREATE_CQ, &cq_in),
        STATUS_INVALID_HANDLE,
    )?;
    let cq = ok(
        "cq on the channel",
        call::<IvCreateCqOut>(&c, IOCTL_IV_CREATE_CQ, &cq_in),
    )?
    .cq;
    let destroy = IvHandleIn { handle: ch };
    expect(
        "destroy a channel with a CQ",
        status(&c, IOCTL_IV_DESTROY_CHANNEL, &destroy),
        STATUS_DEVICE_BUSY,
    )?;
    ok("destroy cq", c.destroy_cq(cq))?;
    ok(
        "destroy channel",
        status(&c, IOCTL_IV_DESTROY_CHANNEL, &destroy),
    )?;
    expect(
        "destroy it again",
        status(&c, IOCTL_IV_DESTROY_CHANNEL, &destroy),
        STATUS_INVALID_HANDLE,
    )
}

/// `IOCTL_IV_CQ_NOTIFY` (an `IV_NOTIFY_*` and a zero reserved field),
/// `IOCTL_IV_ACK_CQ_EVENTS` (at least one event, event type zero, no more
/// than were delivered) and `IOCTL_IV_ACK_ASYNC_EVENT` (at least one, no
/// more than were delivered).
pub(crate) fn pre_notify_and_acks(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let pd = ok("alloc_pd", c.alloc_pd())?.pd;
    let cq = ok("create_cq", c.create_cq(4))?.cq;
    let qp = ok("create_qp", c.create_qp(pd, cq, IV_QPT_RC))?.qp;
    let notify = IvCqNotifyIn {
        cq,
        arm: IV_NOTIFY_SOLICITED + 1,
        reserved: 0,
    };
    expect(
        "CQ_NOTIFY with an unknown arm",
        call::<IvCqEventOut>(&c, IOCTL_IV_CQ_NOTIFY, &notify),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "CQ_NOTIFY with a reserved field",
        call::<IvCqEventOut>(
            &c,
            IOCTL_IV_CQ_NOTIFY,
            &IvCqNotifyIn {
                arm: IV_NOTIFY_NEXT,
                reserved: 1,
                ..notify
            },
        ),
        STATUS_INVALID_PARAMETER,
    )?;
    expect(
        "CQ_NOTIFY on a QP",
        call::<IvCqEventOut>(
            &c,
            IOCTL_IV_CQ_NOTIFY,
            &IvCqNotifyIn {
                cq: qp,
                arm: IV_NOTIFY_NEXT,
                reserved: 0,
            },
        ),
        STATUS_INVALID_HANDLE,
    )?;
    let ack = IvAckIn {
        handle: cq,
        count: 1,
        event_type: 0,
    };
    for (what, a, want) in [
        (
            "ACK_CQ_EVENTS of 0",
            IvAckIn { count: 0, ..ack },
            STATUS_INVALID_PARAMETER,
        ),
        (
            "ACK_CQ_EVENTS with an event type",
            IvAckIn {
                event_type: 1,
                ..ack
            },
            STATUS_INVALID_PARAMETER,
        ),
        (
            "ACK_CQ_EVENTS of none delivered",
            ack,
            STATUS_INVALID_PARAMETER,
        ),
        (
            "ACK_CQ_EVENTS of a QP",
            IvAckIn { handle: qp, ..ack },
            STATUS_INVALID_HANDLE,
        ),
    ] {
        expect(what, status(&c, IOCTL_IV_ACK_CQ_EVENTS, &a), want)?;
    }
    let aack = IvAckIn {
        handle: qp,
        count: 1,
        event_type: IV_EVENT_QP_FATAL,
    };
    for (what, a, want) in [
        (
            "ACK_ASYNC_EVENT of 0",
            IvAckIn { count: 0, ..aack },
            STATUS_INVALID_PARAMETER,
        ),
        (
            "ACK_ASYNC_EVENT of none delivered",
            aack,
            STATUS_INVALID_PARAMETER,
        ),
        (
            "ACK_ASYNC_EVENT of a PD",
            IvAckIn { handle: pd, ..aack },
            STATUS_INVALID_HANDLE,
        ),
    ] {
        expect(what, status(&c, IOCTL_IV_ACK_ASYNC_EVENT, &a), want)?;
    }
    // Nothing is held: everything destroys.
    ok("destroy qp", c.destroy_qp(qp))?;
    ok("destroy cq", c.destroy_cq(cq))?;
    ok("dealloc pd", c.dealloc_pd(pd))
}

/// `IOCTL_IV_LISTEN` (an idle CEP; a service ID without a listener),
/// `IOCTL_IV_LISTEN_ADDR` (only the device's addresses; one listener per
/// GID and service ID; an idle CEP) and `IOCTL_IV_GET_CEP_EVENT` (one at a
/// time; the CEP's destroy completes it with `STATUS_CANCELLED`).
pub(crate) fn pre_listen(d: &dyn Dut) -> Result<(), String> {
    let c = open(d)?;
    let gid = ok("query_gid", c.query_gid(1, 0))?;
    let cep = |c: &Client| {
        ok(
            "create_cep",
            call::<IvCreateCepOut>(c, IOCTL_IV_CREATE_CEP, &IvCreateCepIn { user_context: 5 }),
        )
        .map(|o| o.cep)
    };
    let (a, b, e) = (cep(&c)?, cep(&c)?, cep(&c)?);
    let sid = 0x0106_0000_0000_1234;
    let listen = |cep, service_id| status(&c, IOCTL_IV_LISTEN, &IvListenIn { cep, service_id });
    let listen_addr = |cep, service_id, gid| {
        status(
            &c,
            IOCTL_IV_LISTEN_ADDR,
            &IvListenAddrIn {
                cep,
                service_id,
                gid,
            },
        )
    };
    ok("listen", listen(a, sid))?;
    expect(
        "listen again on the CEP",
        listen(a, sid + 1),
        STATUS_INVALID_DEVICE_STATE,
    )?;
    expect("a second listener", listen(b, sid), STATUS_DEVICE_BUSY)?;
    expect(
        "LISTEN_ADDR on a listened service ID",
        listen_addr(b, sid, gid),
        STATUS_ADDRESS_ALREADY_EXISTS,
    )?;
    // An address the device does not have (TEST-NET-3, IPv4-mapped).
    let mut foreign = [0u8; 16];
    foreign[10..].copy_from_slice(&[0xFF, 0xFF, 203, 0, 113, 77]);
    if foreign != gid {
        expect(
            "LISTEN_ADDR on another host's address",
            listen_addr(b, sid + 2, foreign),
            STATUS_INVALID_ADDRESS,
        )?;
    }
    ok(
        "LISTEN_ADDR on the device's GID",
        listen_addr(b, sid + 2, gid),
    )?;
    expect(
        "LISTEN_ADDR on a listening CEP",
        listen_addr(b, sid + 3, gid),
        STATUS_INVALID_DEVICE_STATE,
    )?;
    expect(
        "LISTEN_ADDR with a PD's handle",
        listen_addr(ok("alloc_pd", c.alloc_pd())?.pd, sid + 4, [0; 16]),
        STATUS_INVALID_HANDLE,
    )?;
    // GET_CEP_EVENT: one at a time (of two, whichever comes second is
    // refused at once); the CEP's destroy cancels the pended one.
    std::thread::scope(|s| -> Result<(), String> {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..2 {
            let tx = tx.clone();
            let c = &c;
            s.spawn(move || {
                let r = call::<IvCepEventOut>(c, IOCTL_IV_GET_CEP_EVENT, &IvHandleIn { handle: e });
                let _ = tx.send(r.map(|_| ()));
            });
        }
        let first = rx.recv().map_err(|_| "a waiter panicked")?;
        expect("a second GET_CEP_EVENT", first, STATUS_DEVICE_BUSY)?;
        ok(
            "destroy the CEP",
            status(&c, IOCTL_IV_DESTROY_CEP, &IvHandleIn { handle: e }),
        )?;
        let pended = rx.recv().map_err(|_| "a waiter panicked")?;
        expect("the pended GET_CEP_EVENT", pended, STATUS_CANCELLED)
    })?;
    for h in [a, b] {
        ok(
            "destroy cep",
            status(&c, IOCTL_IV_DESTROY_CEP, &IvHandleIn { handle: h }),
        )?;
    }
    Ok(())
}
