//! A vendor's unit test of a mini-driver against the core, over the fakes
//! of `irpverbs_core::testing`. docs/hardware-seam.md shows this file
//! ("Unit tests of a mini-driver"); `the_guide_shows_this_file` keeps the
//! two the same.

// guide:begin
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use irpverbs_abi::*;
use irpverbs_core::testing::{FakePlatform, FakeRequest, take_outcome};
use irpverbs_core::{Command, CommandOut, Device, Event, FileKey, Hca, RequestorMode};
use zerocopy::{FromBytes, IntoBytes};

/// The mini-driver under test. Its device executes a command when it is
/// posted and queues the completion on its event queue; this one knows
/// protection domains only.
#[derive(Default)]
struct MyHca {
    caps: IvQueryDeviceOut,
    eq: Mutex<VecDeque<Event>>,
    /// The device's PDs.
    pds: Mutex<Vec<u32>>,
}

impl Hca for MyHca {
    fn caps(&self) -> &IvQueryDeviceOut {
        &self.caps
    }
    fn post_command(&self, token: u64, command: Command) -> Result<(), Command> {
        let mut pds = self.pds.lock().unwrap();
        let (status, out) = match command {
            Command::AllocPd => {
                let pdn = pds.iter().max().map_or(1, |n| n + 1);
                pds.push(pdn);
                (STATUS_SUCCESS, CommandOut::Pd { pdn })
            }
            Command::DeallocPd { pdn } => match pds.iter().position(|&n| n == pdn) {
                Some(i) => {
                    pds.remove(i);
                    (STATUS_SUCCESS, CommandOut::None)
                }
                None => (STATUS_INVALID_PARAMETER, CommandOut::None),
            },
            _ => (STATUS_NOT_SUPPORTED, CommandOut::None),
        };
        let done = Event::CommandDone { token, status, out };
        self.eq.lock().unwrap().push_back(done);
        Ok(())
    }
    fn poll_event(&self) -> Option<Event> {
        self.eq.lock().unwrap().pop_front()
    }
    fn arm_event_queue(&self) {}
    fn sq_doorbell(&self, _: u32) {}
    fn rq_doorbell(&self, _: u32) {}
    fn srq_doorbell(&self, _: u32) {}
    fn cq_arm_doorbell(&self, _: u32) {}
}

/// Sends an IOCTL from a user process (address space 1) on `file`, as
/// the platform does: the caller's context, then the queue.
fn ioctl<P: Hca>(
    device: &Device<FakePlatform, P>,
    file: FileKey,
    code: u32,
    input: &[u8],
    output: usize,
) -> irpverbs_core::testing::Outcome {
    let request = FakeRequest::ioctl(code, RequestorMode::User, file, 1, input, output);
    let outcome = request.outcome.clone();
    if let Some(request) = device.in_caller_context(request) {
        device.dispatch_ioctl(request);
    }
    outcome
}

#[test]
fn a_pd_is_made_by_the_device_and_freed_at_cleanup() {
    let hca = Arc::new(MyHca {
        caps: IvQueryDeviceOut {
            max_pd: 4,
            max_cq: 4,
            max_cqe: 64,
            phys_port_cnt: 1,
            num_comp_vectors: 1,
            ..Default::default()
        },
        ..Default::default()
    });
    let device = Device::new(FakePlatform::default(), hca.clone());
    device.create_file(1, Some(1)).unwrap();

    let input = IvAllocPdIn::default();
    let out = ioctl(&device, 1, IOCTL_IV_ALLOC_PD, input.as_bytes(), 16);
    // Pending until the event queue's DPC completes it.
    assert!(take_outcome(&out).is_none());
    device.dpc();
    let (status, bytes) = take_outcome(&out).expect("completed by the DPC");
    assert_eq!(status, STATUS_SUCCESS);
    assert_ne!(IvAllocPdOut::read_from_bytes(&bytes).unwrap().pd, 0);
    assert_eq!(*hca.pds.lock().unwrap(), [1]);

    // A verb the device refuses fails with the device's status.
    let cq = IvCreateCqIn {
        cqe: 16,
        ..Default::default()
    };
    let out = ioctl(&device, 1, IOCTL_IV_CREATE_CQ, cq.as_bytes(), 64);
    device.dpc();
    assert_eq!(take_outcome(&out).unwrap().0, STATUS_NOT_SUPPORTED);

    // Process exit: the core frees the PD through the device, and
    // nothing the driver took is left.
    device.cleanup_file(1);
    device.dpc();
    device.close_file(1);
    assert!(hca.pds.lock().unwrap().is_empty());
    assert_eq!(device.platform().live_charges.load(Ordering::SeqCst), 0);
}
// guide:end

#[test]
fn the_guide_shows_this_file() {
    let this = include_str!("mini_driver.rs");
    let guide = include_str!("../../../docs/hardware-seam.md");
    let code = |text: &'static str, begin: &str, end: &str| {
        let start = text.find(begin).expect("begin marker") + begin.len();
        let stop = start + text[start..].find(end).expect("end marker");
        text[start..stop].trim().to_owned()
    };
    assert_eq!(
        code(guide, "```rust\n", "```"),
        code(this, "// guide:begin\n", "// guide:end"),
        "docs/hardware-seam.md's example is not driver/core/tests/mini_driver.rs"
    );
}
