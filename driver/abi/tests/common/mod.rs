//! Shared by the `header` and `c_layout` integration tests: repository paths,
//! the bless mechanism, header generation, and the table of the crate's
//! integer constants.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The command that regenerates every generated file this crate checks in.
pub const REGENERATE: &str =
    "IRPVERBS_BLESS=1 cargo test -p irpverbs-abi --test header --test c_layout";

/// `driver/abi`.
pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The repository root (two levels above `driver/abi`).
pub fn repo_root() -> PathBuf {
    crate_dir()
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// `include/irpverbs.h`.
pub fn header_path() -> PathBuf {
    repo_root().join("include/irpverbs.h")
}

/// True when `IRPVERBS_BLESS` asks to rewrite the checked-in files.
pub fn bless() -> bool {
    std::env::var_os("IRPVERBS_BLESS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Compares a generated file with the checked-in one. With `IRPVERBS_BLESS`
/// set, rewrites the checked-in file instead (atomically, so that a reader
/// never sees half a file). `what` names the generator for the message.
pub fn check_or_bless(path: &Path, generated: &str, what: &str) -> Result<(), String> {
    let rel = path
        .strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string();
    // A checkout with CRLF line endings (core.autocrlf on Windows) is not stale.
    let current = std::fs::read_to_string(path)
        .ok()
        .map(|s| s.replace("\r\n", "\n"));
    if current.as_deref() == Some(generated) {
        return Ok(());
    }
    if bless() {
        std::fs::create_dir_all(path.parent().expect("parent"))
            .map_err(|e| format!("creating the folder of {rel}: {e}"))?;
        let tmp = path.with_extension("blessing");
        std::fs::write(&tmp, generated).map_err(|e| format!("writing {rel}: {e}"))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("writing {rel}: {e}"))?;
        eprintln!("IRPVERBS_BLESS: rewrote {rel}");
        return Ok(());
    }
    let mut msg = match &current {
        None => format!("{rel} is missing; it is generated from {what}.\n"),
        Some(_) => format!("{rel} is stale: it differs from what {what} generates.\n"),
    };
    let _ = writeln!(
        msg,
        "Regenerate it with\n    {REGENERATE}\n(or `cargo make header`) and commit the result."
    );
    if let Some(current) = &current {
        let (mut old, mut new) = (current.lines(), generated.lines());
        for n in 1.. {
            match (old.next(), new.next()) {
                (None, None) => break,
                (a, b) if a == b => {}
                (a, b) => {
                    let _ = writeln!(
                        msg,
                        "First difference at line {n}:\n  checked in: {}\n  generated:  {}",
                        a.unwrap_or("<end of file>"),
                        b.unwrap_or("<end of file>"),
                    );
                    break;
                }
            }
        }
    }
    Err(msg)
}

/// The cbindgen configuration, `driver/abi/cbindgen.toml`.
pub fn cbindgen_config() -> cbindgen::Config {
    cbindgen::Config::from_file(crate_dir().join("cbindgen.toml")).expect("cbindgen.toml")
}

/// `include/irpverbs.h` as cbindgen generates it from this crate.
pub fn generate_header() -> String {
    static HEADER: OnceLock<String> = OnceLock::new();
    HEADER
        .get_or_init(|| {
            let bindings = cbindgen::Builder::new()
                .with_crate(crate_dir())
                .with_config(cbindgen_config())
                .generate()
                .expect("cbindgen failed to generate include/irpverbs.h");
            let mut out = Vec::new();
            bindings.write(&mut out);
            guard_windows_names(&String::from_utf8(out).expect("cbindgen wrote UTF-8"))
        })
        .clone()
}

/// Names `<windows.h>`, `<winioctl.h>` and `<ntstatus.h>` also define (with
/// the same values, spelled differently). Each `#define` of one is wrapped in
/// `#ifndef`, so a Windows ULP can include the Windows headers first without
/// redefinition warnings.
fn is_windows_name(name: &str) -> bool {
    name.starts_with("STATUS_")
        || matches!(
            name,
            "FILE_DEVICE_INFINIBAND"
                | "METHOD_BUFFERED"
                | "FILE_ANY_ACCESS"
                | "FILE_READ_ACCESS"
                | "FILE_WRITE_ACCESS"
        )
}

fn guard_windows_names(header: &str) -> String {
    let mut out = String::with_capacity(header.len() + 4096);
    for line in header.lines() {
        let name = line
            .strip_prefix("#define ")
            .and_then(|r| r.split_whitespace().next());
        match name {
            Some(n) if is_windows_name(n) => {
                out.push_str(&format!("#ifndef {n}\n{line}\n#endif\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Checks (or, with `IRPVERBS_BLESS`, rewrites) `include/irpverbs.h` once
/// per test binary; every caller gets the same answer.
pub fn header_fresh() -> Result<(), String> {
    static FRESH: OnceLock<Result<(), String>> = OnceLock::new();
    FRESH
        .get_or_init(|| {
            check_or_bless(
                &header_path(),
                &generate_header(),
                "cbindgen (driver/abi/cbindgen.toml)",
            )
        })
        .clone()
}

macro_rules! consts {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), irpverbs_abi::$name as i128)),*]
    };
}

/// Every integer `pub const` of the crate (all `u8`..`u64` or `i32`, so `as
/// i128` is lossless) except the IOCTL codes (which
/// `irpverbs_abi::IOCTLS` lists), with its value. [`source_consts`] keeps
/// this list complete.
pub const CONSTS: &[(&str, i128)] = consts![
    IV_ABI_VERSION,
    IV_ABI_MAJOR,
    IV_ABI_MINOR,
    FILE_DEVICE_INFINIBAND,
    METHOD_BUFFERED,
    FILE_ANY_ACCESS,
    FILE_READ_ACCESS,
    FILE_WRITE_ACCESS,
    IV_QPT_RC,
    IV_QPT_UC,
    IV_QPT_UD,
    IV_QPS_RESET,
    IV_QPS_INIT,
    IV_QPS_RTR,
    IV_QPS_RTS,
    IV_QPS_SQD,
    IV_QPS_SQE,
    IV_QPS_ERR,
    IV_MTU_256,
    IV_MTU_512,
    IV_MTU_1024,
    IV_MTU_2048,
    IV_MTU_4096,
    IV_MIG_MIGRATED,
    IV_MIG_REARM,
    IV_MIG_ARMED,
    IV_ACCESS_LOCAL_WRITE,
    IV_ACCESS_REMOTE_WRITE,
    IV_ACCESS_REMOTE_READ,
    IV_ACCESS_REMOTE_ATOMIC,
    IV_ACCESS_ALL,
    IV_ACCESS_MW_BIND,
    IV_ACCESS_MW_ALL,
    IV_MW_TYPE_1,
    IV_MW_TYPE_2,
    IV_QP_STATE,
    IV_QP_CUR_STATE,
    IV_QP_EN_SQD_ASYNC_NOTIFY,
    IV_QP_ACCESS_FLAGS,
    IV_QP_PKEY_INDEX,
    IV_QP_PORT,
    IV_QP_QKEY,
    IV_QP_AV,
    IV_QP_PATH_MTU,
    IV_QP_TIMEOUT,
    IV_QP_RETRY_CNT,
    IV_QP_RNR_RETRY,
    IV_QP_RQ_PSN,
    IV_QP_MAX_QP_RD_ATOMIC,
    IV_QP_ALT_PATH,
    IV_QP_MIN_RNR_TIMER,
    IV_QP_SQ_PSN,
    IV_QP_MAX_DEST_RD_ATOMIC,
    IV_QP_PATH_MIG_STATE,
    IV_QP_CAP,
    IV_QP_DEST_QPN,
    IV_QP_ATTR_ALL,
    IV_SRQ_MAX_WR,
    IV_SRQ_LIMIT,
    IV_PORT_DOWN,
    IV_PORT_INIT,
    IV_PORT_ARMED,
    IV_PORT_ACTIVE,
    IV_LINK_LAYER_INFINIBAND,
    IV_LINK_LAYER_ETHERNET,
    IV_ATOMIC_NONE,
    IV_ATOMIC_HCA,
    IV_ATOMIC_GLOB,
    IV_DEVICE_SRQ_RESIZE,
    IV_DEVICE_RC_RNR_NAK_GEN,
    IV_DEVICE_PORT_ACTIVE_EVENT,
    IV_DEVICE_RESIZE_MAX_WR,
    IV_DEVICE_MEM_WINDOW,
    IV_DEVICE_MEM_WINDOW_TYPE_2B,
    IV_DEVICE_MEM_MGT_EXTENSIONS,
    STATUS_SUCCESS,
    IV_CQ_ARM_NEXT,
    IV_DOORBELL_PAGE_SIZE,
    IV_DOORBELL_SLOTS,
    IV_DOORBELL_WORDS,
    IV_DOORBELL_NONE,
    IV_CQ_ARM_SOLICITED,
    IV_CEP_EVENT_CONNECT_REQUEST,
    IV_CEP_EVENT_REPLY,
    IV_CEP_EVENT_ESTABLISHED,
    IV_CEP_EVENT_REJECTED,
    IV_CEP_EVENT_MRA,
    IV_CEP_EVENT_TIMEOUT,
    IV_CEP_EVENT_DISCONNECT_REQUEST,
    IV_CEP_EVENT_DISCONNECT_REPLY,
    IV_CEP_EVENT_STALE,
    IV_CEP_EVENT_TIMEWAIT_EXIT,
    IV_CEP_EVENT_LAP,
    IV_CEP_EVENT_APR,
    IV_CEP_EVENT_SIDR_REQUEST,
    IV_CEP_EVENT_SIDR_REPLY,
    IV_CM_FLOW_CONTROL,
    IV_CM_SRQ,
    IV_CM_PEER_TO_PEER,
    IV_CM_REQ_PDATA,
    IV_CM_REP_PDATA,
    IV_CM_REJ_PDATA,
    IV_CM_ARI_LEN,
    IV_CM_DREQ_PDATA,
    IV_CM_DREP_PDATA,
    IV_CM_MRA_PDATA,
    IV_CM_LAP_PDATA,
    IV_CM_APR_PDATA,
    IV_CM_APR_ACCEPTED,
    IV_CM_APR_MAX_STATUS,
    IV_CM_SIDR_REQ_PDATA,
    IV_CM_SIDR_REP_PDATA,
    IV_EVENT_COMM_EST,
    IV_EVENT_CQ_ERR,
    IV_EVENT_DEVICE_FATAL,
    IV_EVENT_PATH_MIG,
    IV_EVENT_PATH_MIG_ERR,
    IV_EVENT_PORT_ACTIVE,
    IV_EVENT_PORT_ERR,
    IV_EVENT_QP_ACCESS_ERR,
    IV_EVENT_QP_FATAL,
    IV_EVENT_QP_LAST_WQE_REACHED,
    IV_EVENT_QP_REQ_ERR,
    IV_EVENT_SQ_DRAINED,
    IV_EVENT_SRQ_ERR,
    IV_EVENT_SRQ_LIMIT_REACHED,
    IV_GRH_LEN,
    IV_NOTIFY_NEXT,
    IV_NOTIFY_NO_ARM,
    IV_NOTIFY_SOLICITED,
    IV_SEND_FENCE,
    IV_SEND_INLINE,
    IV_SEND_SIGNALED,
    IV_SEND_SOLICITED,
    IV_WC_BAD_RESP_ERR,
    IV_WC_FATAL_ERR,
    IV_WC_GENERAL_ERR,
    IV_WC_GRH,
    IV_WC_LOC_ACCESS_ERR,
    IV_WC_LOC_LEN_ERR,
    IV_WC_LOC_PROT_ERR,
    IV_WC_LOC_QP_OP_ERR,
    IV_WC_MW_BIND_ERR,
    IV_WC_OP_BIND_MW,
    IV_WC_OP_LOCAL_INV,
    IV_WC_OP_REG_MR,
    IV_WC_OP_COMP_SWAP,
    IV_WC_OP_FETCH_ADD,
    IV_WC_OP_RDMA_READ,
    IV_WC_OP_RDMA_WRITE,
    IV_WC_OP_RECV,
    IV_WC_OP_RECV_RDMA_WITH_IMM,
    IV_WC_OP_SEND,
    IV_WC_REM_ACCESS_ERR,
    IV_WC_REM_INV_REQ_ERR,
    IV_WC_REM_OP_ERR,
    IV_WC_RETRY_EXC_ERR,
    IV_WC_RNR_RETRY_EXC_ERR,
    IV_WC_SUCCESS,
    IV_WC_WITH_IMM,
    IV_WC_WITH_INV,
    IV_WC_WR_FLUSH_ERR,
    IV_WR_ATOMIC_CMP_AND_SWP,
    IV_WR_ATOMIC_FETCH_AND_ADD,
    IV_WR_RDMA_READ,
    IV_WR_RDMA_WRITE,
    IV_WR_RDMA_WRITE_WITH_IMM,
    IV_WR_SEND,
    IV_WR_SEND_WITH_IMM,
    IV_WR_SEND_WITH_INV,
    IV_WR_LOCAL_INV,
    IV_WR_BIND_MW,
    IV_WR_REG_MR,
    STATUS_DATA_OVERRUN,
    STATUS_PENDING,
    STATUS_DEVICE_BUSY,
    STATUS_UNSUCCESSFUL,
    STATUS_INFO_LENGTH_MISMATCH,
    STATUS_INVALID_HANDLE,
    STATUS_INVALID_PARAMETER,
    STATUS_INVALID_DEVICE_REQUEST,
    STATUS_ACCESS_DENIED,
    STATUS_ACCESS_VIOLATION,
    STATUS_BUFFER_TOO_SMALL,
    STATUS_INVALID_PARAMETER_MIX,
    STATUS_DELETE_PENDING,
    STATUS_INSUFFICIENT_RESOURCES,
    STATUS_NOT_SUPPORTED,
    STATUS_CANCELLED,
    STATUS_INVALID_DEVICE_STATE,
    STATUS_DEVICE_REMOVED,
    STATUS_DATATYPE_MISALIGNMENT_ERROR,
    STATUS_DEVICE_HARDWARE_ERROR,
    STATUS_CONNECTION_REFUSED,
    STATUS_IO_TIMEOUT,
    STATUS_INVALID_ADDRESS,
    STATUS_ADDRESS_ALREADY_EXISTS,
    STATUS_NETWORK_UNREACHABLE,
    STATUS_QUOTA_EXCEEDED,
    STATUS_PROCESS_IS_TERMINATING,
    IV_ADDR_NONE,
    IV_ADDR_IPV4,
    IV_ADDR_IPV6,
    IV_RDMA_PS_TCP,
    IV_RDMA_PS_UDP,
    IV_RDMA_PS_IB,
];

/// The names of the integer `pub const` items declared at the top level of
/// the crate's source files, read from the source (`pub const NAME: TYPE =`
/// at the start of a line). Tables such as `IOCTLS` and `LAYOUTS` are not
/// integers and are left out.
pub fn source_consts() -> Vec<String> {
    const INTEGER_TYPES: &[&str] = &["u8", "u16", "u32", "u64", "i32", "NtStatus", "IvHandle"];
    let mut files: Vec<_> = std::fs::read_dir(crate_dir().join("src"))
        .expect("src")
        .map(|e| e.expect("src entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    let mut names = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("source file");
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("pub const ") else {
                continue;
            };
            let Some((name, rest)) = rest.split_once(':') else {
                continue; // `pub const fn`
            };
            let ty = rest.split('=').next().unwrap_or_default().trim();
            if INTEGER_TYPES.contains(&ty) {
                names.push(name.trim().to_owned());
            }
        }
    }
    assert!(names.len() > 50, "found only {} constants", names.len());
    names
}
