//! Blink against rings on every allocation of 3–8 GPUs of a DGX-1 (or another machine):
//! all-reduce busbw at one size in the simulator, as % of the optimality bound, as % of the
//! ceiling of trees that send each rank pair's traffic over one path (the bound also counts
//! trees that use a pair's PCIe path beside its NVLink, as Blink's all-reduce does), and the
//! speed-up over the ring. `cargo run --release -p topoccl-synth --example blink_fragments --
//! [machine] [bytes] [--all]` (without `--all`: the summary per GPU count, with: every subset).
use topoccl_synth::blink;
use topoccl_synth::bound::bound;
use topoccl_synth::generate::Request;
use topoccl_synth::registry::Registry;
use topoccl_synth::schedule::Collective;
use topoccl_synth::sim::simulate;
use topoccl_synth::topology::resolve;

struct Row {
    ranks: Vec<u32>,
    ring: f64,
    blink: f64,
    pct: f64,
    /// % of the one-path tree ceiling.
    one_path_pct: f64,
    plan_pct: f64,
}

fn main() -> Result<(), topoccl_synth::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let every = args.iter().any(|a| a == "--all");
    // Chunks per tree lane: the depths the tuner prices for Blink (p1 is Blink's default, 32).
    let pipelines: Vec<u32> = args
        .iter()
        .find_map(|a| a.strip_prefix("--pipelines="))
        .map_or(vec![32, 128], |l| l.split(',').filter_map(|p| p.parse().ok()).collect());
    let mut positional = args.iter().filter(|a| !a.starts_with("--"));
    let machine = positional.next().map_or("dgx1", String::as_str);
    let bytes: u64 = positional.next().and_then(|b| b.parse().ok()).unwrap_or(256 << 20);
    let whole = resolve(machine)?;
    let n = whole.nranks() as u32;
    let reg = Registry::builtin();
    let coll = Collective::AllReduce;
    let mut rows: Vec<Row> = Vec::new();
    for mask in 1u32..(1 << n) {
        let k = mask.count_ones();
        if k < 3 {
            continue;
        }
        let ranks: Vec<u32> = (0..n).filter(|r| mask >> r & 1 == 1).collect();
        let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
        let topo = resolve(&format!("{machine}[{}]", list.join(",")))?;
        let b = bound(&topo, coll);
        let busbw = |algo: &str, pipeline: u32| -> Result<f64, topoccl_synth::Error> {
            let s = reg.generate(algo, &Request::new(&topo, coll).pipeline(pipeline))?;
            let t = simulate(&topo, &s, bytes)?.time_us;
            Ok(bytes as f64 / t / 1e3 * coll.bus_factor(k))
        };
        let ring = busbw("ring", 1)?;
        let mut blink_bw = 0.0f64;
        for &p in &pipelines {
            blink_bw = blink_bw.max(busbw("blink", p)?);
        }
        // The plan Blink emits (over two paths per pair where that gains).
        let plan_rate = match blink::emitted_plans(&topo, coll, true)? {
            (_, Some(two_paths)) => two_paths.rate,
            (one_path, None) => one_path.rate,
        };
        let algbw_bound = b.rate_gbps;
        let one_path = b.shapes.iter().find(|s| s.0 == "trees on one path per pair").map_or(f64::NAN, |s| s.1);
        rows.push(Row {
            ranks,
            ring,
            blink: blink_bw,
            pct: 100.0 * blink_bw / coll.bus_factor(k) / algbw_bound.min(bytes as f64 / b.latency_us / 1e3),
            one_path_pct: 100.0 * blink_bw / coll.bus_factor(k) / one_path,
            plan_pct: 100.0 * plan_rate / algbw_bound,
        });
    }
    println!("# {machine}: all-reduce {bytes} B, busbw GB/s (simulated); bound = topoccl_synth::bound");
    if every {
        println!(
            "{:<20} {:>8} {:>8} {:>8} {:>9} {:>10} {:>7}",
            "gpus", "ring", "blink", "speedup", "% bound", "% 1-path", "plan %"
        );
        for r in &rows {
            println!(
                "{:<20} {:>8.1} {:>8.1} {:>7.2}x {:>8.1}% {:>9.1}% {:>6.1}%",
                format!("{:?}", r.ranks),
                r.ring,
                r.blink,
                r.blink / r.ring,
                r.pct,
                r.one_path_pct,
                r.plan_pct
            );
        }
    }
    println!(
        "{:>5} {:>7} {:>16} {:>16} {:>17} {:>14} {:>15}",
        "gpus", "subsets", "% bound min/mean", "speedup min/max", "speedup geo-mean", "≥95 % bound", "≥95 % 1-path"
    );
    for k in 3..=n as usize {
        let sel: Vec<&Row> = rows.iter().filter(|r| r.ranks.len() == k).collect();
        if sel.is_empty() {
            continue;
        }
        let pct_min = sel.iter().map(|r| r.pct).fold(f64::INFINITY, f64::min);
        let pct_mean = sel.iter().map(|r| r.pct).sum::<f64>() / sel.len() as f64;
        let sp: Vec<f64> = sel.iter().map(|r| r.blink / r.ring).collect();
        let geo = (sp.iter().map(|s| s.ln()).sum::<f64>() / sp.len() as f64).exp();
        let ok = sel.iter().filter(|r| r.pct >= 95.0).count();
        let ok_one_path = sel.iter().filter(|r| r.one_path_pct >= 95.0).count();
        println!(
            "{k:>5} {:>7} {:>7.1} / {:>5.1} {:>7.2} / {:>5.2}x {:>16.2}x {:>9}/{} {:>12}/{}",
            sel.len(),
            pct_min,
            pct_mean,
            sp.iter().copied().fold(f64::INFINITY, f64::min),
            sp.iter().copied().fold(0.0, f64::max),
            geo,
            ok,
            sel.len(),
            ok_one_path,
            sel.len()
        );
    }
    Ok(())
}
