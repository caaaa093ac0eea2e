//! # irpverbs core
//!
//! The driver proper, generic over the OS ([`Platform`]) and the hardware
//! ([`Hca`]): object model, per-file handle tables, IOCTL dispatch, busy
//! rules, the QP state machine and the command-completion path.
//!
//! Every control verb arrives as an IOCTL at DISPATCH_LEVEL, is validated,
//! becomes a command to the HCA and returns pending; the request completes
//! from the DPC that drains the HCA's event queue. Nothing blocks, and no
//! passive-level thread exists. What must happen in the requestor's own
//! process (pinning a user MR's pages, mapping rings and the file's doorbell
//! page into the process) is done by [`Device::in_caller_context`] before
//! the request is queued.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;

pub mod cm;
pub mod device;
pub mod fallible;
mod handle;
pub mod hca;
mod maps;
pub mod notify;
pub mod object;
pub mod platform;
pub mod qp_state;
pub mod quota;
mod resolve;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;
mod verbs;

pub use device::{DRIVER_VERSION, Device, DeviceConfig, DeviceSnapshot, DeviceStats};
pub use handle::MAX_OBJECTS_PER_FILE;
pub use object::Kind;
pub use quota::FileQuota;
pub use verbs::mr::USER_ADDRESS_LIMIT;
pub use verbs::qp::CONTROLLED_QKEY;

pub use hca::{
    AsyncEvent, BindMw, Command, CommandOut, CreateAh, CreateCq, CreateQp, CreateSrq,
    DoorbellPageInfo, DoorbellTarget, Event, GSI_QKEY, GSI_QPN, Hca, MAD_SIZE, MadIn, MadOut,
    ModifyQp, ModifySrq, RegMr,
};
pub use platform::{
    APC_LEVEL, Bar, CommonBuffer, DISPATCH_LEVEL, DMA_PAGE_SIZE, DmaDirection, DmaMapping, FileKey,
    Interrupt, InterruptHandler, Irql, LockClass, LogicalAddress, MajorFunction, PASSIVE_LEVEL,
    PciPlatform, Platform, PoolCharge, PoolTag, ProcessKey, Request, RequestorMode, SgElement,
    SpinLock, page_list, pool_tag,
};

/// A shared HCA is an HCA: `Arc`, and `irpverbs_ring::Shared` (the
/// reference count a kernel driver allocates fallibly).
macro_rules! shared_hca {
    ($($pointer:ty),*) => {$(
        impl<T: Hca> Hca for $pointer {
            fn caps(&self) -> &irpverbs_abi::IvQueryDeviceOut {
                (**self).caps()
            }
            fn post_command(&self, token: u64, command: Command) -> Result<(), Command> {
                (**self).post_command(token, command)
            }
            fn poll_event(&self) -> Option<Event> {
                (**self).poll_event()
            }
            fn poll_events(&self, out: &mut [Option<Event>]) -> usize {
                (**self).poll_events(out)
            }
            fn arm_event_queue(&self) {
                (**self).arm_event_queue();
            }
            fn comp_event_queues(&self) -> u32 {
                (**self).comp_event_queues()
            }
            fn poll_comp_events(&self, vector: u32, out: &mut [Option<Event>]) -> usize {
                (**self).poll_comp_events(vector, out)
            }
            fn arm_comp_event_queue(&self, vector: u32) {
                (**self).arm_comp_event_queue(vector);
            }
            fn sq_doorbell(&self, qpn: u32) {
                (**self).sq_doorbell(qpn);
            }
            fn rq_doorbell(&self, qpn: u32) {
                (**self).rq_doorbell(qpn);
            }
            fn srq_doorbell(&self, srqn: u32) {
                (**self).srq_doorbell(srqn);
            }
            fn cq_arm_doorbell(&self, cqn: u32) {
                (**self).cq_arm_doorbell(cqn);
            }
            fn alloc_doorbell_page(&self) -> Result<DoorbellPageInfo, irpverbs_abi::NtStatus> {
                (**self).alloc_doorbell_page()
            }
            fn free_doorbell_page(&self, page: u32) {
                (**self).free_doorbell_page(page);
            }
            fn bind_doorbell(
                &self,
                page: u32,
                target: DoorbellTarget,
            ) -> Result<u32, irpverbs_abi::NtStatus> {
                (**self).bind_doorbell(page, target)
            }
            fn ring_doorbell_pages(&self) -> Result<(), irpverbs_abi::NtStatus> {
                (**self).ring_doorbell_pages()
            }
            fn device_removed(&self) {
                (**self).device_removed();
            }
            fn send_mad(&self, mad: &MadOut) -> Result<(), irpverbs_abi::NtStatus> {
                (**self).send_mad(mad)
            }
            fn poll_mad(&self) -> Option<MadIn> {
                (**self).poll_mad()
            }
        }
    )*};
}

shared_hca!(alloc::sync::Arc<T>, irpverbs_ring::Shared<T>);
