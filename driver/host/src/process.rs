//! Processes in host mode: handles that belong to a process, duplicated
//! into another, and a process's exit as Windows runs it.
//!
//! Host mode has one address space; a process here is the identity
//! ([`ProcessKey`]) that a handle's requests carry
//! ([`crate::platform::RequestParams::process`]), that the driver binds a
//! file to (its opener: `Device::create_file`), and that the verifier
//! counts pins and mappings against. What the model gives a test:
//!
//! - [`HostDevice::create_process`], [`HostDevice::open_in`]: a process and
//!   a file it opens (every other open is [`HOST_PROCESS`]'s).
//! - [`HostFile::duplicate`]: a second handle to the same file object in
//!   another process (`DuplicateHandle`, or a handle a child inherits). The
//!   file's cleanup and close come with its last handle, wherever it is.
//! - [`HostDevice::exit_process`]: the exit, in Windows' order — the
//!   process-exit notification (irpverbs.sys registers
//!   `PsSetCreateProcessNotifyRoutineEx`; its routine runs down the files
//!   the process opened: `Device::owner_exited`), then the close of the
//!   process's handles, then the teardown of its address space, where the
//!   verifier raises 0x76 for pages still locked or mappings still in it
//!   ([`HostPlatform::process_exited`](crate::platform::HostPlatform::process_exited))
//!   and any later touch of it is a bugcheck.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use irpverbs_core::{FileKey, ProcessKey};

use crate::device::{HostDevice, HostFile, lock};
use crate::platform::HOST_PROCESS;

impl HostDevice {
    /// A new process: its key, for [`Self::open_in`] and
    /// [`HostFile::duplicate`].
    #[must_use]
    pub fn create_process(&self) -> ProcessKey {
        self.platform().create_process()
    }

    /// `process` exits, as Windows runs the exit of a process's last
    /// thread:
    ///
    /// 1. The process-exit notification (the routine irpverbs.sys
    ///    registers with `PsSetCreateProcessNotifyRoutineEx`, called with
    ///    no create information, in the exiting process at
    ///    PASSIVE_LEVEL), unless [`crate::HostDeviceConfig::no_process_notify`]:
    ///    each file the process opened is run down
    ///    (`Device::owner_exited`), and the routine waits, bounded, for the
    ///    pages their registrations locked (as irpverbs.sys's does).
    /// 2. Its handles close (`ObKillProcess`): `close_handles` drops every
    ///    handle the test holds in the process (a file's last handle runs
    ///    its cleanup and close, in this process).
    /// 3. Its address space is torn down: the verifier raises 0x76 for
    ///    pages still pinned or rings still mapped in it, and any touch of
    ///    it from now on is a bugcheck (0xC4/0x2002).
    ///
    /// # Panics
    /// With a verifier bugcheck; or (a test's mistake) when the process
    /// still has handles after `close_handles`, or is [`HOST_PROCESS`].
    pub fn exit_process(&self, process: ProcessKey, close_handles: impl FnOnce()) {
        assert_ne!(process, HOST_PROCESS, "the host process does not exit");
        if !self.no_process_notify {
            self.notify_process_exit(process);
        }
        close_handles();
        let left = lock(&self.handles).get(&process).copied().unwrap_or(0);
        assert_eq!(left, 0, "process {process} exits with handles still held");
        self.platform().process_exited(process);
    }

    /// The driver's process-notify routine for the exit of `process`: the
    /// files it opened are run down now, while its address space is still
    /// there, and their pins waited for (bounded).
    ///
    /// IRQL: PASSIVE_LEVEL.
    fn notify_process_exit(&self, process: ProcessKey) {
        let files: Vec<FileKey> = lock(&self.owners)
            .iter()
            .filter(|&(_, &owner)| owner == process)
            .map(|(&file, _)| file)
            .collect();
        for file in files {
            self.platform()
                .driver_code(|| self.device.owner_exited(file));
            self.wait_file_pins(file, "process exit");
        }
    }
}

impl HostFile {
    /// The process this handle belongs to.
    #[must_use]
    pub fn process(&self) -> ProcessKey {
        self.process
    }

    /// A new handle to the same file object, in `process`
    /// (`DuplicateHandle`, or a handle inherited by a child): its requests
    /// come from `process`. The doorbell page this handle mapped is not
    /// mapped there.
    #[must_use]
    pub fn duplicate(&self, process: ProcessKey) -> HostFile {
        self.handles.fetch_add(1, Ordering::AcqRel);
        *lock(&self.dev.handles).entry(process).or_default() += 1;
        HostFile {
            dev: Arc::clone(&self.dev),
            key: self.key,
            access: self.access,
            mode: self.mode,
            outstanding: self.outstanding.clone(),
            kept_notify: self.kept_notify.clone(),
            page: std::sync::OnceLock::new(),
            process,
            handles: self.handles.clone(),
        }
    }
}
