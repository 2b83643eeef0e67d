//! The table `SIGUSR1` prints: for each communicator of the process, every rank's call in
//! flight, asked of the ranks themselves, the job running on undisturbed.

use std::fmt::Write;

use super::protocol::{self, Answer};
use super::{service, Board, Need};

/// Prints every communicator's table of this process to standard error.
pub(crate) fn print_all() {
    for board in service::boards() {
        eprint!("{}", table_of(&board));
    }
}

/// The table of `board`'s communicator, asking every other rank.
pub(crate) fn table_of(board: &Board) -> String {
    let id = &board.id;
    let ranks: Vec<u32> = (0..id.watch.len() as u32).collect();
    let answers = protocol::for_each_rank(&ranks, |r| {
        if r == id.rank {
            Answer::Status(Box::new(board.status()))
        } else {
            protocol::ask(id, r)
        }
    });
    let comm: String = id.comm_id[..4].iter().map(|b| format!("{b:02x}")).collect();
    let mut out = format!(
        "topoccl: calls in flight on communicator {comm} ({} ranks), asked by rank {} (pid {})\n",
        ranks.len(),
        id.rank,
        std::process::id()
    );
    out += &table(&answers);
    out
}

/// One line per rank: its process, state, how long, the call, and what it waits for.
pub(crate) fn table(answers: &[Answer]) -> String {
    let mut out =
        format!("{:>5}  {:>8}  {:<8}  {:>8}  {:<48}  {}\n", "rank", "pid", "state", "for", "call", "waits for");
    for (r, a) in answers.iter().enumerate() {
        let Answer::Status(s) = a else {
            let _ = writeln!(out, "{r:>5}  {:>8}  {a}", "-");
            continue;
        };
        let state = match (s.running, s.stalled_ms, &s.error) {
            (_, _, Some(_)) => "failed",
            (true, Some(_), None) => "stalled",
            (true, None, None) => "running",
            (false, _, None) => "idle",
        };
        let call = s.call.as_ref().map_or_else(|| "-".to_string(), ToString::to_string);
        let mut waits: Vec<String> = s
            .waits
            .iter()
            .map(|w| match w.need {
                Need::AnyMessage => format!("any rank ({w})"),
                _ => format!("rank {} ({w})", w.peer),
            })
            .collect();
        if let Some(v) = &s.verdict {
            waits.push(format!("cause: {v}"));
        } else if let Some(e) = &s.error {
            waits.push(format!("error: {e}"));
        }
        let _ = writeln!(
            out,
            "{r:>5}  {:>8}  {state:<8}  {:>6.1} s  {:<48}  {}",
            s.pid,
            s.for_ms as f64 / 1000.0,
            call,
            if waits.is_empty() { "-".to_string() } else { waits.join("; ") }
        );
    }
    out
}
