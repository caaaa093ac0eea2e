//! TEMPORARY: the soft HCA's link API (driver/soft/src/link.rs on main),
//! transcribed so that the UDP wire compiles before it lands. Removed by
//! the merge of main.
#![allow(dead_code, missing_docs)]

use std::sync::Arc;

use irpverbs_abi::{NtStatus, STATUS_NOT_SUPPORTED};
use irpverbs_core::Platform;
use irpverbs_soft::SoftHca;

pub type Gid = [u8; 16];

#[derive(Clone, Copy, Debug)]
pub struct Datagram<'a> {
    pub sgid: Gid,
    pub dgid: Gid,
    pub src_port: u16,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub payload: &'a [u8],
}

#[derive(Debug, Default)]
pub struct TxBatch {
    items: Vec<(Gid, Gid, u16, u8, u32, u8, Vec<u8>)>,
}

impl TxBatch {
    pub fn push(&mut self, d: &Datagram<'_>) {
        self.items.push((
            d.sgid,
            d.dgid,
            d.src_port,
            d.traffic_class,
            d.flow_label,
            d.hop_limit,
            d.payload.to_vec(),
        ));
    }
    pub fn iter(&self) -> impl Iterator<Item = Datagram<'_>> {
        self.items.iter().map(|i| Datagram {
            sgid: i.0,
            dgid: i.1,
            src_port: i.2,
            traffic_class: i.3,
            flow_label: i.4,
            hop_limit: i.5,
            payload: &i.6,
        })
    }
    pub fn len(&self) -> usize {
        self.items.len()
    }
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

pub trait Link: Send + Sync {
    fn transmit(&self, batch: &TxBatch);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireError;

pub trait LinkHca {
    fn attach_link(&self, link: Arc<dyn Link>) -> Result<(), NtStatus>;
    fn detach_link(&self);
    fn receive(&self, d: &Datagram<'_>) -> Result<(), WireError>;
    fn advance_clock(&self, now_ns: u64) -> Option<u64>;
}

impl<P: Platform> LinkHca for SoftHca<P> {
    fn attach_link(&self, _link: Arc<dyn Link>) -> Result<(), NtStatus> {
        Err(STATUS_NOT_SUPPORTED)
    }
    fn detach_link(&self) {}
    fn receive(&self, _d: &Datagram<'_>) -> Result<(), WireError> {
        Err(WireError)
    }
    fn advance_clock(&self, _now_ns: u64) -> Option<u64> {
        None
    }
}
