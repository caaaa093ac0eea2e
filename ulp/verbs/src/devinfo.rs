//! `devinfo`: the device and its ports, printed as `ibv_devinfo` prints them.

use std::fmt::Write;

use irpverbs_abi::*;

use crate::{Client, IoctlResult};

fn port_state(s: u32) -> &'static str {
    match s {
        IV_PORT_DOWN => "PORT_DOWN",
        IV_PORT_INIT => "PORT_INIT",
        IV_PORT_ARMED => "PORT_ARMED",
        IV_PORT_ACTIVE => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

fn mtu(m: u32) -> u32 {
    if (IV_MTU_256..=IV_MTU_4096).contains(&m) {
        128 << m
    } else {
        0
    }
}

fn guid(g: u64) -> String {
    let b = g.to_be_bytes();
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]
    )
}

fn fw(v: u64) -> String {
    format!("{}.{}.{}", v >> 48, (v >> 32) & 0xFFFF, v & 0xFFFF_FFFF)
}

/// Formats a GID as IPv6 text (IPv4-mapped GIDs as `::ffff:a.b.c.d`).
#[must_use]
pub fn gid_to_string(gid: &[u8; 16]) -> String {
    if gid[..10] == [0; 10] && gid[10] == 0xFF && gid[11] == 0xFF {
        return format!("::ffff:{}.{}.{}.{}", gid[12], gid[13], gid[14], gid[15]);
    }
    std::net::Ipv6Addr::from(*gid).to_string()
}

/// Queries the device through `client` and formats it like `ibv_devinfo`
/// (`verbose`: like `ibv_devinfo -v`, with every limit and the GID table).
///
/// # Errors
/// The status of the first query that failed.
pub fn devinfo(client: &Client, name: &str, verbose: bool) -> IoctlResult<String> {
    let d = client.query_device()?;
    let mut s = String::new();
    let w = &mut s;
    let _ = writeln!(w, "hca_id:\t{name}");
    let _ = writeln!(w, "\ttransport:\t\t\tInfiniBand (0)");
    let _ = writeln!(w, "\tfw_ver:\t\t\t\t{}", fw(d.fw_ver));
    let _ = writeln!(w, "\tnode_guid:\t\t\t{}", guid(d.node_guid));
    let _ = writeln!(w, "\tsys_image_guid:\t\t\t{}", guid(d.sys_image_guid));
    let _ = writeln!(w, "\tvendor_id:\t\t\t{:#06x}", d.vendor_id);
    let _ = writeln!(w, "\tvendor_part_id:\t\t\t{}", d.vendor_part_id);
    let _ = writeln!(w, "\thw_ver:\t\t\t\t{:#x}", d.hw_ver);
    let _ = writeln!(
        w,
        "\tabi_ver:\t\t\t{}.{}",
        d.abi_version >> 16,
        d.abi_version & 0xFFFF
    );
    let _ = writeln!(w, "\tphys_port_cnt:\t\t\t{}", d.phys_port_cnt);
    if verbose {
        let limits: [(&str, u64); 24] = [
            ("max_mr_size", d.max_mr_size),
            ("page_size_cap", d.page_size_cap),
            ("max_qp", d.max_qp.into()),
            ("max_qp_wr", d.max_qp_wr.into()),
            ("device_cap_flags", d.device_cap_flags),
            ("max_sge", d.max_sge.into()),
            ("max_sge_rd", d.max_sge_rd.into()),
            ("max_cq", d.max_cq.into()),
            ("max_cqe", d.max_cqe.into()),
            ("max_mr", d.max_mr.into()),
            ("max_pd", d.max_pd.into()),
            ("max_qp_rd_atom", d.max_qp_rd_atom.into()),
            ("max_qp_init_rd_atom", d.max_qp_init_rd_atom.into()),
            ("max_res_rd_atom", d.max_res_rd_atom.into()),
            ("atomic_cap", d.atomic_cap.into()),
            ("max_srq", d.max_srq.into()),
            ("max_srq_wr", d.max_srq_wr.into()),
            ("max_srq_sge", d.max_srq_sge.into()),
            ("max_ah", d.max_ah.into()),
            ("max_inline_data", d.max_inline_data.into()),
            ("max_pkeys", d.max_pkeys.into()),
            ("num_comp_vectors", d.num_comp_vectors.into()),
            ("max_mw", d.max_mw.into()),
            (
                "max_fast_reg_page_list_len",
                d.max_fast_reg_page_list_len.into(),
            ),
        ];
        for (name, v) in limits {
            // Values start at column 40 (tabs of 8), as ibv_devinfo -v aligns them.
            let tabs = "\t".repeat((40usize.saturating_sub(9 + name.len())).div_ceil(8).max(1));
            let _ = writeln!(w, "\t{name}:{tabs}{v}");
        }
        let _ = writeln!(w, "\tlocal_ca_ack_delay:\t\t{}", d.local_ca_ack_delay);
    }
    for port in 1..=u32::from(d.phys_port_cnt) {
        let p = client.query_port(port)?;
        let _ = writeln!(w, "\t\tport:\t{port}");
        let _ = writeln!(w, "\t\t\tstate:\t\t\t{} ({})", port_state(p.state), p.state);
        let _ = writeln!(w, "\t\t\tmax_mtu:\t\t{} ({})", mtu(p.max_mtu), p.max_mtu);
        let _ = writeln!(
            w,
            "\t\t\tactive_mtu:\t\t{} ({})",
            mtu(p.active_mtu),
            p.active_mtu
        );
        let _ = writeln!(w, "\t\t\tsm_lid:\t\t\t{}", p.sm_lid);
        let _ = writeln!(w, "\t\t\tport_lid:\t\t{}", p.lid);
        let _ = writeln!(w, "\t\t\tport_lmc:\t\t{:#04x}", p.lmc);
        let layer = if p.link_layer == IV_LINK_LAYER_ETHERNET {
            "Ethernet"
        } else {
            "InfiniBand"
        };
        let _ = writeln!(w, "\t\t\tlink_layer:\t\t{layer}");
        if verbose {
            let _ = writeln!(w, "\t\t\tmax_msg_sz:\t\t{:#x}", p.max_msg_sz);
            let _ = writeln!(w, "\t\t\tport_cap_flags:\t\t{:#010x}", p.port_cap_flags);
            let _ = writeln!(w, "\t\t\tgid_tbl_len:\t\t{}", p.gid_tbl_len);
            let _ = writeln!(w, "\t\t\tpkey_tbl_len:\t\t{}", p.pkey_tbl_len);
            let _ = writeln!(
                w,
                "\t\t\tphys_state:\t\t{}",
                match p.phys_state {
                    5 => "LINK_UP (5)",
                    3 => "DISABLED (3)",
                    2 => "POLLING (2)",
                    _ => "DISABLED",
                }
            );
            for index in 0..p.gid_tbl_len {
                let gid = client.query_gid(port, index)?;
                if gid != [0; 16] {
                    let _ = writeln!(
                        w,
                        "\t\t\tGID[{index:>3}]:\t\t{}, RoCE v2",
                        gid_to_string(&gid)
                    );
                }
            }
        }
        let _ = writeln!(w);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let mut g = [0u8; 16];
        g[10] = 0xFF;
        g[11] = 0xFF;
        g[12..].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(gid_to_string(&g), "::ffff:10.0.0.1");
        assert_eq!(
            gid_to_string(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
            "fe80::1"
        );
        assert_eq!(guid(0x0002_c903_0001_0203), "0002:c903:0001:0203");
        assert_eq!(mtu(IV_MTU_1024), 1024);
        assert_eq!(mtu(0), 0);
        assert_eq!(fw(0x0001_0002_0000_0003), "1.2.3");
    }
}
