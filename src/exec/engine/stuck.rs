//! What a run that does not move waits for: the list its board publishes once it stalls (for
//! the ranks that ask, see [`crate::diag`]) and the text of its timeout.

use super::Run;
use crate::diag::{Need, Wait};
use crate::exec::p2p::ANY_SOURCE;

impl Run<'_> {
    /// The peers the unfinished channels wait for (channels waiting for another channel of
    /// this rank are left out), else the peers whose sends are still queued.
    pub(super) fn waits(&self) -> Vec<Wait> {
        let mut out = Vec::new();
        // Receives from any source go last: a wait for a given rank says more.
        let mut any = Vec::new();
        for (c, ch) in self.prog.channels.iter().enumerate() {
            let s = self.state[c];
            let Some(st) = ch.steps.get(s.step) else { continue };
            if !self.deps_done(c, s.step, s.slice) {
                continue;
            }
            let (peer, need) =
                if st.action.receives() { (self.source(st), Need::Message) } else { (st.to, Need::Room) };
            let (step, steps) = (s.step as u32 + 1, ch.steps.len() as u32);
            if peer == ANY_SOURCE {
                let need = Need::AnyMessage;
                any.push(Wait { peer: self.cfg.rank, channel: c as u32, step, steps, need });
                continue;
            }
            out.push(Wait { peer, channel: c as u32, step, steps, need });
        }
        out.append(&mut any);
        if out.is_empty() {
            for &p in &self.prog.peers {
                if self.links.get(p as usize).and_then(Option::as_ref).is_some_and(|l| l.backlog() > 0) {
                    let steps = self.prog.channels.first().map_or(0, |c| c.steps.len() as u32);
                    out.push(Wait { peer: p, channel: 0, step: steps, steps, need: Need::Room });
                }
            }
        }
        out
    }

    /// What every unfinished channel waits for.
    pub(super) fn blocked(&self) -> String {
        let mut out = Vec::new();
        for (c, ch) in self.prog.channels.iter().enumerate() {
            let s = self.state[c];
            let Some(st) = ch.steps.get(s.step) else { continue };
            let what = if !self.deps_done(c, s.step, s.slice) {
                "another channel".to_string()
            } else if st.action.receives() && self.source(st) == ANY_SOURCE {
                "a message from any rank".to_string()
            } else if st.action.receives() {
                format!("a message from rank {}", self.source(st))
            } else {
                format!("room to send to rank {}", st.to)
            };
            out.push(format!("channel {c} step {}/{} waits for {what}", s.step + 1, ch.steps.len()));
        }
        if out.is_empty() && self.inflight.staging() {
            return "all steps are done; a send waits for the device to stage its data (the work before the call \
                    on its CUDA stream has not finished)"
                .to_string();
        }
        if out.is_empty() {
            return "all steps are done; data to send is still queued (a peer stopped reading)".to_string();
        }
        let more = out.len().saturating_sub(4);
        out.truncate(4);
        let mut s = out.join("; ");
        if more > 0 {
            s += &format!("; and {more} more channels");
        }
        s
    }
}
