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
    /// in `more` (most links carry one route; boxed, a link is 24 bytes).
    pub first: u32,
    // A boxed Vec is one pointer where a Vec is three: the link stays at 24 bytes.
    #[allow(clippy::box_collection)]
    pub more: Option<Box<Vec<u32>>>,
}

impl LinkState {
    /// Whether the link carries at most one route.
    pub fn one_route(&self) -> bool {
        self.more.as_ref().map_or(true, |m| m.is_empty())
    }

    pub fn new(bw: f64) -> LinkState {
        LinkState { bw, flows: 0, first: NO_ROUTE, more: None }
    }

    pub fn add_route(&mut self, route: u32) {
        if self.first == NO_ROUTE {
            self.first = route;
        } else {
            self.more.get_or_insert_with(Box::default).push(route);
        }
    }

    pub fn remove_route(&mut self, route: u32) {
        if self.first == route {
            self.first = self.more.as_mut().and_then(|more| more.pop()).unwrap_or(NO_ROUTE);
        } else if let Some(more) = self.more.as_mut() {
            if let Some(pos) = more.iter().position(|&r| r == route) {
                more.swap_remove(pos);
            }
        }
    }

    pub fn routes(&self) -> impl Iterator<Item = u32> + '_ {
        (self.first != NO_ROUTE)
            .then_some(self.first)
            .into_iter()
            .chain(self.more.iter().flat_map(|m| m.iter().copied()))
    }
}

/// The routes in use, flat: a route's link groups are `links[start..end]` of its span.
#[derive(Default)]
pub(super) struct RouteTable {
    links: Vec<u32>,
    /// Per route: (start, end, latency in µs), together because a message reads all three.
    spans: Vec<RouteSpan>,
}

#[derive(Clone, Copy)]
struct RouteSpan {
    start: u32,
    end: u32,
    latency: f64,
}

impl RouteTable {
    pub fn push(&mut self, route: &Route) -> u32 {
        let start = self.links.len() as u32;
        self.links.extend(route.groups.iter().map(|&g| g as u32));
        self.spans.push(RouteSpan { start, end: self.links.len() as u32, latency: route.latency });
        self.spans.len() as u32 - 1
    }

    pub fn links(&self, route: u32) -> &[u32] {
        let RouteSpan { start, end, .. } = self.spans[route as usize];
        &self.links[start as usize..end as usize]
    }

    /// The route's latency, µs.
    pub fn latency(&self, route: u32) -> f64 {
        self.spans[route as usize].latency
    }
}
