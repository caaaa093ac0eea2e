//! `cargo bench -p irpverbs-cm`: the CM engine's figures, printed (nothing
//! asserted about speed). Two engines exchange MADs in memory on one
//! thread (both sides' work counted):
//!
//! - connections per second: connect, accept, RTU through the state
//!   machines with many connections in flight, and disconnect, DREP;
//! - memory per CEP, counted by a global allocator that tracks live bytes:
//!   established, and with every REQ unanswered;
//! - lookup cost with 1,000,000 CEPs: by local ID and by remote ID.
//!
//! `IRPVERBS_CM_BENCH_CEPS` sets the CEP count (default 1,000,000).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use irpverbs_cm::{CepId, Config, Engine, Event, QpTarget};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{GUID, SID, accept_params, connect_params, gsi};

/// The system allocator, counting live and peak bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged, so `System`'s guarantees hold; the counters are
// plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract (non-zero size).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated with `layout`, and the caller upholds
        // `realloc`'s contract for `new_size`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Relaxed);
            let now = LIVE.fetch_add(new_size, Relaxed) + new_size;
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

struct Pair {
    e: [Engine; 2],
    /// MADs moved between the engines.
    mads: u64,
}

impl Pair {
    fn new() -> Self {
        let mut e = [0, 1].map(|n| {
            Engine::new(Config {
                id_seed: 0x9E37_79B9 ^ n as u32,
                ..Config::new(GUID[n])
            })
        });
        let listener = e[1].create(0).unwrap();
        e[1].listen(listener, SID).unwrap();
        Self { e, mads: 0 }
    }

    /// Node 0 connects `n` new CEPs, QPs from `qpn`.
    fn connect(&mut self, n: u32, qpn: u32) -> Vec<CepId> {
        (0..n)
            .map(|i| {
                let c = self.e[0].create(0).unwrap();
                let p = connect_params(0, 1, qpn + i);
                black_box(p.init_attr());
                self.e[0].connect(c, &p, 0).unwrap();
                c
            })
            .collect()
    }

    /// Delivers what `from` queued to the other engine.
    fn shuttle(&mut self, from: usize) {
        let [a, b] = &mut self.e;
        let (src, dst) = if from == 0 { (a, b) } else { (b, a) };
        while let Some(t) = src.poll_transmit() {
            let _ = dst.receive(0, &gsi(from), &t.mad);
            self.mads += 1;
        }
    }

    /// Node 1's owner: accepts every request (moving an imaginary QP),
    /// answers every DREQ.
    fn passive_owner(&mut self, next_qpn: &mut u32) {
        let e = &mut self.e[1];
        while let Some((id, _)) = e.poll_ready() {
            while let Some(ev) = e.poll_event(id) {
                match ev {
                    Event::ConnectRequest { cep, .. } => {
                        let p = accept_params(*next_qpn);
                        *next_qpn += 1;
                        for t in [QpTarget::Init, QpTarget::Rtr, QpTarget::Rts] {
                            black_box(e.accept_qp_attr(cep, &p, t).unwrap());
                        }
                        e.accept(cep, &p, 0).unwrap();
                    }
                    Event::DisconnectRequest { .. } => {
                        black_box(e.qp_attr(id, QpTarget::Error).unwrap());
                        e.drep(id, &[], 0).unwrap();
                    }
                    _ => {}
                }
            }
        }
    }

    /// Node 0's owner: RTU for every REP.
    fn active_owner(&mut self) {
        let e = &mut self.e[0];
        while let Some((id, _)) = e.poll_ready() {
            while let Some(ev) = e.poll_event(id) {
                if let Event::Reply { .. } = ev {
                    black_box(e.qp_attr(id, QpTarget::Rtr).unwrap());
                    black_box(e.qp_attr(id, QpTarget::Rts).unwrap());
                    e.rtu(id, &[]).unwrap();
                }
            }
        }
    }

    /// Establishes `n` connections, `window` in flight at a time.
    fn establish(&mut self, n: u32, window: u32, next_qpn: &mut u32) -> Vec<CepId> {
        let mut all = Vec::with_capacity(n as usize);
        let mut done = 0;
        while done < n {
            let k = window.min(n - done);
            all.extend(self.connect(k, 0x1000 + done));
            self.shuttle(0);
            self.passive_owner(next_qpn);
            self.shuttle(1);
            self.active_owner();
            self.shuttle(0);
            self.passive_owner(next_qpn);
            done += k;
        }
        all
    }

    /// Disconnects `ceps` (node 0's), `window` at a time.
    fn disconnect(&mut self, ceps: &[CepId], window: usize, next_qpn: &mut u32) {
        for chunk in ceps.chunks(window) {
            for &c in chunk {
                self.e[0].disconnect(c, &[], 0).unwrap();
            }
            self.shuttle(0);
            self.passive_owner(next_qpn);
            self.shuttle(1);
            while let Some((id, _)) = self.e[0].poll_ready() {
                while self.e[0].poll_event(id).is_some() {}
            }
        }
    }
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// A shuffled order of `ids` (xorshift, fixed seed).
fn shuffled<T: Copy>(ids: &[T]) -> Vec<T> {
    let mut v = ids.to_vec();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn main() {
    let n: u32 = std::env::var("IRPVERBS_CM_BENCH_CEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    println!("irpverbs-cm engine: two engines on one thread, MADs moved in memory");

    // Connection rate, many in flight.
    let rate_n = (n / 5).max(1);
    for window in [1_000u32, 10_000] {
        let mut p = Pair::new();
        let mut qpn = 0x80_0000;
        let t = Instant::now();
        let ceps = p.establish(rate_n, window, &mut qpn);
        let dt = t.elapsed().as_secs_f64();
        let mads = p.mads;
        println!(
            "  connect + accept + RTU: {rate_n} connections, {window} in flight: {:.3} s, \
             {:.0} connections/s ({:.0} MADs/s)",
            dt,
            f64::from(rate_n) / dt,
            mads as f64 / dt
        );
        let t = Instant::now();
        p.disconnect(&ceps, window as usize, &mut qpn);
        let dt = t.elapsed().as_secs_f64();
        println!(
            "  DREQ + DREP into time wait: {rate_n} connections, {window} at a time: {:.3} s, \
             {:.0} disconnects/s",
            dt,
            f64::from(rate_n) / dt
        );
    }

    // Memory: n established connections (n CEPs on each engine).
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let mut p = Pair::new();
    let mut qpn = 0x80_0000;
    let t = Instant::now();
    let ceps = p.establish(n, 10_000, &mut qpn);
    let dt = t.elapsed().as_secs_f64();
    let used = LIVE.load(Relaxed) - base;
    let peak = PEAK.load(Relaxed) - base;
    let per = used as f64 / (2.0 * f64::from(n));
    println!(
        "  {n} established connections ({} CEPs) in {dt:.2} s: {:.1} MiB live ({:.0} bytes per CEP: \
         {:.1} MiB per {n} CEPs), peak {:.1} MiB",
        2 * u64::from(n),
        mib(used),
        per,
        per * f64::from(n) / (1024.0 * 1024.0),
        mib(peak)
    );
    let fp = p.e[0].footprint();
    println!(
        "    one CEP slot {} bytes; {} map entries on the active engine",
        fp.slot_bytes, fp.map_entries
    );

    // Lookups among them.
    let order = shuffled(&ceps);
    let t = Instant::now();
    let mut hits = 0usize;
    for &c in &order {
        hits += usize::from(black_box(p.e[0].contains(c)));
    }
    let local = t.elapsed().as_nanos() as f64 / order.len() as f64;
    assert_eq!(hits, order.len());
    // Node 1 finds its passive CEPs by node 0's IDs.
    let keys: Vec<(u64, u32)> = order.iter().map(|&c| (GUID[0], c.0)).collect();
    let t = Instant::now();
    let mut found = 0usize;
    for &(g, id) in &keys {
        found += usize::from(black_box(p.e[1].lookup_remote(g, id)).is_some());
    }
    let remote = t.elapsed().as_nanos() as f64 / keys.len() as f64;
    assert_eq!(found, keys.len());
    println!(
        "  lookup among {n} CEPs: by local ID {local:.1} ns, by remote (CA GUID, ID) {remote:.1} ns"
    );
    drop(p);

    // Memory with every REQ unanswered (each CEP keeps its REQ to resend).
    let base = LIVE.load(Relaxed);
    let mut e = Engine::new(Config::new(GUID[0]));
    for i in 0..n {
        let c = e.create(0).unwrap();
        e.connect(c, &connect_params(0, 1, i), 0).unwrap();
        while e.poll_transmit().is_some() {}
    }
    let used = LIVE.load(Relaxed) - base;
    println!(
        "  {n} CEPs waiting for a REP: {:.1} MiB ({:.0} bytes per CEP)",
        mib(used),
        used as f64 / f64::from(n)
    );
}
