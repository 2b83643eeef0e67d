//! Following the chain of waits from a failed rank to the rank at its end.
//!
//! Each rank on the chain is asked how far it is ([`Answer`]); the chain ends at the first
//! rank that explains it: one that does not answer (stopped, hung, gone), one whose own
//! failure started there (a mismatch, an abort), one that already knows the cause (a verdict),
//! one that is not in the call the others wait in (behind, or in another call), one that runs
//! but waits for nobody, or a cycle. Asking is a parameter, so the reasoning is tested on
//! made-up answers.

use super::protocol::Answer;
use super::{Need, Status, Verdict, Wait};

/// Ranks visited at most (a chain longer than the communicator is a cycle anyway).
const MAX_HOPS: usize = 4096;

/// The cause of `me`'s failure (of `nranks`), asking ranks with `ask`. `mine` is this rank's own status,
/// including the failure it saw.
///
/// A rank waiting for several peers (channels apart) is followed along its first wait; where
/// that leads back into the chain, the chain goes on from the latest rank on it with a wait
/// not followed yet: ranks that wait for each other on different channels are often both
/// held up by a third rank further on (the stalled one), which a cycle at the level of ranks
/// would hide. Only when every way on leads back is it a cycle, and then every rank of every
/// cycle met on the way is named (whichever order the waits were followed in, the same ranks:
/// a link that lost its messages inside a ring is in one of them).
pub(crate) fn find(me: u32, nranks: u32, mine: &Status, mut ask: impl FnMut(u32) -> Answer) -> Verdict {
    let mut chain: Vec<String> = Vec::new();
    // The ranks on the chain, from this one: each one's status, and how long the chain was
    // when it was reached.
    let mut statuses: Vec<(Status, usize)> = vec![(Status { rank: me, ..mine.clone() }, 0)];
    // Waits followed so far: (waiter, peer).
    let mut tried: Vec<(u32, u32)> = Vec::new();
    // Every rank of every cycle met.
    let mut in_cycles: Vec<u32> = Vec::new();
    let mut cur: Status = mine.clone();
    let verdict = |culprits: Vec<u32>, what: String, chain: &[String], stalled: bool| {
        let text = if chain.is_empty() { what } else { format!("{what}; chain of waits: {}", chain.join(", ")) };
        Verdict { culprits, text, found_by: me, stalled }
    };
    for _ in 0..MAX_HOPS {
        let r = cur.rank;
        if r != me {
            if let Some(v) = &cur.verdict {
                let mut text = v.text.clone();
                if !chain.is_empty() {
                    text = format!("{text} (found by rank {}; reached through {})", v.found_by, chain.join(", "));
                }
                return Verdict { culprits: v.culprits.clone(), text, found_by: me, stalled: v.stalled };
            }
            if cur.first {
                let why = cur.error.as_deref().unwrap_or("it failed");
                // It failed first because its own call stalled: a timeout, on every rank.
                return verdict(vec![r], format!("rank {r} failed first: {why}"), &chain, cur.stalled_ms.is_some());
            }
        }
        // Its first wait not followed yet (a rank reached again by another way, all of whose
        // waits were followed: its first, which leads back into the chain).
        let untried = cur.waits.iter().find(|w| !tried.contains(&(r, w.peer))).or(cur.waits.first());
        // A rank whose own failure names a peer (it closed, its connection broke) points
        // there first: what it waited for before is older news.
        let (next, how) = match (cur.blames, untried) {
            (Some(p), _) => (p, format!("rank {r} lost its connection to rank {p}")),
            // Waits for whichever rank sends (listed after its waits for given ranks): no
            // rank in particular owes it a message, so the chain ends here, stalled.
            (None, Some(w)) if w.need == Need::AnyMessage => {
                let call = cur.call.as_ref().map(|c| format!(" in {c}")).unwrap_or_default();
                return verdict(
                    vec![r],
                    format!("rank {r} waits{call} for a message from any rank (a receive from any source) that no rank has sent"),
                    &chain,
                    true,
                );
            }
            (None, Some(w)) => (w.peer, describe_wait(&cur, w)),
            (None, None) if r == me => {
                return verdict(vec![me], format!("rank {me} failed with nothing to wait for"), &chain, false);
            }
            (None, None) if cur.running => {
                let call = cur.call.as_ref().map_or_else(|| "a call".to_string(), ToString::to_string);
                return verdict(
                    vec![r],
                    format!("rank {r} is in {call} and waits for no rank (still working, or stuck outside topoccl)"),
                    &chain,
                    true,
                );
            }
            (None, None) => {
                let last = cur.call.as_ref().map_or_else(|| "none".to_string(), ToString::to_string);
                return verdict(
                    vec![r],
                    format!("rank {r} is not in any call (its last: {last}, ended {:.1} s ago)", secs(cur.for_ms)),
                    &chain,
                    true,
                );
            }
        };
        chain.push(how);
        tried.push((r, next));
        if let Some(at) = statuses.iter().position(|(s, _)| s.rank == next) {
            in_cycles.extend(statuses[at..].iter().map(|(s, _)| s.rank));
            let other_way = (0..statuses.len()).rev().find(|&i| {
                let s = &statuses[i].0;
                s.blames.is_none()
                    && s.waits.iter().any(|w| w.need != Need::AnyMessage && !tried.contains(&(s.rank, w.peer)))
            });
            if let Some(i) = other_way {
                chain.truncate(statuses[i].1);
                statuses.truncate(i + 1);
                cur = statuses[i].0.clone();
                continue;
            }
            let mut cycle = std::mem::take(&mut in_cycles);
            // The same verdict whichever rank of the cycle found it.
            cycle.sort_unstable();
            cycle.dedup();
            return verdict(
                cycle.clone(),
                format!("ranks {cycle:?} wait for each other in a cycle (no rank is behind: a fault in a connection or in topoccl)"),
                &chain,
                true,
            );
        }
        let waiter = cur;
        cur = match ask(next) {
            Answer::Status(s) => {
                statuses.push((*s.clone(), chain.len()));
                *s
            }
            Answer::NoRoute(why) => {
                // This rank cannot reach it at all: the network between the two is cut, which
                // says nothing against the process; the pair is named.
                let [a, b] = ends(me, next);
                let what = format!(
                    "rank {next} cannot be reached from rank {me} over the network ({why}): a link down or a partition between rank {a} and rank {b}"
                );
                return verdict(vec![a, b], what, &chain, false);
            }
            other => {
                let when =
                    waiter.call.as_ref().map(|c| format!(" while rank {} is in {c}", waiter.rank)).unwrap_or_default();
                let silent = matches!(other, Answer::Silent);
                return verdict(vec![next], format!("rank {next} {other}{when}"), &chain, silent);
            }
        };
        if waiter.blames == Some(next) && cur.error.is_none() {
            // The connection broke on `r`'s side while `next` runs on, not failed: the link
            // between them (or one end's network), not a rank that stopped.
            return verdict(
                ends(r, next).to_vec(),
                format!(
                    "the connection between rank {r} and rank {next} broke while both processes run (a network fault)"
                ),
                &chain,
                false,
            );
        }
        match at(&waiter, &cur) {
            Next::Follow => {}
            // Not in the call its waiter waits in (idle, or elsewhere): a rank that is behind.
            Next::End(why) => return verdict(vec![next], why, &chain, true),
            Next::Link(why) => return verdict(ends(waiter.rank, next).to_vec(), why, &chain, false),
            Next::Mismatch => {
                let all: Vec<Answer> = (0..nranks)
                    .map(|r| if r == me { Answer::Status(Box::new(mine.clone())) } else { ask(r) })
                    .collect();
                let seq = waiter.call.as_ref().and_then(|c| c.seq);
                let mut v = odd_one_out(me, &format!("found waiting: {}", chain.join(", ")), seq, &all);
                v.found_by = me;
                return v;
            }
        }
    }
    let ranks = statuses.iter().map(|(s, _)| s.rank).collect();
    verdict(ranks, "the chain of waits did not end".into(), &chain, true)
}

/// The ranks out of step in a mismatch `what` that `me` found in its call number `seq`:
/// those whose call of that number differs from the one most ranks made (all that made one,
/// when none has a majority). Ranks that have not reached that call are behind, not out of
/// step; ranks that do not answer are named too.
pub(crate) fn odd_one_out(me: u32, what: &str, seq: Option<u32>, all: &[Answer]) -> Verdict {
    let call_no = |a: &Answer| call_numbered(seq, a);
    let majority = majority_call(seq, all);
    let mut culprits = Vec::new();
    let mut parts = Vec::new();
    for (r, a) in all.iter().enumerate() {
        let r = r as u32;
        match (a, call_no(a)) {
            (Answer::Status(_), None) => {}
            (Answer::Status(_), Some(c)) if Some(&c) == majority.as_ref() => {}
            (Answer::Status(_), Some(c)) => {
                parts.push(format!("rank {r} made {c}"));
                culprits.push(r);
            }
            (other, _) => {
                parts.push(format!("rank {r} {other}"));
                culprits.push(r);
            }
        }
    }
    let most = majority.map(|m| format!("; the other ranks made {m}")).unwrap_or_default();
    Verdict {
        culprits,
        text: format!("ranks called different things: {}{most} ({what})", parts.join(", ")),
        found_by: me,
        stalled: false,
    }
}

/// The description of the call numbered `seq` that a rank's answer shows, if it made one.
fn call_numbered(seq: Option<u32>, a: &Answer) -> Option<String> {
    let Answer::Status(s) = a else { return None };
    s.call.iter().chain(s.recent.iter()).find(|c| c.seq.is_some() && c.seq == seq).map(|c| c.text.clone())
}

/// The call numbered `seq` that more ranks made than any other, if one did.
fn majority_call(seq: Option<u32>, all: &[Answer]) -> Option<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for c in all.iter().filter_map(|a| call_numbered(seq, a)) {
        match counts.iter_mut().find(|(k, _)| *k == c) {
            Some((_, n)) => *n += 1,
            None => counts.push((c, 1)),
        }
    }
    counts.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    match counts.as_slice() {
        [(c, n), rest @ ..] if rest.first().map_or(true, |(_, m)| m < n) => Some(c.clone()),
        _ => None,
    }
}

/// Whether the vote on a mismatch at call `seq` waits on a rank that is only slower: no call
/// has a majority yet, and some rank that answered has not made call `seq` and has not
/// failed. It gets there within moments (the finder keeps its connections open meanwhile),
/// and its call decides; asked too soon, two disagreeing ranks of three would both be named.
pub(crate) fn waits_for_behind(seq: Option<u32>, all: &[Answer]) -> bool {
    majority_call(seq, all).is_none()
        && all.iter().any(|a| matches!(a, Answer::Status(s) if s.error.is_none()) && call_numbered(seq, a).is_none())
}

/// What the chain does at a rank another waits for.
enum Next {
    /// It is in the call and waits in turn (or is earlier and waits): follow it.
    Follow,
    /// It is where the chain ends, for this reason.
    End(String),
    /// It runs a different call with the same number: the ranks called different things.
    Mismatch,
    /// It finished the call, so what the waiter waits for was lost on the way: the link
    /// between the two is at fault, for this reason.
    Link(String),
}

/// Whether `waitee` is where `waiter` waits for it: in the same call, or in an earlier one
/// waiting in turn (the chain goes on); else why not.
fn at(waiter: &Status, waitee: &Status) -> Next {
    let Some(wanted) = waiter.call.as_ref() else { return Next::Follow };
    let Some(seq) = wanted.seq else { return Next::Follow };
    let (w, r) = (waiter.rank, waitee.rank);
    let its_seq = waitee.call.as_ref().and_then(|c| c.seq);
    let its = waitee.call.as_ref().map_or_else(|| "none yet".to_string(), ToString::to_string);
    if its_seq == Some(seq) && waitee.call.as_ref() != Some(wanted) {
        return Next::Mismatch;
    }
    if waitee.error.is_some() {
        // It failed in the call (or before it): its own error and waits tell more.
        return Next::Follow;
    }
    // It went past the call the waiter waits in: if it made the same call, it sent what that
    // call sends and the data was lost between them.
    if its_seq.is_some_and(|s| s > seq) || (its_seq == Some(seq) && !waitee.running) {
        let made = waitee.call.iter().chain(waitee.recent.iter()).find(|c| c.seq == Some(seq));
        match made {
            Some(c) if c != wanted => return Next::Mismatch,
            Some(_) => {
                let [a, b] = ends(w, r);
                return Next::Link(format!(
                    "rank {r} finished {wanted} (it is {}) but rank {w} still waits for its data: lost between rank {a} and rank {b} (a network fault)",
                    if waitee.running { format!("in {its}") } else { "idle".to_string() },
                ));
            }
            None => {}
        }
    }
    if !waitee.running {
        return Next::End(format!(
            "rank {r} has not started {wanted}: it is idle ({:.1} s), its last call {its}",
            secs(waitee.for_ms)
        ));
    }
    let earlier = its_seq.is_some_and(|s| s < seq) || its_seq.is_none();
    if its_seq == Some(seq) || (earlier && !waitee.waits.is_empty()) {
        return Next::Follow;
    }
    Next::End(format!("rank {r} is in {its}, not in {wanted} where rank {w} waits for it"))
}

/// The two ends of a link, in rank order (the same verdict from either side).
fn ends(a: u32, b: u32) -> [u32; 2] {
    [a.min(b), a.max(b)]
}

fn describe_wait(s: &Status, w: &Wait) -> String {
    let call = s.call.as_ref().map(|c| format!(" in {c}")).unwrap_or_default();
    let stalled = s.stalled_ms.map(|ms| format!(", stalled {:.1} s", secs(ms))).unwrap_or_default();
    format!("rank {} waits for rank {}{call} ({w}{stalled})", s.rank, w.peer)
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::super::CallInfo;
    use super::*;

    fn call(seq: u32) -> Option<CallInfo> {
        Some(CallInfo { seq: Some(seq), text: format!("call #{seq}: all_reduce of 8 × float (sum)") })
    }

    fn waiting(rank: u32, seq: u32, on: &[u32]) -> Status {
        let waits = on.iter().map(|&peer| Wait { peer, channel: 0, step: 2, steps: 6, need: Need::Message }).collect();
        Status {
            rank,
            pid: 100 + rank,
            calls: u64::from(seq) + 1,
            call: call(seq),
            recent: Vec::new(),
            running: true,
            for_ms: 5000,
            stalled_ms: Some(5000),
            waits,
            error: None,
            first: false,
            blames: None,
            verdict: None,
        }
    }

    fn asked(all: Vec<Answer>) -> impl FnMut(u32) -> Answer {
        move |r| all[r as usize].clone()
    }

    #[test]
    fn a_stopped_rank_at_the_end_of_the_chain_is_named() {
        // 4 ranks in a ring; rank 1 stopped: 3 waits for 2, 2 for 1.
        let all = vec![
            Answer::Status(Box::new(waiting(0, 7, &[3]))),
            Answer::Silent,
            Answer::Status(Box::new(waiting(2, 7, &[1]))),
            Answer::Status(Box::new(waiting(3, 7, &[2]))),
        ];
        let mut mine = waiting(3, 7, &[2]);
        mine.error = Some("timed out".into());
        let v = find(3, 4, &mine, asked(all.clone()));
        assert_eq!(v.culprits, vec![1], "{}", v.text);
        assert!(v.text.contains("rank 1 does not answer"), "{}", v.text);
        assert!(v.text.contains("rank 3 waits for rank 2") && v.text.contains("rank 2 waits for rank 1"), "{}", v.text);
        assert!(v.text.contains("call #7"), "{}", v.text);
        // Rank 0 waits for rank 3, which waits for 2: the same rank at the end.
        assert_eq!(find(0, 4, &waiting(0, 7, &[3]), asked(all)).culprits, vec![1]);
    }

    #[test]
    fn a_chain_ending_in_a_receive_from_any_source_names_that_rank_stalled() {
        // Rank 2 waits for rank 1, which waits for a message from any rank.
        let mut one = waiting(1, 4, &[]);
        one.waits.push(Wait { peer: 1, channel: 0, step: 1, steps: 1, need: Need::AnyMessage });
        let all =
            vec![Answer::Status(Box::new(waiting(0, 4, &[]))), Answer::Status(Box::new(one.clone())), Answer::Silent];
        let v = find(2, 3, &waiting(2, 4, &[1]), asked(all.clone()));
        assert_eq!(v.culprits, vec![1], "{}", v.text);
        assert!(
            v.stalled && v.text.contains("rank 1 waits in call #4") && v.text.contains("for a message from any rank"),
            "{}",
            v.text
        );
        // Its own failure: the same.
        assert_eq!(find(1, 3, &one, asked(all)).culprits, vec![1]);
    }

    #[test]
    fn a_rank_past_the_call_whose_data_never_came_names_the_link() {
        // Rank 1 sent its part of call #82 and went on to #83; rank 0 still waits for it.
        let mut past = waiting(1, 83, &[2]);
        past.recent = call(82).into_iter().collect();
        let mut two = waiting(2, 83, &[1]);
        two.recent = call(82).into_iter().collect();
        let all = vec![
            Answer::Status(Box::new(waiting(0, 82, &[1]))),
            Answer::Status(Box::new(past.clone())),
            Answer::Status(Box::new(two)),
        ];
        let v = find(0, 3, &waiting(0, 82, &[1]), asked(all.clone()));
        assert_eq!(v.culprits, vec![0, 1], "{}", v.text);
        assert!(v.text.contains("lost between rank 0 and rank 1"), "{}", v.text);
        // Had it made another call #82, the ranks called different things.
        past.recent[0].text = "call #82: reduce".into();
        let mut all = all;
        all[1] = Answer::Status(Box::new(past));
        let v = find(0, 3, &waiting(0, 82, &[1]), asked(all));
        assert_eq!(v.culprits, vec![1], "{}", v.text);
    }

    #[test]
    fn a_rank_the_network_cannot_reach_is_named_with_the_asker() {
        let all = vec![
            Answer::Status(Box::new(waiting(0, 9, &[2]))),
            Answer::NoRoute("Network is unreachable".into()),
            Answer::Status(Box::new(waiting(2, 9, &[1]))),
        ];
        let v = find(0, 3, &waiting(0, 9, &[2]), asked(all));
        assert_eq!(v.culprits, vec![0, 1], "{}", v.text);
        assert!(v.text.contains("a link down or a partition"), "{}", v.text);
    }

    #[test]
    fn a_rank_that_skipped_the_call_is_behind() {
        let mut idle = waiting(2, 6, &[]);
        idle.running = false;
        let all = vec![
            Answer::Status(Box::new(waiting(0, 7, &[1]))),
            Answer::Status(Box::new(waiting(1, 7, &[2]))),
            Answer::Status(Box::new(idle)),
        ];
        let v = find(0, 3, &waiting(0, 7, &[1]), asked(all));
        assert_eq!(v.culprits, vec![2]);
        assert!(v.text.contains("rank 2 has not started call #7"), "{}", v.text);
    }

    #[test]
    fn a_known_verdict_is_taken_and_first_failures_are_named() {
        let mut told = waiting(1, 7, &[]);
        told.error = Some("timed out".into());
        told.verdict =
            Some(Verdict { culprits: vec![3], text: "rank 3 does not answer".into(), found_by: 1, stalled: true });
        let all = vec![Answer::Gone, Answer::Status(Box::new(told))];
        let mut mine = waiting(0, 7, &[]);
        mine.blames = Some(1);
        let v = find(0, 2, &mine, asked(all));
        assert_eq!(v.culprits, vec![3]);
        assert!(v.text.starts_with("rank 3 does not answer"), "{}", v.text);

        let mut mismatched = waiting(1, 7, &[]);
        mismatched.error = Some("rank 1 ran x, but rank 0 ran y".into());
        mismatched.first = true;
        let v = find(0, 2, &mine, asked(vec![Answer::Gone, Answer::Status(Box::new(mismatched))]));
        assert_eq!(v.culprits, vec![1]);
        assert!(v.text.contains("failed first"), "{}", v.text);
    }

    #[test]
    fn a_rank_still_in_an_earlier_call_is_followed_not_blamed() {
        // Rank 2 finished call #5 and waits in #6 for rank 1, which is still in #5 waiting for
        // rank 0, which does not answer.
        let all = vec![
            Answer::Silent,
            Answer::Status(Box::new(waiting(1, 5, &[0]))),
            Answer::Status(Box::new(waiting(2, 6, &[1]))),
        ];
        let v = find(2, 3, &waiting(2, 6, &[1]), asked(all));
        assert_eq!(v.culprits, vec![0], "{}", v.text);
    }

    #[test]
    fn a_rank_in_another_call_of_the_same_number_is_a_mismatch() {
        let mut other = waiting(2, 7, &[1]);
        other.call = Some(CallInfo { seq: Some(7), text: "call #7: reduce of 8 × float (sum) with root 0".into() });
        let all = vec![
            Answer::Status(Box::new(waiting(0, 7, &[2]))),
            Answer::Status(Box::new(waiting(1, 7, &[2]))),
            Answer::Status(Box::new(other)),
        ];
        let v = find(0, 3, &waiting(0, 7, &[2]), asked(all));
        assert_eq!(v.culprits, vec![2], "{}", v.text);
    }

    #[test]
    fn the_rank_whose_call_differs_from_most_is_out_of_step() {
        // Rank 2 made another call #7 than ranks 0 and 3; rank 1 is still in #6 (behind, not
        // out of step) and made no call #7 yet.
        let mut all: Vec<Status> = [7, 6, 7, 7].iter().enumerate().map(|(r, &c)| waiting(r as u32, c, &[])).collect();
        all[2].call = Some(CallInfo { seq: Some(7), text: "call #7: reduce".into() });
        let answers: Vec<Answer> = all.iter().cloned().map(|s| Answer::Status(Box::new(s))).collect();
        let v = odd_one_out(0, "mismatch", Some(7), &answers);
        assert_eq!(v.culprits, vec![2], "{}", v.text);
        // One that went on remembers its call #7.
        all[3].recent = all[3].call.take().into_iter().collect();
        all[3].call = call(8);
        let answers: Vec<Answer> = all.iter().cloned().map(|s| Answer::Status(Box::new(s))).collect();
        assert_eq!(odd_one_out(0, "mismatch", Some(7), &answers).culprits, vec![2]);
        // Two ranks, two calls: no majority, both named.
        assert_eq!(odd_one_out(0, "mismatch", Some(7), &[answers[0].clone(), answers[2].clone()]).culprits, vec![0, 1]);
    }

    #[test]
    fn a_vote_without_majority_waits_for_a_rank_that_is_only_behind() {
        // Ranks 0 and 2 disagree on call #7; rank 1, still in #6, has no vote yet.
        let mut all: Vec<Status> = [7, 6, 7].iter().enumerate().map(|(r, &c)| waiting(r as u32, c, &[])).collect();
        all[2].call = Some(CallInfo { seq: Some(7), text: "call #7: reduce".into() });
        let answers =
            |all: &[Status]| -> Vec<Answer> { all.iter().cloned().map(|s| Answer::Status(Box::new(s))).collect() };
        assert!(waits_for_behind(Some(7), &answers(&all)));
        // It failed meanwhile: it will never vote.
        all[1].error = Some("closed".into());
        assert!(!waits_for_behind(Some(7), &answers(&all)));
        // It reached #7 (the same call as rank 0): a majority, rank 2 is out of step.
        all[1].error = None;
        all[1].call = call(7);
        assert!(!waits_for_behind(Some(7), &answers(&all)));
        assert_eq!(odd_one_out(0, "mismatch", Some(7), &answers(&all)).culprits, vec![2]);
    }

    #[test]
    fn gone_closed_and_cycles() {
        let mut mine = waiting(0, 3, &[]);
        mine.blames = Some(1);
        assert!(find(0, 2, &mine, |_| Answer::Gone).text.contains("rank 1 is gone"));
        assert!(find(0, 2, &mine, |_| Answer::Closed).text.contains("closed its communicator"));
        let all = vec![
            Answer::Status(Box::new(waiting(0, 3, &[1]))),
            Answer::Status(Box::new(waiting(1, 3, &[2]))),
            Answer::Status(Box::new(waiting(2, 3, &[1]))),
        ];
        let v = find(0, 3, &waiting(0, 3, &[1]), asked(all.clone()));
        assert_eq!(v.culprits, vec![1, 2], "{}", v.text);
        // Found from the other side of the cycle: the same ranks, in the same order.
        assert_eq!(find(2, 3, &waiting(2, 3, &[1]), asked(all)).culprits, vec![1, 2]);
    }

    #[test]
    fn ranks_waiting_for_each_other_on_other_channels_lead_on_to_the_stalled_rank() {
        // Rank 0 waits (first) for rank 4 and then for rank 6; rank 4 waits for rank 0 on
        // another channel; rank 6 does not answer: 0 and 4 are no cycle, 6 is at the end.
        let mut all: Vec<Answer> = (0..7).map(|r| Answer::Status(Box::new(waiting(r, 9, &[])))).collect();
        all[0] = Answer::Status(Box::new(waiting(0, 9, &[4, 6])));
        all[4] = Answer::Status(Box::new(waiting(4, 9, &[0])));
        all[6] = Answer::Silent;
        for finder in [0u32, 4] {
            let Answer::Status(mine) = all[finder as usize].clone() else { unreachable!() };
            let v = find(finder, 7, &mine, asked(all.clone()));
            assert_eq!(v.culprits, vec![6], "found by rank {finder}: {}", v.text);
            assert!(v.text.contains("rank 0 waits for rank 6"), "{}", v.text);
        }
        // Where every way on leads back, it is a cycle still.
        all[0] = Answer::Status(Box::new(waiting(0, 9, &[4, 5])));
        all[5] = Answer::Status(Box::new(waiting(5, 9, &[4])));
        let Answer::Status(mine) = all[0].clone() else { unreachable!() };
        let v = find(0, 7, &mine, asked(all));
        assert!(v.text.contains("in a cycle") && v.culprits.contains(&0) && v.culprits.contains(&4), "{}", v.text);
    }

    #[test]
    fn a_broken_connection_between_running_ranks_names_the_link() {
        // Rank 1 lost its connection to rank 0, which runs on and has not noticed yet: the
        // link is named, not rank 0 for "waiting for nobody".
        let mut one = waiting(1, 82, &[]);
        one.error = Some("rank 0 failed or exited".into());
        one.blames = Some(0);
        let mut zero = waiting(0, 82, &[]);
        zero.stalled_ms = None;
        let all = vec![Answer::Status(Box::new(zero)), Answer::Status(Box::new(one.clone())), Answer::Gone];
        let v = find(1, 3, &one, asked(all.clone()));
        assert_eq!(v.culprits, vec![0, 1], "{}", v.text);
        assert!(v.text.contains("connection between rank 1 and rank 0 broke"), "{}", v.text);
        // A third rank that lost its connection to rank 1 (which closed all of its own when it
        // failed) follows rank 1's blame to the same link.
        let mut two = waiting(2, 82, &[]);
        two.error = Some("rank 1 failed or exited".into());
        two.blames = Some(1);
        assert_eq!(find(2, 3, &two, asked(all)).culprits, vec![0, 1]);
    }
}
