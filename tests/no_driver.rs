//! A machine without a CUDA driver (this test runs without the stand-in): host calls are
//! unchanged, every buffer is host memory, and what needs CUDA — a stream, a device, device
//! memory — is one clear error that names what is missing, never a panic.

mod common;

use topoccl::cuda::StreamRef;
use topoccl::{Buffer, Collective, CollectiveCall, Dtype, MemSpace, ReduceOp, TransportPolicy};

#[test]
fn without_a_driver_host_calls_run_and_cuda_calls_say_what_is_missing() {
    if topoccl::cuda::present() {
        eprintln!("a CUDA driver is present here: the no-driver test has nothing to show");
        return;
    }
    let cfg = common::config(TransportPolicy::Auto, 20.0);
    let results = common::on_ranks(2, &cfg, |comm| {
        let data = vec![comm.rank() as f32 + 1.0; 1000];
        assert_eq!(Buffer::at(data.as_ptr()).space, MemSpace::Host);
        let mut out = vec![0f32; 1000];
        comm.all_reduce(&data, &mut out, ReduceOp::Sum).expect("host all-reduce");
        assert!(out.iter().all(|v| *v == 3.0));
        let call = CollectiveCall::new(Collective::AllReduce, Dtype::Float32, 1000);
        let stream = StreamRef::from_raw(0x10 as *mut std::ffi::c_void);
        // SAFETY: the call is refused before any buffer is touched.
        let on_stream = unsafe { comm.submit_on(&call, Buffer::at(data.as_ptr()), Buffer::at(out.as_ptr()), stream) };
        let device = comm.cuda_device();
        // The refused call numbered nothing: the ranks are still in step.
        comm.all_reduce(&data, &mut out, ReduceOp::Sum).expect("host all-reduce after the refusal");
        (on_stream.map(drop).map_err(|e| e.to_string()), device.map_err(|e| e.to_string()))
    });
    for (stream, device) in results {
        let stream = stream.expect_err("a stream without a driver");
        let device = device.expect_err("a device without a driver");
        for e in [&stream, &device] {
            assert!(e.contains("no CUDA driver") || e.contains("without the `cuda` feature"), "unclear: {e}");
        }
    }
    assert!(topoccl::cuda::Context::primary(0).is_err());
}
