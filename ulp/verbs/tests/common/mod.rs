//! A fake device for the speed-path tests: an IOCTL transport that
//! allocates rings for CQs, QPs and SRQs as the driver would (and frees them
//! on destroy), and doorbells that record every ring.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use irpverbs_abi::*;
use irpverbs_ring::Ring;
use irpverbs_ring::wq::{recv_stride, send_stride};
use irpverbs_verbs::{Doorbells, IoctlTransport, SpeedPath};
use zerocopy::{FromBytes, IntoBytes};

/// A doorbell as recorded: which one and the queue number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bell {
    Sq(u32),
    Rq(u32),
    Srq(u32),
    CqArm(u32),
}

/// Doorbells that record.
#[derive(Debug, Default)]
pub struct Bells(pub Mutex<Vec<Bell>>);

impl Bells {
    pub fn take(&self) -> Vec<Bell> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// The doorbell page slot the fake device's `MAP_RINGS` reports for each
/// doorbell: a different one per queue and doorbell, so that a view that
/// rings the wrong slot is caught.
pub fn slot_of(bell: Bell) -> u32 {
    match bell {
        Bell::CqArm(n) => 1000 + n,
        Bell::Sq(n) => 2000 + n,
        Bell::Rq(n) => 3000 + n,
        Bell::Srq(n) => 4000 + n,
    }
}

impl Bells {
    /// Records `bell`, which the views must ring with the slot `MAP_RINGS`
    /// reported.
    fn record(&self, bell: Bell, rung: irpverbs_verbs::Bell) {
        assert_eq!(rung.slot, slot_of(bell), "{bell:?}");
        self.0.lock().unwrap().push(bell);
    }
}

impl Doorbells for Bells {
    fn sq(&self, qp: irpverbs_verbs::Bell) {
        self.record(Bell::Sq(qp.number), qp);
    }
    fn rq(&self, qp: irpverbs_verbs::Bell) {
        self.record(Bell::Rq(qp.number), qp);
    }
    fn srq(&self, srq: irpverbs_verbs::Bell) {
        self.record(Bell::Srq(srq.number), srq);
    }
    fn cq_arm(&self, cq: irpverbs_verbs::Bell) {
        self.record(Bell::CqArm(cq.number), cq);
    }
}

/// One fake object: its kind, number and rings (owned: freed on destroy).
#[derive(Debug)]
pub struct Object {
    pub code: u32,
    pub num: u32,
    pub rings: Vec<Ring>,
    /// QPs: the CQ and SRQ handles they use.
    pub uses: Vec<IvHandle>,
}

/// What the fake device holds, shared with the test.
#[derive(Debug, Default)]
pub struct State {
    pub objects: Mutex<HashMap<IvHandle, Object>>,
    pub next: Mutex<u64>,
    pub bells: Bells,
    /// Every IOCTL code the driver received.
    pub ioctls: Mutex<Vec<u32>>,
}

impl State {
    pub fn live(&self) -> usize {
        self.objects.lock().unwrap().len()
    }

    pub fn received(&self, code: u32) -> usize {
        self.ioctls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| **c == code)
            .count()
    }

    fn insert(&self, code: u32, rings: Vec<Ring>, uses: Vec<IvHandle>) -> (IvHandle, u32) {
        let mut next = self.next.lock().unwrap();
        *next += 1;
        let h = 0x100 + *next;
        let num = 0x40 + *next as u32;
        self.objects.lock().unwrap().insert(
            h,
            Object {
                code,
                num,
                rings,
                uses,
            },
        );
        (h, num)
    }
}

/// What a user-mode create response carries: the geometry, no addresses
/// (the ULP maps the rings with `IOCTL_IV_MAP_RINGS`).
fn geometry(ring: &Ring) -> IvRingMap {
    IvRingMap {
        entries: ring.entries(),
        stride: ring.stride(),
        ..IvRingMap::default()
    }
}

/// The fake device's file: the only path to its objects.
#[derive(Debug)]
pub struct FakeFile(pub Arc<State>);

fn ok<T: IntoBytes + zerocopy::Immutable>(t: &T) -> (NtStatus, Vec<u8>) {
    (STATUS_SUCCESS, t.as_bytes().to_vec())
}

impl IoctlTransport for FakeFile {
    fn ioctl(&self, code: u32, input: &[u8], _output_len: usize) -> (NtStatus, Vec<u8>) {
        let s = &self.0;
        s.ioctls.lock().unwrap().push(code);
        match code {
            IOCTL_IV_CREATE_CQ => {
                let i = IvCreateCqIn::read_from_bytes(input).unwrap();
                let cqe = (i.cqe + 1).next_power_of_two() - 1;
                let ring = Ring::alloc(cqe + 1, 64).unwrap();
                let map = geometry(&ring);
                let (cq, cqn) = s.insert(code, vec![ring], vec![]);
                ok(&IvCreateCqOut {
                    cq,
                    cqn,
                    cqe,
                    ring: map,
                })
            }
            IOCTL_IV_RESIZE_CQ => {
                let i = IvResizeCqIn::read_from_bytes(input).unwrap();
                let mut objects = s.objects.lock().unwrap();
                let Some(o) = objects.get_mut(&i.cq) else {
                    return (STATUS_INVALID_HANDLE, vec![]);
                };
                if i.cqe == 0 {
                    return (STATUS_INVALID_PARAMETER, vec![]);
                }
                let cqe = (i.cqe + 1).next_power_of_two() - 1;
                let ring = Ring::alloc(cqe + 1, 64).unwrap();
                let map = geometry(&ring);
                o.rings = vec![ring];
                ok(&IvResizeCqOut {
                    cqe,
                    reserved: 0,
                    ring: map,
                })
            }
            IOCTL_IV_CREATE_QP => {
                let i = IvCreateQpIn::read_from_bytes(input).unwrap();
                let c = i.cap;
                let sq = Ring::alloc(
                    (c.max_send_wr + 1).next_power_of_two(),
                    send_stride(c.max_send_sge, c.max_inline_data),
                )
                .unwrap();
                let mut out = IvCreateQpOut {
                    cap: c,
                    sq: geometry(&sq),
                    ..IvCreateQpOut::default()
                };
                let mut rings = vec![sq];
                if i.srq == 0 {
                    let rq = Ring::alloc(
                        (c.max_recv_wr + 1).next_power_of_two(),
                        recv_stride(c.max_recv_sge),
                    )
                    .unwrap();
                    out.rq = geometry(&rq);
                    rings.push(rq);
                }
                let mut uses = vec![i.send_cq, i.recv_cq];
                if i.srq != 0 {
                    uses.push(i.srq);
                }
                (out.qp, out.qpn) = s.insert(code, rings, uses);
                ok(&out)
            }
            IOCTL_IV_CREATE_SRQ => {
                let i = IvCreateSrqIn::read_from_bytes(input).unwrap();
                let ring = Ring::alloc((i.max_wr + 1).next_power_of_two(), recv_stride(i.max_sge))
                    .unwrap();
                let map = geometry(&ring);
                let (srq, srqn) = s.insert(code, vec![ring], vec![]);
                ok(&IvCreateSrqOut {
                    srq,
                    srqn,
                    max_wr: i.max_wr,
                    max_sge: i.max_sge,
                    reserved: 0,
                    ring: map,
                })
            }
            IOCTL_IV_DESTROY_CQ | IOCTL_IV_DESTROY_QP | IOCTL_IV_DESTROY_SRQ => {
                let h = IvHandleIn::read_from_bytes(input).unwrap().handle;
                let mut objects = s.objects.lock().unwrap();
                if objects.values().any(|o| o.uses.contains(&h)) {
                    return (STATUS_DEVICE_BUSY, vec![]);
                }
                match objects.remove(&h) {
                    Some(o) => {
                        // Freed now: a view left over would dangle.
                        drop(o);
                        (STATUS_SUCCESS, vec![])
                    }
                    None => (STATUS_INVALID_HANDLE, vec![]),
                }
            }
            IOCTL_IV_MAP_RINGS => {
                let h = IvHandleIn::read_from_bytes(input).unwrap().handle;
                let objects = s.objects.lock().unwrap();
                let Some(o) = objects.get(&h) else {
                    return (STATUS_INVALID_HANDLE, vec![]);
                };
                let mut rings = o.rings.iter().map(Ring::map);
                let (ring_doorbell, rq_doorbell) = match o.code {
                    IOCTL_IV_CREATE_CQ => (slot_of(Bell::CqArm(o.num)), IV_DOORBELL_NONE),
                    IOCTL_IV_CREATE_SRQ => (slot_of(Bell::Srq(o.num)), IV_DOORBELL_NONE),
                    _ if o.rings.len() == 2 => (slot_of(Bell::Sq(o.num)), slot_of(Bell::Rq(o.num))),
                    _ => (slot_of(Bell::Sq(o.num)), IV_DOORBELL_NONE),
                };
                ok(&IvMapRingsOut {
                    ring: rings.next().unwrap_or_default(),
                    rq: rings.next().unwrap_or_default(),
                    ring_doorbell,
                    rq_doorbell,
                })
            }
            IOCTL_IV_MODIFY_QP => (STATUS_SUCCESS, vec![]),
            _ => (STATUS_INVALID_DEVICE_REQUEST, vec![]),
        }
    }
}

// SAFETY: a `FakeFile` is the only path to its objects: the test's `State`
// handle is used to look, never to destroy, and objects are freed only by
// the destroy IOCTLs this transport receives.
unsafe impl SpeedPath for FakeFile {
    fn doorbells(&self) -> &dyn Doorbells {
        &self.0.bells
    }
}

/// A client over a fresh fake device, and the device's state.
pub fn client() -> (irpverbs_verbs::Client, Arc<State>) {
    let state = Arc::new(State::default());
    let c = irpverbs_verbs::Client::with_speed_path(Box::new(FakeFile(Arc::clone(&state))));
    (c, state)
}

/// A create-QP request: depth 8, `sge` SGEs, `inline` bytes inline.
pub fn qp_in(cq: IvHandle, srq: IvHandle, sge: u32, inline: u32) -> IvCreateQpIn {
    IvCreateQpIn {
        send_cq: cq,
        recv_cq: cq,
        srq,
        qp_type: IV_QPT_RC,
        cap: IvQpCap {
            max_send_wr: 7,
            max_recv_wr: if srq == 0 { 7 } else { 0 },
            max_send_sge: sge,
            max_recv_sge: if srq == 0 { sge } else { 0 },
            max_inline_data: inline,
            reserved: 0,
        },
        ..IvCreateQpIn::default()
    }
}

/// A create-CQ request for `cqe` entries.
pub fn cq_in(cqe: u32) -> IvCreateCqIn {
    IvCreateCqIn {
        cqe,
        ..IvCreateCqIn::default()
    }
}

/// An SGE.
pub fn sge(addr: u64, length: u32) -> IvSge {
    IvSge {
        addr,
        length,
        lkey: 0x77,
    }
}
