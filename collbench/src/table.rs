//! The measured report: nccl-tests' table (streamed row by row as sizes finish), its JSON and
//! CSV twins.

use std::fmt::Write as _;

use serde::Serialize;

use super::report::fmt_time;
pub use super::report::RowId;

/// Time and bandwidth of one variant (out-of-place or in-place) of one size.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// Elements that differed from the reference, summed over ranks (`None`: not checked).
    pub wrong: Option<u64>,
}

/// The simulator's prediction for a row.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Predicted {
    pub time_us: f64,
    pub busbw: f64,
}

/// One size.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredRow {
    #[serde(flatten)]
    pub id: RowId,
    pub out_of_place: Timing,
    /// `None` where an in-place form does not exist (sendrecv).
    pub in_place: Option<Timing>,
    /// The algorithm that ran (what `auto` chose).
    pub algorithm: String,
    pub predicted: Option<Predicted>,
}

/// Rows of one transport × algorithm × collective.
#[derive(Debug, Clone, Serialize)]
pub struct Block {
    pub transport: String,
    pub algorithm: String,
    pub collective: String,
    pub rows: Vec<MeasuredRow>,
}

/// The whole measured run.
#[derive(Debug, Clone, Serialize)]
pub struct MeasuredReport {
    pub mode: String,
    pub nranks: u32,
    pub ranks: Vec<String>,
    pub blocks: Vec<Block>,
}

impl MeasuredReport {
    pub fn wrong(&self) -> u64 {
        self.timings().filter_map(|t| t.wrong).sum()
    }

    fn timings(&self) -> impl Iterator<Item = &Timing> {
        self.blocks.iter().flat_map(|b| b.rows.iter()).flat_map(|r| std::iter::once(&r.out_of_place).chain(&r.in_place))
    }

    /// nccl-tests' average: the mean busbw over every timed variant.
    pub fn avg_busbw(&self) -> f64 {
        let (sum, n) = self.timings().fold((0.0, 0usize), |(s, n), t| (s + t.busbw, n + 1));
        if n == 0 {
            0.0
        } else {
            sum / n as f64
        }
    }

    pub fn header(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# collbench {} (topoccl): {}", env!("CARGO_PKG_VERSION"), self.mode);
        for r in &self.ranks {
            let _ = writeln!(out, "#  {r}");
        }
        out
    }

    pub fn footer(&self) -> String {
        let wrong = self.wrong();
        format!(
            "# Out of bounds values : {wrong} {}\n# Avg bus bandwidth    : {:.4}\n#\n",
            if wrong == 0 { "OK" } else { "FAILED" },
            self.avg_busbw()
        )
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    pub fn csv(&self) -> String {
        let mut out = String::from(
            "transport,algorithm,collective,size,count,type,redop,root,oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong,ran,predicted_time_us,predicted_busbw\n",
        );
        let opt = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.4}"));
        let wrong = |x: Option<u64>| x.map_or(String::new(), |v| v.to_string());
        for b in &self.blocks {
            for r in &b.rows {
                let o = &r.out_of_place;
                let i = r.in_place.as_ref();
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{},{},{},{:.4},{:.4},{:.4},{},{},{},{},{},{},{},{}",
                    b.transport,
                    b.algorithm,
                    b.collective,
                    r.id.size,
                    r.id.count,
                    r.id.dtype,
                    r.id.redop,
                    r.id.root,
                    o.time_us,
                    o.algbw,
                    o.busbw,
                    wrong(o.wrong),
                    opt(i.map(|t| t.time_us)),
                    opt(i.map(|t| t.algbw)),
                    opt(i.map(|t| t.busbw)),
                    wrong(i.and_then(|t| t.wrong)),
                    r.algorithm,
                    opt(r.predicted.map(|p| p.time_us)),
                    opt(r.predicted.map(|p| p.busbw)),
                );
            }
        }
        out
    }
}

fn wrong(w: Option<u64>) -> String {
    w.map_or("N/A".into(), |w| w.to_string())
}

impl Block {
    /// The block's heading and column titles.
    pub fn heading(&self, predicted: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "#\n# {} · algorithm {} · transport {}", self.collective, self.algorithm, self.transport);
        let sim = if predicted { format!("  {:^25}", "predicted") } else { String::new() };
        let _ = writeln!(out, "#{:52}{:^33}  {:^33}{sim}", "", "out-of-place", "in-place");
        let sim = if predicted { format!("  {:>9} {:>7} {:>7}", "time", "busbw", "ratio") } else { String::new() };
        let _ = writeln!(
            out,
            "#{:>11} {:>12} {:>8} {:>6} {:>6}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}{sim}  ran",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        let sim = if predicted { format!("  {:>9} {:>7} {:>7}", "(us)", "(GB/s)", "meas/pr") } else { String::new() };
        let _ = writeln!(
            out,
            "#{:>11} {:>12} {:>8} {:>6} {:>6}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}{sim}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
        out
    }
}

impl MeasuredRow {
    pub fn line(&self) -> String {
        let o = &self.out_of_place;
        let ip = match &self.in_place {
            Some(t) => format!("{:>9} {:>7.2} {:>7.2} {:>6}", fmt_time(t.time_us), t.algbw, t.busbw, wrong(t.wrong)),
            None => format!("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-"),
        };
        let sim = match &self.predicted {
            Some(p) => {
                let ratio = if p.busbw > 0.0 { o.busbw / p.busbw } else { 0.0 };
                format!("  {:>9} {:>7.2} {:>7.2}", fmt_time(p.time_us), p.busbw, ratio)
            }
            None => String::new(),
        };
        format!(
            " {:>11} {:>12} {:>8} {:>6} {:>6}  {:>9} {:>7.2} {:>7.2} {:>6}  {ip}{sim}  {}",
            self.id.size,
            self.id.count,
            self.id.dtype,
            self.id.redop,
            self.id.root,
            fmt_time(o.time_us),
            o.algbw,
            o.busbw,
            wrong(o.wrong),
            self.algorithm
        )
    }
}
