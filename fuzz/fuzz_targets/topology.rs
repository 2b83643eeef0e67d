//! Topology files as a user writes them, and topology names (built-in machines, generated
//! families, rank subsets) as `TOPOCCL_TOPOLOGY` or a tool's `--topology` gives them.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use topoccl_synth::topology::{families, file, resolve};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(topo) = file::parse(text, Path::new("fuzz.toml"), "fuzz") {
        // What parses is a machine the file format can say again (the tuner's and the
        // emulator's files are written that way), unless a GPU holds no rank. Checked up to
        // 1024 ranks: a family of thousands (`torus3d:499x4x4`) is a legitimate file whose
        // round trip, instrumented, outlasts the fuzzer's 10 s per input; size changes nothing
        // the round trip could get wrong.
        let round_trip = topo.nranks() <= 1024;
        if let Some(doc) = round_trip.then(|| file::to_toml(&topo).ok()).flatten() {
            let back = file::parse(&doc, Path::new("written.toml"), "written")
                .unwrap_or_else(|e| panic!("a written topology does not parse: {e}\n{doc}"));
            assert_eq!(back.nranks(), topo.nranks());
            assert_eq!(back.fingerprint(), topo.fingerprint(), "a topology changed through its file");
            assert_eq!(back.hosts(), topo.hosts());
        }
    }
    // A name, not a path: nothing is read from disk.
    let spec = text.trim();
    if spec.len() <= 200 && !spec.contains(['/', '.', '\\']) {
        let _ = resolve(spec);
    } else if families::is_family(spec) {
        let _ = families::generate(spec);
    }
});
