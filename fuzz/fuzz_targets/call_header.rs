//! The 24-byte call header every message carries, and the receiver's check of it against the
//! call it runs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topoccl::fuzzing::call_header(data));
