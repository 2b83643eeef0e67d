//! Entry points for the fuzz targets in `fuzz/` (hidden: no part of the API, changed at will).
//!
//! Each takes bytes as a peer could send them and runs them through this crate's own code: the
//! call header every message carries and the receiver's check of it, and the bootstrap's
//! messages (the unique id, the rendezvous table's entries, the hello the rendezvous service
//! reads, the reply a rank reads). Where the code reads a socket, the bytes go through a real
//! loopback socket; nothing here decodes anything itself.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::comm::bootstrap::{self, UniqueId, HELLO_BYTES, HELLO_MAGIC, PEER_BYTES};
use crate::exec::engine;
use crate::exec::Settings;
use crate::greet::{Greeter, HELLO_DEADLINE, MAX_UNGREETED};
use crate::types::{Dtype, ReduceOp};
use crate::wire::{CallHeader, SEQ_BYTES};
use topoccl_transports::{Meta, META_BYTES};

/// The rendezvous secret of the fuzzer's hellos (seeds carry it; the fuzzer finds it anyway).
pub const SECRET: [u8; 16] = *b"topoccl-fuzzing!";

fn meta_at(data: &[u8], at: usize) -> Option<Meta> {
    data.get(at..at + META_BYTES).map(|b| b.try_into().expect("24 bytes"))
}

/// `data`: the 24-byte meta of a message that arrived (decoded, described, re-encoded), then
/// optionally 24 bytes from which the running call's own header is made, the message's and
/// the step's lengths (4 bytes each), and a byte whose low bit makes the receive one from any
/// source (its check ignores the number), for the receiver's check.
pub fn call_header(data: &[u8]) {
    let Some(theirs) = meta_at(data, 0) else { return };
    if let Some(h) = CallHeader::decode(&theirs) {
        assert_eq!(CallHeader::decode(&h.encode()), Some(h), "a decoded header does not survive re-encoding");
        std::hint::black_box((h.describe(), h.mismatch(&theirs)));
    }
    let Some(raw) = meta_at(data, META_BYTES) else { return };
    // What a running call sends is always an encoded header; a meta that is not one is the
    // expected meta of grouped send/recv steps, which the check also meets.
    let call = CallHeader::decode(&raw);
    let ours = call.map_or(raw, |h| h.encode());
    let word = |at: usize| data.get(at..at + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    let (got, want) = (word(2 * META_BYTES) as usize, word(2 * META_BYTES + 4) as usize);
    let abort = AtomicBool::new(false);
    let settings = Settings::new(1 << 20, 1 << 20, Duration::from_secs(1), false);
    let cfg = settings.run(0, &abort, Dtype::Float32, ReduceOp::Sum, call, None);
    let any = data.get(2 * META_BYTES + 8).is_some_and(|b| b & 1 == 1);
    let checked = engine::check(&cfg, 1, &ours, &theirs, got, want, any);
    let same = if any { ours[SEQ_BYTES..] == theirs[SEQ_BYTES..] } else { ours == theirs };
    assert_eq!(checked.is_ok(), same && got == want, "the check let a different message through");
    if let Err(e) = checked {
        std::hint::black_box(e.to_string());
    }
}

/// The first byte picks the message: a unique id, entries of the rendezvous table, the hello
/// the rendezvous service reads, or the reply a rank reads from it; the rest is the message.
pub fn bootstrap(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 4 {
        0 => unique_id(rest),
        1 => peer_entries(rest),
        2 => hello(rest),
        _ => reply(rest),
    }
}

/// An id as another process (or `ncclCommGrow`'s giver) hands it over.
fn unique_id(b: &[u8]) {
    if let Ok(id) = UniqueId::from_bytes(b) {
        let again = UniqueId::from_bytes(&id.to_bytes()).expect("an id's own bytes are an id");
        assert_eq!(again, id, "an id changed through its bytes");
        std::hint::black_box(format!("{id:?} {}", id.root_addr()));
    }
}

/// Entries of the table every rank receives (and exchanges again when splitting).
fn peer_entries(b: &[u8]) {
    for e in b.chunks_exact(PEER_BYTES) {
        let p = bootstrap::decode_peer(e);
        let mut out = Vec::new();
        bootstrap::encode_peer(&p, &mut out);
        assert_eq!(out.len(), PEER_BYTES);
        assert_eq!(bootstrap::decode_peer(&out), p, "an entry changed through its bytes");
    }
}

fn loopback_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("a loopback listener")
}

/// What a connection sends the rendezvous service, through its greeter: only a hello that is
/// complete and carries the magic and the secret comes through, and unchanged.
fn hello(b: &[u8]) {
    static LISTENER: OnceLock<TcpListener> = OnceLock::new();
    let listener = LISTENER.get_or_init(|| {
        let l = loopback_listener();
        l.set_nonblocking(true).expect("a non-blocking listener");
        l
    });
    let Ok(mut peer) = listener.local_addr().and_then(TcpStream::connect) else { return };
    let Ok(me) = peer.local_addr() else { return };
    if peer.write_all(b).and_then(|()| peer.shutdown(Shutdown::Write)).is_err() {
        return;
    }
    let mut prefix = [0u8; 20];
    prefix[..4].copy_from_slice(HELLO_MAGIC);
    prefix[4..].copy_from_slice(&SECRET);
    let mut greeter = Greeter::<HELLO_BYTES>::new(HELLO_DEADLINE, MAX_UNGREETED);
    let mut greeted = Vec::new();
    let until = Instant::now() + Duration::from_secs(1);
    // Until this connection is let through or some connection is dropped (the bytes arrive
    // at once on loopback, and the peer's end of stream right after them).
    while greeter.dropped == 0 && greeted.is_empty() && Instant::now() < until {
        if !matches!(greeter.poll(listener, &prefix, &mut greeted), Ok(true)) {
            std::thread::yield_now();
        }
    }
    for (s, got) in &greeted {
        if s.peer_addr().ok() == Some(me) {
            assert!(b.len() >= HELLO_BYTES && b.starts_with(&prefix), "a stranger was let through");
            assert_eq!(&got[..], &b[..HELLO_BYTES], "the hello changed on the way");
        }
    }
}

/// A stand-in for the rendezvous service: answers every connection with the bytes in `answer`
/// (set before the connection is made), then reads until the rank hangs up.
struct Service {
    addr: SocketAddr,
    answer: Arc<Mutex<Vec<u8>>>,
}

fn service() -> &'static Service {
    static SERVICE: OnceLock<Service> = OnceLock::new();
    SERVICE.get_or_init(|| {
        let listener = loopback_listener();
        let addr = listener.local_addr().expect("the service's address");
        let answer = Arc::new(Mutex::new(Vec::new()));
        let theirs = answer.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { continue };
                let bytes = theirs.lock().map(|a| a.clone()).unwrap_or_default();
                let _ = s.write_all(&bytes).and_then(|()| s.shutdown(Shutdown::Write));
                let mut sink = [0u8; 512];
                while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
            }
        });
        Service { addr, answer }
    })
}

/// What a rank reads back from the rendezvous: the first byte is how many ranks it says there
/// are (1 to 16), the rest is the service's answer. A complete table comes back with one entry
/// per rank; anything else is an error, not a panic or a hang.
fn reply(b: &[u8]) {
    let Some((&n, answer)) = b.split_first() else { return };
    let nranks = 1 + u32::from(n % 16);
    let service = service();
    *service.answer.lock().expect("the answer") = answer.to_vec();
    let id = UniqueId::remote(service.addr, SECRET);
    let me = bootstrap::decode_peer(&[0u8; PEER_BYTES]);
    let deadline = Instant::now() + Duration::from_secs(5);
    if let Ok(table) = bootstrap::rendezvous(&id, 0, nranks, me, deadline) {
        assert_eq!(table.len(), nranks as usize, "a table of the wrong size was accepted");
        assert!(answer.first() == Some(&0) && answer.len() > table.len() * PEER_BYTES, "a short answer was accepted");
    }
}

/// Seed inputs for [`call_header`], named: headers of real calls, alike and differing.
pub fn call_header_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use crate::types::Reduction;
    use crate::wire::{reduction_code, Called};
    use topoccl_synth::schedule::Collective;
    let header = |called, dtype, count, schedule| CallHeader {
        seq: 7,
        called,
        dtype,
        op: reduction_code(Reduction::Op(ReduceOp::Sum)),
        count,
        schedule,
    };
    let all_reduce = header(Called::Collective(Collective::AllReduce), Dtype::Float32, 1024, 0xdead_beef);
    let reduce = header(Called::Collective(Collective::Reduce { root: 3 }), Dtype::Bfloat16, 1 << 40, 1);
    let p2p = header(Called::SendRecv, Dtype::Int8, 5, 0);
    let pair = |theirs: &CallHeader, ours: &CallHeader, got: u32, want: u32| {
        let mut v = theirs.encode().to_vec();
        v.extend_from_slice(&ours.encode());
        v.extend_from_slice(&got.to_le_bytes());
        v.extend_from_slice(&want.to_le_bytes());
        v
    };
    let other_algo = CallHeader { schedule: 2, ..all_reduce };
    vec![
        ("alone", all_reduce.encode().to_vec()),
        ("same", pair(&all_reduce, &all_reduce, 4096, 4096)),
        ("other-length", pair(&reduce, &reduce, 100, 4096)),
        ("other-algorithm", pair(&other_algo, &all_reduce, 4096, 4096)),
        ("other-call", pair(&p2p, &reduce, 5, 5)),
    ]
}

/// Seed inputs for [`bootstrap`], named: one of each message, as the real encoders make them.
pub fn bootstrap_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let v4 = UniqueId::remote("10.1.2.3:29500".parse().expect("an address"), SECRET).to_bytes();
    let v6 = UniqueId::remote("[fe80::1]:5".parse().expect("an address"), [1; 16]).to_bytes();
    // An entry for the address in an id's bytes (after its 8-byte magic).
    let entry = |id: &[u8], host: u8| {
        let mut raw = vec![host; PEER_BYTES];
        raw[..18].copy_from_slice(&id[8..26]);
        let mut out = Vec::new();
        bootstrap::encode_peer(&bootstrap::decode_peer(&raw), &mut out);
        out
    };
    let tagged = |which: u8, parts: &[&[u8]]| {
        let mut v = vec![which];
        for p in parts {
            v.extend_from_slice(p);
        }
        v
    };
    let hello = tagged(2, &[HELLO_MAGIC, &SECRET, &1u32.to_le_bytes(), &2u32.to_le_bytes(), &entry(&v4, 9)]);
    let error = b"rank 3 is out of range for 2 ranks";
    vec![
        ("id-v4", tagged(0, &[&v4])),
        ("id-v6", tagged(0, &[&v6])),
        ("entries", tagged(1, &[&entry(&v4, 1), &entry(&v6, 2)])),
        ("hello", hello),
        ("hello-stranger", tagged(2, &[b"GET / HTTP/1.1\r\n\r\n"])),
        ("table", tagged(3, &[&[1, 0], &entry(&v4, 1), &entry(&v6, 2)])),
        ("error", tagged(3, &[&[0, 1], &(error.len() as u32).to_le_bytes(), error])),
    ]
}
