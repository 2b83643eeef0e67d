//! Export to MSCCL's algorithm XML, so that our schedules can be inspected with MSCCL's tools or
//! run by an MSCCL runtime.
//!
//! MSCCL gives each thread block one send peer and one receive peer. A channel of ours may talk
//! to several peers (a tree node receives from two children), so each channel is split into
//! thread blocks: steps that share a peer tag (send-to-p, recv-from-q) land in one block, found
//! with a union-find over the tags. The channel's order between blocks becomes MSCCL
//! dependencies; a step that needs more than one dependency gets `nop` steps in front of it
//! (MSCCL steps carry one dependency each).

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;

use super::{Collective, Schedule, Slot};
use crate::error::{Error, Result};

fn coll_name(c: Collective) -> &'static str {
    match c {
        Collective::AllReduce => "allreduce",
        Collective::ReduceScatter => "reduce_scatter",
        Collective::AllGather => "allgather",
        Collective::Broadcast { .. } => "broadcast",
        Collective::Reduce { .. } => "reduce",
        Collective::AllToAll => "alltoall",
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Tag {
    Send(u32),
    Recv(u32),
}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

struct XmlStep {
    kind: &'static str,
    src: Option<Slot>,
    dst: Option<Slot>,
    count: u32,
    dep: Option<(usize, usize)>,
    hasdep: bool,
}

struct Tb {
    send: i64,
    recv: i64,
    chan: u32,
    steps: Vec<XmlStep>,
}

/// Renders `schedule` as MSCCL algorithm XML.
pub fn to_msccl_xml(schedule: &Schedule) -> Result<String> {
    schedule.validate()?;
    // Where each send lands: match sends to receives FIFO per (from, to, channel).
    let mut landing: HashMap<(u32, u32, u32), VecDeque<Option<Slot>>> = HashMap::new();
    for (r, prog) in schedule.ranks.iter().enumerate() {
        for (c, ch) in prog.channels.iter().enumerate() {
            for st in &ch.steps {
                if let Some(from) = st.op.recv_from() {
                    landing.entry((from, r as u32, c as u32)).or_default().push_back(st.op.dst());
                }
            }
        }
    }

    let mut out = String::new();
    let nchannels = schedule.ranks.iter().map(|p| p.channels.len()).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "<algo name=\"{}\" proto=\"Simple\" nchannels=\"{}\" nchunksperloop=\"{}\" ngpus=\"{}\" coll=\"{}\" inplace=\"{}\" outofplace=\"1\" minBytes=\"0\" maxBytes=\"0\">",
        xml_escape(&schedule.name),
        nchannels.max(1),
        schedule.chunks,
        schedule.nranks,
        coll_name(schedule.collective),
        u8::from(schedule.in_place)
    );
    for (r, prog) in schedule.ranks.iter().enumerate() {
        let mut tbs: Vec<Tb> = Vec::new();
        // (channel, step) → (tb, position in tb)
        let mut placed: HashMap<(usize, usize), (usize, usize)> = HashMap::new();
        for (c, ch) in prog.channels.iter().enumerate() {
            // Union-find over this channel's peer tags.
            let mut tag_id: HashMap<Tag, usize> = HashMap::new();
            let mut parent: Vec<usize> = Vec::new();
            let mut tag_of = |t: Tag, parent: &mut Vec<usize>| {
                *tag_id.entry(t).or_insert_with(|| {
                    parent.push(parent.len());
                    parent.len() - 1
                })
            };
            let mut step_tag = Vec::with_capacity(ch.steps.len());
            for st in &ch.steps {
                let s = st.op.send_to().map(|p| tag_of(Tag::Send(p), &mut parent));
                let q = st.op.recv_from().map(|p| tag_of(Tag::Recv(p), &mut parent));
                if let (Some(a), Some(b)) = (s, q) {
                    let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
                    parent[ra] = rb;
                }
                step_tag.push(s.or(q));
            }
            // One thread block per component; check each has ≤ 1 send and ≤ 1 recv peer.
            let mut comp_tb: HashMap<usize, usize> = HashMap::new();
            let mut tags: Vec<(usize, Tag)> = tag_id.iter().map(|(t, &id)| (id, *t)).collect();
            tags.sort_by_key(|&(id, _)| id); // first use first: deterministic block numbering
            for (id, t) in tags {
                let root = find(&mut parent, id);
                let tb = *comp_tb.entry(root).or_insert_with(|| {
                    tbs.push(Tb { send: -1, recv: -1, chan: c as u32, steps: Vec::new() });
                    tbs.len() - 1
                });
                let (slot, peer) = match t {
                    Tag::Send(p) => (&mut tbs[tb].send, p),
                    Tag::Recv(p) => (&mut tbs[tb].recv, p),
                };
                if *slot >= 0 && *slot != i64::from(peer) {
                    return Err(Error::Format(format!(
                        "rank {r} channel {c} cannot be split into MSCCL thread blocks: one block would talk to peers {} and {peer} in the same direction",
                        *slot
                    )));
                }
                *slot = i64::from(peer);
            }
            let mut prev: Option<(usize, usize)> = None;
            for (s, st) in ch.steps.iter().enumerate() {
                let tb = match step_tag[s] {
                    Some(t) => comp_tb[&find(&mut parent, t)],
                    None => match prev {
                        Some((tb, _)) => tb,
                        None => {
                            tbs.push(Tb { send: -1, recv: -1, chan: c as u32, steps: Vec::new() });
                            tbs.len() - 1
                        }
                    },
                };
                let mut deps: Vec<(usize, usize)> = Vec::new();
                if let Some(p) = prev.filter(|p| p.0 != tb) {
                    deps.push(p);
                }
                for d in ch.deps_of(s as u32) {
                    if let Some(&p) = placed.get(&(d.channel as usize, d.step as usize)) {
                        deps.push(p);
                    }
                }
                // Extra dependencies become nops in front.
                while deps.len() > 1 {
                    let d = deps.pop();
                    tbs[tb].steps.push(XmlStep { kind: "nop", src: None, dst: None, count: 0, dep: d, hasdep: false });
                }
                let dst = match st.op.send_to() {
                    Some(to) => landing.get_mut(&(r as u32, to, c as u32)).and_then(|q| q.pop_front()).flatten(),
                    None => st.op.dst(),
                };
                let src = st.op.src().or(st.op.dst());
                tbs[tb].steps.push(XmlStep {
                    kind: st.op.msccl_type(),
                    src,
                    dst,
                    count: st.count,
                    dep: deps.pop(),
                    hasdep: false,
                });
                let at = (tb, tbs[tb].steps.len() - 1);
                placed.insert((c, s), at);
                prev = Some(at);
            }
        }
        // Mark the steps others wait on.
        let targets: Vec<(usize, usize)> = tbs.iter().flat_map(|tb| tb.steps.iter().filter_map(|s| s.dep)).collect();
        for (tb, s) in targets {
            tbs[tb].steps[s].hasdep = true;
        }
        let _ = writeln!(
            out,
            "  <gpu id=\"{r}\" i_chunks=\"{}\" o_chunks=\"{}\" s_chunks=\"{}\">",
            schedule.input_chunks(),
            schedule.output_chunks(),
            schedule.scratch_chunks
        );
        for (id, tb) in tbs.iter().enumerate() {
            let _ =
                writeln!(out, "    <tb id=\"{id}\" send=\"{}\" recv=\"{}\" chan=\"{}\">", tb.send, tb.recv, tb.chan);
            for (s, st) in tb.steps.iter().enumerate() {
                let (sb, so) = st.src.map_or(('i', -1), |x| (x.buffer.letter(), i64::from(x.index)));
                let (db, dof) = st.dst.map_or(('o', -1), |x| (x.buffer.letter(), i64::from(x.index)));
                let (depid, deps) = st.dep.map_or((-1, -1), |(t, s)| (t as i64, s as i64));
                let _ = writeln!(
                    out,
                    "      <step s=\"{s}\" type=\"{}\" srcbuf=\"{sb}\" srcoff=\"{so}\" dstbuf=\"{db}\" dstoff=\"{dof}\" cnt=\"{}\" depid=\"{depid}\" deps=\"{deps}\" hasdep=\"{}\"/>",
                    st.kind,
                    st.count,
                    u8::from(st.hasdep)
                );
            }
            out.push_str("    </tb>\n");
        }
        out.push_str("  </gpu>\n");
    }
    out.push_str("</algo>\n");
    Ok(out)
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
