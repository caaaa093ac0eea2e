//! `cargo bench -p irpverbs-tools --bench copy`: the soft HCA's payload
//! copy (`Region::copy`) against `copy_from_slice` (the C library's
//! `memcpy`) for 4 KiB, 16 KiB, 64 KiB and 1 MiB, with the destination at
//! every offset 0..4096 from a page-aligned source (so the destination
//! minus the source takes every value modulo 4096). Each offset is timed
//! best of three, the two copies taking turns; per size the table gives
//! the worst and median offset's GB/s for each, and our worst over the
//! best offset's `memcpy` (the worst offsets in brackets). Prints figures; asserts nothing about speed.
//! `IRPVERBS_COPY_STRIDE` sweeps every n-th offset only (default 1).

use std::hint::black_box;
use std::time::Instant;

use irpverbs_ring::Region;

const PAGE: usize = 4096;
const SIZES: [usize; 4] = [4 << 10, 16 << 10, 64 << 10, 1 << 20];
/// Bytes copied per timed sample (a sample repeats the copy this often).
const SAMPLE_BYTES: usize = 256 << 10;
const TRIES: usize = 3;

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

/// The index and value of the smallest figure.
fn worst(v: &[f64]) -> (usize, f64) {
    v.iter()
        .copied()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((0, 0.0))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let stride: usize = std::env::var("IRPVERBS_COPY_STRIDE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(1);
    println!(
        "| size | Region::copy worst (GB/s, at offset) | median | memcpy worst | median | best | our worst / memcpy best |"
    );
    println!("|---|---|---|---|---|---|---|");
    for len in SIZES {
        let reps = (SAMPLE_BYTES / len).max(1);
        let (src_r, dst_r) = (
            Region::alloc(len).expect("source"),
            Region::alloc(len + PAGE).expect("destination"),
        );
        src_r.fill(0, len, 0xA5).expect("in bounds");
        dst_r.fill(0, len + PAGE, 0).expect("in bounds");
        let src_v = Aligned::new(len);
        let mut dst_v = Aligned::new(len + PAGE);
        let mut ours = Vec::new();
        let mut libc = Vec::new();
        for off in (0..PAGE).step_by(stride) {
            let (mut a, mut b) = (0f64, 0f64);
            for _ in 0..TRIES {
                a = a.max(rate(len, reps, || {
                    Region::copy(&dst_r, off, &src_r, 0, black_box(len)).expect("in bounds");
                }));
                b = b.max(rate(len, reps, || {
                    let s = &src_v.buf[src_v.start..src_v.start + len];
                    let d = &mut dst_v.buf[dst_v.start + off..dst_v.start + off + len];
                    d.copy_from_slice(black_box(s));
                    black_box(d);
                }));
            }
            ours.push(a);
            libc.push(b);
        }
        let (ours_at, ours_worst) = worst(&ours);
        let (libc_at, libc_worst) = worst(&libc);
        let libc_best = libc.iter().copied().fold(0f64, f64::max);
        let (ours_med, libc_med) = (median(&mut ours), median(&mut libc));
        println!(
            "| {} KiB | {ours_worst:.1} (+{}) | {ours_med:.1} | {libc_worst:.1} (+{}) | {libc_med:.1} | {libc_best:.1} | {:.2} |",
            len >> 10,
            ours_at * stride,
            libc_at * stride,
            ours_worst / libc_best
        );
    }
}
