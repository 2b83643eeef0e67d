use topoccl::{Communicator, ReduceOp, UniqueId};
fn main() {
    let n: u32 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(4);
    let len: usize = std::env::args().nth(2).map(|s| s.parse().unwrap()).unwrap_or(1000);
    let id = UniqueId::new().unwrap();
    std::thread::scope(|s| {
        for r in 0..n {
            let id = id.clone();
            s.spawn(move || {
                let mut c = Communicator::init(&id, r, n).unwrap();
                println!("rank {r} transports {:?}", c.transports());
                let send: Vec<f32> = (0..len).map(|i| (i % 10) as f32 + r as f32).collect();
                let mut recv = vec![0f32; len];
                let t = std::time::Instant::now();
                for _ in 0..10 {
                    c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                }
                let want: Vec<f32> = (0..len).map(|i| ((i % 10) as f32) * n as f32 + (n * (n - 1) / 2) as f32).collect();
                assert_eq!(recv, want);
                println!("rank {r} ok {:?}", t.elapsed() / 10);
            });
        }
    });
}
