//! Doorbell pages: the soft HCA's UAR pages.
//!
//! A real HCA gives each user context a doorbell (UAR) page in its BAR: the
//! process writes a queue's doorbell there with no system call, and the HCA
//! checks that the queue belongs to the page it was written to. The soft
//! HCA has no BAR and no MMIO, so its doorbell pages are ordinary memory it
//! allocates (one page, [`DoorbellPage`]) and the driver maps into the
//! process; instead of trapping writes, it *scans* them
//! ([`crate::SoftHca::poll_doorbells`], which the platform drives).
//!
//! Each page has [`IV_DOORBELL_SLOTS`] slots. The driver binds a queue of
//! the page's file to a slot ([`Firmware::bind_doorbell`]); a scan takes
//! every slot rung since the last one and rings the doorbell of the queue
//! bound to it, exactly as the direct-call doorbell would. The slot table
//! is the HCA's, never in the page: whatever user mode writes into the page
//! makes the HCA look, at worst, at the queues bound to that page (a
//! doorbell is only a hint to look), never at another page's, and a slot
//! bound to nothing is counted and ignored. Bindings end with their queue
//! (its destroy command, under the same lock as the scans) or their page.
//!
//! Every structure here lives in the firmware, under `HCA_LOCK`, and grows
//! fallibly (`STATUS_INSUFFICIENT_RESOURCES`, never an abort).

use alloc::vec::Vec;

use irpverbs_abi::{
    IV_DOORBELL_SLOTS, NtStatus, STATUS_INSUFFICIENT_RESOURCES, STATUS_INVALID_HANDLE,
    STATUS_INVALID_PARAMETER,
};
use irpverbs_core::DoorbellTarget;
use irpverbs_ring::DoorbellPage;
use irpverbs_ring::doorbell::for_each_bit;

use crate::firmware::Firmware;

/// One doorbell page and what its slots ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Page {
    /// The page's number.
    pub(crate) id: u32,
    /// Its memory.
    pub(crate) page: DoorbellPage,
    /// What each slot rings, up to the highest slot bound.
    slots: Vec<Option<DoorbellTarget>>,
}

/// What a scan did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Slots taken that rang a queue.
    pub(crate) rung: usize,
    /// Slots taken that were bound to nothing.
    pub(crate) stray: usize,
    /// The data path has work (a send queue scheduled, a receive side
    /// woken).
    pub(crate) work: bool,
}

/// The doorbell pages of an HCA and every binding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Doorbells {
    /// By number, ascending.
    pages: Vec<Page>,
    /// Every bound queue: (target, page, slot), sorted by target.
    bound: Vec<(DoorbellTarget, u32, u32)>,
    /// The last page number handed out.
    last_id: u32,
    /// Slots taken that rang a queue, in all.
    pub(crate) rung: u64,
    /// Slots taken that were bound to nothing, in all.
    pub(crate) stray: u64,
}

impl Doorbells {
    /// Pages allocated and not freed.
    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    fn index(&self, id: u32) -> Option<usize> {
        self.pages.binary_search_by_key(&id, |p| p.id).ok()
    }

    /// A new page; numbers are never reused while a page holds one.
    ///
    /// # Errors
    /// `STATUS_INSUFFICIENT_RESOURCES` when memory is short (or, after
    /// 2^32 pages, every number is taken).
    /// On `memory` when given (a device's own page, zeroed here) instead
    /// of a page of its own: `STATUS_INVALID_PARAMETER` for memory smaller
    /// than a doorbell page.
    pub(crate) fn alloc_on(
        &mut self,
        memory: Option<irpverbs_ring::Shared<irpverbs_ring::Region>>,
    ) -> Result<(u32, DoorbellPage), NtStatus> {
        self.pages
            .try_reserve(1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let mut id = self.last_id;
        loop {
            id = id.wrapping_add(1);
            if id == self.last_id {
                return Err(STATUS_INSUFFICIENT_RESOURCES);
            }
            if id != 0 && self.index(id).is_none() {
                break;
            }
        }
        self.pages
            .try_reserve(1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let page = match memory {
            Some(memory) => {
                memory
                    .fill(0, memory.len(), 0)
                    .map_err(|_| STATUS_INVALID_PARAMETER)?;
                DoorbellPage::new(memory).map_err(|_| STATUS_INVALID_PARAMETER)?
            }
            None => DoorbellPage::alloc().ok_or(STATUS_INSUFFICIENT_RESOURCES)?,
        };
        self.last_id = id;
        let at = self.pages.partition_point(|p| p.id < id);
        self.pages.insert(
            at,
            Page {
                id,
                page: page.clone(),
                slots: Vec::new(),
            },
        );
        Ok((id, page))
    }

    /// Frees page `id` and every binding to it; returns the page (`None`
    /// for a page that does not exist).
    pub(crate) fn free(&mut self, id: u32) -> Option<DoorbellPage> {
        let at = self.index(id)?;
        let page = self.pages.remove(at);
        self.bound.retain(|&(_, p, _)| p != id);
        Some(page.page)
    }

    /// Binds `target` to the lowest free slot of page `id`; a target bound
    /// to that page already keeps its slot.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for a page that does not exist or a
    /// target bound to another page; `STATUS_INSUFFICIENT_RESOURCES` when
    /// the page has no free slot (or memory is short).
    pub(crate) fn bind(&mut self, id: u32, target: DoorbellTarget) -> Result<u32, NtStatus> {
        let at = self.index(id).ok_or(STATUS_INVALID_PARAMETER)?;
        let b = match self.bound.binary_search_by_key(&target, |&(t, _, _)| t) {
            Ok(b) => {
                let (_, page, slot) = self.bound[b];
                return if page == id {
                    Ok(slot)
                } else {
                    Err(STATUS_INVALID_PARAMETER)
                };
            }
            Err(b) => b,
        };
        self.bound
            .try_reserve(1)
            .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
        let slots = &mut self.pages[at].slots;
        let slot = match slots.iter().position(Option::is_none) {
            Some(free) => free,
            None if slots.len() < IV_DOORBELL_SLOTS as usize => {
                slots
                    .try_reserve(1)
                    .map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;
                slots.push(None);
                slots.len() - 1
            }
            None => return Err(STATUS_INSUFFICIENT_RESOURCES),
        };
        slots[slot] = Some(target);
        // `slot` < IV_DOORBELL_SLOTS, a u32.
        let slot = slot as u32;
        self.bound.insert(b, (target, id, slot));
        Ok(slot)
    }

    /// Ends `target`'s binding, if it has one (its queue is destroyed).
    pub(crate) fn unbind(&mut self, target: DoorbellTarget) {
        let Ok(b) = self.bound.binary_search_by_key(&target, |&(t, _, _)| t) else {
            return;
        };
        let (_, page, slot) = self.bound.remove(b);
        if let Some(at) = self.index(page) {
            if let Some(s) = self.pages[at].slots.get_mut(slot as usize) {
                *s = None;
            }
        }
    }

    /// The target of `slot` of the page at index `at`.
    fn target(&self, at: usize, slot: u32) -> Option<DoorbellTarget> {
        self.pages
            .get(at)?
            .slots
            .get(slot as usize)
            .copied()
            .flatten()
    }
}

impl Firmware {
    /// Binds `target` to a slot of doorbell page `page` ([`Doorbells::bind`])
    /// once its queue is known to exist (a QP's receive queue: a QP without
    /// an SRQ).
    ///
    /// # Errors
    /// `STATUS_INVALID_HANDLE` for a queue that does not exist; as
    /// [`Doorbells::bind`].
    pub(crate) fn bind_doorbell(
        &mut self,
        page: u32,
        target: DoorbellTarget,
    ) -> Result<u32, NtStatus> {
        let exists = match target {
            DoorbellTarget::Sq(qpn) => self.qps.get(qpn).is_ok(),
            DoorbellTarget::Rq(qpn) => self.qps.get(qpn).is_ok_and(|qp| qp.rq.is_some()),
            DoorbellTarget::Srq(srqn) => self.srqs.get(srqn).is_ok(),
            DoorbellTarget::CqArm(cqn) => self.cqs.get(cqn).is_ok(),
        };
        if !exists {
            return Err(STATUS_INVALID_HANDLE);
        }
        self.doorbells.bind(page, target)
    }

    /// Takes every slot rung on every page since the last scan and rings
    /// the doorbell of the queue each is bound to (under `HCA_LOCK`, where
    /// destroys unbind: a slot rings only a live queue of its page). The
    /// send queues are scheduled and the receive sides woken as their
    /// doorbells do; an armed CQ with completions queues its event. The
    /// caller runs the data path when [`Scan::work`] says so.
    ///
    /// `ring` rings a target (the transport's doorbells,
    /// `Firmware::ring_target`) and says whether the data path has work.
    pub(crate) fn scan_doorbells(
        &mut self,
        mut ring: impl FnMut(&mut Firmware, DoorbellTarget) -> bool,
    ) -> Scan {
        let mut scan = Scan::default();
        for at in 0..self.doorbells.pages.len() {
            let summary = self.doorbells.pages[at].page.take_summary();
            for_each_bit(summary, |word| {
                let bits = self.doorbells.pages[at].page.take_word(word);
                for_each_bit(bits, |bit| {
                    match self.doorbells.target(at, word * 64 + bit) {
                        Some(target) => {
                            scan.rung += 1;
                            scan.work |= ring(self, target);
                        }
                        None => scan.stray += 1,
                    }
                });
            });
        }
        self.doorbells.rung += scan.rung as u64;
        self.doorbells.stray += scan.stray as u64;
        scan
    }
}
