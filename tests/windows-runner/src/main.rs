//! Runs the conformance suite (`irpverbs_conformance::SUITE`) against the
//! installed `irpverbs.sys`: opens `\\.\irpverbs0` (or the path given as
//! the first argument) with `CreateFileW`, and carries every IOCTL with an
//! overlapped `DeviceIoControl`, the way a user-mode ULP does. Prints one
//! line per test and `N passed, M failed`; exits 1 if any failed.
//!
//! Run it elevated (the device admits SYSTEM and Administrators), ideally
//! with Driver Verifier on the driver (see the README).
//!
//! On other operating systems it only says that it runs on Windows.

use std::process::ExitCode;

fn main() -> ExitCode {
    #[cfg(windows)]
    {
        win::main()
    }
    #[cfg(not(windows))]
    {
        println!(
            "irpverbs-windows-runner runs on Windows only: it opens the installed \
             irpverbs.sys (\\\\.\\irpverbs0) with DeviceIoControl. In host mode the \
             same suite runs with `cargo test -p irpverbs-conformance`."
        );
        ExitCode::SUCCESS
    }
}

#[cfg(windows)]
mod win {
    use std::ffi::c_void;
    use std::process::ExitCode;
    use std::sync::Arc;

    use irpverbs_abi::{
        IOCTL_IV_MAP_DOORBELLS, IOCTL_IV_RING_DOORBELLS, IvMapDoorbellsOut, NtStatus,
        STATUS_ACCESS_DENIED, STATUS_BUFFER_TOO_SMALL, STATUS_CANCELLED, STATUS_DELETE_PENDING,
        STATUS_DEVICE_REMOVED, STATUS_INFO_LENGTH_MISMATCH, STATUS_INSUFFICIENT_RESOURCES,
        STATUS_INVALID_DEVICE_REQUEST, STATUS_INVALID_HANDLE, STATUS_INVALID_PARAMETER,
        STATUS_PENDING, nt_success,
    };
    use irpverbs_conformance::{Client, Dut, DutFile, IoctlTransport, SUITE};
    use irpverbs_verbs::{Doorbells, PageDoorbells, SpeedPath, WakeHca};
    use windows_sys::Win32::Foundation::{
        CloseHandle, ERROR_ACCESS_DENIED, ERROR_BAD_LENGTH, ERROR_DELETE_PENDING,
        ERROR_DEVICE_REMOVED, ERROR_INSUFFICIENT_BUFFER, ERROR_INVALID_FUNCTION,
        ERROR_INVALID_HANDLE, ERROR_INVALID_PARAMETER, ERROR_IO_PENDING, ERROR_NO_SYSTEM_RESOURCES,
        ERROR_NOT_ENOUGH_MEMORY, ERROR_OPERATION_ABORTED, GENERIC_READ, GENERIC_WRITE,
        GetLastError, HANDLE, INVALID_HANDLE_VALUE, WAIT_TIMEOUT, WIN32_ERROR,
    };
    use windows_sys::Win32::Storage::FileSystem::{
        CreateFileW, FILE_FLAG_OVERLAPPED, FILE_SHARE_READ, FILE_SHARE_WRITE, OPEN_EXISTING,
    };
    use windows_sys::Win32::System::IO::{
        CancelIoEx, DeviceIoControl, GetOverlappedResult, GetOverlappedResultEx, OVERLAPPED,
    };
    use windows_sys::Win32::System::Threading::CreateEventW;
    use zerocopy::FromBytes;

    /// How long one IOCTL may take before it is cancelled and reported.
    const IOCTL_TIMEOUT_MS: u32 = 30_000;

    pub(crate) fn main() -> ExitCode {
        let path = std::env::args()
            .nth(1)
            .unwrap_or_else(|| r"\\.\irpverbs0".to_owned());
        let dut = Device { path };
        if let Err(status) = dut.open() {
            eprintln!(
                "cannot open {}: NTSTATUS {status:#010x}. Is irpverbs.sys installed and its \
                 device started, and is this prompt elevated? (see the README)",
                dut.path
            );
            return ExitCode::from(2);
        }
        let (mut passed, mut failed) = (0usize, 0usize);
        for (name, test) in SUITE {
            match test(&dut) {
                Ok(()) => {
                    passed += 1;
                    println!("PASS {name}");
                }
                Err(e) => {
                    failed += 1;
                    println!("FAIL {name}: {e}");
                }
            }
        }
        println!("{passed} passed, {failed} failed");
        if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }

    /// The installed device, by path.
    struct Device {
        path: String,
    }

    impl Device {
        /// `CreateFileW` on the device, for overlapped I/O.
        fn open_file(&self) -> Result<File, NtStatus> {
            let wide: Vec<u16> = self.path.encode_utf16().chain(Some(0)).collect();
            // SAFETY: `wide` is a NUL-terminated UTF-16 path that outlives the
            // call; no security attributes or template file.
            let handle = unsafe {
                CreateFileW(
                    wide.as_ptr(),
                    GENERIC_READ | GENERIC_WRITE,
                    FILE_SHARE_READ | FILE_SHARE_WRITE,
                    std::ptr::null(),
                    OPEN_EXISTING,
                    FILE_FLAG_OVERLAPPED,
                    std::ptr::null_mut(),
                )
            };
            if handle == INVALID_HANDLE_VALUE {
                return Err(last_error_status());
            }
            Ok(File(Arc::new(OwnedHandle(handle))))
        }
    }

    impl Dut for Device {
        fn open(&self) -> Result<Box<DutFile>, NtStatus> {
            Ok(Box::new(self.open_file()?))
        }

        /// A new open whose doorbells are its doorbell page: mapped into
        /// this process first (`IOCTL_IV_MAP_DOORBELLS`), so that every
        /// ring mapped after it (`IOCTL_IV_MAP_RINGS`) reports its slot;
        /// posts then ring by setting bits in the page, with no system
        /// call, and the driver's scanner finds them. A driver without
        /// doorbell pages answers `STATUS_NOT_SUPPORTED`, and the data-path
        /// tests fail with that status.
        fn open_speed(&self) -> Result<Client, NtStatus> {
            let file = self.open_file()?;
            let (status, out) =
                file.ioctl(IOCTL_IV_MAP_DOORBELLS, &[], size_of::<IvMapDoorbellsOut>());
            if !nt_success(status) {
                return Err(status);
            }
            let map =
                IvMapDoorbellsOut::read_from_bytes(&out).map_err(|_| STATUS_INVALID_PARAMETER)?;
            // SAFETY: `map` is this file's IOCTL_IV_MAP_DOORBELLS response,
            // issued from this process; the driver keeps the page mapped
            // until the file's cleanup, which runs when `SpeedFile` closes
            // the handle, after its doorbells are gone (they are dropped
            // with it, first).
            let bells = unsafe { PageDoorbells::from_map(&map) }?
                .with_wake(Arc::new(File(Arc::clone(&file.0))));
            Ok(Client::with_speed_path(Box::new(SpeedFile { bells, file })))
        }

        /// The installed driver cannot be asked what it holds; Driver
        /// Verifier reports leaks when the driver unloads.
        fn check_quiescent(&self) -> Result<(), String> {
            Ok(())
        }
    }

    /// A handle closed on drop.
    struct OwnedHandle(HANDLE);

    // SAFETY: a Win32 handle is a process-wide value usable from any thread.
    unsafe impl Send for OwnedHandle {}
    // SAFETY: DeviceIoControl and CancelIoEx may be called on one handle from
    // several threads at once; each call brings its own OVERLAPPED.
    unsafe impl Sync for OwnedHandle {}

    impl Drop for OwnedHandle {
        fn drop(&mut self) {
            // SAFETY: the handle is open and owned by this value; closed once.
            unsafe { CloseHandle(self.0) };
        }
    }

    /// One open of the device: `CloseHandle` when the last reference is
    /// dropped is the file's cleanup and close in the driver (the speed
    /// path's doorbells hold one, to wake the driver's doorbell poller).
    struct File(Arc<OwnedHandle>);

    /// A doorbell rung while the driver's poller sleeps (the page's
    /// `polling` word read 0): `IOCTL_IV_RING_DOORBELLS` runs it now and
    /// wakes the poller. Its failure leaves the doorbell in the page.
    impl WakeHca for File {
        fn wake_hca(&self) {
            let _ = self.call(IOCTL_IV_RING_DOORBELLS, &[], 0);
        }
    }

    /// An open of the device with its doorbell page mapped: the speed path.
    /// Fields drop in order: the doorbells before the handle.
    struct SpeedFile {
        bells: PageDoorbells,
        file: File,
    }

    impl IoctlTransport for SpeedFile {
        fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
            self.file.ioctl(code, input, output_len)
        }
    }

    // SAFETY: a `SpeedFile` owns its handle (one open of the device, never
    // duplicated): the objects created through it are destroyed or resized
    // only by IOCTLs it issues, and run down only when it is dropped.
    unsafe impl SpeedPath for SpeedFile {
        fn doorbells(&self) -> &dyn Doorbells {
            &self.bells
        }
    }

    impl IoctlTransport for File {
        fn ioctl(&self, code: u32, input: &[u8], output_len: usize) -> (NtStatus, Vec<u8>) {
            match self.call(code, input, output_len) {
                Ok(result) => result,
                Err(status) => (status, Vec::new()),
            }
        }
    }

    impl File {
        /// One overlapped `DeviceIoControl`, waited for. The completion's
        /// NTSTATUS is the OVERLAPPED's `Internal` (the I/O status block) and
        /// its `information`, `InternalHigh`: KMDF pends every request it
        /// queues, so the status block is always written. Only a request the
        /// I/O manager refuses before the driver sees it fails synchronously;
        /// its Win32 error is mapped back with [`win32_to_status`].
        fn call(
            &self,
            code: u32,
            input: &[u8],
            output_len: usize,
        ) -> Result<(NtStatus, Vec<u8>), NtStatus> {
            let in_len = u32::try_from(input.len()).map_err(|_| STATUS_INVALID_PARAMETER)?;
            let out_len = u32::try_from(output_len).map_err(|_| STATUS_INVALID_PARAMETER)?;
            let mut output = vec![0u8; output_len];
            // SAFETY: no security attributes or name; a manual-reset event,
            // as an overlapped DeviceIoControl requires.
            let event = unsafe { CreateEventW(std::ptr::null(), 1, 0, std::ptr::null()) };
            if event.is_null() {
                return Err(last_error_status());
            }
            let event = OwnedHandle(event);
            let mut overlapped = OVERLAPPED {
                hEvent: event.0,
                ..OVERLAPPED::default()
            };
            let in_ptr: *const c_void = if input.is_empty() {
                std::ptr::null()
            } else {
                input.as_ptr().cast()
            };
            let out_ptr: *mut c_void = if output.is_empty() {
                std::ptr::null_mut()
            } else {
                output.as_mut_ptr().cast()
            };
            // SAFETY: the handle is open for overlapped I/O; the buffers are
            // valid for their lengths, and they and `overlapped` live until
            // the request is complete (waited for below before returning,
            // also on the timeout path); with an OVERLAPPED the byte count
            // output may be null.
            let started = unsafe {
                DeviceIoControl(
                    (self.0).0,
                    code,
                    in_ptr,
                    in_len,
                    out_ptr,
                    out_len,
                    std::ptr::null_mut(),
                    &raw mut overlapped,
                )
            };
            if started == 0 {
                // SAFETY: no precondition.
                let error = unsafe { GetLastError() };
                if error != ERROR_IO_PENDING {
                    return Err(win32_to_status(error));
                }
            }
            let mut transferred = 0u32;
            // SAFETY: the request above is in flight on this handle with this
            // OVERLAPPED; waits up to the timeout for it.
            let done = unsafe {
                GetOverlappedResultEx(
                    (self.0).0,
                    &raw const overlapped,
                    &raw mut transferred,
                    IOCTL_TIMEOUT_MS,
                    0,
                )
            };
            // SAFETY: no precondition.
            if done == 0 && unsafe { GetLastError() } == WAIT_TIMEOUT {
                eprintln!(
                    "IOCTL {code:#010x} did not complete in {IOCTL_TIMEOUT_MS} ms; cancelling it"
                );
                // SAFETY: cancels this request only (same handle and OVERLAPPED).
                unsafe { CancelIoEx((self.0).0, &raw const overlapped) };
                // SAFETY: as above; waits for the cancelled request to complete,
                // so the buffers are no longer in use when this returns.
                unsafe {
                    GetOverlappedResult((self.0).0, &raw const overlapped, &raw mut transferred, 1)
                };
            }
            // The status block: what the driver completed the request with.
            let status = overlapped.Internal as u32 as NtStatus;
            if status == STATUS_PENDING {
                // Never completed (cannot happen after the waits above).
                return Err(STATUS_CANCELLED);
            }
            if irpverbs_abi::nt_success(status) || nt_warning(status) {
                // Success and warning statuses carry output; errors do not.
                output.truncate(overlapped.InternalHigh.min(output_len));
            } else {
                output.clear();
            }
            Ok((status, output))
        }
    }

    /// `NT_WARNING`: a warning status (0x8xxxxxxx), which still carries
    /// output (the I/O manager copies it back, as for success).
    fn nt_warning(status: NtStatus) -> bool {
        (status as u32) >> 30 == 2
    }

    /// The last Win32 error as an NTSTATUS.
    fn last_error_status() -> NtStatus {
        // SAFETY: no precondition.
        win32_to_status(unsafe { GetLastError() })
    }

    /// The NTSTATUS behind a Win32 error, for the few failures that never
    /// reach the driver (the status block then holds nothing); anything
    /// else is reported as an NTSTATUS built from the Win32 code
    /// (`0xC007xxxx`, as `HRESULT_FROM_WIN32` would facility it).
    fn win32_to_status(error: WIN32_ERROR) -> NtStatus {
        match error {
            ERROR_ACCESS_DENIED => STATUS_ACCESS_DENIED,
            ERROR_INVALID_FUNCTION => STATUS_INVALID_DEVICE_REQUEST,
            ERROR_INVALID_HANDLE => STATUS_INVALID_HANDLE,
            ERROR_INVALID_PARAMETER => STATUS_INVALID_PARAMETER,
            ERROR_INSUFFICIENT_BUFFER => STATUS_BUFFER_TOO_SMALL,
            ERROR_BAD_LENGTH => STATUS_INFO_LENGTH_MISMATCH,
            ERROR_NO_SYSTEM_RESOURCES | ERROR_NOT_ENOUGH_MEMORY => STATUS_INSUFFICIENT_RESOURCES,
            ERROR_OPERATION_ABORTED => STATUS_CANCELLED,
            ERROR_DELETE_PENDING => STATUS_DELETE_PENDING,
            ERROR_DEVICE_REMOVED => STATUS_DEVICE_REMOVED,
            other => (0xC007_0000 | (other & 0xFFFF)) as NtStatus,
        }
    }
}
