//! ClassPortInfo (IBTA 13.4.8.1, table 126): what a class agent supports
//! and where it redirects to. The CM answers a Get of it; it is also the
//! additional information of a redirect (REJ, APR, SIDR_REP).

use zerocopy::byteorder::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::MAD_DATA_SIZE;
use super::bits::field32;
use crate::Gid;

/// Bytes of a ClassPortInfo.
pub const CPI_LEN: usize = 72;

/// The ClassPortInfo attribute (72 bytes).
///
/// | byte | field |
/// |---|---|
/// | 0 | BaseVersion |
/// | 1 | ClassVersion |
/// | 2-3 | CapabilityMask |
/// | 4-7 | CapabilityMask2 (27), RespTimeValue (5) |
/// | 8-23 | RedirectGID |
/// | 24-27 | RedirectTC (8), RedirectSL (4), RedirectFL (20) |
/// | 28-29 | RedirectLID |
/// | 30-31 | RedirectP_Key |
/// | 32-35 | reserved (8), RedirectQP (24) |
/// | 36-39 | RedirectQ_Key |
/// | 40-55 | TrapGID |
/// | 56-59 | TrapTC (8), TrapSL (4), TrapFL (20) |
/// | 60-61 | TrapLID |
/// | 62-63 | TrapP_Key |
/// | 64-67 | TrapHL (8), TrapQP (24) |
/// | 68-71 | TrapQ_Key |
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassPortInfoMsg {
    /// BaseVersion.
    pub base_version: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// CapabilityMask.
    pub capability_mask: U16,
    w4: U32,
    /// RedirectGID.
    pub redirect_gid: Gid,
    w24: U32,
    /// RedirectLID.
    pub redirect_lid: U16,
    /// RedirectP_Key.
    pub redirect_pkey: U16,
    w32: U32,
    /// RedirectQ_Key.
    pub redirect_qkey: U32,
    /// TrapGID.
    pub trap_gid: Gid,
    w56: U32,
    /// TrapLID.
    pub trap_lid: U16,
    /// TrapP_Key.
    pub trap_pkey: U16,
    w64: U32,
    /// TrapQ_Key.
    pub trap_qkey: U32,
}

const _: () = assert!(size_of::<ClassPortInfoMsg>() == CPI_LEN);

impl ClassPortInfoMsg {
    field32!(
        /// CapabilityMask2 (27 bits).
        capability_mask2, set_capability_mask2: w4[5; 27]
    );
    field32!(
        /// RespTimeValue (5 bits).
        resp_time_value, set_resp_time_value: w4[0; 5]
    );
    field32!(
        /// RedirectTC.
        redirect_tc, set_redirect_tc: w24[24; 8]
    );
    field32!(
        /// RedirectSL (4 bits).
        redirect_sl, set_redirect_sl: w24[20; 4]
    );
    field32!(
        /// RedirectFL (20 bits).
        redirect_fl, set_redirect_fl: w24[0; 20]
    );
    field32!(
        /// RedirectQP (24 bits).
        redirect_qp, set_redirect_qp: w32[0; 24]
    );
    field32!(
        /// TrapTC.
        trap_tc, set_trap_tc: w56[24; 8]
    );
    field32!(
        /// TrapSL (4 bits).
        trap_sl, set_trap_sl: w56[20; 4]
    );
    field32!(
        /// TrapFL (20 bits).
        trap_fl, set_trap_fl: w56[0; 20]
    );
    field32!(
        /// TrapHL.
        trap_hl, set_trap_hl: w64[24; 8]
    );
    field32!(
        /// TrapQP (24 bits).
        trap_qp, set_trap_qp: w64[0; 24]
    );
}

/// The MAD data of a ClassPortInfo: the attribute and reserved bytes.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpiData {
    /// The attribute.
    pub cpi: ClassPortInfoMsg,
    reserved: [u8; MAD_DATA_SIZE - CPI_LEN],
}

const _: () = assert!(size_of::<CpiData>() == MAD_DATA_SIZE);

/// ClassPortInfo, typed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassPortInfo {
    /// BaseVersion.
    pub base_version: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// CapabilityMask.
    pub capability_mask: u16,
    /// CapabilityMask2 (27 bits).
    pub capability_mask2: u32,
    /// RespTimeValue (5 bits).
    pub resp_time_value: u8,
    /// RedirectGID.
    pub redirect_gid: Gid,
    /// RedirectTC.
    pub redirect_tc: u8,
    /// RedirectSL (4 bits).
    pub redirect_sl: u8,
    /// RedirectFL (20 bits).
    pub redirect_fl: u32,
    /// RedirectLID.
    pub redirect_lid: u16,
    /// RedirectP_Key.
    pub redirect_pkey: u16,
    /// RedirectQP (24 bits).
    pub redirect_qp: u32,
    /// RedirectQ_Key.
    pub redirect_qkey: u32,
    /// TrapGID.
    pub trap_gid: Gid,
    /// TrapTC.
    pub trap_tc: u8,
    /// TrapSL (4 bits).
    pub trap_sl: u8,
    /// TrapFL (20 bits).
    pub trap_fl: u32,
    /// TrapLID.
    pub trap_lid: u16,
    /// TrapP_Key.
    pub trap_pkey: u16,
    /// TrapHL.
    pub trap_hl: u8,
    /// TrapQP (24 bits).
    pub trap_qp: u32,
    /// TrapQ_Key.
    pub trap_qkey: u32,
}

impl ClassPortInfo {
    /// Reads a ClassPortInfo (every bit pattern is one).
    #[must_use]
    pub fn parse(m: &ClassPortInfoMsg) -> Self {
        Self {
            base_version: m.base_version,
            class_version: m.class_version,
            capability_mask: m.capability_mask.get(),
            capability_mask2: m.capability_mask2(),
            resp_time_value: m.resp_time_value() as u8,
            redirect_gid: m.redirect_gid,
            redirect_tc: m.redirect_tc() as u8,
            redirect_sl: m.redirect_sl() as u8,
            redirect_fl: m.redirect_fl(),
            redirect_lid: m.redirect_lid.get(),
            redirect_pkey: m.redirect_pkey.get(),
            redirect_qp: m.redirect_qp(),
            redirect_qkey: m.redirect_qkey.get(),
            trap_gid: m.trap_gid,
            trap_tc: m.trap_tc() as u8,
            trap_sl: m.trap_sl() as u8,
            trap_fl: m.trap_fl(),
            trap_lid: m.trap_lid.get(),
            trap_pkey: m.trap_pkey.get(),
            trap_hl: m.trap_hl() as u8,
            trap_qp: m.trap_qp(),
            trap_qkey: m.trap_qkey.get(),
        }
    }

    /// Writes the ClassPortInfo (reserved bits zero).
    pub fn emit(&self, m: &mut ClassPortInfoMsg) {
        *m = ClassPortInfoMsg {
            base_version: self.base_version,
            class_version: self.class_version,
            capability_mask: U16::new(self.capability_mask),
            redirect_gid: self.redirect_gid,
            redirect_lid: U16::new(self.redirect_lid),
            redirect_pkey: U16::new(self.redirect_pkey),
            redirect_qkey: U32::new(self.redirect_qkey),
            trap_gid: self.trap_gid,
            trap_lid: U16::new(self.trap_lid),
            trap_pkey: U16::new(self.trap_pkey),
            trap_qkey: U32::new(self.trap_qkey),
            ..ClassPortInfoMsg::default()
        };
        m.set_capability_mask2(self.capability_mask2);
        m.set_resp_time_value(u32::from(self.resp_time_value));
        m.set_redirect_tc(u32::from(self.redirect_tc));
        m.set_redirect_sl(u32::from(self.redirect_sl));
        m.set_redirect_fl(self.redirect_fl);
        m.set_redirect_qp(self.redirect_qp);
        m.set_trap_tc(u32::from(self.trap_tc));
        m.set_trap_sl(u32::from(self.trap_sl));
        m.set_trap_fl(self.trap_fl);
        m.set_trap_hl(u32::from(self.trap_hl));
        m.set_trap_qp(self.trap_qp);
    }
}
