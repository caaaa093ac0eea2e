//! The device list, contexts and the queries: `ibv_get_device_list`,
//! `ibv_open_device`, `ibv_query_device`, `ibv_query_port`,
//! `ibv_query_gid` (and `_ex`, the table, the GID type), `ibv_query_pkey`.
//!
//! One device, `irpverbs0`, is always listed: opening it opens
//! `\\.\irpverbs0` (on a non-Windows host, loading the host-mode driver).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use irpverbs_abi::*;
use irpverbs_verbs::Client;

use crate::abi::*;
use crate::events::Events;
use crate::file::DeviceFile;
use crate::{Context, MUTEX, context, cq, errno_of, leak, null_with, qp, set_errno};

/// The device name.
pub const DEVICE_NAME: &str = "irpverbs0";

struct Device(*mut ibv_device);
// SAFETY: the device is created once and never written again.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

fn copy_str<const N: usize>(to: &mut [c_char; N], s: &str) {
    for (d, b) in to.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
}

/// The one device, made once.
fn device() -> *mut ibv_device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| {
        let mut d = ibv_device {
            _ops: _ibv_device_ops {
                _dummy1: std::ptr::null_mut(),
                _dummy2: std::ptr::null_mut(),
            },
            node_type: IBV_NODE_CA,
            transport_type: IBV_TRANSPORT_IB,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; IBV_SYSFS_PATH_MAX],
        };
        copy_str(&mut d.name, DEVICE_NAME);
        copy_str(&mut d.dev_name, "uverbs0");
        Device(leak(d))
    })
    .0
}

fn is_ours(dev: *mut ibv_device) -> bool {
    !dev.is_null() && dev == device()
}

/// `ibv_get_device_list`: a NULL-terminated array (free it with
/// `ibv_free_device_list`) holding `irpverbs0`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    // SAFETY: two pointers, zeroed.
    let list = unsafe { libc::calloc(2, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
    if list.is_null() {
        return null_with(libc::ENOMEM);
    }
    // SAFETY: the array holds two entries; the second stays NULL.
    unsafe { list.write(device()) };
    if !num_devices.is_null() {
        // SAFETY: a non-null out pointer (C contract).
        unsafe { num_devices.write(1) };
    }
    list
}

/// `ibv_free_device_list`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: from `ibv_get_device_list` (calloc) or NULL.
    unsafe { libc::free(list.cast()) };
}

/// `ibv_get_device_name`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if !is_ours(dev) {
        return null_with(libc::EINVAL);
    }
    // SAFETY: our device, never freed.
    unsafe { (*dev).name.as_ptr() }
}

/// `ibv_get_device_index`: 0 for `irpverbs0`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    if is_ours(dev) { 0 } else { -1 }
}

/// `ibv_get_device_guid`: the node GUID (big-endian), read from the
/// device; 0 when it cannot be opened.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    if !is_ours(dev) {
        set_errno(libc::EINVAL);
        return 0;
    }
    let Ok(file) = DeviceFile::open() else {
        return 0;
    };
    let guid = Client::new(Box::new(file))
        .query_device()
        .map_or(0, |d| d.node_guid.to_be());
    file.close();
    guid
}

/// `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    if !is_ours(dev) {
        return null_with(libc::EINVAL);
    }
    let file = match DeviceFile::open() {
        Ok(f) => f,
        Err(_) => return null_with(libc::ENODEV),
    };
    let client = Client::new(Box::new(file));
    let vectors = match client.query_device() {
        Ok(d) => d.num_comp_vectors,
        Err(s) => {
            file.close();
            return null_with(errno_of(s));
        }
    };
    let events = match Events::start(file, IOCTL_IV_GET_ASYNC_EVENT, Vec::new()) {
        Ok(e) => e,
        Err(e) => {
            file.close();
            return null_with(e);
        }
    };
    let ctx = leak(Context {
        ibv: ibv_context {
            device: dev,
            ops: ops(),
            cmd_fd: crate::os::cmd_fd(file.handle()),
            async_fd: events.fd(),
            num_comp_vectors: c_int::try_from(vectors).unwrap_or(1),
            mutex: MUTEX,
            abi_compat: std::ptr::null_mut(),
        },
        file,
        client,
        async_events: Some(events),
    });
    ctx.cast()
}

fn ops() -> ibv_context_ops {
    ibv_context_ops {
        _compat_query_device: Some(ibv_query_device),
        _compat_query_port: Some(ibv_query_port),
        _compat_alloc_pd: None,
        _compat_dealloc_pd: None,
        _compat_reg_mr: None,
        _compat_rereg_mr: None,
        _compat_dereg_mr: None,
        alloc_mw: None,
        bind_mw: None,
        dealloc_mw: None,
        _compat_create_cq: None,
        poll_cq: Some(cq::poll_cq),
        req_notify_cq: Some(cq::req_notify_cq),
        _compat_cq_event: None,
        _compat_resize_cq: None,
        _compat_destroy_cq: None,
        _compat_create_srq: None,
        _compat_modify_srq: None,
        _compat_query_srq: None,
        _compat_destroy_srq: None,
        post_srq_recv: Some(qp::post_srq_recv),
        _compat_create_qp: None,
        _compat_query_qp: None,
        _compat_modify_qp: None,
        _compat_destroy_qp: None,
        post_send: Some(qp::post_send),
        post_recv: Some(qp::post_recv),
        _compat_create_ah: None,
        _compat_destroy_ah: None,
        _compat_attach_mcast: None,
        _compat_detach_mcast: None,
        _compat_async_event: None,
    }
}

/// `ibv_close_device`: closes the device file (the driver runs down what
/// the program left open) and frees the context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    if ctx.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: from `ibv_open_device` (C contract), closed once.
    let mut c = unsafe { Box::from_raw(ctx.cast::<Context>()) };
    c.file.close();
    // Closing the file ended the async thread's wait.
    if let Some(ev) = c.async_events.take() {
        ev.finish();
    }
    0
}

fn fw_string(v: u64) -> String {
    format!("{}.{}.{}", v >> 48, (v >> 32) & 0xFFFF, v & 0xFFFF_FFFF)
}

fn int(v: u32) -> c_int {
    c_int::try_from(v).unwrap_or(c_int::MAX)
}

/// `ibv_device_cap_flags` from irpverbs' `IV_DEVICE_*`.
fn cap_flags(iv: u64) -> c_uint {
    let map = [
        (IV_DEVICE_RESIZE_MAX_WR, IBV_DEVICE_RESIZE_MAX_WR),
        (IV_DEVICE_PORT_ACTIVE_EVENT, IBV_DEVICE_PORT_ACTIVE_EVENT),
        (IV_DEVICE_RC_RNR_NAK_GEN, IBV_DEVICE_RC_RNR_NAK_GEN),
        (IV_DEVICE_SRQ_RESIZE, IBV_DEVICE_SRQ_RESIZE),
        (IV_DEVICE_MEM_WINDOW, IBV_DEVICE_MEM_WINDOW),
        (IV_DEVICE_MEM_WINDOW_TYPE_2B, IBV_DEVICE_MEM_WINDOW_TYPE_2B),
    ];
    map.iter()
        .filter(|(i, _)| iv & i != 0)
        .fold(0, |acc, (_, b)| acc | b)
}

/// `ibv_query_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let (Some(c), false) = (unsafe { context(ctx) }, attr.is_null()) else {
        return libc::EINVAL;
    };
    let d = match c.client.query_device() {
        Ok(d) => d,
        Err(s) => return errno_of(s),
    };
    let mut a = ibv_device_attr {
        fw_ver: [0; 64],
        node_guid: d.node_guid.to_be(),
        sys_image_guid: d.sys_image_guid.to_be(),
        max_mr_size: d.max_mr_size,
        page_size_cap: d.page_size_cap,
        vendor_id: d.vendor_id,
        vendor_part_id: d.vendor_part_id,
        hw_ver: d.hw_ver,
        max_qp: int(d.max_qp),
        max_qp_wr: int(d.max_qp_wr),
        device_cap_flags: cap_flags(d.device_cap_flags),
        max_sge: int(d.max_sge),
        max_sge_rd: int(d.max_sge_rd),
        max_cq: int(d.max_cq),
        max_cqe: int(d.max_cqe),
        max_mr: int(d.max_mr),
        max_pd: int(d.max_pd),
        max_qp_rd_atom: int(d.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: int(d.max_res_rd_atom),
        max_qp_init_rd_atom: int(d.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: int(d.atomic_cap),
        max_ee: 0,
        max_rdd: 0,
        max_mw: int(d.max_mw),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: int(d.max_ah),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: int(d.max_srq),
        max_srq_wr: int(d.max_srq_wr),
        max_srq_sge: int(d.max_srq_sge),
        max_pkeys: d.max_pkeys,
        local_ca_ack_delay: d.local_ca_ack_delay,
        phys_port_cnt: d.phys_port_cnt,
    };
    copy_str(&mut a.fw_ver, &fw_string(d.fw_ver));
    // SAFETY: a non-null out pointer (C contract).
    unsafe { attr.write(a) };
    0
}

/// `ibv_query_port` (the full `ibv_port_attr`: rdma-core's inline wrapper
/// zeroes it and passes it here when the context is not extended).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let (Some(c), false) = (unsafe { context(ctx) }, attr.is_null()) else {
        return libc::EINVAL;
    };
    let p = match c.client.query_port(u32::from(port_num)) {
        Ok(p) => p,
        Err(s) => return errno_of(s),
    };
    let a = ibv_port_attr {
        state: int(p.state),
        max_mtu: int(p.max_mtu),
        active_mtu: int(p.active_mtu),
        gid_tbl_len: int(p.gid_tbl_len),
        port_cap_flags: p.port_cap_flags,
        max_msg_sz: p.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: u16::try_from(p.pkey_tbl_len).unwrap_or(u16::MAX),
        lid: p.lid,
        sm_lid: p.sm_lid,
        lmc: p.lmc,
        max_vl_num: p.max_vl_num,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: p.active_width,
        active_speed: p.active_speed,
        phys_state: u8::try_from(p.phys_state).unwrap_or(0),
        link_layer: p.link_layer,
        flags: 0,
        port_cap_flags2: 0,
    };
    // SAFETY: a non-null out pointer (C contract).
    unsafe { attr.write(a) };
    0
}

/// The GID at `index` of `port`: `Ok(None)` for an empty entry of the
/// table, the errno otherwise.
fn gid_at(c: &Context, port: u32, index: u32) -> Result<Option<[u8; 16]>, c_int> {
    let len = c.client.query_port(port).map_err(errno_of)?.gid_tbl_len;
    if index >= len {
        return Err(libc::EINVAL);
    }
    match c.client.query_gid(port, index) {
        Ok(g) if g == [0; 16] => Ok(None),
        Ok(g) => Ok(Some(g)),
        // An index inside the table the port has no address for.
        Err(_) => Ok(None),
    }
}

/// `ibv_query_gid`: an empty entry reads as the zero GID (as rdma-core
/// preserves it); -1 for a bad port or index.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let (Some(c), false, Ok(index)) =
        (unsafe { context(ctx) }, gid.is_null(), u32::try_from(index))
    else {
        set_errno(libc::EINVAL);
        return -1;
    };
    match gid_at(c, u32::from(port_num), index) {
        Ok(g) => {
            // SAFETY: a non-null out pointer (C contract).
            unsafe {
                gid.write(ibv_gid {
                    raw: g.unwrap_or_default(),
                })
            };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `_ibv_query_gid_ex` (`ibv_query_gid_ex`): the entry with its type,
/// RoCE v2; `ENODATA` for an empty entry, `EINVAL` for a bad port, index,
/// flags or entry size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let Some(c) = (unsafe { context(ctx) }) else {
        return libc::EINVAL;
    };
    if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    match gid_at(c, port_num, gid_index) {
        Ok(Some(g)) => {
            // SAFETY: a non-null entry of at least our size (checked).
            unsafe { entry.write(gid_entry(g, gid_index, port_num)) };
            0
        }
        Ok(None) => libc::ENODATA,
        Err(e) => e,
    }
}

fn gid_entry(g: [u8; 16], index: u32, port: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: ibv_gid { raw: g },
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: 0,
    }
}

/// `_ibv_query_gid_table` (`ibv_query_gid_table`): the valid entries of
/// every port, or a negative errno.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let Some(c) = (unsafe { context(ctx) }) else {
        return -(libc::EINVAL as isize);
    };
    if entries.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let ports = match c.client.query_device() {
        Ok(d) => u32::from(d.phys_port_cnt),
        Err(s) => return -(errno_of(s) as isize),
    };
    let mut n = 0usize;
    for port in 1..=ports {
        let len = match c.client.query_port(port) {
            Ok(p) => p.gid_tbl_len,
            Err(s) => return -(errno_of(s) as isize),
        };
        for index in 0..len {
            if let Ok(Some(g)) = gid_at(c, port, index) {
                if n == max_entries {
                    return -(libc::EINVAL as isize);
                }
                // SAFETY: `entries` holds `max_entries` entries of
                // `entry_size` bytes (C contract); n < max_entries.
                unsafe {
                    entries
                        .cast::<u8>()
                        .add(n * entry_size)
                        .cast::<ibv_gid_entry>()
                        .write_unaligned(gid_entry(g, index, port))
                };
                n += 1;
            }
        }
    }
    n as isize
}

/// `ibv_query_gid_type` (rdma-core's private ABI, used by `ibv_devinfo`):
/// every GID is RoCE v2.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_uint,
    gid_type: *mut c_uint,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let (Some(c), false) = (unsafe { context(ctx) }, gid_type.is_null()) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    match gid_at(c, u32::from(port_num), index) {
        Ok(_) => {
            // SAFETY: a non-null out pointer (C contract).
            unsafe { gid_type.write(IBV_GID_TYPE_SYSFS_ROCE_V2) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `ibv_query_pkey`: the default P_Key (0xFFFF, big-endian) at index 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let (Some(c), false) = (unsafe { context(ctx) }, pkey.is_null()) else {
        return -1;
    };
    if c.client.query_port(u32::from(port_num)).is_err() || index != 0 {
        return -1;
    }
    // SAFETY: a non-null out pointer (C contract).
    unsafe { pkey.write(0xFFFF_u16.to_be()) };
    0
}

/// `ibv_get_pkey_index`: 0 for the default P_Key, -1 otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_pkey_index(
    ctx: *mut ibv_context,
    port_num: u8,
    pkey: u16,
) -> c_int {
    let mut p = 0u16;
    // SAFETY: forwarded (C contract).
    if unsafe { ibv_query_pkey(ctx, port_num, 0, &mut p) } == 0 && p == pkey {
        return 0;
    }
    set_errno(libc::ENOENT);
    -1
}

/// `ibv_get_async_event`: the next asynchronous event of the context
/// (waits while there is none, unless `async_fd` is non-blocking: then -1
/// with `EAGAIN`). `element` is the QP, CQ or SRQ, or the port number.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: a context from `ibv_open_device` (C contract).
    let (Some(c), false) = (unsafe { context(ctx) }, event.is_null()) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    let Some(ev) = &c.async_events else {
        set_errno(libc::EINVAL);
        return -1;
    };
    match ev.take() {
        Ok(e) => {
            let element = if e.user_context != 0 {
                e.user_context as usize as *mut c_void
            } else {
                e.port_num as usize as *mut c_void
            };
            // SAFETY: a non-null out pointer (C contract).
            unsafe {
                event.write(ibv_async_event {
                    element,
                    event_type: int(e.event_type),
                })
            };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `ibv_ack_async_event`: acknowledges an event of a QP, CQ or SRQ to the
/// driver (which refuses to destroy the object until then); port and
/// device events need no acknowledgment.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    // SAFETY: an event from `ibv_get_async_event` (C contract).
    let Some(e) = (unsafe { event.as_ref() }) else {
        return;
    };
    let Ok(kind) = u32::try_from(e.event_type) else {
        return;
    };
    // SAFETY: the element is the program's live object of the event's
    // kind (C contract: it is acknowledged before the object is
    // destroyed).
    let object = unsafe {
        match kind {
            IV_EVENT_CQ_ERR => crate::cq::cq_of(e.element.cast()).map(|(q, c)| (q.out.cq, c)),
            IV_EVENT_SRQ_ERR | IV_EVENT_SRQ_LIMIT_REACHED => qp::srq_handle(e.element.cast()),
            IV_EVENT_QP_FATAL
            | IV_EVENT_QP_REQ_ERR
            | IV_EVENT_QP_ACCESS_ERR
            | IV_EVENT_COMM_EST
            | IV_EVENT_SQ_DRAINED
            | IV_EVENT_PATH_MIG
            | IV_EVENT_PATH_MIG_ERR
            | IV_EVENT_QP_LAST_WQE_REACHED => qp::qp_handle(e.element.cast()),
            _ => None,
        }
    };
    if let Some((handle, c)) = object {
        let _ = c.client.ack_async_event(handle, kind);
    }
}
