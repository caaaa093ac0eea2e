//! The stack budget of the driver crates, measured on built code.
//!
//! The x64 kernel stack is 24 KiB. A driver function's frame must stay within
//! a per-function budget (2 KiB in release builds, 4 KiB in debug builds) and
//! the deepest call chain from each entry the kernel calls (IOCTL dispatch,
//! the DPC, the CM timer, the doorbell poller, device add) within a chain budget (12 KiB). This
//! crate reads the disassembly of a built x86-64 binary that instantiates the
//! driver (`objdump -d --no-show-raw-insn -C`, AT&T syntax), measures every
//! function's frame from its prologue, builds the call graph from direct
//! calls and tail jumps, and reports what exceeds the budget.
//!
//! How a frame is measured (an upper bound of what the function takes below
//! its caller's stack pointer):
//! - 8 bytes of return address;
//! - 8 bytes per `push` anywhere in the function (the prologue's pushes;
//!   LLVM pushes nowhere else, so this is exact in practice);
//! - every constant `sub $N,%rsp` (and `add $-N,%rsp`, LLVM's short form of
//!   it), including the unrolled stack probes (`sub $0x1000,%rsp` followed by
//!   a store); a probe loop (`mov %rsp,%r11; sub $N,%r11; ...`) counts `N`;
//!   a call to `__rust_probestack`/`__chkstk` counts the `mov $N,%eax`
//!   before it;
//! - `and $-A,%rsp` (stack realignment) counts `A`.
//!
//! A `sub` of a register from `%rsp` (a dynamic allocation) is reported.
//!
//! Which functions are the driver's: a demangled name that names a driver
//! crate (`irpverbs_abi`, `irpverbs_ring`, `irpverbs_kernel_table`,
//! `irpverbs_core`, `irpverbs_soft`, `irpverbs_cm`) is the driver's, unless
//! its own path (or its `Self` type, for a trait impl other than of the
//! driver's platform traits) is a host-side crate (`irpverbs_host`,
//! `irpverbs_host_c`, `irpverbs_tools`, `irpverbs_verbs`, the `irpverbs`
//! binary): those stand in for Windows around the driver and are counted
//! in chains but not held to the per-function budget. The host's impls of
//! the platform traits (`irpverbs_core::platform`) are the driver's: its
//! closures are inlined into them. Library code (`core`, `alloc`, compiler builtins)
//! that driver code calls, directly or through other library code, is held
//! to the budget too: a generic like `Box::new::<T>` instantiated for a
//! driver type is where large driver values are moved.
//!
//! How chains are computed: the depth of a function is its frame plus the
//! deepest of its direct callees; a tail jump (`jmp`/`jcc` to another
//! function's start) reuses the caller's frame, so it contributes the
//! callee's depth alone. Rules for what the disassembly cannot show:
//! - panic paths (`core::panicking`, `unwrap_failed`, `handle_alloc_error`,
//!   ...) are not followed: on Windows a panic is a bugcheck;
//! - an indirect call (through a trait object or a function pointer) adds
//!   [`Budget::indirect_allowance`] below the caller: the driver's trait
//!   objects are the platform's and the bus's callbacks (queue a DPC, ring
//!   the link), small leaf-like functions; every indirect call site on a
//!   reported chain is listed;
//! - recursion is followed once around a cycle (the edge back into a
//!   function already on the chain counts nothing); every cycle met is
//!   listed;
//! - calls into shared libraries (`@plt`, the GOT) count as leaves;
//! - the global allocator's entry points (`__rust_alloc`, `__rust_dealloc`,
//!   `__rust_realloc`, `__rust_alloc_zeroed`, and the `GlobalAlloc` methods
//!   they inline) are the platform's pool
//!   (`ExAllocatePool2` / `ExFreePool` in irpverbs.sys): their callees are
//!   not followed (in host mode they are the verifier's bookkeeping, which
//!   stands in for the kernel's pool) and they add
//!   [`Budget::indirect_allowance`] below their caller, as a platform
//!   callback does.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// The driver crates, as their names appear in symbols.
pub const DRIVER_CRATES: [&str; 6] = [
    "irpverbs_abi::",
    "irpverbs_ring::",
    "irpverbs_kernel_table::",
    "irpverbs_core::",
    "irpverbs_soft::",
    "irpverbs_cm::",
];

/// Crates that stand in for Windows around the driver in host mode.
pub const HOST_CRATES: [&str; 6] = [
    "irpverbs_host::",
    "irpverbs_host_c::",
    "irpverbs_tools::",
    "irpverbs_verbs::",
    "irpverbs_conformance::",
    "irpverbs::",
];

/// Functions a chain does not enter: the panic machinery (a bugcheck on
/// Windows), matched as prefixes of the demangled name.
const TERMINAL_PREFIXES: [&str; 6] = [
    "core::panicking::",
    "std::panicking::",
    "std::rt::",
    "alloc::alloc::handle_alloc_error",
    "alloc::raw_vec::handle_error",
    "alloc::raw_vec::capacity_overflow",
];

/// Terminal functions matched anywhere in the name.
const TERMINAL_PARTS: [&str; 8] = [
    "unwrap_failed",
    "expect_failed",
    "panic_bounds_check",
    "slice_index_fail",
    "slice_start_index_len_fail",
    "slice_end_index_len_fail",
    "slice_index_order_fail",
    "str_index_overflow_fail",
];

/// The global allocator's entry points (after an optional `__rustc::`):
/// the platform's pool, a leaf with the platform allowance.
const ALLOCATOR: [&str; 4] = [
    "__rust_alloc",
    "__rust_alloc_zeroed",
    "__rust_dealloc",
    "__rust_realloc",
];

/// The entries the kernel calls the driver through, as host mode
/// instantiates them: a label and the demangled function name.
pub const DEFAULT_ENTRIES: [(&str, &str); 7] = [
    (
        "IOCTL dispatch",
        "irpverbs_core::device::Device<P,H>::dispatch_ioctl",
    ),
    ("DPC", "irpverbs_core::device::Device<P,H>::dpc"),
    (
        "completion vector DPC",
        "irpverbs_core::device::Device<P,H>::comp_dpc",
    ),
    (
        "CM timer",
        "irpverbs_core::cm::<impl irpverbs_core::device::Device<P,H>>::cm_timer",
    ),
    (
        "doorbell poller",
        "irpverbs_soft::poller::<impl irpverbs_soft::SoftHca<P>>::poll_doorbells_step",
    ),
    ("device add (HCA)", "irpverbs_soft::SoftHca<P>::new"),
    (
        "device add (core)",
        "irpverbs_core::device::Device<P,H>::with_config",
    ),
];

/// One function of the disassembly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Function {
    /// Its start address.
    pub addr: u64,
    /// Its demangled name.
    pub name: String,
    /// Its frame in bytes, return address included.
    pub frame: u64,
    /// Direct call targets (addresses).
    pub calls: Vec<u64>,
    /// Tail jumps to other functions (addresses).
    pub tail_calls: Vec<u64>,
    /// Calls through a GOT slot (`call *slot(%rip)`), by slot address:
    /// resolved with the binary's dynamic relocations.
    pub got_calls: Vec<u64>,
    /// Tail jumps through a GOT slot.
    pub got_tail_calls: Vec<u64>,
    /// Calls into shared libraries (PLT), by name.
    pub external_calls: Vec<String>,
    /// Indirect call sites.
    pub indirect_calls: u32,
    /// The stack pointer is moved by a register amount.
    pub dynamic_stack: bool,
}

/// What a function is, for the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Driver code: held to the frame budget.
    Driver,
    /// Host-mode stand-ins for Windows: counted in chains only.
    Host,
    /// Library code: held to the budget when driver code reaches it.
    Library,
}

/// The driver's platform traits (`Platform`, `SpinLock`, `Request`, ...):
/// a host type's impl of one is the driver's.
const PLATFORM_TRAITS: &str = " as irpverbs_core::platform::";

/// Classifies a demangled name.
///
/// A host type's impl of a platform trait (the host platform's
/// `SpinLock::lock`, say) is the driver's: the driver's closures are
/// inlined into it, as they are into the KMDF platform's. A host type's
/// impl of another driver trait (the UDP wire's `Link`, the host bus's
/// `SoftBus`) is the host's: it stands for what lies below or beside the
/// driver on Windows (WSK, the KMDF glue), whose own impls are measured
/// where the driver instantiates them.
pub fn classify(name: &str) -> Class {
    let own_is_host = |n: &str| HOST_CRATES.iter().any(|c| n.starts_with(c));
    let host_impl = name.starts_with('<') && own_is_host(name.trim_start_matches('<'));
    if own_is_host(name) || (host_impl && !name.contains(PLATFORM_TRAITS)) {
        Class::Host
    } else if DRIVER_CRATES.iter().any(|c| name.contains(c)) {
        Class::Driver
    } else if host_impl {
        Class::Host
    } else {
        Class::Library
    }
}

/// True for the panic machinery, which chains do not enter.
pub fn is_terminal(name: &str) -> bool {
    TERMINAL_PREFIXES.iter().any(|p| name.starts_with(p))
        || TERMINAL_PARTS.iter().any(|p| name.contains(p))
}

/// True for the global allocator's entry points and for the methods of a
/// `GlobalAlloc` (which the entry points inline), which chains count as the
/// platform's pool: a leaf taking the platform allowance.
pub fn is_allocator(name: &str) -> bool {
    let short = name.strip_prefix("__rustc::").unwrap_or(name);
    ALLOCATOR.contains(&short)
        || name
            .rsplit_once(" as core::alloc::global::GlobalAlloc>::")
            .is_some_and(|(_, method)| ALLOCATOR.contains(&format!("__rust_{method}").as_str()))
}

/// Parses `objdump -d --no-show-raw-insn -C` output (AT&T syntax).
pub fn parse(disassembly: &str) -> Vec<Function> {
    let mut out = Vec::new();
    let mut current: Option<(Function, Vec<(String, String)>)> = None;
    for line in disassembly.lines() {
        if let Some((addr, name)) = header(line) {
            if let Some((f, insns)) = current.take() {
                out.push(finish(f, &insns));
            }
            current = Some((
                Function {
                    addr,
                    name: name.to_owned(),
                    ..Function::default()
                },
                Vec::new(),
            ));
        } else if let Some(insn) = instruction(line) {
            if let Some((_, insns)) = current.as_mut() {
                insns.push(insn);
            }
        }
    }
    if let Some((f, insns)) = current.take() {
        out.push(finish(f, &insns));
    }
    out
}

/// `0000000000249cc0 <name>:` -> (address, name).
fn header(line: &str) -> Option<(u64, &str)> {
    let (addr, rest) = line.split_once(' ')?;
    if addr.is_empty() || !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let name = rest.strip_prefix('<')?.strip_suffix(">:")?;
    Some((u64::from_str_radix(addr, 16).ok()?, name))
}

/// `  249cc0:\tsub    $0x918,%rsp` -> ("sub", "$0x918,%rsp").
fn instruction(line: &str) -> Option<(String, String)> {
    if !line.starts_with(' ') {
        return None;
    }
    let (addr, text) = line.trim_start().split_once(":\t")?;
    if !addr.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let text = text.trim();
    let (mnemonic, operands) = match text.split_once(char::is_whitespace) {
        Some((m, o)) => (m, o.trim()),
        None => (text, ""),
    };
    // `bnd`/`notrack` prefixes: the instruction follows.
    let (mnemonic, operands) = match mnemonic {
        "bnd" | "notrack" | "rex.W" => match operands.split_once(char::is_whitespace) {
            Some((m, o)) => (m, o.trim()),
            None => (operands, ""),
        },
        _ => (mnemonic, operands),
    };
    Some((mnemonic.to_owned(), operands.to_owned()))
}

/// `$0x918` -> 0x918 (two's complement for negative immediates).
fn immediate(op: &str) -> Option<u64> {
    let hex = op.strip_prefix("$0x")?;
    u64::from_str_radix(hex, 16).ok()
}

/// A direct branch target: `249d65 <name>` -> (address, name).
fn direct_target(operands: &str) -> Option<(u64, &str)> {
    let (addr, rest) = operands.split_once(' ')?;
    let addr = u64::from_str_radix(addr, 16).ok()?;
    let name = rest.trim().strip_prefix('<')?.strip_suffix('>')?;
    Some((addr, name))
}

/// The slot of a GOT operand: `0x228f6f(%rip)        # 352560 <_DYNAMIC+0x2040>`.
fn got_slot(operand: &str) -> Option<u64> {
    let (mem, comment) = operand.split_once('#')?;
    if !mem.trim_end().ends_with("(%rip)") {
        return None;
    }
    let addr = comment.trim().split(' ').next()?;
    u64::from_str_radix(addr, 16).ok()
}

/// What a GOT slot holds, from the dynamic relocations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    /// A function of the binary (`R_X86_64_RELATIVE`).
    Local(u64),
    /// A symbol of a shared library (`R_X86_64_GLOB_DAT`, `JUMP_SLOT`).
    External(String),
}

/// Parses `objdump -R` output: GOT slot -> what it holds.
pub fn parse_relocations(text: &str) -> HashMap<u64, Slot> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(offset), Some(kind), Some(value)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(offset) = u64::from_str_radix(offset, 16) else {
            continue;
        };
        let slot = match kind {
            "R_X86_64_RELATIVE" => {
                let Some(addend) = value.strip_prefix("*ABS*+0x") else {
                    continue;
                };
                let Ok(target) = u64::from_str_radix(addend, 16) else {
                    continue;
                };
                Slot::Local(target)
            }
            "R_X86_64_GLOB_DAT" | "R_X86_64_JUMP_SLOT" => Slot::External(value.to_owned()),
            _ => continue,
        };
        out.insert(offset, slot);
    }
    out
}

fn is_probestack(name: &str) -> bool {
    name.contains("__rust_probestack") || name.contains("__chkstk") || name.contains("___chkstk")
}

fn finish(mut f: Function, insns: &[(String, String)]) -> Function {
    let mut frame = 8u64;
    let mut last_eax: Option<u64> = None;
    let mut probed_rax = false;
    for (i, (m, ops)) in insns.iter().enumerate() {
        let next = |k: usize| insns.get(i + k).map(|(m, o)| (m.as_str(), o.as_str()));
        match m.as_str() {
            "push" | "pushq" => frame += 8,
            "sub" | "subq" => {
                let Some((src, dst)) = ops.split_once(',') else {
                    continue;
                };
                match (immediate(src), dst) {
                    // `sub $-128,%rsp`: LLVM's shorter `add $128,%rsp`.
                    (Some(n), "%rsp") if n > (1 << 63) => {}
                    (Some(n), "%rsp") => {
                        // The loop form of the probes: the loop's one
                        // `sub $0x1000` stands for the %r11 amount.
                        let in_loop = next(2) == Some(("cmp", "%r11,%rsp"));
                        if !in_loop {
                            frame += n;
                        }
                    }
                    (Some(n), "%r11")
                        if i > 0 && insns[i - 1].0 == "mov" && insns[i - 1].1 == "%rsp,%r11" =>
                    {
                        frame += n;
                    }
                    (None, "%rsp") => {
                        if probed_rax && src == "%rax" {
                            probed_rax = false;
                        } else {
                            f.dynamic_stack = true;
                        }
                    }
                    _ => {}
                }
            }
            "add" | "addq" => {
                if let Some((src, "%rsp")) = ops.split_once(',') {
                    // `add $-128,%rsp`: LLVM's shorter `sub $128,%rsp`.
                    if let Some(n) = immediate(src) {
                        if n > (1 << 63) {
                            frame += n.wrapping_neg();
                        }
                    }
                }
            }
            "and" | "andq" => {
                if let Some((src, "%rsp")) = ops.split_once(',') {
                    if let Some(n) = immediate(src) {
                        frame += n.wrapping_neg() & 0xffff;
                    }
                }
            }
            "mov" | "movl" => {
                if let Some((src, "%eax")) = ops.split_once(',') {
                    last_eax = immediate(src);
                }
            }
            "call" | "callq" => {
                if let Some(target) = ops.strip_prefix('*') {
                    match got_slot(target) {
                        Some(slot) => f.got_calls.push(slot),
                        None => f.indirect_calls += 1,
                    }
                } else if let Some((addr, name)) = direct_target(ops) {
                    if is_probestack(name) {
                        frame += last_eax.unwrap_or(0);
                        probed_rax = true;
                    } else if name.ends_with("@plt") {
                        f.external_calls.push(name.to_owned());
                    } else {
                        f.calls.push(addr);
                    }
                }
            }
            m if m.starts_with('j') => {
                if let Some(slot) = ops.strip_prefix('*').and_then(got_slot) {
                    f.got_tail_calls.push(slot);
                } else if let Some((addr, name)) = direct_target(ops) {
                    // Another function's start: a tail call (resolved
                    // against the function table later).
                    if addr != f.addr && !name.contains("+0x") {
                        f.tail_calls.push(addr);
                    }
                }
            }
            _ => {}
        }
    }
    f.frame = frame;
    f.calls.sort_unstable();
    f.calls.dedup();
    f.tail_calls.sort_unstable();
    f.tail_calls.dedup();
    f
}

/// The budget a build is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Largest frame of a driver function, bytes.
    pub frame: u64,
    /// Deepest chain from an entry, bytes.
    pub chain: u64,
    /// What an indirect call is assumed to take below its caller, bytes.
    pub indirect_allowance: u64,
}

impl Budget {
    /// Release builds: 2 KiB frames, 12 KiB chains.
    pub const RELEASE: Budget = Budget {
        frame: 2048,
        chain: 12 * 1024,
        indirect_allowance: 1024,
    };
    /// Debug builds: 4 KiB frames, 12 KiB chains.
    pub const DEBUG: Budget = Budget {
        frame: 4096,
        chain: 12 * 1024,
        indirect_allowance: 1024,
    };
}

/// A link of a chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The function.
    pub name: String,
    /// Its frame, bytes.
    pub frame: u64,
    /// Entered by a tail jump from the previous link (whose frame is gone).
    pub tail: bool,
    /// Indirect call sites in it (each adds the allowance).
    pub indirect_calls: u32,
    /// The platform's allocator: a leaf that adds the allowance.
    pub allocator: bool,
}

/// The deepest chain from one entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// The entry's label.
    pub label: String,
    /// Stack taken at the deepest point, bytes.
    pub depth: u64,
    /// The functions, outermost first.
    pub links: Vec<Link>,
}

/// The result of a check.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Functions parsed.
    pub functions: usize,
    /// Functions held to the frame budget: (frame, name, instances), worst
    /// first.
    pub frames: Vec<(u64, String, usize)>,
    /// The deepest chain of each entry.
    pub chains: Vec<Chain>,
    /// Entries not found in the binary.
    pub missing_entries: Vec<String>,
    /// Recursion cycles met, as function names.
    pub cycles: Vec<Vec<String>>,
    /// Checked functions that move the stack pointer dynamically.
    pub dynamic: Vec<String>,
    /// Indirect call sites in checked functions.
    pub indirect_sites: u64,
}

/// The call graph over the parsed functions.
pub struct Graph {
    funcs: Vec<Function>,
    by_addr: HashMap<u64, usize>,
}

impl Graph {
    /// Indexes `funcs` by address, resolving calls through GOT slots with
    /// `relocations` (a slot holding a function of the binary is a direct
    /// call; any other is a call into a shared library).
    pub fn new(mut funcs: Vec<Function>, relocations: &HashMap<u64, Slot>) -> Self {
        for f in &mut funcs {
            for (slots, direct) in [
                (core::mem::take(&mut f.got_calls), &mut f.calls),
                (core::mem::take(&mut f.got_tail_calls), &mut f.tail_calls),
            ] {
                for slot in slots {
                    match relocations.get(&slot) {
                        Some(Slot::Local(target)) => direct.push(*target),
                        Some(Slot::External(name)) => f.external_calls.push(name.clone()),
                        None => f.external_calls.push(format!("GOT slot {slot:#x}")),
                    }
                }
                direct.sort_unstable();
                direct.dedup();
            }
        }
        let by_addr = funcs.iter().enumerate().map(|(i, f)| (f.addr, i)).collect();
        Self { funcs, by_addr }
    }

    fn callees(&self, i: usize) -> impl Iterator<Item = (usize, bool)> + '_ {
        let f = &self.funcs[i];
        let leaf = is_allocator(&f.name);
        let calls = f.calls.iter().map(|a| (a, false));
        let tails = f.tail_calls.iter().map(|a| (a, true));
        calls
            .chain(tails)
            .filter_map(|(a, tail)| self.by_addr.get(a).map(|&j| (j, tail)))
            .filter(move |&(j, _)| !leaf && j != i && !is_terminal(&self.funcs[j].name))
    }

    /// Whether `i` takes the platform allowance below its frame: it has
    /// indirect call sites, or it is the platform's allocator.
    fn takes_allowance(&self, i: usize) -> bool {
        let f = &self.funcs[i];
        f.indirect_calls > 0 || is_allocator(&f.name)
    }

    /// The functions held to the frame budget: driver functions and the
    /// library functions they reach (not through host functions).
    fn checked(&self) -> Vec<bool> {
        let mut checked: Vec<bool> = self
            .funcs
            .iter()
            .map(|f| classify(&f.name) == Class::Driver)
            .collect();
        let mut stack: Vec<usize> = (0..self.funcs.len()).filter(|&i| checked[i]).collect();
        while let Some(i) = stack.pop() {
            let next: Vec<usize> = self.callees(i).map(|(j, _)| j).collect();
            for j in next {
                if !checked[j] && classify(&self.funcs[j].name) == Class::Library {
                    checked[j] = true;
                    stack.push(j);
                }
            }
        }
        checked
    }

    /// Checks every function and entry against `budget`.
    pub fn check(&self, entries: &[(&str, &str)], budget: Budget) -> Report {
        let checked = self.checked();
        let mut frames: BTreeMap<(u64, &str), usize> = BTreeMap::new();
        let mut report = Report {
            functions: self.funcs.len(),
            ..Report::default()
        };
        for (i, f) in self.funcs.iter().enumerate() {
            if checked[i] {
                *frames.entry((f.frame, &f.name)).or_default() += 1;
                report.indirect_sites += u64::from(f.indirect_calls);
                if f.dynamic_stack {
                    report.dynamic.push(f.name.clone());
                }
            }
        }
        report.frames = frames
            .into_iter()
            .rev()
            .map(|((frame, name), n)| (frame, name.to_owned(), n))
            .collect();
        report.dynamic.sort();
        report.dynamic.dedup();

        let mut depths = Depths::new(self, budget.indirect_allowance);
        let mut cycles = BTreeSet::new();
        for (label, name) in entries {
            let starts: Vec<usize> = (0..self.funcs.len())
                .filter(|&i| self.funcs[i].name == *name)
                .collect();
            if starts.is_empty() {
                report.missing_entries.push(format!("{label}: {name}"));
                continue;
            }
            let best = starts
                .into_iter()
                .map(|i| (depths.depth(i), i))
                .max()
                .map(|(_, i)| i);
            if let Some(i) = best {
                report.chains.push(Chain {
                    label: (*label).to_owned(),
                    depth: depths.depth(i),
                    links: depths.chain(i),
                });
            }
        }
        for cycle in depths.cycles {
            cycles.insert(cycle);
        }
        report.cycles = cycles.into_iter().collect();
        report
    }
}

/// A function's deepest chain: its depth and the callee it goes through
/// (and whether by a tail jump).
type Deepest = (u64, Option<(usize, bool)>);

/// Memoized deepest-chain search.
struct Depths<'g> {
    graph: &'g Graph,
    allowance: u64,
    memo: Vec<Option<Deepest>>,
    on_path: Vec<bool>,
    path: Vec<usize>,
    cycles: Vec<Vec<String>>,
}

impl<'g> Depths<'g> {
    fn new(graph: &'g Graph, allowance: u64) -> Self {
        Self {
            graph,
            allowance,
            memo: vec![None; graph.funcs.len()],
            on_path: vec![false; graph.funcs.len()],
            path: Vec::new(),
            cycles: Vec::new(),
        }
    }

    /// The deepest stack use below (and including) `i`.
    fn depth(&mut self, i: usize) -> u64 {
        self.visit(i);
        self.memo[i].map_or(0, |(d, _)| d)
    }

    fn visit(&mut self, root: usize) {
        // An explicit stack: chains can be deep in debug builds.
        enum Step {
            Enter(usize),
            Leave(usize),
        }
        let mut work = vec![Step::Enter(root)];
        while let Some(step) = work.pop() {
            match step {
                Step::Enter(i) => {
                    if self.memo[i].is_some() || self.on_path[i] {
                        continue;
                    }
                    self.on_path[i] = true;
                    self.path.push(i);
                    work.push(Step::Leave(i));
                    for (j, _) in self.graph.callees(i) {
                        if self.on_path[j] {
                            let at = self.path.iter().position(|&p| p == j).unwrap_or(0);
                            self.cycles.push(
                                self.path[at..]
                                    .iter()
                                    .map(|&p| self.graph.funcs[p].name.clone())
                                    .collect(),
                            );
                        } else if self.memo[j].is_none() {
                            work.push(Step::Enter(j));
                        }
                    }
                }
                Step::Leave(i) => {
                    let f = &self.graph.funcs[i];
                    let own = f.frame
                        + if self.graph.takes_allowance(i) {
                            self.allowance
                        } else {
                            0
                        };
                    let mut best = (own, None);
                    for (j, tail) in self.graph.callees(i) {
                        // A back edge of a cycle counts nothing.
                        let Some((d, _)) = self.memo[j] else {
                            continue;
                        };
                        let via = if tail { d } else { f.frame + d };
                        if via > best.0 {
                            best = (via, Some((j, tail)));
                        }
                    }
                    self.memo[i] = Some(best);
                    self.on_path[i] = false;
                    self.path.pop();
                }
            }
        }
    }

    fn chain(&mut self, mut i: usize) -> Vec<Link> {
        let mut links = Vec::new();
        let mut tail = false;
        let mut seen = BTreeSet::new();
        loop {
            self.visit(i);
            let f = &self.graph.funcs[i];
            links.push(Link {
                name: f.name.clone(),
                frame: f.frame,
                tail,
                indirect_calls: f.indirect_calls,
                allocator: is_allocator(&f.name),
            });
            if !seen.insert(i) {
                break;
            }
            match self.memo[i].and_then(|(_, next)| next) {
                Some((j, t)) => {
                    i = j;
                    tail = t;
                }
                None => break,
            }
        }
        links
    }
}

impl Report {
    /// Frames over `budget`.
    pub fn frames_over(&self, budget: Budget) -> impl Iterator<Item = &(u64, String, usize)> {
        self.frames
            .iter()
            .filter(move |(f, _, _)| *f > budget.frame)
    }

    /// Chains over `budget`.
    pub fn chains_over(&self, budget: Budget) -> impl Iterator<Item = &Chain> {
        self.chains.iter().filter(move |c| c.depth > budget.chain)
    }

    /// True when everything is within `budget` and every entry was found.
    pub fn passes(&self, budget: Budget) -> bool {
        self.frames_over(budget).next().is_none()
            && self.chains_over(budget).next().is_none()
            && self.missing_entries.is_empty()
    }

    /// The report as text: the `top` worst frames, every entry's deepest
    /// chain, cycles, dynamic frames, and the verdict.
    pub fn render(&self, budget: Budget, top: usize) -> String {
        let mut s = String::new();
        let checked = self.frames.iter().map(|(_, _, n)| n).sum::<usize>();
        let _ = writeln!(
            s,
            "{} functions, {} held to the frame budget ({} B); chain budget {} B",
            self.functions, checked, budget.frame, budget.chain
        );
        let _ = writeln!(s, "\nworst frames (bytes, function [instances]):");
        for (frame, name, n) in self.frames.iter().take(top) {
            let over = if *frame > budget.frame { "  OVER" } else { "" };
            let inst = if *n > 1 {
                format!(" [{n}]")
            } else {
                String::new()
            };
            let _ = writeln!(s, "  {frame:>6}  {name}{inst}{over}");
        }
        for chain in &self.chains {
            let over = if chain.depth > budget.chain {
                "  OVER"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "\ndeepest chain from {}: {} B{over}",
                chain.label, chain.depth
            );
            for link in &chain.links {
                let how = if link.tail { " (tail jump)" } else { "" };
                let ind = if link.indirect_calls > 0 {
                    format!(
                        " (+{} B for {} indirect call site(s))",
                        budget.indirect_allowance, link.indirect_calls
                    )
                } else if link.allocator {
                    format!(" (+{} B: the platform's pool)", budget.indirect_allowance)
                } else {
                    String::new()
                };
                let _ = writeln!(s, "  {:>6}  {}{how}{ind}", link.frame, link.name);
            }
        }
        let _ = writeln!(
            s,
            "\nindirect call sites in checked functions: {} (each assumed to take <= {} B below its caller)",
            self.indirect_sites, budget.indirect_allowance
        );
        if !self.cycles.is_empty() {
            let _ = writeln!(
                s,
                "recursion (followed once around each cycle): {} cycle(s)",
                self.cycles.len()
            );
            for cycle in &self.cycles {
                let _ = writeln!(s, "  {}", cycle.join(" -> "));
            }
        }
        for name in &self.dynamic {
            let _ = writeln!(s, "dynamic stack allocation in {name}");
        }
        for entry in &self.missing_entries {
            let _ = writeln!(
                s,
                "entry not found (inlined into its caller, or renamed?): {entry}"
            );
        }
        let frames_over = self.frames_over(budget).count();
        let chains_over = self.chains_over(budget).count();
        let _ = writeln!(
            s,
            "\n{}: {} frame(s) over {} B, {} chain(s) over {} B, {} entr(y/ies) missing",
            if self.passes(budget) { "ok" } else { "FAIL" },
            frames_over,
            budget.frame,
            chains_over,
            budget.chain,
            self.missing_entries.len()
        );
        s
    }
}

#[cfg(test)]
mod tests;
