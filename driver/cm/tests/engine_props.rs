//! Engines mid-connection take any MAD — random bodies carrying the
//! communication IDs of live CEPs, at any time — without panicking, and
//! still end with every CEP at rest and nothing left once destroyed.

mod common;

use common::*;
use irpverbs_cm::msg::{self, attr};
use irpverbs_cm::{CepId, Event, State};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Hostile {
    to: usize,
    attr: u16,
    /// Indices into the live IDs (or random IDs when out of range).
    local: usize,
    remote: usize,
    body: Vec<u8>,
    /// Aimed at a live connection end rather than at random IDs.
    aimed: bool,
    /// Nanoseconds to run before it arrives.
    after: u64,
}

fn hostile() -> impl Strategy<Value = Hostile> {
    (
        0..2usize,
        prop_oneof![
            attr::REQ..=attr::APR,
            Just(attr::CLASS_PORT_INFO),
            Just(0x0020u16)
        ],
        0..12usize,
        0..12usize,
        proptest::collection::vec(any::<u8>(), msg::MAD_DATA_SIZE),
        prop_oneof![0..50_000u64, 0..3_000_000u64, 0..30_000_000u64],
        any::<bool>(),
    )
        .prop_map(|(to, attr, local, remote, body, after, aimed)| Hostile {
            to,
            attr,
            local,
            remote,
            body,
            after,
            aimed,
        })
}

/// A live connection end: (node, its ID, the remote's ID, its QPN).
type End = (usize, u32, u32, Option<u32>);

/// Aims the MAD at a live connection end: its IDs, CA GUID and QPN.
fn aim(h: &mut Hostile, ends: &[End]) -> Option<[u8; 4]> {
    let &(n, ours, theirs, qpn) = ends.get(h.local % ends.len().max(1))?;
    h.to = n;
    h.body[..4].copy_from_slice(&theirs.to_be_bytes());
    h.body[4..8].copy_from_slice(&ours.to_be_bytes());
    if h.attr == attr::REQ {
        h.body[16..24].copy_from_slice(&GUID[1 - n].to_be_bytes());
    }
    qpn.map(|q| (q << 8).to_be_bytes())
}

fn mad(h: &Hostile, ids: &[u32], qpn: Option<[u8; 4]>) -> Vec<u8> {
    let pick = |i: usize| ids.get(i).copied().unwrap_or(i as u32 * 0x0101_0101);
    let mut b = vec![1, 0x07, 2, 0x03, 0, 0, 0, 0];
    b.extend_from_slice(&(h.local as u64).to_be_bytes());
    b.extend_from_slice(&h.attr.to_be_bytes());
    b.extend_from_slice(&[0; 6]);
    let mut body = h.body.clone();
    // Most messages start with the sender's and the receiver's IDs; SIDR
    // carries one request ID.
    if qpn.is_none() {
        body[..4].copy_from_slice(&pick(h.local).to_be_bytes());
        if h.attr != attr::SIDR_REQ && h.attr != attr::SIDR_REP {
            body[4..8].copy_from_slice(&pick(h.remote).to_be_bytes());
        }
    }
    if h.attr == attr::SIDR_REP {
        body[..4].copy_from_slice(&pick(h.remote).to_be_bytes());
        body[5] %= 73;
    }
    // Mostly valid enumerations and lengths, and QPNs the engines use, so
    // that the messages get past the parser and the QPN checks.
    let qpns = [
        0x10u32, 0x20, 0x30, 0x10_0000, 0x10_0001, 0x20_0000, 0x20_0001,
    ];
    let qpn = qpn.unwrap_or((qpns[h.remote % qpns.len()] << 8).to_be_bytes());
    match h.attr {
        attr::REJ => {
            body[8] &= 0xBF;
            body[9] = (body[9] % 73) << 1;
        }
        attr::MRA => body[8] &= 0xBF,
        attr::APR => body[8] %= 73,
        attr::DREQ => body[8..11].copy_from_slice(&qpn[..3]),
        attr::LAP => body[12..15].copy_from_slice(&qpn[..3]),
        _ => {}
    }
    b.extend_from_slice(&body);
    b
}

fn ends_of(sim: &Sim, all: &[(usize, CepId)]) -> Vec<End> {
    all.iter()
        .filter_map(|&(n, c)| {
            let (rid, _) = sim.e[n].remote(c)?;
            let qpn = sim.e[1 - n]
                .qp_attr(CepId(rid), irpverbs_cm::QpTarget::Rtr)
                .ok()
                .map(|m| m.attr.dest_qp_num);
            Some((n, c.0, rid, qpn))
        })
        .collect()
}

fn ids_of(sim: &Sim, auto: &Auto, known: &[(usize, CepId)]) -> Vec<u32> {
    let mut ids: Vec<u32> = known.iter().map(|c| c.1.0).collect();
    ids.extend(auto.log.iter().filter_map(|e| match e.2 {
        Event::ConnectRequest { cep, .. } => Some(cep.0),
        _ => None,
    }));
    for &(n, c) in known {
        if let Some((r, _)) = sim.e[n].remote(c) {
            ids.push(r);
        }
    }
    ids
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn hostile_mads_never_break_the_engines(seed in any::<u64>(), hs in proptest::collection::vec(hostile(), 1..30)) {
        let f = Faults { loss: 100, dup: 100, max_delay: 2_000_000 };
        let mut sim = Sim::new(seed, f, 10_000_000);
        let mut auto = Auto::new();
        let mut known = Vec::new();
        for n in 0..2 {
            let l = sim.e[n].create(0).unwrap();
            sim.e[n].listen(l, SID).unwrap();
            known.push((n, l));
        }
        for (n, qpn) in [(0usize, 0x10u32), (1, 0x20), (0, 0x30)] {
            let a = sim.e[n].create(0).unwrap();
            sim.e[n].connect(a, &connect_params(n, 1 - n, qpn), 0).unwrap();
            known.push((n, a));
        }
        for h in &hs {
            sim.run_for(&mut auto, h.after);
            let ids = ids_of(&sim, &auto, &known);
            let mut h = h.clone();
            let qpn = if h.aimed {
                let mut all = known.clone();
                all.extend(auto.log.iter().filter_map(|e| match e.2 {
                    Event::ConnectRequest { cep, .. } => Some((e.0, cep)),
                    _ => None,
                }));
                aim(&mut h, &ends_of(&sim, &all))
            } else {
                None
            };
            let h = &h;
            let bytes = mad(h, &ids, qpn);
            let _ = sim.e[h.to].receive(sim.now, &gsi(1 - h.to), &bytes);
            sim.poll_owner(&mut auto);
        }
        // Hostile MRAs and REQs may ask for the longest waits the engine
        // takes from a remote (MAX_REMOTE_EXP, about 69 s a wait) and the
        // most retries: 4 hours of virtual time covers them.
        prop_assert!(sim.run(&mut auto, sim.now + 4 * 3_600_000_000_000));
        // At rest: every CEP idle, listening or established.
        let mut all = known.clone();
        all.extend(auto.log.iter().filter_map(|e| match e.2 {
            Event::ConnectRequest { cep, .. } | Event::SidrRequest { cep, .. } => Some((e.0, cep)),
            _ => None,
        }));
        for &(n, c) in &all {
            if let Some(st) = sim.e[n].state(c) {
                prop_assert!(matches!(st, State::Idle | State::Listen | State::Established | State::SidrReqRcvd),
                    "node {} {:?} rests in {:?}", n, c, st);
            }
        }
        for &(n, c) in &all {
            if sim.e[n].state(c) == Some(State::Established) {
                sim.e[n].disconnect(c, &[], sim.now).unwrap();
            }
        }
        // Hostile MRAs and REQs may ask for the longest waits the engine
        // takes from a remote (MAX_REMOTE_EXP, about 69 s a wait) and the
        // most retries: 4 hours of virtual time covers them.
        prop_assert!(sim.run(&mut auto, sim.now + 4 * 3_600_000_000_000));
        for &(n, c) in &all {
            if sim.e[n].contains(c) {
                sim.e[n].destroy(c, sim.now).unwrap();
            }
        }
        prop_assert!(sim.run(&mut auto, u64::MAX));
        prop_assert!(sim.e[0].is_empty() && sim.e[1].is_empty(), "{} {}", sim.e[0].len(), sim.e[1].len());
    }
}
