//! The model HCA over the host device (verifier on): a mini-driver that
//! reaches its device only through the PCI seam — BAR registers, a command
//! queue and event queues in common buffers, registered memory mapped with
//! `map_dma` into page lists, one MSI-X message per event queue — and a
//! device model that reaches host memory only through the IOMMU model.
//!
//! - commands travel through the command queue: a command corrupted in
//!   host memory gets a command error from the device, never a panic, and
//!   the driver goes on;
//! - the device cannot cheat: a command naming memory that is not mapped
//!   for it (a host address, a page list past its mapping) is a bugcheck
//!   0xE6 of the IOMMU model;
//! - a CQ's completion event arrives on its vector's event queue and MSI-X
//!   message, and no other's;
//! - MADs travel through the GSI's send and receive rings in host memory
//!   (the device reads and writes them by DMA, an `EQE_MAD` announces
//!   arrivals); a send entry corrupted in host memory is refused by the
//!   device and given back;
//! - verbs work end to end (SEND, RDMA WRITE, RDMA READ between two
//!   connected RC QPs), each registration mapped for the device while it
//!   lives (the conformance suite runs against the model too:
//!   `cargo test -p irpverbs-conformance --test host conformance_model_backend`).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use irpverbs_abi::*;
use irpverbs_core::Hca;
use irpverbs_core::hca::{GSI_QPN, MAD_SIZE, MadOut};
use irpverbs_core::platform::{Bar, PciPlatform};
use irpverbs_host::loopwire::LoopWire;
use irpverbs_host::platform::{catch_bugcheck, codes, dma};
use irpverbs_host::{Backend, HostDevice, HostDeviceConfig, HostFile, Ioctl};
use irpverbs_model::SLOTS;
use irpverbs_model::gsi::*;
use irpverbs_model::protocol::*;
use irpverbs_ring::Region;
use irpverbs_soft::SoftConfig;
use irpverbs_verbs::{Client, Cq, IntoClient, Qp, SendWr};
use zerocopy::IntoBytes;

mod common;
use common::SharedFile as Shared;

fn model_device(vectors: u32) -> Arc<HostDevice> {
    HostDevice::new(HostDeviceConfig {
        backend: Backend::Model,
        soft: SoftConfig {
            num_comp_vectors: vectors,
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("a host device over the model HCA")
}

/// The slot the tests forge commands in: the driver takes the lowest free
/// slot, so the last one is free while nothing is in flight.
const FORGED: usize = SLOTS - 1;

/// Writes a command of `opcode` with `input` into the forged slot of the
/// driver's command queue (as memory corruption would leave it), with the
/// input mailbox at `input_at` (its own by default), hands it to the
/// device and rings the doorbell through BAR 0. The device runs at once
/// (its DPC, from PASSIVE_LEVEL). Returns the status it wrote back.
fn forge(dev: &HostDevice, opcode: u32, input: &[u8], input_at: Option<u64>) -> NtStatus {
    let (hca, _) = dev.model().unwrap();
    let q = hca.command_queue().unwrap();
    let base = FORGED * SLOT_SIZE;
    let la = command_queue_la(dev, &q) + base as u64;
    q.write(base + INPUT_OFFSET, input).unwrap();
    let mut h = [0u8; HEADER_LEN];
    let mut w = Writer::new(&mut h);
    w.u32(opcode).unwrap();
    w.u32(input.len() as u32).unwrap();
    w.u64(input_at.unwrap_or(la + INPUT_OFFSET as u64)).unwrap();
    w.u64(la + OUTPUT_OFFSET as u64).unwrap();
    w.u32(OUTPUT_LEN as u32).unwrap();
    h[H_OWNER..].copy_from_slice(&OWNER_DEVICE.to_le_bytes());
    q.write(base, &h).unwrap();
    let bar = dev.platform().map_bar(0).unwrap();
    bar.write32(REG_CMD_DOORBELL, 1 << FORGED).unwrap();
    let owner = q.read_obj::<u32>(base + H_OWNER).unwrap();
    assert_eq!(owner, OWNER_DRIVER, "the device gave the slot back");
    q.read_obj::<i32>(base + H_STATUS).unwrap()
}

/// The command queue's logical address: the device's own input mailbox
/// address for slot 0, which the driver wrote in its header.
fn command_queue_la(_dev: &HostDevice, q: &Region) -> u64 {
    q.read_obj::<u64>(H_INPUT_ADDR).unwrap() - INPUT_OFFSET as u64
}

fn alloc_pd_works(dev: &Arc<HostDevice>) {
    let f = dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap();
    let c = Client::with_speed_path(Box::new(f));
    let pd = c.alloc_pd().expect("ALLOC_PD").pd;
    c.dealloc_pd(pd).expect("DEALLOC_PD");
}

/// Corrupted commands in host memory get a command error: an unknown
/// opcode, inputs of the wrong length or past the mailbox, fields out of
/// range, a page list that does not match its registration, objects the
/// device does not have; then a few hundred commands of random bytes. The
/// device hands every slot back with a status, never stops, and the driver
/// goes on.
#[test]
fn a_command_corrupted_in_host_memory_gets_a_command_error() {
    let dev = model_device(2);
    // The queue's slot 0 header holds the driver's addresses once a
    // command ran (the initialization's query).
    alloc_pd_works(&dev);
    let cases: [(u32, Vec<u8>, NtStatus); 7] = [
        (0x7777, vec![], STATUS_NOT_SUPPORTED),
        (OP_ALLOC_PD, vec![0; 4], STATUS_INVALID_PARAMETER),
        (
            OP_DEALLOC_PD,
            vec![0; FIXED_LEN + 8],
            STATUS_INVALID_PARAMETER,
        ),
        (
            OP_QUERY_PORT,
            300u32.to_le_bytes().to_vec(),
            STATUS_INVALID_PARAMETER,
        ),
        (
            OP_CREATE_QP,
            [1u32, IV_QPT_RC, 1, 1, 7, 0, 0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .chain(IvQpCap::default().as_bytes().iter().copied())
                .collect(),
            STATUS_INVALID_PARAMETER,
        ),
        // A registration of 8192 bytes whose page list has 1 entry.
        (
            OP_REG_MR,
            [1u32, 0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .chain(0x1000u64.to_le_bytes())
                .chain(8192u64.to_le_bytes())
                .chain(0u32.to_le_bytes())
                .chain(1u32.to_le_bytes())
                .chain(0u64.to_le_bytes())
                .chain(0u32.to_le_bytes())
                .collect(),
            STATUS_INVALID_PARAMETER,
        ),
        (OP_DESTROY_QP, 0x00AB_CDEFu32.to_le_bytes().to_vec(), 0),
    ];
    let (_, silicon) = dev.model().unwrap();
    let refused = silicon.stats().commands_refused;
    for (opcode, input, want) in &cases {
        let st = forge(&dev, *opcode, input, None);
        if *want == 0 {
            // The engine's own check: no such QP.
            assert_ne!(st, STATUS_SUCCESS, "opcode {opcode:#x}");
        } else {
            assert_eq!(st, *want, "opcode {opcode:#x}: {}", status_name(st));
        }
    }
    assert_eq!(silicon.stats().commands_refused - refused, 6);
    // Random bytes for every opcode that cannot create anything.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let opcodes = [
        OP_QUERY_PORT,
        OP_QUERY_GID,
        OP_DEALLOC_PD,
        OP_DEREG_MR,
        OP_DESTROY_CQ,
        OP_MODIFY_SRQ,
        OP_QUERY_SRQ,
        OP_MODIFY_QP,
        OP_QUERY_QP,
        OP_DESTROY_QP,
        OP_DESTROY_AH,
        0x200,
    ];
    for _ in 0..300 {
        let opcode = opcodes[next() as usize % opcodes.len()];
        let len = 1 + next() as usize % (FIXED_LEN + 16);
        let input: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let _ = forge(&dev, opcode, &input, None);
    }
    assert_eq!(silicon.status(), STATUS_READY);
    alloc_pd_works(&dev);
    HostDevice::remove(dev);
}

/// The device reaches host memory only through the IOMMU: a command whose
/// input mailbox is a host virtual address is a bugcheck 0xE6 (IOMMU
/// violation, an address never mapped).
#[test]
fn a_command_naming_unmapped_memory_is_a_dma_violation() {
    let dev = model_device(2);
    alloc_pd_works(&dev);
    let q = dev.model().unwrap().0.command_queue().unwrap();
    let host_address = q.addr();
    let check =
        catch_bugcheck(|| forge(&dev, OP_QUERY_PORT, &1u32.to_le_bytes(), Some(host_address)))
            .expect_err("the device read a host address");
    assert_eq!(
        check.code,
        codes::DRIVER_VERIFIER_DMA_VIOLATION,
        "{check:?}"
    );
    assert_eq!(check.params[0], dma::IOMMU_VIOLATION, "{check:?}");
    assert_eq!(check.params[3], dma::FAULT_UNMAPPED, "{check:?}");
}

/// A registration's page list is read by DMA and every page it names is
/// touched through the IOMMU: a list naming the page past the command
/// queue's common buffer (its guard page) is a bugcheck 0xE6.
#[test]
fn a_page_list_past_its_mapping_is_a_dma_violation() {
    let dev = model_device(2);
    alloc_pd_works(&dev);
    let q = dev.model().unwrap().0.command_queue().unwrap();
    let la = command_queue_la(&dev, &q);
    let list_at = la + (FORGED * SLOT_SIZE + INPUT_OFFSET + MTT_OFFSET) as u64;
    q.write(
        FORGED * SLOT_SIZE + INPUT_OFFSET + MTT_OFFSET,
        &(la + q.len() as u64).to_le_bytes(),
    )
    .unwrap();
    let input: Vec<u8> = [1u32, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .chain(0x1000u64.to_le_bytes())
        .chain(4096u64.to_le_bytes())
        .chain(0u32.to_le_bytes())
        .chain(1u32.to_le_bytes())
        .chain(list_at.to_le_bytes())
        .chain(0u32.to_le_bytes())
        .collect();
    let check = catch_bugcheck(|| forge(&dev, OP_REG_MR, &input, None))
        .expect_err("the device read past the command queue");
    assert_eq!(
        check.code,
        codes::DRIVER_VERIFIER_DMA_VIOLATION,
        "{check:?}"
    );
    assert_eq!(check.params[0], dma::IOMMU_VIOLATION, "{check:?}");
}

/// Queues live in the driver's memory: each CQ's, SRQ's and work queue's
/// ring is allocated and mapped by the mini-driver, its page list travels
/// in the create's mailbox, and the device works on its view of it (one
/// view per ring, counted by the IOMMU model) until the destroy, after
/// which the driver unmaps it. A create whose page list is bad is refused
/// (no memory, a page not on a page boundary) or, naming memory not
/// mapped for the device, is a bugcheck 0xE6.
#[test]
fn queues_are_the_drivers_memory_which_the_device_views() {
    let dev = model_device(2);
    let (hca, _) = dev.model().unwrap();
    let hca = Arc::clone(hca);
    let before = dev.platform().iommu_stats();
    let c = Client::with_speed_path(Box::new(
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap(),
    ));
    let pd = c.alloc_pd().unwrap().pd;
    let cq = cq_on(&c, 0);
    assert_eq!(hca.mapped_rings(), 1);
    let qp = rc_qp(&c, pd, &cq);
    let srq = c.create_srq(pd, 8, 0).unwrap();
    let raw_cq = c.create_cq(8).unwrap();
    // CQs, send queue, receive queue, SRQ: each mapped, each viewed.
    assert_eq!(hca.mapped_rings(), 5);
    let during = dev.platform().iommu_stats();
    assert_eq!(during.live, before.live + 5);
    assert_eq!(during.views, before.views + 5);
    // A resize moves the CQ to a new ring; the old one is let go of.
    c.resize_cq(raw_cq.cq, 100).unwrap();
    assert_eq!(hca.mapped_rings(), 5);
    let during = dev.platform().iommu_stats();
    assert_eq!(during.live, before.live + 5);
    assert_eq!(during.views, before.views + 5);

    // Forged creates: a page list with no pages, or a page address off a
    // page boundary, is refused.
    let q = hca.command_queue().unwrap();
    let la = command_queue_la(&dev, &q);
    let list = FORGED * SLOT_SIZE + INPUT_OFFSET + MTT_OFFSET;
    let list_at = la + list as u64;
    let create = |pages: u32| -> Vec<u8> {
        [7u32, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .chain(list_at.to_le_bytes())
            .chain(pages.to_le_bytes())
            .chain(0u32.to_le_bytes())
            .collect()
    };
    assert_eq!(
        forge(&dev, OP_CREATE_CQ, &create(0), None),
        STATUS_INVALID_PARAMETER
    );
    q.write(list, &(la + 8).to_le_bytes()).unwrap();
    assert_eq!(
        forge(&dev, OP_CREATE_CQ, &create(1), None),
        STATUS_INVALID_PARAMETER
    );
    assert_eq!(dev.platform().iommu_stats().views, before.views + 5);

    // Teardown: every ring unmapped once its queue is gone.
    c.destroy_srq(srq.srq).unwrap();
    c.destroy_cq(raw_cq.cq).unwrap();
    drop(qp);
    drop(cq);
    assert_eq!(hca.mapped_rings(), 0);
    let after = dev.platform().iommu_stats();
    assert_eq!((after.live, after.views), (before.live, before.views));

    // A page past the command queue (its guard page): the IOMMU stops it.
    q.write(list, &(la + q.len() as u64).to_le_bytes()).unwrap();
    let check = catch_bugcheck(|| forge(&dev, OP_CREATE_CQ, &create(1), None))
        .expect_err("the device viewed memory not mapped for it");
    assert_eq!(
        check.code,
        codes::DRIVER_VERIFIER_DMA_VIOLATION,
        "{check:?}"
    );
    assert_eq!(check.params[0], dma::IOMMU_VIOLATION, "{check:?}");
}

/// Doorbell (UAR) pages are pages of the device's BAR 2, its own memory,
/// which its engine scans: the mini-driver hands out a free page of the
/// BAR, the device opens it (its number comes back in the page's result
/// register), binds queues on it (a queue it does not have is refused
/// with the engine's status), and closes it when it is freed. Every page
/// taken, the next allocation is refused.
#[test]
fn doorbell_pages_are_pages_of_the_devices_bar() {
    let dev = model_device(2);
    let (hca, silicon) = dev.model().unwrap();
    let bar = silicon.uar_memory();
    let info = hca.alloc_doorbell_page().expect("a doorbell page");
    let offset = info.region.addr() - bar.addr();
    assert!(offset < bar.len() as u64, "the page is BAR 2's memory");
    assert_eq!(offset % 4096, 0);
    assert_eq!(info.region.len(), 4096);
    let index = (offset / 4096) as usize;
    assert_eq!(silicon.uar_page(index), info.page, "the device opened it");
    assert_eq!(
        hca.bind_doorbell(info.page, irpverbs_core::DoorbellTarget::Sq(0x77)),
        Err(STATUS_INVALID_HANDLE)
    );
    assert_eq!(
        hca.bind_doorbell(info.page + 1000, irpverbs_core::DoorbellTarget::Sq(1)),
        Err(STATUS_INVALID_PARAMETER)
    );
    hca.free_doorbell_page(info.page);
    assert_eq!(silicon.uar_page(index), 0, "the device closed it");
    // Every page of the BAR, then none.
    let all: Vec<_> = (0..irpverbs_model::uar::UAR_PAGES)
        .map(|i| {
            hca.alloc_doorbell_page()
                .unwrap_or_else(|s| panic!("page {i}: {s:#x}"))
        })
        .collect();
    assert_eq!(
        hca.alloc_doorbell_page().err(),
        Some(STATUS_INSUFFICIENT_RESOURCES)
    );
    for p in &all {
        hca.free_doorbell_page(p.page);
    }
    drop(all);
    hca.alloc_doorbell_page()
        .map(|p| hca.free_doorbell_page(p.page))
        .expect("a page again");
    HostDevice::remove(dev);
}

/// Driver Verifier's low-resources simulation over the model: a scenario
/// (open, ALLOC_PD, REG_MR, CREATE_QP, QUERY_QP, their destroys) runs once
/// per charge after the device was added, with exactly that charge
/// refused. The verb that met it fails with `STATUS_INSUFFICIENT_RESOURCES`
/// and succeeds when issued again; nothing leaks at removal. A mapping or
/// a query's output box the mini-driver cannot take sends a no-op in the
/// command's place, which completes with that status through the event
/// queue: the sweep reaches it.
#[test]
fn every_refused_charge_of_a_scenario_fails_one_verb_cleanly() {
    use irpverbs_host::platform::{HostConfig, VerifierConfig};
    fn device(fail_nth: Option<u64>) -> Arc<HostDevice> {
        HostDevice::new(HostDeviceConfig {
            backend: Backend::Model,
            platform: HostConfig {
                verifier: VerifierConfig {
                    fail_nth,
                    ..VerifierConfig::default()
                },
                ..HostConfig::default()
            },
            soft: SoftConfig {
                num_comp_vectors: 2,
                ..SoftConfig::default()
            },
            ..HostDeviceConfig::default()
        })
        .expect("added before the refused charge")
    }
    /// Issues `verb`; a refusal must be `STATUS_INSUFFICIENT_RESOURCES`,
    /// and the verb issued again must succeed.
    fn again<T>(refused: &mut u32, what: &str, verb: impl Fn() -> Result<T, NtStatus>) -> T {
        match verb() {
            Ok(v) => v,
            Err(st) => {
                assert_eq!(
                    st,
                    STATUS_INSUFFICIENT_RESOURCES,
                    "{what}: {}",
                    status_name(st)
                );
                *refused += 1;
                verb().unwrap_or_else(|st| panic!("{what} again: {}", status_name(st)))
            }
        }
    }
    fn scenario(dev: &Arc<HostDevice>) -> u32 {
        let mut refused = 0;
        let file = again(&mut refused, "open", || {
            dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        });
        let c = Client::with_speed_path(Box::new(file));
        let pd = again(&mut refused, "alloc_pd", || c.alloc_pd()).pd;
        let mut buf = vec![0u8; 2 * 4096];
        let (addr, len) = (buf.as_mut_ptr() as u64, buf.len() as u64);
        let mr = again(&mut refused, "reg_mr", || {
            c.reg_mr(pd, addr, len, IV_ACCESS_LOCAL_WRITE)
        });
        let cq = again(&mut refused, "create_cq", || c.create_cq(16)).cq;
        let req = irpverbs_verbs::qp_request(pd, cq, 0, IV_QPT_RC);
        let qp = again(&mut refused, "create_qp", || c.create_qp_with(&req)).qp;
        again(&mut refused, "query_qp", || c.query_qp(qp));
        again(&mut refused, "destroy_qp", || c.destroy_qp(qp));
        again(&mut refused, "destroy_cq", || c.destroy_cq(cq));
        again(&mut refused, "dereg_mr", || c.dereg_mr(mr.mr));
        again(&mut refused, "dealloc_pd", || c.dealloc_pd(pd));
        drop(c);
        drop(buf);
        refused
    }
    // The counting run: the charges the scenario takes after the add.
    let dev = device(None);
    let added = dev.platform().pool_stats().attempts;
    assert_eq!(scenario(&dev), 0);
    let end = dev.platform().pool_stats().attempts;
    HostDevice::remove(dev);
    let (mut refusals, mut nops) = (0, 0);
    for n in added + 1..=end {
        let dev = device(Some(n));
        refusals += scenario(&dev);
        nops += dev.model().unwrap().1.stats().nops;
        dev.quiesce(Duration::from_secs(10)).unwrap();
        HostDevice::remove(dev);
    }
    assert!(refusals > 0, "no verb met a refused charge");
    assert!(nops > 0, "no command was replaced by a no-op");
}

/// Surprise removal with a registration alive: the device is reset (it
/// forgets registered memory), the registration's mapping is dropped and
/// its pages unpinned at once, while the file is still open; destroys
/// still succeed and the device unloads clean.
#[test]
fn removal_resets_the_device_and_unmaps_registered_memory() {
    let dev = model_device(2);
    let (hca, _) = dev.model().unwrap();
    let hca = Arc::clone(hca);
    let live = dev.platform().iommu_stats().live;
    let c = Client::with_speed_path(Box::new(
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap(),
    ));
    let pd = c.alloc_pd().unwrap().pd;
    let mut buf = vec![0u8; 4096];
    let mr = c
        .reg_mr(pd, buf.as_mut_ptr() as u64, 4096, IV_ACCESS_LOCAL_WRITE)
        .unwrap();
    assert_eq!(hca.mapped_registrations(), 1);
    assert_eq!(dev.platform().iommu_stats().live, live + 1);
    assert_eq!(dev.platform().iommu_stats().views, 1, "the MR's view");
    dev.surprise_remove();
    // The device let go of the MR's view (its reset) before the driver
    // unmapped it.
    assert_eq!(hca.mapped_registrations(), 0);
    assert_eq!(dev.platform().iommu_stats().live, live);
    assert_eq!(dev.platform().iommu_stats().views, 0);
    assert_eq!(c.alloc_pd().err(), Some(STATUS_DEVICE_REMOVED));
    c.dereg_mr(mr.mr).unwrap();
    c.dealloc_pd(pd).unwrap();
    drop(c);
    drop(buf);
    drop(hca);
    HostDevice::remove(dev);
}

/// The device reports the largest registration its page list (in the
/// command's mailbox) can describe: a region of that size registers, one
/// byte more is refused by the driver before it reaches the device.
#[test]
fn registrations_up_to_the_page_list_limit() {
    let dev = model_device(2);
    let c = Client::with_speed_path(Box::new(
        dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap(),
    ));
    let max = c.query_device().unwrap().max_mr_size;
    assert_eq!(max, (MAX_MTT as u64 - 1) * 4096);
    let pd = c.alloc_pd().unwrap().pd;
    let mut buf = vec![0u8; max as usize + 4096];
    // The worst start: the last byte of a page.
    let start = buf.as_mut_ptr() as usize;
    let off = 4095 - start % 4096;
    let addr = (start + off) as u64;
    let mr = c.reg_mr(pd, addr, max, IV_ACCESS_LOCAL_WRITE).unwrap();
    assert_eq!(
        c.reg_mr(pd, addr, max + 1, IV_ACCESS_LOCAL_WRITE).err(),
        Some(STATUS_INVALID_PARAMETER)
    );
    c.dereg_mr(mr.mr).unwrap();
    c.dealloc_pd(pd).unwrap();
    drop(c);
    drop(buf);
    HostDevice::remove(dev);
}

fn cq_on(c: &Client, comp_vector: u32) -> Cq<'_> {
    c.new_cq(&IvCreateCqIn {
        cqe: 32,
        comp_vector,
        ..IvCreateCqIn::default()
    })
    .unwrap()
}

fn rc_qp<'c>(c: &'c Client, pd: IvHandle, cq: &Cq<'_>) -> Qp<'c> {
    c.new_qp(&IvCreateQpIn {
        pd,
        send_cq: cq.handle(),
        recv_cq: cq.handle(),
        qp_type: IV_QPT_RC,
        cap: IvQpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
            ..IvQpCap::default()
        },
        ..IvCreateQpIn::default()
    })
    .unwrap()
}

fn poll_one(cq: &Cq<'_>, what: &str) -> IvCqe {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wc = [IvCqe::default(); 1];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, IV_WC_SUCCESS, "{what}: {:?}", wc[0]);
            return wc[0];
        }
        assert!(Instant::now() < deadline, "no completion for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Pends a CQ_NOTIFY on `cq`; its completion sets the flag.
fn notify(f: &HostFile, cq: IvHandle) -> Arc<std::sync::atomic::AtomicBool> {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = Arc::clone(&done);
    let arm = IvCqNotifyIn {
        cq,
        arm: IV_NOTIFY_NEXT,
        reserved: 0,
    };
    let sub = f.submit(
        Ioctl::user(
            IOCTL_IV_CQ_NOTIFY,
            arm.as_bytes(),
            size_of::<IvCqEventOut>(),
        ),
        move |st, _, _| {
            assert_eq!(st, STATUS_SUCCESS);
            d.store(true, std::sync::atomic::Ordering::SeqCst);
        },
    );
    assert!(sub.pended);
    done
}

fn wait(flag: &std::sync::atomic::AtomicBool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !flag.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Verbs end to end over the model: two RC QPs connected, SEND, RDMA WRITE
/// and RDMA READ with the data checked; each registration is mapped for
/// the device (a live IOMMU mapping) while it lives and unmapped when it
/// is deregistered. A CQ armed on vector `v` gets its event through EQ
/// `1 + v` and MSI-X message `1 + v`, and no other vector's.
/// MADs from device A to device B (a loopback wire between their
/// engines) go out through A's send ring and come in through B's receive
/// ring: the devices count them sent and received, B's DPC takes each
/// (the core counts it), and every entry is free again. A send entry corrupted in host memory (port 0) is
/// refused by the device, counted, and given back unsent.
#[test]
fn mads_travel_through_the_dma_rings() {
    let node = |last: u8| {
        HostDevice::new(HostDeviceConfig {
            backend: Backend::Model,
            soft: SoftConfig {
                ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
                node_guid: 0x0200_00FF_FE00_0000 | u64::from(last),
                ..SoftConfig::default()
            },
            ..HostDeviceConfig::default()
        })
        .expect("a host device over the model HCA")
    };
    let (dev, peer) = (node(1), node(2));
    let wire = LoopWire::start();
    wire.attach(dev.soft()).unwrap();
    wire.attach(peer.soft()).unwrap();
    let (hca, silicon) = dev.model().unwrap();
    let (hca, silicon) = (Arc::clone(hca), Arc::clone(silicon));
    let peer_silicon = Arc::clone(peer.model().unwrap().1);
    let c = peer.open(FILE_READ_ACCESS).unwrap().into_client();
    let gid = c.query_gid(1, 0).unwrap();
    let before = peer.device().stats().mads_received;
    const N: u64 = 3;
    for i in 0..N {
        let mut mad = [0u8; MAD_SIZE];
        // Base version 1, management class 0x2A: not the CM's (it drops
        // the MAD after the GSI took it).
        mad[0] = 1;
        mad[1] = 0x2A;
        mad[8..16].copy_from_slice(&i.to_be_bytes());
        let out = MadOut {
            port: 1,
            sgid_index: 0,
            dgid: gid,
            dest_qpn: GSI_QPN,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            mad,
        };
        hca.send_mad(&out).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while peer.device().stats().mads_received < before + N {
        assert!(Instant::now() < deadline, "{:?}", peer_silicon.stats());
        std::thread::yield_now();
    }
    let (sent, got) = (silicon.stats(), peer_silicon.stats());
    assert_eq!((sent.mads_sent, sent.mads_refused), (N, 0), "{sent:?}");
    assert_eq!(got.mads_received, N, "{got:?}");
    let rings = hca.mad_rings().unwrap();
    let peer_rings = peer.model().unwrap().0.mad_rings().unwrap();
    let entries = MAD_RING_ENTRIES as usize;
    for e in 0..2 * entries {
        let at = e * MAD_ENTRY_LEN + M_OWNER;
        assert_eq!(
            rings.read_obj::<u32>(at).unwrap(),
            MAD_FREE,
            "A's entry {e}"
        );
        assert_eq!(peer_rings.read_obj::<u32>(at).unwrap(), MAD_FREE, "B's {e}");
    }
    // A bad entry where the device reads next.
    let at = N as usize * MAD_ENTRY_LEN;
    let mut bad = [0u8; MAD_HEADER_LEN];
    bad[M_OWNER..].copy_from_slice(&MAD_FULL.to_le_bytes());
    rings.write(at, &bad).unwrap();
    let bar = dev.platform().map_bar(0).unwrap();
    bar.write32(REG_MAD_SQ_DOORBELL, N as u32 + 1).unwrap();
    let stats = silicon.stats();
    assert_eq!((stats.mads_sent, stats.mads_refused), (N, 1), "{stats:?}");
    assert_eq!(rings.read_obj::<u32>(at + M_OWNER).unwrap(), MAD_FREE);
    assert_eq!(stats.dma_faults, 0);
    drop(c);
    for d in [&dev, &peer] {
        d.quiesce(Duration::from_secs(10)).expect("quiescent");
        d.unload();
    }
    drop(wire);
}

#[test]
fn verbs_work_end_to_end_and_each_vector_has_its_message() {
    let dev = model_device(2);
    let (hca, _) = dev.model().unwrap();
    let hca = Arc::clone(hca);
    let live = dev.platform().iommu_stats().live;
    let views = dev.platform().iommu_stats().views;
    let file = Arc::new(dev.open(FILE_READ_ACCESS | FILE_WRITE_ACCESS).unwrap());
    let c = Client::with_speed_path(Box::new(Shared(Arc::clone(&file))));
    let pd = c.alloc_pd().unwrap().pd;
    let mut a_buf = vec![0u8; 3 * 4096];
    let mut b_buf = vec![0u8; 3 * 4096];
    let access = IV_ACCESS_LOCAL_WRITE | IV_ACCESS_REMOTE_WRITE | IV_ACCESS_REMOTE_READ;
    let ma = c
        .reg_mr(pd, a_buf.as_mut_ptr() as u64, a_buf.len() as u64, access)
        .unwrap();
    let mb = c
        .reg_mr(pd, b_buf.as_mut_ptr() as u64, b_buf.len() as u64, access)
        .unwrap();
    assert_eq!(hca.mapped_registrations(), 2);
    assert_eq!(dev.platform().iommu_stats().live, live + 2);
    // The device moves each MR's data through its view of the MR's pages.
    assert_eq!(dev.platform().iommu_stats().views, views + 2);
    let (cqa, cqb) = (cq_on(&c, 0), cq_on(&c, 1));
    let (a, b) = (rc_qp(&c, pd, &cqa), rc_qp(&c, pd, &cqb));
    let gid = c.query_gid(1, 0).unwrap();
    a.connect(b.qpn(), gid).unwrap();
    b.connect(a.qpn(), gid).unwrap();
    let (a_at, b_at) = (a_buf.as_ptr() as u64, b_buf.as_ptr() as u64);
    let sge = |addr: u64, length: u32, lkey: u32| IvSge { addr, length, lkey };

    // SEND: b's receive completes on vector 1 only.
    let before = [hca.interrupts(1), hca.interrupts(2)];
    let seen = notify(&file, cqb.handle());
    a_buf[..5].copy_from_slice(b"hello");
    b.post_recv(1, &[sge(b_at, 64, mb.lkey)]).unwrap();
    a.post_send(&SendWr {
        wr_id: 2,
        opcode: IV_WR_SEND,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(a_at, 5, ma.lkey)],
        ..SendWr::default()
    })
    .unwrap();
    wait(&seen, "the receive CQ's event");
    poll_one(&cqa, "send");
    assert_eq!(poll_one(&cqb, "recv").byte_len, 5);
    assert_eq!(&b_buf[..5], b"hello");
    assert_eq!(hca.interrupts(1), before[0], "vector 0's message");
    assert!(hca.interrupts(2) > before[1], "vector 1's message");

    // RDMA WRITE across pages (the device's page lists are per page),
    // then RDMA READ it back; a's CQ (vector 0) is armed now.
    let before = [hca.interrupts(1), hca.interrupts(2)];
    let seen = notify(&file, cqa.handle());
    for (i, x) in a_buf[100..100 + 8000].iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    a.post_send(&SendWr {
        wr_id: 3,
        opcode: IV_WR_RDMA_WRITE,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(a_at + 100, 8000, ma.lkey)],
        remote_addr: b_at + 50,
        rkey: mb.rkey,
        ..SendWr::default()
    })
    .unwrap();
    wait(&seen, "the send CQ's event");
    poll_one(&cqa, "write");
    assert_eq!(b_buf[50..50 + 8000], a_buf[100..100 + 8000]);
    assert!(hca.interrupts(1) > before[0], "vector 0's message");
    assert_eq!(hca.interrupts(2), before[1], "vector 1's message");
    a.post_send(&SendWr {
        wr_id: 4,
        opcode: IV_WR_RDMA_READ,
        flags: IV_SEND_SIGNALED,
        sges: &[sge(a_at + 9000, 3000, ma.lkey)],
        remote_addr: b_at + 50,
        rkey: mb.rkey,
        ..SendWr::default()
    })
    .unwrap();
    poll_one(&cqa, "read");
    assert_eq!(a_buf[9000..12000], b_buf[50..3050]);

    // Teardown: deregistration unmaps.
    drop((a, b, cqa, cqb));
    c.dereg_mr(ma.mr).unwrap();
    assert_eq!(hca.mapped_registrations(), 1);
    c.dereg_mr(mb.mr).unwrap();
    assert_eq!(hca.mapped_registrations(), 0);
    assert_eq!(dev.platform().iommu_stats().live, live);
    assert_eq!(dev.platform().iommu_stats().views, views);
    c.dealloc_pd(pd).unwrap();
    drop(c);
    drop(file);
    drop(hca);
    HostDevice::remove(dev);
}
