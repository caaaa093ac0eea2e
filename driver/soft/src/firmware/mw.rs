//! Memory windows: their keys, their binds and invalidations, and the
//! rules of each (IBTA 10.6.7; docs/memory-windows.md).
//!
//! A window's rkey is `((MW_INDEX | index) << 8) | key`: the top bit of the
//! 24-bit index marks a window (MR indices stay below it), `index` is its
//! slot in the window table (from 1) and `key` the 8-bit key of its current
//! binding. A remote access looks an rkey up by that index, in the window
//! table or the MR table (one table index either way), and a window bound
//! to an MR is checked as an MR is: a bound window holds a view of its MR
//! (an [`Mr`] with the window's start, end and access, the MR's region),
//! which the same range and access rules then check.
//!
//! - Type 1: bound by `Command::BindMw` (`IOCTL_IV_BIND_MW`), to no QP;
//!   length 0 unbinds; each bind gives it a new key. Any QP of its PD may
//!   use it. Not invalidated by work requests.
//! - Type 2 (2B): bound by an `IV_WR_BIND_MW` work request to the QP that
//!   posted it, with the key that request chose; only that QP's responder
//!   honours it. Invalidated by `IV_WR_LOCAL_INV` or a SEND with
//!   invalidate (of a QP of its PD), after which a new bind may follow.
//!
//! An MR counts the windows bound to it and refuses deregistration while
//! there are any; deallocating a window unbinds it.

use irpverbs_abi::{
    IV_ACCESS_LOCAL_WRITE, IV_ACCESS_MW_ALL, IV_ACCESS_MW_BIND, IV_ACCESS_REMOTE_ATOMIC,
    IV_ACCESS_REMOTE_WRITE, IV_MW_TYPE_1, IV_MW_TYPE_2, IvSendWqe, NtStatus, STATUS_ACCESS_DENIED,
    STATUS_INVALID_HANDLE, STATUS_INVALID_PARAMETER, STATUS_INVALID_PARAMETER_MIX,
};
use irpverbs_core::{BindMw, CommandOut};

use crate::firmware::Firmware;
use crate::firmware::mr::{Mr, make_key};
use crate::firmware::table::Table;

/// The index bit that marks a window's key.
pub(crate) const MW_INDEX: u32 = 1 << 23;

/// A memory window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mw {
    /// Its PD.
    pub(crate) pdn: u32,
    /// `IV_MW_TYPE_1` or `IV_MW_TYPE_2`.
    pub(crate) mw_type: u32,
    /// The 8-bit key of its rkey.
    pub(crate) key: u8,
    /// Its binding, while bound.
    pub(crate) bound: Option<Bound>,
}

/// A window's binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bound {
    /// The MR's index.
    pub(crate) mr: u32,
    /// Type 2: the QP it is bound to (the only one whose responder
    /// honours it).
    pub(crate) qpn: Option<u32>,
    /// The window as an MR: the window's PD, range and access, the MR's
    /// region and address (region offsets stay the MR's).
    pub(crate) view: Mr,
}

/// Why a bind is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindError {
    /// Access flags other than `IV_ACCESS_REMOTE_*`, or a range that is
    /// empty (type 2), wraps or leaves the MR.
    Invalid,
    /// The MR lacks `IV_ACCESS_MW_BIND`, or local write when the window
    /// grants remote write or atomics.
    Access,
}

impl BindError {
    fn status(self) -> NtStatus {
        match self {
            Self::Invalid => STATUS_INVALID_PARAMETER,
            Self::Access => STATUS_ACCESS_DENIED,
        }
    }
}

/// The rkey of window slot `index` with key `key`.
pub(crate) const fn mw_key(index: u32, key: u8) -> u32 {
    make_key(index | MW_INDEX, key)
}

/// The window slot an rkey names (any key), if it names a window.
pub(crate) const fn mw_index(rkey: u32) -> Option<u32> {
    let index = rkey >> 8;
    if index & MW_INDEX != 0 {
        Some(index & !MW_INDEX)
    } else {
        None
    }
}

/// The view of `mr` that a window of PD `pdn` bound to `addr..addr+length`
/// with `access` gives, checked: the MR allows binds, the access is remote
/// only and the MR has local write if the window writes, the range is
/// inside the MR (`length` 0 is an empty range at `addr`).
///
/// # Errors
/// [`BindError`].
pub(crate) fn bind_view(
    mr: &Mr,
    pdn: u32,
    addr: u64,
    length: u64,
    access: u32,
) -> Result<Mr, BindError> {
    if access & !IV_ACCESS_MW_ALL != 0 {
        return Err(BindError::Invalid);
    }
    let writes = access & (IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_ATOMIC) != 0;
    if mr.access & IV_ACCESS_MW_BIND == 0 || (writes && mr.access & IV_ACCESS_LOCAL_WRITE == 0) {
        return Err(BindError::Access);
    }
    let end = addr.checked_add(length).ok_or(BindError::Invalid)?;
    if addr < mr.start || end > mr.start.saturating_add(mr.length) {
        return Err(BindError::Invalid);
    }
    Ok(Mr {
        pdn,
        addr: mr.addr,
        start: addr,
        length,
        // Inside the region too.
        end: end.min(mr.end),
        access,
        physical: mr.physical,
        region: mr.region.clone(),
        windows: crate::firmware::Refs::default(),
        fast: None,
        pages: mr.pages.clone(),
    })
}

/// Ends `mw`'s binding, if any: its MR has one window fewer.
fn unbind(mrs: &mut Table<Mr>, mw: &mut Mw) {
    if let Some(b) = mw.bound.take() {
        if let Ok(mr) = mrs.get_mut(b.mr) {
            mr.windows.put();
        }
    }
}

/// Binds `mw` to MR `mr_index` as `view` (for QP `qpn`, type 2) with the
/// new key `key`; a previous binding (type 1) ends.
fn bind(mrs: &mut Table<Mr>, mw: &mut Mw, mr_index: u32, view: Mr, qpn: Option<u32>, key: u8) {
    unbind(mrs, mw);
    if let Ok(mr) = mrs.get_mut(mr_index) {
        mr.windows.get();
    }
    mw.key = key;
    mw.bound = Some(Bound {
        mr: mr_index,
        qpn,
        view,
    });
}

/// The window an rkey names for the responder of QP `qpn`: bound, with
/// that key, and (type 2) bound to that QP. Its view is checked as an MR
/// (the transport's `dma::remote_range`).
#[inline]
pub(crate) fn window_by_key(mws: &Table<Mw>, rkey: u32, qpn: u32) -> Option<&Mr> {
    let mw = mws.get(mw_index(rkey)?).ok()?;
    let b = mw.bound.as_ref()?;
    if rkey as u8 != mw.key || b.qpn.is_some_and(|q| q != qpn) {
        return None;
    }
    Some(&b.view)
}

/// An `IV_WR_BIND_MW` work request of QP `qpn` (PD `pdn`): binds the type
/// 2 window its new rkey names to the MR its `imm_or_inv` lkey names.
///
/// # Errors
/// `IV_WC_MW_BIND_ERR` (the caller's status) for a key that names no
/// window, a type 1 window, a window bound already, a window or MR of
/// another PD, an MR key that names no MR, a zero length, or a refused
/// [`bind_view`].
pub(crate) fn bind_wr(
    mrs: &mut Table<Mr>,
    mws: &mut Table<Mw>,
    qpn: u32,
    pdn: u32,
    wqe: &IvSendWqe,
) -> Result<(), ()> {
    let index = mw_index(wqe.rkey).ok_or(())?;
    let mw = mws.get_mut(index).map_err(|_| ())?;
    if mw.mw_type != IV_MW_TYPE_2 || mw.bound.is_some() || mw.pdn != pdn || wqe.compare_add == 0 {
        return Err(());
    }
    let mr_index = wqe.imm_or_inv >> 8;
    let mr = crate::firmware::mr::mr_by_key(mrs, wqe.imm_or_inv).ok_or(())?;
    if mr.pdn != pdn {
        return Err(());
    }
    let access = u32::try_from(wqe.swap).map_err(|_| ())?;
    let view = bind_view(mr, pdn, wqe.remote_addr, wqe.compare_add, access).map_err(|_| ())?;
    bind(mrs, mw, mr_index, view, Some(qpn), wqe.rkey as u8);
    Ok(())
}

/// Invalidates the type 2 window `rkey` names, for a QP of PD `pdn` (an
/// `IV_WR_LOCAL_INV`, or a SEND with invalidate at the responder). An MR's
/// key is refused: an MR registered by `REG_MR` cannot be invalidated.
///
/// # Errors
/// When `rkey` names no bound type 2 window of PD `pdn` with that key.
pub(crate) fn invalidate(
    mrs: &mut Table<Mr>,
    mws: &mut Table<Mw>,
    pdn: u32,
    rkey: u32,
) -> Result<(), ()> {
    let mw = mws.get_mut(mw_index(rkey).ok_or(())?).map_err(|_| ())?;
    if mw.mw_type != IV_MW_TYPE_2 || mw.pdn != pdn || mw.bound.is_none() || rkey as u8 != mw.key {
        return Err(());
    }
    unbind(mrs, mw);
    Ok(())
}

impl Firmware {
    /// `AllocMw`: an unbound window. Returns its rkey.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for an unknown PD; `STATUS_INVALID_PARAMETER`
    /// for an unknown type; `STATUS_INSUFFICIENT_RESOURCES` when `max_mw`
    /// windows exist.
    pub(crate) fn alloc_mw(&mut self, pdn: u32, mw_type: u32) -> Result<CommandOut, NtStatus> {
        self.pds.get(pdn)?;
        if !matches!(mw_type, IV_MW_TYPE_1 | IV_MW_TYPE_2) {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let index = self.mws.insert(Mw {
            pdn,
            mw_type,
            key: 0,
            bound: None,
        })?;
        let key = self.mws.generation(index)?;
        self.mws.get_mut(index)?.key = key;
        self.pds.get_mut(pdn)?.refs.get();
        Ok(CommandOut::Mw {
            rkey: mw_key(index, key),
        })
    }

    /// `DeallocMw`: the window goes, unbound first.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` when `rkey` names no window.
    pub(crate) fn dealloc_mw(&mut self, rkey: u32) -> Result<CommandOut, NtStatus> {
        let index = mw_index(rkey).ok_or(STATUS_INVALID_HANDLE)?;
        self.dealloc_mw_index(index)
    }

    /// [`Firmware::dealloc_mw`] by slot.
    pub(crate) fn dealloc_mw_index(&mut self, index: u32) -> Result<CommandOut, NtStatus> {
        let mut mw = self.mws.remove(index)?;
        unbind(&mut self.mrs, &mut mw);
        self.pds.get_mut(mw.pdn)?.refs.put();
        Ok(CommandOut::None)
    }

    /// `BindMw`: binds (length 0: unbinds) a type 1 window, with a new key.
    /// Returns the new rkey.
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for a key that names no window or MR;
    /// `STATUS_INVALID_PARAMETER` for a type 2 window, access flags other
    /// than `IV_ACCESS_REMOTE_*` or a range outside the MR;
    /// `STATUS_INVALID_PARAMETER_MIX` for an MR of another PD;
    /// `STATUS_ACCESS_DENIED` for an MR without `IV_ACCESS_MW_BIND`, or
    /// without local write for a window that grants remote write or
    /// atomics.
    pub(crate) fn bind_mw(&mut self, c: &BindMw) -> Result<CommandOut, NtStatus> {
        let index = mw_index(c.rkey).ok_or(STATUS_INVALID_HANDLE)?;
        let mw = self.mws.get_mut(index)?;
        if mw.mw_type != IV_MW_TYPE_1 {
            return Err(STATUS_INVALID_PARAMETER);
        }
        let mr = crate::firmware::mr::mr_by_key(&self.mrs, c.lkey).ok_or(STATUS_INVALID_HANDLE)?;
        if mr.pdn != mw.pdn {
            return Err(STATUS_INVALID_PARAMETER_MIX);
        }
        let key = mw.key.wrapping_add(1);
        if c.length == 0 {
            unbind(&mut self.mrs, mw);
            mw.key = key;
        } else {
            let view =
                bind_view(mr, mw.pdn, c.addr, c.length, c.access).map_err(BindError::status)?;
            bind(&mut self.mrs, mw, c.lkey >> 8, view, None, key);
        }
        Ok(CommandOut::Mw {
            rkey: mw_key(index, key),
        })
    }
}
