//! The INF template (`inf/irpverbs.inx`) against the devices it installs:
//! infverif runs on Windows only, so this test parses the template's
//! sections and checks what Linux can check.
//!
//! - the soft build's device: `Root\irpverbs`, installed with no
//!   interrupt properties (it has no bus resources);
//! - the model build's PCI function: its hardware ID is the one the model
//!   device's configuration space reports (vendor and device ID), and its
//!   install section enables MSI-X with a `MessageNumberLimit` equal to
//!   the device's MSI-X table size, enough for every event queue the
//!   mini-driver connects (the async queue and one per completion vector);
//! - every section an install names exists, and both installs add the
//!   same service with the same KMDF section.

use std::collections::HashMap;

use irpverbs_host::{Backend, HostDevice, HostDeviceConfig};
use irpverbs_model::config::*;
use irpverbs_soft::SoftConfig;

/// The template's sections: lower-cased name to lines (comments and blank
/// lines dropped).
fn parse(text: &str) -> HashMap<String, Vec<String>> {
    let mut sections: HashMap<String, Vec<String>> = HashMap::new();
    let mut current = None;
    for raw in text.lines() {
        // A `;` starts a comment unless it is inside quotes.
        let mut line = String::new();
        let mut quoted = false;
        for c in raw.chars() {
            match c {
                '"' => quoted = !quoted,
                ';' if !quoted => break,
                _ => {}
            }
            line.push(c);
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim().to_ascii_lowercase();
            assert!(
                !sections.contains_key(&name),
                "section [{name}] appears twice"
            );
            sections.insert(name.clone(), Vec::new());
            current = Some(name);
        } else {
            let name = current.as_ref().expect("a line before any section");
            sections.get_mut(name).unwrap().push(line.to_string());
        }
    }
    sections
}

fn inx() -> HashMap<String, Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../inf/irpverbs.inx");
    parse(&std::fs::read_to_string(path).expect("inf/irpverbs.inx"))
}

fn section<'a>(inf: &'a HashMap<String, Vec<String>>, name: &str) -> &'a [String] {
    inf.get(&name.to_ascii_lowercase())
        .unwrap_or_else(|| panic!("no section [{name}]"))
}

/// `key = a, b, c` as (key, [a, b, c]).
fn entry(line: &str) -> Option<(String, Vec<String>)> {
    let (key, value) = line.split_once('=')?;
    let values = value.split(',').map(|v| v.trim().to_string()).collect();
    Some((key.trim().to_string(), values))
}

/// The install section of each hardware ID of the models section.
fn models(inf: &HashMap<String, Vec<String>>) -> HashMap<String, String> {
    let manufacturer = section(inf, "Manufacturer");
    let (_, decorations) = entry(&manufacturer[0]).expect("a manufacturer");
    let name = format!("{}.{}", decorations[0], decorations[1]);
    // stampinf's $ARCH$ stays as written in the template.
    section(inf, &name)
        .iter()
        .map(|l| {
            let (_, v) = entry(l).expect("a model line");
            (v[1].to_ascii_uppercase(), v[0].clone())
        })
        .collect()
}

/// The values an AddReg section sets under `key` (value name to value).
fn reg_values(lines: &[String], key: &str) -> HashMap<String, (u32, String)> {
    let mut out = HashMap::new();
    for line in lines {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        assert_eq!(fields[0], "HKR", "{line}");
        if fields[1].trim_matches('"') != key || fields.len() < 5 {
            continue;
        }
        let flags = fields[3].trim_start_matches("0x");
        let flags = u32::from_str_radix(flags, 16).expect("hex flags");
        out.insert(fields[2].to_string(), (flags, fields[4].to_string()));
    }
    out
}

fn add_reg(inf: &HashMap<String, Vec<String>>, install: &str) -> Vec<String> {
    let hw = section(inf, &format!("{install}.NT.HW"));
    let (key, names) = entry(&hw[0]).expect("AddReg");
    assert_eq!(key, "AddReg");
    names
        .iter()
        .flat_map(|n| section(inf, n).iter().cloned())
        .collect()
}

const MSI: &str = r"Interrupt Management\MessageSignaledInterruptProperties";
/// FLG_ADDREG_TYPE_DWORD.
const DWORD: u32 = 0x0001_0001;

#[test]
fn both_installs_are_complete_and_add_the_same_service() {
    let inf = inx();
    let models = models(&inf);
    assert_eq!(models.len(), 2, "{models:?}");
    for install in models.values() {
        for part in ["NT", "NT.HW", "NT.Services", "NT.Wdf"] {
            section(&inf, &format!("{install}.{part}"));
        }
        let copy = entry(&section(&inf, &format!("{install}.NT"))[0]).unwrap();
        assert_eq!(copy.0, "CopyFiles");
        assert_eq!(section(&inf, &copy.1[0]), ["irpverbs.sys"]);
        let service = entry(&section(&inf, &format!("{install}.NT.Services"))[0]).unwrap();
        assert_eq!(service.0, "AddService");
        assert_eq!(service.1[0], "irpverbs");
        section(&inf, &service.1[2]);
        let wdf = entry(&section(&inf, &format!("{install}.NT.Wdf"))[0]).unwrap();
        assert_eq!(wdf.1, ["irpverbs", "irpverbs_wdfsect"]);
        // Every AddReg section exists (add_reg panics otherwise), and
        // the device is for SYSTEM and administrators only.
        let regs = add_reg(&inf, install);
        assert!(regs.iter().any(|l| l.contains("Security")), "{install}");
    }
}

#[test]
fn the_soft_device_is_root_enumerated_without_interrupts() {
    let inf = inx();
    let models = models(&inf);
    let install = &models[r"ROOT\IRPVERBS"];
    let regs = add_reg(&inf, install);
    assert!(reg_values(&regs, MSI).is_empty(), "{regs:?}");
}

#[test]
fn the_pci_id_and_msix_limit_are_the_model_devices() {
    let dev = HostDevice::new(HostDeviceConfig {
        backend: Backend::Model,
        soft: SoftConfig {
            num_comp_vectors: irpverbs_soft::MAX_COMP_VECTORS,
            ..SoftConfig::default()
        },
        ..HostDeviceConfig::default()
    })
    .expect("a model device");
    let (hca, silicon) = dev.model().expect("the model");
    // The hardware ID from the device's configuration space.
    let vendor = silicon.read_config(CFG_VENDOR_ID, 2);
    let device = silicon.read_config(CFG_DEVICE_ID, 2);
    let id = format!(r"PCI\VEN_{vendor:04X}&DEV_{device:04X}");
    assert_eq!(id, r"PCI\VEN_FFFE&DEV_0001");
    let inf = inx();
    let models = models(&inf);
    let install = models
        .get(&id)
        .unwrap_or_else(|| panic!("{id} is not in the models section: {models:?}"));

    // MSI-X on, and as many messages as the device's MSI-X table has.
    let regs = add_reg(&inf, install);
    let msi = reg_values(&regs, MSI);
    assert_eq!(msi["MSISupported"], (DWORD, "1".into()));
    let (flags, limit) = &msi["MessageNumberLimit"];
    assert_eq!(*flags, DWORD);
    let limit: u16 = limit.parse().expect("a decimal limit");
    let cap = silicon.read_config(CFG_CAPABILITIES, 1) as usize;
    let space: Vec<u8> = (0..CONFIG_LEN)
        .map(|o| silicon.read_config(o, 1) as u8)
        .collect();
    assert_eq!(msix_table_size(&space, cap), Some(limit));
    // Enough for the mini-driver at its most: the async event queue and
    // one per completion vector.
    assert_eq!(limit, 1 + MAX_COMP_VECTORS);
    assert_eq!(hca.event_queues(), limit);
    assert_eq!(
        u32::from(limit),
        1 + irpverbs_core::Hca::comp_event_queues(&**hca)
    );
    dev.unload();
}
