//! The host time a transport's own code spends per message, apart from waiting: one thread
//! drives both ends of a connection (over a loopback TCP pair the way the bootstrap hands
//! them over), pinging messages of each size back and forth, and times every call — `send`,
//! and the `progress` and `recv_with` calls that moved something (busy) apart from those
//! that found nothing to do (idle: waiting on the kernel, or on the NIC). Used by
//! `benches/verbs/run.sh`.
//!
//! `connection_cost tcp|ib [sizes] [messages]`; `ib` opens `TOPOCCL_IBVERBS_LIB` (the
//! stand-in's path, in the bench). Prints `size messages busy_us idle_us wall_us` per message.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use topoccl_transports::tcp::TcpTransport;
use topoccl_transports::verbs::{VerbsSettings, VerbsTransport};
use topoccl_transports::{Connected, Connection, PeerSetup, Region, Transport, META_BYTES};

fn pair(t: &dyn Transport) -> (Box<dyn Connection>, Box<dyn Connection>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("listener");
    let addr = l.local_addr().expect("address");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..t.streams() {
        a.push(TcpStream::connect(addr).expect("connect"));
        b.push(l.accept().expect("accept").0);
    }
    let setup = |streams, creator: bool| PeerSetup {
        streams,
        creator,
        rank: u32::from(!creator),
        peer: format!("rank {}", u32::from(!creator)),
        timeout: Duration::from_secs(10),
    };
    let connected = |c: topoccl_transports::Result<Connected>| match c.expect("set-up") {
        Connected::Connection(c) => c,
        Connected::Declined { why, .. } => panic!("declined: {why}"),
    };
    std::thread::scope(|s| {
        let other = s.spawn(|| connected(t.connect(setup(b, false))));
        let me = connected(t.connect(setup(a, true)));
        (me, other.join().expect("set-up thread"))
    })
}

#[derive(Default)]
struct Clock {
    busy: Duration,
    idle: Duration,
}

impl Clock {
    fn time<T>(&mut self, f: impl FnOnce() -> T, moved: impl Fn(&T) -> bool) -> T {
        let t = Instant::now();
        let r = f();
        if moved(&r) {
            self.busy += t.elapsed();
        } else {
            self.idle += t.elapsed();
        }
        r
    }
}

/// Sends `data` from `from` and waits until `to` has it (and `from` is done with it).
fn one_way(from: &mut dyn Connection, to: &mut dyn Connection, data: &[u8], into: &mut [u8], c: &mut Clock) {
    // SAFETY: `data` outlives the send: this returns only once the ticket is done.
    let ticket = c.time(|| unsafe { from.send(1, &[0; META_BYTES], Region::of(data)) }, |_| true).expect("send");
    let mut got = false;
    while !got || !from.sent(ticket) {
        c.time(|| from.progress(), |r| matches!(r, Ok(true))).expect("progress");
        c.time(|| to.progress(), |r| matches!(r, Ok(true))).expect("progress");
        if !got {
            got = c
                .time(
                    || {
                        to.recv_with(1, &mut |_, r| {
                            // SAFETY: host memory valid for the callback.
                            into.copy_from_slice(unsafe { r.bytes() })
                        })
                    },
                    |r| matches!(r, Ok(true)),
                )
                .expect("recv");
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "tcp".into());
    let sizes: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "8,4096,65536,1048576".into())
        .split(',')
        .map(|s| s.trim().parse().expect("a size"))
        .collect();
    let base: usize = args.next().and_then(|m| m.parse().ok()).unwrap_or(20000);
    let t: Arc<dyn Transport> = match kind.as_str() {
        "tcp" => Arc::new(TcpTransport { sockets: 1 }),
        "ib" => {
            let settings = VerbsSettings { library: std::env::var("TOPOCCL_IBVERBS_LIB").ok(), ..Default::default() };
            Arc::new(VerbsTransport::open(&settings, 0, true).expect("a verbs port"))
        }
        other => panic!("unknown transport {other} (tcp, ib)"),
    };
    let (mut a, mut b) = pair(t.as_ref());
    for size in sizes {
        let messages = (base * 4096 / size.max(4096)).max(200);
        let (ping, mut pong) = (vec![7u8; size], vec![0u8; size]);
        let mut warm = Clock::default();
        for _ in 0..messages / 20 {
            one_way(a.as_mut(), b.as_mut(), &ping, &mut pong, &mut warm);
            one_way(b.as_mut(), a.as_mut(), &pong, &mut vec![0u8; size], &mut warm);
        }
        let mut c = Clock::default();
        let mut back = vec![0u8; size];
        let t0 = Instant::now();
        for _ in 0..messages / 2 {
            one_way(a.as_mut(), b.as_mut(), &ping, &mut pong, &mut c);
            one_way(b.as_mut(), a.as_mut(), &pong, &mut back, &mut c);
        }
        assert!(back == ping, "the bytes came back changed");
        let per = |d: Duration| d.as_secs_f64() * 1e6 / messages as f64;
        println!("{size} {messages} {:.2} {:.2} {:.2}", per(c.busy), per(c.idle), per(t0.elapsed()));
    }
}
