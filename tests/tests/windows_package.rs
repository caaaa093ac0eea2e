//! What can be checked on Linux about the Windows driver, which cannot be
//! built here (`driver/kmdf`, `inf/irpverbs.inx`, `tests/windows-runner`):
//!
//! - the INF template has every section and key installation needs, and
//!   its `[Strings]` defines every `%token%` it uses;
//! - the KMDF crate's manifest is a KMDF cdylib that aborts on panic, in its
//!   own workspace, which the root workspace excludes;
//! - the device interface GUID is the same in the crate and the README;
//! - the KMDF glue calls every `irpverbs_core::Device` entry point the host
//!   device calls: both are the same mapping of the same driver;
//! - user-mode doorbell pages are scanned by both layers (host mode's
//!   doorbell thread, irpverbs.sys's high-resolution timer, started in
//!   D0Entry and stopped in D0Exit), and mapped with the rings' MDLs.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf()
}

fn read(path: &str) -> String {
    let full = repo().join(path);
    fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

// ------------------------------------------------------------------ INF

/// An INF, parsed the way SetupAPI reads one: `[section]` headers (names
/// case-insensitive), lines of `key = value` or bare values, `;` comments
/// outside double quotes, values split on commas.
#[derive(Debug, Default)]
struct Inf {
    /// Section name (lowercased) -> its lines, in order.
    sections: BTreeMap<String, Vec<InfLine>>,
    /// Sections seen more than once.
    duplicates: Vec<String>,
}

#[derive(Debug, Clone)]
struct InfLine {
    /// The key, if the line has one (`key = ...`), as written.
    key: Option<String>,
    /// The comma-separated fields of the value, trimmed, quotes kept.
    fields: Vec<String>,
    /// The raw line (comment stripped).
    raw: String,
}

fn strip_comment(line: &str) -> &str {
    let mut quoted = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ';' if !quoted => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Splits on `sep` outside double quotes.
fn split_unquoted(s: &str, sep: char, limit: usize) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted && parts.len() + 1 < limit {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

impl Inf {
    fn parse(text: &str) -> Self {
        let mut inf = Inf::default();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let line = strip_comment(line).trim();
            if line.is_empty() {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                let name = name.trim().to_ascii_lowercase();
                if inf.sections.contains_key(&name) {
                    inf.duplicates.push(name.clone());
                }
                inf.sections.entry(name.clone()).or_default();
                current = Some(name);
                continue;
            }
            let section = current
                .as_ref()
                .unwrap_or_else(|| panic!("line outside any section: {line}"));
            let kv = split_unquoted(line, '=', 2);
            let (key, value) = match kv.as_slice() {
                [k, v] => (Some(k.trim().to_owned()), *v),
                _ => (None, line),
            };
            let fields = split_unquoted(value, ',', usize::MAX)
                .into_iter()
                .map(|f| f.trim().to_owned())
                .collect();
            inf.sections
                .get_mut(section)
                .expect("current section exists")
                .push(InfLine {
                    key,
                    fields,
                    raw: line.to_owned(),
                });
        }
        inf
    }

    fn section(&self, name: &str) -> &[InfLine] {
        self.sections
            .get(&name.to_ascii_lowercase())
            .unwrap_or_else(|| panic!("INF has no [{name}] section"))
    }

    fn has_section(&self, name: &str) -> bool {
        self.sections.contains_key(&name.to_ascii_lowercase())
    }

    /// The fields of `key` in `section` (keys are case-insensitive).
    fn get(&self, section: &str, key: &str) -> &[String] {
        self.section(section)
            .iter()
            .find(|l| {
                l.key
                    .as_deref()
                    .is_some_and(|k| k.eq_ignore_ascii_case(key))
            })
            .map(|l| l.fields.as_slice())
            .unwrap_or_else(|| panic!("[{section}] has no {key}"))
    }

    /// The single value of `key` in `section`, unquoted.
    fn value(&self, section: &str, key: &str) -> String {
        let fields = self.get(section, key);
        assert_eq!(fields.len(), 1, "[{section}] {key} = {fields:?}");
        fields[0].trim_matches('"').to_owned()
    }

    /// `%token%` strings named anywhere (DIRIDs such as `%13%` excluded).
    fn tokens(&self) -> BTreeSet<String> {
        let mut tokens = BTreeSet::new();
        for (name, lines) in &self.sections {
            if name == "strings" {
                continue;
            }
            for line in lines {
                let mut rest = line.raw.as_str();
                while let Some(start) = rest.find('%') {
                    let after = &rest[start + 1..];
                    let Some(end) = after.find('%') else {
                        panic!("unterminated %token% in [{name}]: {}", line.raw)
                    };
                    let token = &after[..end];
                    if !token.is_empty() && !token.chars().all(|c| c.is_ascii_digit()) {
                        tokens.insert(token.to_ascii_lowercase());
                    }
                    rest = &after[end + 1..];
                }
            }
        }
        tokens
    }

    /// Resolves `%token%` through [Strings].
    fn resolve(&self, value: &str) -> String {
        match value.strip_prefix('%').and_then(|v| v.strip_suffix('%')) {
            Some(token) if !token.chars().all(|c| c.is_ascii_digit()) => {
                self.value("Strings", token)
            }
            _ => value.to_owned(),
        }
    }
}

fn inx() -> Inf {
    let inf = Inf::parse(&read("inf/irpverbs.inx"));
    assert!(
        inf.duplicates.is_empty(),
        "duplicate sections: {:?}",
        inf.duplicates
    );
    inf
}

fn is_guid(s: &str) -> bool {
    let Some(inner) = s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
        return false;
    };
    let groups: Vec<&str> = inner.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[test]
fn inx_version_section() {
    let inf = inx();
    assert!(
        inf.value("Version", "Signature")
            .eq_ignore_ascii_case("$WINDOWS NT$")
    );
    assert_eq!(inf.value("Version", "Class"), "InfiniBand");
    let class_guid = inf.value("Version", "ClassGuid");
    assert!(is_guid(&class_guid), "ClassGuid {class_guid}");
    assert_eq!(
        class_guid.to_ascii_lowercase(),
        "{30ef7132-d858-4a0c-ac24-b9028a5cca3f}",
        "GUID_DEVCLASS_INFINIBAND"
    );
    assert!(!inf.resolve(&inf.value("Version", "Provider")).is_empty());
    assert_eq!(inf.value("Version", "CatalogFile"), "irpverbs.cat");
    assert!(!inf.get("Version", "DriverVer").is_empty());
    assert_eq!(inf.value("Version", "PnpLockdown"), "1");
}

/// Manufacturer -> models (per decoration) -> the install section for
/// `Root\irpverbs`.
fn install_section(inf: &Inf) -> String {
    let manufacturer = inf.section("Manufacturer");
    assert_eq!(manufacturer.len(), 1, "one manufacturer");
    let fields = &manufacturer[0].fields;
    let models = &fields[0];
    let decorations = &fields[1..];
    assert!(
        !decorations.is_empty() && decorations.iter().all(|d| d.starts_with("NT$ARCH$")),
        "models decorated with NT$ARCH$: {decorations:?}"
    );
    let mut install = None;
    for decoration in decorations {
        let section = format!("{models}.{decoration}");
        let entry = inf
            .section(&section)
            .iter()
            .find(|l| {
                l.fields[1..]
                    .iter()
                    .any(|id| id.eq_ignore_ascii_case(r"Root\irpverbs"))
            })
            .unwrap_or_else(|| panic!("[{section}] has no Root\\irpverbs model"));
        let description = entry.key.as_deref().expect("a model has a description");
        assert!(!inf.resolve(description).is_empty());
        install = Some(entry.fields[0].clone());
    }
    install.expect("a models section")
}

#[test]
fn inx_models_install_and_files() {
    let inf = inx();
    let install = install_section(&inf);
    let ddinstall = format!("{install}.NT");
    let copy_files = inf.get(&ddinstall, "CopyFiles");
    let mut copied = BTreeSet::new();
    for section in copy_files {
        for line in inf.section(section) {
            copied.insert(line.fields[0].to_ascii_lowercase());
        }
    }
    assert!(copied.contains("irpverbs.sys"), "CopyFiles: {copied:?}");
    // The files come from a declared disk, into the driver store.
    let sources: BTreeMap<String, String> = inf
        .section("SourceDisksFiles")
        .iter()
        .map(|l| {
            (
                l.key.clone().expect("file = disk").to_ascii_lowercase(),
                l.fields[0].clone(),
            )
        })
        .collect();
    let disks: BTreeSet<String> = inf
        .section("SourceDisksNames")
        .iter()
        .map(|l| l.key.clone().expect("disk = name"))
        .collect();
    for file in &copied {
        let disk = sources
            .get(file)
            .unwrap_or_else(|| panic!("{file} not in [SourceDisksFiles]"));
        assert!(disks.contains(disk), "{file} on undeclared disk {disk}");
    }
    assert_eq!(inf.value("DestinationDirs", "DefaultDestDir"), "13");
}

#[test]
fn inx_service_and_kmdf_sections() {
    let inf = inx();
    let install = install_section(&inf);
    let add_service = inf.get(&format!("{install}.NT.Services"), "AddService");
    assert_eq!(add_service[0], "irpverbs", "service name");
    let flags = inf.resolve(&add_service[1]);
    let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).expect("hex flags");
    assert_ne!(
        flags & 0x2,
        0,
        "SPSVCINST_ASSOCSERVICE: the device's function driver"
    );
    let service = &add_service[2];
    assert_eq!(
        inf.value(service, "ServiceType"),
        "1",
        "SERVICE_KERNEL_DRIVER"
    );
    assert_eq!(inf.value(service, "StartType"), "3", "SERVICE_DEMAND_START");
    assert_eq!(
        inf.value(service, "ErrorControl"),
        "1",
        "SERVICE_ERROR_NORMAL"
    );
    assert!(
        inf.value(service, "ServiceBinary")
            .eq_ignore_ascii_case(r"%13%\irpverbs.sys")
    );
    assert!(!inf.resolve(&inf.value(service, "DisplayName")).is_empty());

    let kmdf = inf.get(&format!("{install}.NT.Wdf"), "KmdfService");
    assert_eq!(kmdf[0], "irpverbs", "KmdfService names the service");
    assert_eq!(
        inf.value(&kmdf[1], "KmdfLibraryVersion"),
        "$KMDFVERSION$",
        "stampinf fills in the KMDF version"
    );
}

#[test]
fn inx_strings_define_every_token() {
    let inf = inx();
    let defined: BTreeSet<String> = inf
        .section("Strings")
        .iter()
        .map(|l| l.key.clone().expect("token = string").to_ascii_lowercase())
        .collect();
    let used = inf.tokens();
    let missing: Vec<&String> = used.difference(&defined).collect();
    assert!(missing.is_empty(), "[Strings] lacks {missing:?}");
    let unused: Vec<&String> = defined.difference(&used).collect();
    assert!(unused.is_empty(), "[Strings] defines unused {unused:?}");
}

#[test]
fn inf_parser_reads_quotes_comments_and_tokens() {
    let inf = Inf::parse(
        "[A]\nk = \"x;y\", 2 ; note\nbare.sys\nHKR,,Security,,\"D:P(A;;GA;;;SY)\"\n[B]\nv = %Tok%, %13%\\f\n",
    );
    assert_eq!(inf.get("a", "K"), ["\"x;y\"", "2"]);
    assert_eq!(inf.section("A")[1].fields, ["bare.sys"]);
    assert_eq!(inf.section("A")[2].fields[4], "\"D:P(A;;GA;;;SY)\"");
    assert_eq!(inf.tokens(), BTreeSet::from(["tok".to_owned()]));
}

// ------------------------------------------------------------------ manifests

/// The body of `[table]` in a TOML file: the lines up to the next header.
fn toml_table<'a>(text: &'a str, table: &str) -> Option<&'a str> {
    let header = format!("[{table}]");
    let start = text
        .lines()
        .scan(0usize, |offset, line| {
            let here = *offset;
            *offset += line.len() + 1;
            Some((here, line))
        })
        .find(|(_, line)| line.trim() == header)
        .map(|(offset, line)| offset + line.len() + 1)?;
    let body = &text[start.min(text.len())..];
    let end = body
        .lines()
        .scan(0usize, |offset, line| {
            let here = *offset;
            *offset += line.len() + 1;
            Some((here, line))
        })
        .find(|(_, line)| line.trim_start().starts_with('['))
        .map_or(body.len(), |(offset, _)| offset);
    Some(&body[..end])
}

/// `key = value` in a table body, value as written (quotes kept).
fn toml_value<'a>(body: &'a str, key: &str) -> Option<&'a str> {
    body.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.split('#').next().unwrap_or(v).trim())
    })
}

#[test]
fn kmdf_manifest_is_a_kmdf_driver_in_its_own_workspace() {
    let manifest = read("driver/kmdf/Cargo.toml");
    let table = |name: &str| {
        toml_table(&manifest, name)
            .unwrap_or_else(|| panic!("driver/kmdf/Cargo.toml has no [{name}]"))
    };
    assert_eq!(
        toml_value(table("package"), "name"),
        Some("\"irpverbs-kmdf\"")
    );
    let lib = table("lib");
    assert_eq!(toml_value(lib, "crate-type"), Some("[\"cdylib\"]"));
    assert_eq!(
        toml_value(lib, "name"),
        Some("\"irpverbs\""),
        "the binary is irpverbs.sys, the INF's service binary"
    );
    for profile in ["profile.dev", "profile.release"] {
        assert_eq!(
            toml_value(table(profile), "panic"),
            Some("\"abort\""),
            "[{profile}]"
        );
    }
    let model = table("package.metadata.wdk.driver-model");
    assert_eq!(toml_value(model, "driver-type"), Some("\"KMDF\""));
    assert_eq!(toml_value(model, "kmdf-version-major"), Some("1"));
    let minor = toml_value(model, "target-kmdf-version-minor").expect("a KMDF minor version");
    assert_eq!(
        minor, "31",
        "KMDF 1.31: Windows 10 2004, as the README and the INF state"
    );
    assert!(
        read("README.md").contains("1.31 (`target-kmdf-version-minor = 31`)"),
        "the README states the KMDF version"
    );
    assert!(
        inx().has_section("Irpverbs.NT$ARCH$.10.0...19041"),
        "the INF's models require Windows 10 2004 (build 19041), KMDF 1.31's floor"
    );
    assert!(
        toml_table(&manifest, "workspace").is_some(),
        "driver/kmdf is its own workspace"
    );
    for dep in ["wdk", "wdk-sys", "wdk-panic"] {
        assert!(
            toml_value(table("dependencies"), dep).is_some(),
            "depends on {dep}"
        );
    }
    for dep in [
        "irpverbs-abi",
        "irpverbs-core",
        "irpverbs-soft",
        "irpverbs-kalloc",
    ] {
        let value = toml_value(table("dependencies"), dep).unwrap_or_default();
        assert!(value.contains("path = \"../"), "{dep} by path: {value}");
    }
    assert!(toml_value(table("build-dependencies"), "wdk-build").is_some());
    // wdk_build::configure_wdk_binary_build(), spelled out so that the
    // shim can be compiled with the same configuration.
    let build = read("driver/kmdf/build.rs");
    assert!(
        build.contains("wdk_build::Config::from_env_auto()?")
            && build.contains("config.configure_binary_build()")
    );
    assert!(
        read("driver/kmdf/.cargo/config.toml").contains("target-feature=+crt-static"),
        "static CRT"
    );
    let makefile = read("driver/kmdf/Makefile.toml");
    assert!(makefile.contains("extend = \"target/rust-driver-makefile.toml\""));
    assert!(makefile.contains("load_rust_driver_makefile()"));
    assert!(makefile.contains("CARGO_MAKE_CRATE_FS_NAME = \"irpverbs\""));
    assert!(makefile.contains("/../../inf/irpverbs.inx"));
}

#[test]
fn root_workspace_excludes_the_driver_and_builds_the_runner() {
    let manifest = read("Cargo.toml");
    let workspace = toml_table(&manifest, "workspace").expect("root [workspace]");
    assert_eq!(
        toml_value(workspace, "exclude"),
        Some("[\"driver/kmdf\", \"driver/soft/fuzz\", \"driver/cm/fuzz\"]"),
        "Linux builds never see the KMDF crate (nor the fuzz targets, which need libFuzzer)"
    );
    let members_start = workspace.find("members").expect("members");
    let members = &workspace[members_start
        ..workspace[members_start..]
            .find(']')
            .map_or(workspace.len(), |e| members_start + e)];
    assert!(!members.contains("driver/kmdf"), "members: {members}");
    assert!(
        members.contains("\"tests/windows-runner\""),
        "members: {members}"
    );

    let runner = read("tests/windows-runner/Cargo.toml");
    let windows = toml_table(&runner, "target.'cfg(windows)'.dependencies")
        .expect("the runner's Windows-only dependencies");
    assert!(toml_value(windows, "windows-sys").is_some());
    assert!(
        toml_value(
            toml_table(&runner, "dependencies").expect("[dependencies]"),
            "windows-sys"
        )
        .is_none(),
        "windows-sys only on Windows"
    );
}

// ------------------------------------------------------------------ GUID

/// `GUID_DEVINTERFACE_IRPVERBS` as the crate spells it (its `Data1` ..
/// `Data4` fields), formatted `{xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx}`.
fn crate_interface_guid(lib_rs: &str) -> String {
    let start = lib_rs
        .find("pub const GUID_DEVINTERFACE_IRPVERBS: GUID = GUID {")
        .expect("the crate defines GUID_DEVINTERFACE_IRPVERBS");
    let body = &lib_rs[start..start + lib_rs[start..].find("};").expect("end of the GUID")];
    let number = |s: &str| {
        let s = s.trim().replace('_', "");
        let hex = s.strip_prefix("0x").expect("hex literal");
        u32::from_str_radix(hex, 16).expect("hex literal")
    };
    let field = |name: &str| {
        let at = body.find(&format!("{name}:")).expect(name) + name.len() + 1;
        let rest = &body[at..];
        rest[..rest.find(",\n").expect("field end")]
            .trim()
            .to_owned()
    };
    let data4: Vec<u32> = field("Data4")
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split(',')
        .map(number)
        .collect();
    assert_eq!(data4.len(), 8);
    format!(
        "{{{:08x}-{:04x}-{:04x}-{:02x}{:02x}-{}}}",
        number(&field("Data1")),
        number(&field("Data2")),
        number(&field("Data3")),
        data4[0],
        data4[1],
        data4[2..]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    )
}

#[test]
fn device_interface_guid_agrees() {
    let lib_rs = read("driver/kmdf/src/lib.rs");
    let guid = crate_interface_guid(&lib_rs);
    assert!(is_guid(&guid), "{guid}");
    assert!(
        lib_rs.contains(&format!("`{guid}`")),
        "the crate's doc comment names {guid}"
    );
    assert!(
        read("README.md").contains(&format!("`GUID_DEVINTERFACE_IRPVERBS` = `{guid}`")),
        "the README names the crate's interface GUID {guid}"
    );
}

// ------------------------------------------------------------------ same mapping

/// The entry points of `irpverbs_core::Device` an OS layer calls.
const ENTRY_POINTS: [&str; 9] = [
    "create_file",
    "cleanup_file",
    "owner_exited",
    "close_file",
    "in_caller_context",
    "dispatch_ioctl",
    "dpc",
    "cancel",
    "remove",
];

/// Rust source without `//` comments (doc comments included), so that
/// only code counts.
fn code_of(source: &str) -> String {
    source
        .lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The entry points called on a core `Device` in `code`: `<recv>.name(`
/// where the receiver is one of `receivers` (the names each layer gives its
/// `Device`).
fn calls(code: &str, receivers: &[&str]) -> BTreeSet<&'static str> {
    ENTRY_POINTS
        .into_iter()
        .filter(|name| {
            receivers.iter().any(|recv| {
                code.match_indices(&format!("{recv}.{name}("))
                    .any(|(at, _)| {
                        // A whole identifier: `device.dpc(`, not `other_device.dpc(`.
                        code[..at]
                            .chars()
                            .next_back()
                            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                    })
            })
        })
        .collect()
}

#[test]
fn kmdf_glue_is_the_host_devices_mapping() {
    let core = code_of(&(read("driver/core/src/device.rs") + &read("driver/core/src/maps.rs")));
    for name in ENTRY_POINTS {
        assert!(
            core.contains(&format!("pub fn {name}(")),
            "irpverbs_core::Device has no pub fn {name}"
        );
    }
    let host = code_of(&(read("driver/host/src/device.rs") + &read("driver/host/src/process.rs")));
    // The host names its Device `device` (a field) and `d` (upgraded weak).
    let host_calls = calls(&host, &["device", "d"]);
    assert!(
        host_calls.len() >= 6,
        "the host device's calls were not found (renamed?): {host_calls:?}"
    );
    assert!(
        host.contains("Device::with_config("),
        "host builds the core device with its configuration"
    );

    let kmdf = code_in("driver/kmdf/src");
    // The KMDF glue reaches its Device as `state.device`.
    let kmdf_calls = calls(&kmdf, &["device"]);
    let missing: Vec<&&str> = host_calls.difference(&kmdf_calls).collect();
    assert!(
        missing.is_empty(),
        "the host device calls {missing:?}, the KMDF glue does not"
    );
    let all: BTreeSet<&str> = ENTRY_POINTS.into_iter().collect();
    assert_eq!(kmdf_calls, all, "the KMDF glue calls every entry point");
    assert!(
        kmdf.contains("Device::with_config(") && kmdf.contains("registry::device_config("),
        "the KMDF glue builds the core device with the registry's configuration"
    );
    assert!(
        kmdf.contains("impl SoftBus for KmdfSoftBus")
            && kmdf.contains("self.bus.interrupt();")
            && kmdf.contains("WdfDpcEnqueue"),
        "the soft HCA's interrupt queues the DPC"
    );
    assert!(
        kmdf.contains("impl InterruptHandler for Message")
            && kmdf.contains("0 => state.device.dpc(),")
            && kmdf.contains("m => state.device.comp_dpc(u32::from(m) - 1),"),
        "the model's MSI-X messages run the device's DPCs"
    );
}

// ------------------------------------------------------------------ kernel table

/// The hex numbers of `text` in order (`0x17EE_45AE`, `0xE023u`, ...).
fn hex_numbers(text: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("0x") {
        let digits: String = rest[at + 2..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || *c == '_')
            .filter(|c| *c != '_')
            .collect();
        out.push(u64::from_str_radix(&digits, 16).expect("hex literal"));
        rest = &rest[at + 2 + digits.len()..];
    }
    out
}

/// The text from `start` to the first `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let at = text.find(start).unwrap_or_else(|| panic!("no {start:?}"));
    let rest = &text[at..];
    &rest[..rest
        .find(end)
        .unwrap_or_else(|| panic!("no {end:?} after {start:?}"))]
}

#[test]
fn kernel_interface_guid_agrees() {
    let table = read("driver/kernel-table/src/kernel.rs");
    let header = read("include/irpverbs_kernel.h");
    let ours = hex_numbers(between(&table, "pub const IV_KERNEL_INTERFACE_GUID", ");"));
    let c = hex_numbers(between(
        &header,
        "#define IV_KERNEL_INTERFACE_GUID_INIT",
        "} }",
    ));
    assert_eq!(ours.len(), 11, "{ours:x?}");
    assert_eq!(ours, c, "the table's GUID is the header's");
    // The driver's GUID is built from the table crate's constant, not
    // written out again.
    let kmdf = read("driver/kmdf/src/kernel.rs");
    let guid = code_of(between(
        &kmdf,
        "pub const GUID_IV_KERNEL_INTERFACE: GUID = GUID {",
        "};",
    ));
    for (field, part) in [("Data1", 0), ("Data2", 1), ("Data3", 2), ("Data4", 3)] {
        assert!(
            guid.contains(&format!("{field}: IV_KERNEL_INTERFACE_GUID.{part},")),
            "{field} comes from irpverbs_kernel_table: {guid}"
        );
    }
    assert!(kmdf.contains("`{17EE45AE-E023-4F3B-81FC-6784694953D3}`"));
    // Registered for IRP_MN_QUERY_INTERFACE.
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    assert!(device.contains("WdfDeviceAddQueryInterface"));
    assert!(device.contains("GUID_IV_KERNEL_INTERFACE"));
}

/// The `.rs` files under `dir` and its folders.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Every `.rs` file under `dir` (and its folders), concatenated, comments
/// removed.
fn code_in(dir: &str) -> String {
    let mut code = String::new();
    for path in rust_files(&repo().join(dir)) {
        code.push_str(&code_of(&fs::read_to_string(&path).expect("source")));
        code.push('\n');
    }
    code
}

#[test]
fn there_is_one_kernel_table_and_the_driver_uses_it() {
    // The table lives in the no_std crate, once.
    let table = code_of(&read("driver/kernel-table/src/kernel.rs"));
    assert!(table.contains("pub struct IvKernelInterface {"));
    assert!(table.contains("pub fn interface<D, P>("));
    assert!(read("driver/kernel-table/src/lib.rs").contains("#![no_std]"));
    // The driver and the verbs library use it; neither defines one.
    let kmdf = code_in("driver/kmdf/src");
    let verbs = code_in("ulp/verbs/src");
    for (name, code) in [("driver/kmdf", &kmdf), ("ulp/verbs", &verbs)] {
        assert!(
            !code.contains("struct IvKernelInterface")
                && !code.contains("extern \"C\" fn post_send("),
            "{name} has a table of its own"
        );
    }
    assert!(kmdf.contains("irpverbs_kernel_table::kernel::{"));
    assert!(kmdf.contains("let table = interface_with_cm(") && kmdf.contains("HcaDoorbells {"));
    assert!(verbs.contains("pub use irpverbs_kernel_table::kernel;"));
    let manifest = read("driver/kmdf/Cargo.toml");
    assert!(manifest.contains("irpverbs-kernel-table = { path = \"../kernel-table\" }"));
}

#[test]
fn user_memory_goes_through_the_seh_shim() {
    let shim = read("driver/kmdf/src/seh.c");
    for f in ["IvProbeAndLockPages", "IvMapLockedPagesUser"] {
        assert!(
            shim.contains(&format!("NTSTATUS {f}(")),
            "seh.c defines {f}"
        );
    }
    assert_eq!(shim.matches("__try {").count(), 2, "each call in __try");
    assert_eq!(
        shim.matches("__except (EXCEPTION_EXECUTE_HANDLER)").count(),
        2
    );
    assert!(shim.contains("MmProbeAndLockPages(Mdl, UserMode, Operation)"));
    assert!(shim.contains("MmMapLockedPagesSpecifyCache(Mdl, UserMode, CacheType, NULL, FALSE,"));
    assert!(shim.contains("NormalPagePriority | MdlMappingNoExecute"));
    let build = read("driver/kmdf/build.rs");
    assert!(build.contains(".file(\"src/seh.c\")") && build.contains("config.include_paths()"));
    assert!(read("driver/kmdf/Cargo.toml").contains("cc = "));
    // The Rust side calls the shim, never the raising calls directly.
    let mdl = code_of(&read("driver/kmdf/src/mdl.rs"));
    assert!(mdl.contains("fn IvProbeAndLockPages(") && mdl.contains("fn IvMapLockedPagesUser("));
    assert!(
        !mdl.contains("MmProbeAndLockPages("),
        "probed only through the shim"
    );
    assert!(
        mdl.contains("KeStackAttachProcess"),
        "unmapped in its process"
    );
    // Memory is mapped cached; a device's BAR page (a UAR page) uncached,
    // as the driver's own mapping of the BAR.
    let map = between(&mdl, "pub(crate) fn map_region(", "\n    }\n");
    assert!(
        map.contains("crate::pci::is_io_space(region)")
            && map.contains("_MEMORY_CACHING_TYPE::MmNonCached")
            && map.contains("_MEMORY_CACHING_TYPE::MmCached")
            && map.contains("IvMapLockedPagesUser(mdl.0, cache, &raw mut user)"),
        "{map}"
    );
    // Rings are mapped in the caller's context and the cleanup waits for pins.
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    assert!(device.contains("state.device.in_caller_context("));
    assert!(device.contains("pins.wait_idle()"));
}

/// What irpverbs.sys allocates when a file is opened (at PASSIVE_LEVEL, in
/// the opener's context) it takes fallibly: a pool that cannot serve the
/// open fails it with STATUS_INSUFFICIENT_RESOURCES, never a bugcheck
/// through `handle_alloc_error`.
#[test]
fn a_file_open_allocates_fallibly() {
    let mdl = code_of(&read("driver/kmdf/src/mdl.rs"));
    assert!(
        mdl.contains("fn new() -> Result<Shared<Self>, NtStatus>")
            && mdl.contains("Shared::try_new(Self {")
            && !mdl.contains("Arc::new("),
        "the file's pin counter"
    );
    let process = code_of(&read("driver/kmdf/src/process.rs"));
    assert!(process.contains("Shared::try_new("), "the opener's record");
    assert!(!process.contains("Arc::new("));
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    assert!(device.contains("match FilePins::new() {"));
}

/// What irpverbs.sys allocates itself when a device is added (and in
/// D0Entry, for the doorbell thread and the wire) it takes fallibly: the
/// kernel ULPs' table context, the poller's event, the device state, the
/// thread's context, the wire's state and its control waiters. A refusal
/// fails the add (or the start) with STATUS_INSUFFICIENT_RESOURCES.
#[test]
fn a_device_add_allocates_its_own_parts_fallibly() {
    let kernel = code_of(&read("driver/kmdf/src/kernel.rs"));
    assert!(!kernel.contains("Arc::new("), "the table's context");
    assert!(
        kernel.contains(") -> Result<Self, NtStatus> {")
            && kernel.contains("KmdfSpeed,\n            TableCeps(ceps.clone()),\n        )?;")
            && kernel.contains("Shared::try_new(KmdfCeps {"),
        "the table's context and its CM's"
    );
    let doorbell = code_of(&read("driver/kmdf/src/backend/soft/doorbell.rs"));
    assert!(
        doorbell.contains("fn new() -> Result<Shared<Self>, NTSTATUS>")
            && doorbell.contains("Shared::try_new(Self {")
            && doorbell.contains("irpverbs_ring::try_box(ThreadContext {")
            && !doorbell.contains("Arc::new("),
        "the poller's event and the thread's context"
    );
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    let state = between(&device, "unsafe fn publish(", "\n}\n");
    for part in [
        "KernelInterface::new(hca.clone(), device_object) }?;",
        "irpverbs_ring::try_box_with(move || DeviceState {",
    ] {
        assert!(state.contains(part), "publish lacks {part}");
    }
    assert!(!device.contains("Box::new("), "the device state");
    let soft = code_of(&read("driver/kmdf/src/backend/soft.rs"));
    assert!(soft.contains("let poller = PollerEvent::new()?;"));
    let wsk = code_of(&read("driver/kmdf/src/backend/soft/wsk.rs"));
    assert!(!wsk.contains("Box::new("), "the wire's state and waiters");
    assert!(wsk.contains("let waiter = Waiter::new()?;"));
}

/// A kernel ULP built against version 1 of the direct-call table gets it
/// from irpverbs.sys: KMDF's own `IRP_MN_QUERY_INTERFACE` handling refuses
/// a `Size` below the registered (version 2) table's, so the device
/// preprocesses `IRP_MJ_PNP`/`IRP_MN_QUERY_INTERFACE` (registered before
/// `WdfDeviceCreate`), serves a query that the table's one rule
/// (`query_layout`, host mode's too) gives version 1's layout with the
/// version 1 table, referenced, completing the IRP, and hands every other
/// IRP back to the framework.
#[test]
fn a_version_1_query_interface_is_served_by_the_preprocess_callback() {
    let kernel = code_of(&read("driver/kmdf/src/kernel.rs"));
    let assign = between(
        &kernel,
        "unsafe fn assign_query_interface_preprocess(",
        "\n}\n",
    );
    for part in [
        "WdfDeviceInitAssignWdmIrpPreprocessCallback,",
        "Some(evt_device_wdm_irp_preprocess),",
        "IRP_MJ_PNP as u8,",
        "PREPROCESSED_PNP.as_ptr().cast_mut(),",
        "PREPROCESSED_PNP.len() as u32",
    ] {
        assert!(assign.contains(part), "the registration lacks {part}");
    }
    assert!(kernel.contains("static PREPROCESSED_PNP: [u8; 1] = [IRP_MN_QUERY_INTERFACE as u8];"));
    let callback = between(
        &kernel,
        "extern \"C\" fn evt_device_wdm_irp_preprocess(",
        "\n}\n",
    );
    assert!(callback.contains("serve_version_1(device, irp)"));
    assert!(callback.contains("IofCompleteRequest(irp, IO_NO_INCREMENT as i8)"));
    assert!(callback.contains("WdfDeviceWdmDispatchPreprocessedIrp, device, irp"));
    let serve = between(&kernel, "unsafe fn serve_version_1(", "\n}\n");
    for part in [
        "stack.MinorFunction != IRP_MN_QUERY_INTERFACE as u8",
        "stack.Parameters.QueryInterface",
        "is_table_guid(query.InterfaceType)",
        "query_layout(query.Version, query.Size) != Ok(TableLayout::V1)",
        "state.kernel.serve_query(query.Size, query.Version, out)",
        "Ok(()) => STATUS_SUCCESS,",
    ] {
        assert!(serve.contains(part), "serve_version_1 lacks {part}");
    }
    // The copy goes through the shared rule and takes the requester's
    // reference.
    let method = between(&kernel, "pub(crate) unsafe fn serve_query(", "\n    }\n");
    assert!(method.contains("serve_query(&self.table, size, version, out) }?;"));
    assert!(method.contains("reference(self.table.context)"));
    // Registered at device init, before WdfDeviceCreate.
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    let add = between(&device, "fn add_device(", "\n}\n");
    let assign_at = add
        .find("crate::kernel::assign_query_interface_preprocess(device_init)?")
        .expect("add_device registers the preprocess callback");
    assert!(assign_at < add.find("create_device(device_init, config)?").unwrap());
    let mocks = read("driver/kmdf/linux-check/mocks/wdk-sys/src/lib.rs");
    for binding in [
        "pub type PFN_WDFDEVICE_WDM_IRP_PREPROCESS = Option<unsafe extern \"C\" fn(Device: WDFDEVICE, Irp: PIRP) -> NTSTATUS>;",
        "WdfDeviceInitAssignWdmIrpPreprocessCallback(DeviceInit: PWDFDEVICE_INIT, EvtDeviceWdmIrpPreprocess: PFN_WDFDEVICE_WDM_IRP_PREPROCESS, MajorFunction: UCHAR, MinorFunctions: PUCHAR, NumMinorFunctions: ULONG) -> NTSTATUS;",
        "WdfDeviceWdmDispatchPreprocessedIrp(Device: WDFDEVICE, Irp: PIRP) -> NTSTATUS;",
        "pub InterfaceType: *const GUID, pub Size: USHORT, pub Version: USHORT, pub Interface: PINTERFACE, pub InterfaceSpecificData: PVOID",
        "pub fn IofCompleteRequest(Irp: PIRP, PriorityBoost: CCHAR);",
        "pub const IRP_MJ_PNP: u32 = 27;",
        "pub const IRP_MN_QUERY_INTERFACE: u32 = 8;",
    ] {
        assert!(mocks.contains(binding), "the mocks lack {binding}");
    }
}

/// What the core and the soft HCA hold shared is allocated fallibly too:
/// at device add the bus, the soft HCA (made by the backend,
/// `backend.rs`) and the two timers' states (the
/// device owns its platform: nothing to allocate), in D0Entry the CM
/// timer's arming function, the transport clock and the WSK link. No
/// `Arc::new` (which aborts when refused) is left in the glue; each part
/// is an `irpverbs_ring::Shared` or a box, and a refusal fails the add or
/// the start with STATUS_INSUFFICIENT_RESOURCES.
#[test]
fn a_device_add_allocates_its_shared_parts_fallibly() {
    for path in rust_files(&repo().join("driver/kmdf/src")) {
        let code = code_of(&fs::read_to_string(&path).expect("source"));
        assert!(!code.contains("Arc::new("), "{}: Arc::new", path.display());
    }
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    assert!(between(&device, "fn new_bus(", "\n}\n").contains("Shared::try_new(Bus {"));
    let add = between(&device, "fn add_device(", "\n}\n");
    assert!(add.contains("let bus = new_bus()?;"));
    assert!(add.contains("Hw::add(device, &KmdfPlatform, &bus) }?"));
    let state = between(&device, "unsafe fn publish(", "\n}\n");
    for part in [
        "let cm_timer = CmTimer::new()?;",
        "Device::with_config(KmdfPlatform, hca, config)",
    ] {
        assert!(state.contains(part), "publish lacks {part}");
    }
    // The HCA itself and its services, made by the backend
    // (driver/kmdf/src/backend/soft.rs; the model's in
    // driver/kmdf/src/backend/model.rs).
    let backend = code_of(&read("driver/kmdf/src/backend/soft.rs"));
    let add = between(&backend, "impl Backend for Hw {", "\n}");
    for part in [
        "let hca = Shared::try_new(soft).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;",
        "transport_timer: TransportTimer::new(hca.clone())?,",
    ] {
        assert!(add.contains(part), "the soft backend lacks {part}");
    }
    let model = code_of(&read("driver/kmdf/src/backend/model.rs"));
    assert!(model.contains("let hca = Shared::try_new(hca).map_err(|hca| {"));
    let cmtimer = code_of(&read("driver/kmdf/src/cmtimer.rs"));
    assert!(
        cmtimer.contains("let shared = Shared::try_new(Arming {")
            && cmtimer
                .contains("irpverbs_core::cm::cm_timer_arm(move |deadline| shared.arm(deadline))"),
        "the timers' states and the CM timer's arming function"
    );
    let clock = code_of(&read("driver/kmdf/src/backend/soft/clock.rs"));
    assert!(
        clock.contains("irpverbs_ring::try_box(TransportClock(shared))"),
        "the transport clock"
    );
    let wsk = code_of(&read("driver/kmdf/src/backend/soft/wsk.rs"));
    assert!(
        wsk.contains(
            "let link = Shared::try_new(link).map_err(|_| STATUS_INSUFFICIENT_RESOURCES)?;"
        ),
        "the WSK link"
    );
    // The interfaces that take them: no `Arc` to make.
    let core = code_of(&read("driver/core/src/device.rs"));
    assert!(core.contains("pub fn with_config(platform: P, hca: H, config: DeviceConfig)"));
    let soft = code_of(&read("driver/soft/src/lib.rs"));
    for signature in [
        "bus: impl SoftBus + 'static,",
        "pub fn attach_link(&self, link: impl Link + 'static)",
        "pub fn attach_clock(&self, clock: Box<dyn Clock>)",
    ] {
        assert!(soft.contains(signature), "soft lacks {signature}");
    }
}

/// irpverbs.sys implements the hardware seam (`PciPlatform`) with WDF's
/// DMA objects, `MmMapIoSpaceEx` and per-message interrupts, against
/// bindings transcribed into the linux-check mocks.
#[test]
fn the_kmdf_glue_implements_the_hardware_seam() {
    let pci = code_of(&read("driver/kmdf/src/pci.rs"));
    for call in [
        "impl PciPlatform for KmdfPci",
        "impl Platform for KmdfPci",
        "WdfDmaEnablerCreate,",
        "WdfDmaProfileScatterGather64",
        "WdfCommonBufferCreate,",
        "WdfCommonBufferGetAlignedVirtualAddress,",
        "WdfCommonBufferGetAlignedLogicalAddress,",
        "WdfDmaTransactionCreate,",
        "WdfDmaTransactionInitialize,",
        "WdfDmaTransactionExecute,",
        "WdfDmaTransactionDmaCompletedFinal,",
        "WdfDmaTransactionRelease,",
        "MmBuildMdlForNonPagedPool(",
        "pinned_mdl(region)",
        "MmMapIoSpaceEx(address, len as _, PAGE_READWRITE | PAGE_NOCACHE)",
        "MmUnmapIoSpace(",
        "read_volatile()",
        "WdfInterruptCreate,",
        "WdfInterruptQueueDpcForIsr,",
    ] {
        assert!(pci.contains(call), "pci.rs lacks {call}");
    }
    assert!(read("driver/kmdf/src/lib.rs").contains("pub mod pci;"));
    let mocks = read("driver/kmdf/linux-check/mocks/wdk-sys/src/lib.rs");
    for binding in [
        "pub struct _WDF_DMA_ENABLER_CONFIG {",
        "pub struct _WDF_INTERRUPT_CONFIG {",
        "pub struct _SCATTER_GATHER_LIST {",
        "pub fn MmMapIoSpaceEx(",
        "WdfDmaTransactionInitialize(",
    ] {
        assert!(mocks.contains(binding), "the mocks lack {binding}");
    }
}

/// irpverbs.sys names its HCA in `backend.rs` and the backends' modules
/// only: the rest of the glue builds with either backend (`soft`, `model`;
/// `linux-check/check.sh` type-checks both), and a PCI backend is started
/// from `EvtDevicePrepareHardware`'s resources.
#[test]
fn only_the_backend_names_the_hca() {
    let src = repo().join("driver/kmdf/src");
    for path in rust_files(&src) {
        let rel = path.strip_prefix(&src).expect("under src");
        if rel.starts_with("backend") || rel == std::path::Path::new("backend.rs") {
            continue;
        }
        let code = code_of(&fs::read_to_string(&path).expect("source"));
        for name in ["irpverbs_soft", "irpverbs_model", "SoftHca", "ModelHca"] {
            assert!(!code.contains(name), "{} names {name}", rel.display());
        }
    }
    let backend = code_of(&read("driver/kmdf/src/backend.rs"));
    for part in [
        "pub(crate) trait Backend:",
        "type Services",
        "const SOFTWARE_INTERRUPTS: bool;",
        "unsafe fn add(",
        "unsafe fn prepare_hardware(",
        "fn release_hardware(&self);",
        "fn start(&self, services: &Self::Services)",
        "fn stop(&self, services: &Self::Services);",
        "#[cfg(feature = \"model\")]",
        "compile_error!(",
    ] {
        assert!(backend.contains(part), "backend.rs lacks {part}");
    }
    let manifest = read("driver/kmdf/Cargo.toml");
    for part in [
        "default = [\"soft\"]",
        "soft = [\"dep:irpverbs-soft\"]",
        "model = [\"dep:irpverbs-model\"]",
    ] {
        assert!(manifest.contains(part), "Cargo.toml lacks {part}");
    }
    let check = read("driver/kmdf/linux-check/check.sh");
    assert!(check.contains("\"--features soft\" \"--no-default-features --features model\""));
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    for part in [
        "EvtDevicePrepareHardware: Some(evt_device_prepare_hardware),",
        "EvtDeviceReleaseHardware: Some(evt_device_release_hardware),",
        "Hw::prepare_hardware(device, raw, translated)",
        "state.device.hca().release_hardware();",
    ] {
        assert!(device.contains(part), "device.rs lacks {part}");
    }
    let pci = code_of(&read("driver/kmdf/src/pci.rs"));
    for part in [
        "WdfCmResourceListGetCount,",
        "WdfCmResourceListGetDescriptor,",
        "RtlCMDecodeMemIoResource(d, &raw mut start)",
        "InterruptRaw: raw,",
        "InterruptTranslated: translated,",
    ] {
        assert!(pci.contains(part), "pci.rs lacks {part}");
    }
    let mocks = read("driver/kmdf/linux-check/mocks/wdk-sys/src/lib.rs");
    for binding in [
        "pub type PFN_WDF_DEVICE_PREPARE_HARDWARE = Option<unsafe extern \"C\" fn(Device: WDFDEVICE, ResourcesRaw: WDFCMRESLIST, ResourcesTranslated: WDFCMRESLIST) -> NTSTATUS>;",
        "pub type PFN_WDF_DEVICE_RELEASE_HARDWARE = Option<unsafe extern \"C\" fn(Device: WDFDEVICE, ResourcesTranslated: WDFCMRESLIST) -> NTSTATUS>;",
        "WdfCmResourceListGetCount(List: WDFCMRESLIST) -> ULONG;",
        "WdfCmResourceListGetDescriptor(List: WDFCMRESLIST, Index: ULONG) -> PCM_PARTIAL_RESOURCE_DESCRIPTOR;",
        "pub fn RtlCMDecodeMemIoResource(Descriptor: *mut _CM_PARTIAL_RESOURCE_DESCRIPTOR, Start: PULONGLONG) -> ULONGLONG;",
        "pub struct _CM_PARTIAL_RESOURCE_DESCRIPTOR { pub Type: UCHAR, pub ShareDisposition: UCHAR, pub Flags: USHORT,",
    ] {
        assert!(mocks.contains(binding), "the mocks lack {binding}");
    }
}

// ------------------------------------------------------------------ doorbells

#[test]
fn user_doorbells_are_scanned_by_both_layers() {
    // Host mode's doorbell thread and irpverbs.sys's system thread run the
    // same poller steps; the ring IOCTL wakes both through the bus.
    let soft = code_of(&read("driver/soft/src/poller.rs"));
    assert!(soft.contains("pub fn poll_doorbells_step("));
    let host = code_of(&(read("driver/host/src/device.rs") + &read("driver/host/src/process.rs")));
    assert!(host.contains("soft.poll_doorbells_step(&mut poller, now)"));
    assert!(host.contains("fn wake_doorbell_poller(&self)"));
    let thread = code_of(&read("driver/kmdf/src/backend/soft/doorbell.rs"));
    assert!(
        thread.contains("hca.poll_doorbells_step(&mut poller, now)"),
        "the thread runs the poller"
    );
    assert!(
        thread.contains("PsCreateSystemThread(") && thread.contains("KeWaitForSingleObject("),
        "a system thread that sleeps on an event"
    );
    assert!(
        !thread.contains("ExAllocateTimer(") && !thread.contains("EX_TIMER_HIGH_RESOLUTION"),
        "no high-resolution timer pinning the clock rate"
    );
    assert!(thread.contains("PsTerminateSystemThread("));
    let backend = code_of(&read("driver/kmdf/src/backend/soft.rs"));
    assert!(
        backend.contains("fn wake_doorbell_poller(&self)") && backend.contains("self.poller.set()"),
        "the ring IOCTL sets the thread's event"
    );
    // Started in D0Entry, stopped in D0Exit: the backend's services.
    let device = code_of(&read("driver/kmdf/src/device.rs"));
    let d0_entry = between(&device, "fn evt_device_d0_entry(", "\n}\n");
    let d0_exit = between(&device, "fn evt_device_d0_exit(", "\n}\n");
    assert!(
        d0_entry.contains("hca.start(&state.services)"),
        "{d0_entry}"
    );
    assert!(d0_exit.contains(".stop(&state.services)"), "{d0_exit}");
    let start = between(
        &backend,
        "fn start(&self, services: &SoftServices)",
        "\n    }\n",
    );
    let stop = between(
        &backend,
        "fn stop(&self, services: &SoftServices)",
        "\n    }\n",
    );
    assert!(start.contains("services.scanner.start()?;"), "{start}");
    assert!(stop.contains("services.scanner.stop();"), "{stop}");
    // The page is mapped with the rings' MDL machinery.
    let platform = code_of(&read("driver/kmdf/src/platform.rs"));
    assert!(
        platform.contains("fn map_doorbell_page(")
            && platform.contains("UserMapping::map_region(page)")
    );
    // Kernel ULPs keep the direct-call doorbells.
    let kernel = code_of(&read("driver/kmdf/src/kernel.rs"));
    assert!(kernel.contains("self.hca.sq_doorbell(qp.number)"));
}

// ------------------------------------------------------------------ the wire

#[test]
fn the_wsk_wire_is_the_sans_io_socket_link_configured_from_the_inf() {
    // The glue only moves bytes between WSK and irpverbs_soft::sockwire.
    let wsk = code_of(&read("driver/kmdf/src/backend/soft/wsk.rs"));
    for call in [
        "WireConfig::from_registry(",
        "link.received(&st.hca, from,",
        "link.end_receive(&st.hca)",
        "st.link.on_timer(&st.hca)",
        ".link.send_done(slot.index,",
        "impl DatagramSocket for WskSocket",
        "WskRegister(",
        "WskCaptureProviderNPI(",
        "WSK_FLAG_DATAGRAM_SOCKET",
        "WSK_EVENT_RECEIVE_FROM",
        "STATUS_MORE_PROCESSING_REQUIRED",
    ] {
        assert!(wsk.contains(call), "wsk.rs lacks {call}");
    }
    // Configured when the device is added, opened in D0Entry, closed in
    // D0Exit.
    let backend = code_of(&read("driver/kmdf/src/backend/soft.rs"));
    assert!(backend.contains("wsk::read_config(device)"));
    let start = between(
        &backend,
        "fn start(&self, services: &SoftServices)",
        "\n    }\n",
    );
    let stop = between(
        &backend,
        "fn stop(&self, services: &SoftServices)",
        "\n    }\n",
    );
    assert!(start.contains("WskWire::start"), "{start}");
    assert!(stop.contains("wire.stop()"), "{stop}");
    // The INF's defaults name the values the glue reads.
    let inx = read("inf/irpverbs.inx");
    let soft = code_of(&read("driver/soft/src/net/sockwire/mod.rs"));
    for (name, default) in [
        ("RoceEnable", "0x10003,0"),
        ("RoceAddress", "0x2,\"\""),
        ("RocePort", "0x10003,4791"),
    ] {
        assert!(inx.contains(&format!("HKR,,{name},{default}")), "{name}");
        assert!(soft.contains(&format!("\"{name}\"")), "{name}");
    }
}

/// The service's `Parameters` key gets every per-file quota the driver
/// reads, with the driver's own defaults (`irpverbs_core::FileQuota`), as
/// `REG_DWORD`s an administrator's changes survive a reinstall of.
#[test]
fn inx_quota_parameters_are_the_drivers_defaults() {
    use irpverbs_core::FileQuota;
    let inf = inx();
    assert_eq!(
        inf.value("Irpverbs_Service", "AddReg"),
        "Irpverbs_Service.Parameters"
    );
    let defaults = FileQuota::default();
    let mut names = Vec::new();
    for line in inf.section("Irpverbs_Service.Parameters") {
        let [root, key, name, flags, value] = line.fields.as_slice() else {
            panic!("not an AddReg line: {}", line.raw)
        };
        assert_eq!(
            (root.as_str(), key.as_str()),
            ("HKR", "Parameters"),
            "{}",
            line.raw
        );
        assert_eq!(flags, "0x00010003", "REG_DWORD, no clobber: {}", line.raw);
        let value: u32 = value.parse().expect("a decimal DWORD");
        assert_eq!(defaults.registry_value(name), Some(value), "{name}");
        names.push(name.clone());
    }
    assert_eq!(
        names,
        FileQuota::REGISTRY_NAMES,
        "every parameter, in order"
    );
}
