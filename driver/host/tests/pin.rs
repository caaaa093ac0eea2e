//! A memory registration pins only memory the caller can reach: the host's
//! pin probes the range as `MmProbeAndLockPages` does (every page mapped
//! and readable, writable when the registration grants local write) and
//! refuses the rest with `STATUS_ACCESS_VIOLATION`, on both backends, before
//! the device touches a page (the model HCA reads each one).

use irpverbs_abi::*;
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_verbs::IntoClient;

mod common;

/// Read-only memory of this program.
static READ_ONLY: [u8; 8192] = [7; 8192];

fn unreachable_ranges_are_refused_and_reachable_ones_pinned(backend: Backend) {
    let dev = HostDevice::new(HostDeviceConfig {
        backend,
        ..HostDeviceConfig::default()
    })
    .expect("host device");
    let client = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .expect("open")
        .into_client();
    let pd = client.alloc_pd().expect("pd").pd;
    let write = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE;

    // Page 1 is never mapped; nor is a range that runs off a buffer's end
    // into a page nobody may touch (reserved with no access, so that no
    // other mapping of the process can land there while the test runs).
    assert_eq!(
        client.reg_mr(pd, 0x1000, 4096, 0).err(),
        Some(STATUS_ACCESS_VIOLATION)
    );
    let guarded = GuardedPages::new(16);
    assert_eq!(
        client
            .reg_mr(pd, guarded.addr(), guarded.open + 4096, 0)
            .err(),
        Some(STATUS_ACCESS_VIOLATION)
    );
    let mr = client
        .reg_mr(pd, guarded.addr(), guarded.open, 0)
        .expect("the pages before the guard");
    client.dereg_mr(mr.mr).expect("dereg");
    // Read-only memory: readable, not writable.
    let ro = READ_ONLY.as_ptr() as u64;
    let len = READ_ONLY.len() as u64;
    assert_eq!(
        client.reg_mr(pd, ro, len, write).err(),
        Some(STATUS_ACCESS_VIOLATION)
    );
    let mr = client
        .reg_mr(pd, ro, len, 0)
        .expect("read-only, read access");
    client.dereg_mr(mr.mr).expect("dereg");
    // Heap memory, writable.
    let mut buf = vec![0u8; 3 << 16];
    let mr = client
        .reg_mr(pd, buf.as_mut_ptr() as u64, buf.len() as u64, write)
        .expect("heap, write access");
    client.dereg_mr(mr.mr).expect("dereg");
    // The refusals left nothing behind: the PD has no MR.
    client.dealloc_pd(pd).expect("dealloc pd");
    drop(client);
    dev.quiesce(std::time::Duration::from_secs(10))
        .expect("nothing held");
}

on_each_backend!(unreachable_ranges_are_refused_and_reachable_ones_pinned);

/// `pages` readable and writable pages followed by one with no access
/// (`PROT_NONE`): a range that runs past them is unreachable, whatever else
/// the process maps meanwhile.
struct GuardedPages {
    base: *mut libc::c_void,
    len: usize,
    /// Bytes before the guard page.
    open: u64,
}

impl GuardedPages {
    fn new(pages: usize) -> Self {
        // SAFETY: sysconf reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = (pages + 1) * page;
        // SAFETY: an anonymous private mapping at an address the kernel
        // chooses; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap");
        // SAFETY: the last page of the mapping made above.
        let guard = unsafe { base.cast::<u8>().add(pages * page) };
        // SAFETY: the page lies within the mapping, which this value owns.
        let rc = unsafe { libc::mprotect(guard.cast(), page, libc::PROT_NONE) };
        assert_eq!(rc, 0, "mprotect");
        Self {
            base,
            len,
            open: (pages * page) as u64,
        }
    }

    fn addr(&self) -> u64 {
        self.base as u64
    }
}

impl Drop for GuardedPages {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made; no MR refers to it any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}
