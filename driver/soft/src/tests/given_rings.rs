//! Queues on memory the device was given ([`SoftHca::post_command_on_rings`]):
//! the firmware of the model HCA's device runs on rings its driver
//! allocated, and lets go of them when the queue goes.

use irpverbs_abi::{IV_QPT_RC, STATUS_INVALID_PARAMETER, STATUS_SUCCESS};
use irpverbs_core::{Command, CommandOut, CreateCq, CreateQp, Event, Hca};
use irpverbs_ring::{Region, Ring, Shared};

use super::util::{Dev, cap};
use crate::SoftHca;

type Given = [Option<Shared<Region>>; 2];

/// Runs `command` on `rings` and returns its completion.
fn exec_on(d: &Dev, command: Command, rings: Given) -> (i32, CommandOut) {
    let token = d.token();
    d.hca.post_command_on_rings(token, command, rings).unwrap();
    loop {
        match d.hca.poll_event() {
            Some(Event::CommandDone {
                token: t,
                status,
                out,
            }) if t == token => {
                return (status, out);
            }
            Some(_) => {}
            None => panic!("no completion"),
        }
    }
}

fn memory(bytes: usize) -> Shared<Region> {
    Shared::try_new(Region::alloc(bytes).unwrap()).unwrap()
}

/// Whether the caller holds the only reference to `r` (the firmware let
/// go of it).
fn only_ours(r: &mut Shared<Region>) -> bool {
    Shared::get_mut(r).is_some()
}

#[test]
fn a_cq_and_a_qp_run_on_the_memory_they_were_given_and_let_go_of_it() {
    let d = Dev::inline();
    let CommandOut::Pd { pdn } = d.exec(Command::AllocPd).1 else {
        panic!()
    };
    let cq_len = Ring::alloc_len(64, 64).unwrap();
    let mut cq_mem = memory(cq_len);
    let cq = Command::CreateCq(CreateCq {
        cqe: 63,
        comp_vector: 0,
    });
    // No memory, or too little: refused, nothing kept.
    assert_eq!(
        exec_on(&d, cq.clone(), [None, None]).0,
        STATUS_INVALID_PARAMETER
    );
    let mut small = memory(4096);
    assert_eq!(
        exec_on(&d, cq.clone(), [Some(small.clone()), None]).0,
        STATUS_INVALID_PARAMETER
    );
    assert!(only_ours(&mut small));
    let (status, out) = exec_on(&d, cq, [Some(cq_mem.clone()), None]);
    assert_eq!(status, STATUS_SUCCESS);
    let CommandOut::Cq { cqn, ring, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(
        ring.region().addr(),
        cq_mem.addr(),
        "the ring is the given memory"
    );
    assert_eq!(ring.entries(), 64);
    drop(ring);
    // A QP: send queue and receive queue each on its own memory.
    let c = cap();
    let sq_len = Ring::alloc_len(32, irpverbs_ring::wq::send_stride(2, 64)).unwrap();
    let rq_len = Ring::alloc_len(32, irpverbs_ring::wq::recv_stride(2)).unwrap();
    let (mut sq_mem, mut rq_mem) = (memory(sq_len), memory(rq_len));
    let qp = Command::CreateQp(CreateQp {
        pdn,
        qp_type: IV_QPT_RC,
        send_cqn: cqn,
        recv_cqn: cqn,
        srqn: None,
        sq_sig_all: false,
        cap: c,
    });
    // Without its receive queue's memory: refused, the send queue's let go.
    assert_eq!(
        exec_on(&d, qp.clone(), [Some(sq_mem.clone()), None]).0,
        STATUS_INVALID_PARAMETER
    );
    assert!(only_ours(&mut sq_mem));
    let (status, out) = exec_on(&d, qp, [Some(sq_mem.clone()), Some(rq_mem.clone())]);
    assert_eq!(status, STATUS_SUCCESS);
    let CommandOut::Qp { qpn, sq, rq, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(sq.region().addr(), sq_mem.addr());
    assert_eq!(rq.as_ref().map(|r| r.region().addr()), Some(rq_mem.addr()));
    drop((sq, rq));
    assert!(!only_ours(&mut sq_mem) && !only_ours(&mut rq_mem));
    // Destroyed: the memory is not kept for reuse.
    assert_eq!(d.exec(Command::DestroyQp { qpn }).0, STATUS_SUCCESS);
    assert!(only_ours(&mut sq_mem) && only_ours(&mut rq_mem));
    assert!(!only_ours(&mut cq_mem));
    assert_eq!(d.exec(Command::DestroyCq { cqn }).0, STATUS_SUCCESS);
    assert!(only_ours(&mut cq_mem));
    // The firmware's own rings are still its own (and pooled).
    assert_eq!(
        d.exec(Command::CreateCq(CreateCq {
            cqe: 7,
            comp_vector: 0
        }))
        .0,
        STATUS_SUCCESS
    );
}

#[test]
fn a_resize_moves_to_the_given_memory_and_lets_go_of_the_old() {
    let d = Dev::inline();
    let mut first = memory(Ring::alloc_len(8, 64).unwrap());
    let (_, out) = exec_on(
        &d,
        Command::CreateCq(CreateCq {
            cqe: 7,
            comp_vector: 0,
        }),
        [Some(first.clone()), None],
    );
    let CommandOut::Cq { cqn, ring, .. } = out else {
        panic!("{out:?}")
    };
    drop(ring);
    let mut second = memory(Ring::alloc_len(32, 64).unwrap());
    let (status, out) = exec_on(
        &d,
        Command::ResizeCq { cqn, cqe: 31 },
        [Some(second.clone()), None],
    );
    assert_eq!(status, STATUS_SUCCESS);
    let CommandOut::Cq { ring, .. } = out else {
        panic!("{out:?}")
    };
    assert_eq!(ring.region().addr(), second.addr());
    drop(ring);
    assert!(only_ours(&mut first));
    assert!(!only_ours(&mut second));
}

#[test]
fn only_an_inline_engine_runs_on_given_memory() {
    let d = Dev::deferred();
    let hca: &SoftHca<_> = &d.hca;
    let cq = Command::CreateCq(CreateCq {
        cqe: 7,
        comp_vector: 0,
    });
    assert!(hca.post_command_on_rings(1, cq, [None, None]).is_err());
    assert!(hca.poll_event().is_none());
}
