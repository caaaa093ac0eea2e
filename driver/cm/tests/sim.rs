//! Thousands of seeded runs of two engines over a wire that loses,
//! duplicates, delays and reorders MADs: connections establish and
//! disconnect through retries, both sides agree, and nothing is left
//! half-done. A failure names its seed.

mod common;

use common::*;
use irpverbs_cm::{CepId, Event, Nanos, Op, State, cm_time};

/// Waits for an answer: the response timeout plus the ACK timeout.
const WAIT: Nanos = cm_time(RESP) + cm_time(ACK);

fn faults(seed: u64) -> Faults {
    Faults {
        loss: [0, 50, 100, 200][(seed % 4) as usize],
        dup: [0, 50, 150][(seed / 4 % 3) as usize],
        // Up to two waits: retransmissions overtake the originals.
        max_delay: [0, WAIT / 2, 2 * WAIT][(seed / 12 % 3) as usize],
    }
}

/// Time wait long enough that no MAD outlives it.
fn timewait(f: &Faults) -> Nanos {
    2 * f.max_delay + WAIT
}

/// The states a CEP may rest in when nothing is in flight or armed.
fn stable(s: State) -> bool {
    matches!(s, State::Idle | State::Listen | State::Established)
}

struct Conn {
    /// (node, CEP) of the active side.
    active: (usize, CepId),
}

/// The passive CEP of an active one, through the remote ID it learned.
fn passive_of(sim: &Sim, c: &Conn) -> Option<(usize, CepId)> {
    let (n, a) = c.active;
    let (rid, guid) = sim.e[n].remote(a)?;
    let other = 1 - n;
    assert_eq!(guid, GUID[other]);
    Some((other, CepId(rid)))
}

fn check_all_stable(sim: &Sim, ceps: &[(usize, CepId)], seed: u64) {
    for &(n, c) in ceps {
        if let Some(st) = sim.e[n].state(c) {
            assert!(stable(st), "seed {seed}: node {n} {c:?} rests in {st:?}");
        }
    }
}

#[test]
fn lossy_connect_and_disconnect_recover_through_retries() {
    let mut retransmits = 0;
    let mut lost = 0;
    for seed in 0..2400u64 {
        let f = faults(seed);
        let mut sim = Sim::new(seed, f, timewait(&f));
        let mut auto = Auto::new();
        let mut ceps = Vec::new();
        for n in 0..2 {
            let l = sim.e[n].create(0).unwrap();
            sim.e[n].listen(l, SID).unwrap();
        }
        // Two connections from node 0, one from node 1.
        let conns: Vec<Conn> = [(0, 0x100), (0, 0x101), (1, 0x200)]
            .into_iter()
            .map(|(n, qpn)| {
                let a = sim.e[n].create(qpn.into()).unwrap();
                sim.e[n]
                    .connect(a, &connect_params(n, 1 - n, qpn), 0)
                    .unwrap();
                ceps.push((n, a));
                Conn { active: (n, a) }
            })
            .collect();
        assert!(
            sim.run(&mut auto, 120_000_000_000),
            "seed {seed}: still busy"
        );
        for c in &conns {
            let (n, a) = c.active;
            assert_eq!(
                sim.e[n].state(a),
                Some(State::Established),
                "seed {seed} {f:?}: {:?}",
                auto.log
            );
            let (pn, p) = passive_of(&sim, c).unwrap();
            assert_eq!(sim.e[pn].state(p), Some(State::Established), "seed {seed}");
            assert_eq!(sim.e[pn].remote(p), Some((a.0, GUID[n])), "seed {seed}");
            ceps.push((pn, p));
        }
        // Listener plus two or one sides of each connection: no strays.
        assert_eq!(sim.e[0].len() + sim.e[1].len(), 2 + 6, "seed {seed}");

        // Disconnect: the active side, the passive side, or both at once.
        for (i, c) in conns.iter().enumerate() {
            let (n, a) = c.active;
            let (pn, p) = passive_of(&sim, c).unwrap();
            let how = (seed as usize + i) % 3;
            if how != 1 {
                sim.e[n].disconnect(a, &[], sim.now).unwrap();
            }
            if how != 0 {
                sim.e[pn].disconnect(p, &[], sim.now).unwrap();
            }
        }
        assert!(
            sim.run(&mut auto, sim.now + 120_000_000_000),
            "seed {seed}: still busy"
        );
        for &(n, c) in &ceps {
            assert_eq!(
                sim.e[n].state(c),
                Some(State::Idle),
                "seed {seed}: {n} {c:?}"
            );
            let log: Vec<_> = auto
                .log
                .iter()
                .filter(|e| e.0 == n && e.1 == c)
                .map(|e| e.2)
                .collect();
            // Every disconnect completed, with a DREP (or crossing DREQs),
            // not by giving up.
            assert!(
                !log.contains(&Event::Timeout { op: Op::Disconnect }),
                "seed {seed}: {log:?}"
            );
            assert_eq!(
                log.last(),
                Some(&Event::TimewaitExit),
                "seed {seed}: {log:?}"
            );
        }
        check_all_stable(&sim, &ceps, seed);
        for &(n, c) in &ceps {
            assert_eq!(sim.e[n].destroy(c, sim.now), Ok(vec![]));
        }
        assert!(sim.run(&mut auto, u64::MAX));
        assert_eq!(
            (sim.e[0].len(), sim.e[1].len()),
            (1, 1),
            "seed {seed}: only the listeners"
        );
        retransmits += sim.e[0].stats().retransmits + sim.e[1].stats().retransmits;
        lost += sim.lost;
    }
    assert!(
        retransmits > 1000 && lost > 1000,
        "the faults were exercised: {retransmits} {lost}"
    );
}

#[test]
fn lossy_simultaneous_peer_to_peer_connects() {
    for seed in 0..1200u64 {
        let f = faults(seed);
        let mut sim = Sim::new(seed, f, timewait(&f));
        let mut auto = Auto::new();
        let a = sim.e[0].create(0).unwrap();
        let b = sim.e[1].create(0).unwrap();
        let pa = irpverbs_cm::ConnectParams {
            peer_to_peer: true,
            ..connect_params(0, 1, 0x30)
        };
        let pb = irpverbs_cm::ConnectParams {
            peer_to_peer: true,
            ..connect_params(1, 0, 0x40)
        };
        sim.e[0].connect(a, &pa, 0).unwrap();
        sim.e[1].connect(b, &pb, 0).unwrap();
        assert!(sim.run(&mut auto, 120_000_000_000), "seed {seed}");
        assert_eq!(
            sim.e[0].state(a),
            Some(State::Established),
            "seed {seed} {f:?}: {:?}",
            auto.log
        );
        assert_eq!(sim.e[1].state(b), Some(State::Established), "seed {seed}");
        assert_eq!(sim.e[0].remote(a), Some((b.0, GUID[1])), "seed {seed}");
        assert_eq!(sim.e[1].remote(b), Some((a.0, GUID[0])), "seed {seed}");
        assert_eq!((sim.e[0].len(), sim.e[1].len()), (1, 1), "seed {seed}");
        // Node 0 (the smaller GUID) was the passive side.
        assert_eq!(
            auto.count(0, |e| matches!(e, Event::ConnectRequest { .. })),
            1,
            "seed {seed}"
        );
        assert_eq!(
            auto.count(1, |e| matches!(e, Event::ConnectRequest { .. })),
            0,
            "seed {seed}"
        );
    }
}

#[test]
fn lossy_runs_with_destroys_at_random_times_leave_nothing_half_done() {
    for seed in 0..1500u64 {
        let f = faults(seed);
        let mut sim = Sim::new(seed, f, timewait(&f));
        let mut auto = Auto::new();
        let l = sim.e[1].create(0).unwrap();
        sim.e[1].listen(l, SID).unwrap();
        let a = sim.e[0].create(0).unwrap();
        sim.e[0].connect(a, &connect_params(0, 1, 0x99), 0).unwrap();
        // Destroy one side (or the listener) at some point of the exchange.
        let at = (seed.wrapping_mul(7919) % 8) * WAIT / 4;
        sim.run(&mut auto, at);
        let victim = match seed % 3 {
            0 => Some((0, a)),
            1 => auto.log.iter().find_map(|e| match e.2 {
                Event::ConnectRequest { cep, .. } => Some((1, cep)),
                _ => None,
            }),
            _ => Some((1, l)),
        };
        if let Some((n, c)) = victim
            && let Some(st) = sim.e[n].state(c)
        {
            let evs = sim.e[n].destroy(c, sim.now).unwrap();
            let pending = match st {
                State::Listen => Some(Op::Listen),
                State::ReqSent | State::MraReqRcvd | State::RepRcvd | State::MraRepSent => {
                    Some(Op::Connect)
                }
                State::RepSent | State::MraRepRcvd => Some(Op::Accept),
                _ => None,
            };
            assert_eq!(
                evs.last().copied(),
                pending.map(|op| Event::Canceled { op }),
                "seed {seed} {st:?}"
            );
        }
        assert!(sim.run(&mut auto, sim.now + 120_000_000_000), "seed {seed}");
        let mut ceps = vec![(0, a), (1, l)];
        ceps.extend(auto.log.iter().filter_map(|e| match e.2 {
            Event::ConnectRequest { cep, .. } => Some((1, cep)),
            _ => None,
        }));
        check_all_stable(&sim, &ceps, seed);
        // Whatever survived disconnects cleanly, and then nothing is left.
        for &(n, c) in &ceps {
            if sim.e[n].state(c) == Some(State::Established) {
                sim.e[n].disconnect(c, &[], sim.now).unwrap();
            }
        }
        assert!(sim.run(&mut auto, sim.now + 120_000_000_000), "seed {seed}");
        for &(n, c) in &ceps {
            if sim.e[n].contains(c) {
                assert!(
                    matches!(sim.e[n].state(c), Some(State::Idle | State::Listen)),
                    "seed {seed}"
                );
                sim.e[n].destroy(c, sim.now).unwrap();
            }
        }
        assert!(sim.run(&mut auto, u64::MAX));
        assert!(
            sim.e[0].is_empty() && sim.e[1].is_empty(),
            "seed {seed}: {} {}",
            sim.e[0].len(),
            sim.e[1].len()
        );
    }
}
