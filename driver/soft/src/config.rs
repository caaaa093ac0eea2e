//! Device configuration: limits, identity, address, execution mode.

use core::net::{IpAddr, Ipv4Addr};

use irpverbs_abi::{NtStatus, STATUS_INVALID_PARAMETER};

/// Where the firmware runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Execution {
    /// [`crate::SoftHca`]'s `post_command` executes the queued commands at
    /// once, on the caller's thread, under the same hold of its queue lock; a
    /// data-path doorbell runs the work it announces (and what that work
    /// causes, on this HCA and on the inline HCAs it sends to) before it
    /// returns. Deterministic; used by tests and for speed.
    #[default]
    Inline,
    /// `post_command` and the data-path doorbells only record the work and
    /// call [`crate::SoftBus::doorbell`]; the host runs
    /// [`crate::SoftHca::run_firmware`] from its own "hardware" thread, as a
    /// real HCA's firmware runs beside the CPU.
    Deferred,
}

/// Configuration of a [`crate::SoftHca`]: its identity, its port's address,
/// its limits and how its firmware runs.
///
/// Work queue and CQ depths are rings of 2^k slots holding up to 2^k - 1
/// entries, so `max_qp_wr`, `max_cqe` and `max_srq_wr` must be of the form
/// 2^k - 1. [`SoftConfig::validate`] states every rule.
///
/// The [`Default`] limits are close to Linux rdma_rxe's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftConfig {
    /// Node GUID (also the system image GUID). Default
    /// `0x0200_00FF_FE00_0001` (a locally administered EUI-64).
    pub node_guid: u64,
    /// The port's IP address. GID index 0 is its IPv4-mapped form
    /// (`::ffff:a.b.c.d`) or the IPv6 address itself. Default 127.0.0.1.
    pub ip: IpAddr,
    /// More addresses of the port, at GID indexes 1, 2, ... (as a RoCE
    /// port's GID table holds each IP address of its interface): at most
    /// [`crate::GID_TBL_LEN`] - 1, none unspecified or repeated. The
    /// GSI takes MADs for any of them, and wires that route by GID (the
    /// loopback wire, [`crate::SoftHca::owns_gid`]) deliver to them; the
    /// UDP wire binds `ip` only. Default none.
    pub aliases: alloc::vec::Vec<IpAddr>,
    /// The UDP port the port's RoCEv2 datagrams are sent to (and that its
    /// link listens on). The ICRC covers it, so every HCA of a wire must
    /// agree. Default 4791 ([`crate::net::link::DEFAULT_PORT`]).
    pub udp_port: u16,
    /// Where the firmware runs. Default [`Execution::Inline`].
    pub execution: Execution,
    /// Command queue slots: `post_command` gives the command back when this
    /// many are queued and not yet executed. Default 64.
    pub cmd_queue_depth: usize,
    /// Event queue entries, at least 2. The firmware only executes a command
    /// when the event queue has room for everything the command may produce
    /// (its completion and one async event), so no command completion is
    /// ever lost: a full event queue stalls the command queue until the
    /// driver polls. Default 256.
    pub eq_depth: usize,
    /// Completion vectors, 2 to [`MAX_COMP_VECTORS`]: an event queue, an
    /// interrupt and a DPC each (the async event queue comes on top).
    /// Default 2; the hosts (the host device, irpverbs.sys) default it to
    /// the processor count ([`default_comp_vectors`]).
    pub num_comp_vectors: u32,
    /// Max QPs (QP0 and QP1 not counted), at most 0xFF_FFFE. Default 0x1_0000.
    pub max_qp: u32,
    /// Max WRs per send or receive queue, 2^k - 1. Default 0x3FFF.
    pub max_qp_wr: u32,
    /// Max SGEs per send or receive WR. Default 32.
    pub max_sge: u32,
    /// Max SGEs per RDMA READ. Default 32.
    pub max_sge_rd: u32,
    /// Max CQs. Default 0x4000.
    pub max_cq: u32,
    /// Max entries per CQ, 2^k - 1. Default 0x7FFF.
    pub max_cqe: u32,
    /// Max MRs, at most 0x7F_FFFF (the key's 24-bit index, whose top bit
    /// marks a memory window's). Default 0x1_0000.
    pub max_mr: u32,
    /// Max memory windows, at most 0x7F_FFFF. Default 0x1_0000.
    pub max_mw: u32,
    /// Largest MR in bytes. Default 1 TiB (2^40).
    pub max_mr_size: u64,
    /// Max PDs. Default 0x1_0000.
    pub max_pd: u32,
    /// Max SRQs. Default 0x4000.
    pub max_srq: u32,
    /// Max WRs per SRQ, 2^k - 1. Default 0x3FFF.
    pub max_srq_wr: u32,
    /// Max SGEs per SRQ WR. Default 32.
    pub max_srq_sge: u32,
    /// Max address handles. Default 0x4000.
    pub max_ah: u32,
    /// Max inline data per send WR, in bytes. Default 400.
    pub max_inline_data: u32,
    /// Max outstanding RDMA READ / atomic per QP as responder, at most 255.
    /// Default 128.
    pub max_qp_rd_atom: u32,
    /// Max outstanding RDMA READ / atomic per QP as requester, at most 255.
    /// Default 128.
    pub max_qp_init_rd_atom: u32,
    /// Max responder resources for the whole device: the sum of the QPs'
    /// `max_dest_rd_atomic` (a modify that would pass it is refused).
    /// Default 0x80_0000 (`max_qp` x `max_qp_rd_atom`, as mlx5 reports it:
    /// every QP can have its maximum).
    pub max_res_rd_atom: u32,
    /// The data path's work per call, in packets (sent and received, the
    /// fast path's counted as the packets they stand for): a doorbell, a
    /// received datagram, the timer, the doorbell scanner or a DPC runs at
    /// most this much (plus the step that crosses it: one fast-path turn
    /// of at most one message, or the requester's 256-packet turn)
    /// and requeues the rest ([`crate::SoftBus::resume`]: another DPC;
    /// deferred, the firmware's own doorbell), as a real driver bounds its
    /// DPC for the watchdog. At least 1. Default [`DEFAULT_DPC_BUDGET`].
    pub dpc_budget: u32,
    /// Whether RC requests between two QPs of this HCA are short-circuited
    /// to the peer's responder, and its responses to the requester's
    /// completer, without frames ([`crate::transport::local`]; the send
    /// doorbell's fast path, `transport/fast.rs`, in front of it); when
    /// false every looped-back packet travels as a frame through the
    /// loopback queue, as it would through a wire. The same requester,
    /// responder and completer run either way; the frames cost a queue
    /// and a reference to each payload's memory per packet. Default true.
    pub short_circuit: bool,
    /// Whether the send doorbell's fast path (`transport/fast.rs`) runs
    /// in front of the requester between two QPs of this HCA (with
    /// [`Self::short_circuit`]); when false the requester takes every
    /// WQE, short-circuited: the same completions and memory, in more
    /// instructions. For measuring and testing the short-circuit alone.
    /// Default true.
    pub fast_path: bool,
}

/// Most completion vectors a soft HCA has ([`SoftConfig::num_comp_vectors`]).
pub const MAX_COMP_VECTORS: u32 = 64;

/// The completion vectors for a machine of `processors` processors: one
/// per processor, at least 2 and at most [`MAX_COMP_VECTORS`].
///
/// IRQL: any.
#[must_use]
pub const fn default_comp_vectors(processors: u32) -> u32 {
    if processors < 2 {
        2
    } else if processors > MAX_COMP_VECTORS {
        MAX_COMP_VECTORS
    } else {
        processors
    }
}

/// [`SoftConfig::dpc_budget`]'s default: 4096 packets (4 MiB at the
/// port's 1024-byte MTU).
pub const DEFAULT_DPC_BUDGET: u32 = 4096;

impl Default for SoftConfig {
    fn default() -> Self {
        Self {
            node_guid: 0x0200_00FF_FE00_0001,
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            aliases: alloc::vec::Vec::new(),
            udp_port: crate::net::link::DEFAULT_PORT,
            execution: Execution::Inline,
            cmd_queue_depth: 64,
            eq_depth: 256,
            num_comp_vectors: 2,
            max_qp: 0x1_0000,
            max_qp_wr: 0x3FFF,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: 0x4000,
            max_cqe: 0x7FFF,
            max_mr: 0x1_0000,
            max_mw: 0x1_0000,
            max_mr_size: 1 << 40,
            max_pd: 0x1_0000,
            max_srq: 0x4000,
            max_srq_wr: 0x3FFF,
            max_srq_sge: 32,
            max_ah: 0x4000,
            max_inline_data: 400,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: 0x80_0000,
            dpc_budget: DEFAULT_DPC_BUDGET,
            short_circuit: true,
            fast_path: true,
        }
    }
}

/// Largest QP number (24 bits).
pub(crate) const MAX_QPN: u32 = 0xFF_FFFF;
/// First QP number the firmware hands out (QP0 and QP1 are reserved).
pub(crate) const FIRST_QPN: u32 = 2;
/// Largest MR index (the upper 24 bits of a key).
pub(crate) const MAX_MR_INDEX: u32 = 0x7F_FFFF;
/// Events one command may produce: its completion and one async event.
pub(crate) const EVENTS_PER_COMMAND: usize = 2;

/// 2^k - 1 for some k in 1..=31.
const fn is_ring_limit(n: u32) -> bool {
    n != 0 && n < (1 << 31) && (n & (n + 1)) == 0
}

impl SoftConfig {
    /// Checks that the configuration is consistent.
    ///
    /// IRQL: any.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` when `cmd_queue_depth` is 0, `eq_depth` is
    /// below 2, `num_comp_vectors` is not 2 to [`MAX_COMP_VECTORS`], `max_qp_wr`, `max_cqe` or
    /// `max_srq_wr` is not 2^k - 1 (k <= 31), `max_qp` exceeds 0xFF_FFFE,
    /// `max_mr` or `max_mw` exceeds 0x7F_FFFF, `max_qp_rd_atom` or `max_qp_init_rd_atom`
    /// exceeds 255, `max_mr_size` is 0, `dpc_budget` is 0, or `aliases`
    /// are too many, unspecified or repeated (`ip` included).
    pub fn validate(&self) -> Result<(), NtStatus> {
        let ok = self.cmd_queue_depth >= 1
            && self.eq_depth >= EVENTS_PER_COMMAND
            && (2..=MAX_COMP_VECTORS).contains(&self.num_comp_vectors)
            && is_ring_limit(self.max_qp_wr)
            && is_ring_limit(self.max_cqe)
            && is_ring_limit(self.max_srq_wr)
            && self.max_qp <= MAX_QPN - FIRST_QPN + 1
            && self.max_mr <= MAX_MR_INDEX
            && self.max_mw <= MAX_MR_INDEX
            && self.max_qp_rd_atom <= u32::from(u8::MAX)
            && self.max_qp_init_rd_atom <= u32::from(u8::MAX)
            && self.max_mr_size >= 1
            && self.dpc_budget >= 1
            && self.aliases.len() < crate::firmware::port::GID_TBL_LEN as usize
            && self.aliases.iter().enumerate().all(|(k, a)| {
                !a.is_unspecified()
                    && crate::wire::ip::ip_gid(*a) != crate::wire::ip::ip_gid(self.ip)
                    && self.aliases[..k]
                        .iter()
                        .all(|b| crate::wire::ip::ip_gid(*b) != crate::wire::ip::ip_gid(*a))
            });
        if ok {
            Ok(())
        } else {
            Err(STATUS_INVALID_PARAMETER)
        }
    }
}

/// The number of entries a ring sized for at least `n` entries holds:
/// 2^k - 1 >= n. `n` must be below 2^31.
pub(crate) const fn ring_entries(n: u32) -> u32 {
    (n + 1).next_power_of_two() - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        assert_eq!(SoftConfig::default().validate(), Ok(()));
    }

    #[test]
    fn inconsistent_configs_are_refused() {
        let bad: [fn(&mut SoftConfig); 14] = [
            |c| c.cmd_queue_depth = 0,
            |c| c.eq_depth = 1,
            |c| c.num_comp_vectors = 1,
            |c| c.num_comp_vectors = MAX_COMP_VECTORS + 1,
            |c| c.max_qp_wr = 0x4000,
            |c| c.max_cqe = 0,
            |c| c.max_srq_wr = u32::MAX,
            |c| c.max_qp = 0xFF_FFFF,
            |c| c.max_mr = 0x100_0000,
            |c| c.max_mr = 0x80_0000,
            |c| c.max_mw = 0x80_0000,
            |c| c.max_qp_rd_atom = 256,
            |c| c.max_qp_init_rd_atom = 256,
            |c| c.max_mr_size = 0,
        ];
        for (i, f) in bad.iter().enumerate() {
            let mut c = SoftConfig::default();
            f(&mut c);
            assert_eq!(c.validate(), Err(STATUS_INVALID_PARAMETER), "case {i}");
        }
    }

    #[test]
    fn rings_round_up_to_a_power_of_two_minus_one() {
        assert_eq!(ring_entries(0), 0);
        assert_eq!(ring_entries(1), 1);
        assert_eq!(ring_entries(2), 3);
        assert_eq!(ring_entries(3), 3);
        assert_eq!(ring_entries(4), 7);
        assert_eq!(ring_entries(0x7FFF), 0x7FFF);
        assert_eq!(ring_entries((1 << 31) - 1), (1 << 31) - 1);
    }
}
