//! A file's cleanup waits for the user pages its registrations pinned, and
//! never forever: with a pin leaked on purpose the close returns after the
//! bounded wait, logs it, and the verifier sees the process end with
//! locked pages (0x76, naming the driver, where Windows would otherwise
//! have an unkillable process); without a leak, the rundown's
//! deregistrations release every pin before the close, in both engines.

use std::sync::Arc;
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_core::{MajorFunction, Platform as _, RequestorMode};
use irpverbs_host::platform::{RequestParams, catch_bugcheck, codes, locked_pages};
use irpverbs_host::{Backend, Engine, HostDevice, HostDeviceConfig};
use irpverbs_verbs::IntoClient;

mod common;
use common::{End, Mem};

crate::on_each_backend!(
    a_closing_file_releases_its_pins_before_the_close,
    a_leaked_pin_bounds_the_cleanup_and_is_reported,
);

const RW: u32 = FILE_READ_ACCESS | FILE_WRITE_ACCESS;

fn device(backend: Backend, engine: Engine, cleanup_pin_timeout: Duration) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine,
        cleanup_pin_timeout: Some(cleanup_pin_timeout),
        ..HostDeviceConfig::default()
    })
    .expect("host device")
}

/// Registrations and a QP, the file closed with all of them alive: the
/// rundown releases every pin before the close (the verifier would raise
/// 0x76 for one left), and the cleanup did not give up.
fn a_closing_file_releases_its_pins_before_the_close(backend: Backend) {
    for engine in [Engine::Inline, Engine::Thread] {
        let dev = device(backend, engine, irpverbs_host::CLEANUP_PIN_TIMEOUT);
        let c = dev.open(RW).unwrap().into_client();
        let end = End::new_rc(&c);
        let extra = Mem::new(8192);
        c.reg_mr(end.pd, extra.addr(), 8192, IV_ACCESS_ALL).unwrap();
        std::mem::forget(end);
        drop(c);
        assert_eq!(dev.cleanup_timeouts(), 0);
        dev.quiesce(Duration::from_secs(10)).unwrap();
        dev.unload();
        drop(extra);
    }
}

/// A pin the driver never releases (taken here through the platform, as a
/// driver path that forgot it would): the close returns after the bounded
/// wait and the verifier raises 0x76 for the locked pages.
fn a_leaked_pin_bounds_the_cleanup_and_is_reported(backend: Backend) {
    let dev = device(backend, Engine::Inline, Duration::from_millis(50));
    let file = dev.open(RW).unwrap();
    let key = file.key();
    let platform = dev.platform().clone();
    let mem = Mem::new(4096);
    let request = platform.new_request(
        RequestParams {
            ioctl_code: IOCTL_IV_REG_MR,
            major_function: MajorFunction::DeviceControl,
            requestor_mode: RequestorMode::User,
            file: key,
            process: irpverbs_host::platform::HOST_PROCESS,
            input: Vec::new(),
            output_len: 0,
        },
        |_, _, _| {},
        None,
    );
    let leaked = platform
        .pin_memory(&request, mem.addr(), 4096, true, false)
        .unwrap();
    irpverbs_core::Request::complete(request, STATUS_SUCCESS, 0);
    assert_eq!(platform.pinned(key), 1);

    let check = catch_bugcheck(move || drop(file)).expect_err("0x76 at the close");
    assert_eq!(check.code, codes::PROCESS_HAS_LOCKED_PAGES, "{check}");
    assert_eq!(check.param1(), locked_pages::STILL_LOCKED);
    assert_eq!(dev.cleanup_timeouts(), 1, "the cleanup gave up and said so");

    // The pin goes at last; the file's close completes; nothing leaks.
    drop(leaked);
    assert_eq!(platform.pinned(key), 0);
    dev.device().close_file(key);
    dev.quiesce(Duration::from_secs(10)).unwrap();
    dev.unload();
}
