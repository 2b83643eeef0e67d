//! Emulated topologies: a topology turned into a real network on this machine, one network
//! namespace per node, one veth pair per link, each end shaped with `tc` to its link's
//! bandwidth times a scale factor (one htb class per rank pair crossing it, see [`shape`]),
//! routed exactly as the simulator routes. Ranks run inside the
//! rank namespaces and talk TCP over the shaped links, so a synthesized schedule meets real
//! sockets, real contention and real TCP, and the simulator can be checked against it.
//!
//! [`plan`] decides (pure, testable without root), [`netns`] runs iproute2, and [`Emulation`]
//! owns what was created: dropping it deletes every namespace (and with them every veth and
//! qdisc), also when a run fails or is interrupted. Namespaces are named
//! `topoccl-<pid>-<i>`; a run first deletes those of processes that no longer exist, so a run
//! killed with SIGKILL leaves nothing behind past the next one.

pub mod netns;
pub mod plan;
pub mod shape;

use std::net::Ipv4Addr;

use topoccl_synth::topology::Topology;

use crate::error::{Error, Result};
use plan::{NetPlan, ADDRESS_IFACE};

const PREFIX: &str = "topoccl-";

/// A built emulation; the network exists as long as this value does.
pub struct Emulation {
    pub plan: NetPlan,
    namespaces: Vec<String>,
}

/// Deletes the namespaces of emulations whose process is gone; returns their names.
pub fn reap_stale() -> Result<Vec<String>> {
    let mut reaped = Vec::new();
    for ns in netns::list()? {
        let Some(pid) = ns.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            netns::delete(&ns)?;
            reaped.push(ns);
        }
    }
    Ok(reaped)
}

/// The namespaces this process's emulations own.
pub fn own_namespaces() -> Result<Vec<String>> {
    let mine = format!("{PREFIX}{}-", std::process::id());
    Ok(netns::list()?.into_iter().filter(|n| n.starts_with(&mine)).collect())
}

/// MTU of the emulated links. The links stand for NVLink, PCIe and InfiniBand fabrics, whose
/// per-packet cost is not what an emulation measures; at Ethernet's 1500 bytes the kernel's
/// per-packet work dominates, and schedules with many small messages measure the CPU instead
/// of the links (the README's emulation section has the figures).
const LINK_MTU: u32 = 65_000;

/// TCP's minimum retransmission timeout on the routes of rank namespaces (see `wire`).
const RTO_MIN: &str = "5s";

impl Emulation {
    /// Builds the network for `topo` (`scale`: Mbit/s per GB/s, `None` for the default).
    pub fn build(topo: &Topology, scale: Option<f64>) -> Result<Emulation> {
        if let Some(why) = netns::unavailable() {
            return Err(Error::Emulation(why));
        }
        let plan = NetPlan::new(topo, scale)?;
        reap_stale()?;
        let pid = std::process::id();
        let namespaces: Vec<String> = (0..plan.nodes.len()).map(|i| format!("{PREFIX}{pid}-{i}")).collect();
        let mut emu = Emulation { plan, namespaces: Vec::new() };
        for ns in &namespaces {
            netns::add(ns)?;
            emu.namespaces.push(ns.clone());
        }
        emu.wire()?;
        Ok(emu)
    }

    fn wire(&self) -> Result<()> {
        let (plan, ns) = (&self.plan, &self.namespaces);
        let pairs: Vec<String> = plan
            .links
            .iter()
            .map(|l| {
                format!(
                    "link add {} netns {} type veth peer name {} netns {}",
                    l.iface_at(l.a),
                    ns[l.a],
                    l.iface_at(l.b),
                    ns[l.b]
                )
            })
            .collect();
        netns::batch("ip", None, &pairs)?;
        for (i, node) in plan.nodes.iter().enumerate() {
            netns::sysctl(
                &ns[i],
                &["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"],
            )?;
            let mut ip = vec![
                "link set lo up".to_string(),
                format!("link add {ADDRESS_IFACE} type veth peer name {ADDRESS_IFACE}p"),
                format!("addr add {}/32 dev {ADDRESS_IFACE}", node.ip),
                format!("link set {ADDRESS_IFACE}p up"),
                format!("link set {ADDRESS_IFACE} up"),
            ];
            for l in plan.links.iter().filter(|l| l.a == i || l.b == i) {
                ip.push(format!("link set {} mtu {LINK_MTU} up", l.iface_at(i)));
            }
            let tc = shape::tc_commands(plan, i);
            let mut tables = std::collections::BTreeSet::new();
            for h in plan.hops.iter().filter(|h| h.at == i) {
                let iface = plan.links[h.link].iface_at(i);
                let to = plan.nodes[h.to].ip;
                let via = if h.next == h.to { String::new() } else { format!(" via {} onlink", plan.nodes[h.next].ip) };
                // A pair's share of a slow shared link can be a few Mbit/s, where one 64 KB
                // packet takes longer than TCP's 200 ms minimum retransmission timeout: the
                // sender times out with nothing lost, collapses its window, and one run of a
                // schedule took 11 s, the next 14 s (cluster-2x4-slow, Blink, 1–20 timeouts
                // per rank). Queues here do not drop, so a late ACK is never a loss.
                if h.from == i {
                    ip.push(format!("route add {to}/32{via} dev {iface} src {} rto_min {RTO_MIN}", node.ip));
                } else {
                    let table = 100 + h.from;
                    if tables.insert(table) {
                        ip.push(format!("rule add from {}/32 lookup {table} pref {table}", plan.nodes[h.from].ip));
                    }
                    ip.push(format!("route add {to}/32{via} dev {iface} table {table}"));
                }
            }
            netns::batch("ip", Some(&ns[i]), &ip)?;
            netns::batch("tc", Some(&ns[i]), &tc)?;
        }
        Ok(())
    }

    /// The namespace rank `r` runs in.
    pub fn rank_namespace(&self, r: u32) -> Option<&str> {
        self.namespaces.get(r as usize).map(String::as_str)
    }

    /// The address rank `r` is reached at.
    pub fn rank_ip(&self, r: u32) -> Option<Ipv4Addr> {
        self.plan.nodes.get(r as usize).map(|n| n.ip)
    }

    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// Deletes everything; safe to call twice. Tries every namespace, reports the first error.
    pub fn teardown(&mut self) -> Result<()> {
        let mut first = None;
        for ns in self.namespaces.drain(..) {
            if let Err(e) = netns::delete(&ns) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Emulation {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("topoccl: tearing down the emulated network: {e}");
        }
    }
}
