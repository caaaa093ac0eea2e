//! Runs the conformance suite against the host device: the driver in-process
//! over the soft HCA, with the verifier on, firmware inline and on its own
//! thread. After every test the device must hold nothing of it.

use std::sync::Arc;
use std::time::Duration;

use irpverbs_abi::{FILE_READ_ACCESS, FILE_WRITE_ACCESS, NtStatus};
use irpverbs_conformance::{Dut, DutFile, SUITE};
use irpverbs_host::{Engine, HostDevice, HostDeviceConfig};

struct HostDut(Arc<HostDevice>);

impl Dut for HostDut {
    fn open(&self) -> Result<Box<DutFile>, NtStatus> {
        Ok(Box::new(self.0.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)?))
    }

    fn check_quiescent(&self) -> Result<(), String> {
        self.0.quiesce(Duration::from_secs(10))?;
        let pool = self.0.platform().pool_stats();
        if pool.live != 0 {
            return Err(format!("pool still charged: {pool:?}"));
        }
        Ok(())
    }
}

fn run_suite(engine: Engine) {
    let mut failures = Vec::new();
    for (name, test) in SUITE {
        let dev = HostDevice::new(HostDeviceConfig {
            engine,
            ..HostDeviceConfig::default()
        })
        .expect("host device");
        let dut = HostDut(Arc::clone(&dev));
        let result = test(&dut).and_then(|()| dut.check_quiescent());
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
        dev.unload();
    }
    assert!(
        failures.is_empty(),
        "{} of {} failed:\n{}",
        failures.len(),
        SUITE.len(),
        failures.join("\n")
    );
}

#[test]
fn conformance_inline_engine() {
    run_suite(Engine::Inline);
}

#[test]
fn conformance_thread_engine() {
    run_suite(Engine::Thread);
}
