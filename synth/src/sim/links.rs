//! Link groups and routes as a run sees them, laid out flat: every message touches them.

use crate::topology::routing::Route;

pub(super) const NO_ROUTE: u32 = u32::MAX;

/// A link group as the run sees it.
pub(super) struct LinkState {
    /// Bytes per µs.
    pub bw: f64,
    /// Active flows on it.
    pub flows: u32,
    /// The routes those flows take, each once: the first here ([`NO_ROUTE`] if none), the rest
    /// in `more` (most links carry one route).
    pub first: u32,
    pub more: Vec<u32>,
}

impl LinkState {
    pub fn new(bw: f64) -> LinkState {
        LinkState { bw, flows: 0, first: NO_ROUTE, more: Vec::new() }
    }

    pub fn add_route(&mut self, route: u32) {
        if self.first == NO_ROUTE {
            self.first = route;
        } else {
            self.more.push(route);
        }
    }

    pub fn remove_route(&mut self, route: u32) {
        if self.first == route {
            self.first = self.more.pop().unwrap_or(NO_ROUTE);
        } else if let Some(pos) = self.more.iter().position(|&r| r == route) {
            self.more.swap_remove(pos);
        }
    }

    pub fn routes(&self) -> impl Iterator<Item = u32> + '_ {
        (self.first != NO_ROUTE).then_some(self.first).into_iter().chain(self.more.iter().copied())
    }
}

/// The routes in use, flat: a route's link groups are `links[span.0..span.1]`.
#[derive(Default)]
pub(super) struct RouteTable {
    links: Vec<u32>,
    span: Vec<(u32, u32)>,
    pub latency: Vec<f64>,
}

impl RouteTable {
    pub fn push(&mut self, route: &Route) -> u32 {
        let start = self.links.len() as u32;
        self.links.extend(route.groups.iter().map(|&g| g as u32));
        self.span.push((start, self.links.len() as u32));
        self.latency.push(route.latency);
        self.span.len() as u32 - 1
    }

    pub fn links(&self, route: u32) -> &[u32] {
        let (a, b) = self.span[route as usize];
        &self.links[a as usize..b as usize]
    }
}
