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

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use rustc_hash::FxHashMap;

use crate::error::{Error, Result};
use crate::schedule::{Rank, Schedule};
use crate::topology::routing::Router;
use crate::topology::Topology;
use events::{EventKind, EventQueue};
use flows::RouteFlows;
use plan::{Plan, PlanStep, HAS_DEPS, TOUCHES, VIA_FABRIC};

mod events;
mod flows;
mod links;
pub mod lockstep;
mod plan;
use links::{LinkState, RouteTable, NO_ROUTE};

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

const NO_WAITER: u32 = u32::MAX;
struct Conn {
    /// The receiving rank.
    to: Rank,
    route: u32,
    arrived: u32,
    /// The channel waiting for the next arrival, or [`NO_WAITER`].
    waiter: u32,
}

struct ChannelState {
    rank: Rank,
    index: u32,
    pc: u32,
    /// The current step's receive is consumed and its local work done.
    received: bool,
    /// The current step's send has had its turn on the rank's engine (`rank_message_us`).
    posted: bool,
    /// Channels wait in `Run::dep_waiters` for this one's next step.
    has_waiters: bool,
}

/// Schedules of at least this many steps are validated on a second thread while they run (a
/// thread costs tens of µs; validating 67 M steps, a second).
const VALIDATE_BESIDE_STEPS: usize = 1 << 20;
/// Events between looks at whether validation, running beside, has failed.
const POLL_EVERY: u32 = 1 << 16;

/// Prices schedules on one topology; routes are cached across runs.
pub struct Simulator<'t> {
    topo: &'t Topology,
    router: Router<'t>,
    config: SimConfig,
    route_of: FxHashMap<(Rank, Rank), u32>,
    fabric_of: FxHashMap<(Rank, Rank), u32>,
    routes: RouteTable,
}

struct Run<'a> {
    sched: &'a Schedule,
    plan: Plan,
    chunk_bytes: f64,
    now: f64,
    events: EventQueue,
    /// When each rank's engine is next free (`rank_message_us`).
    engine_free: Vec<f64>,
    channels: Vec<ChannelState>,
    /// Channels waiting for a channel's next step, by channel (few schedules have any).
    dep_waiters: FxHashMap<u32, Vec<u32>>,
    /// Global channel id of (rank, 0).
    offset: Vec<u32>,
    conns: Vec<Conn>,
    flows: Vec<Flow>,
    free_flows: Vec<u32>,
    /// Per route, with `pair_queue_bytes`.
    queues: FxHashMap<u32, PairQueue>,
    /// Active flows of each route ([`flows::RouteFlows`]), indexed by route id.
    route_flows: Vec<RouteFlows>,
    /// Each link group's bandwidth, flows and routes.
    links: Vec<LinkState>,
    /// With `pair_sharing`: per link group, flows on it per route (a route is one rank pair).
    link_pairs: Vec<FxHashMap<u32, u32>>,
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
            routes: RouteTable::default(),
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
        let id = self.routes.push(&route);
        if fabric { &mut self.fabric_of } else { &mut self.route_of }.insert((from, to), id);
        Ok(id)
    }

    /// Predicts `sched` moving a collective buffer of `bytes` bytes (the size of the `chunks`
    /// chunks the schedule is written over).
    pub fn run(&mut self, sched: &Schedule, bytes: u64) -> Result<SimResult> {
        if sched.nranks as usize != self.topo.nranks() {
            return Err(Error::RankMismatch {
                schedule: sched.nranks,
                topology: self.topo.name().into(),
                ranks: self.topo.nranks(),
            });
        }
        let steps: usize = sched.ranks.iter().flat_map(|p| &p.channels).map(|c| c.steps.len()).sum();
        if steps < VALIDATE_BESIDE_STEPS {
            sched.validate()?;
            return self.simulate(sched, bytes, &AtomicBool::new(false));
        }
        // Validation reads every step, and so does the plan; on two cores, side by side with
        // the whole run. The run reads nothing validation has not yet checked that could make
        // it fail other than cleanly, and gives up once validation has failed.
        let invalid = AtomicBool::new(false);
        std::thread::scope(|s| {
            let checked = s.spawn(|| {
                let checked = sched.validate();
                if checked.is_err() {
                    invalid.store(true, Ordering::Relaxed);
                }
                checked
            });
            let outcome = self.simulate(sched, bytes, &invalid);
            // Validation's error names the step; it comes first.
            checked.join().unwrap_or_else(|_| Err(Error::MalformedSchedule("validation panicked".into())))?;
            outcome
        })
    }

    /// Runs a schedule that is valid or being validated (`invalid` set once it is known not
    /// to be).
    fn simulate(&mut self, sched: &Schedule, bytes: u64, invalid: &AtomicBool) -> Result<SimResult> {
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
                    has_waiters: false,
                });
            }
        }
        let placed: Vec<(Rank, u32)> = channels.iter().map(|c| (c.rank, c.index)).collect();
        let mut conns = Vec::new();
        let mut conn_of = FxHashMap::default();
        let nranks = sched.nranks;
        let plan = Plan::build(sched, &placed, |from, to, ch| {
            if let Some(&c) = conn_of.get(&(from, to, ch)) {
                return Ok(c);
            }
            if from.max(to) >= nranks || from == to {
                // Validation names the step.
                return Err(Error::MalformedSchedule(format!("a message from rank {from} to rank {to}")));
            }
            let route = self.route(from, to, false)?;
            conns.push(Conn { to, route, arrived: 0, waiter: NO_WAITER });
            let id = conns.len() as u32 - 1;
            conn_of.insert((from, to, ch), id);
            Ok(id)
        })?;
        drop(placed);
        let groups = self.topo.link_groups();
        let mut run = Run {
            sched,
            plan,
            chunk_bytes: bytes as f64 / f64::from(sched.chunks),
            now: 0.0,
            events: EventQueue::default(),
            engine_free: vec![0.0; sched.ranks.len()],
            channels,
            dep_waiters: FxHashMap::default(),
            offset,
            conns,
            flows: Vec::new(),
            free_flows: Vec::new(),
            queues: FxHashMap::default(),
            route_flows: Vec::new(),
            // GB/s = 10^9 B/s = 10^3 B/µs.
            links: groups.iter().map(|g| LinkState::new(g.bandwidth * 1e3)).collect(),
            link_pairs: if self.config.pair_sharing { vec![FxHashMap::default(); groups.len()] } else { Vec::new() },
            messages: 0,
            link_bytes: 0.0,
            done_channels: 0,
            finish: 0.0,
        };
        for g in 0..run.channels.len() as u32 {
            self.advance(&mut run, g)?;
        }
        let mut events = 0u32;
        while let Some((time, kind)) = run.events.pop() {
            events = events.wrapping_add(1);
            if events % POLL_EVERY == 0 && invalid.load(Ordering::Relaxed) {
                return Err(Error::MalformedSchedule("validation failed".into()));
            }
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
                    let w = std::mem::replace(&mut c.waiter, NO_WAITER);
                    if w != NO_WAITER {
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

    /// Runs channel `g` as far as it can go now.
    fn advance(&mut self, run: &mut Run, g: u32) -> Result<()> {
        loop {
            let (pc, received) = {
                let c = &run.channels[g as usize];
                (c.pc, c.received)
            };
            let Some(step) = run.plan.step(g, pc) else {
                run.done_channels += 1;
                run.finish = run.finish.max(run.now);
                return Ok(());
            };
            if step.flags & HAS_DEPS != 0 {
                let (rank, index) = (run.channels[g as usize].rank, run.channels[g as usize].index);
                for d in run.sched.ranks[rank as usize].channels[index as usize].deps_of(pc) {
                    let dg = run.offset[rank as usize] + d.channel;
                    if run.channels[dg as usize].pc <= d.step {
                        run.channels[dg as usize].has_waiters = true;
                        run.dep_waiters.entry(dg).or_default().push(g);
                        return Ok(());
                    }
                }
            }
            if !received {
                if let Some(recv) = step.recv {
                    let cs = &mut run.conns[recv as usize];
                    if cs.arrived == 0 {
                        cs.waiter = g;
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
            if let Some(conn) = step.send {
                let rank = run.channels[g as usize].rank;
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
                let bytes = f64::from(step.count) * run.chunk_bytes;
                let route = if self.config.follow_paths && step.flags & VIA_FABRIC != 0 {
                    self.route(rank, run.conns[conn as usize].to, true)?
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
    fn local_work(&self, run: &Run, step: &PlanStep) -> Option<f64> {
        let gbps = self.config.local_gbps?;
        let bytes = f64::from(step.count) * run.chunk_bytes;
        (step.flags & TOUCHES != 0 && bytes > 0.0).then(|| bytes / (gbps * 1e3))
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
        let groups = self.routes.links(route);
        run.link_bytes += bytes * groups.len() as f64;
        if run.route_flows.len() <= route as usize {
            run.route_flows.resize_with(route as usize + 1, RouteFlows::default);
        }
        let first = run.route_flows[route as usize].add(run.now, id, bytes);
        for &l in groups {
            let l = l as usize;
            run.links[l].flows += 1;
            if first {
                run.links[l].add_route(route);
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
        for &l in self.routes.links(route) {
            let l = l as usize;
            run.links[l].flows -= 1;
            if last {
                run.links[l].remove_route(route);
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
        let latency = self.routes.latency(route) + self.config.message_overhead_us;
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
        let groups = self.routes.links(route);
        if let [l] = groups {
            let link = &run.links[*l as usize];
            if link.one_route() {
                // The common case: one route alone on a direct link.
                if link.first != NO_ROUTE {
                    self.rerate(run, link.first);
                }
                return;
            }
        }
        let mut affected: Vec<u32> = groups.iter().flat_map(|&l| run.links[l as usize].routes()).collect();
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
                run.links[l].bw / pairs.len().max(1) as f64 / f64::from(pairs.get(&route).copied().unwrap_or(1).max(1))
            }
            None => run.links[l].bw / f64::from(run.links[l].flows.max(1)),
        };
        let rate = self.routes.links(route).iter().map(|&l| share(l as usize)).fold(f64::INFINITY, f64::min);
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
        if c.has_waiters {
            c.has_waiters = false;
            let waiters = self.dep_waiters.remove(&g).unwrap_or_default();
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
