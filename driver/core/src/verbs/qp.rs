//! `CREATE_QP`, `MODIFY_QP` through the IBTA state machine, `QUERY_QP`,
//! and the attribute value checks. (`DESTROY_QP` is a destroy:
//! `destroy.rs`.)

use irpverbs_abi::*;
use irpverbs_ring::Ring;

use super::Op;
use crate::device::{Device, State};
use crate::object::{Body, Kind, Object, Qp};
use crate::qp_state::check_modify;
use crate::{Command, CommandOut, CreateQp, FileKey, Hca, ModifyQp, Platform, RequestorMode};

/// Q_Keys with the high bit set are controlled: only kernel callers may
/// set them (IBTA 10.2.4).
pub const CONTROLLED_QKEY: u32 = 0x8000_0000;

fn check_cap(cap: &IvQpCap, caps: &IvQueryDeviceOut, with_srq: bool) -> Result<(), NtStatus> {
    if cap.reserved != 0
        || cap.max_send_wr > caps.max_qp_wr
        || cap.max_recv_wr > caps.max_qp_wr
        || cap.max_send_sge > caps.max_sge
        || cap.max_recv_sge > caps.max_sge
        || cap.max_inline_data > caps.max_inline_data
    {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if with_srq && (cap.max_recv_wr != 0 || cap.max_recv_sge != 0) {
        return Err(STATUS_INVALID_PARAMETER);
    }
    Ok(())
}

/// `IOCTL_IV_CREATE_QP`: a QP in RESET over the file's PD, CQs and SRQ.
///
/// # Errors
/// `STATUS_INVALID_PARAMETER` for an unknown QP type, `sq_sig_all` over 1,
/// a reserved field set, sizes above the device's limits, or receive sizes
/// with an SRQ; `STATUS_INVALID_HANDLE` for a PD, CQ or SRQ handle that
/// names no live object of that kind in the file; those of
/// [`Device::reserve_with`].
pub(crate) fn create_qp<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    i: &IvCreateQpIn,
) -> Result<(Op, Command), NtStatus> {
    let caps = d.hca.caps();
    if !matches!(i.qp_type, IV_QPT_RC | IV_QPT_UC | IV_QPT_UD) || i.sq_sig_all > 1 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    check_cap(&i.cap, caps, i.srq != 0)?;
    let f = s.file(file)?;
    let pd = f.objects.lookup(i.pd, Kind::Pd)?;
    let send_cq = f.objects.lookup(i.send_cq, Kind::Cq)?;
    let recv_cq = f.objects.lookup(i.recv_cq, Kind::Cq)?;
    let srq = if i.srq == 0 {
        None
    } else {
        Some(f.objects.lookup(i.srq, Kind::Srq)?)
    };
    let number = |idx: u32| match &f.objects.get(idx).body {
        Body::Cq(c) => c.cqn,
        Body::Srq(s) => s.srqn,
        _ => 0,
    };
    let (send_cqn, recv_cqn, srqn) = (number(send_cq), number(recv_cq), srq.map(number));
    let pdn = super::pd::pdn(s, file, pd);
    let body = Body::Qp(Qp {
        pd,
        send_cq,
        recv_cq,
        srq,
        qpn: 0,
        qp_type: i.qp_type,
        cap: i.cap,
        state: IV_QPS_RESET,
        user_context: i.user_context,
        sq: None,
        rq: None,
    });
    let rings = crate::quota::qp_rings(&i.cap, i.srq != 0);
    let idx = d.reserve_with(s, file, body, caps.max_qp, rings)?;
    let cmd = Command::CreateQp(CreateQp {
        pdn,
        qp_type: i.qp_type,
        send_cqn,
        recv_cqn,
        srqn,
        sq_sig_all: i.sq_sig_all == 1,
        cap: i.cap,
    });
    Ok((Op::CreateQp(idx), cmd))
}

/// `IOCTL_IV_CREATE_QP`'s completion: the QP takes the number, sizes and
/// rings the HCA gave it.
pub(crate) fn create_qp_done(
    o: &mut Object,
    qp: IvHandle,
    out: CommandOut,
    map: &dyn Fn(&Ring) -> IvRingMap,
) -> Option<IvCreateQpOut> {
    let (Body::Qp(q), CommandOut::Qp { qpn, cap, sq, rq }) = (&mut o.body, out) else {
        return None;
    };
    q.qpn = qpn;
    q.cap = cap;
    let (sq_map, rq_map) = (map(&sq), rq.as_ref().map(map).unwrap_or_default());
    q.sq = Some(sq);
    q.rq = rq;
    Some(IvCreateQpOut {
        qp,
        qpn,
        reserved: 0,
        cap,
        sq: sq_map,
        rq: rq_map,
    })
}

/// Checks the values of the attributes a modify's mask names.
pub(crate) fn check_attr_values(
    mask: u32,
    a: &IvQpAttr,
    caps: &IvQueryDeviceOut,
    mode: RequestorMode,
) -> Result<(), NtStatus> {
    let has = |bit: u32| mask & bit != 0;
    if a.reserved0 != 0 || a.reserved1 != 0 || a.cap.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if mask & !IV_QP_ATTR_ALL != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if has(IV_QP_CAP) {
        // Resizing work queues through modify is not in any IBTA transition.
        return Err(STATUS_INVALID_PARAMETER_MIX);
    }
    let bad = (has(IV_QP_STATE) && a.qp_state > IV_QPS_ERR)
        || (has(IV_QP_CUR_STATE) && a.cur_qp_state > IV_QPS_ERR)
        || (has(IV_QP_PATH_MTU) && !(IV_MTU_256..=IV_MTU_4096).contains(&a.path_mtu))
        || (has(IV_QP_PATH_MIG_STATE) && a.path_mig_state > IV_MIG_ARMED)
        || (has(IV_QP_ALT_PATH)
            && (u32::from(a.alt_pkey_index) >= u32::from(caps.max_pkeys)
                || a.alt_port_num == 0
                || a.alt_port_num > caps.phys_port_cnt
                || a.alt_timeout > 31))
        || (has(IV_QP_RQ_PSN) && a.rq_psn > 0xFF_FFFF)
        || (has(IV_QP_SQ_PSN) && a.sq_psn > 0xFF_FFFF)
        || (has(IV_QP_DEST_QPN) && a.dest_qp_num > 0xFF_FFFF)
        || (has(IV_QP_ACCESS_FLAGS)
            && a.qp_access_flags
                & !(IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ | IV_ACCESS_REMOTE_ATOMIC)
                != 0)
        || (has(IV_QP_PKEY_INDEX) && u32::from(a.pkey_index) >= u32::from(caps.max_pkeys))
        || (has(IV_QP_PORT) && (a.port_num == 0 || a.port_num > caps.phys_port_cnt))
        || (has(IV_QP_EN_SQD_ASYNC_NOTIFY) && a.en_sqd_async_notify > 1)
        || (has(IV_QP_MAX_QP_RD_ATOMIC) && u32::from(a.max_rd_atomic) > caps.max_qp_init_rd_atom)
        || (has(IV_QP_MAX_DEST_RD_ATOMIC) && u32::from(a.max_dest_rd_atomic) > caps.max_qp_rd_atom)
        || (has(IV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31)
        || (has(IV_QP_TIMEOUT) && a.timeout > 31)
        || (has(IV_QP_RETRY_CNT) && a.retry_cnt > 7)
        || (has(IV_QP_RNR_RETRY) && a.rnr_retry > 7);
    if bad {
        return Err(STATUS_INVALID_PARAMETER);
    }
    if has(IV_QP_AV) {
        super::ah::check_ah_attr(&a.ah_attr, caps)?;
    }
    if has(IV_QP_ALT_PATH) {
        // The alternate path is checked as the primary is.
        super::ah::check_ah_attr(&a.alt_ah_attr, caps)?;
    }
    if has(IV_QP_QKEY) && a.qkey & CONTROLLED_QKEY != 0 && mode == RequestorMode::User {
        return Err(STATUS_ACCESS_DENIED);
    }
    Ok(())
}

/// `IOCTL_IV_MODIFY_QP`: the attributes' values ([`check_attr_values`]),
/// then the transition and its required and allowed attributes
/// ([`check_modify`]) from the state the driver knows; one modify at a
/// time. The HCA refuses it if the QP moved meanwhile (to ERR, SQE).
///
/// # Errors
/// Those of [`check_attr_values`] and [`check_modify`];
/// `STATUS_INVALID_PARAMETER` for a reserved field set;
/// `STATUS_INVALID_HANDLE` for a handle that names no live QP of the file;
/// `STATUS_DEVICE_BUSY` while another modify is in flight;
/// `STATUS_INVALID_DEVICE_STATE` for an `IV_QP_CUR_STATE` that is not the
/// QP's state.
pub(crate) fn modify_qp<P: Platform, H: Hca>(
    d: &Device<P, H>,
    s: &mut State<P::Request>,
    file: FileKey,
    mode: RequestorMode,
    i: &IvModifyQpIn,
) -> Result<(Op, Command), NtStatus> {
    if i.reserved != 0 {
        return Err(STATUS_INVALID_PARAMETER);
    }
    check_attr_values(i.attr_mask, &i.attr, d.hca.caps(), mode)?;
    let f = s.file(file)?;
    let idx = f.objects.lookup(i.qp, Kind::Qp)?;
    let o = f.objects.get_mut(idx);
    if o.busy {
        return Err(STATUS_DEVICE_BUSY);
    }
    let Body::Qp(qp) = &o.body else {
        return Err(STATUS_INVALID_HANDLE);
    };
    if i.attr_mask & IV_QP_CUR_STATE != 0 && i.attr.cur_qp_state != qp.state {
        return Err(STATUS_INVALID_DEVICE_STATE);
    }
    let next = check_modify(qp.qp_type, qp.state, i.attr_mask, &i.attr).map_err(|e| e.status())?;
    let cmd = Command::ModifyQp(ModifyQp {
        qpn: qp.qpn,
        cur_state: qp.state,
        mask: i.attr_mask,
        attr: i.attr,
    });
    o.busy = true;
    Ok((Op::ModifyQp { qp: idx, next }, cmd))
}

/// A modify that is not the last of a chain completed: the QP is in `next`
/// and stays busy.
pub(crate) fn set_qp_state<R>(s: &mut State<R>, file: FileKey, idx: u32, next: u32) {
    if let Some(Body::Qp(qp)) = s
        .files
        .get_mut(&file)
        .map(|f| &mut f.objects.get_mut(idx).body)
    {
        qp.state = next;
    }
}

/// `IOCTL_IV_MODIFY_QP`'s completion (and a CM request's last modify's):
/// the QP is no longer busy and, if the HCA made the transition, in
/// `next`. No output.
pub(crate) fn modify_qp_done<R>(s: &mut State<R>, file: FileKey, idx: u32, next: u32, ok: bool) {
    let Some(f) = s.files.get_mut(&file) else {
        return;
    };
    let o = f.objects.get_mut(idx);
    o.busy = false;
    if let (true, Body::Qp(qp)) = (ok, &mut o.body) {
        qp.state = next;
    }
}

/// `IOCTL_IV_QUERY_QP`: the HCA is asked, since it may have moved the QP
/// (to ERR or SQE) on its own. Counted as a query in flight on the QP (a
/// destroy waits for it; a modify may overlap it).
///
/// # Errors
/// `STATUS_INVALID_HANDLE` for a handle that names no live QP of the file.
pub(crate) fn query_qp<R>(
    s: &mut State<R>,
    file: FileKey,
    i: &IvHandleIn,
) -> Result<(Op, Command), NtStatus> {
    let (idx, qpn) = s.begin_query(file, i.handle, Kind::Qp)?;
    Ok((Op::QueryQp(idx), Command::QueryQp { qpn }))
}

/// `IOCTL_IV_QUERY_QP`'s completion: the QP's attributes are the output,
/// and the driver learns the state the HCA reports (moves to ERR or SQE
/// it made on its own).
pub(crate) fn query_qp_done<R>(
    s: &mut State<R>,
    file: FileKey,
    idx: u32,
    ok: bool,
    out: CommandOut,
) -> Option<alloc::boxed::Box<IvQueryQpOut>> {
    let o = s.end_query(file, idx)?;
    let (true, Body::Qp(qp), CommandOut::QpAttr(a)) = (ok, &mut o.body, out) else {
        return None;
    };
    qp.state = a.attr.qp_state;
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> IvQueryDeviceOut {
        IvQueryDeviceOut {
            phys_port_cnt: 1,
            max_pkeys: 1,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            ..Default::default()
        }
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let c = caps();
        let ok = IvQpAttr {
            path_mtu: IV_MTU_1024,
            port_num: 1,
            ..Default::default()
        };
        let k = RequestorMode::Kernel;
        assert_eq!(
            check_attr_values(IV_QP_PATH_MTU | IV_QP_PORT, &ok, &c, k),
            Ok(())
        );
        let cases: [(u32, IvQpAttr); 10] = [
            (IV_QP_PATH_MTU, IvQpAttr { path_mtu: 6, ..ok }),
            (IV_QP_PORT, IvQpAttr { port_num: 2, ..ok }),
            (
                IV_QP_RQ_PSN,
                IvQpAttr {
                    rq_psn: 1 << 24,
                    ..ok
                },
            ),
            (
                IV_QP_SQ_PSN,
                IvQpAttr {
                    sq_psn: 1 << 24,
                    ..ok
                },
            ),
            (
                IV_QP_DEST_QPN,
                IvQpAttr {
                    dest_qp_num: 1 << 24,
                    ..ok
                },
            ),
            (IV_QP_RETRY_CNT, IvQpAttr { retry_cnt: 8, ..ok }),
            (IV_QP_TIMEOUT, IvQpAttr { timeout: 32, ..ok }),
            (
                IV_QP_MAX_DEST_RD_ATOMIC,
                IvQpAttr {
                    max_dest_rd_atomic: 17,
                    ..ok
                },
            ),
            (
                IV_QP_PKEY_INDEX,
                IvQpAttr {
                    pkey_index: 1,
                    ..ok
                },
            ),
            (IV_QP_STATE, IvQpAttr { reserved1: 1, ..ok }),
        ];
        for (mask, a) in cases {
            assert_eq!(
                check_attr_values(mask, &a, &c, k),
                Err(STATUS_INVALID_PARAMETER),
                "{mask:#x}"
            );
        }
        assert_eq!(
            check_attr_values(1 << 21, &ok, &c, k),
            Err(STATUS_INVALID_PARAMETER)
        );
        // The alternate path: checked as the primary.
        let alt = IvQpAttr {
            alt_port_num: 1,
            alt_timeout: 14,
            alt_ah_attr: IvAhAttr {
                is_global: 1,
                hop_limit: 64,
                port_num: 1,
                ..IvAhAttr::default()
            },
            ..ok
        };
        assert_eq!(check_attr_values(IV_QP_ALT_PATH, &alt, &c, k), Ok(()));
        let bad_alts = [
            IvQpAttr {
                alt_port_num: 0,
                ..alt
            },
            IvQpAttr {
                alt_port_num: 2,
                ..alt
            },
            IvQpAttr {
                alt_pkey_index: 1,
                ..alt
            },
            IvQpAttr {
                alt_timeout: 32,
                ..alt
            },
            IvQpAttr {
                alt_ah_attr: IvAhAttr {
                    port_num: 2,
                    ..alt.alt_ah_attr
                },
                ..alt
            },
        ];
        for a in bad_alts {
            assert_eq!(
                check_attr_values(IV_QP_ALT_PATH, &a, &c, k),
                Err(STATUS_INVALID_PARAMETER),
                "{a:?}"
            );
        }
        for (state, ok_state) in [
            (IV_MIG_MIGRATED, true),
            (IV_MIG_REARM, true),
            (IV_MIG_ARMED, true),
            (3, false),
        ] {
            let a = IvQpAttr {
                path_mig_state: state,
                ..ok
            };
            assert_eq!(
                check_attr_values(IV_QP_PATH_MIG_STATE, &a, &c, k).is_ok(),
                ok_state
            );
        }
        assert_eq!(
            check_attr_values(IV_QP_CAP, &ok, &c, k),
            Err(STATUS_INVALID_PARAMETER_MIX)
        );
    }

    #[test]
    fn controlled_qkeys_are_kernel_only() {
        let a = IvQpAttr {
            qkey: CONTROLLED_QKEY | 1,
            ..Default::default()
        };
        assert_eq!(
            check_attr_values(IV_QP_QKEY, &a, &caps(), RequestorMode::User),
            Err(STATUS_ACCESS_DENIED)
        );
        assert_eq!(
            check_attr_values(IV_QP_QKEY, &a, &caps(), RequestorMode::Kernel),
            Ok(())
        );
    }
}
