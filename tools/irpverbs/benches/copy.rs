//! `cargo bench -p irpverbs-tools --bench copy`: the soft HCA's payload
//! copy (`Region::copy`) against `copy_from_slice` (the C library's
//! `memcpy`) for 4 KiB, 16 KiB, 64 KiB and 1 MiB, with the destination at
//! every offset 0..4096 from a page-aligned source (so the destination
//! minus the source takes every value modulo 4096).
//!
//! Made to survive a shared, noisy host: at each offset the two copies
//! take turns (which one goes first alternating) for several passes, and
//! each routine's figure at that offset is the median of its passes. Per
//! size the first table gives each routine's worst offset (and where),
//! its median over offsets and `memcpy`'s best, with three ratios: our
//! worst over `memcpy`'s best offset, our worst over `memcpy`'s worst,
//! and the lowest of ours over `memcpy` at the same offset. The second
//! table splits the offsets into classes (by destination minus source
//! modulo 64, and the 4K-aliasing windows modulo 4096) with each
//! routine's median in the class. The load average before and after is
//! printed: figures from a loaded host say so. Prints figures; asserts
//! nothing about speed.
//!
//! `IRPVERBS_COPY_STRIDE` sweeps every n-th offset only (default 1);
//! `IRPVERBS_COPY_PASSES` sets the passes per offset (default 5, odd).

use std::hint::black_box;
use std::time::Instant;

use irpverbs_ring::Region;

const PAGE: usize = 4096;
const SIZES: [usize; 4] = [4 << 10, 16 << 10, 64 << 10, 1 << 20];
/// Bytes copied per timed sample (a sample repeats the copy this often).
const SAMPLE_BYTES: usize = 512 << 10;

/// A page-aligned window of a byte vector.
struct Aligned {
    buf: Vec<u8>,
    start: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let buf = vec![0x5Au8; len + PAGE];
        let start = buf.as_ptr().align_offset(PAGE);
        Self { buf, start }
    }
}

/// GB/s of `reps` runs of `f`.
fn rate(len: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    (len * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// The median of `v` (reordered); 0 for none.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The index and value of the smallest figure.
fn worst(v: &[f64]) -> (usize, f64) {
    v.iter()
        .copied()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((0, 0.0))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// An offset class: a name and a test on the destination minus the
/// source (modulo 4096).
type Class = (&'static str, fn(usize) -> bool);

/// The offset classes of the second table (the last two overlap the
/// first three).
const CLASSES: [Class; 5] = [
    ("same alignment (≡ 0 mod 64)", |d| d % 64 == 0),
    ("16-byte steps (≡ 16, 32, 48 mod 64)", |d| {
        d % 16 == 0 && d % 64 != 0
    }),
    ("other (not ≡ 0 mod 16)", |d| d % 16 != 0),
    ("1–255 past (mod 4096)", |d| (1..256).contains(&d)),
    ("3841–4095 past (mod 4096)", |d| d >= 4096 - 255),
];

/// Per size: the offsets swept and both routines' figure at each.
struct Sweep {
    len: usize,
    offsets: Vec<usize>,
    ours: Vec<f64>,
    libc: Vec<f64>,
}

fn sweep(len: usize, stride: usize, passes: usize) -> Sweep {
    let reps = (SAMPLE_BYTES / len).max(1);
    let (src_r, dst_r) = (
        Region::alloc(len).expect("source"),
        Region::alloc(len + PAGE).expect("destination"),
    );
    src_r.fill(0, len, 0xA5).expect("in bounds");
    dst_r.fill(0, len + PAGE, 0).expect("in bounds");
    let src_v = Aligned::new(len);
    let mut dst_v = Aligned::new(len + PAGE);
    let offsets: Vec<usize> = (0..PAGE).step_by(stride).collect();
    let (mut ours, mut libc) = (Vec::new(), Vec::new());
    let (mut a, mut b) = (Vec::with_capacity(passes), Vec::with_capacity(passes));
    for &off in &offsets {
        a.clear();
        b.clear();
        for pass in 0..passes {
            let region = || {
                rate(len, reps, || {
                    Region::copy(&dst_r, off, &src_r, 0, black_box(len)).expect("in bounds");
                })
            };
            let mut memcpy = || {
                rate(len, reps, || {
                    let s = &src_v.buf[src_v.start..src_v.start + len];
                    let d = &mut dst_v.buf[dst_v.start + off..dst_v.start + off + len];
                    d.copy_from_slice(black_box(s));
                    black_box(d);
                })
            };
            if pass % 2 == 0 {
                a.push(region());
                b.push(memcpy());
            } else {
                b.push(memcpy());
                a.push(region());
            }
        }
        ours.push(median(&mut a));
        libc.push(median(&mut b));
    }
    Sweep {
        len,
        offsets,
        ours,
        libc,
    }
}

fn main() {
    let stride = env_usize("IRPVERBS_COPY_STRIDE", 1);
    let passes = env_usize("IRPVERBS_COPY_PASSES", 5) | 1;
    let load_before = load_average();
    let sweeps: Vec<Sweep> = SIZES
        .iter()
        .map(|&len| sweep(len, stride, passes))
        .collect();
    println!(
        "load average {load_before} before, {} after; every {stride}. offset, median of {passes} alternating passes",
        load_average()
    );
    println!();
    println!(
        "| size | `Region::copy` worst (GB/s, at offset) | median | `memcpy` worst | median | best | our worst / `memcpy` best | our worst / `memcpy` worst | lowest ours / `memcpy` at one offset |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for s in &sweeps {
        let (ours_at, ours_worst) = worst(&s.ours);
        let (libc_at, libc_worst) = worst(&s.libc);
        let libc_best = s.libc.iter().copied().fold(0f64, f64::max);
        let same: Vec<f64> = s.ours.iter().zip(&s.libc).map(|(o, l)| o / l).collect();
        let (same_at, same_worst) = worst(&same);
        let (ours_med, libc_med) = (median(&mut s.ours.clone()), median(&mut s.libc.clone()));
        println!(
            "| {} KiB | {ours_worst:.1} (+{}) | {ours_med:.1} | {libc_worst:.1} (+{}) | {libc_med:.1} | {libc_best:.1} | {:.2} | {:.2} | {same_worst:.2} (+{}) |",
            s.len >> 10,
            s.offsets[ours_at],
            s.offsets[libc_at],
            ours_worst / libc_best,
            ours_worst / libc_worst,
            s.offsets[same_at],
        );
    }
    println!();
    println!(
        "| size | offset class | offsets | `Region::copy` median (GB/s) | `memcpy` median | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    for s in &sweeps {
        for (name, member) in CLASSES {
            let (mut o, mut l) = (Vec::new(), Vec::new());
            for (i, &off) in s.offsets.iter().enumerate() {
                if member(off) {
                    o.push(s.ours[i]);
                    l.push(s.libc[i]);
                }
            }
            if o.is_empty() {
                continue;
            }
            let n = o.len();
            let (om, lm) = (median(&mut o), median(&mut l));
            println!(
                "| {} KiB | {name} | {n} | {om:.1} | {lm:.1} | {:.2} |",
                s.len >> 10,
                om / lm
            );
        }
    }
}
