//! Schedules survive a JSON round trip unchanged, and export to MSCCL's XML with every step
//! accounted for.

use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::{msccl::to_msccl_xml, Collective, Schedule};
use topoccl_synth::topology::resolve;
use topoccl_synth::verify::verify;

#[test]
fn json_round_trip_keeps_every_schedule() {
    let reg = Registry::builtin();
    let topo = resolve("dgx1").unwrap();
    for g in reg.iter() {
        for c in Collective::ALL {
            if !g.supports(c) {
                continue;
            }
            let s = g.generate(&Request::new(&topo, c)).unwrap();
            let back = Schedule::from_json(&s.to_json().unwrap()).unwrap();
            assert_eq!(back, s, "{} {c}", g.name());
            verify(&back).unwrap();
        }
    }
    // Blink's all-reduce on a DGX-1 sends over PCIe beside NVLink: the marks round-trip too.
    let blink = reg.generate("blink", &Request::new(&topo, Collective::AllReduce)).unwrap();
    assert!(blink.ranks.iter().flat_map(|r| &r.channels).any(|c| !c.via_fabric.is_empty()));
    assert_eq!(Schedule::from_json(&blink.to_json().unwrap()).unwrap(), blink);
    assert!(Schedule::from_json("{\"name\": 3}").is_err());
}

#[test]
fn msccl_export_has_every_step() {
    let reg = Registry::builtin();
    let topo = resolve("dgx1").unwrap();
    for algo in ["ring", "tree", "rhd", "hier"] {
        let s = reg.generate(algo, &Request::new(&topo, Collective::AllReduce)).unwrap();
        let xml = to_msccl_xml(&s).unwrap();
        assert!(xml.starts_with("<algo name=\"") && xml.trim_end().ends_with("</algo>"), "{algo}");
        assert_eq!(xml.matches("<gpu id=").count(), 8, "{algo}");
        let steps = xml.matches("<step ").count() - xml.matches("type=\"nop\"").count();
        assert_eq!(steps as u64, s.stats().steps, "{algo}");
        // Every thread block names at most one send and one receive peer.
        for tb in xml.lines().filter(|l| l.trim_start().starts_with("<tb ")) {
            assert!(tb.contains("send=\"") && tb.contains("recv=\""), "{tb}");
        }
    }
}
