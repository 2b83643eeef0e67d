//! nccl-tests-style tables and their JSON twin.

use std::fmt::Write;

use serde::Serialize;

/// nccl-tests' leading columns, shared by predicted and measured rows.
#[derive(Debug, Clone, Serialize)]
pub struct RowId {
    pub size: u64,
    pub count: u64,
    #[serde(rename = "type")]
    pub dtype: String,
    pub redop: String,
    pub root: i64,
}

/// One size of one sweep.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub id: RowId,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    /// The optimality bound's time over this time (100 = optimal).
    pub pct_of_bound: f64,
    /// What the tuner chose for this size (`auto` sweeps only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
}

/// One algorithm's sweep.
#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    pub algorithm: String,
    /// What the schedule looks like (channels, chunks, steps).
    pub schedule: String,
    pub rows: Vec<Row>,
}

impl Sweep {
    /// nccl-tests' "Avg bus bandwidth": the mean of the busbw column.
    pub fn avg_busbw(&self) -> f64 {
        if self.rows.is_empty() {
            return 0.0;
        }
        self.rows.iter().map(|r| r.busbw).sum::<f64>() / self.rows.len() as f64
    }
}

/// A whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub mode: String,
    pub topology: String,
    pub nranks: usize,
    pub collective: String,
    /// What no schedule can beat (see `topoccl_synth::bound`).
    pub bound: String,
    pub sweeps: Vec<Sweep>,
}

pub(crate) fn fmt_time(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.0}", us)
    } else if us >= 100.0 {
        format!("{:.1}", us)
    } else {
        format!("{:.2}", us)
    }
}

impl Report {
    /// The human table, one block per algorithm.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# collbench {} (topoccl): {}", env!("CARGO_PKG_VERSION"), self.mode);
        let _ = writeln!(out, "# topology {}: {} ranks; collective {}", self.topology, self.nranks, self.collective);
        let _ = writeln!(out, "# bound: {}", self.bound);
        for sweep in &self.sweeps {
            let _ = writeln!(out, "#\n# algorithm {}: {}", sweep.algorithm, sweep.schedule);
            if sweep.rows.is_empty() {
                continue;
            }
            let _ = writeln!(out, "#{}{:^36}", " ".repeat(53), "predicted");
            let chosen = if sweep.rows.iter().any(|r| r.choice.is_some()) { "  chosen" } else { "" };
            let _ = writeln!(
                out,
                "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}{chosen}",
                "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "bound"
            );
            let _ = writeln!(
                out,
                "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>9}  {:>7}  {:>7}  {:>6}",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "(%)"
            );
            for r in &sweep.rows {
                let _ = writeln!(
                    out,
                    " {:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>9}  {:>7.2}  {:>7.2}  {:>6.1}{}",
                    r.id.size,
                    r.id.count,
                    r.id.dtype,
                    r.id.redop,
                    r.id.root,
                    fmt_time(r.time_us),
                    r.algbw,
                    r.busbw,
                    r.pct_of_bound,
                    r.choice.as_deref().map(|c| format!("  {c}")).unwrap_or_default()
                );
            }
            let _ = writeln!(out, "# Avg bus bandwidth    : {:.4}", sweep.avg_busbw());
        }
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}
