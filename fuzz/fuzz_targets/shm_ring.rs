//! A shared-memory ring whose other side may publish any position: the checks of the peer's
//! head and tail keep every copy inside the ring.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| topoccl_transports::fuzzing::shm_ring(data));
