//! The process-wide allocation failure injection
//! (`irpverbs_host::platform::heap::arm_process_injection`): it counts
//! every allocation of the process once armed, refuses exactly the one
//! asked for, records where it was made, and leaves the platform's own
//! bookkeeping alone. One test: the injection is process-wide.

use irpverbs_host::platform::HostPlatform;
use irpverbs_host::platform::heap::{arm_process_injection, disarm_process_injection};

/// Reserves room for a few bytes in a new vector: `Err` when refused.
#[inline(never)]
fn irpverbs_probe_allocation() -> Result<Vec<u8>, std::collections::TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(24)?;
    Ok(v)
}

#[test]
fn the_nth_allocation_is_refused_and_the_platforms_bookkeeping_is_exempt() {
    let platform = HostPlatform::default();
    // Count only: every allocation of this thread is counted, none refused.
    arm_process_injection(None);
    let kept: Vec<_> = (0..3).map(|_| irpverbs_probe_allocation()).collect();
    let report = disarm_process_injection();
    assert!(kept.iter().all(Result::is_ok));
    assert!(report.counted >= 3, "{report:?}");
    assert_eq!(report.refused, None);
    drop(kept);

    // The second allocation after arming is refused, and only it. Nothing
    // else allocates on this thread meanwhile (the probes are fallible).
    arm_process_injection(Some(2));
    let first = irpverbs_probe_allocation();
    let second = irpverbs_probe_allocation();
    let third = irpverbs_probe_allocation();
    let report = disarm_process_injection();
    assert!(first.is_ok() && second.is_err() && third.is_ok());
    let refused = report.refused.expect("a refusal");
    assert_eq!((refused.index, refused.bytes), (2, 24));
    assert!(
        refused.site.contains("irpverbs_probe_allocation"),
        "the site names the allocating function: {}",
        refused.site
    );

    // The platform's own work (`os_code`: uncharged) is neither counted nor
    // refused: the verifier's bookkeeping never fails.
    arm_process_injection(Some(1));
    let exempt = platform.os_code(irpverbs_probe_allocation);
    let counted = disarm_process_injection();
    assert!(exempt.is_ok());
    assert_eq!(counted.counted, 0, "{counted:?}");
    assert_eq!(counted.refused, None);
}
