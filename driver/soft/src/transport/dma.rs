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
}

pub(crate) use crate::firmware::mr::mr_by_key;

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
    /// The offset in the pinned region of `len` bytes at `addr`, if they
    /// lie inside the MR and the region.
    pub(crate) fn offset_of(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.checked_add(len)?;
        if addr < self.start || end > self.end {
            return None;
        }
        // Inside the region too: `end` is at most its length past `addr`.
        // (Wrapping: a fast-register MR's `addr` may lie above its iova,
        // `crate::firmware::fast_reg`.)
        usize::try_from(addr.wrapping_sub(self.addr)).ok()
    }

    /// The region.
    pub(crate) fn region(&self) -> &irpverbs_ring::Shared<Region> {
        &self.region.0
    }
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

/// The MR a local SGE names, checked ([`local_range`]). Returns the MR
/// and the SGE's region offset.
fn local_sge<'m>(
    mrs: &'m Table<Mr>,
    pdn: u32,
    sge: &IvSge,
    write: bool,
) -> Result<(&'m Mr, usize), DmaError> {
    let mr = mr_by_key(mrs, sge.lkey).ok_or(DmaError::Prot)?;
    let off = local_range(mr, pdn, sge, write).ok_or(DmaError::Prot)?;
    Ok((mr, off))
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
        let (mr, base) = local_sge(mrs, pdn, sge, write)?;
        let n = (sl - offset).min(len);
        // Both fit: inside one SGE of at most 4 GiB, checked in the region.
        let (o, n_us) = (
            usize::try_from(offset).map_err(|_| DmaError::Prot)?,
            usize::try_from(n).map_err(|_| DmaError::Prot)?,
        );
        f(mr, base + o, n_us)?;
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
    pub(crate) fn copy_to(
        &mut self,
        dst: &Region,
        mut dst_off: usize,
        mut len: usize,
    ) -> Result<(), DmaError> {
        match self {
            Self::Region { region, off } => {
                Region::copy(dst, dst_off, region, *off, len).map_err(|_| DmaError::Prot)?;
                *off += len;
                Ok(())
            }
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
                    let (mr, base) = local_sge(mrs, *pdn, sge, false)?;
                    let n = (sl - *off).min(len);
                    Region::copy(dst, dst_off, mr.region(), base + *off, n)
                        .map_err(|_| DmaError::Prot)?;
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
            Self::Region { len, .. } => len,
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
        out.push(Seg {
            region: mr.region().clone(),
            offset: off,
            len: n,
        });
        Ok(())
    })
}
