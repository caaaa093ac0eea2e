//! `irpverbs port down|up`: the soft HCA's link model in host mode. The
//! command loads the driver over a soft HCA in this process, opens it as a
//! ULP does, takes port 1's link down (or, for `up`, down and up again: a
//! new device's port is up), and reports what a ULP sees: each async event
//! (`IOCTL_IV_GET_ASYNC_EVENT`) and the port as `devinfo` prints it.
//! See docs/port-state.md.

use std::fmt::Write;

use irpverbs_abi::*;
use irpverbs_host::{Engine, HostDevice, HostDeviceConfig};
use irpverbs_verbs::Client;

/// What to do to the port's link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortAction {
    /// Take it down.
    Down,
    /// Bring it up (after taking it down).
    Up,
}

fn event_name(t: u32) -> &'static str {
    match t {
        IV_EVENT_PORT_ACTIVE => "PORT_ACTIVE",
        IV_EVENT_PORT_ERR => "PORT_ERR",
        IV_EVENT_DEVICE_FATAL => "DEVICE_FATAL",
        _ => "other",
    }
}

/// Runs `action` on a new host device's port 1 (firmware per `engine`);
/// the report.
///
/// # Errors
/// A verb's status, named.
pub fn run(action: PortAction, engine: Engine) -> Result<String, String> {
    let dev = HostDevice::new(HostDeviceConfig {
        engine,
        ..HostDeviceConfig::default()
    })
    .map_err(|s| format!("device: {}", status_name(s)))?;
    let file = dev
        .open(FILE_READ_ACCESS | FILE_WRITE_ACCESS)
        .map_err(|s| status_name(s).to_string())?;
    let c = Client::new(Box::new(file));
    let mut out = String::new();
    let steps: &[bool] = match action {
        PortAction::Down => &[false],
        PortAction::Up => &[false, true],
    };
    for &up in steps {
        let changed = dev.set_port_link(up);
        let ev = c
            .get_async_event()
            .map_err(|s| status_name(s).to_string())?;
        let _ = writeln!(
            out,
            "port 1 link {}: {}; async event {} ({}) on port {}",
            if up { "up" } else { "down" },
            if changed { "changed" } else { "unchanged" },
            event_name(ev.event_type),
            ev.event_type,
            ev.port_num
        );
    }
    let info = irpverbs_verbs::devinfo::devinfo(&c, "irpverbs0", true)
        .map_err(|s| status_name(s).to_string())?;
    for line in info.lines().filter(|l| {
        let l = l.trim_start();
        l.starts_with("port:") || l.starts_with("state:") || l.starts_with("phys_state:")
    }) {
        let _ = writeln!(out, "{line}");
    }
    drop(c);
    dev.unload();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_reports_port_err_and_a_disabled_port() {
        let r = run(PortAction::Down, Engine::Inline).unwrap();
        assert!(r.contains("async event PORT_ERR (10) on port 1"), "{r}");
        assert!(r.contains("PORT_DOWN (1)"), "{r}");
        assert!(r.contains("DISABLED (3)"), "{r}");
    }

    #[test]
    fn up_reports_port_active_and_an_active_port() {
        let r = run(PortAction::Up, Engine::Thread).unwrap();
        assert!(r.contains("async event PORT_ERR (10)"), "{r}");
        assert!(r.contains("async event PORT_ACTIVE (9) on port 1"), "{r}");
        assert!(r.contains("PORT_ACTIVE (4)"), "{r}");
        assert!(r.contains("LINK_UP (5)"), "{r}");
    }
}
