//! The driver's registry parameters: the per-file quotas
//! ([`irpverbs_core::FileQuota`]), `REG_DWORD`s under
//! `HKLM\System\CurrentControlSet\Services\irpverbs\Parameters`, which the
//! INF (`inf/irpverbs.inx`) fills with the defaults. Read once, at device
//! add; a value that is missing or not a `REG_DWORD` keeps its default.
//!
//! IRQL: PASSIVE_LEVEL (`WdfDriverOpenParametersRegistryKey` and
//! `WdfRegistryQueryULong` require it).

use irpverbs_abi::nt_success;
use irpverbs_core::{DeviceConfig, FileQuota};
use wdk_sys::{ULONG, UNICODE_STRING, WDFDRIVER, WDFKEY, call_unsafe_wdf_function_binding};

/// `KEY_READ` from `winnt.h`: `(STANDARD_RIGHTS_READ | KEY_QUERY_VALUE |
/// KEY_ENUMERATE_SUB_KEYS | KEY_NOTIFY) & ~SYNCHRONIZE`, a macro bindgen
/// does not evaluate.
const KEY_READ: ULONG = 0x0002_0019;

/// A short name in UTF-16 and the `UNICODE_STRING` over it.
pub(crate) struct WideName {
    buffer: [u16; 32],
    len: usize,
}

impl WideName {
    /// `name`, cut at 32 UTF-16 units.
    pub(crate) fn new(name: &str) -> Self {
        let mut this = Self {
            buffer: [0; 32],
            len: 0,
        };
        for c in name.encode_utf16() {
            this.push(c);
        }
        this
    }

    /// Appends one unit (dropped when full).
    pub(crate) fn push(&mut self, c: u16) {
        if let Some(slot) = self.buffer.get_mut(self.len) {
            *slot = c;
            self.len += 1;
        }
    }

    /// A UNICODE_STRING over the buffer; valid while `self` is borrowed.
    pub(crate) fn unicode_string(&mut self) -> UNICODE_STRING {
        let bytes = u16::try_from(self.len * 2).unwrap_or(u16::MAX);
        UNICODE_STRING {
            Length: bytes,
            MaximumLength: bytes,
            Buffer: self.buffer.as_mut_ptr(),
        }
    }
}

/// The device's configuration from the driver's `Parameters` key: the
/// defaults, with each quota value the key holds.
pub(crate) fn device_config(driver: WDFDRIVER) -> DeviceConfig {
    let mut config = DeviceConfig::default();
    let mut key: WDFKEY = core::ptr::null_mut();
    // SAFETY: `driver` is the framework's driver object (EvtDriverDeviceAdd's
    // argument); no attributes (WDF_NO_OBJECT_ATTRIBUTES); `key` receives
    // the opened key.
    let status = unsafe {
        call_unsafe_wdf_function_binding!(
            WdfDriverOpenParametersRegistryKey,
            driver,
            KEY_READ,
            core::ptr::null_mut(),
            &raw mut key
        )
    };
    if !nt_success(status) {
        // No Parameters key (installed without the INF): the defaults.
        return config;
    }
    read_quota(key, &mut config.quota);
    // SAFETY: `key` was opened above and is closed once.
    unsafe { call_unsafe_wdf_function_binding!(WdfRegistryClose, key) };
    config
}

/// Reads every quota value `key` holds into `quota`.
fn read_quota(key: WDFKEY, quota: &mut FileQuota) {
    for name in FileQuota::REGISTRY_NAMES {
        let mut wide = WideName::new(name);
        let text = wide.unicode_string();
        let mut value: ULONG = 0;
        // SAFETY: `key` is open for reading; `text` points into `wide`,
        // which outlives the call; `value` receives the DWORD.
        let status = unsafe {
            call_unsafe_wdf_function_binding!(
                WdfRegistryQueryULong,
                key,
                &raw const text,
                &raw mut value
            )
        };
        if nt_success(status) {
            quota.set_registry_value(name, value);
        }
    }
}
