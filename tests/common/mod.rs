//! Helpers shared by the multi-rank tests: ranks as threads, each with its own communicator
//! over real TCP or shared-memory connections.
#![allow(dead_code)]

use std::time::Duration;

use topoccl::{Communicator, Config, TransportPolicy, UniqueId};

pub fn config(transport: TransportPolicy, timeout_s: f64) -> Config {
    Config { transport, timeout: Duration::from_secs_f64(timeout_s), ..Config::default() }
}

/// Runs `f` on `n` ranks (threads) and returns their results in rank order.
pub fn on_ranks<R: Send>(n: u32, cfg: &Config, f: impl Fn(&mut Communicator) -> R + Sync) -> Vec<R> {
    let id = UniqueId::new().expect("unique id");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, cfg, f) = (id.clone(), cfg.clone(), &f);
                s.spawn(move || {
                    let mut comm = Communicator::init_with(&id, r, n, cfg).expect("init");
                    f(&mut comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Runs `f` on `n` ranks (threads), rank `r` with `cfg(r)`; their results in rank order.
pub fn on_ranks_with<R: Send>(
    n: u32,
    cfg: impl Fn(u32) -> Config + Sync,
    f: impl Fn(&mut Communicator) -> R + Sync,
) -> Vec<R> {
    let id = UniqueId::new().expect("unique id");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (id, cfg, f) = (id.clone(), &cfg, &f);
                s.spawn(move || {
                    let mut comm = Communicator::init_with(&id, r, n, cfg(r)).expect("init");
                    f(&mut comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}
