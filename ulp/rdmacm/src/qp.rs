//! QPs of ids and endpoints: `rdma_create_qp`, `rdma_create_qp_ex`,
//! `rdma_destroy_qp`, `rdma_create_ep`, `rdma_destroy_ep`; for a QP the
//! program moves itself, `rdma_init_qp_attr` and `rdma_establish`; plus
//! `rpoll`.
//!
//! A QP is created with libibverbs' `ibv_create_qp` on the id's device.
//! An RC QP stays in RESET: `rdma_connect` and `rdma_accept` hand it to
//! the driver's CM, whose one request moves it to INIT, RTR and RTS
//! (receives posted before that are kept). A UD QP is moved to RTS at
//! once with `RDMA_UDP_QKEY`, as librdmacm does. An id without a QP
//! connects the program's (`qp_num` in the connection parameters): the
//! driver's CM then moves no QP, `rdma_init_qp_attr` gives the attributes
//! of each state (`IOCTL_IV_CM_INIT_QP_ATTR`), and the active side answers
//! `CONNECT_RESPONSE` with `rdma_establish` (`IOCTL_IV_CM_ESTABLISH`).

use std::ffi::{c_int, c_void};
use std::net::SocketAddr;

use crate::abi::*;
use crate::device::*;
use crate::id::{
    Id, Phase, bind, id_of, rdma_create_id, rdma_destroy_id, resolve_addr, sockaddr_get,
};
use crate::{err, ret};
use irpverbs_abi::{
    IOCTL_IV_CM_ESTABLISH, IOCTL_IV_CM_INIT_QP_ATTR, IvCmInitQpAttrIn, IvCmInitQpAttrOut,
    IvHandleIn,
};

use crate::os::{self, errno};

/// Destroys the CQs and completion channels `rdma_create_qp` made for
/// the id.
fn destroy_cqs(i: &Id) {
    if !std::mem::take(&mut i.state().own_cqs) {
        return;
    }
    let cm = i.cm();
    for (cq, ch) in [
        (&mut cm.send_cq, &mut cm.send_cq_channel),
        (&mut cm.recv_cq, &mut cm.recv_cq_channel),
    ] {
        if !cq.is_null() {
            // SAFETY: a CQ this library created, its QP destroyed.
            unsafe { ibv_destroy_cq(*cq) };
            *cq = std::ptr::null_mut();
        }
        if !ch.is_null() {
            // SAFETY: its channel, without CQs now.
            unsafe { ibv_destroy_comp_channel(*ch) };
            *ch = std::ptr::null_mut();
        }
    }
}

/// A CQ of `cqe` entries on a new completion channel, for the id.
fn new_cq(i: &Id, cqe: u32) -> Result<(*mut c_void, *mut c_void), c_int> {
    // SAFETY: the id's open context.
    let ch = unsafe { ibv_create_comp_channel(i.cm().verbs) };
    if ch.is_null() {
        return Err(errno());
    }
    let me = std::ptr::from_ref(i).cast_mut().cast::<c_void>();
    // SAFETY: the context, the channel just made.
    let cq = unsafe { ibv_create_cq(i.cm().verbs, cqe.max(1) as c_int, me, ch, 0) };
    if cq.is_null() {
        let e = errno();
        // SAFETY: the channel just made, without CQs.
        unsafe { ibv_destroy_comp_channel(ch) };
        return Err(e);
    }
    Ok((cq, ch))
}

/// Moves a UD QP to RTS as librdmacm does (P_Key index 0, the id's port,
/// `RDMA_UDP_QKEY`, send PSN 0).
fn ud_to_rts(qp: *mut c_void, port: u8) -> Result<(), c_int> {
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: port.max(1),
        qkey: RDMA_UDP_QKEY,
        ..ibv_qp_attr::default()
    };
    let steps = [
        (
            IBV_QPS_INIT,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
        ),
        (IBV_QPS_RTR, IBV_QP_STATE),
        (IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN),
    ];
    for (state, mask) in steps {
        a.qp_state = state;
        // SAFETY: a live QP; attributes on the stack.
        let r = unsafe { ibv_modify_qp(qp, &mut a, mask) };
        if r != 0 {
            return Err(r);
        }
    }
    Ok(())
}

/// `rdma_create_qp`: a QP on the id's device, in `pd` (NULL: the
/// device's); CQs given as NULL are made, each on its own completion
/// channel (`id->send_cq`, `id->recv_cq` and their channels). `EINVAL`
/// for an id not yet on a device (bound to an address, or resolved), a PD
/// of another device, or NULL attributes.
///
/// # Safety
/// `id` is NULL or a live id; `pd` NULL or a PD of libibverbs;
/// `qp_init_attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut c_void,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: forwarded (caller).
    let (Some(i), Some(attr)) = (unsafe { id_of(id) }, unsafe { qp_init_attr.as_mut() }) else {
        return err(libc::EINVAL);
    };
    ret(create_qp(i, pd, attr))
}

fn create_qp(i: &Id, pd: *mut c_void, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    let d = device()?;
    if i.cm().verbs.is_null() || !i.cm().qp.is_null() {
        return Err(libc::EINVAL);
    }
    let pd = if pd.is_null() { d.pd } else { pd };
    // SAFETY: a PD of libibverbs (caller).
    if unsafe { &*pd.cast::<ibv_pd>() }.context.cast() != i.cm().verbs {
        return Err(libc::EINVAL);
    }
    // rdma-core's examples leave the type 0 (no type): the id's.
    if attr.qp_type == 0 {
        attr.qp_type = i.cm().qp_type;
    }
    if attr.qp_type != i.cm().qp_type {
        return Err(libc::EINVAL);
    }
    let made = attr.send_cq.is_null() || attr.recv_cq.is_null();
    if attr.recv_cq.is_null() {
        let (cq, ch) = new_cq(i, attr.cap.max_recv_wr)?;
        i.cm().recv_cq = cq;
        i.cm().recv_cq_channel = ch;
        i.state().own_cqs = true;
        attr.recv_cq = cq.cast();
    }
    if attr.send_cq.is_null() {
        match new_cq(i, attr.cap.max_send_wr) {
            Ok((cq, ch)) => {
                i.cm().send_cq = cq;
                i.cm().send_cq_channel = ch;
                i.state().own_cqs = true;
                attr.send_cq = cq.cast();
            }
            Err(e) => {
                destroy_cqs(i);
                return Err(e);
            }
        }
    }
    // SAFETY: the PD and attributes checked above.
    let qp = unsafe { ibv_create_qp(pd, attr) };
    if qp.is_null() {
        let e = errno();
        if made {
            destroy_cqs(i);
        }
        return Err(e);
    }
    if attr.qp_type == IBV_QPT_UD {
        if let Err(e) = ud_to_rts(qp, i.cm().port_num) {
            // SAFETY: the QP just made.
            unsafe { ibv_destroy_qp(qp) };
            if made {
                destroy_cqs(i);
            }
            return Err(e);
        }
    }
    i.cm().qp = qp;
    i.cm().pd = pd;
    Ok(())
}

/// `rdma_create_qp_ex`: as `rdma_create_qp`, with the PD of the extended
/// attributes (`IBV_QP_INIT_ATTR_PD`); other extended attributes are
/// `EOPNOTSUPP`.
///
/// # Safety
/// `id` is NULL or a live id; `qp_init_attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    qp_init_attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    // SAFETY: forwarded (caller).
    let (Some(i), Some(a)) = (unsafe { id_of(id) }, unsafe { qp_init_attr.as_mut() }) else {
        return err(libc::EINVAL);
    };
    if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
        return err(libc::EOPNOTSUPP);
    }
    let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
        a.pd
    } else {
        std::ptr::null_mut()
    };
    let mut attr = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    let r = create_qp(i, pd.cast(), &mut attr);
    a.cap = attr.cap;
    a.send_cq = attr.send_cq;
    a.recv_cq = attr.recv_cq;
    ret(r)
}

/// `rdma_destroy_qp`: destroys the id's QP (and the CQs `rdma_create_qp`
/// made for it).
///
/// # Safety
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return;
    };
    if !i.cm().qp.is_null() {
        // SAFETY: the id's QP.
        if unsafe { ibv_destroy_qp(i.cm().qp) } != 0 {
            return;
        }
        i.cm().qp = std::ptr::null_mut();
    }
    destroy_cqs(i);
}

/// `rdma_create_ep`: a synchronous id from `rdma_getaddrinfo`'s result:
/// passive (`RAI_PASSIVE`), bound to the source address, keeping the QP
/// attributes for the ids `rdma_get_request` returns; active, resolved to
/// the destination (address and route) with a QP if attributes are given.
///
/// # Safety
/// `id` is NULL or writable; `res` NULL or from `rdma_getaddrinfo`; `pd`
/// NULL or a PD; `qp_init_attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut c_void,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: NULL or valid (caller).
    let Some(r) = (unsafe { res.as_ref() }) else {
        return err(libc::EINVAL);
    };
    if id.is_null() {
        return err(libc::EINVAL);
    }
    let mut cm = std::ptr::null_mut();
    // SAFETY: a place for the id; no channel (synchronous).
    if unsafe {
        rdma_create_id(
            std::ptr::null_mut(),
            &mut cm,
            std::ptr::null_mut(),
            r.ai_port_space,
        )
    } != 0
    {
        return -1;
    }
    // SAFETY: the id just made.
    let i = unsafe { id_of(cm) }.expect("a new id");
    // SAFETY: NULL or valid (caller).
    let attr = unsafe { qp_init_attr.as_mut() };
    let done = (|| -> Result<(), c_int> {
        if r.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the result's source address (or NULL).
            bind(i, unsafe { sockaddr_get(r.ai_src_addr) }?)?;
            if let Some(a) = attr {
                i.state().ep_qp = Some((*a, pd));
            }
            return Ok(());
        }
        let src: Option<SocketAddr> = if r.ai_src_addr.is_null() {
            None
        } else {
            // SAFETY: the result's source address.
            Some(unsafe { sockaddr_get(r.ai_src_addr) }?)
        };
        // SAFETY: the result's destination address (or NULL).
        let dst = unsafe { sockaddr_get(r.ai_dst_addr) }?;
        resolve_addr(i, src, dst)?;
        // SAFETY: the id, its address resolved.
        if unsafe { crate::id::rdma_resolve_route(cm, 2000) } != 0 {
            return Err(errno());
        }
        if let Some(a) = attr {
            create_qp(i, pd, a)?;
        }
        Ok(())
    })();
    match done {
        Ok(()) => {
            // SAFETY: writable (caller).
            unsafe { *id = cm };
            0
        }
        Err(e) => {
            // SAFETY: the id just made, not handed out.
            unsafe { rdma_destroy_id(cm) };
            err(e)
        }
    }
}

/// `rdma_destroy_ep`: the id's QP (and CQs it made), then the id.
///
/// # Safety
/// `id` is NULL or a live id, not used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: forwarded (caller).
    unsafe { rdma_destroy_qp(id) };
    // SAFETY: forwarded (caller).
    unsafe { rdma_destroy_id(id) };
}

/// `rdma_init_qp_attr`: the attributes and mask that move a QP the
/// program owns to `qp_attr->qp_state` (INIT, RTR or RTS) for the id's
/// connection, as rdma-core's: before a connect (address or route
/// resolved) INIT from the id's port (P_Key index 0, no remote access);
/// then the driver's CM's (`IOCTL_IV_CM_INIT_QP_ATTR`: INIT once the REQ
/// left or came, RTR and RTS once the REP came or from the connect
/// request); a UD id's from its port and `RDMA_UDP_QKEY`. The whole of
/// `*qp_attr` is written. `EINVAL` for NULL arguments, another state, or
/// a state the connection does not give yet (or any more).
///
/// # Safety
/// `id` is NULL or a live id; `qp_attr` and `qp_attr_mask` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    // SAFETY: forwarded (caller).
    let (Some(i), Some(attr)) = (unsafe { id_of(id) }, unsafe { qp_attr.as_mut() }) else {
        return err(libc::EINVAL);
    };
    if qp_attr_mask.is_null() {
        return err(libc::EINVAL);
    }
    match init_qp_attr(i, attr.qp_state) {
        Ok((a, mask)) => {
            *attr = a;
            // SAFETY: non-null (checked), writable (caller).
            unsafe { qp_attr_mask.write(mask) };
            0
        }
        Err(e) => err(e),
    }
}

fn init_qp_attr(i: &Id, state: c_int) -> Result<(ibv_qp_attr, c_int), c_int> {
    if i.cm().verbs.is_null() {
        return Err(libc::EINVAL);
    }
    let port = i.cm().port_num.max(1);
    let phase = i.state().phase;
    let local = |mask: c_int| {
        let a = ibv_qp_attr {
            qp_state: state,
            port_num: port,
            ..ibv_qp_attr::default()
        };
        (a, mask)
    };
    if i.cm().qp_type == IBV_QPT_UD {
        // As `rdma_create_qp` moves a UD QP (librdmacm's).
        let (mut a, mask) = match state {
            IBV_QPS_INIT => local(IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
            IBV_QPS_RTR => local(IBV_QP_STATE),
            IBV_QPS_RTS => local(IBV_QP_STATE | IBV_QP_SQ_PSN),
            _ => return Err(libc::EINVAL),
        };
        a.qkey = RDMA_UDP_QKEY;
        return Ok((a, mask));
    }
    if state == IBV_QPS_INIT && matches!(phase, Phase::AddrResolved | Phase::RouteResolved) {
        // No connection yet: rdma_cm's own (no CM to ask).
        return Ok(local(
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        ));
    }
    let qp_state = u32::try_from(state).map_err(|_| libc::EINVAL)?;
    let d = device()?;
    let input = IvCmInitQpAttrIn {
        cep: i.cep,
        qp_state,
        starting_psn: i.state().psn,
    };
    let out: IvCmInitQpAttrOut = call(d, IOCTL_IV_CM_INIT_QP_ATTR, &input).map_err(errno_of)?;
    Ok((
        irpverbs_rdma_abi::iv::qp_attr_from_iv(&out.attr),
        out.attr_mask as c_int,
    ))
}

/// `rdma_establish`: the active side of a connection without a QP of the
/// id, after `CONNECT_RESPONSE` and the program's QP moved to RTS: the
/// RTU (`IOCTL_IV_CM_ESTABLISH`); the connection is established (the
/// passive side gets `ESTABLISHED`; this side no event, as rdma-core's).
/// `EINVAL` for NULL, an id with a QP, or an id not in that state.
///
/// # Safety
/// `id` is NULL or a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    // SAFETY: forwarded (caller).
    let Some(i) = (unsafe { id_of(id) }) else {
        return err(libc::EINVAL);
    };
    if !i.cm().qp.is_null() || i.state().phase != Phase::ConnectResponse {
        return err(libc::EINVAL);
    }
    let d = match device() {
        Ok(d) => d,
        Err(e) => return err(e),
    };
    let input = IvHandleIn { handle: i.cep };
    match call_none(d, IOCTL_IV_CM_ESTABLISH, &input) {
        Ok(()) => {
            let mut st = i.state();
            if st.phase == Phase::ConnectResponse {
                st.phase = Phase::Connected;
            }
            0
        }
        Err(s) => err(errno_of(s)),
    }
}

/// `rpoll`: every descriptor here is an ordinary one (no rsockets), so it
/// is `poll`.
///
/// # Safety
/// As `poll`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rpoll(fds: *mut os::pollfd, nfds: os::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: forwarded (caller).
    unsafe { os::poll(fds, nfds, timeout) }
}
