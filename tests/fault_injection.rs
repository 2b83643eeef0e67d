//! The fault-injection suite: ranks as processes running random checked collectives, one of
//! them faulted at a random moment (killed; stopped past the deadline; idle, never making the
//! call the others wait in; skipping a call, so the ranks call different things; its
//! connection to one peer closed, fed a corrupted header, or black-holed), over TCP and
//! shared memory (and, for kills, stops, closes and black holes, RDMA verbs on the stand-in
//! libibverbs), on 2 to 8 ranks. Every surviving rank must fail within the deadline with an
//! error naming the faulty rank (the same on every rank), never return wrong data, never hang,
//! and then build a communicator without the faulty rank (a shrink) that works.
//!
//! Each scenario prints one row; the table is the suite's output (`--nocapture`).
//! `TOPOCCL_FI_ROUNDS` sets how many random scenarios run per fault kind and transport (1 in CI),
//! `TOPOCCL_FI_SEED` the seed, `TOPOCCL_FI_ONLY=stop-shm` (say) one kind and transport (each
//! scenario draws from its own generator, so a scenario replays alone).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use free_port::free_port;
use topoccl::transports::fault::{Fault, Faulty};
use topoccl::transports::{Connection, TransportTable};
use topoccl::{Collective, CollectiveCall, Communicator, Config, Dtype, Error, ReduceOp};

mod free_port;
mod verbs_standin;

/// The call deadline the ranks run with, seconds.
const TIMEOUT_S: f64 = 3.0;

/// A small deterministic generator (every rank draws the same calls from the same seed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Seconds since the epoch: when things happened, comparable across the processes.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn env_u64(k: &str) -> Option<u64> {
    std::env::var(k).ok().and_then(|v| v.parse().ok())
}

/// The value rank `r` contributes at element `j` of call `i` (small integers: exact in f32).
fn value(r: u32, j: usize, i: u64) -> f32 {
    ((r as usize + 1) * (j % 7 + 1) + (i as usize % 5)) as f32
}

/// Call `i` of the random sequence: the collective and its count.
fn draw(rng: &mut Rng, nranks: u32) -> (Collective, usize) {
    let root = rng.below(u64::from(nranks)) as u32;
    let kinds = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast { root },
        Collective::Reduce { root },
        Collective::AllToAll,
    ];
    let c = kinds[rng.below(kinds.len() as u64) as usize];
    let most = if rng.below(4) == 0 { 1 << 16 } else { 1024 };
    let count = 1 + rng.below(most) as usize;
    (c, count)
}

/// Runs call `i` on `comm` and checks what it produced; `Err(None)` for wrong data.
fn checked_call(comm: &Communicator, c: Collective, count: usize, i: u64) -> Result<(), Option<Error>> {
    let (me, n) = (comm.rank(), comm.nranks());
    let call = CollectiveCall::new(c, Dtype::Float32, count);
    let (_, in_bytes, out_bytes) = call.bytes(n).map_err(Some)?;
    let input: Vec<f32> = (0..in_bytes / 4).map(|j| value(me, j, i)).collect();
    let mut out = vec![0f32; out_bytes / 4];
    comm.collective_bytes(&call, bytemuck::cast_slice(&input), bytemuck::cast_slice_mut(&mut out)).map_err(Some)?;
    let sum = |j: usize| (0..n).map(|r| value(r, j, i)).sum::<f32>();
    let ok = match c {
        Collective::AllReduce => out.iter().enumerate().all(|(j, &v)| v == sum(j)),
        Collective::Reduce { root } => me != root || out.iter().enumerate().all(|(j, &v)| v == sum(j)),
        Collective::Broadcast { root } => out.iter().enumerate().all(|(j, &v)| v == value(root, j, i)),
        Collective::AllGather => out.iter().enumerate().all(|(j, &v)| v == value((j / count) as u32, j % count, i)),
        Collective::ReduceScatter => out.iter().enumerate().all(|(j, &v)| v == sum(me as usize * count + j)),
        Collective::AllToAll => {
            out.iter().enumerate().all(|(j, &v)| v == value((j / count) as u32, me as usize * count + j % count, i))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(None)
    }
}

/// The rank's configuration from the environment; on the faulty rank, for the link faults
/// (`close`, `garbage`, `stall`), its connection to rank `FI_PEER` wrapped in a [`Faulty`] that
/// strikes at its `FI_SENDS`-th send. A thread prints `FAULT at <time>` when it strikes.
fn link_fault_config(fault: &str) -> Config {
    let mut cfg = Config::from_env().expect("configuration from the environment");
    let faulty = env_u64("FI_RANK");
    let me = env_u64("RANK");
    let sends = env_u64("FI_SENDS").unwrap_or(u64::MAX);
    let link_to = env_u64("FI_PEER").map(|p| p as u32);
    let fault = match fault {
        "close" => Fault::CloseAfter(sends),
        "garbage" => Fault::CorruptMeta(sends),
        "stall" => Fault::StallAfter(sends),
        _ => return cfg,
    };
    if faulty != me {
        return cfg;
    }
    let counters: Arc<Mutex<Vec<Arc<AtomicU64>>>> = Arc::default();
    let watched = counters.clone();
    std::thread::spawn(move || loop {
        // The fault strikes at send `sends` (its index, for a corrupted header: the count
        // reaches sends + 1 once that send went through).
        let struck = sends + u64::from(matches!(fault, Fault::CorruptMeta(_)));
        if watched.lock().unwrap().iter().any(|c| c.load(Ordering::Relaxed) >= struck) {
            println!("FAULT at {}", unix_now());
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    });
    let wrap = move |peer: u32, c: Box<dyn Connection>| -> Box<dyn Connection> {
        if Some(peer) != link_to {
            return c;
        }
        let f = Faulty::new(c, fault);
        counters.lock().unwrap().push(f.counter());
        Box::new(f)
    };
    cfg.transports = TransportTable::new().wrapped(Arc::new(wrap));
    cfg
}

/// A rank process (`TOPOCCL_FI_CHILD`): random checked calls until one fails; then a shrink
/// without the ranks the error names, and a checked all-reduce on it. Exit codes: 3 failed
/// and recovered, 4 wrong data, 5 failed and the recovery failed.
#[test]
fn fi_child_rank() {
    if std::env::var("TOPOCCL_FI_CHILD").is_err() {
        return;
    }
    let seed = env_u64("FI_SEED").unwrap_or(1);
    let fault = std::env::var("FI_FAULT").unwrap_or_default();
    let comm = match Communicator::from_env_with(link_fault_config(&fault)) {
        Ok(c) => c,
        Err(e) => {
            println!("INIT FAILED: {e}");
            std::process::exit(5);
        }
    };
    let (me, n) = (comm.rank(), comm.nranks());
    let at = env_u64("FI_AT").unwrap_or(u64::MAX);
    let faulty = env_u64("FI_RANK").map(|r| r as u32);
    let mut rng = Rng(seed | 1);
    let mut i = 0u64;
    loop {
        let (c, count) = draw(&mut rng, n);
        if faulty == Some(me) && i == at {
            match fault.as_str() {
                "idle" => {
                    println!("FAULT at {}", unix_now());
                    std::thread::sleep(Duration::from_secs_f64(TIMEOUT_S * 4.0));
                    std::process::exit(0);
                }
                "skip" => {
                    println!("FAULT at {}", unix_now());
                    i += 1;
                    continue;
                }
                _ => {}
            }
        }
        match checked_call(&comm, c, count, i) {
            Ok(()) => {}
            Err(None) => {
                println!("WRONG DATA in call {i} ({c:?} of {count})");
                std::process::exit(4);
            }
            Err(Some(e)) => {
                println!("ERROR {:?} at {}: {e}", e.culprits(), unix_now());
                if e.culprits().contains(&me) {
                    println!("EXCLUDED");
                    std::process::exit(3);
                }
                let start = Instant::now();
                let recovered = comm.shrink(e.culprits()).and_then(|small| {
                    let me = small.rank();
                    let send = vec![1.0f32 + me as f32; 1000];
                    let mut recv = vec![0f32; 1000];
                    small.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
                    let want: f32 = (0..small.nranks()).map(|r| 1.0 + r as f32).sum();
                    if recv.iter().any(|&v| v != want) {
                        return Err(Error::Internal("wrong data after the shrink".into()));
                    }
                    Ok(small.nranks())
                });
                match recovered {
                    Ok(k) => {
                        println!("RECOVERED on {k} ranks in {:.2} s", start.elapsed().as_secs_f64());
                        std::process::exit(3)
                    }
                    Err(e) => {
                        println!("RECOVERY FAILED: {e}");
                        std::process::exit(5)
                    }
                }
            }
        }
        if i == 0 {
            println!("READY");
        }
        i += 1;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Kill,
    Stop,
    Idle,
    Skip,
    /// The faulty rank's connection to one peer closes at a random send (a link went down).
    Close,
    /// One message of the faulty rank to one peer carries a corrupted header.
    Garbage,
    /// The faulty rank's connection to one peer stops moving at a random send, staying open
    /// (a black-holed link); both processes and their watch services go on.
    Stall,
}

impl Kind {
    const ALL: [Kind; 7] = [Kind::Kill, Kind::Stop, Kind::Idle, Kind::Skip, Kind::Close, Kind::Garbage, Kind::Stall];

    /// Faults of the faulty rank's connections, injected inside its process.
    fn on_links(self) -> bool {
        matches!(self, Kind::Close | Kind::Garbage | Kind::Stall)
    }
}

/// How one surviving rank ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Failed naming the faulty rank, within the deadline, and recovered (or was named itself).
    Named,
    WrongRank(String),
    NotRecovered(String),
    WrongData(String),
    Hang,
    Late(String),
}

struct Row {
    kind: Kind,
    transport: &'static str,
    nranks: u32,
    faulty: u32,
    outcomes: Vec<Outcome>,
    worst: Duration,
}

fn spawn_rank(r: u32, n: u32, port: u16, env: &[(&str, String)]) -> Child {
    let me = std::env::current_exe().unwrap();
    let mut c = Command::new(me);
    c.args(["--exact", "fi_child_rank", "--nocapture", "--test-threads=1"])
        .env("TOPOCCL_FI_CHILD", "1")
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("TOPOCCL_TIMEOUT", TIMEOUT_S.to_string())
        .stdout(Stdio::piped())
        .stderr(if env.iter().any(|(k, _)| *k == "TOPOCCL_FI_STDERR_PIPE") {
            Stdio::piped()
        } else if std::env::var("TOPOCCL_FI_STDERR").is_ok() {
            Stdio::inherit()
        } else {
            Stdio::null()
        });
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap().success());
}

fn scenario(kind: Kind, transport: &'static str, rng: &mut Rng) -> Row {
    let n = 2 + rng.below(7) as u32;
    let faulty = rng.below(u64::from(n)) as u32;
    let peer = (faulty + 1 + rng.below(u64::from(n - 1)) as u32) % n;
    let seed = rng.next();
    let at = 1 + rng.below(20);
    let port = free_port();
    let mut env = vec![
        ("TOPOCCL_TRANSPORT", transport.to_string()),
        ("FI_SEED", seed.to_string()),
        ("FI_FAULT", format!("{kind:?}").to_lowercase()),
        ("FI_RANK", faulty.to_string()),
        ("FI_AT", at.to_string()),
        // For the link faults: the send of the faulty rank's connections that fails (the
        // first call has at least this many on some connection only when it is large).
        ("FI_SENDS", (20 + rng.below(400)).to_string()),
        ("FI_PEER", peer.to_string()),
    ];
    if transport == "ib" {
        env.push(("TOPOCCL_IBVERBS_LIB", verbs_standin::lib()));
    }
    let mut kids: Vec<Child> = (0..n).map(|r| spawn_rank(r, n, port, &env)).collect();
    let mut readers: Vec<BufReader<_>> = kids.iter_mut().map(|k| BufReader::new(k.stdout.take().unwrap())).collect();
    // What each rank printed before its output is read to the end.
    let mut early = vec![String::new(); n as usize];
    for (r, rd) in readers.iter_mut().enumerate() {
        let mut line = String::new();
        while !line.contains("READY") {
            line.clear();
            let ended = rd.read_line(&mut line).unwrap() == 0;
            early[r].push_str(&line);
            // A link fault may strike in the first call.
            if ended || (kind.on_links() && line.starts_with("ERROR")) {
                assert!(kind.on_links(), "rank {r} of {n} ended before its first call");
                break;
            }
        }
    }
    // A random moment of the random calls.
    std::thread::sleep(Duration::from_millis(rng.below(200)));
    let mut fault_at = unix_now();
    match kind {
        Kind::Kill => signal(&kids[faulty as usize], "-KILL"),
        Kind::Stop => signal(&kids[faulty as usize], "-STOP"),
        Kind::Idle | Kind::Skip | Kind::Close | Kind::Garbage | Kind::Stall => {
            // When the faulty rank reached the call it idles in or skips (it says so then).
            let (f, mut line) = (faulty as usize, String::new());
            loop {
                if let Some(t) = early[f].lines().find_map(|l| l.strip_prefix("FAULT at ")) {
                    fault_at = t.trim().parse().unwrap();
                    break;
                }
                line.clear();
                if readers[f].read_line(&mut line).unwrap() == 0 {
                    // Only a link fault's rank may end first: its error came before its
                    // watcher saw the fault strike; the error's own time bounds it.
                    assert!(kind.on_links(), "the faulty rank ended early");
                    break;
                }
                early[f].push_str(&line);
            }
        }
    }
    let t0 = Instant::now();
    // The error must come within the deadline; recovering (a shrink) may take another.
    let limit = Duration::from_secs_f64(TIMEOUT_S * 3.0 + 5.0);
    let mut outcomes = Vec::new();
    let mut worst = Duration::ZERO;
    for (r, k) in kids.iter_mut().enumerate() {
        let r = r as u32;
        if r == faulty && !matches!(kind, Kind::Skip) && !kind.on_links() {
            continue;
        }
        let status = loop {
            if let Some(s) = k.try_wait().unwrap() {
                break Some(s);
            }
            if t0.elapsed() > limit {
                let _ = k.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut text = std::mem::take(&mut early[r as usize]);
        let _ = readers[r as usize].read_to_string(&mut text);
        let error = text.lines().find(|l| l.starts_with("ERROR")).unwrap_or("").to_string();
        // "ERROR [culprits] at T: message"
        let culprits: Vec<u32> = error
            .split_once('[')
            .and_then(|(_, rest)| rest.split_once(']'))
            .map(|(list, _)| list.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default();
        // From the fault (for a skipped call: the start of the scenario's waiting) to the error.
        let after: f64 = error
            .split_once("] at ")
            .and_then(|(_, rest)| rest.split_once(':'))
            .and_then(|(t, _)| t.parse::<f64>().ok())
            .map_or(f64::MAX, |t| (t - fault_at).max(0.0));
        // A mismatch between two ranks has no majority to tell which is out of step: both
        // are named.
        // A broken link has two ends, and from outside either may be at fault: the link (the
        // faulty rank and its peer on it) is the right answer. A black-holed one inside a ring
        // leaves every rank of the ring waiting for its predecessor: without counts of what
        // each side sent and received, the cycle is named, and it must hold the link.
        let named = match kind {
            Kind::Close => culprits == [faulty.min(peer), faulty.max(peer)],
            Kind::Stall => culprits.contains(&faulty) && culprits.contains(&peer),
            _ => culprits == [faulty] || (kind == Kind::Skip && n == 2 && culprits.contains(&faulty)),
        };
        let outcome = match status.and_then(|s| s.code()) {
            None => Outcome::Hang,
            Some(4) => Outcome::WrongData(text),
            Some(3) | Some(5) if !named => Outcome::WrongRank(error),
            // The deadline counts from the last progress: a rank may still move for a moment after
            // the fault (8 processes share 2 cores here).
            Some(3) | Some(5) if after > TIMEOUT_S + 1.0 => Outcome::Late(error),
            Some(3) if text.contains("RECOVERED") || text.contains("EXCLUDED") => Outcome::Named,
            Some(c) => Outcome::NotRecovered(format!("exit {c}: {text}")),
        };
        outcomes.push(outcome);
        if after < f64::MAX {
            worst = worst.max(Duration::from_secs_f64(after));
        }
    }
    if kind == Kind::Stop {
        signal(&kids[faulty as usize], "-KILL");
    }
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    Row { kind, transport, nranks: n, faulty, outcomes, worst }
}

#[test]
fn every_fault_names_the_faulty_rank_and_a_new_communicator_works() {
    let rounds = env_u64("TOPOCCL_FI_ROUNDS").unwrap_or(1);
    let seed = env_u64("TOPOCCL_FI_SEED").unwrap_or(0x5eed_1234_abcd);
    let mut rows = Vec::new();
    for round in 0..rounds {
        for (k, kind) in Kind::ALL.into_iter().enumerate() {
            for (t, transport) in ["tcp", "shm", "ib"].into_iter().enumerate() {
                // Over RDMA verbs: the faults of a process and of a link (the others concern
                // calls, not the transport).
                if transport == "ib" && !matches!(kind, Kind::Kill | Kind::Stop | Kind::Close | Kind::Stall) {
                    continue;
                }
                let wanted = std::env::var("TOPOCCL_FI_ONLY").unwrap_or_default();
                if !wanted.is_empty() && wanted != format!("{kind:?}-{transport}").to_lowercase() {
                    continue;
                }
                // Each scenario draws from its own generator, so TOPOCCL_FI_ONLY replays it.
                let mut rng =
                    Rng(seed ^ (round * 64 + k as u64 * 2 + t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let row = scenario(kind, transport, &mut rng);
                let bad: Vec<_> = row.outcomes.iter().filter(|o| **o != Outcome::Named).collect();
                println!(
                    "{:<5} {:<4} {} ranks, rank {} faulty: {}/{} named it and recovered, worst time to the error {:.2} s{}",
                    format!("{:?}", row.kind).to_lowercase(),
                    row.transport,
                    row.nranks,
                    row.faulty,
                    row.outcomes.len() - bad.len(),
                    row.outcomes.len(),
                    row.worst.as_secs_f64(),
                    if bad.is_empty() { String::new() } else { format!(" — {bad:?}") }
                );
                rows.push(row);
            }
        }
    }
    let failures: Vec<String> = rows
        .iter()
        .flat_map(|row| {
            row.outcomes.iter().filter(|o| **o != Outcome::Named).map(move |o| {
                format!(
                    "{:?} over {} on {} ranks (rank {} faulty): {o:?}",
                    row.kind, row.transport, row.nranks, row.faulty
                )
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `SIGUSR1` on a rank prints every rank's call in flight and changes nothing: rank 1 idles
/// where rank 0 waits for it, and rank 0's table says both.
#[test]
fn sigusr1_prints_the_table_of_calls_in_flight() {
    let port = free_port();
    let env = [
        ("TOPOCCL_TRANSPORT", "tcp".to_string()),
        ("FI_SEED", "7".to_string()),
        ("FI_FAULT", "idle".to_string()),
        ("FI_RANK", "1".to_string()),
        ("FI_AT", "3".to_string()),
        ("TOPOCCL_FI_STDERR_PIPE", "1".to_string()),
    ];
    let mut kids: Vec<Child> = (0..2).map(|r| spawn_rank(r, 2, port, &env)).collect();
    let mut out1 = BufReader::new(kids[1].stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("FAULT at ") {
        line.clear();
        assert!(out1.read_line(&mut line).unwrap() > 0, "rank 1 ended early");
    }
    std::thread::sleep(Duration::from_millis(600));
    signal(&kids[0], "-USR1");
    let status = kids[0].wait().unwrap();
    let mut err = String::new();
    kids[0].stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let mut out = String::new();
    kids[0].stdout.take().unwrap().read_to_string(&mut out).unwrap();
    for k in &mut kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    // The signal did not end the rank: it failed later, at the deadline, naming rank 1.
    assert_eq!(status.code(), Some(3), "{out}{err}");
    assert!(out.contains("ERROR [1]"), "{out}");
    assert!(err.contains("calls in flight on communicator"), "{err}");
    let row = |r: u32| err.lines().find(|l| l.trim_start().starts_with(&format!("{r} "))).unwrap_or("").to_string();
    assert!(row(0).contains("stalled") && row(0).contains("call #") && row(0).contains("rank 1 ("), "{err}");
    assert!(row(1).contains("idle"), "{err}");
}
