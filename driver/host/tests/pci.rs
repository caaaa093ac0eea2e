//! The hardware seam in host mode: a device model reaches host memory only
//! through the IOMMU model (common buffers, scatter/gather mappings), owns
//! its BARs' registers, and signals MSI-X messages that run their ISR and
//! DPC. Every device access outside a live mapping is a bugcheck 0xE6 that
//! names the mapping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use irpverbs_abi::*;
use irpverbs_core::platform::{
    Bar, CommonBuffer, DEVICE_LEVEL, DISPATCH_LEVEL, DMA_PAGE_SIZE, DmaDirection, DmaMapping,
    Interrupt, InterruptHandler, PciPlatform, SgElement, page_list,
};
use irpverbs_core::platform::{MajorFunction, Platform, Request, RequestorMode};
use irpverbs_host::platform::pci::BarModel;
use irpverbs_host::platform::{
    BugCheck, HOST_PROCESS, HostConfig, HostPlatform, RequestParams, VerifierConfig,
    catch_bugcheck, codes, current_irql, dma,
};
use irpverbs_ring::{Region, Shared};

fn platform() -> HostPlatform {
    HostPlatform::default()
}

/// A region of kernel memory the driver registers, `len` bytes starting
/// `skew` bytes into a page.
fn region(len: usize, skew: usize) -> (Shared<Region>, Shared<Region>) {
    let backing = Shared::try_new(Region::alloc(len + skew).expect("memory")).expect("memory");
    // SAFETY: inside the backing region, which the returned pair keeps
    // alive as long as the view.
    #[allow(unsafe_code, reason = "a view of part of a region")]
    let view = unsafe {
        Region::from_raw_parts(
            (backing.addr() as usize + skew) as *mut u8,
            len,
            Some(Box::new(backing.clone())),
        )
    }
    .expect("a view");
    (Shared::try_new(view).expect("memory"), backing)
}

/// Asserts a 0xE6 IOMMU violation of `fault`, naming `mapping` (its id and
/// its kind in the reason).
fn violation(got: Result<Result<(), NtStatus>, BugCheck>, fault: u64, kind: &str) -> BugCheck {
    let check = got.expect_err("the access must bugcheck");
    assert_eq!(
        check.code,
        codes::DRIVER_VERIFIER_DMA_VIOLATION,
        "{check:?}"
    );
    assert_eq!(check.params[0], dma::IOMMU_VIOLATION);
    assert_eq!(check.params[3], fault, "{}", check.reason);
    assert!(
        check.reason.contains(kind),
        "the mapping is named: {}",
        check.reason
    );
    check
}

#[test]
fn a_common_buffer_is_shared_both_ways_at_its_logical_address() {
    let p = platform();
    let cb = p.alloc_common_buffer(5000).expect("common buffer");
    assert_eq!(cb.len(), 8192, "whole pages");
    assert_eq!(cb.logical_address() % DMA_PAGE_SIZE, 0);
    assert_ne!(
        cb.logical_address(),
        cb.region().addr(),
        "a bus address, not a host one"
    );
    // The driver writes, the device reads it by DMA.
    cb.region().write(4090, b"queue entry").unwrap();
    let mut got = [0u8; 11];
    p.dma_read(cb.logical_address() + 4090, &mut got).unwrap();
    assert_eq!(&got, b"queue entry");
    // The device writes (a CQE), the driver sees it.
    p.dma_write(cb.logical_address() + 8000, b"cqe").unwrap();
    let mut seen = [0u8; 3];
    cb.region().read(8000, &mut seen).unwrap();
    assert_eq!(&seen, b"cqe");
    assert_eq!(p.iommu_stats().live, 1);
    drop(cb);
    assert_eq!(p.iommu_stats().live, 0);
    // Nothing of the driver's is left.
    assert_eq!(p.pool_stats().heap_live, 0);
}

#[test]
fn a_common_buffer_refuses_bad_lengths_and_a_refused_allocation() {
    let p = platform();
    assert_eq!(
        p.alloc_common_buffer(0).err(),
        Some(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        p.alloc_common_buffer(usize::MAX).err(),
        Some(STATUS_INVALID_PARAMETER)
    );
    // The low-resources simulation refuses each of its allocations in
    // turn: a status, nothing mapped, nothing left.
    let mut refused = 0;
    for n in 1.. {
        let p = HostPlatform::new(HostConfig {
            verifier: VerifierConfig {
                fail_nth: Some(n),
                ..VerifierConfig::default()
            },
            ..HostConfig::default()
        });
        let r = p.driver_code(|| p.alloc_common_buffer(4096).map(|_| ()));
        if p.pool_stats().injected_failures == 0 {
            assert_eq!(r, Ok(()));
            break;
        }
        refused += 1;
        assert_eq!(r, Err(STATUS_INSUFFICIENT_RESOURCES), "allocation {n}");
        assert_eq!(p.iommu_stats().live, 0);
        assert_eq!(p.pool_stats().heap_live, 0);
    }
    assert!(refused >= 2, "the memory and its count");
}

#[test]
fn a_common_buffer_is_allocated_at_passive_level_only() {
    let p = platform();
    let check = catch_bugcheck(|| p.run_at_dispatch(|| p.alloc_common_buffer(4096).map(|_| ())))
        .expect_err("at DISPATCH_LEVEL");
    assert_eq!(check.code, codes::DRIVER_VERIFIER_DETECTED_VIOLATION);
    assert!(
        check.reason.contains("WdfCommonBufferCreate"),
        "{}",
        check.reason
    );
}

#[test]
fn a_scatter_gather_mapping_lists_each_page_and_carries_dma() {
    let p = platform();
    // 3 pages' worth, starting 100 bytes into a page: 4 pages touched.
    let (r, _backing) = region(3 * 4096, 100);
    let pattern: Vec<u8> = (0..r.len()).map(|i| (i % 251) as u8).collect();
    r.write(0, &pattern).unwrap();
    let m = p
        .run_at_dispatch(|| p.map_dma(&r, DmaDirection::Bidirectional))
        .expect("mapped at DISPATCH_LEVEL");
    assert_eq!(m.direction(), DmaDirection::Bidirectional);
    assert_eq!(m.len(), r.len() as u64);
    let e = m.elements();
    assert_eq!(e.len(), 4, "{e:?}");
    assert_eq!(e[0].address % DMA_PAGE_SIZE, 100);
    assert_eq!(e[0].length, 4096 - 100);
    assert_eq!(e[3].length, 100);
    for w in e.windows(2) {
        assert_ne!(
            w[0].address + u64::from(w[0].length),
            w[1].address,
            "pages are scattered: the list is not one run"
        );
    }
    // Its page list: the MTT entries a memory registration writes.
    let mut pages = [0u64; 4];
    assert_eq!(page_list(e, &mut pages), Ok(4));
    assert_eq!(pages[0], e[0].address - 100);
    assert_eq!(pages[1..], [e[1].address, e[2].address, e[3].address]);
    let mut short = [0u64; 3];
    assert_eq!(page_list(e, &mut short), Err(STATUS_BUFFER_TOO_SMALL));
    // The device gathers the region through the list, element by element.
    let mut gathered = Vec::new();
    for el in e {
        let mut chunk = vec![0u8; el.length as usize];
        p.dma_read(el.address, &mut chunk).unwrap();
        gathered.extend_from_slice(&chunk);
    }
    assert_eq!(gathered, pattern);
    // And writes into it (a received message in an MR).
    p.dma_write(e[2].address + 10, b"inbound").unwrap();
    let mut seen = [0u8; 7];
    r.read(e[0].length as usize + 4096 + 10, &mut seen).unwrap();
    assert_eq!(&seen, b"inbound");
    // The mapping keeps the region alive; dropping it unmaps.
    assert_eq!(p.iommu_stats().live, 1);
    drop(m);
    assert_eq!(p.iommu_stats().live, 0);
    assert_eq!(
        p.map_dma(
            &Shared::try_new(Region::alloc(1).unwrap()).unwrap(),
            DmaDirection::ToDevice
        )
        .map(|m| m.elements().len()),
        Ok(1)
    );
}

#[test]
fn a_page_list_refuses_a_list_that_is_not_one() {
    let hole = [
        SgElement {
            address: 0x1000,
            length: 0x800,
        },
        SgElement {
            address: 0x3000,
            length: 0x1000,
        },
    ];
    let mut out = [0u64; 4];
    assert_eq!(page_list(&hole, &mut out), Err(STATUS_INVALID_PARAMETER));
    let skewed = [
        SgElement {
            address: 0x1000,
            length: 0x1000,
        },
        SgElement {
            address: 0x3010,
            length: 0x10,
        },
    ];
    assert_eq!(page_list(&skewed, &mut out), Err(STATUS_INVALID_PARAMETER));
    let ok = [
        SgElement {
            address: 0x1010,
            length: 0xFF0,
        },
        SgElement {
            address: 0x5000,
            length: 0x1001,
        },
    ];
    assert_eq!(page_list(&ok, &mut out), Ok(3));
    assert_eq!(out[..3], [0x1000, 0x5000, 0x6000]);
}

#[test]
fn an_access_to_an_address_never_mapped_bugchecks() {
    let p = platform();
    let cb = p.alloc_common_buffer(4096).unwrap();
    // A host virtual address handed to the device by mistake.
    let mut b = [0u8; 4];
    violation(
        catch_bugcheck(|| p.dma_read(cb.region().addr(), &mut b)),
        dma::FAULT_UNMAPPED,
        "no mapping",
    );
    // Below every mapping.
    violation(
        catch_bugcheck(|| p.dma_write(0x1000, &b)),
        dma::FAULT_UNMAPPED,
        "no mapping",
    );
}

#[test]
fn an_access_past_a_mappings_length_bugchecks_naming_it() {
    let p = platform();
    let cb = p.alloc_common_buffer(4096).unwrap();
    let mut b = [0u8; 8];
    // Straddling the end.
    let check = violation(
        catch_bugcheck(|| p.dma_read(cb.logical_address() + 4092, &mut b)),
        dma::FAULT_PAST_END,
        "common buffer",
    );
    assert_eq!(check.params[2], cb.logical_address() + 4092);
    assert_ne!(check.params[1], 0, "the mapping's id");
    // Wholly in the guard page after it.
    violation(
        catch_bugcheck(|| p.dma_write(cb.logical_address() + 4096, &b)),
        dma::FAULT_PAST_END,
        "common buffer",
    );
    // A scatter/gather list read as if contiguous runs into a guard page.
    let (r, _backing) = region(8192, 0);
    let m = p.map_dma(&r, DmaDirection::ToDevice).unwrap();
    let mut big = vec![0u8; 8192];
    violation(
        catch_bugcheck(|| p.dma_read(m.elements()[0].address, &mut big)),
        dma::FAULT_PAST_END,
        "scatter/gather mapping",
    );
}

#[test]
fn an_access_after_the_unmap_bugchecks_naming_the_mapping() {
    let p = platform();
    let cb = p.alloc_common_buffer(4096).unwrap();
    let at = cb.logical_address();
    drop(cb);
    let mut b = [0u8; 4];
    let check = violation(
        catch_bugcheck(|| p.dma_read(at, &mut b)),
        dma::FAULT_AFTER_UNMAP,
        "common buffer",
    );
    assert!(check.reason.contains("unmapped"), "{}", check.reason);
    let (r, _backing) = region(4096, 0);
    let m = p.map_dma(&r, DmaDirection::FromDevice).unwrap();
    let el = m.elements()[0];
    drop(m);
    violation(
        catch_bugcheck(|| p.dma_write(el.address, b"late")),
        dma::FAULT_AFTER_UNMAP,
        "scatter/gather mapping",
    );
}

#[test]
fn an_access_against_the_mappings_direction_bugchecks() {
    let p = platform();
    let (r, _backing) = region(4096, 0);
    let to_device = p.map_dma(&r, DmaDirection::ToDevice).unwrap();
    let at = to_device.elements()[0].address;
    let mut b = [0u8; 4];
    p.dma_read(at, &mut b).expect("the device may read it");
    violation(
        catch_bugcheck(|| p.dma_write(at, b"nope")),
        dma::FAULT_DIRECTION,
        "ToDevice",
    );
    let from_device = p.map_dma(&r, DmaDirection::FromDevice).unwrap();
    let at = from_device.elements()[0].address;
    p.dma_write(at, b"ok").expect("the device may write it");
    violation(
        catch_bugcheck(|| p.dma_read(at, &mut b)),
        dma::FAULT_DIRECTION,
        "FromDevice",
    );
}

/// A device's view of memory through a page list: translated and checked
/// page by page when it is made, the same memory as the driver's, counted
/// while the device holds it; unmapping what the device still views is a
/// bugcheck naming the mapping.
#[test]
fn a_device_view_is_checked_when_made_and_counted_until_let_go() {
    let p = platform();
    // A scatter/gather mapping: 3 pages' worth from 100 bytes into a page.
    let (r, _backing) = region(3 * 4096, 100);
    let m = p.map_dma(&r, DmaDirection::Bidirectional).unwrap();
    let mut pages = [0u64; 4];
    assert_eq!(page_list(m.elements(), &mut pages), Ok(4));
    let view = p
        .dma_view(100, r.len(), true, &mut |i| Ok(pages[i]))
        .expect("a view of the whole region");
    assert_eq!(view.len(), r.len());
    view.write(5000, b"device").unwrap();
    let mut seen = [0u8; 6];
    r.read(5000, &mut seen).unwrap();
    assert_eq!(&seen, b"device");
    assert_eq!(p.iommu_stats().views, 1);
    // Pages out of order, or of two mappings, are no view.
    let swapped = [pages[0], pages[2], pages[1], pages[3]];
    assert_eq!(
        p.dma_view(100, r.len(), false, &mut |i| Ok(swapped[i]))
            .map(|_| ()),
        Err(STATUS_INVALID_PARAMETER)
    );
    let cb = p.alloc_common_buffer(2 * 4096).unwrap();
    let mixed = [pages[0], cb.logical_address()];
    assert_eq!(
        p.dma_view(100, 4096, false, &mut |i| Ok(mixed[i]))
            .map(|_| ()),
        Err(STATUS_INVALID_PARAMETER)
    );
    // An unaligned page address is refused; an unmapped one faults.
    assert_eq!(
        p.dma_view(0, 8, false, &mut |_| Ok(pages[1] + 8))
            .map(|_| ()),
        Err(STATUS_INVALID_PARAMETER)
    );
    let unmapped = pages[3] + 4096;
    violation(
        catch_bugcheck(|| {
            p.dma_view(0, 4096, false, &mut |_| Ok(unmapped))
                .map(|_| ())
        }),
        dma::FAULT_PAST_END,
        "scatter/gather mapping",
    );
    // A common buffer's pages follow each other; a view for writing of
    // memory the device may only read faults.
    let at = cb.logical_address();
    let cb_view = p
        .dma_view(0, 2 * 4096, true, &mut |i| Ok(at + i as u64 * 4096))
        .unwrap();
    assert_eq!(cb_view.addr(), cb.region().addr());
    let (ro, _ro_backing) = region(4096, 0);
    let to_device = p.map_dma(&ro, DmaDirection::ToDevice).unwrap();
    let ro_page = to_device.elements()[0].address;
    violation(
        catch_bugcheck(|| p.dma_view(0, 4096, true, &mut |_| Ok(ro_page)).map(|_| ())),
        dma::FAULT_DIRECTION,
        "ToDevice",
    );
    assert!(p.dma_view(0, 4096, false, &mut |_| Ok(ro_page)).is_ok());
    assert_eq!(p.iommu_stats().views, 2, "the dropped view let go");
    // Let go, then freed: fine.
    drop(cb_view);
    drop(cb);
    // Unmapped while viewed: a bugcheck naming the mapping.
    let check = catch_bugcheck(|| drop(m)).expect_err("the device still views it");
    assert_eq!(check.code, codes::DRIVER_VERIFIER_DMA_VIOLATION);
    assert_eq!(check.params[0], dma::IOMMU_VIOLATION);
    assert_eq!(check.params[3], dma::FAULT_UNMAPPED_WHILE_VIEWED);
    assert!(
        check.reason.contains("scatter/gather mapping"),
        "{}",
        check.reason
    );
    drop(view);
    assert_eq!(p.iommu_stats().views, 0);
}

#[test]
fn without_the_verifier_a_bad_access_is_a_status() {
    let p = HostPlatform::new(HostConfig {
        verifier: VerifierConfig {
            enabled: false,
            ..VerifierConfig::default()
        },
        ..HostConfig::default()
    });
    let mut b = [0u8; 4];
    assert_eq!(p.dma_read(0x1000, &mut b), Err(STATUS_INVALID_ADDRESS));
}

/// A BAR of eight 64-bit registers that records every access.
#[derive(Default)]
struct Registers {
    regs: Mutex<[u64; 8]>,
    log: Mutex<Vec<(bool, usize, usize, u64)>>,
}

impl BarModel for Registers {
    fn read(&self, offset: usize, width: usize) -> u64 {
        let v = self.regs.lock().unwrap()[offset / 8];
        let v = if width == 4 {
            (v >> ((offset % 8) * 8)) & 0xFFFF_FFFF
        } else {
            v
        };
        self.log.lock().unwrap().push((false, offset, width, v));
        v
    }
    fn write(&self, offset: usize, width: usize, value: u64) {
        let mut regs = self.regs.lock().unwrap();
        let r = &mut regs[offset / 8];
        if width == 4 {
            let shift = (offset % 8) * 8;
            *r = (*r & !(0xFFFF_FFFF << shift)) | (value << shift);
        } else {
            *r = value;
        }
        self.log.lock().unwrap().push((true, offset, width, value));
    }
}

#[test]
fn a_bar_the_device_model_owns_takes_32_and_64_bit_accesses() {
    let p = platform();
    let model = Arc::new(Registers::default());
    p.install_bar(0, 64, model.clone()).unwrap();
    assert_eq!(
        p.install_bar(0, 64, model.clone()),
        Err(STATUS_INVALID_PARAMETER),
        "there already"
    );
    assert_eq!(
        p.install_bar(6, 64, model.clone()),
        Err(STATUS_INVALID_PARAMETER)
    );
    assert_eq!(
        p.map_bar(2).err(),
        Some(STATUS_INVALID_PARAMETER),
        "no BAR 2"
    );
    let bar = p.map_bar(0).unwrap();
    assert_eq!(bar.len(), 64);
    bar.write64(8, 0x1122_3344_5566_7788).unwrap();
    assert_eq!(bar.read32(8), Ok(0x5566_7788));
    assert_eq!(bar.read32(12), Ok(0x1122_3344));
    bar.write32(16, 7).unwrap();
    assert_eq!(bar.read64(16), Ok(7));
    // Out of the BAR, or misaligned: refused, the model never sees it.
    let seen = model.log.lock().unwrap().len();
    assert_eq!(bar.read32(64), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(bar.write64(60, 0), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(bar.read64(4), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(bar.write32(2, 0), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(bar.read64(usize::MAX - 3), Err(STATUS_INVALID_PARAMETER));
    assert_eq!(model.log.lock().unwrap().len(), seen);
    // Registers are read from an ISR, at DIRQL.
    assert_eq!(p.interrupt(|| bar.read64(8)), Ok(0x1122_3344_5566_7788));
    // The function goes away: the BAR cannot be mapped again, and the
    // platform lets the model go once the mapped view is dropped.
    assert!(p.remove_bar(0));
    assert!(!p.remove_bar(0), "gone already");
    assert_eq!(p.map_bar(0).err(), Some(STATUS_INVALID_PARAMETER));
    assert_eq!(bar.read64(8), Ok(0x1122_3344_5566_7788), "a mapped view");
    drop(bar);
    assert_eq!(Arc::strong_count(&model), 1);
}

/// Counts ISR and DPC calls per message, checking their IRQLs.
#[derive(Debug, Default)]
struct Handler {
    isrs: [AtomicU64; 2],
    dpcs: [AtomicU64; 2],
    claim: bool,
}

impl InterruptHandler for Handler {
    fn isr(&self, message: u16) -> bool {
        assert_eq!(current_irql(), DEVICE_LEVEL, "an ISR runs at DIRQL");
        self.isrs[usize::from(message)].fetch_add(1, Ordering::SeqCst);
        self.claim
    }
    fn dpc(&self, message: u16) {
        assert_eq!(
            current_irql(),
            DISPATCH_LEVEL,
            "a DPC runs at DISPATCH_LEVEL"
        );
        self.dpcs[usize::from(message)].fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn each_msix_message_runs_its_own_isr_and_dpc() {
    let p = platform();
    p.grant_msix(2);
    assert_eq!(p.msix_messages(), 2);
    let h = Shared::try_new(Handler {
        claim: true,
        ..Handler::default()
    })
    .unwrap();
    let quiet = Shared::try_new(Handler::default()).unwrap();
    let i0 = p.connect_interrupt(0, h.clone()).unwrap();
    let i1 = p.connect_interrupt(1, quiet.clone()).unwrap();
    assert_eq!((i0.message(), i1.message()), (0, 1));
    assert_eq!(
        p.connect_interrupt(0, h.clone()).err(),
        Some(STATUS_DEVICE_BUSY)
    );
    assert_eq!(
        p.connect_interrupt(2, h.clone()).err(),
        Some(STATUS_INVALID_PARAMETER)
    );
    // Message 0: its ISR, then its DPC once the interrupt returns.
    assert!(p.raise_msix(0));
    assert_eq!(h.isrs[0].load(Ordering::SeqCst), 1);
    assert_eq!(h.dpcs[0].load(Ordering::SeqCst), 1);
    assert_eq!(quiet.isrs[1].load(Ordering::SeqCst), 0, "not message 1's");
    // Message 1: an ISR that does not claim it queues no DPC.
    assert!(p.raise_msix(1));
    assert_eq!(quiet.isrs[1].load(Ordering::SeqCst), 1);
    assert_eq!(quiet.dpcs[1].load(Ordering::SeqCst), 0);
    // Raised while the processor is at DISPATCH_LEVEL: the DPC waits for
    // IRQL to drop.
    p.run_at_dispatch(|| {
        assert!(p.raise_msix(0));
        assert_eq!(h.dpcs[0].load(Ordering::SeqCst), 1, "not yet");
    });
    assert_eq!(h.dpcs[0].load(Ordering::SeqCst), 2);
    // Disconnected: the message goes nowhere (counted), and can be
    // connected again.
    drop(i0);
    assert!(!p.raise_msix(0));
    assert_eq!(p.iommu_stats().stray_messages, 1);
    assert_eq!(h.isrs[0].load(Ordering::SeqCst), 2);
    let again = p.connect_interrupt(0, h.clone()).unwrap();
    assert!(p.raise_msix(0));
    assert_eq!(h.isrs[0].load(Ordering::SeqCst), 3);
    drop((again, i1));
    drop(p);
}

#[test]
fn unloading_with_a_mapping_out_bugchecks_naming_it() {
    let p = platform();
    let cb = p.alloc_common_buffer(4096).unwrap();
    let check = catch_bugcheck(|| p.unload()).expect_err("a common buffer is out");
    assert_eq!(check.code, codes::DRIVER_VERIFIER_DMA_VIOLATION);
    assert_eq!(check.params[0], dma::RELEASED_WITH_OUTSTANDING);
    assert_eq!(check.params[2], 1);
    assert!(check.reason.contains("common buffer"), "{}", check.reason);
    drop(cb);
    let (r, _backing) = region(4096, 0);
    let m = p.map_dma(&r, DmaDirection::ToDevice).unwrap();
    let check = catch_bugcheck(|| p.unload()).expect_err("a mapping is out");
    assert!(check.reason.contains("scatter/gather"), "{}", check.reason);
    drop(m);
    p.unload();
}

/// A memory registration of user memory: the buffer pinned in the
/// caller's context (`pin_memory`, an MDL on Windows), mapped for the
/// device, which reads the user's bytes through the list and writes into
/// them; the pin lasts until both the mapping and the region are gone.
#[test]
fn a_pinned_user_buffer_is_mapped_for_the_device() {
    let p = platform();
    p.file_opened(7);
    let request = p.new_request(
        RequestParams {
            ioctl_code: IOCTL_IV_REG_MR,
            major_function: MajorFunction::DeviceControl,
            requestor_mode: RequestorMode::User,
            file: 7,
            process: HOST_PROCESS,
            input: Vec::new(),
            output_len: 0,
        },
        |_, _, _| {},
        None,
    );
    let mut user = vec![0u8; 3 * 4096];
    user[..5].copy_from_slice(b"hello");
    let addr = user.as_mut_ptr() as u64 + 2;
    let pinned = p.pin_memory(&request, addr, 8000, true, false).unwrap();
    assert_eq!(p.pinned(7), 1);
    let m = p.map_dma(&pinned, DmaDirection::Bidirectional).unwrap();
    let e = m.elements()[0];
    let mut got = [0u8; 3];
    p.dma_read(e.address, &mut got).unwrap();
    assert_eq!(&got, b"llo", "the user's bytes, from the pinned start");
    let last = *m.elements().last().unwrap();
    p.dma_write(last.address + u64::from(last.length) - 2, b"!!")
        .unwrap();
    drop(pinned);
    assert_eq!(p.pinned(7), 1, "the mapping keeps the pin");
    drop(m);
    assert_eq!(p.pinned(7), 0, "unpinned with the mapping");
    assert_eq!(&user[2 + 8000 - 2..2 + 8000], b"!!");
    request.complete(STATUS_SUCCESS, 0);
    p.file_closing(7);
}
