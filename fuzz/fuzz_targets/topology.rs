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
        // emulator's files are written that way), unless a GPU holds no rank.
        if let Ok(doc) = file::to_toml(&topo) {
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
