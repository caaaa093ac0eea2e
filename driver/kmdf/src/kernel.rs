//! The kernel ULPs' direct-call table (`include/irpverbs_kernel.h`),
//! published with `IRP_MN_QUERY_INTERFACE` for
//! [`GUID_IV_KERNEL_INTERFACE`] (`{17EE45AE-E023-4F3B-81FC-6784694953D3}`).
//!
//! The table is `irpverbs_kernel_table::kernel` (`no_std`, tested on Linux,
//! the same code host mode hands out): this module only gives it the soft
//! HCA's doorbells and keeps the device's reference to it.
//!
//! # Lifetime
//! [`KernelInterface::new`] builds the table over the device's soft HCA with
//! one reference, the device's own. KMDF (`WdfDeviceAddQueryInterface`)
//! copies the table when it is added and, for every `IRP_MN_QUERY_INTERFACE`
//! for the GUID, copies it into the requester's `INTERFACE` and calls
//! `InterfaceReference(Context)`; the ULP calls `InterfaceDereference(Context)`
//! when done. The device drops its reference in its destroy callback. The
//! context holds an `Arc` of the soft HCA, so a ULP that still holds a
//! reference after removal calls into live memory (a removed HCA ignores
//! doorbells for queues it no longer has).
//!
//! IRQL: every table function is callable at IRQL <= DISPATCH_LEVEL; none
//! blocks; `open_*` allocate from nonpaged pool (the global allocator).

use alloc::sync::Arc;

use irpverbs_core::Hca;
use irpverbs_kernel_table::kernel::{IV_KERNEL_INTERFACE_GUID, IvKernelInterface, interface};
use irpverbs_kernel_table::{Bell, Doorbells};
use irpverbs_soft::SoftHca;
use wdk_sys::GUID;

use crate::platform::KmdfPlatform;

/// The interface type of the table, `{17EE45AE-E023-4F3B-81FC-6784694953D3}`:
/// `IV_KERNEL_INTERFACE_GUID` of `irpverbs_kernel_table::kernel` (and of
/// `include/irpverbs_kernel.h`) as a `GUID`.
pub const GUID_IV_KERNEL_INTERFACE: GUID = GUID {
    Data1: IV_KERNEL_INTERFACE_GUID.0,
    Data2: IV_KERNEL_INTERFACE_GUID.1,
    Data3: IV_KERNEL_INTERFACE_GUID.2,
    Data4: IV_KERNEL_INTERFACE_GUID.3,
};

/// The soft HCA's doorbells, as the table rings them: direct calls of its
/// [`Hca`] doorbell methods, by queue number (a kernel ULP's queues have no
/// doorbell page slot).
///
/// IRQL: <= DISPATCH_LEVEL, never blocking.
struct SoftDoorbells(Arc<SoftHca<KmdfPlatform>>);

impl Doorbells for SoftDoorbells {
    fn sq(&self, qp: Bell) {
        self.0.sq_doorbell(qp.number);
    }
    fn rq(&self, qp: Bell) {
        self.0.rq_doorbell(qp.number);
    }
    fn srq(&self, srq: Bell) {
        self.0.srq_doorbell(srq.number);
    }
    fn cq_arm(&self, cq: Bell) {
        self.0.cq_arm_doorbell(cq.number);
    }
}

/// The device's table and its own reference to the table's context.
pub(crate) struct KernelInterface {
    table: IvKernelInterface,
}

impl KernelInterface {
    /// The table over `hca`'s doorbells, referenced once (by the device).
    ///
    /// IRQL: <= DISPATCH_LEVEL (it allocates the context from nonpaged pool).
    pub(crate) fn new(hca: Arc<SoftHca<KmdfPlatform>>) -> Self {
        Self {
            table: interface(Arc::new(SoftDoorbells(hca))),
        }
    }

    /// A copy of the table, for `WDF_QUERY_INTERFACE_CONFIG.Interface` (the
    /// framework copies `Size` bytes of it once more; it starts with the
    /// `INTERFACE` header). The copy holds no reference of its own.
    pub(crate) fn table(&self) -> IvKernelInterface {
        self.table
    }
}

impl Drop for KernelInterface {
    /// Gives back the device's reference (ULPs may still hold theirs).
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    fn drop(&mut self) {
        let dereference = self.table.interface_dereference;
        // SAFETY: the context came from `interface`, which took one
        // reference for its caller: this one, given back exactly once (the
        // table is not Clone, and this is its drop).
        unsafe { dereference(self.table.context) };
    }
}
