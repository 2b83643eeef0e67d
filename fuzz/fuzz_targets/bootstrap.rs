//! The bootstrap's messages: a unique id, the rendezvous table's entries, the hello the
//! rendezvous service reads, the reply a rank reads.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topoccl::fuzzing::bootstrap(data));
