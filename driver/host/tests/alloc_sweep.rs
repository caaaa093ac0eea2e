//! Driver Verifier's low-resources simulation, exhaustively: a scenario
//! (open, every create, a connection through the CM, traffic, close with
//! objects alive, removal and unload) runs once with every allocation
//! counted and its site recorded, then once per allocation index with
//! exactly that allocation refused. Every run must end without a panic or
//! an abort; the verb whose allocation was refused must fail with a clear
//! status (`STATUS_INSUFFICIENT_RESOURCES`) and succeed when issued again
//! (the device keeps working); the rest of the scenario must run; nothing
//! may leak (pool charges at unload, the driver's heap once the device is
//! gone).
//!
//! Two devices on the simulated wire (virtual clock, inline engines, all
//! on the test's thread), so that allocation n of a run is the same
//! allocation in every run up to the refused one. Device A is the active
//! side, B the passive one; each device's allocations are swept in turn.
//!
//! Every allocation of the driver crates and the host glue is swept. The
//! sites (the first driver function above the allocator in the
//! allocation's backtrace) reached are printed; the test fails if a site
//! the scenario must reach ([`MUST_REACH`]) is not reached.
//!
//! `IRPVERBS_SWEEP_STRIDE=n` sweeps every nth index (plus the first index
//! of every site); the default sweeps every index.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use irpverbs_abi::*;
use irpverbs_host::platform::{ChargeSite, HostConfig, TimerClock, VerifierConfig};
use irpverbs_host::simwire::SimHosts;
use irpverbs_host::{Backend, CmSubmitter, Engine, HostDevice, HostDeviceConfig};
use irpverbs_soft::SoftConfig;
use irpverbs_soft::sim::SimConfig;
use irpverbs_verbs::{Client, Cq, IntoClient, Qp, SendWr, av, qp_request};
use zerocopy::{FromBytes, IntoBytes};

mod common;
use common::{Mem, connect_defaults};

crate::on_each_backend!(every_allocation_can_fail_cleanly,);

/// Where the scenario must allocate (site prefixes): each crate, and the
/// places that take the room a create or request needs.
const MUST_REACH: &[&str] = &[
    "irpverbs_core::",
    "irpverbs_cm::",
    "irpverbs_soft::",
    "irpverbs_core::handle::HandleTable::insert ",
    "irpverbs_core::device::State<R>::reserve_commands ",
    "irpverbs_core::notify::reserve_waits ",
    "irpverbs_core::cm::<impl irpverbs_core::device::Device<P,H>>::new_cep ",
    "irpverbs_cm::engine::Engine::reserve_cep ",
    "irpverbs_cm::engine::api::<impl irpverbs_cm::engine::Engine>::listen_on ",
    "irpverbs_host::device::HostFile::dispatch ",
    "irpverbs_ring::region::Region::alloc ",
    "irpverbs_ring::ring::Ring::alloc ",
    "irpverbs_kernel_table::kernel::interface",
    // Device add and D0Entry: what the core and the HCA take shared.
    "irpverbs_core::cm::cm_timer_arm ",
    "irpverbs_soft::SoftHca<P>::attach_clock ",
];

/// The driver crates (and the host glue): every allocation site of
/// theirs the scenario reaches is swept.
const SWEPT: &[&str] = &[
    "irpverbs_core::",
    "irpverbs_cm::",
    "irpverbs_ring::",
    "irpverbs_kernel_table::",
    "irpverbs_soft::",
    "irpverbs_host::",
];

const MS: u64 = 1_000_000;
const LIMIT: u64 = 120_000 * MS;
const SID: u64 = 0x5EE_0001;

/// Host device `last` (10.0.3.`last`), refusing its `fail_nth` charge.
/// If that charge is refused while the device is added, the add must fail
/// with `STATUS_INSUFFICIENT_RESOURCES` and leave nothing behind
/// (`HostDevice::new` runs the unload and heap leak checks on a failed
/// add), and a second add (without the fault) must work.
fn device(
    backend: Backend,
    last: u8,
    fail_nth: Option<u64>,
    record_sites: bool,
) -> Arc<HostDevice> {
    match add_device(backend, last, fail_nth, record_sites) {
        Ok(d) => d,
        Err(st) => {
            assert!(fail_nth.is_some(), "device {last}: {}", status_name(st));
            assert_eq!(st, STATUS_INSUFFICIENT_RESOURCES, "{}", status_name(st));
            add_device(backend, last, None, record_sites)
                .unwrap_or_else(|st| panic!("device {last} again: {}", status_name(st)))
        }
    }
}

fn add_device(
    backend: Backend,
    last: u8,
    fail_nth: Option<u64>,
    record_sites: bool,
) -> Result<Arc<HostDevice>, NtStatus> {
    HostDevice::new(HostDeviceConfig {
        backend,
        engine: Engine::Inline,
        platform: HostConfig {
            clock: TimerClock::Virtual,
            verifier: VerifierConfig {
                fail_nth,
                record_sites,
                ..VerifierConfig::default()
            },
        },
        soft: SoftConfig {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 3, last)),
            node_guid: 0x0200_00FF_FE00_0300 | u64::from(last),
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
}

/// A request's result, once complete.
type Slot = Arc<Mutex<Option<(NtStatus, Vec<u8>)>>>;

fn submit(s: &CmSubmitter, code: u32, input: &[u8], out: usize) -> Slot {
    let slot: Slot = Arc::default();
    let done = Arc::clone(&slot);
    s.submit(code, input, out, move |st, info, bytes| {
        *done.lock().unwrap() = Some((st, bytes[..info.min(bytes.len())].to_vec()));
    })
    .expect("a CM request");
    slot
}

fn status_of(slot: &Slot) -> Option<NtStatus> {
    slot.lock().unwrap().as_ref().map(|r| r.0)
}

/// Which device refuses which of its charges.
#[derive(Clone, Copy, Debug)]
struct Fault {
    device: usize,
    nth: u64,
}

/// What a run saw.
#[derive(Debug, Default)]
struct Report {
    /// The step whose verb failed (and then succeeded again).
    failed_step: Option<&'static str>,
    /// Refusals the driver absorbed without failing a verb (a dropped MAD
    /// the CM retried, say), by step.
    absorbed: Option<&'static str>,
}

/// The scenario's steps, with the checks around each verb.
struct Run {
    devices: [Arc<HostDevice>; 2],
    report: Report,
}

impl Run {
    fn injected(&self) -> u64 {
        self.devices
            .iter()
            .map(|d| d.platform().pool_stats().injected_failures)
            .sum()
    }

    /// Runs `verb`; if it fails, the failure must be the refused
    /// allocation's (`STATUS_INSUFFICIENT_RESOURCES`, and a refusal made
    /// during it), and the same verb issued again must succeed.
    fn verb<T>(&mut self, step: &'static str, mut verb: impl FnMut() -> Result<T, NtStatus>) -> T {
        let before = self.injected();
        match verb() {
            Ok(t) => {
                if self.injected() != before {
                    self.report.absorbed.get_or_insert(step);
                }
                t
            }
            Err(st) => {
                assert_ne!(
                    self.injected(),
                    before,
                    "{step} failed with {} but no allocation was refused",
                    status_name(st)
                );
                assert_eq!(
                    st,
                    STATUS_INSUFFICIENT_RESOURCES,
                    "{step}: a refused allocation must fail the verb with \
                     STATUS_INSUFFICIENT_RESOURCES, not {}",
                    status_name(st)
                );
                self.report.failed_step = Some(step);
                verb().unwrap_or_else(|st| {
                    panic!(
                        "{step} fails again ({}): the device is not usable",
                        status_name(st)
                    )
                })
            }
        }
    }
}

fn ok<T>((st, out): (NtStatus, Vec<u8>)) -> Result<T, NtStatus>
where
    T: FromBytes,
{
    if st != STATUS_SUCCESS {
        return Err(st);
    }
    T::read_from_bytes(&out[..size_of::<T>()]).map_err(|_| STATUS_INVALID_PARAMETER)
}

fn done((st, _): (NtStatus, Vec<u8>)) -> Result<(), NtStatus> {
    if st == STATUS_SUCCESS {
        Ok(())
    } else {
        Err(st)
    }
}

/// One side's objects (the PD, MR, channel, SRQ and AH stay alive until
/// the file's close runs them down).
struct Side<'c> {
    mem: Mem,
    mr: IvRegMrOut,
    cq: Cq<'c>,
    qp: Qp<'c>,
}

fn create_side<'c>(run: &mut Run, c: &'c Client, peer_gid: [u8; 16]) -> Side<'c> {
    let pd = run.verb("alloc_pd", || c.alloc_pd()).pd;
    let mem = Mem::new(4096);
    let mr = run.verb("reg_mr", || c.reg_mr(pd, mem.addr(), 4096, IV_ACCESS_ALL));
    // A memory window left bound: the rundown deallocates it before the MR.
    let mw = run.verb("alloc_mw", || c.alloc_mw(pd, IV_MW_TYPE_1)).mw;
    run.verb("bind_mw", || {
        c.bind_mw(mw, mr.mr, mem.addr(), 64, IV_ACCESS_REMOTE_READ)
    });
    let channel = run
        .verb("create_channel", || {
            ok::<IvCreateChannelOut>(c.raw(
                IOCTL_IV_CREATE_CHANNEL,
                IvAllocPdIn::default().as_bytes(),
                size_of::<IvCreateChannelOut>(),
            ))
        })
        .channel;
    let cq = run.verb("create_cq", || {
        c.new_cq(&IvCreateCqIn {
            cqe: 32,
            channel,
            ..IvCreateCqIn::default()
        })
    });
    run.verb("create_srq", || c.create_srq(pd, 16, 0));
    let qp = run.verb("create_qp", || {
        c.new_qp(&qp_request(pd, cq.handle(), 0, IV_QPT_RC))
    });
    run.verb("create_ah", || c.create_ah(pd, &av(peer_gid)));
    Side { mem, mr, cq, qp }
}

fn create_cep(run: &mut Run, s: &CmSubmitter, ctx: u64) -> IvHandle {
    run.verb("create_cep", || {
        ok::<IvCreateCepOut>(s.ioctl(
            IOCTL_IV_CREATE_CEP,
            IvCreateCepIn { user_context: ctx }.as_bytes(),
            size_of::<IvCreateCepOut>(),
        ))
    })
    .cep
}

/// Runs the simulated wire until `done`.
fn drive(net: &SimHosts, what: &str, mut done: impl FnMut() -> bool) {
    let limit = net.now() + LIMIT;
    assert!(net.run_until(limit, &mut done), "{what}: not done in time");
}

/// The scenario. `record`: record each device's charge sites.
fn scenario(
    backend: Backend,
    fault: Option<Fault>,
    record: bool,
) -> (Report, [Vec<ChargeSite>; 2]) {
    let nth = |d| fault.filter(|f| f.device == d).map(|f| f.nth);
    let da = device(backend, 1, nth(0), record);
    let db = device(backend, 2, nth(1), record);
    let mut run = Run {
        devices: [Arc::clone(&da), Arc::clone(&db)],
        report: Report::default(),
    };
    let net = SimHosts::new(SimConfig::default(), &[&da, &db]).expect("sim net");
    let open = |run: &mut Run, d: &Arc<HostDevice>| {
        let file = run.verb("open", || d.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS));
        let (file, cm) = file.with_cm_submitter();
        (file.into_client(), cm)
    };
    let (ca, sa) = open(&mut run, &da);
    let (cb, sb) = open(&mut run, &db);
    // A kernel ULP queries the direct-call table (IRP_MN_QUERY_INTERFACE):
    // a refused context fails the query and references nothing.
    let kernel = run.verb("query_interface", || da.query_interface());
    let a = create_side(&mut run, &ca, db.soft().gid());
    let b = create_side(&mut run, &cb, da.soft().gid());
    // A kernel ULP's fast-register MR (ALLOC_MR is kernel-only), left for
    // its file's rundown.
    let kc = run.verb("open_kernel", || da.open_kernel()).into_client();
    let kpd = run.verb("alloc_pd (kernel)", || kc.alloc_pd()).pd;
    run.verb("alloc_mr", || kc.alloc_mr(kpd, 4));

    // B listens; A connects; B accepts.
    let listener = create_cep(&mut run, &sb, 1);
    run.verb("listen", || {
        done(
            sb.ioctl(
                IOCTL_IV_LISTEN,
                IvListenIn {
                    cep: listener,
                    service_id: SID,
                }
                .as_bytes(),
                0,
            ),
        )
    });
    let mut ccep = create_cep(&mut run, &sa, 2);
    let connect_in = |cep| IvCmConnectIn {
        cep,
        qp: a.qp.handle(),
        service_id: SID,
        local_gid: da.soft().gid(),
        remote_gid: db.soft().gid(),
        starting_psn: 0x10,
        cm_response_timeout: 12,
        max_cm_retries: 5,
        local_ack_timeout: 12,
        path_mtu: IV_MTU_1024 as u8,
        ..connect_defaults()
    };
    let mut conn = submit(&sa, IOCTL_IV_CM_CONNECT, connect_in(ccep).as_bytes(), 0);
    let mut req_event = submit(
        &sb,
        IOCTL_IV_GET_CEP_EVENT,
        IvHandleIn { handle: listener }.as_bytes(),
        size_of::<IvCepEventOut>(),
    );
    let mut accept: Option<Slot> = None;
    let mut accepted_cep = 0;
    let mut accept_in: Option<IvCmAcceptIn> = None;
    loop {
        drive(&net, "connect", || {
            status_of(&conn).is_some() || status_of(&req_event).is_some()
        });
        // The connect failed on the spot (a refused allocation).
        if let Some(st) = status_of(&conn)
            && st != STATUS_SUCCESS
            && accept.is_none()
        {
            // Refused here, or by the passive side (a REJ: no resources
            // for the connection there).
            let peer = fault.is_some_and(|f| f.device == 1);
            assert!(
                st == STATUS_INSUFFICIENT_RESOURCES || (peer && st == STATUS_CONNECTION_REFUSED),
                "the connect failed with {}",
                status_name(st)
            );
            assert_ne!(run.injected(), 0, "the connect failed with no refusal");
            run.report.failed_step = Some("cm_connect");
            // A fresh CEP, the QP back to RESET, and a fresh try.
            let _ = sa.ioctl(
                IOCTL_IV_DESTROY_CEP,
                IvHandleIn { handle: ccep }.as_bytes(),
                0,
            );
            let reset = IvQpAttr {
                qp_state: IV_QPS_RESET,
                ..IvQpAttr::default()
            };
            a.qp.modify(IV_QP_STATE, &reset)
                .unwrap_or_else(|st| panic!("QP to RESET: {}", status_name(st)));
            ccep = create_cep(&mut run, &sa, 2);
            conn = submit(&sa, IOCTL_IV_CM_CONNECT, connect_in(ccep).as_bytes(), 0);
            continue;
        }
        if let Some(st) = status_of(&req_event)
            && accept.is_none()
        {
            if st != STATUS_SUCCESS {
                assert_eq!(st, STATUS_INSUFFICIENT_RESOURCES, "{}", status_name(st));
                run.report.failed_step = Some("get_cep_event");
                req_event = submit(
                    &sb,
                    IOCTL_IV_GET_CEP_EVENT,
                    IvHandleIn { handle: listener }.as_bytes(),
                    size_of::<IvCepEventOut>(),
                );
                continue;
            }
            let ev = ok::<IvCepEventOut>(req_event.lock().unwrap().clone().unwrap()).unwrap();
            assert_eq!(ev.event_type, IV_CEP_EVENT_CONNECT_REQUEST);
            accepted_cep = ev.cep;
            let acc = IvCmAcceptIn {
                cep: ev.cep,
                qp: b.qp.handle(),
                starting_psn: 0x20,
                responder_resources: 4,
                initiator_depth: 4,
                rnr_retry_count: 7,
                min_rnr_timer: 12,
                ..IvCmAcceptIn::default()
            };
            accept_in = Some(acc);
            accept = Some(submit(&sb, IOCTL_IV_CM_ACCEPT, acc.as_bytes(), 0));
        }
        break;
    }
    let mut acc = accept.expect("the connect request reached B");
    loop {
        drive(&net, "accept", || {
            status_of(&acc).is_some_and(|st| st != STATUS_SUCCESS)
                || (status_of(&conn).is_some() && status_of(&acc).is_some())
        });
        match status_of(&acc) {
            // Refused on the spot: the CEP is as it was; accept again.
            Some(st) if st != STATUS_SUCCESS => {
                assert_eq!(st, STATUS_INSUFFICIENT_RESOURCES, "{}", status_name(st));
                run.report.failed_step = Some("cm_accept");
                let i = accept_in.expect("an accept");
                acc = submit(&sb, IOCTL_IV_CM_ACCEPT, i.as_bytes(), 0);
            }
            _ => break,
        }
    }
    assert_eq!(status_of(&conn), Some(STATUS_SUCCESS), "connect");
    assert_eq!(status_of(&acc), Some(STATUS_SUCCESS), "accept");

    // Traffic: a SEND from A to B (the speed path allocates nothing).
    let msg = b"allocation sweep";
    a.mem.fill(0, msg);
    b.qp.post_recv(
        1,
        &[IvSge {
            addr: b.mem.addr(),
            length: 64,
            lkey: b.mr.lkey,
        }],
    )
    .unwrap();
    a.qp.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[IvSge {
            addr: a.mem.addr(),
            length: msg.len() as u32,
            lkey: a.mr.lkey,
        }],
        ..SendWr::default()
    })
    .unwrap();
    let mut wc = [IvCqe::default(); 1];
    drive(&net, "traffic", || b.cq.poll(&mut wc).unwrap() == 1);
    assert_eq!(wc[0].status, IV_WC_SUCCESS);
    assert_eq!(b.mem.read(0, msg.len()), msg);
    let _ = accepted_cep;
    // The kernel ULP lets the table go: its context (and the device
    // reference it held) goes with it.
    // SAFETY: the reference query_interface returned, given back once.
    #[allow(unsafe_code, reason = "the kernel interface's dereference")]
    unsafe {
        (kernel.interface_dereference)(kernel.context)
    };
    assert_eq!(
        da.platform().device_references(),
        0,
        "the table's reference"
    );

    // Close with objects alive: the QPs and CQs go through their own
    // destroys, the rest through the files' rundown.
    drop((a, b));
    drop((ca, sa, cb, sb, kc));
    drive(&net, "rundown", || {
        da.quiesce(Duration::ZERO).is_ok() && db.quiesce(Duration::ZERO).is_ok()
    });
    drop(net);
    let sites = [
        da.platform().record_charge_sites(false),
        db.platform().record_charge_sites(false),
    ];
    let mut report = std::mem::take(&mut run.report);
    if report.failed_step.is_none() && report.absorbed.is_none() && run.injected() > 0 {
        // Refused on the wire's, a timer's or a completion's path: the
        // driver did without (a MAD not kept, say), and the scenario ran.
        report.absorbed = Some("wire, timer or completion");
    }
    drop(run);
    for d in [da, db] {
        assert_eq!(d.platform().pool_stats().live, 0, "pool charges leaked");
        HostDevice::remove(d);
    }
    (report, sites)
}

/// An allocation's site: the first driver function above the allocator in
/// its backtrace (name and line), or `None` if no driver frame is in it.
fn site_of(backtrace: &str) -> Option<String> {
    let mut lines = backtrace.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((_, symbol)) = line.trim_start().split_once(": ") else {
            continue;
        };
        let at = lines
            .peek()
            .and_then(|l| l.trim_start().strip_prefix("at "))
            .map(str::to_owned);
        let name = symbol.trim_start_matches('<');
        let driver = SWEPT.iter().any(|c| name.starts_with(c));
        let helper = name.starts_with("irpverbs_host::platform::")
            || name.starts_with("irpverbs_ring::shared::")
            || name.contains("::fallible::");
        if driver && !helper {
            let line_no = at
                .as_deref()
                .and_then(|a| {
                    let file = a.rsplit('/').next().unwrap_or(a);
                    let mut parts = file.split(':');
                    Some(format!("{}:{}", parts.next()?, parts.next()?))
                })
                .unwrap_or_default();
            return Some(format!("{name} ({line_no})"));
        }
    }
    None
}

fn every_allocation_can_fail_cleanly(backend: Backend) {
    let stride: u64 = std::env::var("IRPVERBS_SWEEP_STRIDE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    // The counting run: every charge, with its site.
    let (report, recorded) = scenario(backend, None, true);
    assert!(report.failed_step.is_none() && report.absorbed.is_none());
    let mut sites: BTreeMap<String, (usize, Vec<Fault>)> = BTreeMap::new();
    let mut unknown = 0;
    for (device, charges) in recorded.iter().enumerate() {
        for c in charges {
            let Some(site) = site_of(&c.backtrace) else {
                unknown += 1;
                eprintln!(
                    "charge {} of device {device}: no driver frame\n{}",
                    c.attempt, c.backtrace
                );
                continue;
            };
            let e = sites.entry(site).or_default();
            e.0 += 1;
            e.1.push(Fault {
                device,
                nth: c.attempt,
            });
        }
    }
    println!(
        "{} charges (heap, pool and I/O manager; {} on A, {} on B) at {} distinct sites:",
        recorded[0].len() + recorded[1].len(),
        recorded[0].len(),
        recorded[1].len(),
        sites.len()
    );
    for (site, (n, _)) in &sites {
        println!("  {n:4}  {site}");
    }
    assert_eq!(unknown, 0, "charges without a driver frame");
    for must in MUST_REACH {
        // The model's rings are the mini-driver's memory (`Region::alloc`,
        // mapped for the device), not rings the firmware allocates.
        if backend == Backend::Model && *must == "irpverbs_ring::ring::Ring::alloc " {
            continue;
        }
        assert!(
            sites.keys().any(|s| s.starts_with(must)),
            "no allocation site {must}… reached"
        );
    }
    // The sweep: every index (every `stride`th, and the first of each
    // site).
    let mut faults: Vec<(Fault, &str)> = Vec::new();
    for (site, (_, at)) in &sites {
        for (k, f) in at.iter().enumerate() {
            if k == 0 || f.nth % stride == 0 {
                faults.push((*f, site));
            }
        }
    }
    faults.sort_by_key(|(f, _)| (f.device, f.nth));
    let mut failed_verbs: BTreeMap<&str, usize> = BTreeMap::new();
    let mut absorbed = 0;
    for (f, site) in &faults {
        eprintln!("refusing charge {} of device {} at {site}", f.nth, f.device);
        let (report, _) = scenario(backend, Some(*f), false);
        match (report.failed_step, report.absorbed) {
            (Some(step), _) => *failed_verbs.entry(step).or_default() += 1,
            (None, Some(_)) => absorbed += 1,
            // At the device's add: it failed, and a second add worked.
            (None, None) => *failed_verbs.entry("device add").or_default() += 1,
        }
    }
    println!(
        "{} runs, one refused allocation each: {absorbed} absorbed (retried by the driver), \
         failed verbs: {failed_verbs:?}",
        faults.len()
    );
}
