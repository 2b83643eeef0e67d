//! `--plot FILE.svg`: bus bandwidth against message size (log axis), one line per algorithm,
//! transport, collective or type swept. Plain SVG, no dependency, readable in any browser.

use std::fmt::Write as _;

use super::table::MeasuredReport;

const W: f64 = 860.0;
const H: f64 = 520.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

fn human(b: f64) -> String {
    let mut v = b;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if v < 1024.0 {
            return format!("{v:.0}{unit}");
        }
        v /= 1024.0;
    }
    format!("{v:.0}TiB")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// One labelled series of (size, busbw) points.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed, without markers (a bound, not a measurement).
    pub dashed: bool,
}

/// Series per block and type/op, labelled by whatever differs between them.
fn series(report: &MeasuredReport) -> Vec<Series> {
    let differs = |f: &dyn Fn(usize) -> String| {
        let first = f(0);
        (0..report.blocks.len()).any(|i| f(i) != first)
    };
    let show_algo = differs(&|i| report.blocks[i].algorithm.clone());
    let show_transport = differs(&|i| report.blocks[i].transport.clone());
    let show_coll = differs(&|i| report.blocks[i].collective.clone());
    let mut out: Vec<Series> = Vec::new();
    for b in &report.blocks {
        let mut keys: Vec<(String, String)> = Vec::new();
        for r in &b.rows {
            let k = (r.id.dtype.clone(), r.id.redop.clone());
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for (dtype, redop) in &keys {
            let mut parts = Vec::new();
            if show_coll {
                parts.push(b.collective.clone());
            }
            if show_algo || (!show_transport && !show_coll) {
                parts.push(b.algorithm.clone());
            }
            if show_transport {
                parts.push(b.transport.clone());
            }
            if keys.len() > 1 {
                parts.push(format!("{dtype} {redop}"));
            }
            let points = b
                .rows
                .iter()
                .filter(|r| &r.id.dtype == dtype && &r.id.redop == redop && r.id.size > 0)
                .map(|r| (r.id.size as f64, r.out_of_place.busbw))
                .collect();
            out.push(Series { label: parts.join(" / "), points, dashed: false });
        }
    }
    out
}

/// The SVG document of a measured report.
pub fn svg(report: &MeasuredReport, title: &str) -> String {
    svg_of(&series(report), title)
}

/// The SVG document of any series (the simulated sweep draws its bound as a dashed one).
pub fn svg_of(all: &[Series], title: &str) -> String {
    let pts = all.iter().flat_map(|s| s.points.iter());
    let (mut xmin, mut xmax, mut ymax) = (f64::MAX, 0f64, 0f64);
    for &(x, y) in pts {
        xmin = xmin.min(x);
        xmax = xmax.max(x);
        ymax = ymax.max(y);
    }
    if xmin > xmax {
        (xmin, xmax) = (1.0, 2.0);
    }
    let (lx0, lx1) = (xmin.log2().floor(), xmax.log2().ceil().max(xmin.log2().floor() + 1.0));
    let ymax = nice(ymax.max(1e-3));
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |v: f64| LEFT + (v.log2() - lx0) / (lx1 - lx0) * pw;
    let y = |v: f64| TOP + ph - v / ymax * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" font-size="15" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        escape(title)
    );
    // Grid and axes.
    let step = ((lx1 - lx0) / 10.0).ceil().max(1.0);
    let mut e = lx0;
    while e <= lx1 {
        let px = LEFT + (e - lx0) / (lx1 - lx0) * pw;
        let _ = writeln!(s, r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##, TOP + ph);
        let _ = writeln!(
            s,
            r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 18.0,
            human(2f64.powf(e))
        );
        e += step;
    }
    for i in 0..=5 {
        let v = ymax * f64::from(i) / 5.0;
        let py = y(v);
        let _ =
            writeln!(s, r##"<line x1="{LEFT}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e5e5e5"/>"##, LEFT + pw);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{v:.2}</text>"#, LEFT - 6.0, py + 4.0);
    }
    let _ = writeln!(s, r##"<rect x="{LEFT}" y="{TOP}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333"/>"##);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size (bytes, log scale)</text>"#,
        LEFT + pw / 2.0,
        H - 15.0
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">bus bandwidth (GB/s)</text>"#,
        TOP + ph / 2.0
    );
    // Lines and legend.
    for (i, ser) in all.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = ser.points.iter().map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b))).collect();
        let (color, dash) = if ser.dashed { ("#000000", r#" stroke-dasharray="6 4""#) } else { (color, "") };
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        if !ser.dashed {
            for &(a, b) in &ser.points {
                let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#, x(a), y(b));
            }
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + pw + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"{dash}/>"#,
            lx + 22.0
        );
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 28.0, ly + 4.0, escape(&ser.label));
    }
    s.push_str("</svg>\n");
    s
}

/// A round upper bound for the axis (1, 2 or 5 times a power of ten).
fn nice(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|&c| c >= v).unwrap_or(10.0 * p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Block, MeasuredRow, RowId, Timing};

    #[test]
    fn one_line_per_algorithm() {
        let row = |size: u64, busbw: f64| MeasuredRow {
            id: RowId { size, count: size / 4, dtype: "float".into(), redop: "sum".into(), root: -1 },
            out_of_place: Timing { time_us: 1.0, algbw: busbw, busbw, wrong: Some(0) },
            in_place: None,
            algorithm: "ring".into(),
            predicted: None,
        };
        let block = |algo: &str| Block {
            transport: "shm".into(),
            algorithm: algo.into(),
            collective: "all_reduce".into(),
            rows: vec![row(1024, 0.5), row(1 << 20, 3.0)],
        };
        let r =
            MeasuredReport { mode: "m".into(), nranks: 4, ranks: vec![], blocks: vec![block("ring"), block("rhd")] };
        let s = svg(&r, "a <title>");
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains(">ring<") && s.contains(">rhd<") && s.contains("a &lt;title&gt;"));
        assert_eq!(nice(3.2), 5.0);
    }
}
