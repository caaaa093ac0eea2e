use super::*;

/// A hand-made disassembly in `objdump -d --no-show-raw-insn -C` form: an
/// entry, a callee with unrolled stack probes, one with a probe loop, a
/// tail-called leaf, a call through the GOT, a panic path and a cycle.
const SAMPLE: &str = "
target/release/irpverbs:     file format elf64-x86-64


Disassembly of section .text:

0000000000001000 <irpverbs_core::device::Device<P,H>::dispatch_ioctl>:
    1000:\tpush   %rbp
    1001:\tpush   %r15
    1003:\tpush   %rbx
    1004:\tsub    $0x3a0,%rsp
    100b:\tmov    %rdi,%rbx
    100e:\tcall   2000 <irpverbs_soft::SoftHca<P>::new>
    1013:\tcall   *0x18(%rax)
    1016:\tcall   *0x2f6c(%rip)        # 4000 <_DYNAMIC+0x40>
    101c:\tcall   *0x2f6c(%rip)        # 4008 <memcpy@GLIBC_2.14>
    1022:\tjne    1030 <irpverbs_core::device::Device<P,H>::dispatch_ioctl+0x30>
    1024:\tcall   5000 <core::panicking::panic_bounds_check>
    1030:\tsub    $0xffffffffffffff80,%rsp
    1034:\tadd    $0x3a0,%rsp
    103b:\tpop    %rbx
    103c:\tpop    %r15
    103e:\tpop    %rbp
    103f:\tjmp    3000 <alloc::raw_vec::RawVec<T,A>::grow_one>

0000000000002000 <irpverbs_soft::SoftHca<P>::new>:
    2000:\tpush   %rbx
    2001:\tsub    $0x1000,%rsp
    2008:\tmovq   $0x0,(%rsp)
    2010:\tsub    $0x1000,%rsp
    2017:\tmovq   $0x0,(%rsp)
    201f:\tsub    $0x178,%rsp
    2026:\tcall   2100 <irpverbs_soft::firmware::Firmware::new>
    202b:\tret

0000000000002100 <irpverbs_soft::firmware::Firmware::new>:
    2100:\tmov    %rsp,%r11
    2103:\tsub    $0x3000,%r11
    210a:\tsub    $0x1000,%rsp
    2111:\tmovq   $0x0,(%rsp)
    2119:\tcmp    %r11,%rsp
    211c:\tjne    210a <irpverbs_soft::firmware::Firmware::new+0xa>
    211e:\tsub    $0x200,%rsp
    2125:\tadd    $0xffffffffffffff80,%rsp
    2129:\tret

0000000000003000 <alloc::raw_vec::RawVec<T,A>::grow_one>:
    3000:\tpush   %rax
    3001:\tcall   3100 <irpverbs_cm::engine::Engine::receive>
    3006:\tpop    %rax
    3007:\tret

0000000000003100 <irpverbs_cm::engine::Engine::receive>:
    3100:\tsub    $0x18,%rsp
    3104:\tcall   3000 <alloc::raw_vec::RawVec<T,A>::grow_one>
    3109:\tadd    $0x18,%rsp
    310d:\tret

0000000000003200 <irpverbs_host::device::HostDevice::new>:
    3200:\tsub    $0x2000,%rsp
    3207:\tcall   2000 <irpverbs_soft::SoftHca<P>::new>
    320c:\tcall   3300 <std::io::stdio::_print>
    3211:\tret

0000000000003300 <std::io::stdio::_print>:
    3300:\tsub    $0x1800,%rsp
    3307:\tret

0000000000003400 <irpverbs_core::device::Device<P,H>::dpc>:
    3400:\tpush   %rbp
    3401:\tmov    %rsp,%rbp
    3404:\tand    $0xffffffffffffffc0,%rsp
    3408:\tsub    %rax,%rsp
    340b:\tmov    $0x2800,%eax
    3410:\tcall   3500 <__rust_probestack>
    3415:\tsub    %rax,%rsp
    3418:\tret

0000000000003500 <__rust_probestack>:
    3500:\tret

0000000000005000 <core::panicking::panic_bounds_check>:
    5000:\tsub    $0x4000,%rsp
    5007:\tcall   *%rax
";

const RELOCS: &str = "
target/release/irpverbs:     file format elf64-x86-64

DYNAMIC RELOCATION RECORDS
OFFSET           TYPE              VALUE
0000000000004000 R_X86_64_RELATIVE  *ABS*+0x0000000000003000
0000000000004008 R_X86_64_GLOB_DAT  memcpy@GLIBC_2.14
";

fn graph() -> Graph {
    Graph::new(parse(SAMPLE), &parse_relocations(RELOCS))
}

fn func<'a>(funcs: &'a [Function], name: &str) -> &'a Function {
    funcs.iter().find(|f| f.name == name).expect(name)
}

#[test]
fn frames_count_pushes_subs_probes_and_realignment() {
    let funcs = parse(SAMPLE);
    assert_eq!(funcs.len(), 10);
    let entry = func(&funcs, "irpverbs_core::device::Device<P,H>::dispatch_ioctl");
    // Return address, three pushes, 0x3a0; the `sub $-128` is an add.
    assert_eq!(entry.frame, 8 + 24 + 0x3a0);
    assert_eq!(entry.calls, vec![0x2000, 0x5000]);
    assert_eq!(entry.tail_calls, vec![0x3000]);
    assert_eq!(entry.got_calls, vec![0x4000, 0x4008]);
    assert_eq!(entry.indirect_calls, 1);
    assert!(!entry.dynamic_stack);
    // Two unrolled probes and the rest.
    let new = func(&funcs, "irpverbs_soft::SoftHca<P>::new");
    assert_eq!(new.frame, 8 + 8 + 0x2000 + 0x178);
    // The probe loop counts its %r11 distance, not the loop's one page;
    // `add $-128,%rsp` is a sub.
    let fw = func(&funcs, "irpverbs_soft::firmware::Firmware::new");
    assert_eq!(fw.frame, 8 + 0x3000 + 0x200 + 0x80);
    assert!(fw.tail_calls.is_empty(), "a loop's jump is no tail call");
    // Realignment counts its alignment; `__rust_probestack` counts %eax
    // and its `sub %rax,%rsp` is no dynamic allocation, but the one before
    // is.
    let dpc = func(&funcs, "irpverbs_core::device::Device<P,H>::dpc");
    assert_eq!(dpc.frame, 8 + 8 + 0x40 + 0x2800);
    assert!(dpc.dynamic_stack);
    assert!(dpc.calls.is_empty(), "the probe is no call");
}

#[test]
fn got_calls_resolve_through_the_relocations() {
    let relocs = parse_relocations(RELOCS);
    assert_eq!(relocs.get(&0x4000), Some(&Slot::Local(0x3000)));
    assert_eq!(
        relocs.get(&0x4008),
        Some(&Slot::External("memcpy@GLIBC_2.14".into()))
    );
    let g = graph();
    let entry = g
        .funcs
        .iter()
        .find(|f| f.addr == 0x1000)
        .expect("the entry");
    assert_eq!(entry.calls, vec![0x2000, 0x3000, 0x5000]);
    assert_eq!(entry.external_calls, vec!["memcpy@GLIBC_2.14".to_owned()]);
}

#[test]
fn names_are_classified_by_crate() {
    assert_eq!(
        classify("irpverbs_core::device::Device<P,H>::dispatch_ioctl"),
        Class::Driver
    );
    assert_eq!(
        classify("<irpverbs_soft::SoftHca<P> as irpverbs_core::hca::Hca>::post_command"),
        Class::Driver
    );
    // The host platform's lock runs the driver's closures.
    assert_eq!(
        classify(
            "<irpverbs_host::platform::spinlock::HostSpinLock<T> as irpverbs_core::platform::SpinLock<T>>::lock"
        ),
        Class::Driver
    );
    // The host's UDP wire and bus stand for what is below and beside the
    // driver on Windows.
    assert_eq!(
        classify("<irpverbs_host::udp::UdpLink as irpverbs_soft::link::Link>::transmit"),
        Class::Host
    );
    assert_eq!(
        classify("<irpverbs_host::device::Bus as irpverbs_soft::SoftBus>::raise"),
        Class::Host
    );
    assert_eq!(
        classify(
            "<irpverbs_host::platform::HostPlatform as irpverbs_core::platform::Platform>::new_lock"
        ),
        Class::Driver
    );
    assert_eq!(
        classify("irpverbs_host::device::HostDevice::new"),
        Class::Host
    );
    assert_eq!(
        classify("<irpverbs_host::platform::HostPlatform as core::fmt::Debug>::fmt"),
        Class::Host
    );
    assert_eq!(
        classify("core::ptr::drop_in_place<irpverbs_soft::engine::DataPath>"),
        Class::Driver
    );
    assert_eq!(
        classify("alloc::raw_vec::RawVec<T,A>::grow_one"),
        Class::Library
    );
    assert!(is_terminal("core::panicking::panic_bounds_check"));
    assert!(is_terminal("core::result::unwrap_failed"));
    assert!(!is_terminal("alloc::raw_vec::RawVec<T,A>::grow_one"));
}

#[test]
fn the_budget_holds_driver_code_and_the_library_code_it_reaches() {
    let budget = Budget {
        frame: 0x1000,
        chain: 0x4000,
        indirect_allowance: 0x100,
    };
    let entries = [
        (
            "IOCTL dispatch",
            "irpverbs_core::device::Device<P,H>::dispatch_ioctl",
        ),
        ("DPC", "irpverbs_core::device::Device<P,H>::dpc"),
        ("nowhere", "irpverbs_core::device::Device<P,H>::gone"),
    ];
    let report = graph().check(&entries, budget);
    let names: Vec<&str> = report.frames.iter().map(|(_, n, _)| n.as_str()).collect();
    // Worst first; the host's own functions and what only they reach
    // (`_print`) are not held to it, nor is the panic path; library code
    // that driver code calls is.
    assert_eq!(
        names,
        [
            "irpverbs_soft::firmware::Firmware::new",
            "irpverbs_core::device::Device<P,H>::dpc",
            "irpverbs_soft::SoftHca<P>::new",
            "irpverbs_core::device::Device<P,H>::dispatch_ioctl",
            "irpverbs_cm::engine::Engine::receive",
            "alloc::raw_vec::RawVec<T,A>::grow_one",
        ]
    );
    assert_eq!(report.frames_over(budget).count(), 3);
    assert_eq!(
        report.dynamic,
        vec!["irpverbs_core::device::Device<P,H>::dpc".to_owned()]
    );
    assert_eq!(report.indirect_sites, 1);

    // dispatch_ioctl -> SoftHca::new -> Firmware::new is the deepest; the
    // tail jump to grow_one (-> receive -> grow_one: a cycle) is not.
    let chain = &report.chains[0];
    assert_eq!(chain.label, "IOCTL dispatch");
    let fw = 8 + 0x3000 + 0x200 + 0x80;
    let new = 8 + 8 + 0x2000 + 0x178;
    let entry = 8 + 24 + 0x3a0;
    assert_eq!(chain.depth, entry + new + fw);
    let links: Vec<&str> = chain.links.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        links,
        [
            "irpverbs_core::device::Device<P,H>::dispatch_ioctl",
            "irpverbs_soft::SoftHca<P>::new",
            "irpverbs_soft::firmware::Firmware::new",
        ]
    );
    assert_eq!(report.chains_over(budget).count(), 1);
    assert_eq!(
        report.cycles,
        vec![vec![
            "alloc::raw_vec::RawVec<T,A>::grow_one".to_owned(),
            "irpverbs_cm::engine::Engine::receive".to_owned(),
        ]]
    );
    assert_eq!(report.chains[1].depth, 8 + 8 + 0x40 + 0x2800);
    assert_eq!(
        report.missing_entries,
        vec!["nowhere: irpverbs_core::device::Device<P,H>::gone".to_owned()]
    );
    assert!(!report.passes(budget));
    let text = report.render(budget, 3);
    assert!(text.contains("OVER"), "{text}");
    assert!(text.starts_with("10 functions, 6 held"), "{text}");
    assert!(
        text.contains(
            "FAIL: 3 frame(s) over 4096 B, 1 chain(s) over 16384 B, 1 entr(y/ies) missing"
        ),
        "{text}"
    );
}

#[test]
fn a_tail_call_reuses_the_callers_frame_and_indirect_calls_add_the_allowance() {
    let budget = Budget {
        frame: 0x10000,
        chain: 0x10000,
        indirect_allowance: 0x100,
    };
    let g = graph();
    let report = g.check(&[("tail", "alloc::raw_vec::RawVec<T,A>::grow_one")], budget);
    // grow_one (16) -> receive (0x20) -> back edge: nothing more.
    assert_eq!(report.chains[0].depth, 16 + 0x20);

    let tail = "
0000000000001000 <irpverbs_core::a>:
    1000:\tsub    $0x100,%rsp
    1007:\tcall   *%rax
    100a:\tadd    $0x100,%rsp
    1011:\tjmp    2000 <irpverbs_core::b>

0000000000002000 <irpverbs_core::b>:
    2000:\tsub    $0x40,%rsp
    2007:\tret
";
    let g = Graph::new(parse(tail), &HashMap::new());
    let report = g.check(&[("a", "irpverbs_core::a")], budget);
    // a's frame and the allowance beat the tail-called b (whose frame
    // replaces a's).
    assert_eq!(report.chains[0].depth, 8 + 0x100 + 0x100);
    assert_eq!(report.chains[0].links.len(), 1);
    let report = g.check(
        &[("a", "irpverbs_core::a")],
        Budget {
            indirect_allowance: 0,
            ..budget
        },
    );
    assert_eq!(report.chains[0].depth, 8 + 0x100);
}

#[test]
fn the_allocator_is_a_leaf_taking_the_platform_allowance() {
    let budget = Budget {
        frame: 0x1000,
        chain: 0x1000,
        indirect_allowance: 0x100,
    };
    // Host mode's global allocator records a backtrace (a deep chain of
    // the verifier's own): the chain stops at the allocator's entry point.
    let text = "
0000000000001000 <irpverbs_core::a>:
    1000:\tsub    $0x100,%rsp
    1007:\tcall   2000 <__rustc::__rust_alloc>
    100c:\tadd    $0x100,%rsp
    1013:\tret

0000000000002000 <__rustc::__rust_alloc>:
    2000:\tpush   %rax
    2001:\tcall   3000 <irpverbs_host::platform::pool::Pool::record_site>
    2006:\tpop    %rax
    2007:\tret

0000000000003000 <irpverbs_host::platform::pool::Pool::record_site>:
    3000:\tsub    $0x4000,%rsp
    3007:\tcall   4000 <std::backtrace::Backtrace::force_capture>
    300c:\tret

0000000000004000 <std::backtrace::Backtrace::force_capture>:
    4000:\tsub    $0x4000,%rsp
    4007:\tret
";
    let g = Graph::new(parse(text), &HashMap::new());
    let report = g.check(&[("a", "irpverbs_core::a")], budget);
    let chain = &report.chains[0];
    assert_eq!(chain.depth, (8 + 0x100) + (8 + 8) + 0x100);
    let links: Vec<(&str, bool)> = chain
        .links
        .iter()
        .map(|l| (l.name.as_str(), l.allocator))
        .collect();
    assert_eq!(
        links,
        [("irpverbs_core::a", false), ("__rustc::__rust_alloc", true)]
    );
    assert!(report.passes(budget), "{}", report.render(budget, 5));
    // What only the allocator reaches is not held to the frame budget.
    let names: Vec<&str> = report.frames.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(names, ["irpverbs_core::a", "__rustc::__rust_alloc"]);
    assert!(
        report
            .render(budget, 5)
            .contains("__rustc::__rust_alloc (+256 B: the platform's pool)")
    );
    assert!(is_allocator("__rust_dealloc"));
    assert!(is_allocator("__rustc::__rust_realloc"));
    assert!(!is_allocator("__rustc::__rust_alloc_error_handler"));
}

#[test]
fn global_alloc_methods_are_the_allocator() {
    assert!(is_allocator(
        "<irpverbs_host::platform::heap::DriverHeap as core::alloc::global::GlobalAlloc>::realloc"
    ));
    assert!(is_allocator(
        "<irpverbs_kalloc::Aligned<R> as core::alloc::global::GlobalAlloc>::alloc_zeroed"
    ));
    assert!(!is_allocator(
        "<irpverbs_host::platform::heap::DriverHeap as core::alloc::global::GlobalAlloc>::other"
    ));
    assert!(!is_allocator("alloc::raw_vec::RawVecInner<A>::finish_grow"));
}
