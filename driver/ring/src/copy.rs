//! The HCA's byte mover: every payload copy of the soft HCA goes through
//! [`move_bytes`] (by way of [`Region::copy`](crate::Region::copy) and the
//! region's `read`/`write`).
//!
//! It does not call the C library's `memmove` for anything but overlapping
//! ranges, because that routine's choice of strategy can be ambushed by
//! the relative placement of the two buffers: with `rep movsb` or a
//! forward vector loop, a destination a few bytes past a multiple of 4096
//! from its source makes every load wait on an unrelated recent store to
//! the same low twelve address bits ("4K aliasing"), and a misaligned
//! destination splits every store across two cache lines. So:
//!
//! - up to 16 bytes: a pair of (possibly overlapping) scalar moves;
//! - 17 to 128 bytes: up to eight 16-byte loads from both ends, then the
//!   stores (no loop, no branch on alignment);
//! - above: the destination is aligned to a cache line, then either
//!   `rep movsb` (from 2 KiB, on processors where it is fast at every
//!   placement) or a loop of 16-byte unaligned loads and 64-byte aligned
//!   store groups; the loop runs backward when the destination lies just
//!   past the source modulo 4096 (where a forward loop's loads would alias
//!   its recent stores), and from 32 KiB it replaces `rep movsb` there
//!   too, whose microcode suffers the same aliasing once the buffers no
//!   longer fit the L1 cache ([`choose`]).
//!
//! Only 16-byte registers, with their legacy (SSE2) encodings, are used:
//! they are in the x86_64 baseline, and Windows x64 kernel code may use
//! them at any IRQL (interrupt service routines included) without saving
//! state, provided it preserves XMM6–XMM15 as the calling convention
//! requires (the compiler does for registers an `asm!` block declares).
//! AVX's are a different matter: the kernel does not save them for its
//! own code, so a driver must wrap their use in
//! `KeSaveExtendedProcessorState`/`KeRestoreExtendedProcessorState` and may
//! not use them in an ISR at all; and a VEX-encoded instruction, even on a
//! 16-byte register, clears the upper half of the 256-bit register it
//! writes, the state of whichever thread the processor was running.
//! On other architectures the large case is `core::ptr::copy`.
//!
//! IRQL: any. Allocates nothing; the stack frame is a few registers.

/// Below this many bytes no loop runs.
const SMALL: usize = 128;

/// From this many bytes up, `rep movsb` with an aligned destination where
/// it is known to be fast ([`x86::fast_strings`]).
#[cfg(target_arch = "x86_64")]
const REP_MIN: usize = 2048;

/// A destination less than this far past its source (modulo 4096, and
/// not 0) is copied backward: a forward loop would load from addresses
/// whose low twelve bits match those of stores it made a few bytes ago
/// and still holds in its store buffer, and each such load waits for them.
/// (Backward, the same happens just *below* a multiple of 4096, which this
/// window keeps far from.) Measured on Intel: forward loses a quarter of
/// its speed for distances 1 to 63, backward nine tenths of it for 4081
/// to 4095.
#[cfg(target_arch = "x86_64")]
const ALIAS_WINDOW: usize = 256;

/// From this many bytes up, a copy in [`ALIAS_WINDOW`] takes the backward
/// loop even where `rep movsb` is fast: source and destination together
/// no longer fit a 32–48 KiB L1 data cache, the loop keeps pace with
/// `rep movsb` at L2 speed and does not suffer the aliasing it does.
/// (Below, in L1, `rep movsb` is faster than any 16-byte loop.)
#[cfg(target_arch = "x86_64")]
const ALIAS_L2_MIN: usize = 32 << 10;

/// How [`move_large`] copies.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Strategy {
    /// Overlapping ranges: `memmove`.
    Memmove,
    /// [`x86::rep_movsb`].
    RepMovsb,
    /// [`x86::forward`].
    Forward,
    /// [`x86::backward`].
    Backward,
}

/// The strategy for `len > 128` bytes from `src` to `dst` (addresses),
/// where `fast_strings` is [`x86::fast_strings`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn choose(dst: usize, src: usize, len: usize, fast_strings: bool) -> Strategy {
    if overlap(dst, src, len) {
        return Strategy::Memmove;
    }
    let aliasing = (1..ALIAS_WINDOW).contains(&(dst.wrapping_sub(src) % 4096));
    if len >= REP_MIN && fast_strings && !(aliasing && len >= ALIAS_L2_MIN) {
        Strategy::RepMovsb
    } else if aliasing {
        Strategy::Backward
    } else {
        Strategy::Forward
    }
}

/// Copies `len` bytes from `src` to `dst`, which may overlap (`memmove`'s
/// contract), without the C library's choice of strategy.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes. Other
/// threads may write either range meanwhile (shared memory): the bytes
/// copied are then unspecified, nothing else is affected.
#[inline]
pub(crate) unsafe fn move_bytes(dst: *mut u8, src: *const u8, len: usize) {
    if len <= 16 {
        // SAFETY: the caller's contract, with `len <= 16`.
        unsafe { move_small(dst, src, len) };
    } else if len <= SMALL {
        // SAFETY: the caller's contract, with `16 < len <= 128`.
        unsafe { move_medium(dst, src, len) };
    } else {
        // SAFETY: the caller's contract, with `len > 128`.
        unsafe { move_large(dst, src, len) };
    }
}

/// `len <= 16`: every load before any store, so overlap is handled.
///
/// # Safety
/// As [`move_bytes`], with `len <= 16`.
#[inline(always)]
unsafe fn move_small(dst: *mut u8, src: *const u8, len: usize) {
    if len >= 8 {
        // SAFETY: `src` is valid for `len >= 8` bytes; unaligned read.
        let head = unsafe { src.cast::<u64>().read_unaligned() };
        // SAFETY: `src + len - 8 .. src + len` is inside the range.
        let tail = unsafe { src.add(len - 8).cast::<u64>().read_unaligned() };
        // SAFETY: `dst` is valid for `len >= 8` bytes; unaligned write.
        unsafe { dst.cast::<u64>().write_unaligned(head) };
        // SAFETY: `dst + len - 8 .. dst + len` is inside the range.
        unsafe { dst.add(len - 8).cast::<u64>().write_unaligned(tail) };
    } else if len >= 4 {
        // SAFETY: as above, with 4-byte words and `len >= 4`.
        let head = unsafe { src.cast::<u32>().read_unaligned() };
        // SAFETY: `src + len - 4 .. src + len` is inside the range.
        let tail = unsafe { src.add(len - 4).cast::<u32>().read_unaligned() };
        // SAFETY: `dst` is valid for `len >= 4` bytes.
        unsafe { dst.cast::<u32>().write_unaligned(head) };
        // SAFETY: `dst + len - 4 .. dst + len` is inside the range.
        unsafe { dst.add(len - 4).cast::<u32>().write_unaligned(tail) };
    } else if len >= 2 {
        // SAFETY: as above, with 2-byte words and `len >= 2`.
        let head = unsafe { src.cast::<u16>().read_unaligned() };
        // SAFETY: `src + len - 2 .. src + len` is inside the range.
        let tail = unsafe { src.add(len - 2).cast::<u16>().read_unaligned() };
        // SAFETY: `dst` is valid for `len >= 2` bytes.
        unsafe { dst.cast::<u16>().write_unaligned(head) };
        // SAFETY: `dst + len - 2 .. dst + len` is inside the range.
        unsafe { dst.add(len - 2).cast::<u16>().write_unaligned(tail) };
    } else if len == 1 {
        // SAFETY: one byte, valid on both sides.
        let b = unsafe { src.read() };
        // SAFETY: as above.
        unsafe { dst.write(b) };
    }
}

/// A 16-byte value, loaded and stored unaligned: on x86_64 an SSE2
/// register (`__m128i`; a `u128` would be kept in two general registers,
/// twice the loads and stores and, in [`move_large`], five registers to
/// save around `rep movsb`).
#[cfg(target_arch = "x86_64")]
type Chunk = core::arch::x86_64::__m128i;
/// A 16-byte value, loaded and stored unaligned.
#[cfg(not(target_arch = "x86_64"))]
type Chunk = u128;

/// Loads the 16 bytes at `p`.
///
/// # Safety
/// `p` is valid for 16 bytes of reads.
#[inline(always)]
unsafe fn load16(p: *const u8) -> Chunk {
    // SAFETY: the caller's contract; unaligned read.
    unsafe { p.cast::<Chunk>().read_unaligned() }
}

/// Stores 16 bytes at `p`.
///
/// # Safety
/// `p` is valid for 16 bytes of writes.
#[inline(always)]
unsafe fn store16(p: *mut u8, v: Chunk) {
    // SAFETY: the caller's contract; unaligned write.
    unsafe { p.cast::<Chunk>().write_unaligned(v) };
}

/// `16 < len <= 128`: 16-byte pieces from both ends, overlapping in the
/// middle, all loaded before any is stored (so overlap is handled).
///
/// # Safety
/// As [`move_bytes`], with `16 < len <= 128`.
#[inline(always)]
unsafe fn move_medium(dst: *mut u8, src: *const u8, len: usize) {
    // Every load and store below: the offsets are 0, 16, 32, 48
    // from the start and from `len - 64`, `len - 32`, `len - 16`, each
    // used only when `len` covers it, so every piece is inside the range.
    if len <= 32 {
        // SAFETY: in the range (see above) (`16 < len`).
        let a = unsafe { load16(src) };
        // SAFETY: in the range (see above) (`16 < len`).
        let z = unsafe { load16(src.add(len - 16)) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst, a) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(len - 16), z) };
    } else if len <= 64 {
        // SAFETY: in the range (see above) (`32 < len`).
        let a = unsafe { load16(src) };
        // SAFETY: in the range (see above) (`32 < len`).
        let b = unsafe { load16(src.add(16)) };
        // SAFETY: in the range (see above).
        let y = unsafe { load16(src.add(len - 32)) };
        // SAFETY: in the range (see above).
        let z = unsafe { load16(src.add(len - 16)) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst, a) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(16), b) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(len - 32), y) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(len - 16), z) };
    } else {
        // SAFETY: in the range (see above) (`64 < len`).
        let a = unsafe { load16(src) };
        // SAFETY: in the range (see above) (`64 < len`).
        let b = unsafe { load16(src.add(16)) };
        // SAFETY: in the range (see above).
        let c = unsafe { load16(src.add(32)) };
        // SAFETY: in the range (see above).
        let d = unsafe { load16(src.add(48)) };
        // SAFETY: in the range (see above).
        let w = unsafe { load16(src.add(len - 64)) };
        // SAFETY: in the range (see above).
        let x = unsafe { load16(src.add(len - 48)) };
        // SAFETY: in the range (see above).
        let y = unsafe { load16(src.add(len - 32)) };
        // SAFETY: in the range (see above).
        let z = unsafe { load16(src.add(len - 16)) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst, a) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(16), b) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(32), c) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(48), d) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(len - 64), w) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(len - 48), x) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(len - 32), y) };
        // SAFETY: in the range (see above).
        unsafe { store16(dst.add(len - 16), z) };
    }
}

/// Whether the ranges of `len` bytes at `a` and `b` overlap.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn overlap(a: usize, b: usize, len: usize) -> bool {
    a.wrapping_sub(b) < len || b.wrapping_sub(a) < len
}

/// `len > 128`.
///
/// # Safety
/// As [`move_bytes`], with `len > 128`.
#[inline(never)]
unsafe fn move_large(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        match choose(dst as usize, src as usize, len, x86::fast_strings()) {
            // SAFETY: the caller's contract, `len > 128`, no overlap.
            Strategy::RepMovsb => unsafe { x86::rep_movsb(dst, src, len) },
            // SAFETY: as above.
            Strategy::Backward => unsafe { x86::backward(dst, src, len) },
            // SAFETY: as above.
            Strategy::Forward => unsafe { x86::forward(dst, src, len) },
            Strategy::Memmove => {
                // SAFETY: the caller's contract; `copy` is `memmove`,
                // correct for overlapping ranges (the same memory
                // registered twice).
                unsafe { core::ptr::copy(src, dst, len) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's contract; `copy` is `memmove`.
        unsafe { core::ptr::copy(src, dst, len) };
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use core::arch::asm;
    use core::sync::atomic::{AtomicU8, Ordering};

    use super::{Chunk, load16, store16};

    /// Loads the 64 bytes at `p` as four 16-byte pieces.
    ///
    /// # Safety
    /// `p` is valid for 64 bytes of reads.
    #[inline(always)]
    unsafe fn load64(p: *const u8) -> [Chunk; 4] {
        // SAFETY: the caller's contract; each piece lies in the 64 bytes.
        let a = unsafe { load16(p) };
        // SAFETY: as above.
        let b = unsafe { load16(p.add(16)) };
        // SAFETY: as above.
        let c = unsafe { load16(p.add(32)) };
        // SAFETY: as above.
        let d = unsafe { load16(p.add(48)) };
        [a, b, c, d]
    }

    /// Stores four 16-byte pieces at `p`.
    ///
    /// # Safety
    /// `p` is valid for 64 bytes of writes.
    #[inline(always)]
    unsafe fn store64(p: *mut u8, v: [Chunk; 4]) {
        let [a, b, c, d] = v;
        // SAFETY: the caller's contract; each piece lies in the 64 bytes.
        unsafe { store16(p, a) };
        // SAFETY: as above.
        unsafe { store16(p.add(16), b) };
        // SAFETY: as above.
        unsafe { store16(p.add(32), c) };
        // SAFETY: as above.
        unsafe { store16(p.add(48), d) };
    }

    /// Whether `rep movsb` is the processor's fast copy at every relative
    /// placement of source and destination: an Intel processor with
    /// enhanced `rep movsb` (ERMS). (AMD's, even with FSRM, falls to a
    /// few GB/s when the destination is just past the source modulo 4096.)
    /// Asked of `cpuid` once.
    #[inline(always)]
    pub(crate) fn fast_strings() -> bool {
        static KNOWN: AtomicU8 = AtomicU8::new(0);
        match KNOWN.load(Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => {
                let yes = detect();
                KNOWN.store(1 + u8::from(yes), Ordering::Relaxed);
                yes
            }
        }
    }

    /// An Intel processor (vendor "GenuineIntel" in EBX, EDX, ECX of
    /// leaf 0) with ERMS (leaf 7, EBX bit 9).
    #[cold]
    fn detect() -> bool {
        use core::arch::x86_64::{__cpuid, __cpuid_count};
        let v = __cpuid(0);
        let intel = v.ebx == 0x756e_6547 && v.edx == 0x4965_6e69 && v.ecx == 0x6c65_746e;
        intel && v.eax >= 7 && __cpuid_count(7, 0).ebx & (1 << 9) != 0
    }

    /// `rep movsb` from the destination's first cache-line boundary, and
    /// the bytes before it (when the destination is not aligned) as the
    /// first 64 unaligned. (Copying a head of 64 when none is needed costs
    /// an aligned 4 KiB copy a sixth of its speed.)
    ///
    /// # Safety
    /// `src` valid for reads and `dst` for writes of `len > 64` bytes, not
    /// overlapping.
    #[inline(always)]
    pub(crate) unsafe fn rep_movsb(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: `len > 64`: the first 64 bytes are inside.
        let head = unsafe { load64(src) };
        let skew = (dst as usize).wrapping_neg() & 63; // 0..=63
        // SAFETY: `len - skew` bytes from `src + skew` and `dst + skew` are
        // inside both ranges; the direction flag is clear (the ABI's rule
        // at every call); the registers it changes are declared.
        unsafe {
            asm!(
                "rep movsb",
                inout("rcx") len - skew => _,
                inout("rdi") dst.add(skew) => _,
                inout("rsi") src.add(skew) => _,
                options(nostack, preserves_flags),
            );
        }
        if skew != 0 {
            // SAFETY: the first 64 bytes of `dst` are inside.
            unsafe { store64(dst, head) };
        }
    }

    /// Forward: the first 64 bytes unaligned, then whole cache lines of
    /// the destination from its first line boundary, then the last 64
    /// bytes unaligned (the head and tail overlap the loop's lines).
    ///
    /// # Safety
    /// `src` valid for reads and `dst` for writes of `len > 128` bytes,
    /// not overlapping.
    #[inline(always)]
    pub(crate) unsafe fn forward(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: `len > 128`: the first and last 64 bytes are inside.
        let head = unsafe { load64(src) };
        // SAFETY: `len > 128`: the first and last 64 bytes are inside.
        let tail = unsafe { load64(src.add(len - 64)) };
        let skew = 64 - (dst as usize & 63); // 1..=64
        let lines = (len - skew) / 64; // >= 1: len - skew > 64
        // SAFETY: `lines` cache lines from `dst + skew` (64-byte aligned)
        // and as many 64-byte blocks from `src + skew` end at or before
        // `len`; the loop touches nothing else, and the registers it
        // names are declared clobbered.
        unsafe {
            asm!(
                "2:",
                "movdqu xmm0, [{s}]",
                "movdqu xmm1, [{s} + 16]",
                "movdqu xmm2, [{s} + 32]",
                "movdqu xmm3, [{s} + 48]",
                "movdqa [{d}], xmm0",
                "movdqa [{d} + 16], xmm1",
                "movdqa [{d} + 32], xmm2",
                "movdqa [{d} + 48], xmm3",
                "add {s}, 64",
                "add {d}, 64",
                "dec {n}",
                "jnz 2b",
                s = inout(reg) src.add(skew) => _,
                d = inout(reg) dst.add(skew) => _,
                n = inout(reg) lines => _,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                options(nostack),
            );
        }
        // SAFETY: the first and last 64 bytes of `dst` are inside.
        unsafe { store64(dst, head) };
        // SAFETY: as above.
        unsafe { store64(dst.add(len - 64), tail) };
    }

    /// Backward: the mirror of [`forward`], from the destination's last
    /// line boundary down.
    ///
    /// # Safety
    /// As [`forward`].
    #[inline(always)]
    pub(crate) unsafe fn backward(dst: *mut u8, src: *const u8, len: usize) {
        // SAFETY: `len > 128`: the first and last 64 bytes are inside.
        let head = unsafe { load64(src) };
        // SAFETY: `len > 128`: the first and last 64 bytes are inside.
        let tail = unsafe { load64(src.add(len - 64)) };
        let end = dst as usize + len;
        let skew = (end & 63) + 64 * usize::from(end & 63 == 0); // 1..=64
        let lines = (len - skew) / 64; // >= 1: len - skew > 64
        // SAFETY: `lines` cache lines ending at `dst + len - skew` (64-byte
        // aligned) and as many 64-byte blocks ending at `src + len - skew`
        // start at or after 0; the loop touches nothing else, and the
        // registers it names are declared clobbered.
        unsafe {
            asm!(
                "2:",
                "sub {s}, 64",
                "sub {d}, 64",
                "movdqu xmm0, [{s} + 48]",
                "movdqu xmm1, [{s} + 32]",
                "movdqu xmm2, [{s} + 16]",
                "movdqu xmm3, [{s}]",
                "movdqa [{d} + 48], xmm0",
                "movdqa [{d} + 32], xmm1",
                "movdqa [{d} + 16], xmm2",
                "movdqa [{d}], xmm3",
                "dec {n}",
                "jnz 2b",
                s = inout(reg) src.add(len - skew) => _,
                d = inout(reg) dst.add(len - skew) => _,
                n = inout(reg) lines => _,
                out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
                options(nostack),
            );
        }
        // SAFETY: the first and last 64 bytes of `dst` are inside.
        unsafe { store64(dst.add(len - 64), tail) };
        // SAFETY: as above.
        unsafe { store64(dst, head) };
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec;
    use std::vec::Vec;

    use proptest::prelude::*;

    use super::move_bytes;

    /// A pattern no two nearby bytes share.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| {
                (i as u8)
                    .wrapping_mul(31)
                    .wrapping_add(seed ^ (i >> 8) as u8)
            })
            .collect()
    }

    /// Copies `len` bytes between two buffers with `move_bytes` and with
    /// `copy_from_slice`, and compares the whole destinations (so bytes
    /// outside the range are checked untouched too).
    fn check_between(len: usize, src_off: usize, dst_off: usize) {
        let src = pattern(src_off + len + 64, 7);
        let mut ours = pattern(dst_off + len + 64, 200);
        let mut want = ours.clone();
        want[dst_off..dst_off + len].copy_from_slice(&src[src_off..src_off + len]);
        // SAFETY: both ranges are inside their vectors, which are distinct.
        unsafe {
            move_bytes(
                ours.as_mut_ptr().add(dst_off),
                src.as_ptr().add(src_off),
                len,
            )
        };
        assert_eq!(ours, want, "len {len} src+{src_off} dst+{dst_off}");
    }

    /// The same, within one buffer (overlapping when the offsets are
    /// closer than `len`), against `copy_within`.
    fn check_within(len: usize, src_off: usize, dst_off: usize) {
        let mut ours = pattern(src_off.max(dst_off) + len + 64, 3);
        let mut want = ours.clone();
        want.copy_within(src_off..src_off + len, dst_off);
        let p = ours.as_mut_ptr();
        // SAFETY: both ranges are inside the vector; `move_bytes` allows
        // overlap.
        unsafe { move_bytes(p.add(dst_off), p.add(src_off), len) };
        assert_eq!(
            ours, want,
            "len {len} src+{src_off} dst+{dst_off} (one buffer)"
        );
    }

    #[test]
    fn every_length_to_600_at_every_alignment_matches_copy_from_slice() {
        for len in 0..=600 {
            for (s, d) in [(0, 0), (1, 0), (0, 1), (3, 61), (63, 2), (17, 48), (64, 0)] {
                check_between(len, s, d);
            }
        }
    }

    #[test]
    fn overlapping_ranges_are_moved_as_memmove_does() {
        for len in (0..300).chain([1000, 4096, 5000]) {
            for delta in [0usize, 1, 7, 15, 16, 17, 63, 64, 65, 200, 4095, 4097] {
                check_within(len, 0, delta);
                check_within(len, delta, 0);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_large_strategy_copies_exactly_its_range() {
        type Strategy = unsafe fn(*mut u8, *const u8, usize);
        let all: [(&str, Strategy); 3] = [
            ("forward", super::x86::forward),
            ("backward", super::x86::backward),
            ("rep movsb", super::x86::rep_movsb),
        ];
        for (name, f) in all {
            for len in [129, 130, 191, 192, 193, 255, 256, 1000, 4096, 4099, 70_000] {
                // The destination offsets count from the vector's first
                // cache-line boundary: 0 is aligned, 1 and 63 the extremes.
                for (s_off, d_off) in [(0, 0), (0, 1), (5, 0), (13, 77), (64, 63), (1, 4095)] {
                    let src = pattern(s_off + len, 9);
                    let mut ours = vec![0xEEu8; d_off + len + 128];
                    let d_off = d_off + ours.as_ptr().align_offset(64);
                    let mut want = ours.clone();
                    want[d_off..d_off + len].copy_from_slice(&src[s_off..]);
                    // SAFETY: in bounds of two distinct vectors, `len > 128`.
                    unsafe { f(ours.as_mut_ptr().add(d_off), src.as_ptr().add(s_off), len) };
                    assert_eq!(ours, want, "{name}: len {len} src+{s_off} dst+{d_off}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_strategy_follows_size_placement_and_processor() {
        use super::Strategy::{Backward, Forward, Memmove, RepMovsb};
        use super::choose;
        let base = 0x10_0000usize;
        // (destination minus source, length, fast strings, expected)
        let cases = [
            (8192, 4096, true, RepMovsb),
            (8192, 4096, false, Forward),
            (1 << 20 | 4000, 64 << 10, true, RepMovsb),
            (1, 129, false, Memmove),
            (4096 * 16 + 1, 4096, false, Backward),
            (4096 * 16 + 1, 4096, true, RepMovsb),
            (4096 * 16 + 1, 2047, true, Backward),
            (4096 * 16 + 255, 200, false, Backward),
            (4096 * 16 + 256, 200, false, Forward),
            (4096 * 16 + 4095, 200, false, Forward),
            // From 32 KiB, out of L1, `rep movsb` aliases too.
            (1 << 20 | 1, 32 << 10, true, Backward),
            (1 << 20 | 255, 1 << 20, true, Backward),
            (1 << 20 | 256, 1 << 20, true, RepMovsb),
            (1 << 20 | 1, (32 << 10) - 1, true, RepMovsb),
        ];
        for (delta, len, fast, want) in cases {
            assert_eq!(
                choose(base + delta, base, len, fast),
                want,
                "+{delta} len {len}"
            );
        }
        // A destination below its source is never "just past" it modulo
        // 4096 unless it wraps so.
        assert_eq!(choose(base, base + 8191, 200, false), Backward);
        assert_eq!(choose(base, base + 8193, 200, false), Forward);
    }

    /// The 16-byte loops must not be VEX-encoded: on a processor with
    /// AVX, a VEX instruction writing `xmmN` clears the upper half of
    /// `ymmN`, which in a kernel belongs to whatever thread was
    /// interrupted. Sets the upper halves of YMM0–YMM7, calls each large
    /// strategy, and checks the halves are intact. (Skipped, passing,
    /// where the processor has no AVX: nothing there can clear them.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_large_strategies_leave_the_upper_halves_of_ymm_registers_alone() {
        use core::arch::asm;
        if !std::is_x86_feature_detected!("avx") {
            return;
        }
        type Entry = unsafe extern "sysv64" fn(*mut u8, *const u8, usize);
        unsafe extern "sysv64" fn forward(d: *mut u8, s: *const u8, n: usize) {
            // SAFETY: as the callers below guarantee.
            unsafe { super::x86::forward(d, s, n) }
        }
        unsafe extern "sysv64" fn backward(d: *mut u8, s: *const u8, n: usize) {
            // SAFETY: as the callers below guarantee.
            unsafe { super::x86::backward(d, s, n) }
        }
        unsafe extern "sysv64" fn rep_movsb(d: *mut u8, s: *const u8, n: usize) {
            // SAFETY: as the callers below guarantee.
            unsafe { super::x86::rep_movsb(d, s, n) }
        }
        let all: [(&str, Entry); 3] = [
            ("forward", forward),
            ("backward", backward),
            ("rep movsb", rep_movsb),
        ];
        for (name, f) in all {
            let len = 4096 + 77;
            let src = pattern(len, 5);
            let mut dst = vec![0u8; len + 3];
            let mut upper = [0u8; 8 * 16];
            // SAFETY: AVX is present (checked above); the call passes
            // two distinct vectors' in-bounds ranges of `len > 128` bytes
            // with the System V convention the entry points use, and the
            // asm declares that convention's clobbers; `upper` has room
            // for the eight 16-byte halves stored through r12, which the
            // callee preserves. The stack is aligned for a call (no
            // `nostack`).
            unsafe {
                asm!(
                    "vcmpps ymm0, ymm0, ymm0, 15",
                    "vcmpps ymm1, ymm1, ymm1, 15",
                    "vcmpps ymm2, ymm2, ymm2, 15",
                    "vcmpps ymm3, ymm3, ymm3, 15",
                    "vcmpps ymm4, ymm4, ymm4, 15",
                    "vcmpps ymm5, ymm5, ymm5, 15",
                    "vcmpps ymm6, ymm6, ymm6, 15",
                    "vcmpps ymm7, ymm7, ymm7, 15",
                    "call rax",
                    "vextractf128 [r12], ymm0, 1",
                    "vextractf128 [r12 + 16], ymm1, 1",
                    "vextractf128 [r12 + 32], ymm2, 1",
                    "vextractf128 [r12 + 48], ymm3, 1",
                    "vextractf128 [r12 + 64], ymm4, 1",
                    "vextractf128 [r12 + 80], ymm5, 1",
                    "vextractf128 [r12 + 96], ymm6, 1",
                    "vextractf128 [r12 + 112], ymm7, 1",
                    "vzeroupper",
                    in("rax") f,
                    in("rdi") dst.as_mut_ptr().add(3),
                    in("rsi") src.as_ptr(),
                    in("rdx") len,
                    in("r12") upper.as_mut_ptr(),
                    clobber_abi("sysv64"),
                );
            }
            assert_eq!(&dst[3..], &src[..], "{name} copied");
            assert!(
                upper.iter().all(|&b| b == 0xFF),
                "{name} cleared upper YMM halves: {upper:02x?}"
            );
        }
    }

    proptest! {
        #[test]
        fn any_length_and_offsets_match_copy_from_slice(
            len in prop_oneof![0usize..300, 0usize..20_000],
            src_off in 0usize..4200,
            dst_off in 0usize..4200,
        ) {
            check_between(len, src_off, dst_off);
        }

        #[test]
        fn any_move_within_one_buffer_matches_copy_within(
            len in 0usize..10_000,
            src_off in 0usize..5000,
            dst_off in 0usize..5000,
        ) {
            check_within(len, src_off, dst_off);
        }
    }
}
