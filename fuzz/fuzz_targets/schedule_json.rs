//! Schedules loaded from JSON (`Schedule::from_json`): what loads has passed `validate`, so
//! the verifier, the statistics, the exports and the simulator must give an answer, not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use topoccl_synth::schedule::{msccl, Schedule};
use topoccl_synth::{sim, topology, verify};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(s) = Schedule::from_json(text) else { return };
    let json = s.to_json().expect("a loaded schedule writes as JSON");
    assert_eq!(Schedule::from_json(&json).expect("a written schedule loads"), s, "a schedule changed through JSON");
    std::hint::black_box((s.stats(), msccl::to_msccl_xml(&s).is_ok()));
    // The verifier holds every chunk of every rank's buffers: memory in proportion to the
    // schedule's declared size, which `validate` bounds per rank (MAX_CHUNKS) but which can
    // still exceed the fuzzer's limit over many ranks. Verify what a fuzzer can afford.
    let cells = u64::from(s.nranks) * (2 * u64::from(s.chunks) + u64::from(s.scratch_chunks));
    if cells <= 1 << 22 {
        std::hint::black_box(verify::verify(&s).is_ok());
    }
    if s.nranks <= 16 {
        if let Ok(topo) = topology::resolve(&format!("full:{}", s.nranks)) {
            std::hint::black_box(sim::simulate(&topo, &s, 1 << 20).is_ok());
        }
    }
});
