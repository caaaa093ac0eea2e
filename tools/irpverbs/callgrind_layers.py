#!/usr/bin/env python3
"""Instructions of a callgrind run by layer (tools/irpverbs/ibverbs_cost.sh).

    callgrind_layers.py CALLGRIND_OUT

prints one line of `key=value` words:

- total: every instruction of the run;
- program, layer, driver, system: the run's instructions split by who
  executes them, each function's own instructions going to its layer:
  - program: the benchmark's own code (perftest's binary, or
    irpverbs_tools and the `irpverbs` binary's crate);
  - layer: the verbs API the program calls (libibverbs over irpverbs:
    irpverbs_ibverbs, irpverbs_rdmacm and the speed-path library
    irpverbs_host_c; or irpverbs perf's irpverbs_verbs);
  - driver: the host-mode driver and soft HCA both run the same way
    (every other irpverbs crate, crc32fast);
  - system: what neither calls (the dynamic loader's start-up, threads'
    start);
  the C library, the dynamic loader's lazy calls and Rust's std / core /
  alloc functions not inlined count for the layer of the function that
  called them (a callback from them into a layer counts for that layer);
- polls: calls of the layer's poll function (libibverbs' `poll_cq` op,
  or irpverbs perf's `Cq::poll`);
- empty: the polls that found nothing at all: no completion, and then no
  datagram on the UDP wire (a poll that finds no completion polls the
  wire, `HostDevice::poll_wire`, through the library's `IvUserPollCq` or
  irpverbs perf's idle step; a wire poll that receives nothing then
  flushes the ACKs it held, `SoftHca::flush_tx`, which is what counts
  them);
- empty_ir: the busy-wait, those empty polls' instructions, estimated as
  their number times (a poll call's average instructions without its wire
  poll + a wire poll's average without the datagrams it delivered): more
  than they cost, as the averages include the polls that found something
  (the HCA's deferred work on a batch that held datagrams is in them).
"""

import re
import sys

PROGRAM = ("irpverbs_tools::", "irpverbs::")
LAYER = ("irpverbs_ibverbs::", "irpverbs_rdmacm::", "irpverbs_host_c::", "IvUser",
         "ibv_", "rdma_", "irpverbs_verbs::")
SHARED_OBJ = ("libc.so", "ld-linux", "libm.so", "libgcc_s", "vgpreload", "libpthread")
SHARED_FN = ("std::", "core::", "alloc::", "<std::", "<core::", "<alloc::", "__rust",
             "hashbrown::", "<hashbrown::")
POLL = ("irpverbs_ibverbs::cq::poll_cq", "irpverbs_verbs::objects::Cq::poll")
WIRE = "irpverbs_host::device::HostDevice::poll_wire"
WIRE_EMPTY = "irpverbs_soft::scheduler::<impl irpverbs_soft::SoftHca<P>>::flush_tx"
IN_POLL = "IvUserPollCq"
DELIVER = "<irpverbs_host::device::DeviceEndpoint as irpverbs_host::udp::Endpoint>::receive_queued"


def parse(path):
    """(self cost by function, edges (caller, callee) -> [calls, inclusive],
    object by function, total)."""
    names = {"ob": {}, "fn": {}, "fl": {}}
    own = {}
    edges = {}
    obj_of = {}
    total = 0
    ob = fn = None
    call = None  # (callee, count) of a pending calls= line
    cob = None
    ref = re.compile(r"^\((\d+)\)(?: (.*))?$")

    def name(kind, v):
        m = ref.match(v)
        if not m:
            return v
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), v)

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                cost = int(parts[1]) if len(parts) > 1 else 0
                if call is not None:
                    e = edges.setdefault((fn, call[0]), [0, 0])
                    e[0] += call[1]
                    e[1] += cost
                    call = None
                else:
                    own[fn] = own.get(fn, 0) + cost
                continue
            key, _, v = line.partition("=")
            if key == "ob":
                ob = name("ob", v)
            elif key == "cob":
                cob = name("ob", v)
            elif key in ("fl", "fi", "fe", "cfi", "cfl"):
                name("fl", v)
            elif key == "fn":
                fn = clean(name("fn", v))
                obj_of[fn] = ob
                cob = None
            elif key == "cfn":
                callee = clean(name("fn", v))
                obj_of.setdefault(callee, cob if cob is not None else ob)
                cob = None
                call = (callee, 0)
            elif key == "calls":
                call = (call[0], int(v.split()[0]))
            elif line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    return own, edges, obj_of, total


def clean(fn):
    """A function's name without callgrind's recursion marks."""
    return re.sub(r"'\d+$", "", fn)


def layer(fn, obj):
    if any(s in (obj or "") for s in SHARED_OBJ) or fn.startswith(SHARED_FN):
        return None
    if fn.startswith(LAYER):
        return "layer"
    if fn.startswith(PROGRAM):
        return "program"
    if fn.startswith(("irpverbs_", "<irpverbs_", "crc32fast")):
        return "driver"
    if "irpverbs" not in (obj or "") and "libibverbs" not in (obj or ""):
        return "program"
    # An unnamed or foreign symbol of the library: the driver's.
    return "driver"


def main():
    own, edges, obj_of, total = parse(sys.argv[1])
    out_of = {}
    for (a, b), (n, incl) in edges.items():
        out_of.setdefault(a, []).append((b, n, incl))
    kind = {fn: layer(fn, obj_of.get(fn)) for fn in set(own) | set(obj_of)}

    # The part of a shared function's inclusive cost that is its own (and
    # its shared callees'), not a callback into a layer (`main` below
    # `__libc_start_main`, a thread's function below std's thread start).
    ratio = {}

    def shared_part(g, seen):
        if g in ratio:
            return ratio[g]
        if g in seen:
            return 1.0
        seen.add(g)
        incl = own.get(g, 0) + sum(i for _, _, i in out_of.get(g, []))
        cb = 0.0
        for b, _, i in out_of.get(g, []):
            if kind.get(b) is not None:
                cb += i
            elif b != g:
                cb += i * (1.0 - shared_part(b, seen))
        ratio[g] = 1.0 if incl == 0 else max(0.0, (incl - cb) / incl)
        return ratio[g]

    sys.setrecursionlimit(100000)
    for g, k in kind.items():
        if k is None:
            shared_part(g, set())
    sums = {"program": 0.0, "layer": 0.0, "driver": 0.0}
    for fn, k in kind.items():
        if k is None:
            continue
        c = own.get(fn, 0)
        for b, _, incl in out_of.get(fn, []):
            if kind.get(b) is None:
                c += incl * ratio.get(b, 1.0)
        sums[k] += c
    system = total - sum(sums.values())

    polls = sum(n for (a, b), (n, _) in edges.items() if b in POLL and a not in POLL)
    poll_ir = sum(i for (a, b), (_, i) in edges.items() if b in POLL and a not in POLL)
    wire_calls = sum(n for (a, b), (n, _) in edges.items() if b == WIRE and a != WIRE)
    wire_ir = sum(i for (a, b), (_, i) in edges.items() if b == WIRE and a != WIRE)
    # The wire polls inside the poll calls (libibverbs' IvUserPollCq).
    wire_in_poll = sum(i for (a, b), (_, i) in edges.items() if b == WIRE and a == IN_POLL)
    # A wire poll that received nothing sends the ACKs it held: only then.
    empty = sum(n for (a, b), (n, _) in edges.items() if a == WIRE and b == WIRE_EMPTY)
    per_poll = (poll_ir - wire_in_poll) / polls if polls else 0.0
    # The datagrams a wire poll hands to the HCA are work, not waiting.
    delivered = sum(i for (a, b), (_, i) in edges.items() if b == DELIVER)
    per_wire = (wire_ir - delivered) / wire_calls if wire_calls else 0.0
    empty_ir = empty * (per_poll + per_wire)
    print(f"total={total} program={sums['program']:.0f} layer={sums['layer']:.0f} "
          f"driver={sums['driver']:.0f} system={system:.0f} polls={polls} empty={empty} "
          f"empty_ir={empty_ir:.0f}")


if __name__ == "__main__":
    main()
