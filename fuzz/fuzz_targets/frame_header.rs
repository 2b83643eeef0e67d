//! What a peer sends on a framed byte stream (TCP, or a shared-memory ring), drained message by
//! message: no panic, no stall, no allocation beyond what the bytes warrant.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topoccl_transports::fuzzing::frame_stream(data));
