//! The IBTA QP state machine (IBTA 1.4 section 10.3 and 11.2.4.2): which
//! transitions exist, and for each transition and QP type which attributes
//! are required and which are optional.
//!
//! [`check_modify`] is a pure function: the driver calls it at DISPATCH_LEVEL
//! before it posts the modify command, so a transition the table does not
//! have, or a mask with a missing required or a forbidden attribute, fails at
//! once and leaves the QP unchanged.

use irpverbs_abi::*;

/// Why a modify was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModifyError {
    /// The state machine has no transition from the current state to the
    /// requested one (`STATUS_INVALID_DEVICE_STATE`).
    InvalidTransition,
    /// A required attribute is missing from the mask
    /// (`STATUS_INVALID_PARAMETER_MIX`).
    MissingRequired(u32),
    /// The mask has attributes the transition does not take
    /// (`STATUS_INVALID_PARAMETER_MIX`).
    NotAllowed(u32),
}

impl ModifyError {
    /// The NTSTATUS the request completes with.
    #[must_use]
    pub const fn status(self) -> NtStatus {
        match self {
            ModifyError::InvalidTransition => STATUS_INVALID_DEVICE_STATE,
            ModifyError::MissingRequired(_) | ModifyError::NotAllowed(_) => {
                STATUS_INVALID_PARAMETER_MIX
            }
        }
    }
}

/// Required and optional attribute masks of one transition for one QP type,
/// or `None` when the transition does not exist.
#[must_use]
pub fn transition_masks(qp_type: u32, cur: u32, next: u32) -> Option<(u32, u32)> {
    let t = qp_type;
    let (ud, uc, rc) = (t == IV_QPT_UD, t == IV_QPT_UC, t == IV_QPT_RC);
    if !(ud || uc || rc) || cur > IV_QPS_ERR || next > IV_QPS_ERR {
        return None;
    }
    // Any state may go to RESET or ERR, with no attributes.
    if next == IV_QPS_RESET || next == IV_QPS_ERR {
        return Some((0, 0));
    }
    let pick = |ud_m: u32, uc_m: u32, rc_m: u32| {
        if ud {
            ud_m
        } else if uc {
            uc_m
        } else {
            rc_m
        }
    };
    let masks = match (cur, next) {
        (IV_QPS_RESET, IV_QPS_INIT) => (
            pick(
                IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_QKEY,
                IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS,
                IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS,
            ),
            0,
        ),
        (IV_QPS_INIT, IV_QPS_INIT) => (
            0,
            pick(
                IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_QKEY,
                IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS,
                IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS,
            ),
        ),
        (IV_QPS_INIT, IV_QPS_RTR) => (
            pick(
                0,
                IV_QP_AV | IV_QP_PATH_MTU | IV_QP_DEST_QPN | IV_QP_RQ_PSN,
                IV_QP_AV
                    | IV_QP_PATH_MTU
                    | IV_QP_DEST_QPN
                    | IV_QP_RQ_PSN
                    | IV_QP_MAX_DEST_RD_ATOMIC
                    | IV_QP_MIN_RNR_TIMER,
            ),
            pick(
                IV_QP_PKEY_INDEX | IV_QP_QKEY,
                IV_QP_ALT_PATH | IV_QP_ACCESS_FLAGS | IV_QP_PKEY_INDEX,
                IV_QP_ALT_PATH | IV_QP_ACCESS_FLAGS | IV_QP_PKEY_INDEX,
            ),
        ),
        (IV_QPS_RTR, IV_QPS_RTS) => (
            pick(
                IV_QP_SQ_PSN,
                IV_QP_SQ_PSN,
                IV_QP_TIMEOUT
                    | IV_QP_RETRY_CNT
                    | IV_QP_RNR_RETRY
                    | IV_QP_SQ_PSN
                    | IV_QP_MAX_QP_RD_ATOMIC,
            ),
            pick(
                IV_QP_CUR_STATE | IV_QP_QKEY,
                IV_QP_CUR_STATE | IV_QP_ALT_PATH | IV_QP_ACCESS_FLAGS | IV_QP_PATH_MIG_STATE,
                IV_QP_CUR_STATE
                    | IV_QP_ALT_PATH
                    | IV_QP_ACCESS_FLAGS
                    | IV_QP_MIN_RNR_TIMER
                    | IV_QP_PATH_MIG_STATE,
            ),
        ),
        (IV_QPS_RTS, IV_QPS_RTS) | (IV_QPS_SQD, IV_QPS_RTS) => (
            0,
            pick(
                IV_QP_CUR_STATE | IV_QP_QKEY,
                IV_QP_CUR_STATE | IV_QP_ACCESS_FLAGS | IV_QP_ALT_PATH | IV_QP_PATH_MIG_STATE,
                IV_QP_CUR_STATE
                    | IV_QP_ACCESS_FLAGS
                    | IV_QP_ALT_PATH
                    | IV_QP_PATH_MIG_STATE
                    | IV_QP_MIN_RNR_TIMER,
            ),
        ),
        (IV_QPS_RTS, IV_QPS_SQD) => (0, IV_QP_EN_SQD_ASYNC_NOTIFY),
        (IV_QPS_SQD, IV_QPS_SQD) => (
            0,
            pick(
                IV_QP_PKEY_INDEX | IV_QP_QKEY,
                IV_QP_AV
                    | IV_QP_ALT_PATH
                    | IV_QP_ACCESS_FLAGS
                    | IV_QP_PKEY_INDEX
                    | IV_QP_PATH_MIG_STATE,
                IV_QP_PORT
                    | IV_QP_AV
                    | IV_QP_TIMEOUT
                    | IV_QP_RETRY_CNT
                    | IV_QP_RNR_RETRY
                    | IV_QP_MAX_QP_RD_ATOMIC
                    | IV_QP_MAX_DEST_RD_ATOMIC
                    | IV_QP_ALT_PATH
                    | IV_QP_ACCESS_FLAGS
                    | IV_QP_PKEY_INDEX
                    | IV_QP_MIN_RNR_TIMER
                    | IV_QP_PATH_MIG_STATE,
            ),
        ),
        (IV_QPS_SQE, IV_QPS_RTS) => (
            0,
            pick(
                IV_QP_CUR_STATE | IV_QP_QKEY,
                IV_QP_CUR_STATE | IV_QP_ACCESS_FLAGS,
                0,
            ),
        ),
        _ => return None,
    };
    // SQE exists only for UD and UC (an RC QP goes to ERR instead).
    if rc && cur == IV_QPS_SQE {
        return None;
    }
    Some(masks)
}

/// Checks a modify of a QP of `qp_type` in state `cur` with `mask`: returns
/// the state the QP moves to.
///
/// # Errors
/// See [`ModifyError`].
pub fn check_modify(
    qp_type: u32,
    cur: u32,
    mask: u32,
    attr: &IvQpAttr,
) -> Result<u32, ModifyError> {
    let next = if mask & IV_QP_STATE != 0 {
        attr.qp_state
    } else {
        cur
    };
    let (required, optional) =
        transition_masks(qp_type, cur, next).ok_or(ModifyError::InvalidTransition)?;
    let given = mask & !IV_QP_STATE;
    let missing = required & !given;
    if missing != 0 {
        return Err(ModifyError::MissingRequired(missing));
    }
    let extra = given & !(required | optional);
    if extra != 0 {
        return Err(ModifyError::NotAllowed(extra));
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: [u32; 3] = [IV_QPT_RC, IV_QPT_UC, IV_QPT_UD];

    fn attr(state: u32) -> IvQpAttr {
        IvQpAttr {
            qp_state: state,
            ..IvQpAttr::default()
        }
    }

    #[test]
    fn the_transition_table_is_exactly_the_ibta_one() {
        use IV_QPS_ERR as E;
        use IV_QPS_INIT as I;
        use IV_QPS_RESET as R;
        use IV_QPS_RTR as RTR;
        use IV_QPS_RTS as RTS;
        use IV_QPS_SQD as SQD;
        use IV_QPS_SQE as SQE;
        let legal = [
            (R, I),
            (I, I),
            (I, RTR),
            (RTR, RTS),
            (RTS, RTS),
            (RTS, SQD),
            (SQD, SQD),
            (SQD, RTS),
            (SQE, RTS),
        ];
        for t in TYPES {
            for cur in 0..=6 {
                for next in 0..=6 {
                    let want = next == R
                        || next == E
                        || (legal.contains(&(cur, next)) && !(t == IV_QPT_RC && cur == SQE));
                    assert_eq!(
                        transition_masks(t, cur, next).is_some(),
                        want,
                        "type {t} {cur}->{next}"
                    );
                }
            }
            assert!(transition_masks(t, 7, R).is_none());
            assert!(transition_masks(t, R, 7).is_none());
        }
        assert!(transition_masks(1, R, I).is_none());
    }

    #[test]
    fn reset_to_init_requires_exactly_its_attributes() {
        let rc = IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_ACCESS_FLAGS;
        assert_eq!(
            check_modify(IV_QPT_RC, IV_QPS_RESET, rc, &attr(IV_QPS_INIT)),
            Ok(IV_QPS_INIT)
        );
        assert_eq!(
            check_modify(
                IV_QPT_RC,
                IV_QPS_RESET,
                rc & !IV_QP_PORT,
                &attr(IV_QPS_INIT)
            ),
            Err(ModifyError::MissingRequired(IV_QP_PORT))
        );
        assert_eq!(
            check_modify(IV_QPT_RC, IV_QPS_RESET, rc | IV_QP_QKEY, &attr(IV_QPS_INIT)),
            Err(ModifyError::NotAllowed(IV_QP_QKEY))
        );
        let ud = IV_QP_STATE | IV_QP_PKEY_INDEX | IV_QP_PORT | IV_QP_QKEY;
        assert_eq!(
            check_modify(IV_QPT_UD, IV_QPS_RESET, ud, &attr(IV_QPS_INIT)),
            Ok(IV_QPS_INIT)
        );
        assert_eq!(
            check_modify(IV_QPT_UD, IV_QPS_RESET, rc, &attr(IV_QPS_INIT)),
            Err(ModifyError::MissingRequired(IV_QP_QKEY))
        );
    }

    #[test]
    fn rc_rtr_and_rts_need_the_connection_attributes() {
        let rtr = IV_QP_STATE
            | IV_QP_AV
            | IV_QP_PATH_MTU
            | IV_QP_DEST_QPN
            | IV_QP_RQ_PSN
            | IV_QP_MAX_DEST_RD_ATOMIC
            | IV_QP_MIN_RNR_TIMER;
        assert_eq!(
            check_modify(IV_QPT_RC, IV_QPS_INIT, rtr, &attr(IV_QPS_RTR)),
            Ok(IV_QPS_RTR)
        );
        assert!(matches!(
            check_modify(IV_QPT_RC, IV_QPS_INIT, rtr & !IV_QP_AV, &attr(IV_QPS_RTR)),
            Err(ModifyError::MissingRequired(IV_QP_AV))
        ));
        // UC doesn't take the RDMA READ depth.
        assert!(matches!(
            check_modify(IV_QPT_UC, IV_QPS_INIT, rtr, &attr(IV_QPS_RTR)),
            Err(ModifyError::NotAllowed(_))
        ));
        // UD needs nothing to reach RTR.
        assert_eq!(
            check_modify(IV_QPT_UD, IV_QPS_INIT, IV_QP_STATE, &attr(IV_QPS_RTR)),
            Ok(IV_QPS_RTR)
        );
        let rts = IV_QP_STATE
            | IV_QP_TIMEOUT
            | IV_QP_RETRY_CNT
            | IV_QP_RNR_RETRY
            | IV_QP_SQ_PSN
            | IV_QP_MAX_QP_RD_ATOMIC;
        assert_eq!(
            check_modify(IV_QPT_RC, IV_QPS_RTR, rts, &attr(IV_QPS_RTS)),
            Ok(IV_QPS_RTS)
        );
        assert_eq!(
            check_modify(
                IV_QPT_UD,
                IV_QPS_RTR,
                IV_QP_STATE | IV_QP_SQ_PSN,
                &attr(IV_QPS_RTS)
            ),
            Ok(IV_QPS_RTS)
        );
    }

    #[test]
    fn a_mask_without_state_modifies_in_place_where_the_table_allows_it() {
        assert_eq!(
            check_modify(IV_QPT_RC, IV_QPS_RTS, IV_QP_MIN_RNR_TIMER, &attr(0)),
            Ok(IV_QPS_RTS)
        );
        assert_eq!(
            check_modify(IV_QPT_RC, IV_QPS_RTR, IV_QP_MIN_RNR_TIMER, &attr(0)),
            Err(ModifyError::InvalidTransition)
        );
    }

    #[test]
    fn any_state_goes_to_reset_and_err_without_attributes() {
        for t in TYPES {
            for cur in 0..=6 {
                for next in [IV_QPS_RESET, IV_QPS_ERR] {
                    assert_eq!(check_modify(t, cur, IV_QP_STATE, &attr(next)), Ok(next));
                    assert!(matches!(
                        check_modify(t, cur, IV_QP_STATE | IV_QP_QKEY, &attr(next)),
                        Err(ModifyError::NotAllowed(_))
                    ));
                }
            }
        }
    }

    #[test]
    fn errors_map_to_distinct_statuses() {
        assert_eq!(
            ModifyError::InvalidTransition.status(),
            STATUS_INVALID_DEVICE_STATE
        );
        assert_eq!(
            ModifyError::MissingRequired(1).status(),
            STATUS_INVALID_PARAMETER_MIX
        );
        assert_eq!(
            ModifyError::NotAllowed(1).status(),
            STATUS_INVALID_PARAMETER_MIX
        );
    }
}
