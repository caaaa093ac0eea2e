//! The requestor's-context half of the driver: what must run in the
//! process that issued a request, before the request reaches the
//! dispatch-level queue ([`Device::in_caller_context`]), and the user
//! mappings of rings it makes.
//!
//! # Decisions
//! - **Rings are mapped on request** (`IOCTL_IV_MAP_RINGS`, handled in the
//!   caller's context), not by the create verbs: a create completes in the
//!   DPC (DISPATCH_LEVEL, in whatever process was running), where no user
//!   mapping can be made. A user-mode caller's create response therefore
//!   carries the rings' geometry with zero addresses, and the ULP maps them
//!   next; asking again returns the same addresses.
//! - **One process per file: its opener.** A user-mode file belongs to the
//!   process that opened it ([`Device::create_file`]'s owner): only its
//!   requests pin user memory (`IOCTL_IV_REG_MR`) or map rings and the
//!   doorbell page into a process; the same requests from any other
//!   process (a handle inherited or duplicated) are refused with
//!   `STATUS_ACCESS_DENIED` before anything is pinned, allocated or
//!   mapped. A kernel-mode file has no owner and maps nothing for user
//!   mode. Control verbs work from any process. Every mapping of a file is
//!   therefore in its opener, and every pin of its pages.
//! - **The opener's exit runs the file down** ([`Device::owner_exited`], on
//!   the platform's process-exit notification): its mappings are undone in
//!   the exiting process and its registrations' pins released while the
//!   address space is still there, whatever other process keeps a handle
//!   to the file; that process's later requests on it fail with
//!   `STATUS_PROCESS_IS_TERMINATING`, and the last handle's cleanup finds
//!   nothing to unmap.
//! - **A mapping keeps its ring's memory.** It holds the ring's region, so
//!   a destroy (or a CQ resize) that frees the object never frees memory
//!   still mapped into a process.
//! - **Unmapped in the caller's context only.** Unmapping needs the process's
//!   context at PASSIVE_LEVEL, which a destroy completing in the DPC does not
//!   have. Mappings of destroyed objects and replaced rings are swept at the
//!   file's next user request from the bound process, in its context, and
//!   every mapping of the file is undone at its cleanup (which runs in the
//!   process, before a process exit tears its address space down).
//! - **One doorbell page per file** (`IOCTL_IV_MAP_DOORBELLS`): the HCA's
//!   page through which the file's process rings its queues' doorbells with
//!   no system call (as a real HCA gives each user context a UAR page). It is
//!   allocated by the first request and freed with the file, and mapped like
//!   a ring: in the caller's context, once, into the file's process, held
//!   while mapped, unmapped at the file's cleanup. Per file rather than per
//!   queue: one mapping and one page for the scanner to look at per process,
//!   however many queues it has. A user-mode `IOCTL_IV_MAP_RINGS` after it
//!   binds the object's doorbells to slots of the page
//!   ([`Hca::bind_doorbell`], under the device lock, while the object is
//!   live, so the binding always precedes the destroy that ends it) and
//!   reports them.

use alloc::vec::Vec;

use irpverbs_abi::*;
use irpverbs_ring::{Region, Ring, Shared};

use crate::Hca;
use crate::device::{Device, Response, State};
use crate::fallible::{VecMap, try_push};
use crate::object::{Kind, Object};
use crate::platform::{FileKey, Platform, ProcessKey, Request, RequestorMode, SpinLock};
use crate::verbs::Verb;
use zerocopy::IntoBytes;

/// The user mappings of every file, under [`crate::platform::MAP_LOCK`]:
/// a file's entry is made when the file is created and goes when it is
/// closed, so that nothing after the create needs memory for it.
pub(crate) type Maps<M> = VecMap<FileKey, FileMaps<M>>;

/// `file`'s mapping entry.
///
/// # Errors
/// `STATUS_DELETE_PENDING` once the file is closed (its entry is gone).
fn file_maps<M>(maps: &mut Maps<M>, file: FileKey) -> Result<&mut FileMaps<M>, NtStatus> {
    maps.get_mut(&file).ok_or(STATUS_DELETE_PENDING)
}

/// One file's user mappings.
pub(crate) struct FileMaps<M> {
    /// The process the file's mappings and pins belong to: its opener
    /// (`None` for a kernel-mode file).
    space: Option<ProcessKey>,
    /// The file's cleanup ran: nothing is mapped any more.
    closed: bool,
    entries: Vec<MapEntry<M>>,
    /// The file's doorbell page, once mapped.
    page: Option<PageEntry<M>>,
}

impl<M> FileMaps<M> {
    /// A new file's entry: nothing mapped, owned by `owner`.
    pub(crate) fn new(owner: Option<ProcessKey>) -> Self {
        Self {
            space: owner,
            closed: false,
            entries: Vec::new(),
            page: None,
        }
    }

    /// Checks that `process` may map into, or pin memory of, its own
    /// address space through the file: that it opened the file.
    ///
    /// # Errors
    /// `STATUS_ACCESS_DENIED` for any other process (or a kernel-mode
    /// file); `STATUS_DELETE_PENDING` once the file's mappings are undone
    /// for good (its cleanup, or its opener's exit).
    fn bind(&self, process: ProcessKey) -> Result<(), NtStatus> {
        if self.space != Some(process) {
            return Err(STATUS_ACCESS_DENIED);
        }
        if self.closed {
            return Err(STATUS_DELETE_PENDING);
        }
        Ok(())
    }

    /// Where `region` of the object `handle` is mapped, if it is.
    fn find(&self, handle: IvHandle, region: &Shared<Region>) -> Option<IvRingMap> {
        self.entries
            .iter()
            .find(|e| e.handle == handle && Shared::ptr_eq(&e.region, region))
            .map(|e| e.map)
    }
}

/// One ring mapped into the file's process.
struct MapEntry<M> {
    /// The object it belongs to.
    handle: IvHandle,
    /// The ring's memory, kept allocated while it is mapped.
    region: Shared<Region>,
    /// Where it is in the process.
    map: IvRingMap,
    /// The platform's mapping.
    mapping: M,
}

/// The file's doorbell page mapped into its process.
struct PageEntry<M> {
    /// The page's memory, kept allocated while it is mapped.
    region: Shared<Region>,
    /// Where it is in the process.
    addr: u64,
    /// The platform's mapping.
    mapping: M,
}

/// The `IOCTL_IV_MAP_DOORBELLS` response for a page mapped at `addr`.
fn doorbells_out(addr: u64) -> IvMapDoorbellsOut {
    IvMapDoorbellsOut {
        page_addr: addr,
        page_len: IV_DOORBELL_PAGE_SIZE,
        slots: IV_DOORBELL_SLOTS,
    }
}

/// Binds the doorbells of `o`'s rings to slots of doorbell page `page`
/// (those not bound yet) and returns the slots, in [`Object::rings`] order
/// ([`IV_DOORBELL_NONE`] where there is no ring). A slot bound before a
/// later one fails stays bound (and is reported by the next request).
fn bind_doorbells<H: Hca>(hca: &H, page: u32, o: &mut Object) -> Result<[u32; 2], NtStatus> {
    let mut slots = [IV_DOORBELL_NONE; 2];
    for (i, target) in o.doorbell_targets().into_iter().enumerate() {
        let Some(target) = target else { continue };
        let slot = match o.doorbells[i] {
            Some(slot) => slot,
            None => {
                let slot = hca.bind_doorbell(page, target)?;
                o.doorbells[i] = Some(slot);
                slot
            }
        };
        slots[i] = slot;
    }
    Ok(slots)
}

/// The ring's geometry without addresses: what a user-mode caller's create
/// and resize responses carry.
pub(crate) fn geometry(ring: &Ring) -> IvRingMap {
    IvRingMap {
        entries: ring.entries(),
        stride: ring.stride(),
        ..IvRingMap::default()
    }
}

/// Whether the object `handle` names still exists with `region` as one of
/// its rings (a destroy in flight, or failing, keeps the mapping).
fn still_mapped<R>(s: &State<R>, file: FileKey, handle: IvHandle, region: &Shared<Region>) -> bool {
    let Some(f) = s.files.get(&file) else {
        return false;
    };
    let Some(idx) = f.objects.find(handle) else {
        return false;
    };
    f.objects
        .get(idx)
        .rings()
        .into_iter()
        .flatten()
        .any(|r| Shared::ptr_eq(r.region(), region))
}

impl<P: Platform, H: Hca> Device<P, H> {
    /// `EvtIoInCallerContext`: the platform calls this for every request in
    /// the requestor's thread and process, before the request is queued, and
    /// queues what it returns (to reach [`Device::dispatch_ioctl`]).
    ///
    /// - Every user-mode request first unmaps, from the file's process, the
    ///   rings of objects destroyed (or CQs resized) since.
    /// - `IOCTL_IV_MAP_RINGS` and `IOCTL_IV_MAP_DOORBELLS` are handled and
    ///   completed here.
    /// - A user-mode `IOCTL_IV_REG_MR` is validated and its range pinned
    ///   ([`Platform::pin_memory`]); the region rides with the request
    ///   ([`Request::attach_pin`]) to the queue. A refusal completes it here.
    /// - Everything else is returned untouched.
    ///
    /// IRQL: the requestor's: PASSIVE_LEVEL for user-mode requests (the
    /// unmapping, mapping and pinning need it); kernel callers may be at up
    /// to DISPATCH_LEVEL (nothing here touches an address space for them).
    pub fn in_caller_context(&self, mut request: P::Request) -> Option<P::Request> {
        let user = request.requestor_mode() == RequestorMode::User;
        if user {
            self.sweep(request.file(), request.address_space());
        }
        match request.ioctl_code() {
            IOCTL_IV_MAP_RINGS => {
                self.map_rings(request, true);
                None
            }
            IOCTL_IV_MAP_DOORBELLS => {
                self.map_doorbells(request, true);
                None
            }
            IOCTL_IV_RING_DOORBELLS => {
                self.ring_doorbells(request);
                None
            }
            IOCTL_IV_REG_MR if user => match self.pin_in_caller_context(&mut request) {
                Ok(()) => Some(request),
                Err(status) => {
                    self.complete(request, status, &Response::None);
                    None
                }
            },
            _ => Some(request),
        }
    }

    /// Validates a user-mode `REG_MR` and pins its range for the request.
    fn pin_in_caller_context(&self, request: &mut P::Request) -> Result<(), NtStatus> {
        let Verb::RegMr(i, physical, _) = self.parse_request(request)? else {
            return Err(STATUS_INVALID_DEVICE_REQUEST);
        };
        crate::verbs::mr::check_reg_mr(self.hca.caps(), RequestorMode::User, &i)?;
        let file = request.file();
        self.state.lock(|s| {
            if s.removed {
                return Err(STATUS_DEVICE_REMOVED);
            }
            s.file(file).map(drop)
        })?;
        let space = request.address_space();
        self.maps.lock(|maps| file_maps(maps, file)?.bind(space))?;
        let write = crate::verbs::mr::writable(i.access);
        let region = self
            .platform
            .pin_memory(request, i.addr, i.length, write, physical)?;
        request.attach_pin(region);
        Ok(())
    }

    /// `IOCTL_IV_MAP_RINGS`, completed here. A user-mode request is served
    /// only from [`Device::in_caller_context`] (`in_caller`); from the queue
    /// it fails with `STATUS_INVALID_DEVICE_STATE`.
    pub(crate) fn map_rings(&self, mut request: P::Request, in_caller: bool) {
        match self.try_map_rings(&mut request, in_caller) {
            Ok(out) => {
                let response = Response::write(&mut request, out.as_bytes());
                self.complete(request, STATUS_SUCCESS, &response);
            }
            Err(status) => self.complete(request, status, &Response::None),
        }
    }

    fn try_map_rings(
        &self,
        request: &mut P::Request,
        in_caller: bool,
    ) -> Result<IvMapRingsOut, NtStatus> {
        let Verb::MapRings(h) = self.parse_request(request)? else {
            return Err(STATUS_INVALID_DEVICE_REQUEST);
        };
        let file = request.file();
        let handle = h.handle;
        let user = request.requestor_mode() == RequestorMode::User;
        let (rings, slots): ([Option<Ring>; 2], [u32; 2]) = self.state.lock(|s| {
            if s.removed {
                return Err(STATUS_DEVICE_REMOVED);
            }
            let f = s.file(file)?;
            let kind = [Kind::Cq, Kind::Qp, Kind::Srq]
                .into_iter()
                .find(|&k| crate::handle::kind_of(handle) == k as u8)
                .ok_or(STATUS_INVALID_HANDLE)?;
            let idx = f.objects.lookup(handle, kind)?;
            let rings = match f.objects.get(idx).rings() {
                [Some(a), b] => [Some(a.clone()), b.cloned()],
                [None, _] => return Err(STATUS_INVALID_HANDLE),
            };
            // A user-mode caller's doorbells ring the file's page, if it
            // has one (and the caller the context to map); a kernel caller
            // rings the direct-call doorbells.
            let page = f.doorbell_page.as_ref().map(|p| p.page);
            let slots = match page {
                Some(page) if user && in_caller => {
                    bind_doorbells(&self.hca, page, f.objects.get_mut(idx))?
                }
                _ => [IV_DOORBELL_NONE; 2],
            };
            Ok((rings, slots))
        })?;
        let out = |maps: [Option<IvRingMap>; 2]| IvMapRingsOut {
            ring: maps[0].unwrap_or_default(),
            rq: maps[1].unwrap_or_default(),
            ring_doorbell: slots[0],
            rq_doorbell: slots[1],
        };
        if request.requestor_mode() == RequestorMode::Kernel {
            return Ok(out([
                rings[0].as_ref().map(Ring::map),
                rings[1].as_ref().map(Ring::map),
            ]));
        }
        if !in_caller {
            return Err(STATUS_INVALID_DEVICE_STATE);
        }
        let space = request.address_space();
        let mut found: [Option<IvRingMap>; 2] = [None, None];
        self.maps.lock(|maps| {
            let fm = file_maps(maps, file)?;
            fm.bind(space)?;
            for (slot, ring) in found.iter_mut().zip(&rings) {
                if let Some(ring) = ring {
                    *slot = fm.find(handle, ring.region());
                }
            }
            Ok::<(), NtStatus>(())
        })?;
        // Map what is not mapped yet: outside the locks, in the caller's
        // context (PASSIVE_LEVEL).
        let mut fresh: [Option<(IvRingMap, P::Mapping)>; 2] = [None, None];
        for (i, ring) in rings.iter().enumerate() {
            let Some(ring) = ring else { continue };
            if found[i].is_some() {
                continue;
            }
            match self.platform.map_ring(request, ring) {
                Ok((map, mapping)) => fresh[i] = Some((map, mapping)),
                Err(status) => {
                    for (_, mapping) in fresh.into_iter().flatten() {
                        self.platform.unmap_ring(mapping);
                    }
                    return Err(status);
                }
            }
        }
        // Record them, unless the file was cleaned up meanwhile or another
        // request mapped the same ring first (or the entry's room is
        // refused): then give ours back.
        let (spare, status) = self.maps.lock(|maps| {
            let mut spare: [Option<P::Mapping>; 2] = [None, None];
            let fm = match file_maps(maps, file) {
                Ok(fm) if !fm.closed => fm,
                _ => {
                    for (slot, f) in spare.iter_mut().zip(fresh) {
                        *slot = f.map(|(_, m)| m);
                    }
                    return (spare, Err(STATUS_DELETE_PENDING));
                }
            };
            let mut status = Ok(());
            for (i, f) in fresh.into_iter().enumerate() {
                let Some((map, mapping)) = f else { continue };
                let Some(region) = rings[i].as_ref().map(|r| Shared::clone(r.region())) else {
                    spare[i] = Some(mapping);
                    continue;
                };
                if let Some(existing) = fm.find(handle, &region) {
                    found[i] = Some(existing);
                    spare[i] = Some(mapping);
                    continue;
                }
                let entry = MapEntry {
                    handle,
                    region,
                    map,
                    mapping,
                };
                match try_push(&mut fm.entries, entry) {
                    Ok(()) => {
                        found[i] = Some(map);
                        self.any_mapped
                            .store(true, core::sync::atomic::Ordering::Release);
                    }
                    Err((st, entry)) => {
                        spare[i] = Some(entry.mapping);
                        status = Err(st);
                    }
                }
            }
            (spare, status)
        });
        for mapping in spare.into_iter().flatten() {
            self.platform.unmap_ring(mapping);
        }
        status?;
        Ok(out(found))
    }

    /// `IOCTL_IV_MAP_DOORBELLS`, completed here. A user-mode request is
    /// served only from [`Device::in_caller_context`] (`in_caller`); from
    /// the queue it fails with `STATUS_INVALID_DEVICE_STATE`. Kernel callers
    /// ring the direct-call doorbells: `STATUS_NOT_SUPPORTED`.
    pub(crate) fn map_doorbells(&self, mut request: P::Request, in_caller: bool) {
        match self.try_map_doorbells(&mut request, in_caller) {
            Ok(out) => {
                let response = Response::write(&mut request, out.as_bytes());
                self.complete(request, STATUS_SUCCESS, &response);
            }
            Err(status) => self.complete(request, status, &Response::None),
        }
    }

    fn try_map_doorbells(
        &self,
        request: &mut P::Request,
        in_caller: bool,
    ) -> Result<IvMapDoorbellsOut, NtStatus> {
        let Verb::MapDoorbells = self.parse_request(request)? else {
            return Err(STATUS_INVALID_DEVICE_REQUEST);
        };
        if request.requestor_mode() == RequestorMode::Kernel {
            return Err(STATUS_NOT_SUPPORTED);
        }
        if !in_caller {
            return Err(STATUS_INVALID_DEVICE_STATE);
        }
        let file = request.file();
        let space = request.address_space();
        // The file's page, allocated by its opener's first request (the
        // mapping lock before the device's); another process's request
        // allocates nothing.
        let (region, mapped) = self.maps.lock(|maps| {
            let fm = file_maps(maps, file)?;
            let region = self.state.lock(|s| {
                if s.removed {
                    return Err(STATUS_DEVICE_REMOVED);
                }
                let f = s.file(file)?;
                fm.bind(space)?;
                if let Some(page) = &f.doorbell_page {
                    return Ok(Shared::clone(&page.region));
                }
                let page = self.hca.alloc_doorbell_page()?;
                let region = Shared::clone(&page.region);
                f.doorbell_page = Some(page);
                Ok(region)
            })?;
            Ok::<_, NtStatus>((region, fm.page.as_ref().map(|p| p.addr)))
        })?;
        if let Some(addr) = mapped {
            return Ok(doorbells_out(addr));
        }
        // Map it outside the locks, in the caller's context (PASSIVE_LEVEL).
        let (addr, mapping) = self.platform.map_doorbell_page(request, &region)?;
        // Record it, unless the file was cleaned up meanwhile or another
        // request mapped the page first: then give ours back.
        let (spare, result) = self.maps.lock(|maps| {
            let fm = match file_maps(maps, file) {
                Ok(fm) if !fm.closed => fm,
                _ => return (Some(mapping), Err(STATUS_DELETE_PENDING)),
            };
            if let Some(p) = &fm.page {
                return (Some(mapping), Ok(p.addr));
            }
            fm.page = Some(PageEntry {
                region,
                addr,
                mapping,
            });
            (None, Ok(addr))
        });
        if let Some(mapping) = spare {
            self.platform.unmap_ring(mapping);
        }
        result.map(doorbells_out)
    }

    /// `IOCTL_IV_RING_DOORBELLS`, completed at once (in the caller's
    /// context, or from the queue): the HCA takes what was rung in the
    /// doorbell pages now and polls them again ([`Hca::ring_doorbell_pages`],
    /// called with no driver lock held). Kernel callers ring the
    /// direct-call doorbells: `STATUS_NOT_SUPPORTED`; a file without a
    /// doorbell page: `STATUS_INVALID_DEVICE_STATE`; a removed device:
    /// `STATUS_DEVICE_REMOVED`.
    ///
    /// IRQL: <= DISPATCH_LEVEL.
    pub(crate) fn ring_doorbells(&self, mut request: P::Request) {
        let status = match self.try_ring_doorbells(&mut request) {
            Ok(()) => STATUS_SUCCESS,
            Err(status) => status,
        };
        self.complete(request, status, &Response::None);
    }

    fn try_ring_doorbells(&self, request: &mut P::Request) -> Result<(), NtStatus> {
        let Verb::RingDoorbells = self.parse_request(request)? else {
            return Err(STATUS_INVALID_DEVICE_REQUEST);
        };
        if request.requestor_mode() == RequestorMode::Kernel {
            return Err(STATUS_NOT_SUPPORTED);
        }
        let file = request.file();
        self.state.lock(|s| {
            if s.removed {
                return Err(STATUS_DEVICE_REMOVED);
            }
            match s.file(file)?.doorbell_page {
                Some(_) => Ok(()),
                None => Err(STATUS_INVALID_DEVICE_STATE),
            }
        })?;
        self.hca.ring_doorbell_pages()
    }

    /// Unmaps the file's rings whose objects are gone (or whose CQ was
    /// resized), when the request comes from the file's process.
    ///
    /// IRQL: PASSIVE_LEVEL, in the requestor's context.
    fn sweep(&self, file: FileKey, space: u64) {
        if !self.any_mapped.load(core::sync::atomic::Ordering::Acquire) {
            return;
        }
        // One stale entry at a time, unmapped outside the locks: no list
        // to allocate.
        loop {
            let stale = self.maps.lock(|maps| {
                let fm = maps.get_mut(&file)?;
                if fm.entries.is_empty() || fm.space != Some(space) {
                    return None;
                }
                let at = self.state.lock(|s| {
                    fm.entries
                        .iter()
                        .position(|e| !still_mapped(s, file, e.handle, &e.region))
                })?;
                Some(fm.entries.swap_remove(at))
            });
            let Some(entry) = stale else { break };
            self.unmap_all([entry]);
        }
    }

    /// The file's cleanup (or close): every mapping of the file is undone,
    /// and no new one can be made.
    ///
    /// IRQL: PASSIVE_LEVEL (the file callbacks), when there is anything to
    /// unmap.
    pub(crate) fn unmap_file(&self, file: FileKey, forget: bool) {
        let (entries, page) = self.maps.lock(|maps| {
            if forget {
                return maps
                    .remove(&file)
                    .map(|fm| (fm.entries, fm.page))
                    .unwrap_or_default();
            }
            // No entry: the file is closed already.
            let Some(fm) = maps.get_mut(&file) else {
                return (Vec::new(), None);
            };
            fm.closed = true;
            (core::mem::take(&mut fm.entries), fm.page.take())
        });
        self.unmap_all(entries);
        if let Some(PageEntry {
            region, mapping, ..
        }) = page
        {
            self.platform.unmap_ring(mapping);
            // Only now may the page's memory go (with the HCA's hold).
            drop(region);
        }
    }

    fn unmap_all(&self, entries: impl IntoIterator<Item = MapEntry<P::Mapping>>) {
        for MapEntry {
            mapping, region, ..
        } in entries
        {
            self.platform.unmap_ring(mapping);
            // Only now may the ring's memory go.
            drop(region);
        }
    }

    /// User mappings alive (all files): rings and doorbell pages.
    pub(crate) fn mapping_count(&self) -> usize {
        self.maps.lock(|maps| {
            maps.values()
                .map(|fm| fm.entries.len() + usize::from(fm.page.is_some()))
                .sum()
        })
    }
}
