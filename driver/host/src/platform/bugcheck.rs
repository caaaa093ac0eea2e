//! Bugchecks: what the verifier raises when a rule is broken.
//!
//! A bugcheck is a panic whose payload is a [`BugCheck`] carrying the Windows
//! stop code and its four parameters. [`catch_bugcheck`] turns it back into a
//! value (tests assert on the code and parameter 1); any other panic keeps
//! unwinding.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use super::irql;

/// Windows bugcheck codes the host platform raises (`bugcodes.h` values).
pub mod codes {
    /// 0x44: a request (IRP) was completed twice.
    pub const MULTIPLE_IRP_COMPLETE_REQUESTS: u32 = 0x44;
    /// 0x76: a process ends with pages a driver locked (or mapped) in it
    /// still locked; parameter 1 is one of [`locked_pages`](super::locked_pages).
    pub const PROCESS_HAS_LOCKED_PAGES: u32 = 0x76;
    /// A driver kept a power transition waiting (here: it held a request
    /// from a power-managed queue when the device left D0).
    pub const DRIVER_POWER_STATE_FAILURE: u32 = 0x9F;
    /// 0x7E: a system thread (the host's timer or worker thread) raised an
    /// exception nobody handled; the host uses it for a non-bugcheck panic
    /// on one of its own threads.
    pub const SYSTEM_THREAD_EXCEPTION_NOT_HANDLED: u32 = 0x7E;
    /// 0xC2: a bad pool request (wrong tag on free, tag of zero).
    pub const BAD_POOL_CALLER: u32 = 0xC2;
    /// 0xC4: the general Driver Verifier code; parameter 1 is one of
    /// [`verifier`](super::verifier).
    pub const DRIVER_VERIFIER_DETECTED_VIOLATION: u32 = 0xC4;
    /// 0xC7: a timer (or DPC) is still queued in memory being freed.
    pub const TIMER_OR_DPC_INVALID: u32 = 0xC7;
    /// 0xC9: a Driver Verifier I/O verification violation; parameter 1 is
    /// one of [`iomanager`](super::iomanager).
    pub const DRIVER_VERIFIER_IOMANAGER_VIOLATION: u32 = 0xC9;
    /// 0xCE: the driver unloaded with operations (requests, work items)
    /// still pending.
    pub const DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS: u32 = 0xCE;
    /// 0xE6: a DMA violation Driver Verifier's DMA checks (or the IOMMU,
    /// with DMA remapping) caught; parameter 1 is one of [`dma`](super::dma).
    pub const DRIVER_VERIFIER_DMA_VIOLATION: u32 = 0xE6;
    /// 0xD1: pageable code or data touched at IRQL > APC_LEVEL.
    pub const DRIVER_IRQL_NOT_LESS_OR_EQUAL: u32 = 0xD1;
    /// 0x10D: KMDF detected a framework rule violation; parameter 1 is one
    /// of [`wdf`](super::wdf).
    pub const WDF_VIOLATION: u32 = 0x10D;
    /// 0x133: the DPC watchdog: a DPC ran past its allotment, or the
    /// processor stayed at DISPATCH_LEVEL too long; parameter 1 is one of
    /// [`dpc_watchdog`](super::dpc_watchdog).
    pub const DPC_WATCHDOG_VIOLATION: u32 = 0x133;
}

/// Parameter 1 values of 0x76 PROCESS_HAS_LOCKED_PAGES.
pub mod locked_pages {
    /// The process ends (or, in the host's stricter check, the file
    /// closes) with pages still locked or a ring still mapped into it.
    pub const STILL_LOCKED: u64 = 0x0;
    /// The driver undid a mapping that was not there (undone twice).
    pub const NOT_LOCKED: u64 = 0x1;
}

/// Parameter 1 values of 0x9F DRIVER_POWER_STATE_FAILURE.
pub mod power {
    /// A device object blocked a power IRP too long: the driver held a
    /// request from a power-managed queue as the device left D0.
    /// (0x3, device, 0, request)
    pub const BLOCKED_IRP: u64 = 0x3;
}

/// Parameter 1 values of 0xC4 DRIVER_VERIFIER_DETECTED_VIOLATION.
pub mod verifier {
    /// Zero-byte pool allocation. (IRQL, pool type, 0)
    pub const ZERO_BYTE_ALLOCATION: u64 = 0x00;
    /// Nonpaged pool allocated above DISPATCH_LEVEL. (IRQL, pool type, bytes)
    pub const ALLOCATE_ABOVE_DISPATCH: u64 = 0x02;
    /// Freeing something that was never allocated. (address, 0, 0)
    pub const FREE_BAD_ADDRESS: u64 = 0x10;
    /// Nonpaged pool freed above DISPATCH_LEVEL. (IRQL, pool type, address)
    pub const FREE_ABOVE_DISPATCH: u64 = 0x12;
    /// Freeing pool that was already freed. (0, address, tag)
    pub const DOUBLE_FREE: u64 = 0x13;
    /// KeRaiseIrql to a lower IRQL (or above HIGH_LEVEL). (IRQL, requested, 0)
    pub const RAISE_IRQL_INVALID: u64 = 0x30;
    /// KeLowerIrql to a higher IRQL (or above HIGH_LEVEL), or below
    /// DISPATCH_LEVEL inside a DPC. (IRQL, requested, 0 = bad / 1 = in a DPC)
    pub const LOWER_IRQL_INVALID: u64 = 0x31;
    /// KeReleaseSpinLock at an IRQL other than DISPATCH_LEVEL.
    /// (IRQL, lock, 0)
    pub const SPIN_LOCK_RELEASE_NOT_DISPATCH: u64 = 0x32;
    /// KeAcquireSpinLockAtDpcLevel below DISPATCH_LEVEL: here, a kernel
    /// caller's speed-path queue locked below DISPATCH_LEVEL. (IRQL, lock, 0)
    pub const SPIN_LOCK_AT_DPC_BELOW_DISPATCH: u64 = 0x40;
    /// KeAcquireSpinLock above DISPATCH_LEVEL. (IRQL, lock, 0)
    pub const SPIN_LOCK_ACQUIRE_ABOVE_DISPATCH: u64 = 0x42;
    /// Driver unloading with pool still allocated.
    /// (driver, total bytes, number of allocations)
    pub const POOL_LEAK_AT_UNLOAD: u64 = 0x62;
    /// KeSetEvent above DISPATCH_LEVEL. (IRQL, event, 0)
    pub const SET_EVENT_ABOVE_DISPATCH: u64 = 0x80;
    /// A kernel API called at the wrong IRQL. (IRQL, 0, 0)
    pub const API_AT_WRONG_IRQL: u64 = 0xE5;
    /// An interrupt service routine returned at a different IRQL.
    /// (ISR, IRQL before, IRQL after)
    pub const ISR_CHANGED_IRQL: u64 = 0x111;
    /// A wait above DISPATCH_LEVEL. (IRQL, object, timeout)
    pub const WAIT_ABOVE_DISPATCH: u64 = 0x120;
    /// A wait at DISPATCH_LEVEL without a timeout. (IRQL, object, timeout)
    pub const WAIT_AT_DISPATCH_INFINITE: u64 = 0x121;
    /// A wait at DISPATCH_LEVEL with a non-zero timeout.
    /// (IRQL, object, timeout)
    pub const WAIT_AT_DISPATCH_NONZERO: u64 = 0x122;
    /// A cancelled request was not completed in time (here: before its
    /// file was closed). (request, 0, file)
    pub const CANCELLED_IRP_NOT_COMPLETED: u64 = 0x135;
    /// Bytes freed differ from bytes allocated. (address, bytes, tracked)
    pub const FREE_WRONG_SIZE: u64 = 0x13F;
    /// Deadlock detection: a lock acquired recursively. (lock, 0, 0)
    pub const DEADLOCK_SELF: u64 = 0x1000;
    /// Deadlock detection: lock hierarchy violation. (lock, held lock, 0)
    pub const DEADLOCK_HIERARCHY: u64 = 0x1001;
    /// Deadlock detection: released in the wrong order.
    /// (lock, lock to release first, 0)
    pub const DEADLOCK_RELEASE_ORDER: u64 = 0x1003;
    /// Deadlock detection: released by a thread that does not own it.
    /// (lock, owner thread, current thread)
    pub const DEADLOCK_WRONG_THREAD: u64 = 0x1004;
    /// Deadlock detection: released without being acquired. (lock, 0, 0)
    pub const DEADLOCK_UNACQUIRED: u64 = 0x1007;
    /// Host-defined (Windows does not check it): a global allocator handed
    /// out a pool block not aligned to its layout. (address, alignment,
    /// pool type)
    pub const HOST_MISALIGNED_POOL: u64 = 0x2001;
    /// Host-defined: the driver touched the address space of a process
    /// that has exited (unmapped a ring from it, pinned its memory or
    /// mapped into it), which on Windows is gone by then: a fault in
    /// whatever the attach finds. (process, mapping or 0, 0)
    pub const HOST_EXITED_PROCESS_TOUCHED: u64 = 0x2002;
    /// Host-defined: the driver read or wrote a register of its device
    /// while the function was out of D0 (between D0Exit and D0Entry):
    /// on hardware the write is lost and the read gives all ones.
    /// (BAR, offset, width)
    pub const HOST_REGISTER_ACCESS_OUT_OF_D0: u64 = 0x2003;
}

/// Parameter 1 values of 0x133 DPC_WATCHDOG_VIOLATION, and the host's
/// parameter 4 (Windows passes its triage block there): what the counts
/// are in.
pub mod dpc_watchdog {
    /// One DPC routine (a timer's included) ran past its allotment.
    /// (0, count, allotment, unit)
    pub const SINGLE_DPC: u64 = 0;
    /// A dispatch-level callback (an I/O queue callback, the doorbell
    /// scanner's pass) kept the processor at DISPATCH_LEVEL past the
    /// watchdog's period. (1, period, count, unit)
    pub const CUMULATIVE: u64 = 1;
    /// Parameter 4: the counts are work units (the soft HCA's packets).
    pub const UNIT_WORK: u64 = 0;
    /// Parameter 4: the counts are milliseconds.
    pub const UNIT_MS: u64 = 1;
}

/// Parameter 1 values of 0xC2 BAD_POOL_CALLER.
pub mod bad_pool {
    /// Freed with a tag other than the allocation's. (address, tag, free tag)
    pub const FREE_WRONG_TAG: u64 = 0x0A;
    /// Allocation with a tag of zero. (pool type, bytes, 0)
    pub const ZERO_TAG: u64 = 0x9B;
}

/// Parameter 1 values of 0xC9 DRIVER_VERIFIER_IOMANAGER_VIOLATION.
pub mod iomanager {
    /// IoCompleteRequest while the cancel routine is still set (the request
    /// is still marked cancelable). (cancel routine, request, 0)
    pub const COMPLETE_WITH_CANCEL_ROUTINE: u64 = 0x07;
    /// IoCompleteRequest above DISPATCH_LEVEL. (IRQL, request, 0)
    pub const COMPLETE_ABOVE_DISPATCH: u64 = 0x0E;
}

/// Parameter 1 values of 0xE6 DRIVER_VERIFIER_DMA_VIOLATION, and the
/// fault types the host's IOMMU model puts in parameter 4.
pub mod dma {
    /// The driver released its DMA adapter (here: unloaded) with common
    /// buffers or scatter/gather lists still out. (0x08, 0, how many, the
    /// first one's mapping id)
    pub const RELEASED_WITH_OUTSTANDING: u64 = 0x08;
    /// The IOMMU detected a DMA violation: a device access outside what is
    /// mapped for it. (0x26, mapping id or 0, logical address, fault type)
    pub const IOMMU_VIOLATION: u64 = 0x26;
    /// Fault type: the logical address was never mapped.
    pub const FAULT_UNMAPPED: u64 = 0x1;
    /// Fault type: the access runs past the end of the mapping it starts
    /// in (into the unmapped page after it).
    pub const FAULT_PAST_END: u64 = 0x2;
    /// Fault type: the mapping was unmapped (its common buffer freed, its
    /// scatter/gather list put back).
    pub const FAULT_AFTER_UNMAP: u64 = 0x3;
    /// Fault type: a read of memory mapped only for the device to write,
    /// or a write of memory mapped only for it to read.
    pub const FAULT_DIRECTION: u64 = 0x4;
    /// Fault type: the driver unmapped memory (freed a common buffer, put
    /// back a scatter/gather list) the device still holds a view of (a
    /// queue or a registration it was given and has not let go of).
    pub const FAULT_UNMAPPED_WHILE_VIEWED: u64 = 0x5;
    /// Fault type, host-defined: the device did DMA (or raised an MSI-X
    /// message, a DMA write) while the function was in D3, which a
    /// device does only if its driver did not quiesce it before D0Exit
    /// returned. (0x26, 0, logical address or message, 0x6)
    pub const FAULT_POWERED_DOWN: u64 = 0x6;
}

/// Parameter 1 (and for [`REQUEST_FATAL_ERROR`](wdf::REQUEST_FATAL_ERROR),
/// parameter 2) values of 0x10D WDF_VIOLATION (`wdfbugcodes.h`).
pub mod wdf {
    /// A fatal error handling a request; parameter 2 says which.
    pub const REQUEST_FATAL_ERROR: u64 = 0x6;
    /// Parameter 2 of [`REQUEST_FATAL_ERROR`]: the request was completed
    /// with more information bytes than its output buffer holds.
    /// (0x6, 0x4, request, information)
    pub const INFORMATION_LENGTH_MISMATCH: u64 = 0x4;
    /// Parameter 2 of [`REQUEST_FATAL_ERROR`], host-defined (KMDF only
    /// breaks into the debugger here): marked cancelable while already
    /// cancelable or owned by its cancel routine. (0x6, 0x1001, request, 0)
    pub const HOST_MARK_CANCELABLE_TWICE: u64 = 0x1001;
    /// Parameter 2 of [`REQUEST_FATAL_ERROR`], host-defined (KMDF only
    /// breaks into the debugger here): unmarked while not cancelable.
    /// (0x6, 0x1002, request, 0)
    pub const HOST_UNMARK_NOT_CANCELABLE: u64 = 0x1002;
    /// A callback returned at a different IRQL than it was called at.
    /// (0xE, IRQL called, IRQL returned)
    pub const VERIFIER_IRQL_MISMATCH: u64 = 0xE;
}

/// A verifier stop: the Windows bugcheck code, its name and parameters, and
/// a human-readable reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BugCheck {
    /// The bugcheck code (e.g. 0xC4).
    pub code: u32,
    /// Its symbolic name (e.g. `DRIVER_VERIFIER_DETECTED_VIOLATION`).
    pub name: &'static str,
    /// Parameters 1 to 4, as Windows documents them for this code (host
    /// objects' ids stand in for addresses).
    pub params: [u64; 4],
    /// What the verifier saw, for people.
    pub reason: String,
}

impl BugCheck {
    /// A bugcheck with the name looked up from the code.
    #[must_use]
    pub fn new(code: u32, params: [u64; 4], reason: impl Into<String>) -> Self {
        Self {
            code,
            name: code_name(code),
            params,
            reason: reason.into(),
        }
    }

    /// Parameter 1 (the subcode for 0xC4, 0xC9, 0x10D, 0xC2, 0xC7).
    #[must_use]
    pub const fn param1(&self) -> u64 {
        self.params[0]
    }
}

impl fmt::Display for BugCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [p1, p2, p3, p4] = self.params;
        write!(
            f,
            "STOP 0x{:08X} {} (0x{p1:X}, 0x{p2:X}, 0x{p3:X}, 0x{p4:X}): {}",
            self.code, self.name, self.reason
        )
    }
}

impl std::error::Error for BugCheck {}

/// The symbolic name of a bugcheck code this crate raises.
#[must_use]
pub const fn code_name(code: u32) -> &'static str {
    match code {
        codes::MULTIPLE_IRP_COMPLETE_REQUESTS => "MULTIPLE_IRP_COMPLETE_REQUESTS",
        codes::PROCESS_HAS_LOCKED_PAGES => "PROCESS_HAS_LOCKED_PAGES",
        codes::DRIVER_POWER_STATE_FAILURE => "DRIVER_POWER_STATE_FAILURE",
        codes::SYSTEM_THREAD_EXCEPTION_NOT_HANDLED => "SYSTEM_THREAD_EXCEPTION_NOT_HANDLED",
        codes::BAD_POOL_CALLER => "BAD_POOL_CALLER",
        codes::DRIVER_VERIFIER_DETECTED_VIOLATION => "DRIVER_VERIFIER_DETECTED_VIOLATION",
        codes::TIMER_OR_DPC_INVALID => "TIMER_OR_DPC_INVALID",
        codes::DRIVER_VERIFIER_IOMANAGER_VIOLATION => "DRIVER_VERIFIER_IOMANAGER_VIOLATION",
        codes::DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS => {
            "DRIVER_UNLOADED_WITHOUT_CANCELLING_PENDING_OPERATIONS"
        }
        codes::DRIVER_IRQL_NOT_LESS_OR_EQUAL => "DRIVER_IRQL_NOT_LESS_OR_EQUAL",
        codes::DRIVER_VERIFIER_DMA_VIOLATION => "DRIVER_VERIFIER_DMA_VIOLATION",
        codes::WDF_VIOLATION => "WDF_VIOLATION",
        codes::DPC_WATCHDOG_VIOLATION => "DPC_WATCHDOG_VIOLATION",
        _ => "UNKNOWN_BUGCHECK",
    }
}

thread_local! {
    /// How many `catch_bugcheck` frames are active on this thread: a caught
    /// bugcheck is not printed by the panic hook.
    static CATCH_DEPTH: Cell<u32> = const { Cell::new(0) };
}

static HOOK: Once = Once::new();

/// Installs (once) a panic hook that prints uncaught bugchecks as a STOP
/// line and stays quiet for ones a [`catch_bugcheck`] will return; other
/// panics go to the previous hook.
fn install_hook() {
    // The verifier's own: never refused by the process-wide injection.
    super::heap::uncharged(install_hook_once);
}

fn install_hook_once() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if let Some(b) = info.payload().downcast_ref::<BugCheck>() {
                if CATCH_DEPTH.with(Cell::get) == 0 {
                    let at = info
                        .location()
                        .map(|l| format!(" at {}:{}", l.file(), l.line()))
                        .unwrap_or_default();
                    let thread = std::thread::current();
                    eprintln!(
                        "*** {b}{at} (thread {})",
                        thread.name().unwrap_or("<unnamed>")
                    );
                }
            } else {
                previous(info);
            }
        }));
    });
}

/// Stops "the machine": panics with `check` as the payload.
///
/// IRQL: any.
#[track_caller]
pub fn bugcheck(check: BugCheck) -> ! {
    install_hook();
    panic::panic_any(check)
}

/// Shorthand for the verifier: raise a bugcheck from code and parameters.
#[track_caller]
pub(crate) fn stop(code: u32, params: [u64; 4], reason: impl Into<String>) -> ! {
    bugcheck(BugCheck::new(code, params, reason))
}

/// Runs `f`, returning the bugcheck it raised instead of unwinding.
///
/// On a bugcheck the calling thread's emulated processor state (IRQL,
/// spin locks it holds, DPC nesting) is put back as it was on entry, so the
/// thread can go on. Any other panic resumes unwinding (after the same
/// restoration).
///
/// # Errors
/// The [`BugCheck`] `f` raised.
pub fn catch_bugcheck<R>(f: impl FnOnce() -> R) -> Result<R, BugCheck> {
    install_hook();
    let saved = irql::save_state();
    CATCH_DEPTH.with(|d| d.set(d.get() + 1));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    CATCH_DEPTH.with(|d| d.set(d.get() - 1));
    match result {
        Ok(value) => Ok(value),
        Err(payload) => {
            irql::restore_state(saved);
            match payload.downcast::<BugCheck>() {
                Ok(check) => Err(*check),
                Err(other) => panic::resume_unwind(other),
            }
        }
    }
}

/// Turns a panic payload caught on a host thread into a bugcheck: a
/// bugcheck as is, anything else as SYSTEM_THREAD_EXCEPTION_NOT_HANDLED.
pub(crate) fn from_payload(payload: Box<dyn Any + Send>, thread: &str) -> BugCheck {
    match payload.downcast::<BugCheck>() {
        Ok(check) => *check,
        Err(other) => {
            let message = other
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| other.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".to_owned());
            BugCheck::new(
                codes::SYSTEM_THREAD_EXCEPTION_NOT_HANDLED,
                [0, 0, 0, 0],
                format!("panic on host thread {thread}: {message}"),
            )
        }
    }
}

/// Runs `f` on a host-owned thread (timer, worker): a bugcheck or panic is
/// recorded in `slot` (first one wins) instead of killing the thread.
pub(crate) fn run_guarded(
    slot: &std::sync::Mutex<Option<BugCheck>>,
    thread: &str,
    f: impl FnOnce(),
) {
    install_hook();
    let saved = irql::save_state();
    if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(f)) {
        irql::restore_state(saved);
        let check = from_payload(payload, thread);
        let mut slot = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(check);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catch_returns_the_bugcheck() {
        let r = catch_bugcheck(|| -> u32 { stop(0xC4, [0x30, 2, 0, 0], "test") });
        let b = r.unwrap_err();
        assert_eq!(b.code, 0xC4);
        assert_eq!(b.name, "DRIVER_VERIFIER_DETECTED_VIOLATION");
        assert_eq!(b.params, [0x30, 2, 0, 0]);
        assert!(b.to_string().starts_with("STOP 0x000000C4 DRIVER_VERIFIER"));
    }

    #[test]
    fn catch_passes_values_through() {
        assert_eq!(catch_bugcheck(|| 7), Ok(7));
    }

    #[test]
    fn other_panics_keep_unwinding() {
        let r = panic::catch_unwind(|| {
            let _ = catch_bugcheck(|| panic!("not a bugcheck"));
        });
        assert!(r.is_err());
    }
}
