//! The simulator: predicts how long a schedule takes for a message size on a topology.
//!
//! Event-driven fluid model. Every group of parallel links (one direction) is a resource with a
//! bandwidth; a transfer is a flow over its routed path. Flows that share a link share its
//! bandwidth equally, and a flow runs at the smallest share along its path (rates are
//! recomputed whenever a flow starts or ends on a link it uses). A message arrives one path
//! latency after its last byte left; the sending step completes when its last byte has left
//! (eager sends, as the IR specifies). With one flow per link this is exactly the alpha-beta
//! model: a message of b bytes over a link of latency α and bandwidth B takes α + b/B.
//!
//! Two options model topoccl's own executor rather than a GPU's channels: flows between one
//! pair of ranks share a link as one ([`SimConfig::pair_sharing`]), and sends are eager into one
//! first-in-first-out queue per pair ([`SimConfig::pair_queue_bytes`]). The queue matters to
//! schedules whose channels share links unevenly (Blink's tree lanes): a chunk waits behind
//! whatever other lanes queued first, instead of getting its fair share at once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::schedule::{Op, Rank, Schedule, Step};
use crate::topology::routing::{Route, Router};
use flows::RouteFlows;

mod flows;
use crate::topology::Topology;

/// Knobs of the cost model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// Software cost added to every message's latency, µs (a kernel launch, a syscall).
    pub message_overhead_us: f64,
    /// Bandwidth of local copies and reductions, GB/s; `None` makes them free.
    pub local_gbps: Option<f64>,
    /// Time a rank's engine is busy posting one message, µs. Unlike `message_overhead_us`,
    /// which delays messages in parallel, this serializes a rank's sends: it models one CPU
    /// thread (topoccl's executor without a GPU) that handles its messages one at a time, so a
    /// schedule with many small messages per rank pays for each.
    pub rank_message_us: f64,
    /// Flows between the same two ranks share one fair share of a link instead of one each:
    /// topoccl's runtime multiplexes every channel to a peer onto one connection (TCP streams
    /// or a shared-memory ring), so TCP's per-connection fairness splits a shared link by rank
    /// pair, not by channel. GPUs with a connection per channel (NCCL) share per flow.
    pub pair_sharing: bool,
    /// Eager sends through one first-in-first-out queue per rank pair, of at most this many
    /// bytes: a send step completes as soon as its message is queued (the queue under the
    /// cap), and the pair's messages then cross the network one after another, not side by
    /// side. This is topoccl's executor over its transports (one connection per peer, a
    /// send backlog capped by `TOPOCCL_MAX_BACKLOG`). `None`: each step's message is its own
    /// flow and the step completes when its last byte has left.
    pub pair_queue_bytes: Option<f64>,
    /// Sends marked [`via_fabric`](crate::schedule::Channel::via_fabric) take the fabric path
    /// (a GPU transport can choose NVLink or PCIe per message). Off: every send takes the
    /// router's path, as topoccl's host transports (one connection per peer) do.
    pub follow_paths: bool,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            message_overhead_us: 0.0,
            local_gbps: None,
            rank_message_us: 0.0,
            pair_sharing: false,
            pair_queue_bytes: None,
            follow_paths: true,
        }
    }
}

/// A prediction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimResult {
    /// Time from the first step to the last completion, µs.
    pub time_us: f64,
    pub messages: u64,
    /// Bytes × links crossed, summed over messages.
    pub link_bytes: f64,
}

#[derive(Clone, Copy, PartialEq)]
enum EventKind {
    /// The first-ending flow of a route ends (stale if the route's version moved on).
    FlowDone {
        route: u32,
        version: u32,
    },
    Arrive {
        conn: u32,
    },
    Continue {
        channel: u32,
    },
}

/// Pending events, grouped by exact time: a heap of distinct times and a FIFO per time. Lock-step
/// schedules (rings on uniform links) put thousands of events on one timestamp, so this keeps the
/// heap small; within a time, events run in the order they were posted, so runs are
/// deterministic.
#[derive(Default)]
struct EventQueue {
    /// Times as f64 bits: for non-negative finite times, bit order is numeric order.
    times: BinaryHeap<Reverse<u64>>,
    buckets: FxHashMap<u64, VecDeque<EventKind>>,
    spare: Vec<VecDeque<EventKind>>,
}

impl EventQueue {
    fn push(&mut self, time: f64, kind: EventKind) {
        let key = time.max(0.0).to_bits();
        if let Some(b) = self.buckets.get_mut(&key) {
            b.push_back(kind);
            return;
        }
        let mut b = self.spare.pop().unwrap_or_default();
        b.push_back(kind);
        self.buckets.insert(key, b);
        self.times.push(Reverse(key));
    }

    fn pop(&mut self) -> Option<(f64, EventKind)> {
        loop {
            let Reverse(key) = *self.times.peek()?;
            match self.buckets.get_mut(&key).and_then(|b| b.pop_front()) {
                Some(kind) => return Some((f64::from_bits(key), kind)),
                None => {
                    self.times.pop();
                    if let Some(b) = self.buckets.remove(&key) {
                        self.spare.push(b);
                    }
                }
            }
        }
    }
}

struct Flow {
    channel: u32,
    conn: u32,
}

/// A rank pair's send queue (`SimConfig::pair_queue_bytes`): messages as (bytes, conn); the
/// first is on the wire.
#[derive(Default)]
struct PairQueue {
    /// (bytes, conn, route)
    messages: VecDeque<(f64, u32, u32)>,
    bytes: f64,
    /// Channels waiting for room.
    waiters: Vec<u32>,
}

/// `Flow::channel` of a queued message, which completes no step when it ends.
const QUEUED: u32 = u32::MAX;

struct Conn {
    route: u32,
    arrived: u32,
    waiter: Option<u32>,
}

struct ChannelState {
    rank: Rank,
    index: u32,
    pc: u32,
    /// The current step's receive is consumed and its local work done.
    received: bool,
    /// The current step's send has had its turn on the rank's engine (`rank_message_us`).
    posted: bool,
    /// (peer, conn) of the last send and receive: rings use one peer throughout.
    last_send: (Rank, u32),
    last_recv: (Rank, u32),
    dep_waiters: Vec<u32>,
}

/// Prices schedules on one topology; routes are cached across runs.
pub struct Simulator<'t> {
    topo: &'t Topology,
    router: Router<'t>,
    config: SimConfig,
    route_of: FxHashMap<(Rank, Rank), u32>,
    fabric_of: FxHashMap<(Rank, Rank), u32>,
    routes: Vec<Route>,
}

struct Run<'a> {
    sched: &'a Schedule,
    chunk_bytes: f64,
    now: f64,
    events: EventQueue,
    /// When each rank's engine is next free (`rank_message_us`).
    engine_free: Vec<f64>,
    channels: Vec<ChannelState>,
    /// Global channel id of (rank, 0).
    offset: Vec<u32>,
    conns: Vec<Conn>,
    conn_of: FxHashMap<(Rank, Rank, u32), u32>,
    flows: Vec<Flow>,
    free_flows: Vec<u32>,
    /// Per route, with `pair_queue_bytes`.
    queues: FxHashMap<u32, PairQueue>,
    /// Active flows of each route ([`flows::RouteFlows`]), indexed by route id.
    route_flows: Vec<RouteFlows>,
    /// Active flows on each link group, and the routes they take (each once).
    link_count: Vec<u32>,
    link_routes: Vec<Vec<u32>>,
    /// With `pair_sharing`: per link group, flows on it per route (a route is one rank pair).
    link_pairs: Vec<FxHashMap<u32, u32>>,
    /// Bytes per µs of each group.
    link_bw: Vec<f64>,
    messages: u64,
    link_bytes: f64,
    done_channels: usize,
    finish: f64,
}

impl<'t> Simulator<'t> {
    pub fn new(topo: &'t Topology) -> Simulator<'t> {
        Simulator::with_config(topo, SimConfig::default())
    }

    pub fn with_config(topo: &'t Topology, config: SimConfig) -> Simulator<'t> {
        Simulator {
            topo,
            router: Router::new(topo),
            config,
            route_of: FxHashMap::default(),
            fabric_of: FxHashMap::default(),
            routes: Vec::new(),
        }
    }

    pub fn config(&self) -> SimConfig {
        self.config
    }

    /// The id of the route from `from` to `to`: the router's, or with `fabric` the fabric path
    /// ([`Router::fabric_route`]); computed once.
    fn route(&mut self, from: Rank, to: Rank, fabric: bool) -> Result<u32> {
        let known = if fabric { &self.fabric_of } else { &self.route_of };
        if let Some(&r) = known.get(&(from, to)) {
            return Ok(r);
        }
        let (route, missing) = if fabric {
            (self.router.fabric_route(from, to), "a step sends via a fabric the two ranks do not share")
        } else {
            (self.router.route(from, to), "no path")
        };
        let route = route.ok_or_else(|| Error::InvalidTopology {
            name: self.topo.name().to_string(),
            message: format!("from rank {from} to rank {to}: {missing}"),
        })?;
        self.routes.push(route);
        let id = self.routes.len() as u32 - 1;
        if fabric { &mut self.fabric_of } else { &mut self.route_of }.insert((from, to), id);
        Ok(id)
    }

    /// Predicts `sched` moving a collective buffer of `bytes` bytes (the size of the `chunks`
    /// chunks the schedule is written over).
    pub fn run(&mut self, sched: &Schedule, bytes: u64) -> Result<SimResult> {
        sched.validate()?;
        if sched.nranks as usize != self.topo.nranks() {
            return Err(Error::RankMismatch {
                schedule: sched.nranks,
                topology: self.topo.name().into(),
                ranks: self.topo.nranks(),
            });
        }
        let mut channels = Vec::new();
        let mut offset = Vec::with_capacity(sched.ranks.len());
        for (r, prog) in sched.ranks.iter().enumerate() {
            offset.push(channels.len() as u32);
            for c in 0..prog.channels.len() {
                channels.push(ChannelState {
                    rank: r as Rank,
                    index: c as u32,
                    pc: 0,
                    received: false,
                    posted: false,
                    last_send: (Rank::MAX, 0),
                    last_recv: (Rank::MAX, 0),
                    dep_waiters: Vec::new(),
                });
            }
        }
        let groups = self.topo.link_groups();
        let mut run = Run {
            sched,
            chunk_bytes: bytes as f64 / f64::from(sched.chunks),
            now: 0.0,
            events: EventQueue::default(),
            engine_free: vec![0.0; sched.ranks.len()],
            channels,
            offset,
            conns: Vec::new(),
            conn_of: FxHashMap::default(),
            flows: Vec::new(),
            free_flows: Vec::new(),
            queues: FxHashMap::default(),
            route_flows: Vec::new(),
            link_count: vec![0; groups.len()],
            link_routes: vec![Vec::new(); groups.len()],
            link_pairs: if self.config.pair_sharing { vec![FxHashMap::default(); groups.len()] } else { Vec::new() },
            // GB/s = 10^9 B/s = 10^3 B/µs.
            link_bw: groups.iter().map(|g| g.bandwidth * 1e3).collect(),
            messages: 0,
            link_bytes: 0.0,
            done_channels: 0,
            finish: 0.0,
        };
        for g in 0..run.channels.len() as u32 {
            self.advance(&mut run, g)?;
        }
        while let Some((time, kind)) = run.events.pop() {
            run.now = time;
            match kind {
                EventKind::FlowDone { route, version } => {
                    if run.route_flows[route as usize].version() != version {
                        continue; // superseded by a rate change
                    }
                    self.finish_flow(&mut run, route)?;
                }
                EventKind::Arrive { conn } => {
                    let c = &mut run.conns[conn as usize];
                    c.arrived += 1;
                    if let Some(w) = c.waiter.take() {
                        self.advance(&mut run, w)?;
                    }
                }
                EventKind::Continue { channel } => self.advance(&mut run, channel)?,
            }
        }
        if run.done_channels < run.channels.len() {
            let stuck: Vec<String> = run
                .channels
                .iter()
                .filter(|c| (c.pc as usize) < sched.ranks[c.rank as usize].channels[c.index as usize].steps.len())
                .take(6)
                .map(|c| format!("rank {} channel {} step {}", c.rank, c.index, c.pc))
                .collect();
            return Err(Error::Deadlock {
                schedule: sched.name.clone(),
                message: format!("stuck at {}", stuck.join("; ")),
            });
        }
        Ok(SimResult { time_us: run.finish, messages: run.messages, link_bytes: run.link_bytes })
    }

    fn conn(&mut self, run: &mut Run, from: Rank, to: Rank, ch: u32) -> Result<u32> {
        if let Some(&c) = run.conn_of.get(&(from, to, ch)) {
            return Ok(c);
        }
        let route = self.route(from, to, false)?;
        run.conns.push(Conn { route, arrived: 0, waiter: None });
        let id = run.conns.len() as u32 - 1;
        run.conn_of.insert((from, to, ch), id);
        Ok(id)
    }

    /// Runs channel `g` as far as it can go now.
    fn advance(&mut self, run: &mut Run, g: u32) -> Result<()> {
        loop {
            let (rank, index, pc) = {
                let c = &run.channels[g as usize];
                (c.rank, c.index, c.pc)
            };
            let channel = &run.sched.ranks[rank as usize].channels[index as usize];
            let Some(&step) = channel.steps.get(pc as usize) else {
                run.done_channels += 1;
                run.finish = run.finish.max(run.now);
                return Ok(());
            };
            for d in channel.deps_of(pc) {
                let dg = run.offset[rank as usize] + d.channel;
                if run.channels[dg as usize].pc <= d.step {
                    run.channels[dg as usize].dep_waiters.push(g);
                    return Ok(());
                }
            }
            if !run.channels[g as usize].received {
                if let Some(from) = step.op.recv_from() {
                    let conn = match run.channels[g as usize].last_recv {
                        (p, c) if p == from => c,
                        _ => {
                            let c = self.conn(run, from, rank, index)?;
                            run.channels[g as usize].last_recv = (from, c);
                            c
                        }
                    };
                    let cs = &mut run.conns[conn as usize];
                    if cs.arrived == 0 {
                        cs.waiter = Some(g);
                        return Ok(());
                    }
                    cs.arrived -= 1;
                }
                run.channels[g as usize].received = true;
                if let Some(delay) = self.local_work(run, &step) {
                    run.push(delay, EventKind::Continue { channel: g });
                    return Ok(());
                }
            }
            if let Some(to) = step.op.send_to() {
                let cost = self.config.rank_message_us;
                if cost > 0.0 && !run.channels[g as usize].posted {
                    let free = &mut run.engine_free[rank as usize];
                    *free = free.max(run.now) + cost;
                    let delay = *free - run.now;
                    run.channels[g as usize].posted = true;
                    run.push(delay, EventKind::Continue { channel: g });
                    return Ok(());
                }
                run.channels[g as usize].posted = false;
                let conn = match run.channels[g as usize].last_send {
                    (p, c) if p == to => c,
                    _ => {
                        let c = self.conn(run, rank, to, index)?;
                        run.channels[g as usize].last_send = (to, c);
                        c
                    }
                };
                let bytes = f64::from(step.count) * run.chunk_bytes;
                let route = if self.config.follow_paths && channel.sends_via_fabric(pc) {
                    self.route(rank, to, true)?
                } else {
                    run.conns[conn as usize].route
                };
                let Some(cap) = self.config.pair_queue_bytes else {
                    self.start_flow(run, g, conn, route, bytes);
                    return Ok(());
                };
                let q = run.queues.entry(route).or_default();
                if q.bytes >= cap && !q.messages.is_empty() {
                    q.waiters.push(g);
                    return Ok(());
                }
                q.bytes += bytes;
                q.messages.push_back((bytes, conn, route));
                if q.messages.len() == 1 {
                    self.start_flow(run, QUEUED, conn, route, bytes);
                }
            }
            run.complete_step(g);
        }
    }

    /// Time a step's local copy or reduction takes, if the model prices it.
    fn local_work(&self, run: &Run, step: &Step) -> Option<f64> {
        let gbps = self.config.local_gbps?;
        let touches =
            step.op.reduces() || matches!(step.op, Op::Copy { .. } | Op::Recv { .. } | Op::RecvCopySend { .. });
        let bytes = f64::from(step.count) * run.chunk_bytes;
        (touches && bytes > 0.0).then(|| bytes / (gbps * 1e3))
    }

    fn start_flow(&mut self, run: &mut Run, g: u32, conn: u32, route: u32, bytes: f64) {
        let flow = Flow { channel: g, conn };
        let id = match run.free_flows.pop() {
            Some(id) => {
                run.flows[id as usize] = flow;
                id
            }
            None => {
                run.flows.push(flow);
                run.flows.len() as u32 - 1
            }
        };
        run.messages += 1;
        let groups = &self.routes[route as usize].groups;
        run.link_bytes += bytes * groups.len() as f64;
        if run.route_flows.len() <= route as usize {
            run.route_flows.resize_with(route as usize + 1, RouteFlows::default);
        }
        let first = run.route_flows[route as usize].add(run.now, id, bytes);
        for &l in groups {
            run.link_count[l] += 1;
            if first {
                run.link_routes[l].push(route);
            }
            if self.config.pair_sharing {
                *run.link_pairs[l].entry(route).or_insert(0) += 1;
            }
        }
        self.rerate_links(run, route);
    }

    /// The first-ending flow of `route` has ended.
    fn finish_flow(&mut self, run: &mut Run, route: u32) -> Result<()> {
        let Some((id, last)) = run.route_flows[route as usize].pop(run.now) else { return Ok(()) };
        let (g, conn) = {
            let f = &run.flows[id as usize];
            (f.channel, f.conn)
        };
        for &l in &self.routes[route as usize].groups {
            run.link_count[l] -= 1;
            if last {
                let routes = &mut run.link_routes[l];
                if let Some(pos) = routes.iter().position(|&r| r == route) {
                    routes.swap_remove(pos);
                }
            }
            if let Some(pairs) = run.link_pairs.get_mut(l) {
                if let Some(k) = pairs.get_mut(&route) {
                    *k -= 1;
                    if *k == 0 {
                        pairs.remove(&route);
                    }
                }
            }
        }
        run.free_flows.push(id);
        // A route left without flows is off its links' lists and gets no event; the one that
        // just fired was its only one (each rate change posts one).
        self.rerate_links(run, route);
        let latency = self.routes[route as usize].latency + self.config.message_overhead_us;
        run.push(latency, EventKind::Arrive { conn });
        if g != QUEUED {
            run.complete_step(g);
            return self.advance(run, g);
        }
        // The pair's next message goes on the wire; channels waiting for room go on.
        let Some(q) = run.queues.get_mut(&route) else { return Ok(()) };
        if let Some((bytes, _, _)) = q.messages.pop_front() {
            q.bytes -= bytes;
        }
        let next = q.messages.front().copied();
        let waiters = std::mem::take(&mut q.waiters);
        if let Some((bytes, conn, route)) = next {
            self.start_flow(run, QUEUED, conn, route, bytes);
        }
        for w in waiters {
            run.push(0.0, EventKind::Continue { channel: w });
        }
        Ok(())
    }

    /// Recomputes the rate of every route that shares a link with `route` (itself included).
    fn rerate_links(&self, run: &mut Run, route: u32) {
        let groups = &self.routes[route as usize].groups;
        if groups.len() == 1 && run.link_routes[groups[0]].len() <= 1 {
            // The common case: one route alone on a direct link.
            if let Some(&r) = run.link_routes[groups[0]].first() {
                self.rerate(run, r);
            }
            return;
        }
        let mut affected: Vec<u32> = groups.iter().flat_map(|&l| run.link_routes[l].iter().copied()).collect();
        affected.sort_unstable();
        affected.dedup();
        for r in affected {
            self.rerate(run, r);
        }
    }

    fn rerate(&self, run: &mut Run, route: u32) {
        let share = |l: usize| match run.link_pairs.get(l) {
            // Routes are per rank pair: the pairs on the link split it, then a pair's flows.
            Some(pairs) => {
                run.link_bw[l] / pairs.len().max(1) as f64 / f64::from(pairs.get(&route).copied().unwrap_or(1).max(1))
            }
            None => run.link_bw[l] / f64::from(run.link_count[l].max(1)),
        };
        let rate = self.routes[route as usize].groups.iter().map(|&l| share(l)).fold(f64::INFINITY, f64::min);
        let (version, next) = run.route_flows[route as usize].rerate(run.now, rate);
        if let Some(done_in) = next {
            run.push(done_in, EventKind::FlowDone { route, version });
        }
    }
}

impl Run<'_> {
    fn push(&mut self, delay: f64, kind: EventKind) {
        self.events.push(self.now + delay, kind);
    }

    fn complete_step(&mut self, g: u32) {
        let c = &mut self.channels[g as usize];
        c.pc += 1;
        c.received = false;
        if !c.dep_waiters.is_empty() {
            let waiters = std::mem::take(&mut c.dep_waiters);
            for w in waiters {
                self.push(0.0, EventKind::Continue { channel: w });
            }
        }
    }
}

/// Predicts one schedule once (convenience for callers without a long-lived simulator).
pub fn simulate(topo: &Topology, sched: &Schedule, bytes: u64) -> Result<SimResult> {
    Simulator::new(topo).run(sched, bytes)
}
