//! Host CPU per message of a transport: two ranks (processes, joined from the environment)
//! ping-pong messages of each size with `send`/`recv`, and rank 0 prints, per size, the wall
//! time and the CPU time of its calling thread per message (the transport's software path —
//! framing, posting, polling, and for TCP the kernel's socket work — which is what this rank's
//! core pays) and of its whole process (for the stand-in libibverbs this adds its emulated
//! NIC's threads, which a real NIC does in hardware). Used by `benches/verbs/run.sh`.
//!
//! `SIZES` (bytes, comma-separated; default 8,4096,65536,1048576), `MESSAGES` per size
//! (default 20000, fewer for large sizes).

use std::time::Instant;

use topoccl::Communicator;

fn thread_cpu() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).expect("thread clock");
    t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9
}

fn process_cpu() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).expect("process clock");
    t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let comm = Communicator::from_env()?;
    let (me, peer) = (comm.rank(), 1 - comm.rank());
    if comm.nranks() != 2 {
        return Err("run on exactly 2 ranks".into());
    }
    let sizes: Vec<usize> = std::env::var("SIZES")
        .unwrap_or_else(|_| "8,4096,65536,1048576".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let base: usize = std::env::var("MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(20000);
    if me == 0 {
        println!("transport {:?}", comm.transports()[1].unwrap_or("?"));
    }
    for size in sizes {
        let messages = (base * 4096 / size.max(4096)).max(200);
        let mut buf = vec![0u8; size];
        let round = |buf: &mut Vec<u8>| -> topoccl::Result<()> {
            if me == 0 {
                comm.send(&buf[..], peer)?;
                comm.recv(&mut buf[..], peer)
            } else {
                comm.recv(&mut buf[..], peer)?;
                comm.send(&buf[..], peer)
            }
        };
        for _ in 0..messages / 10 {
            round(&mut buf)?;
        }
        let (t0, c0, p0) = (Instant::now(), thread_cpu(), process_cpu());
        for _ in 0..messages / 2 {
            round(&mut buf)?;
        }
        let (wall, cpu, proc_cpu) = (t0.elapsed().as_secs_f64(), thread_cpu() - c0, process_cpu() - p0);
        // Each round is two messages: one sent and one received by each rank.
        let per = |s: f64| s * 1e6 / messages as f64;
        if me == 0 {
            println!("{size} {messages} {:.2} {:.2} {:.2}", per(wall), per(cpu), per(proc_cpu));
        }
    }
    comm.destroy()?;
    Ok(())
}
