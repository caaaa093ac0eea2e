//! The HCA's memory access: keys to MRs, SGE lists to pieces of regions,
//! and copies between regions (one `Region::copy` per contiguous piece: no
//! bounce buffer).
//!
//! Every access is checked: the key names a live MR (its generation
//! matches) or, for a remote access, a bound memory window, of the right
//! PD, with the access right, and the range is inside both the MR (or
//! window) and the memory pinned for it.

use irpverbs_abi::{IV_ACCESS_LOCAL_WRITE, IvSge};
use irpverbs_ring::Region;

use crate::firmware::mr::Mr;
use crate::firmware::table::Table;
use crate::wire::packet::Seg;

/// Why an access through an SGE list failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DmaError {
    /// The list is shorter than the bytes asked for.
    Len,
    /// A key, PD, access right or bound is wrong.
    Prot,
    /// A list of payload segments could not grow (a registration mapped
    /// page by page splits a range into more pieces than the room a
    /// frame reserves): the frame is lost, as when its batch cannot grow.
    NoMemory,
}

pub(crate) use crate::firmware::mr::{mr_by_key, mr_index};

/// The MR or memory window an rkey names for the responder of QP `qpn`
/// (a window's view of its MR, `crate::firmware::mw`): one table index
/// either way.
#[inline(always)]
pub(crate) fn rkey_mr<'m>(
    mrs: &'m Table<Mr>,
    mws: &'m Table<crate::firmware::mw::Mw>,
    key: u32,
    qpn: u32,
) -> Option<&'m Mr> {
    if key & (crate::firmware::mw::MW_INDEX << 8) == 0 {
        mr_by_key(mrs, key)
    } else {
        crate::firmware::mw::window_by_key(mws, key, qpn)
    }
}

impl Mr {
    /// Whether the `len` bytes at `addr` lie inside the MR and the memory
    /// pinned for it (`end` is at most the region's length past `addr`;
    /// an MR mapped page by page has `end` 0 and checked pages up to
    /// `start + length`).
    #[inline(always)]
    pub(crate) fn holds(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        addr >= self.start
            && (end <= self.end
                || (self.pages.is_some() && end <= self.start.saturating_add(self.length)))
    }

    /// The region offset of `addr` and how many of the `len` bytes from
    /// there lie in one piece of the region, if all `len` lie inside the
    /// MR and the region: all of them unless the MR maps page by page
    /// (`crate::firmware::fast_reg::Pages`).
    #[inline(always)]
    pub(crate) fn piece(&self, addr: u64, len: u64) -> Option<(usize, u64)> {
        if !self.holds(addr, len) {
            return None;
        }
        match &self.pages {
            // (Wrapping: a fast-register MR's `addr` may lie above its
            // iova, `crate::firmware::fast_reg`.)
            None => Some((usize::try_from(addr.wrapping_sub(self.addr)).ok()?, len)),
            Some(pages) => paged(pages, addr, len),
        }
    }

    /// The offset in the pinned region of `len` bytes at `addr`, if they
    /// lie inside the MR and the region, in one piece. An MR mapped page
    /// by page has none (its `end` is 0): the fast path leaves its
    /// accesses to the general path, which copies them piece by piece.
    #[inline(always)]
    pub(crate) fn offset_of(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.checked_add(len)?;
        if addr < self.start || end > self.end {
            return None;
        }
        // Inside the region too: `end` is at most its length past `addr`.
        usize::try_from(addr.wrapping_sub(self.addr)).ok()
    }

    /// The region.
    pub(crate) fn region(&self) -> &irpverbs_ring::Shared<Region> {
        &self.region.0
    }

    /// Visits the `len` bytes at `addr` (inside the MR: checked by the
    /// caller) piece by piece, as (region offset, length).
    ///
    /// # Errors
    /// [`DmaError::Prot`] when they are not inside; `f`'s error.
    #[inline(always)]
    pub(crate) fn for_each_run(
        &self,
        mut addr: u64,
        mut len: u64,
        mut f: impl FnMut(usize, usize) -> Result<(), DmaError>,
    ) -> Result<(), DmaError> {
        while len > 0 {
            let (offset, n) = self.piece(addr, len).ok_or(DmaError::Prot)?;
            if n == 0 {
                return Err(DmaError::Prot);
            }
            f(offset, usize::try_from(n).map_err(|_| DmaError::Prot)?)?;
            addr += n;
            len -= n;
        }
        Ok(())
    }
}

/// [`Mr::piece`] of a registration mapped page by page (off the hot path:
/// ordinary MRs are one piece).
#[cold]
#[inline(never)]
fn paged(pages: &crate::firmware::fast_reg::Pages, addr: u64, len: u64) -> Option<(usize, u64)> {
    if len == 0 {
        return Some((0, 0));
    }
    pages.piece(addr, len)
}

/// Appends `seg` to a frame's payload segments: in the room the frame
/// reserved, or grown fallibly past it.
///
/// # Errors
/// [`DmaError::NoMemory`].
pub(crate) fn push_seg(out: &mut alloc::vec::Vec<Seg>, seg: Seg) -> Result<(), DmaError> {
    if out.len() == out.capacity() && out.try_reserve(1).is_err() {
        return Err(DmaError::NoMemory);
    }
    out.push(seg);
    Ok(())
}

/// The `len` bytes at `va` of `mr` (inside it: checked by the caller) as
/// payload segments.
///
/// # Errors
/// [`DmaError::Prot`], [`DmaError::NoMemory`].
pub(crate) fn mr_segs(
    mr: &Mr,
    va: u64,
    len: u64,
    out: &mut alloc::vec::Vec<Seg>,
) -> Result<(), DmaError> {
    mr.for_each_run(va, len, |offset, n| {
        push_seg(
            out,
            Seg {
                region: mr.region().clone(),
                offset,
                len: n,
            },
        )
    })
}

/// Copies the next `len` bytes of `src` into `mr` at `va` (inside it:
/// checked by the caller), piece by piece.
///
/// # Errors
/// [`DmaError::Prot`].
pub(crate) fn write_mr(src: &mut Source<'_>, mr: &Mr, va: u64, len: u64) -> Result<(), DmaError> {
    mr.for_each_run(va, len, |offset, n| src.copy_to(mr.region(), offset, n))
}

/// The rule of a local SGE, for the MR its key names: the MR is of the
/// QP's PD (`pdn`), allows LOCAL_WRITE when the HCA writes (`write`), and
/// holds the whole SGE. Returns the SGE's region offset.
#[inline(always)]
pub(crate) fn local_range(mr: &Mr, pdn: u32, sge: &IvSge, write: bool) -> Option<usize> {
    if mr.pdn != pdn || (write && mr.access & IV_ACCESS_LOCAL_WRITE == 0) {
        return None;
    }
    mr.offset_of(sge.addr, u64::from(sge.length))
}

/// The rule of a remote access (an rkey's READ, WRITE or atomic), for the
/// MR the key names: the MR is of the responder QP's PD (`pdn`), grants
/// `need` (`IV_ACCESS_REMOTE_*`), and holds the `len` bytes at `va`.
/// Returns their region offset.
#[inline(always)]
pub(crate) fn remote_range(mr: &Mr, pdn: u32, need: u32, va: u64, len: u64) -> Option<usize> {
    if mr.pdn != pdn || mr.access & need == 0 {
        return None;
    }
    mr.offset_of(va, len)
}

/// [`remote_range`]'s rule, for bytes that may lie in more than one piece
/// of the region.
#[inline(always)]
pub(crate) fn remote_ok(mr: &Mr, pdn: u32, need: u32, va: u64, len: u64) -> bool {
    mr.pdn == pdn && mr.access & need != 0 && mr.holds(va, len)
}

/// The MR a local SGE names, checked as [`local_range`] checks it (its
/// bytes may lie in more than one piece of the region).
fn local_sge<'m>(
    mrs: &'m Table<Mr>,
    pdn: u32,
    sge: &IvSge,
    write: bool,
) -> Result<&'m Mr, DmaError> {
    let mr = mr_by_key(mrs, sge.lkey).ok_or(DmaError::Prot)?;
    let ok = mr.pdn == pdn
        && (!write || mr.access & IV_ACCESS_LOCAL_WRITE != 0)
        && mr.holds(sge.addr, u64::from(sge.length));
    if ok { Ok(mr) } else { Err(DmaError::Prot) }
}

/// The SGE bytes `offset..offset + len` (some, inside the SGE) where they
/// lie in one piece of the region of the MR its key names, checked as
/// [`local_sge`] checks the SGE (`write`: the HCA writes them): the MR
/// (its index in the table is the key's, [`mr_index`]) and the region
/// offset. `None` when they do not lie in one piece or a check fails:
/// the caller walks the list with [`for_each_piece`], which tells which.
#[inline(always)]
pub(crate) fn resolve_sge<'m>(
    mrs: &'m Table<Mr>,
    pdn: u32,
    sge: &IvSge,
    offset: u64,
    len: u64,
    write: bool,
) -> Option<(&'m Mr, usize)> {
    let end = offset.checked_add(len)?;
    if len == 0 || end > u64::from(sge.length) {
        return None;
    }
    let mr = local_sge(mrs, pdn, sge, write).ok()?;
    let off = mr.offset_of(sge.addr.checked_add(offset)?, len)?;
    Some((mr, off))
}

/// Checks every SGE of a list (zero-length ones are ignored) and returns
/// the total length.
///
/// # Errors
/// [`DmaError::Prot`].
pub(crate) fn check_sges(
    mrs: &Table<Mr>,
    pdn: u32,
    sges: &[IvSge],
    write: bool,
) -> Result<u64, DmaError> {
    let mut total = 0u64;
    for sge in sges.iter().filter(|s| s.length != 0) {
        local_sge(mrs, pdn, sge, write)?;
        total += u64::from(sge.length);
    }
    Ok(total)
}

/// Visits the pieces of the message bytes `offset..offset + len` that an
/// SGE list describes, as (MR, region offset, length), checking each SGE
/// used.
///
/// # Errors
/// [`DmaError::Len`] when the list is shorter; [`DmaError::Prot`].
pub(crate) fn for_each_piece<'m>(
    mrs: &'m Table<Mr>,
    pdn: u32,
    sges: &[IvSge],
    mut offset: u64,
    mut len: u64,
    write: bool,
    mut f: impl FnMut(&'m Mr, usize, usize) -> Result<(), DmaError>,
) -> Result<(), DmaError> {
    for sge in sges {
        if len == 0 {
            return Ok(());
        }
        let sl = u64::from(sge.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let mr = local_sge(mrs, pdn, sge, write)?;
        let n = (sl - offset).min(len);
        // Inside one SGE of at most 4 GiB, checked in the region.
        mr.for_each_run(sge.addr + offset, n, |off, n| f(mr, off, n))?;
        len -= n;
        offset = 0;
    }
    if len == 0 { Ok(()) } else { Err(DmaError::Len) }
}

/// Where copied bytes come from: a packet's payload segments, a range of a
/// region (a send queue slot's inline data, an MR's), a local gather list
/// read where it lies (a requester's, between two QPs of this HCA), or
/// bytes of the HCA's own (a GRH, an atomic's original value).
pub(crate) enum Source<'a> {
    /// Payload segments, consumed in order.
    Segs {
        /// The segments.
        segs: &'a [Seg],
        /// Current segment.
        i: usize,
        /// Bytes of it already copied.
        off: usize,
    },
    /// One contiguous range of a region.
    Region {
        /// The region.
        region: &'a Region,
        /// Offset of the next byte.
        off: usize,
    },
    /// A local gather list, each SGE checked as the HCA reads it
    /// ([`local_range`]): SGE `i`, `off` bytes into it next.
    Gather {
        /// The MRs its keys name.
        mrs: &'a Table<Mr>,
        /// The PD of the QP whose list it is.
        pdn: u32,
        /// The list.
        sges: &'a [IvSge],
        /// Current SGE.
        i: usize,
        /// Bytes of it already copied.
        off: usize,
    },
    /// Plain bytes.
    Bytes {
        /// The bytes.
        bytes: &'a [u8],
        /// Bytes already copied.
        pos: usize,
    },
}

impl<'a> Source<'a> {
    /// A cursor at the start of `segs`.
    pub(crate) fn segs(segs: &'a [Seg]) -> Self {
        Self::Segs { segs, i: 0, off: 0 }
    }

    /// A cursor at the start of the gather list `sges` of a QP of PD
    /// `pdn`.
    pub(crate) fn gather(mrs: &'a Table<Mr>, pdn: u32, sges: &'a [IvSge]) -> Self {
        Self::Gather {
            mrs,
            pdn,
            sges,
            i: 0,
            off: 0,
        }
    }

    /// A cursor at the start of `bytes`.
    pub(crate) fn bytes(bytes: &'a [u8]) -> Self {
        Self::Bytes { bytes, pos: 0 }
    }

    /// Copies the next `len` bytes to `dst` at `dst_off`.
    ///
    /// # Errors
    /// [`DmaError::Prot`] when a range falls outside its region, or the
    /// source is shorter than `len`.
    #[inline(always)]
    pub(crate) fn copy_to(
        &mut self,
        dst: &Region,
        dst_off: usize,
        len: usize,
    ) -> Result<(), DmaError> {
        // One range (a short-circuited payload in one piece, inline data):
        // one copy, without the walk's frame.
        if let Self::Region { region, off } = self {
            return copy_range(dst, dst_off, region, off, len);
        }
        self.copy_walk(dst, dst_off, len)
    }

    /// [`Self::copy_to`] from segments, a gather list or bytes.
    #[inline(never)]
    fn copy_walk(
        &mut self,
        dst: &Region,
        mut dst_off: usize,
        mut len: usize,
    ) -> Result<(), DmaError> {
        match self {
            Self::Region { region, off } => copy_range(dst, dst_off, region, off, len),
            Self::Bytes { bytes, pos } => {
                let end = pos.checked_add(len).ok_or(DmaError::Prot)?;
                let chunk = bytes.get(*pos..end).ok_or(DmaError::Prot)?;
                dst.write(dst_off, chunk).map_err(|_| DmaError::Prot)?;
                *pos = end;
                Ok(())
            }
            Self::Gather {
                mrs,
                pdn,
                sges,
                i,
                off,
            } => {
                while len > 0 {
                    let sge = sges.get(*i).ok_or(DmaError::Prot)?;
                    let sl = sge.length as usize;
                    if *off >= sl {
                        *i += 1;
                        *off = 0;
                        continue;
                    }
                    let mr = local_sge(mrs, *pdn, sge, false)?;
                    let want = u64::try_from((sl - *off).min(len)).map_err(|_| DmaError::Prot)?;
                    let (base, n) = mr
                        .piece(sge.addr + *off as u64, want)
                        .ok_or(DmaError::Prot)?;
                    let n = usize::try_from(n).map_err(|_| DmaError::Prot)?;
                    if n == 0 {
                        return Err(DmaError::Prot);
                    }
                    Region::copy(dst, dst_off, mr.region(), base, n).map_err(|_| DmaError::Prot)?;
                    len -= n;
                    dst_off += n;
                    *off += n;
                }
                Ok(())
            }
            Self::Segs { segs, i, off } => {
                while len > 0 {
                    let s = segs.get(*i).ok_or(DmaError::Prot)?;
                    let n = (s.len - *off).min(len);
                    Region::copy(dst, dst_off, &s.region, s.offset + *off, n)
                        .map_err(|_| DmaError::Prot)?;
                    len -= n;
                    dst_off += n;
                    *off += n;
                    if *off == s.len {
                        *i += 1;
                        *off = 0;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Copies `len` bytes of `region` from `*off` to `dst` at `dst_off`, and
/// moves `*off` past them.
#[inline(always)]
fn copy_range(
    dst: &Region,
    dst_off: usize,
    region: &Region,
    off: &mut usize,
    len: usize,
) -> Result<(), DmaError> {
    Region::copy(dst, dst_off, region, *off, len).map_err(|_| DmaError::Prot)?;
    *off += len;
    Ok(())
}

/// A packet's (or burst's) payload as its receiver copies from it: the
/// segments a frame carries, or, for a request short-circuited between
/// two QPs of this HCA ([`crate::transport::local`]), the sender's memory
/// where it lies.
#[derive(Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// A frame's segments.
    Segs(&'a [Seg]),
    /// `len` bytes of `region` at `off` (a send queue slot's inline data).
    Region {
        /// The region.
        region: &'a Region,
        /// Offset of the first byte.
        off: usize,
        /// Bytes.
        len: usize,
    },
    /// `len` bytes of the region of MR `index` at region offset `off`:
    /// a gather list's bytes in one piece of one MR, which the sender
    /// resolved and checked (key, PD, range) as it sent them
    /// ([`resolve_sge`], [`mr_index`]); the receiver copies from there without looking
    /// the key up again.
    Mr {
        /// The MR's index in the MR table.
        index: u32,
        /// Region offset of the first byte.
        off: usize,
        /// Bytes.
        len: usize,
    },
    /// The message bytes `offset..offset + len` of the gather list `sges`
    /// of a QP of PD `pdn`, checked by the sender before it sent them.
    Gather {
        /// The sender's PD.
        pdn: u32,
        /// The gather list.
        sges: &'a [IvSge],
        /// First message byte.
        offset: u64,
        /// Bytes.
        len: u32,
    },
}

impl<'a> Payload<'a> {
    /// No payload.
    pub(crate) const NONE: Payload<'static> = Payload::Segs(&[]);

    /// The bytes it carries.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        match *self {
            Self::Segs(segs) => segs.iter().map(|s| s.len).sum(),
            Self::Region { len, .. } | Self::Mr { len, .. } => len,
            Self::Gather { len, .. } => len as usize,
        }
    }

    /// A cursor at its first byte (a gather list's keys looked up in
    /// `mrs` as it is read).
    #[inline(always)]
    pub(crate) fn source<'b>(&self, mrs: &'b Table<Mr>) -> Source<'b>
    where
        'a: 'b,
    {
        match *self {
            Self::Segs(segs) => Source::segs(segs),
            Self::Region { region, off, .. } => Source::Region { region, off },
            // The MR cannot go while the run that resolved it holds the
            // HCA; were it gone, nothing is copied (a protection error).
            Self::Mr { index, off, .. } => match mrs.get(index) {
                Ok(mr) => Source::Region {
                    region: mr.region(),
                    off,
                },
                Err(_) => Source::bytes(&[]),
            },
            Self::Gather {
                pdn, sges, offset, ..
            } => {
                // Positioned at message byte `offset`.
                let (mut i, mut off) = (0, offset);
                while let Some(s) = sges.get(i)
                    && off >= u64::from(s.length)
                    && off > 0
                {
                    off -= u64::from(s.length);
                    i += 1;
                }
                Source::Gather {
                    mrs,
                    pdn,
                    sges,
                    i,
                    off: usize::try_from(off).unwrap_or(usize::MAX),
                }
            }
        }
    }
}

/// Copies `len` bytes from `src` into the message bytes from `offset` of
/// a local SGE list (the HCA writes: LOCAL_WRITE required).
///
/// # Errors
/// [`DmaError::Len`] when the list is too short; [`DmaError::Prot`].
pub(crate) fn scatter(
    mrs: &Table<Mr>,
    pdn: u32,
    sges: &[IvSge],
    offset: u64,
    len: u64,
    src: &mut Source<'_>,
) -> Result<(), DmaError> {
    // The common case (the bytes land in one piece of the only SGE): one
    // copy, the SGE checked as `for_each_piece` checks it.
    if let [sge] = sges
        && let Some((mr, off)) = resolve_sge(mrs, pdn, sge, offset, len, true)
    {
        // At most an SGE's 4 GiB.
        return src.copy_to(mr.region(), off, len as usize);
    }
    scatter_walk(src, mrs, pdn, sges, (offset, len))
}

/// [`scatter`] piece by piece: the message bytes `at` (offset, length).
#[inline(never)]
fn scatter_walk(
    src: &mut Source<'_>,
    mrs: &Table<Mr>,
    pdn: u32,
    sges: &[IvSge],
    at: (u64, u64),
) -> Result<(), DmaError> {
    let (offset, len) = at;
    for_each_piece(mrs, pdn, sges, offset, len, true, |mr, off, n| {
        src.copy_to(mr.region(), off, n)
    })
}

/// Appends the pieces of the message bytes `offset..offset + len` of a
/// local SGE list as payload segments (the HCA reads: no access right
/// needed beyond the key).
///
/// # Errors
/// As [`for_each_piece`].
pub(crate) fn gather(
    mrs: &Table<Mr>,
    pdn: u32,
    sges: &[IvSge],
    offset: u64,
    len: u64,
    out: &mut alloc::vec::Vec<Seg>,
) -> Result<(), DmaError> {
    for_each_piece(mrs, pdn, sges, offset, len, false, |mr, off, n| {
        push_seg(
            out,
            Seg {
                region: mr.region().clone(),
                offset: off,
                len: n,
            },
        )
    })
}
