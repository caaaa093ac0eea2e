//! QPs, SRQs and AHs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_destroy_qp`, `ibv_create_srq` and its siblings, `ibv_create_ah`,
//! `ibv_init_ah_from_wc`, and the inline speed path (`ibv_post_send`,
//! `ibv_post_recv`, `ibv_post_srq_recv` through `context->ops`) on the
//! rings the driver mapped.

use std::ffi::{c_int, c_void};

use crate::os::{
    IvUserPostRecv, IvUserPostSrqRecv, IvUserQp, IvUserQpClose, IvUserQpOpen, IvUserRecvWr,
    IvUserSrq, IvUserSrqClose, IvUserSrqOpen, post_send_wr,
};
use irpverbs_abi::*;
use irpverbs_verbs::SendWr;
use zerocopy::FromBytes;
use zerocopy::IntoBytes;

use crate::abi::*;
use crate::cq::cq_handle;
use crate::events::{Mapped, destroy_mapped};
use crate::pd::{Pd, pd_of};
use crate::{COND, Context, MUTEX, context, errno_of, leak, null_with, set_errno};
use irpverbs_rdma_abi::iv::{qp_attr_from_iv, qp_cap_from_iv};

/// A QP: the `ibv_qp`, the driver's create response and the open speed
/// path.
#[repr(C)]
pub(crate) struct Qp {
    pub ibv: ibv_qp,
    pub out: IvCreateQpOut,
    pub user: *mut IvUserQp,
}

/// An SRQ.
#[repr(C)]
pub(crate) struct Srq {
    pub ibv: ibv_srq,
    pub out: IvCreateSrqOut,
    pub user: *mut IvUserSrq,
}

/// An AH: the `ibv_ah`, its handle and the number UD sends name it by.
#[repr(C)]
pub(crate) struct Ah {
    pub ibv: ibv_ah,
    pub handle: IvHandle,
    pub ahn: u32,
}

fn cap_of(c: &ibv_qp_cap) -> IvQpCap {
    IvQpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
        reserved: 0,
    }
}

fn ah_of(a: &ibv_ah_attr) -> IvAhAttr {
    IvAhAttr {
        dgid: a.grh.dgid.raw,
        flow_label: a.grh.flow_label,
        dlid: a.dlid,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global,
        port_num: a.port_num,
        reserved: [0; 2],
    }
}

/// `ibv_create_qp`: an RC, UC or UD QP (`EOPNOTSUPP` for other types);
/// `attr->cap` is updated to the queues' actual sizes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    // SAFETY: a PD from `ibv_alloc_pd` (C contract).
    let Some((p, c)) = (unsafe { pd_of(pd) }) else {
        return null_with(libc::EINVAL);
    };
    // SAFETY: a non-null init attr (C contract).
    let Some(a) = (unsafe { attr.as_mut() }) else {
        return null_with(libc::EINVAL);
    };
    if !matches!(a.qp_type, IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_UD) {
        return null_with(libc::EOPNOTSUPP);
    }
    if a.send_cq.is_null() || a.recv_cq.is_null() {
        return null_with(libc::EINVAL);
    }
    let q = leak(Qp {
        ibv: ibv_qp {
            context: p.ibv.context,
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: 0,
            qp_num: 0,
            state: IV_QPS_RESET as c_int,
            qp_type: a.qp_type,
            mutex: MUTEX,
            cond: COND,
            events_completed: 0,
        },
        out: IvCreateQpOut::default(),
        user: std::ptr::null_mut(),
    });
    // SAFETY: the CQs are the program's live objects (C contract).
    let send_cq = unsafe { cq_handle(a.send_cq) };
    // SAFETY: as above.
    let recv_cq = unsafe { cq_handle(a.recv_cq) };
    // SAFETY: the SRQ is NULL or a live SRQ (C contract).
    let srq = unsafe { a.srq.cast::<Srq>().as_ref() }.map_or(0, |s| s.out.srq);
    let created = c.client.create_qp_with(&IvCreateQpIn {
        pd: p.handle,
        send_cq,
        recv_cq,
        srq,
        user_context: q as u64,
        qp_type: a.qp_type as u32,
        sq_sig_all: u32::from(a.sq_sig_all != 0),
        cap: cap_of(&a.cap),
    });
    let out = match created {
        Ok(out) => out,
        Err(s) => {
            // SAFETY: just leaked, never handed out.
            drop(unsafe { Box::from_raw(q) });
            return null_with(errno_of(s));
        }
    };
    // SAFETY: the unmodified create response of a QP of this file.
    let user = unsafe { IvUserQpOpen(c.file.handle(), &out) };
    if user.is_null() {
        let _ = c.client.destroy_qp(out.qp);
        // SAFETY: just leaked, never handed out.
        drop(unsafe { Box::from_raw(q) });
        return null_with(libc::ENOMEM);
    }
    // SAFETY: `q` is ours until returned.
    let qm = unsafe { &mut *q };
    qm.ibv.handle = out.qp as u32;
    qm.ibv.qp_num = out.qpn;
    qm.out = out;
    qm.user = user;
    a.cap = qp_cap_from_iv(&out.cap);
    q.cast()
}

/// The QP behind `qp` and its context.
unsafe fn qp_of<'a>(qp: *mut ibv_qp) -> Option<(&'a Qp, &'a crate::Context)> {
    // SAFETY: forwarded (C contract).
    unsafe { crate::object_of(qp) }
}

impl crate::Object for Qp {
    fn context_ptr(&self) -> *mut ibv_context {
        self.ibv.context
    }
}

/// The handle of the QP `qp` and its context.
///
/// # Safety
/// `qp` is NULL or a live QP of this library.
pub(crate) unsafe fn qp_handle<'a>(qp: *mut ibv_qp) -> Option<(IvHandle, &'a crate::Context)> {
    // SAFETY: forwarded.
    unsafe { qp_of(qp) }.map(|(q, c)| (q.out.qp, c))
}

/// The handle of the SRQ `srq` and its context.
///
/// # Safety
/// `srq` is NULL or a live SRQ of this library.
pub(crate) unsafe fn srq_handle<'a>(srq: *mut ibv_srq) -> Option<(IvHandle, &'a crate::Context)> {
    // SAFETY: forwarded.
    unsafe { srq_of(srq) }.map(|(s, c)| (s.out.srq, c))
}

/// `ibv_modify_qp`: the attributes `attr_mask` names, checked by the
/// driver against the IBTA's table; `EINVAL` when they do not fit,
/// `EOPNOTSUPP` for a rate limit.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    // SAFETY: a QP from `ibv_create_qp` (C contract).
    let (Some((q, c)), Some(a)) = (unsafe { qp_of(qp) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    if attr_mask & IBV_QP_RATE_LIMIT != 0 {
        return libc::EOPNOTSUPP;
    }
    let Ok(mask) = u32::try_from(attr_mask) else {
        return libc::EINVAL;
    };
    if mask & !IV_QP_ATTR_ALL != 0 {
        return libc::EINVAL;
    }
    let iv = IvQpAttr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: a.path_mig_state as u32,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        // The local bits mean nothing for a QP: rdma-core's kernel
        // ignores them there (perftest sets IBV_ACCESS_LOCAL_WRITE); the
        // driver takes the remote ones.
        qp_access_flags: a.qp_access_flags & !(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify,
        sq_draining: a.sq_draining,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        cap: cap_of(&a.cap),
        ah_attr: ah_of(&a.ah_attr),
        alt_ah_attr: ah_of(&a.alt_ah_attr),
        ..IvQpAttr::default()
    };
    match c.client.modify_qp(q.out.qp, mask, &iv) {
        Ok(()) => {
            if mask & IV_QP_STATE != 0 {
                // SAFETY: a live QP; `state` is the library's to keep.
                unsafe { (*qp).state = a.qp_state };
            }
            0
        }
        Err(s) => errno_of(s),
    }
}

/// `ibv_query_qp`: every attribute (whatever `attr_mask` asks for), and
/// the init attributes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: a QP from `ibv_create_qp` (C contract).
    let Some((q, c)) = (unsafe { qp_of(qp) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || init_attr.is_null() {
        return libc::EINVAL;
    }
    let out = match c.client.query_qp(q.out.qp) {
        Ok(o) => o,
        Err(s) => return errno_of(s),
    };
    let a = &out.attr;
    let qa = qp_attr_from_iv(a);
    // SAFETY: a non-null out pointer (checked).
    unsafe { attr.write(qa) };
    // SAFETY: a live QP; `state` is the library's to keep.
    unsafe { (*qp).state = qa.qp_state };
    let init = ibv_qp_init_attr {
        qp_context: q.ibv.qp_context,
        send_cq: q.ibv.send_cq,
        recv_cq: q.ibv.recv_cq,
        srq: q.ibv.srq,
        cap: qp_cap_from_iv(&a.cap),
        qp_type: q.ibv.qp_type,
        sq_sig_all: out.sq_sig_all as c_int,
    };
    // SAFETY: a non-null out pointer (checked).
    unsafe { init_attr.write(init) };
    0
}

/// `ibv_destroy_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    // SAFETY: a QP from `ibv_create_qp` (C contract).
    let Some((_, c)) = (unsafe { qp_of(qp) }) else {
        return libc::EINVAL;
    };
    // SAFETY: a QP of `leak`, not in use (C contract).
    unsafe { destroy_mapped(qp.cast::<Qp>(), c) }
}

impl Mapped for Qp {
    fn settle(&self, c: &Context) {
        c.drop_async_of(self.out.qp);
    }

    fn destroy(&self, c: &Context) -> Result<(), NtStatus> {
        c.client.destroy_qp(self.out.qp)
    }

    unsafe fn close(&mut self) {
        // SAFETY: the rings the speed path opened (caller: once).
        unsafe { IvUserQpClose(self.user) };
    }

    unsafe fn reopen(&mut self, c: &Context) {
        // SAFETY: the QP the driver kept (caller).
        self.user = unsafe { IvUserQpOpen(c.file.handle(), &self.out) };
    }
}

fn opcode_of(op: c_int) -> Option<u8> {
    Some(match op {
        IBV_WR_RDMA_WRITE => IV_WR_RDMA_WRITE,
        IBV_WR_RDMA_WRITE_WITH_IMM => IV_WR_RDMA_WRITE_WITH_IMM,
        IBV_WR_SEND => IV_WR_SEND,
        IBV_WR_SEND_WITH_IMM => IV_WR_SEND_WITH_IMM,
        IBV_WR_RDMA_READ => IV_WR_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IV_WR_ATOMIC_CMP_AND_SWP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IV_WR_ATOMIC_FETCH_AND_ADD,
        IBV_WR_LOCAL_INV => IV_WR_LOCAL_INV,
        IBV_WR_SEND_WITH_INV => IV_WR_SEND_WITH_INV,
        _ => return None,
    })
}

fn flags_of(f: u32) -> Option<u8> {
    if f & !(IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE) != 0 {
        return None;
    }
    let bit = |ibv: u32, iv: u8| if f & ibv != 0 { iv } else { 0 };
    Some(
        bit(IBV_SEND_FENCE, IV_SEND_FENCE)
            | bit(IBV_SEND_SIGNALED, IV_SEND_SIGNALED)
            | bit(IBV_SEND_SOLICITED, IV_SEND_SOLICITED)
            | bit(IBV_SEND_INLINE, IV_SEND_INLINE),
    )
}

/// The most inline data one send gathers from several SGEs (one SGE is
/// sent from its own buffer): more than any irpverbs HCA inlines.
const INLINE_MAX: usize = 1024;

/// The most SGEs a work request names (the rings' limit; a QP's own is
/// at most this).
const MAX_SGE: usize = 32;

/// One `ibv_send_wr` posted: 0 or the errno. The speed path's work request
/// is built here, from the program's, and written into the mapped ring
/// by the post (no C work request between them).
///
/// # Safety
/// `w` is a valid work request of a QP of `q`'s type.
unsafe fn post_one(q: &Qp, w: &ibv_send_wr) -> c_int {
    let (Some(opcode), Some(flags)) = (opcode_of(w.opcode), flags_of(w.send_flags)) else {
        return libc::EINVAL;
    };
    let num_sge = match usize::try_from(w.num_sge) {
        Ok(n) if n <= MAX_SGE => n,
        _ => return libc::EINVAL,
    };
    let sges: &[ibv_sge] = if num_sge == 0 {
        &[]
    } else if w.sg_list.is_null() {
        return libc::EINVAL;
    } else {
        // SAFETY: the program's gather list of `num_sge` entries (C
        // contract), at most MAX_SGE.
        unsafe { std::slice::from_raw_parts(w.sg_list, num_sge) }
    };
    let mut send = SendWr {
        wr_id: w.wr_id,
        opcode,
        flags,
        imm_or_inv: match w.opcode {
            IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM => u32::from_be(w.imm_data),
            _ => w.imm_data,
        },
        ..SendWr::default()
    };
    match w.opcode {
        IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
            // SAFETY: the atomic member for atomic opcodes.
            let a = unsafe { w.wr.atomic };
            (send.remote_addr, send.rkey, send.compare_add, send.swap) =
                (a.remote_addr, a.rkey, a.compare_add, a.swap);
        }
        _ if q.ibv.qp_type == IBV_QPT_UD => {
            // SAFETY: the ud member on a UD QP.
            let ud = unsafe { w.wr.ud };
            // SAFETY: an AH from `ibv_create_ah` (C contract).
            let Some(ah) = (unsafe { ud.ah.cast::<Ah>().as_ref() }) else {
                return libc::EINVAL;
            };
            send.ud = Some((ah.ahn, ud.remote_qpn, ud.remote_qkey));
        }
        _ => {
            // SAFETY: the rdma member otherwise.
            let r = unsafe { w.wr.rdma };
            (send.remote_addr, send.rkey) = (r.remote_addr, r.rkey);
        }
    }
    if w.send_flags & IBV_SEND_INLINE == 0 {
        // `ibv_sge` is laid out as `IvSge`.
        // SAFETY: the same entries, as the speed path's type.
        send.sges = unsafe { std::slice::from_raw_parts(sges.as_ptr().cast::<IvSge>(), num_sge) };
    } else if let [one] = sges {
        let len = one.length as usize;
        if len > 0 && one.addr == 0 {
            return libc::EINVAL;
        }
        send.inline = Some(if len == 0 {
            &[]
        } else {
            // SAFETY: inline data is read from the program's buffer during
            // the post (as rdma-core's providers copy it at post time).
            unsafe { std::slice::from_raw_parts(one.addr as usize as *const u8, len) }
        });
    } else {
        // SAFETY: forwarded (caller; the list is the program's).
        return unsafe { post_gathered(q, send, sges) };
    }
    // SAFETY: an open speed-path QP; the request's list or data is valid
    // for the call.
    errno_of(unsafe { post_send_wr(q.user, &send) })
}

/// An inline send gathered from several SGEs (or none) into one buffer
/// first: 0 or the errno.
///
/// # Safety
/// As for [`post_one`]; `sges` is the request's gather list.
#[cold]
unsafe fn post_gathered(q: &Qp, send: SendWr<'_>, sges: &[ibv_sge]) -> c_int {
    let mut gather = [0u8; INLINE_MAX];
    let mut len = 0usize;
    for s in sges {
        let n = s.length as usize;
        let Some(to) = gather.get_mut(len..len + n) else {
            return libc::EINVAL;
        };
        if n > 0 && s.addr == 0 {
            return libc::EINVAL;
        }
        if n > 0 {
            // SAFETY: inline data is read from the program's buffers now
            // (as rdma-core's providers copy it at post time).
            to.copy_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as usize as *const u8, n)
            });
        }
        len += n;
    }
    let send = SendWr {
        inline: Some(&gather[..len]),
        ..send
    };
    // SAFETY: an open speed-path QP; the data is `gather`, alive for the
    // call.
    errno_of(unsafe { post_send_wr(q.user, &send) })
}

/// `ops.post_send` (`ibv_post_send`): posts the chain in order; on a
/// failure `*bad_wr` is the first request not posted.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: a QP from `ibv_create_qp` (C contract).
    let Some(q) = (unsafe { qp.cast::<Qp>().as_ref() }) else {
        return libc::EINVAL;
    };
    let mut cur = wr;
    // SAFETY: a chain of valid work requests (C contract).
    while let Some(w) = unsafe { cur.as_ref() } {
        // SAFETY: as above.
        let e = unsafe { post_one(q, w) };
        if e != 0 {
            if !bad_wr.is_null() {
                // SAFETY: a valid out pointer (C contract).
                unsafe { bad_wr.write(cur) };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// Posts a chain of receive requests with `post`; on a failure `*bad_wr`
/// is the first not posted.
///
/// # Safety
/// `wr` is a chain of valid receive requests.
unsafe fn post_recv_chain(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl Fn(&IvUserRecvWr) -> NtStatus,
) -> c_int {
    let mut cur = wr;
    // SAFETY: a chain of valid receive requests (caller).
    while let Some(w) = unsafe { cur.as_ref() } {
        let e = match u32::try_from(w.num_sge) {
            Ok(num_sge) => errno_of(post(&IvUserRecvWr {
                wr_id: w.wr_id,
                // `ibv_sge` is laid out as `IvSge`.
                sg_list: w.sg_list.cast_const().cast::<IvSge>(),
                num_sge,
                reserved: 0,
            })),
            Err(_) => libc::EINVAL,
        };
        if e != 0 {
            if !bad_wr.is_null() {
                // SAFETY: a valid out pointer (C contract).
                unsafe { bad_wr.write(cur) };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

/// `ops.post_recv` (`ibv_post_recv`).
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: a QP from `ibv_create_qp` (C contract).
    let Some(q) = (unsafe { qp.cast::<Qp>().as_ref() }) else {
        return libc::EINVAL;
    };
    // SAFETY: the program's chain; each request's list is valid for the
    // call; an open speed-path QP.
    unsafe { post_recv_chain(wr, bad_wr, |r| IvUserPostRecv(q.user, r)) }
}

/// `ops.post_srq_recv` (`ibv_post_srq_recv`).
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: an SRQ from `ibv_create_srq` (C contract).
    let Some(s) = (unsafe { srq.cast::<Srq>().as_ref() }) else {
        return libc::EINVAL;
    };
    // SAFETY: as for `post_recv`, on an open speed-path SRQ.
    unsafe { post_recv_chain(wr, bad_wr, |r| IvUserPostSrqRecv(s.user, r)) }
}

/// `ibv_create_srq`: `attr->attr` is updated to the actual sizes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    // SAFETY: a PD from `ibv_alloc_pd` (C contract).
    let (Some((p, c)), Some(a)) = (unsafe { pd_of(pd) }, unsafe { attr.as_mut() }) else {
        return null_with(libc::EINVAL);
    };
    let s = leak(Srq {
        ibv: ibv_srq {
            context: p.ibv.context,
            srq_context: a.srq_context,
            pd,
            handle: 0,
            mutex: MUTEX,
            cond: COND,
            events_completed: 0,
        },
        out: IvCreateSrqOut::default(),
        user: std::ptr::null_mut(),
    });
    let i = IvCreateSrqIn {
        pd: p.handle,
        user_context: s as u64,
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
        reserved: 0,
    };
    let (status, bytes) = c.client.raw(
        IOCTL_IV_CREATE_SRQ,
        i.as_bytes(),
        size_of::<IvCreateSrqOut>(),
    );
    let out = match IvCreateSrqOut::read_from_bytes(&bytes) {
        Ok(out) if nt_success(status) => out,
        _ => {
            // SAFETY: just leaked, never handed out.
            drop(unsafe { Box::from_raw(s) });
            return null_with(if nt_success(status) {
                libc::EIO
            } else {
                errno_of(status)
            });
        }
    };
    // SAFETY: the unmodified create response of an SRQ of this file.
    let user = unsafe { IvUserSrqOpen(c.file.handle(), &out) };
    if user.is_null() {
        let _ = c.client.destroy_srq(out.srq);
        // SAFETY: just leaked, never handed out.
        drop(unsafe { Box::from_raw(s) });
        return null_with(libc::ENOMEM);
    }
    // SAFETY: `s` is ours until returned.
    let sm = unsafe { &mut *s };
    sm.ibv.handle = out.srq as u32;
    sm.out = out;
    sm.user = user;
    a.attr.max_wr = out.max_wr;
    a.attr.max_sge = out.max_sge;
    s.cast()
}

unsafe fn srq_of<'a>(srq: *mut ibv_srq) -> Option<(&'a Srq, &'a crate::Context)> {
    // SAFETY: forwarded (C contract).
    unsafe { crate::object_of(srq) }
}

impl crate::Object for Srq {
    fn context_ptr(&self) -> *mut ibv_context {
        self.ibv.context
    }
}

/// `ibv_modify_srq`: its size (`IBV_SRQ_MAX_WR`) or limit
/// (`IBV_SRQ_LIMIT`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    // SAFETY: an SRQ from `ibv_create_srq` (C contract).
    let (Some((s, c)), Some(a)) = (unsafe { srq_of(srq) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 {
        return libc::EINVAL;
    }
    match c
        .client
        .modify_srq(s.out.srq, mask as u32, a.max_wr, a.srq_limit)
    {
        Ok(()) => 0,
        Err(st) => errno_of(st),
    }
}

/// `ibv_query_srq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    // SAFETY: an SRQ from `ibv_create_srq` (C contract).
    let Some((s, c)) = (unsafe { srq_of(srq) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    match c.client.query_srq(s.out.srq) {
        Ok(o) => {
            // SAFETY: a non-null out pointer (checked).
            unsafe {
                attr.write(ibv_srq_attr {
                    max_wr: o.max_wr,
                    max_sge: o.max_sge,
                    srq_limit: o.srq_limit,
                })
            };
            0
        }
        Err(st) => errno_of(st),
    }
}

/// `ibv_destroy_srq`: `EBUSY` while QPs use it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    // SAFETY: an SRQ from `ibv_create_srq` (C contract).
    let Some((_, c)) = (unsafe { srq_of(srq) }) else {
        return libc::EINVAL;
    };
    // SAFETY: an SRQ of `leak`, not in use (C contract).
    unsafe { destroy_mapped(srq.cast::<Srq>(), c) }
}

impl Mapped for Srq {
    fn settle(&self, c: &Context) {
        c.drop_async_of(self.out.srq);
    }

    fn destroy(&self, c: &Context) -> Result<(), NtStatus> {
        c.client.destroy_srq(self.out.srq)
    }

    unsafe fn close(&mut self) {
        // SAFETY: the ring the speed path opened (caller: once).
        unsafe { IvUserSrqClose(self.user) };
    }

    unsafe fn reopen(&mut self, c: &Context) {
        // SAFETY: the SRQ the driver kept (caller).
        self.user = unsafe { IvUserSrqOpen(c.file.handle(), &self.out) };
    }
}

/// `ibv_create_ah`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    // SAFETY: a PD from `ibv_alloc_pd` (C contract).
    let (Some((p, c)), Some(a)) = (unsafe { pd_of(pd) }, unsafe { attr.as_ref() }) else {
        return null_with(libc::EINVAL);
    };
    match c.client.create_ah(p.handle, &ah_of(a)) {
        Ok(out) => leak(Ah {
            ibv: ibv_ah {
                context: p.ibv.context,
                pd,
                handle: out.ah as u32,
            },
            handle: out.ah,
            ahn: out.ahn,
        })
        .cast(),
        Err(s) => null_with(errno_of(s)),
    }
}

/// `ibv_destroy_ah`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    // SAFETY: an AH's `ibv_ah` is the first field of its `Ah` (C contract).
    let Some(h) = (unsafe { ah.cast::<Ah>().as_ref() }) else {
        return libc::EINVAL;
    };
    // SAFETY: its context is open (C contract).
    let Some(c) = (unsafe { context(h.ibv.context) }) else {
        return libc::EINVAL;
    };
    match c.client.destroy_ah(h.handle) {
        Ok(()) => {
            // SAFETY: from `leak` in `ibv_create_ah`, destroyed once.
            drop(unsafe { Box::from_raw(ah.cast::<Ah>()) });
            0
        }
        Err(s) => errno_of(s),
    }
}

/// The index of `gid` in `port`'s table, if it is there.
fn gid_index(c: &crate::Context, port: u8, gid: &[u8; 16]) -> Option<u8> {
    let len = c.client.query_port(u32::from(port)).ok()?.gid_tbl_len;
    (0..len.min(256))
        .find(|&i| {
            c.client
                .query_gid(u32::from(port), i)
                .is_ok_and(|g| g == *gid)
        })
        .and_then(|i| u8::try_from(i).ok())
}

fn ipv4_mapped(a: &[u8]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xFF;
    g[11] = 0xFF;
    g[12..].copy_from_slice(&a[..4]);
    g
}

/// `ibv_init_ah_from_wc`: the address vector back to the sender of the
/// UD receive `wc`, from the 40 bytes before its payload (`grh`): a GRH,
/// or for RoCE v2 over IPv4 20 bytes and the IPv4 header. -1 with `EINVAL`
/// when the receiving GID is not in `port_num`'s table.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    ctx: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let (Some(c), Some(w), false) = (
        unsafe { context(ctx) },
        unsafe { wc.as_ref() },
        ah_attr.is_null(),
    ) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let mut a = ibv_ah_attr {
        dlid: w.slid,
        sl: w.sl,
        src_path_bits: w.dlid_path_bits,
        port_num,
        ..ibv_ah_attr::default()
    };
    if w.wc_flags & IBV_WC_GRH != 0 {
        // SAFETY: the 40 bytes before the payload (C contract).
        let Some(g) = (unsafe { grh.cast::<[u8; 40]>().as_ref() }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let ip4 = &g[20..];
        let (sgid, dgid, tclass, flow) = if ip4[0] >> 4 == 4 {
            (
                ipv4_mapped(&ip4[12..16]),
                ipv4_mapped(&ip4[16..20]),
                ip4[1],
                0,
            )
        } else {
            let vtf = u32::from_be_bytes([g[0], g[1], g[2], g[3]]);
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&g[8..24]);
            d.copy_from_slice(&g[24..40]);
            (s, d, ((vtf >> 20) & 0xFF) as u8, vtf & 0xF_FFFF)
        };
        let Some(index) = gid_index(c, port_num, &dgid) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        a.is_global = 1;
        a.grh = ibv_global_route {
            dgid: ibv_gid { raw: sgid },
            flow_label: flow,
            sgid_index: index,
            hop_limit: 0xFF,
            traffic_class: tclass,
        };
    }
    // SAFETY: a non-null out pointer (checked).
    unsafe { ah_attr.write(a) };
    0
}

/// `ibv_create_ah_from_wc`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    // SAFETY: a PD from `ibv_alloc_pd` (C contract).
    let Some(p) = (unsafe { pd.cast::<Pd>().as_ref() }) else {
        return null_with(libc::EINVAL);
    };
    let mut a = ibv_ah_attr::default();
    // SAFETY: forwarded (C contract).
    if unsafe { ibv_init_ah_from_wc(p.ibv.context, port_num, wc, grh, &mut a) } != 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: as above.
    unsafe { ibv_create_ah(pd, &mut a) }
}

/// `ibv_qp_to_qp_ex`: NULL, as for every QP not created with
/// `ibv_create_qp_ex` (which this library does not offer).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut c_void {
    std::ptr::null_mut()
}
