//! The soft HCA as the driver sees it: commands through the event queue,
//! device add and removal, the doorbell and clock entry points.

use crate::tests::util::{CountingBus, Dev, TestPlatform};
use crate::*;
use alloc::vec::Vec;
use irpverbs_abi::{STATUS_INVALID_HANDLE, STATUS_INVALID_PARAMETER, STATUS_SUCCESS};
use irpverbs_core::CommandOut;
use irpverbs_core::platform::DEVICE_LOCK;

/// Drains the event queue: the tokens of the command completions, in
/// order.
fn drain(d: &Dev) -> Vec<u64> {
    let mut tokens = Vec::new();
    while let Some(e) = d.hca.poll_event() {
        let Event::CommandDone { token, .. } = e else {
            panic!("{e:?}")
        };
        tokens.push(token);
    }
    tokens
}

#[test]
fn invalid_config_is_refused() {
    let config = SoftConfig {
        max_cqe: 1000,
        ..SoftConfig::default()
    };
    let bus = Arc::new(CountingBus::default());
    assert_eq!(
        SoftHca::new(&TestPlatform, config, bus).err(),
        Some(STATUS_INVALID_PARAMETER)
    );
}

/// Every allocation of device add can fail: `new` then returns
/// `STATUS_INSUFFICIENT_RESOURCES` instead of aborting.
#[test]
fn new_fails_cleanly_when_memory_is_short() {
    let bus: Arc<dyn SoftBus> = Arc::new(CountingBus::default());
    let mut n = 0;
    loop {
        let config = SoftConfig::default();
        let (hca, failed) =
            irpverbs_failalloc::failing_nth(n, || SoftHca::new(&TestPlatform, config, bus.clone()));
        match hca {
            Ok(hca) => {
                assert!(!failed, "run {n}: an allocation failed, and new succeeded");
                drop(hca);
            }
            Err(status) => assert_eq!(status, STATUS_INSUFFICIENT_RESOURCES, "run {n}"),
        }
        if !failed {
            break;
        }
        n += 1;
    }
    assert!(
        n >= 4,
        "the command queue, the event queue, the ring pool: {n}"
    );
}

/// The data path's event list has room for a full event queue from
/// the start; past that it grows fallibly, and an event it has no
/// memory for is lost and counted, not an abort.
#[test]
fn data_path_events_have_room_and_fail_cleanly() {
    let d = Dev::with(|c| c.eq_depth = 8);
    d.hca.with_firmware(|fw| {
        let dp = &mut fw.dp;
        assert!(dp.events.capacity() >= 8);
        let ((), allocated) = irpverbs_failalloc::counting(|| {
            while dp.events.len() < dp.events.capacity() {
                assert!(dp.event(Event::Completion { cqn: 1 }));
            }
        });
        assert_eq!(allocated, 0);
        let (queued, failed) =
            irpverbs_failalloc::failing_nth(0, || dp.event(Event::Completion { cqn: 2 }));
        assert!(failed && !queued);
        assert_eq!(dp.stats.events_lost, 1);
        dp.events.clear();
    });
    assert_eq!(d.hca.stats().events_lost, 1);
}

/// After a removal the driver destroys what is left: those commands
/// queue in the room the command queue had (removal gives it back),
/// without allocating.
#[test]
fn commands_after_removal_queue_without_allocating() {
    let d = Dev::deferred();
    let pdn = {
        d.hca.post_command(1, Command::AllocPd).unwrap();
        d.hca.run_firmware();
        d.hca.device_removed();
        let Some(Event::CommandDone { out, .. }) = d.hca.poll_event() else {
            panic!("no completion")
        };
        let CommandOut::Pd { pdn } = out else {
            panic!("{out:?}")
        };
        pdn
    };
    let (posted, allocated) =
        irpverbs_failalloc::counting(|| d.hca.post_command(2, Command::DeallocPd { pdn }));
    assert!(posted.is_ok());
    assert_eq!(allocated, 0);
    assert_eq!(d.hca.run_firmware(), 1);
}

#[test]
fn inline_executes_at_once_and_interrupts_only_when_armed() {
    let d = Dev::inline();
    d.hca.post_command(7, Command::AllocPd).unwrap();
    assert_eq!(d.bus.interrupts(), 0, "not armed");
    assert_eq!(d.bus.doorbells(), 0, "inline: no doorbell");
    assert_eq!(
        d.hca.poll_event(),
        Some(Event::CommandDone {
            token: 7,
            status: STATUS_SUCCESS,
            out: CommandOut::Pd { pdn: 1 }
        })
    );
    assert_eq!(d.hca.poll_event(), None);

    d.hca.arm_event_queue();
    assert_eq!(d.bus.interrupts(), 0, "nothing pending");
    d.hca.post_command(8, Command::AllocPd).unwrap();
    assert_eq!(d.bus.interrupts(), 1, "armed: interrupts");
    d.hca.post_command(9, Command::AllocPd).unwrap();
    assert_eq!(d.bus.interrupts(), 1, "disarmed by the first");
    assert_eq!(drain(&d), [8, 9]);
    d.hca.arm_event_queue();
    d.hca
        .post_command(10, Command::DeallocPd { pdn: 99 })
        .unwrap();
    assert_eq!(d.bus.interrupts(), 2, "failures complete too");
    assert_eq!(
        d.hca.poll_event(),
        Some(Event::CommandDone {
            token: 10,
            status: STATUS_INVALID_HANDLE,
            out: CommandOut::None
        })
    );
}

#[test]
fn arming_with_entries_pending_interrupts_at_once() {
    let d = Dev::inline();
    d.hca.post_command(1, Command::AllocPd).unwrap();
    d.hca.post_command(2, Command::AllocPd).unwrap();
    assert_eq!(d.bus.interrupts(), 0);
    d.hca.arm_event_queue();
    assert_eq!(d.bus.interrupts(), 1);
    d.hca.post_command(3, Command::AllocPd).unwrap();
    assert_eq!(d.bus.interrupts(), 1, "that arm was consumed");
    assert!(d.hca.poll_event().is_some());
    d.hca.arm_event_queue();
    assert_eq!(d.bus.interrupts(), 2, "still entries pending");
    assert_eq!(drain(&d), [2, 3]);
    d.hca.arm_event_queue();
    assert_eq!(d.bus.interrupts(), 2);
}

#[test]
fn deferred_queue_full_gives_the_command_back() {
    let d = Dev::with(|c| {
        c.execution = Execution::Deferred;
        c.cmd_queue_depth = 4;
    });
    for token in 1..=4 {
        d.hca.post_command(token, Command::AllocPd).unwrap();
    }
    assert_eq!(d.bus.doorbells(), 4);
    assert_eq!(d.hca.poll_event(), None, "deferred: nothing ran yet");
    let cmd = Command::RegMr(irpverbs_core::RegMr {
        pdn: 1,
        addr: 0,
        length: 1,
        access: 0,
        physical: false,
        region: crate::tests::util::region(4096),
    });
    assert_eq!(d.hca.post_command(5, cmd.clone()), Err(cmd.clone()));
    assert_eq!(d.bus.doorbells(), 4, "no doorbell for a refused command");
    let stats = d.hca.stats();
    assert_eq!((stats.commands_refused, stats.commands_queued), (1, 4));
    assert_eq!(d.hca.run_firmware(), 4);
    assert_eq!(d.hca.run_firmware(), 0);
    d.hca.post_command(5, cmd).unwrap();
    assert_eq!(d.hca.run_firmware(), 1);
    assert_eq!(drain(&d), [1, 2, 3, 4, 5]);
    assert_eq!(d.hca.live_objects(), 5);
    assert_eq!(d.bus.interrupts(), 0);
}

#[test]
fn deferred_interrupts_from_the_firmware_run() {
    let d = Dev::deferred();
    d.hca.arm_event_queue();
    d.hca.post_command(1, Command::AllocPd).unwrap();
    assert_eq!(d.bus.interrupts(), 0);
    d.hca.run_firmware();
    assert_eq!(d.bus.interrupts(), 1);
    assert_eq!(drain(&d), [1]);
}

#[test]
fn a_full_event_queue_stalls_commands_and_loses_nothing_deferred() {
    let d = Dev::with(|c| {
        c.execution = Execution::Deferred;
        c.cmd_queue_depth = 8;
        c.eq_depth = 4;
    });
    for token in 1..=8 {
        d.hca.post_command(token, Command::AllocPd).unwrap();
    }
    assert_eq!(d.hca.run_firmware(), 3, "room for 3 completions + 1 async");
    assert_eq!(d.hca.run_firmware(), 0, "stalled");
    let doorbells = d.bus.doorbells();
    let mut tokens = Vec::new();
    while tokens.len() < 8 {
        let Some(Event::CommandDone { token, .. }) = d.hca.poll_event() else {
            panic!("a completion was lost");
        };
        tokens.push(token);
        d.hca.run_firmware();
    }
    assert_eq!(tokens, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(
        d.bus.doorbells() > doorbells,
        "a poll rings for the stalled firmware"
    );
    let stats = d.hca.stats();
    assert_eq!(stats.commands_executed, 8);
    assert_eq!(stats.eq_high_water, 3);
    assert_eq!(stats.commands_queued, 0);
}

#[test]
fn a_full_event_queue_stalls_commands_and_loses_nothing_inline() {
    let d = Dev::with(|c| {
        c.cmd_queue_depth = 2;
        c.eq_depth = 2;
    });
    d.hca.post_command(1, Command::AllocPd).unwrap();
    d.hca.post_command(2, Command::AllocPd).unwrap();
    d.hca.post_command(3, Command::AllocPd).unwrap();
    assert_eq!(
        d.hca.post_command(4, Command::AllocPd),
        Err(Command::AllocPd),
        "two waiting for room in the event queue"
    );
    d.hca.arm_event_queue();
    assert_eq!(d.bus.interrupts(), 1);
    assert_eq!(drain(&d), [1, 2, 3], "each poll ran the next command");
    d.hca.post_command(4, Command::AllocPd).unwrap();
    assert_eq!(drain(&d), [4]);
    assert_eq!(d.hca.live_objects(), 4);
}

#[test]
fn stats_count_commands() {
    let d = Dev::inline();
    d.ok(Command::AllocPd);
    d.fails(Command::DeallocPd { pdn: 5 }, STATUS_INVALID_HANDLE);
    d.ok(Command::QueryPort { port: 1 });
    let s = d.hca.stats();
    assert_eq!(s.commands_executed, 3);
    assert_eq!(s.commands_failed, 1);
    assert_eq!(s.commands_refused, 0);
    assert_eq!(s.eq_high_water, 1);
    assert_eq!(s, d.hca.stats());
    assert!(alloc::format!("{:?}", d.hca).contains("commands_executed: 3"));
}

#[test]
fn callable_under_the_device_lock() {
    let d = Dev::inline();
    let device = TestPlatform.new_lock(&DEVICE_LOCK, ());
    d.hca.arm_event_queue();
    device.lock(|()| {
        d.hca.post_command(1, Command::AllocPd).unwrap();
        assert!(d.hca.poll_event().is_some());
        d.hca.arm_event_queue();
    });
    assert_eq!(d.bus.interrupts(), 1);
}

#[test]
fn concurrent_posters_and_a_hardware_thread() {
    for execution in [Execution::Inline, Execution::Deferred] {
        let d = Dev::with(|c| {
            c.execution = execution;
            c.cmd_queue_depth = 8;
            c.eq_depth = 8;
        });
        let hca = d.hca.clone();
        let threads = 4;
        let per_thread = 200u64;
        let stop = Arc::new(core::sync::atomic::AtomicBool::new(false));
        std::thread::scope(|s| {
            for t in 0..threads {
                let hca = hca.clone();
                s.spawn(move || {
                    for i in 0..per_thread {
                        let token = t * 1000 + i;
                        while hca.post_command(token, Command::AllocPd).is_err() {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            if execution == Execution::Deferred {
                let (hca, stop) = (hca.clone(), stop.clone());
                s.spawn(move || {
                    while !stop.load(core::sync::atomic::Ordering::SeqCst) {
                        if hca.run_firmware() == 0 {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            let mut seen = Vec::new();
            while seen.len() < (threads * per_thread) as usize {
                match hca.poll_event() {
                    Some(Event::CommandDone { token, status, .. }) => {
                        assert_eq!(status, STATUS_SUCCESS);
                        seen.push(token);
                    }
                    Some(e) => panic!("{e:?}"),
                    None => std::thread::yield_now(),
                }
            }
            stop.store(true, core::sync::atomic::Ordering::SeqCst);
            for t in 0..threads {
                let mine: Vec<u64> = seen.iter().copied().filter(|k| k / 1000 == t).collect();
                let expect: Vec<u64> = (0..per_thread).map(|i| t * 1000 + i).collect();
                assert_eq!(mine, expect, "each poster's commands complete in order");
            }
        });
        assert_eq!(d.hca.live_objects(), (threads * per_thread) as usize);
        assert!(d.hca.stats().eq_high_water <= 8);
    }
}
